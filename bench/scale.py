"""Many gateways on one desk: 1, 2, 4, 8 and 16 gateway processes sharing one order's budget.

``python -m bench.scale [--quick] [--repeat R] [--processes 1,2,4,8,16] [--callers C]
[--per-caller K] [--store sqlite,postgres] [--postgres-url URL]``

For each count P of processes and each target it starts P real stdio processes, each in
front of its own outbox server (``examples/outbox_server.py``, as :mod:`bench.gateway`
uses) and each driven by a client process of its own with C concurrent callers making K
calls of ``get_note`` each (a host running an agent per gateway):

- **bare proxy**: ``gateway._bare_proxy``, forwarding every call unchecked;
- **gateway (sqlite)**: ``awl gateway``, all P on one SQLite desk file;
- **gateway (postgres)**: ``awl gateway``, all P on one PostgreSQL desk (a fresh schema,
  see :mod:`bench.stores`).

Every gateway of a count serves the same working order, so its budget is shared across
processes, as a fleet of gateways spending one order's budget would share it. The budget
is set a little short of the calls made (the warm-up's and 95% of the timed ones), so the
last calls race for the last of it. Each client warms its gateway up, waits until every
client is ready, then all start together; the figures are the total calls per second (all
calls over the time from the first start to the last end), and the median and p99 latency
of every call. At the end the desk is read: **exact** holds when the calls the desk counts
as spent are the calls that succeeded, none went over the budget, and every call refused
was refused because the budget was spent (no call refused while budget was left).

Targets take turns point by point (the order rotating), so drift in the machine's load
hits them alike; ``--repeat R`` measures everything R times and ends with the medians, and
with the median of each count's ratios run by run (the steadier figure). The
ratio lines give each gateway's time per call over the bare proxies' at the same count (the
bare proxies' calls per second over the gateways'). On a machine of 2 cores the clients,
proxies, gateways and upstreams all share them: the curve shows what the desk's store adds
as processes contend for it, not what more hardware would give.
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
from collections.abc import Sequence
from contextlib import ExitStack, closing
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bench.stores import POSTGRES_ENV, Stores, add_options, columns

ROOT = Path(__file__).resolve().parents[1]
BARE = "bare proxy"
COUNTS = (1, 2, 4, 8, 16)
QUICK_COUNTS = (1, 2, 4)
SHORT = 0.95
"""The share of the timed calls the budget allows (after the warm-up's)."""
READY_S = 180
"""How long a client may take to start its target and warm it up."""


def target_name(store: str) -> str:
    return f"gateway ({store})"


@dataclass(frozen=True)
class Point:
    """What P processes of one target measured together."""

    target: str
    processes: int
    calls: int
    """Timed calls, all processes together."""
    seconds: float
    """From the first process's start to the last one's end."""
    p50_ms: float
    p99_ms: float
    ok: int
    """Calls that succeeded, the warm-up's included (they are spent too)."""
    refused: int
    """Calls refused because the order's budget was spent."""
    failed: int
    """Calls that failed otherwise."""
    budget: int | None = None
    spent: int | None = None
    """The tool calls the desk counts as spent at the end (None: no desk)."""

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.seconds if self.seconds > 0 else 0.0

    @property
    def exact(self) -> bool | None:
        """Whether the desk's spent calls are the calls that succeeded, within the budget,
        and a call was refused only once the budget was spent (None without a desk)."""
        if self.budget is None or self.spent is None:
            return None
        return (self.spent == self.ok and self.spent <= self.budget and self.failed == 0
                and (self.refused == 0 or self.spent == self.budget))

    def budget_text(self) -> str:
        if self.budget is None:
            return "-"
        verdict = "exact" if self.exact else "NOT EXACT"
        return f"{self.ok} ok, {self.refused} refused, spent {self.spent}/{self.budget}: {verdict}"


# The client process (``--drive``) ---------------------------------------------------------

async def _drive(spec: dict[str, Any]) -> dict[str, Any]:
    """Connect to the target ``spec`` names, warm it up, say ``ready``, wait for ``go`` on
    stdin, make the calls, and return what they gave."""
    import anyio
    import mcp_types as types
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=spec["command"], args=spec["args"],
                                   env=spec.get("env"), cwd=spec.get("cwd"))
    tally = {"ok": 0, "refused": 0, "failed": 0, "warm_ok": 0}
    latencies: list[float] = []
    last_error = ""

    async with Client(params) as client:
        async def once(key: str = "ok") -> None:
            nonlocal last_error
            start = time.perf_counter()
            result = await client.call_tool(spec["tool"], {"id": "n1"})
            if key == "ok":
                latencies.append(time.perf_counter() - start)
            if not result.is_error:
                tally[key] += 1
                return
            text = " ".join(c.text for c in result.content if isinstance(c, types.TextContent))
            if text.startswith("AWL_BUDGET_EXHAUSTED"):
                tally["refused"] += 1
            else:
                tally["failed"] += 1
                last_error = text[:300]

        for _ in range(spec["warmup"]):
            await once("warm_ok")
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        begin = time.monotonic()

        async def caller() -> None:
            for _ in range(spec["per_caller"]):
                await once()

        async with anyio.create_task_group() as tg:
            for _ in range(spec["callers"]):
                tg.start_soon(caller)
        end = time.monotonic()
    return {**tally, "begin": begin, "end": end, "latencies": latencies,
            "last_error": last_error}


