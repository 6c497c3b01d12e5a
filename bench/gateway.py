"""Gateway overhead: one small tool call, direct, through a bare proxy, through the gateway.

``python -m bench.gateway [--quick] [--calls N] [--callers C] [--per-caller K] [--repeat R]
[--store sqlite,postgres] [--postgres-url URL] [--against DIR]``

MCP servers are started as subprocesses over stdio, each in front of (or being) the
example outbox server, and a client calls its read-only ``get_note`` tool:

- **direct**: the outbox server itself;
- **bare proxy**: ``gateway._bare_proxy``, forwarding every call unchecked;
- **gateway**: ``awl gateway`` for a working order in a fresh SQLite home, so every call
  is checked against the order, reserved against the budget, recorded, and forwarded;
  with ``--store sqlite,postgres`` one gateway per store, **gateway (sqlite)** and
  **gateway (postgres)** (a fresh PostgreSQL schema, see :mod:`bench.stores`), each rated
  against the same bare proxy;
- **gateway (memory store)**: the same gateway on the in-memory store
  (:mod:`bench.memory_gateway`): every check and record, none of them written to a file,
  so the gateway's own work apart from the persistent store's two writes per call;
- **gateway (journal store)**: the same gateway with its two writes per call appended to a
  journal file and the budget counted in the process (:mod:`bench.journal_gateway`): what a
  call path leasing an order's calls could cost at the least, folding and leases left out;
- **recording floor**: the bare proxy plus the least recording there is, a budget counter
  and two lines appended to a file per call (:mod:`bench.recording_floor`): what keeping
  evidence of each call before answering costs at the least;
- **bare proxy (control)**: a second, identical bare proxy;
- with ``--against DIR``, another checkout of this project (say ``git worktree add --detach
  /tmp/base main``): **gateway (against NAME)** and **gateway (memory store, against
  NAME)**, its own SQLite gateway and in-memory gateway, its order made by its own code,
  in the same run, so a change to the gateway is measured side by side with the code
  before it rather than across runs.

For each it measures the median and p99 latency of sequential calls, then calls per
second with ``--callers`` concurrent callers, and the CPU time its own process (not its
upstream) spent per call over both phases (read from ``/proc``; not shown where there is
none). They run side by side and take turns (one call at a time, then short bursts under
load), so background load on the machine hits them alike.
With PostgreSQL among the stores, the **round trips per call** column counts what the
PostgreSQL gateway sends the server per call (:mod:`bench.round_trips`): a second gateway of
the same kind, on a fresh schema, through a counting relay, apart from the timed run (the
relay's hop would slow it), first over sequential calls, then with the concurrent callers.
On a server on another host each round trip costs the network's latency.
The ratio line compares the gateway with the bare proxy (targets: the median, the time per
call under load and the CPU per call within 1.10x, the p99 within 1.25x). The control
line compares the two identical bare proxies: how far apart two processes running the same
code land in this run, which is the run's noise.

The ratio under load varies from run to run far more than within a run (fresh processes
land differently on a small, shared machine), so ``--repeat R`` measures R times, each with
fresh processes and a fresh desk, prints every run, and ends with the median of the runs'
ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import AsyncExitStack, ExitStack, closing
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import anyio
from mcp import Client, StdioServerParameters, stdio_client

from bench.round_trips import Counted, count
from bench.stores import Stores, add_options

if TYPE_CHECKING:
    from awl.store.protocol import Store

ROOT = Path(__file__).resolve().parents[1]
OUTBOX_SERVER = ROOT / "examples" / "outbox_server.py"
TARGET_RATIO = 1.10
"""The most the gateway may add to a bare proxy's call: median, under load, CPU per call."""
TARGET_P99 = 1.25
"""The most the gateway may add to a bare proxy's p99 latency."""
BARE = "bare proxy"
CONTROL = "bare proxy (control)"
MEMORY = "gateway (memory store)"
"""The gateway on the in-memory store (:mod:`bench.memory_gateway`): its checks without the
persistent store's writes."""
JOURNAL = "gateway (journal store)"
"""The gateway whose two writes per call are appended lines (:mod:`bench.journal_gateway`):
the least a leased call path could cost."""
FLOOR = "recording floor"
"""The bare proxy plus a counter and two appended lines per call (:mod:`bench.recording_floor`)."""
BURST = 2
"""Calls per concurrent caller in one turn of the concurrent phase."""


