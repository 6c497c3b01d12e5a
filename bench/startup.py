"""Start and stop: from spawn to the first ``tools/list`` answer, and from stdin closed to exit.

``python -m bench.startup [--quick] [--runs N]``

The gateway (``awl gateway`` for a working order) and the bare proxy (:mod:`bench.bare_proxy`,
on the MCP SDK alone) are spawned in turn, each in front of the example outbox server, and a
client writes ``initialize`` and ``tools/list`` down the pipe at once. It times the
``initialize`` answer, the ``tools/list`` answer, and, after closing the process's stdin, how
long the process takes to exit by itself (the MCP SDK's client gives it 2 s before SIGTERM).
The gateway's ``startup_wait`` is set long, so that both answer ``tools/list`` with the
upstream's tools; an answer without them (which would flatter the time) is counted.
The ratio line compares the gateway's median time to ``tools/list`` with the bare proxy's
(target: within 1.3x), both measured in the same run, taking turns.

The import line shows where the difference comes from: the wall time of ``python -c
"import ..."`` for the MCP SDK's server and client alone (what the bare proxy imports) and
for what ``awl gateway`` imports before it serves, and how many modules each loads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.gateway import ROOT, _working_order, outbox_config

TARGET_RATIO = 1.3
INITIALIZE_PARAMS: dict[str, Any] = {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "bench", "version": "1"}}
"""What a bench client says in its ``initialize`` request."""
UPSTREAM_TOOL = "notes__get_note"
"""A tool of the outbox upstream: a ``tools/list`` answer without it came before it was up."""
_INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE_PARAMS}
_LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


@dataclass
class Timings:
    """What one target measured, one sample per run (seconds)."""

    name: str
    initialize: list[float] = field(default_factory=list)
    tools_list: list[float] = field(default_factory=list)
    stop: list[float] = field(default_factory=list)
    signalled: int = 0
    partial: int = 0
    """Spawns whose ``tools/list`` answer lacked the upstream's tools (it was not up yet)."""


def _answer(out: object, want: int) -> dict[str, Any]:
    assert hasattr(out, "readline")
    while True:
        line = out.readline()
        if not line:
            raise RuntimeError("the server closed stdout before answering")
        message: dict[str, Any] = json.loads(line)
        if message.get("id") == want:
            return message


def once(argv: list[str], timings: Timings, *, cwd: Path) -> None:
    """Spawn ``argv``, time its first answers and its stop, add them to ``timings``."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, cwd=cwd, env={"PYTHONPATH": str(ROOT)})
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write((json.dumps(_INIT) + "\n").encode())
        proc.stdin.flush()
        _answer(proc.stdout, 1)
        timings.initialize.append(time.perf_counter() - start)
        proc.stdin.write((json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})
                          + "\n" + json.dumps(_LIST) + "\n").encode())
        proc.stdin.flush()
        listed = _answer(proc.stdout, 2)
        timings.tools_list.append(time.perf_counter() - start)
        names = {tool["name"] for tool in listed.get("result", {}).get("tools", [])}
        timings.partial += UPSTREAM_TOOL not in names
        closed = time.perf_counter()
        proc.stdin.close()
        code = proc.wait(timeout=30)
        timings.stop.append(time.perf_counter() - closed)
        timings.signalled += code < 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run(runs: int) -> list[Timings]:
    """Spawn each target ``runs`` times, taking turns, in a fresh temporary folder."""
    with tempfile.TemporaryDirectory(prefix="awl-bench-") as tmp:
        folder = Path(tmp)
        home = folder / "home"
        home.mkdir()
        # The gateway's tools/list waits for the upstream as the bare proxy's does: both
        # times are to the whole list.
        config = outbox_config(folder, gateway={"startup_wait": 60})
        order_id = _working_order(home, 10)
        targets = [
            (Timings("bare proxy"), [sys.executable, "-m", "bench.bare_proxy",
                                     "--config", str(config)]),
            (Timings("gateway"), [sys.executable, "-m", "awl", "gateway", "--order", order_id,
                                  "--config", str(config), "--home", str(home)]),
        ]
        for i in range(runs):
            for timings, argv in targets[i % 2:] + targets[:i % 2]:
                once(argv, timings, cwd=ROOT)
        return [timings for timings, _ in targets]


_IMPORTS = {
    "MCP SDK only": "import mcp.server, mcp.client, mcp.server.stdio",
    "awl gateway": "import awl.cli, gateway._serve",
}


def imports(runs: int) -> dict[str, tuple[float, int]]:
    """Median seconds to start Python and import each set, and how many modules it loads."""
    out: dict[str, tuple[float, int]] = {}
    samples: dict[str, list[float]] = {name: [] for name in _IMPORTS}
    counts: dict[str, int] = {}
    for _ in range(runs):
        for name, code in _IMPORTS.items():
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", f"{code}; import sys; "
                                   "print(len(sys.modules))"], capture_output=True,
                                  text=True, check=True, cwd=ROOT,
                                  env={"PYTHONPATH": str(ROOT)})
            samples[name].append(time.perf_counter() - start)
            counts[name] = int(done.stdout.strip())
    for name, times in samples.items():
        out[name] = (statistics.median(times), counts[name])
    return out


def report_imports(found: dict[str, tuple[float, int]]) -> str:
    """One line: each import set's time and module count, and the ratio to the SDK's."""
    (floor, floor_n), (mine, mine_n) = found["MCP SDK only"], found["awl gateway"]
    return (f"imports: MCP SDK only {floor * 1000:.0f} ms ({floor_n} modules), awl gateway "
            f"{mine * 1000:.0f} ms ({mine_n} modules): {mine / floor:.2f}x")


def report(results: list[Timings]) -> str:
    """The table of medians, and the gateway's ratio to the bare proxy."""
    lines = ["| target | initialize ms | tools/list ms | stop after stdin EOF ms | "
             "killed | listed before the upstream was up |", "|---|---:|---:|---:|---:|---:|"]
    for t in results:
        lines.append(f"| {t.name} | {statistics.median(t.initialize) * 1000:.0f} | "
                     f"{statistics.median(t.tools_list) * 1000:.0f} | "
                     f"{statistics.median(t.stop) * 1000:.0f} | {t.signalled} | "
                     f"{t.partial} |")
    by_name = {t.name: t for t in results}
    bare, gateway = by_name["bare proxy"], by_name["gateway"]
    ratio = statistics.median(gateway.tools_list) / statistics.median(bare.tools_list)
    verdict = "within" if ratio <= TARGET_RATIO else "OVER"
    lines += ["", f"spawn to tools/list, gateway / bare proxy: {ratio:.2f}x "
              f"({verdict} the {TARGET_RATIO}x target; medians of {len(gateway.tools_list)} "
              "spawns each)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer spawns, for a smoke run")
    parser.add_argument("--runs", type=int, help="spawns per target (default 7; quick 2)")
    args = parser.parse_args(argv)
    runs = args.runs or (2 if args.quick else 7)
    print(report(run(runs)), flush=True)
    print(report_imports(imports(runs)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