def drive_main(spec_json: str) -> int:
    """``--drive SPEC``: one client process; its answer is one JSON line on stdout."""
    import anyio

    out = anyio.run(_drive, json.loads(spec_json))
    print(json.dumps(out), flush=True)
    return 0


# The parent --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sizes:
    callers: int
    per_caller: int
    warmup: int

    def timed(self, processes: int) -> int:
        return processes * self.callers * self.per_caller

    def budget(self, processes: int) -> int:
        """The order's tool_calls: every warm-up call and :data:`SHORT` of the timed ones."""
        return processes * self.warmup + int(self.timed(processes) * SHORT)


def _params(target: str, config: Path, home: Path, order_id: str | None,
            url: str | None) -> dict[str, Any]:
    env = {"PYTHONPATH": str(ROOT)}
    if target == BARE:
        args = ["-m", "gateway._bare_proxy", "--config", str(config)]
    else:
        assert order_id is not None
        args = ["-m", "awl", "gateway", "--order", order_id, "--config", str(config),
                "--home", str(home), *(["--store", url] if url is not None else [])]
    return {"command": sys.executable, "args": args, "env": env, "cwd": str(ROOT),
            "tool": "notes__get_note"}


def _fail(what: str, log: Path) -> SystemExit:
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    last = lines[-1] if lines else "no output"
    return SystemExit(f"bench.scale: {what} ({last}); the clients' stderr is in {log}")


def _run_clients(specs: list[dict[str, Any]], log: Path) -> list[dict[str, Any]]:
    """Start a client per spec, wait until all are ready, start them together, and
    collect what each measured."""
    with open(log, "a") as errors:
        procs = [subprocess.Popen(
            [sys.executable, "-m", "bench.scale", "--drive", json.dumps(spec)], cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=errors, text=True) for spec in specs]
        try:
            deadline = time.monotonic() + READY_S
            for proc in procs:
                assert proc.stdout is not None
                if not _ready(proc.stdout, deadline):
                    raise _fail("a client did not get ready", log)
            _go(procs)
            results = []
            for proc in procs:
                out, _ = proc.communicate(timeout=READY_S)
                if proc.returncode != 0 or not out.strip():
                    raise _fail("a client failed", log)
                results.append(json.loads(out.strip().splitlines()[-1]))
            return results
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()


def _go(procs: list[subprocess.Popen[str]]) -> None:
    """Tell every ready client to start, one right after the other."""
    for proc in procs:
        assert proc.stdin is not None
        print("go", file=proc.stdin, flush=True)


def _ready(stream: IO[str], deadline: float) -> bool:
    import select

    while time.monotonic() < deadline:
        readable, _, _ = select.select([stream], [], [], max(0.0, deadline - time.monotonic()))
        if not readable:
            return False
        line = stream.readline()
        if not line:
            return False
        if line.strip() == "ready":
            return True
    return False


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


