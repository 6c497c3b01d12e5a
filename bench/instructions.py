"""The gateway's work per call in instructions, counted by callgrind: a figure without noise.

``python -m bench.instructions [--quick] [--calls N]``

Wall-clock and CPU ratios (:mod:`bench.gateway`) move by about 0.06x between two runs of the
same code, so a change that removes a tenth of the gateway's extra work cannot be told from
noise there. Counting instructions can: valgrind's callgrind counts every instruction one
Python process runs, the same count each time. Each target runs in its own process, in
front of the same outbox server (a subprocess, not counted), twice: once with ``warm`` calls
and once with ``warm + calls``; the difference over ``calls`` is what one call costs, with
start, imports and shutdown taken out.

- **pool call**: :meth:`gateway._upstream.UpstreamPool.call`, the upstream call the bare
  proxy makes and the gateway makes too: the floor;
- **gateway (memory store)** and **gateway (sqlite)**: :meth:`gateway.Gateway.call` for a
  working order on that store: deciding, reserving, recording and forwarding.

The worker's side of the connection (the gateway's MCP server reading and answering the
call) is not in any of them; bench.gateway measures it. Needs valgrind (``apt-get install
-y valgrind``); a run takes minutes (each process runs about 50 times slower under it).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"pool call": ("memory", "pool"), "gateway (memory store)": ("memory", "gateway"),
           "gateway (sqlite)": ("sqlite", "gateway")}
"""Each target's store and what it calls."""
FLOOR = "pool call"

# The program callgrind runs: a gateway on STORE in front of the outbox server, then WARM
# calls that are not counted apart and CALLS more (of the pool, or of the gateway).
_PROGRAM = r'''
import json, sys, tempfile
from pathlib import Path
import anyio
sys.path.insert(0, ROOT)
from awl.store.memory import MemoryStore
from awl.store.sqlite import SQLiteStore
from bench.gateway import OUTBOX_SERVER, new_working_order
from gateway import open_gateway

async def main():
    folder = Path(tempfile.mkdtemp(prefix="awl-instructions-"))
    config = folder / "upstream.json"
    config.write_text(json.dumps({"mcpServers": {"notes": {
        "command": sys.executable, "args": [str(OUTBOX_SERVER)],
        "env": {"OUTBOX_PATH": str(folder / "outbox.jsonl")}}}}))
    store = (MemoryStore() if STORE == "memory"
             else SQLiteStore(folder / "desk.sqlite3", checkpoint_every=3600.0))
    order_id = new_working_order(store, 1_000_000)
    async with open_gateway(order_id, str(config), store=store) as gw:
        await gw.pool.tools()
        for _ in range(WARM):
            await gw.call("notes__get_note", {"id": "n1"})
        for _ in range(CALLS):
            if WHAT == "pool":
                await gw.pool.call("notes", "get_note", {"id": "n1"}, meta=None)
            else:
                await gw.call("notes__get_note", {"id": "n1"})

anyio.run(main)
'''
_TOTALS = re.compile(r"^(?:summary|totals): (\d+)", re.M)


@dataclass(frozen=True)
class Count:
    """One target's instructions per call."""

    name: str
    per_call: float


def count(store: str, what: str, *, warm: int, calls: int) -> int:
    """The instructions one process runs for ``warm`` calls and then ``calls`` more."""
    with tempfile.TemporaryDirectory(prefix="awl-callgrind-") as tmp:
        out = Path(tmp) / "callgrind.out"
        program = (f"ROOT={str(ROOT)!r}; STORE={store!r}; WHAT={what!r}; WARM={warm}; "
                   f"CALLS={calls}\n{_PROGRAM}")
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
             "-c", program], capture_output=True, text=True, cwd=ROOT, check=False)
        found = _TOTALS.search(out.read_text()) if out.exists() else None
        if done.returncode != 0 or found is None:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"the counted run of {what} on {store} failed: {last}")
        return int(found.group(1))


def measure(names: list[str], *, warm: int, calls: int) -> list[Count]:
    """Instructions per call of each target named (see :data:`TARGETS`), the counted runs
    one per core at a time (a count does not depend on what else runs)."""
    runs = [(name, n) for name in names for n in (0, calls)]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        totals = list(pool.map(lambda run: count(*TARGETS[run[0]], warm=warm, calls=run[1]),
                               runs))
    by_run = dict(zip(runs, totals, strict=True))
    return [Count(name, (by_run[name, calls] - by_run[name, 0]) / calls) for name in names]


def report(counts: list[Count]) -> str:
    """The table: thousands of instructions per call, and each over the pool call's."""
    floor = next((c.per_call for c in counts if c.name == FLOOR), None)
    lines = ["| target | k instructions per call | over the pool call | ratio |",
             "|---|---:|---:|---:|"]
    for c in counts:
        extra = ratio = "n/a"
        if floor:
            extra, ratio = f"{(c.per_call - floor) / 1e3:+.0f} k", f"{c.per_call / floor:.2f}x"
        lines.append(f"| {c.name} | {c.per_call / 1e3:.0f} | {extra} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Count, and print the table."""
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer calls, for a smoke run")
    parser.add_argument("--calls", type=int, help="counted calls per target (default 200)")
    args = parser.parse_args(argv)
    calls = args.calls or (30 if args.quick else 200)
    if calls < 1:
        parser.error("--calls needs a count of 1 or more")
    if shutil.which("valgrind") is None:
        print("bench.instructions: valgrind is not installed; install it (apt-get install -y "
              "valgrind) and run again", file=sys.stderr)
        return 2
    try:
        counts = measure(list(TARGETS), warm=20, calls=calls)
    except RuntimeError as exc:
        print(f"bench.instructions: {exc}", file=sys.stderr)
        return 1
    print(report(counts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