def against_names(checkout: Path) -> tuple[str, str]:
    """The names of the SQLite and in-memory gateways of the checkout ``checkout``."""
    return f"gateway (against {checkout.name})", f"gateway (memory store, against {checkout.name})"


def check_checkout(checkout: Path) -> str | None:
    """Why ``checkout`` cannot be measured against (None when it can)."""
    missing = [part for part in ("awl/__main__.py", "gateway/__init__.py",
                                 "bench/gateway.py", "bench/memory_gateway.py")
               if not (checkout / part).is_file()]
    if missing:
        return (f"{checkout} is not a checkout of awl-gateway that has the memory-store "
                f"gateway (no {', '.join(missing)}); give a work tree of this project, for "
                "example one made by `git worktree add --detach /tmp/base main`")
    return None


@dataclass(frozen=True)
class Figures:
    """What one target measured."""

    name: str
    median_ms: float
    p99_ms: float
    calls_per_s: float
    cpu_ms: float | None = None
    """CPU time of the target's own process per call, sequential and loaded calls alike."""
    round_trips: Counted | None = None
    """Round trips to the PostgreSQL server per call (:mod:`bench.round_trips`), counted by
    a second gateway of the same kind apart from the timed runs."""


@dataclass
class _Target:
    name: str
    client: Client
    tool: str
    samples: list[float] = field(default_factory=list)
    loaded_calls: int = 0
    loaded_seconds: float = 0.0
    pid: int | None = None
    cpu_seconds: float | None = None

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
        calls = len(self.samples) + self.loaded_calls
        cpu = None if self.cpu_seconds is None else self.cpu_seconds / calls * 1000
        return Figures(self.name, statistics.median(self.samples) * 1000, p99 * 1000,
                       self.loaded_calls / self.loaded_seconds, cpu)


def _children() -> set[int]:
    """The pids of this process's children (empty where ``/proc`` cannot tell)."""
    found: set[int] = set()
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                found.update(int(pid) for pid in f.read().split())
    except OSError:
        return set()
    return found


def _cpu_seconds(pid: int | None) -> float | None:
    """User and system CPU time the process ``pid`` has used so far; None if unknown."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _turn(running: list[_Target], i: int) -> list[_Target]:
    """The targets in the order of turn ``i``: rotated by one each turn."""
    k = i % len(running)
    return running[k:] + running[:k]


async def measure(targets: list[tuple[str, StdioServerParameters, str]], *, calls: int,
                  callers: int, per_caller: int,
                  errlogs: dict[str, TextIO] | None = None) -> list[Figures]:
    """Sequential latency, then throughput with ``callers`` concurrent callers, per target.

    All targets run at once and take turns, so a change in the machine's background load
    hits them alike: sequential calls alternate one call at a time (the order rotating),
    and the concurrent phase alternates short bursts of ``callers`` x ``BURST`` calls.
    ``errlogs`` names where a target's stderr goes (default: this process's).
    """
    async with AsyncExitStack() as stack:
        running: list[_Target] = []
        for name, params, tool in targets:
            errlog = (errlogs or {}).get(name)
            before = _children()
            client = await stack.enter_async_context(
                Client(params if errlog is None else stdio_client(params, errlog=errlog)))
            new = _children() - before  # the target's own process (not its upstream's)
            running.append(_Target(name, client, tool, pid=new.pop() if len(new) == 1 else None))
        for target in running:  # warm up imports, caches and the store
            for _ in range(max(calls // 10, 5)):
                await target.once()
        cpu = {id(t): _cpu_seconds(t.pid) for t in running}
        for i in range(calls):
            for target in _turn(running, i):
                await target.timed()
        for i in range(max(per_caller // BURST, 1)):
            for target in _turn(running, i):
                await target.concurrent(callers, BURST)
        for target in running:
            start, end = cpu[id(target)], _cpu_seconds(target.pid)
            if start is not None and end is not None:
                target.cpu_seconds = end - start
        return [target.figures() for target in running]


def gateway_name(store: str, stores: tuple[str, ...]) -> str:
    """The gateway target's name: ``gateway`` alone on SQLite, else ``gateway (STORE)``."""
    return "gateway" if stores == ("sqlite",) else f"gateway ({store})"