def measure_point(target: str, processes: int, sizes: Sizes, stores: Stores,
                  folder: Path) -> Point:
    """P processes of ``target`` (a fresh desk for a gateway), measured together."""
    from awl.store.urls import open_store
    from bench.gateway import new_working_order, outbox_config

    work = folder / f"{target.replace(' ', '-').strip('()')}-{processes}".replace("(", "")
    work.mkdir(parents=True)
    config = outbox_config(work)
    with ExitStack() as stack:
        order_id = url = budget = None
        store_name = None if target == BARE else target[len("gateway ("):-1]
        if store_name is not None:
            url = stack.enter_context(stores.fresh(store_name, work, "desk"))
            budget = sizes.budget(processes)
            with closing(open_store(url)) as store:
                order_id = new_working_order(store, budget)
        # (a SQLite desk is the home's own, work/desk.sqlite3: no --store for it)
        spec = {**_params(target, config, work, order_id,
                          url if store_name == "postgres" else None),
                "callers": sizes.callers, "per_caller": sizes.per_caller,
                "warmup": sizes.warmup}
        results = _run_clients([spec] * processes, work / "clients.log")
        spent = None
        if url is not None and order_id is not None:
            with closing(open_store(url)) as store:
                spent = store.usage(order_id).tool_calls
    begin = min(r["begin"] for r in results)
    end = max(r["end"] for r in results)
    latencies = [s for r in results for s in r["latencies"]]
    failed = sum(r["failed"] for r in results)
    if failed:
        example = next((r["last_error"] for r in results if r["last_error"]), "")
        print(f"bench.scale: {processes} x {target}: {failed} calls failed, for example: "
              f"{example}", file=sys.stderr)
    return Point(target, processes, len(latencies), end - begin,
                 _quantile(latencies, 0.5) * 1000, _quantile(latencies, 0.99) * 1000,
                 sum(r["ok"] + r["warm_ok"] for r in results),
                 sum(r["refused"] for r in results), failed, budget, spent)


def targets_of(stores: Stores) -> list[str]:
    return [BARE, *(target_name(s) for s in stores.names)]


def run(counts: Sequence[int], sizes: Sizes, stores: Stores, turn: int = 0) -> list[Point]:
    """Every point of one run: per count, every target, the order rotating per count."""
    targets = targets_of(stores)
    points: list[Point] = []
    with tempfile.TemporaryDirectory(prefix="awl-scale-") as tmp:
        for i, processes in enumerate(counts):
            k = (i + turn) % len(targets)
            for target in targets[k:] + targets[:k]:
                points.append(measure_point(target, processes, sizes, stores,
                                            Path(tmp) / f"{processes}"))
    order = {t: i for i, t in enumerate(targets)}
    return sorted(points, key=lambda p: (p.processes, order[p.target]))


def median_points(runs: list[list[Point]]) -> list[Point]:
    """Per count and target, the median of the runs' calls per second and latencies; the
    budget counts of a run that was not exact, if any (else the first run's)."""
    grouped: dict[tuple[int, str], list[Point]] = {}
    for points in runs:
        for p in points:
            grouped.setdefault((p.processes, p.target), []).append(p)
    out = []
    for (processes, target), each in grouped.items():
        worst = next((p for p in each if p.exact is False), each[0])
        seconds = statistics.median(p.seconds / p.calls for p in each) * worst.calls
        out.append(Point(target, processes, worst.calls, seconds,
                         statistics.median(p.p50_ms for p in each),
                         statistics.median(p.p99_ms for p in each),
                         worst.ok, worst.refused, worst.failed, worst.budget, worst.spent))
    return out


def table(points: list[Point]) -> str:
    rows = [(f"{p.processes} x {p.target}",
             [f"{p.calls_per_s:.0f}", f"{p.p50_ms:.2f}", f"{p.p99_ms:.2f}",
              _ratio(points, p), p.budget_text()]) for p in points]
    return columns(rows, ["calls/s", "p50 ms", "p99 ms", "time per call / bare", "budget"])


def _ratio(points: list[Point], p: Point) -> str:
    bare = next((b for b in points if b.target == BARE and b.processes == p.processes), None)
    if bare is None or p.calls_per_s <= 0:
        return "-"
    return f"{bare.calls_per_s / p.calls_per_s:.2f}x"


