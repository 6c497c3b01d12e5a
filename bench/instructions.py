"""The gateway's work per call in instructions, counted by callgrind: a figure with little noise.

``python -m bench.instructions [--quick] [--calls N] [--served]``

Wall-clock and CPU ratios (:mod:`bench.gateway`) move by about 0.06x between two runs of the
same code, so a change that removes a tenth of the gateway's extra work cannot be told from
noise there. Counting instructions can: valgrind's callgrind counts every instruction one
Python process runs, nearly the same count each time (a few thousand a call over 100 calls
or more; a process's start varies more, so ``--quick``'s 30 calls move by tens of
thousands). Each target runs in its own process, in
front of the same outbox server (a subprocess, not counted), twice: once with ``warm`` calls
and once with ``warm + calls``; the difference over ``calls`` is what one call costs, with
start, imports and shutdown taken out.

- **pool call**: :meth:`gateway._upstream.UpstreamPool.call`, the upstream call the bare
  proxy makes and the gateway makes too: the floor;
- **gateway (memory store)** and **gateway (sqlite)**: :meth:`gateway.Gateway.call` for a
  working order on that store: deciding, reserving, recording and forwarding.

The worker's side of the connection (the gateway's MCP server reading and answering the
call) is not in any of them. ``--served`` counts it too: the bare proxy, the in-memory
gateway and the SQLite gateway each serve over stdio under callgrind, a client outside it
makes the calls, and the counters are zeroed after the warm-up calls and dumped after the
counted ones (``callgrind_control``), so the figure is the whole process's work per call,
the one item 1 of the performance issue judges as CPU (kernel time aside).

Needs valgrind (``apt-get install -y valgrind``); a run takes minutes (each process runs
about 50 times slower under it).
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
SERVED_FLOOR = "bare proxy"
SERVED = (SERVED_FLOOR, "gateway (memory store)", "gateway (sqlite)")
"""What ``--served`` counts: each a process serving over stdio."""

# The program callgrind runs: a gateway on STORE in front of the outbox server, then WARM
# calls that are not counted apart and CALLS more (of the pool, or of the gateway).
_PROGRAM = r'''
import json, sys, tempfile
from pathlib import Path
import anyio
sys.path.insert(0, ROOT)
from awl.store.memory import MemoryStore
from awl.store.sqlite import SQLiteStore
from bench.gateway import new_working_order, outbox_config
from gateway import open_gateway

async def main():
    folder = Path(tempfile.mkdtemp(prefix="awl-instructions-"))
    config = outbox_config(folder)
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
             "-c", program], capture_output=True, text=True, cwd=ROOT, check=False,
            env={**os.environ, "PYTHONHASHSEED": "0"})  # the same dict layouts each run
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


def _served_args(name: str, folder: Path) -> list[str]:
    """The command line (after the interpreter) serving target ``name`` of :data:`SERVED`."""
    if name == SERVED_FLOOR:
        return ["-m", "gateway._bare_proxy"]
    if name == "gateway (memory store)":
        return ["-m", "bench.memory_gateway"]
    from bench.gateway import _working_order

    home = folder / "home"
    home.mkdir()
    return ["-m", "awl", "gateway", "--order", _working_order(home, 100_000), "--home",
            str(home)]


async def _control(pid: int, option: str, what: str) -> None:
    """Ask callgrind in process ``pid`` to ``option`` (-z: zero its counters, -d: dump them),
    and wait until it has (it answers while the process waits for the next call)."""
    import anyio

    asked = subprocess.Popen(["callgrind_control", option, str(pid)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with anyio.move_on_after(120):
        while asked.poll() is None:
            await anyio.sleep(0.1)
    if asked.poll() is None:
        asked.kill()
        raise RuntimeError(f"callgrind did not {what} within 120 s")


async def served_count(name: str, *, warm: int, calls: int) -> float:
    """Instructions per call of target ``name`` of :data:`SERVED`, serving over stdio."""
    import glob

    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    from bench.gateway import outbox_config

    with tempfile.TemporaryDirectory(prefix="awl-callgrind-") as tmp:
        folder = Path(tmp)
        config = outbox_config(folder)
        out = folder / "callgrind.out"
        params = StdioServerParameters(
            command="valgrind",
            args=["--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
                  *_served_args(name, folder), "--config", str(config)],
            env={"PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "0", "PATH": os.environ["PATH"]},
            cwd=str(ROOT))
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            with anyio.fail_after(1800):
                await s.initialize()
                for _ in range(warm):
                    await s.call_tool("notes__get_note", {"id": "n1"})
                # The one process callgrind runs with this output file: the served target.
                found = subprocess.run(["pgrep", "-f", str(out)], capture_output=True,
                                       text=True, check=False).stdout.split()
                if not found:
                    raise RuntimeError(f"the counted {name} is not running")
                pid = int(found[0])
                await _control(pid, "-z", "zero its counters")
                for _ in range(calls):
                    await s.call_tool("notes__get_note", {"id": "n1"})
                await _control(pid, "-d", "dump its counters")
        dumps = sorted(glob.glob(f"{out}.*"))
        found_total = _TOTALS.search(Path(dumps[0]).read_text()) if dumps else None
        if found_total is None:
            raise RuntimeError(f"the counted {name} wrote no counts")
        return int(found_total.group(1)) / calls


def measure_served(*, warm: int, calls: int) -> list[Count]:
    """Instructions per call of each of :data:`SERVED`, one per core at a time."""
    import anyio

    def one(name: str) -> Count:
        return Count(name, anyio.run(lambda: served_count(name, warm=warm, calls=calls)))

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return list(pool.map(one, SERVED))


def report(counts: list[Count], floor_name: str = FLOOR) -> str:
    """The table: thousands of instructions per call, and each over the floor's."""
    floor = next((c.per_call for c in counts if c.name == floor_name), None)
    lines = [f"| target | k instructions per call | over the {floor_name} | ratio |",
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
    parser.add_argument("--served", action="store_true",
                        help="count whole processes serving over stdio (see above)")
    args = parser.parse_args(argv)
    calls = args.calls or (30 if args.quick else 200)
    if calls < 1:
        parser.error("--calls needs a count of 1 or more")
    if shutil.which("valgrind") is None:
        print("bench.instructions: valgrind is not installed; install it (apt-get install -y "
              "valgrind) and run again", file=sys.stderr)
        return 2
    try:
        if args.served:
            counts, floor = measure_served(warm=20, calls=calls), SERVED_FLOOR
        else:
            counts, floor = measure(list(TARGETS), warm=20, calls=calls), FLOOR
    except RuntimeError as exc:
        print(f"bench.instructions: {exc}", file=sys.stderr)
        return 1
    print(report(counts, floor))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