def outbox_config(folder: Path, **extra: Any) -> Path:
    """``folder``'s upstream config (``upstream.json``, written now): the outbox server as
    ``notes``, its outbox in ``folder``, and ``extra`` top-level sections (``gateway=...``)."""
    config = folder / "upstream.json"
    config.write_text(json.dumps({**extra, "mcpServers": {"notes": {
        "command": sys.executable, "args": [str(OUTBOX_SERVER)],
        "env": {"OUTBOX_PATH": str(folder / "outbox.jsonl")}}}}))
    return config


def new_working_order(store: Store, calls: int, tools: tuple[str, ...] = ("notes/*",)) -> str:
    """A working order in ``store`` allowed ``calls`` calls of ``tools`` (the outbox
    server's)."""
    from awl.desk import Desk

    desk = Desk(store)
    deadline = datetime.now(UTC) + timedelta(hours=1)
    view = desk.create({
        "to": "agent:bench",
        "goal": "Measure the gateway",
        "criteria": [{"id": "c1", "text": "calls were made"}],
        "budget": {"tool_calls": calls},
        "deadline": deadline.isoformat(timespec="seconds").replace("+00:00", "Z"),
        "tools": list(tools),
    }, "human:bench")
    desk.accept(view.id, "agent:bench")
    desk.start(view.id, "agent:bench")
    return view.id


def _working_order(home: Path, calls: int, tools: tuple[str, ...] = ("notes/*",),
                   url: str | None = None) -> str:
    """A fresh desk (the store ``url`` names, else the home's SQLite desk) with one working
    order allowed to call ``tools`` (the outbox server's)."""
    from awl.store.urls import open_store

    with closing(open_store(url or home / "desk.sqlite3")) as store:
        return new_working_order(store, calls * 10 + 10_000, tools)


def _order_in(checkout: Path, home: Path, calls: int) -> str:
    """A working order in ``home``'s SQLite desk, made by the code of ``checkout`` (whose
    store may have another schema than this one's)."""
    made = subprocess.run(
        [sys.executable, "-c", "import sys; from pathlib import Path; "
         "from bench.gateway import _working_order; "
         "print(_working_order(Path(sys.argv[1]), int(sys.argv[2])))", str(home), str(calls)],
        cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)}, capture_output=True,
        text=True, check=False)
    if made.returncode != 0:
        last = (made.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"bench.gateway: the checkout {checkout} could not make its order: "
                         f"{last}")
    return made.stdout.strip().splitlines()[-1]


def against_targets(checkout: Path, folder: Path, config: Path, calls: int
                    ) -> list[tuple[str, StdioServerParameters, str]]:
    """The SQLite gateway (in a home of its own under ``folder``) and the in-memory gateway
    of another checkout, in front of the upstreams of ``config``."""
    home = folder / "against-home"
    home.mkdir()
    order_id = _order_in(checkout, home, calls)
    sqlite_name, memory_name = against_names(checkout)
    return [(sqlite_name, _gateway_params(checkout, order_id, config, home), "notes__get_note"),
            (memory_name, _memory_params(checkout, config), "notes__get_note")]


