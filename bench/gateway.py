"""Gateway overhead: one small tool call, direct, through a bare proxy, through the gateway.

``python -m bench.gateway [--quick] [--calls N] [--callers C]``

Three MCP servers are started as subprocesses over stdio, each in front of (or being) the
example outbox server, and a client calls its read-only ``get_note`` tool:

- **direct**: the outbox server itself;
- **bare proxy**: ``gateway._bare_proxy``, forwarding every call unchecked;
- **gateway**: ``awl gateway`` for a working order in a fresh SQLite home, so every call
  is checked against the order, reserved against the budget, recorded, and forwarded.

For each it measures the median and p99 latency of sequential calls, then calls per
second with ``--callers`` concurrent callers. The three run side by side and take turns (one
call at a time, then short bursts under load), so background load on the machine hits them
alike.
The ratio line compares the gateway with the bare proxy (target: within 1.25x).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parents[1]
OUTBOX_SERVER = ROOT / "examples" / "outbox_server.py"
TARGET_RATIO = 1.25
BURST = 2
"""Calls per concurrent caller in one turn of the concurrent phase."""


@dataclass(frozen=True)
class Figures:
    """What one target measured."""

    name: str
    median_ms: float
    p99_ms: float
    calls_per_s: float


@dataclass
class _Target:
    name: str
    client: Client
    tool: str
    samples: list[float] = field(default_factory=list)
    loaded_calls: int = 0
    loaded_seconds: float = 0.0

    async def once(self) -> None:
        result = await self.client.call_tool(self.tool, {"id": "n1"})
        if result.is_error:
            raise RuntimeError(f"{self.name}: {self.tool} failed: {result.content}")

    async def timed(self) -> None:
        start = time.perf_counter()
        await self.once()
        self.samples.append(time.perf_counter() - start)

    async def concurrent(self, callers: int, per_caller: int) -> None:
        async def caller() -> None:
            for _ in range(per_caller):
                await self.once()

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(callers):
                tg.start_soon(caller)
        self.loaded_seconds += time.perf_counter() - start
        self.loaded_calls += callers * per_caller

    def figures(self) -> Figures:
        p99 = statistics.quantiles(self.samples, n=100, method="inclusive")[98]
        return Figures(self.name, statistics.median(self.samples) * 1000, p99 * 1000,
                       self.loaded_calls / self.loaded_seconds)


def _turn(running: list[_Target], i: int) -> list[_Target]:
    """The targets in the order of turn ``i``: rotated by one each turn."""
    k = i % len(running)
    return running[k:] + running[:k]


async def measure(targets: list[tuple[str, StdioServerParameters, str]], *, calls: int,
                  callers: int, per_caller: int) -> list[Figures]:
    """Sequential latency, then throughput with ``callers`` concurrent callers, per target.

    All targets run at once and take turns, so a change in the machine's background load
    hits them alike: sequential calls alternate one call at a time (the order rotating),
    and the concurrent phase alternates short bursts of ``callers`` x ``BURST`` calls.
    """
    async with AsyncExitStack() as stack:
        running: list[_Target] = []
        for name, params, tool in targets:
            client = await stack.enter_async_context(Client(params))
            running.append(_Target(name, client, tool))
        for target in running:  # warm up imports, caches and the store
            for _ in range(max(calls // 10, 5)):
                await target.once()
        for i in range(calls):
            for target in _turn(running, i):
                await target.timed()
        for i in range(max(per_caller // BURST, 1)):
            for target in _turn(running, i):
                await target.concurrent(callers, BURST)
        return [target.figures() for target in running]


def _working_order(home: Path, calls: int) -> str:
    """A fresh SQLite desk with one working order allowed to call the outbox server."""
    from awl._desk import Desk
    from awl._sqlite import SQLiteStore

    store = SQLiteStore(home / "desk.sqlite3")
    try:
        desk = Desk(store)
        deadline = datetime.now(UTC) + timedelta(hours=1)
        view = desk.create({
            "to": "agent:bench",
            "goal": "Measure the gateway",
            "criteria": [{"id": "c1", "text": "calls were made"}],
            "budget": {"tool_calls": calls * 10 + 10_000},
            "deadline": deadline.isoformat(timespec="seconds").replace("+00:00", "Z"),
            "tools": ["notes/*"],
        }, "human:bench")
        desk.accept(view.id, "agent:bench")
        desk.start(view.id, "agent:bench")
        return view.id
    finally:
        close = getattr(store, "close", None)
        if callable(close):
            close()


async def run(calls: int, callers: int, per_caller: int) -> list[Figures]:
    """Measure the three targets in a fresh temporary folder."""
    with tempfile.TemporaryDirectory(prefix="awl-bench-") as tmp:
        folder = Path(tmp)
        home = folder / "home"
        home.mkdir()
        outbox_env = {"OUTBOX_PATH": str(folder / "outbox.jsonl")}
        config = folder / "upstream.json"
        config.write_text(json.dumps({"mcpServers": {"notes": {
            "command": sys.executable, "args": [str(OUTBOX_SERVER)], "env": outbox_env}}}))
        env = {"PYTHONPATH": str(ROOT)}
        order_id = _working_order(home, calls + callers * per_caller)
        targets: list[tuple[str, StdioServerParameters, str]] = [
            ("direct", StdioServerParameters(command=sys.executable, args=[str(OUTBOX_SERVER)],
                                             env=outbox_env), "get_note"),
            ("bare proxy", StdioServerParameters(
                command=sys.executable, args=["-m", "gateway._bare_proxy", "--config", str(config)],
                env=env, cwd=ROOT), "notes__get_note"),
            ("gateway", StdioServerParameters(
                command=sys.executable,
                args=["-m", "awl", "gateway", "--order", order_id, "--config", str(config),
                      "--home", str(home)],
                env=env, cwd=ROOT), "notes__get_note"),
        ]
        with anyio.fail_after(300):
            return await measure(targets, calls=calls, callers=callers, per_caller=per_caller)


def report(figures: list[Figures], *, callers: int) -> str:
    """The table, with the gateway's ratios to the bare proxy."""
    lines = [
        f"| target | median ms | p99 ms | calls/s ({callers} callers) |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {f.name} | {f.median_ms:.2f} | {f.p99_ms:.2f} | {f.calls_per_s:.0f} |"
              for f in figures]
    by_name = {f.name: f for f in figures}
    bare, gateway = by_name.get("bare proxy"), by_name.get("gateway")
    if bare is not None and gateway is not None:
        median = gateway.median_ms / bare.median_ms
        p99 = gateway.p99_ms / bare.p99_ms
        throughput = bare.calls_per_s / gateway.calls_per_s
        verdict = "within" if max(median, throughput) <= TARGET_RATIO else "OVER"
        lines.append("")
        lines.append(f"gateway / bare proxy: median {median:.2f}x, p99 {p99:.2f}x, "
                     f"time per call under load {throughput:.2f}x "
                     f"({verdict} the {TARGET_RATIO}x target)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(prog="python -m bench.gateway", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer calls, for a smoke run")
    parser.add_argument("--calls", type=int, help="sequential calls per target (default 400)")
    parser.add_argument("--callers", type=int, default=16, help="concurrent callers (16)")
    parser.add_argument("--per-caller", type=int, help="calls per concurrent caller (40)")
    args = parser.parse_args(argv)
    calls = args.calls or (60 if args.quick else 400)
    per_caller = args.per_caller or (5 if args.quick else 40)
    figures: list[Figures] = anyio.run(run, calls, args.callers, per_caller)
    print(report(figures, callers=args.callers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