def curves(points: list[Point]) -> str:
    """One line per gateway: its time per call over the bare proxies' at each count, and
    its total calls per second against theirs."""
    lines = []
    for target in dict.fromkeys(p.target for p in points if p.target != BARE):
        mine = [p for p in points if p.target == target]
        ratio = ", ".join(f"{p.processes}: {_ratio(points, p)}" for p in mine)
        rates = ", ".join(f"{p.processes}: {p.calls_per_s:.0f}" for p in mine)
        exact = all(p.exact for p in mine)
        lines.append(f"{target} / bare proxies, time per call by processes: {ratio}; "
                     f"calls/s {rates}; budget {'exact at every count' if exact else 'NOT EXACT'}")
    bare = [p for p in points if p.target == BARE]
    if bare:
        lines.append("bare proxies, calls/s by processes: "
                     + ", ".join(f"{p.processes}: {p.calls_per_s:.0f}" for p in bare))
    return "\n".join(lines)


def run_ratios(runs: list[list[Point]]) -> str:
    """Per gateway, the median over the runs of its time per call over the bare proxies'
    in the same run, at each count (steadier than the ratio of the medians)."""
    lines = []
    targets = dict.fromkeys(p.target for points in runs for p in points if p.target != BARE)
    for target in targets:
        counts = dict.fromkeys(p.processes for points in runs for p in points
                               if p.target == target)
        each = []
        for processes in counts:
            ratios = [bare.calls_per_s / mine.calls_per_s for points in runs
                      for mine in points if mine.target == target
                      and mine.processes == processes and mine.calls_per_s > 0
                      for bare in points if bare.target == BARE
                      and bare.processes == processes]
            if ratios:
                each.append(f"{processes}: {statistics.median(ratios):.2f}x")
        lines.append(f"median of {len(runs)} runs' ratios, {target} / bare proxies, time per "
                     f"call by processes: {', '.join(each)}")
    return "\n".join(lines)


def parse_counts(text: str) -> list[int]:
    """``1,2,4`` as counts of processes, each at least 1."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--processes takes counts separated by commas, not {text!r}") from None
    if not counts or min(counts) < 1:
        raise ValueError("--processes needs counts of 1 or more, e.g. 1,2,4,8,16")
    return counts


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--drive"] and len(argv) == 2:
        return drive_main(argv[1])
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="1, 2 and 4 processes, fewer calls: a smoke run")
    parser.add_argument("--repeat", type=int, default=1, metavar="R",
                        help="measure R times, ending with the medians (1)")
    parser.add_argument("--processes", metavar="COUNTS",
                        help="counts of processes (1,2,4,8,16; --quick 1,2,4)")
    parser.add_argument("--callers", type=int, help="concurrent callers per process (4; 2)")
    parser.add_argument("--per-caller", type=int, help="calls per caller (40; 10)")
    add_options(parser)
    parser.set_defaults(store="sqlite,postgres" if os.environ.get(POSTGRES_ENV) else "sqlite")
    args = parser.parse_args(argv)
    stores = Stores.of(parser, args)
    if args.repeat < 1:
        parser.error("--repeat needs a count of 1 or more")
    try:
        counts = (parse_counts(args.processes) if args.processes
                  else list(QUICK_COUNTS if args.quick else COUNTS))
    except ValueError as exc:
        parser.error(str(exc))
    sizes = Sizes(callers=args.callers or (2 if args.quick else 4),
                  per_caller=args.per_caller or (10 if args.quick else 40),
                  warmup=3 if args.quick else 10)
    if sizes.callers < 1 or sizes.per_caller < 1:
        parser.error("--callers and --per-caller need 1 or more")
    print(f"{', '.join(map(str, counts))} processes of each target, {sizes.callers} callers "
          f"each making {sizes.per_caller} calls; budget {SHORT:.0%} of the timed calls")
    runs = []
    for i in range(args.repeat):
        points = run(counts, sizes, stores, turn=i)
        runs.append(points)
        if args.repeat > 1:
            print(f"\nrun {i + 1} of {args.repeat}")
        print(table(points))
        print(curves(points), flush=True)
    if args.repeat > 1:
        medians = median_points(runs)
        print(f"\nmedians of {args.repeat} runs")
        print(table(medians))
        print(curves(medians))
        print(run_ratios(runs))
    exact = all(p.exact is not False for points in runs for p in points)
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