def _gateway_params(root: Path, order_id: str, config: Path, home: Path,
                    url: str | None = None) -> StdioServerParameters:
    """``awl gateway`` of the checkout ``root`` for ``order_id`` (on ``url``, else the home's
    SQLite desk)."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "awl", "gateway", "--order", order_id, "--config", str(config),
              "--home", str(home), *(["--store", url] if url is not None else [])],
        env={"PYTHONPATH": str(root)}, cwd=root)


def _memory_params(root: Path, config: Path) -> StdioServerParameters:
    """The in-memory gateway (:mod:`bench.memory_gateway`) of the checkout ``root``."""
    return StdioServerParameters(
        command=sys.executable, args=["-m", "bench.memory_gateway", "--config", str(config)],
        env={"PYTHONPATH": str(root)}, cwd=root)


def _journal_params(home: Path, order_id: str, config: Path) -> StdioServerParameters:
    """The journal gateway (:mod:`bench.journal_gateway`) for ``order_id`` of the SQLite desk
    in ``home``."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "bench.journal_gateway", "--home", str(home), "--order", order_id,
              "--config", str(config)],
        env={"PYTHONPATH": str(ROOT)}, cwd=ROOT)


def _floor_params(config: Path, journal: Path) -> StdioServerParameters:
    """The recording floor (:mod:`bench.recording_floor`), its journal at ``journal``."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "bench.recording_floor", "--config", str(config), "--journal",
              str(journal)],
        env={"PYTHONPATH": str(ROOT)}, cwd=ROOT)


async def run(calls: int, callers: int, per_caller: int,
              stores: Stores | None = None, against: Path | None = None) -> list[Figures]:
    """Measure the targets (one gateway per store, and ``against``'s two) in a fresh
    temporary folder."""
    stores = stores or Stores(("sqlite",))
    with tempfile.TemporaryDirectory(prefix="awl-bench-") as tmp, ExitStack() as fresh:
        folder = Path(tmp)
        home = folder / "home"
        home.mkdir()
        outbox_env = {"OUTBOX_PATH": str(folder / "outbox.jsonl")}
        config = outbox_config(folder)
        env = {"PYTHONPATH": str(ROOT)}
        gateways: list[tuple[str, StdioServerParameters, str]] = []
        for store in stores.names:
            url = fresh.enter_context(stores.fresh(store, home, "desk"))  # home/desk.sqlite3
            order_id = _working_order(home, calls + callers * per_caller, url=url)
            gateways.append((gateway_name(store, stores.names), _gateway_params(
                ROOT, order_id, config, home, url if store != "sqlite" else None),
                "notes__get_note"))
        # The floor of the gateway's own work: the same gateway on the in-memory store.
        gateways.append((MEMORY, _memory_params(ROOT, config), "notes__get_note"))
        # The least a journal for call records could cost: its own desk, in a home of its own.
        journal_home = folder / "journal-home"
        journal_home.mkdir()
        gateways.append((JOURNAL, _journal_params(
            journal_home, _working_order(journal_home, calls + callers * per_caller), config),
            "notes__get_note"))
        if against is not None:
            gateways += against_targets(against, folder, config, calls + callers * per_caller)
        gateways.append((FLOOR, _floor_params(config, folder / "floor-journal.jsonl"),
                         "notes__get_note"))
        bare = StdioServerParameters(
            command=sys.executable, args=["-m", "gateway._bare_proxy", "--config", str(config)],
            env=env, cwd=ROOT)
        targets: list[tuple[str, StdioServerParameters, str]] = [
            ("direct", StdioServerParameters(command=sys.executable, args=[str(OUTBOX_SERVER)],
                                             env=outbox_env), "get_note"),
            (BARE, bare, "notes__get_note"),
            *gateways,
            (CONTROL, bare, "notes__get_note"),
        ]
        with anyio.fail_after(300):
            figures = await measure(targets, calls=calls, callers=callers,
                                    per_caller=per_caller)
        if "postgres" in stores.names:
            name = gateway_name("postgres", stores.names)
            url = fresh.enter_context(stores.fresh("postgres", home, "counted"))
            order_id = _working_order(home, calls + callers * per_caller, url=url)
            with anyio.fail_after(120):
                counted = await count(
                    lambda relayed: _gateway_params(ROOT, order_id, config, home, relayed),
                    url, "notes__get_note", calls=min(calls, 100), callers=callers,
                    per_caller=BURST * 2)
            figures = [replace(f, round_trips=counted) if f.name == name else f
                       for f in figures]
        return figures


@dataclass(frozen=True)
class Ratios:
    """One target's figures over the bare proxy's in one run (higher is slower)."""

    median: float
    p99: float
    under_load: float
    """Time per call with the concurrent callers (the bare proxy's calls/s over the target's)."""
    cpu: float | None = None
    """CPU time of the target's process per call over the bare proxy's (None: not measured)."""

    @classmethod
    def of(cls, figures: list[Figures], name: str = "gateway",
           base: str = BARE) -> Ratios | None:
        """Target ``name``'s ratios to ``base`` (the bare proxy) in one run; None when the
        run lacks either of the two."""
        by_name = {f.name: f for f in figures}
        bare, other = by_name.get(base), by_name.get(name)
        if bare is None or other is None:
            return None
        cpu = (other.cpu_ms / bare.cpu_ms if other.cpu_ms is not None and bare.cpu_ms
               else None)
        return cls(other.median_ms / bare.median_ms, other.p99_ms / bare.p99_ms,
                   bare.calls_per_s / other.calls_per_s, cpu)

    @property
    def within(self) -> bool:
        """Whether the median, the time under load and the CPU per call (when measured) are
        within :data:`TARGET_RATIO`, and the p99 within :data:`TARGET_P99`."""
        return (max(self.median, self.under_load, self.cpu or 0.0) <= TARGET_RATIO
                and self.p99 <= TARGET_P99)

    def line(self, what: str, *, verdict: bool = True) -> str:
        """One line with the ratios and (``verdict``) the verdict against the targets."""
        text = (f"{what}: median {self.median:.2f}x, p99 {self.p99:.2f}x, "
                f"time per call under load {self.under_load:.2f}x")
        if self.cpu is not None:
            text += f", CPU per call {self.cpu:.2f}x"
        if verdict:
            text += (f" ({'within' if self.within else 'OVER'} the targets: "
                     f"{TARGET_RATIO:.2f}x, p99 {TARGET_P99:.2f}x)")
        return text


def _median(runs: list[Ratios]) -> Ratios:
    cpus = [r.cpu for r in runs if r.cpu is not None]
    return Ratios(statistics.median(r.median for r in runs),
                  statistics.median(r.p99 for r in runs),
                  statistics.median(r.under_load for r in runs),
                  statistics.median(cpus) if len(cpus) == len(runs) else None)


def gateways(figures: list[Figures]) -> list[str]:
    """The names of the gateway targets in one run (one per store)."""
    return [f.name for f in figures if f.name.startswith("gateway")]


def summary(runs: list[Ratios], controls: list[Ratios] | None = None,
            what: str = "gateway") -> str:
    """The median of several runs' ratios of gateway ``what`` and every run's ratio under
    load; the same for the control when given."""
    each = ", ".join(f"{r.under_load:.2f}x" for r in runs)
    over = sum(1 for r in runs if not r.within)
    lines = [_median(runs).line(f"median of {len(runs)} runs, {what} / bare proxy"),
             f"under load, run by run: {each} ({over} of {len(runs)} over the targets)"]
    if controls:
        lines.append(_median(controls).line(f"median of {len(controls)} runs, control / bare "
                                            "proxy", verdict=False))
        each = ", ".join(f"{r.under_load:.2f}x" for r in controls)
        lines.append(f"control under load, run by run: {each}")
    return "\n".join(lines)


def report(figures: list[Figures], *, callers: int) -> str:
    """The table, with the gateway's ratios to the bare proxy."""
    counted = any(f.round_trips is not None for f in figures)
    lines = [
        f"| target | median ms | p99 ms | calls/s ({callers} callers) | CPU ms per call |"
        + (" round trips per call |" if counted else ""),
        "|---|---:|---:|---:|---:|" + ("---:|" if counted else ""),
    ]
    lines += [f"| {f.name} | {f.median_ms:.2f} | {f.p99_ms:.2f} | {f.calls_per_s:.0f} | "
              f"{'n/a' if f.cpu_ms is None else f'{f.cpu_ms:.3f}'} |"
              + ((" - |" if f.round_trips is None else f" {f.round_trips.text()} |")
                 if counted else "") for f in figures]
    ratios = {name: Ratios.of(figures, name) for name in gateways(figures)}
    control = Ratios.of(figures, CONTROL)
    if any(r is not None for r in ratios.values()) or control is not None:
        lines.append("")
    for name, each in ratios.items():
        if each is not None:
            lines.append(each.line(f"{name} / bare proxy"))
    floor = Ratios.of(figures, FLOOR)
    if floor is not None:
        lines.append(floor.line(f"{FLOOR} / bare proxy (the least recording costs)",
                                verdict=False))
    if control is not None:
        lines.append(control.line("control / bare proxy (two identical proxies: this run's "
                                  "noise)", verdict=False))
    return "\n".join(lines)


def call_options(parser: argparse.ArgumentParser) -> None:
    """The options of a benchmark that measures calls with :func:`measure`."""
    parser.add_argument("--quick", action="store_true", help="fewer calls, for a smoke run")
    parser.add_argument("--calls", type=int, help="sequential calls per target (default 400)")
    parser.add_argument("--callers", type=int, default=16, help="concurrent callers (16)")
    parser.add_argument("--per-caller", type=int, help="calls per concurrent caller (40)")


def call_sizes(args: argparse.Namespace) -> tuple[int, int]:
    """Sequential calls per target and calls per concurrent caller, as asked."""
    return (args.calls or (60 if args.quick else 400),
            args.per_caller or (5 if args.quick else 40))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(prog="python -m bench.gateway", description=__doc__)
    call_options(parser)
    parser.add_argument("--repeat", type=int, default=1,
                        help="measure this many times, fresh processes each time (1)")
    parser.add_argument("--against", type=Path, metavar="DIR",
                        help="also measure the gateways of another checkout of this project")
    add_options(parser)
    args = parser.parse_args(argv)
    stores = Stores.of(parser, args)
    if args.repeat < 1:
        parser.error("--repeat needs a count of 1 or more")
    against: Path | None = None if args.against is None else args.against.resolve()
    if against is not None and (problem := check_checkout(against)) is not None:
        parser.error(f"--against: {problem}")
    calls, per_caller = call_sizes(args)
    runs: dict[str, list[Ratios]] = {}
    controls: list[Ratios] = []
    floors: list[Ratios] = []
    for i in range(args.repeat):
        figures: list[Figures] = anyio.run(run, calls, args.callers, per_caller, stores,
                                             against)
        if args.repeat > 1:
            print(f"run {i + 1} of {args.repeat}")
        print(report(figures, callers=args.callers), flush=True)
        for name in gateways(figures):
            ratios = Ratios.of(figures, name)
            if ratios is not None:
                runs.setdefault(name, []).append(ratios)
        control = Ratios.of(figures, CONTROL)
        if control is not None:
            controls.append(control)
        if (floor := Ratios.of(figures, FLOOR)) is not None:
            floors.append(floor)
    if args.repeat > 1 and runs:
        print()
        print("\n".join(summary(each, controls if k == 0 else None, name)
                        for k, (name, each) in enumerate(runs.items())))
        if floors:
            print(_median(floors).line(f"median of {len(floors)} runs, {FLOOR} / bare proxy",
                                       verdict=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
