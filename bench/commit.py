"""Commit overhead: 1,000 approved effects committed, against the same calls sent directly.

``python -m bench.commit [--quick] [--effects N] [--store sqlite,postgres] [--postgres-url URL]``

Both sides call the receiver fixture server (``tests/servers/receiver.py``, stdio, one
fsynced log line per delivery) with the same arguments and the same ``_meta``:

- **direct**: an MCP client calls ``deliver`` N times in a row;
- **commit**: :func:`gateway._commit.commit` runs an approved order's N held calls, so each
  call also pays the write-ahead ``dispatching`` mark and the recorded outcome (two fsynced
  SQLite transactions) plus the lock and the pre-check;
- **commit again**: the same commit once more, which sends nothing and only reports.

With ``--store sqlite,postgres`` the commit runs once on each store (a fresh PostgreSQL
schema, see :mod:`bench.stores`, where the two marks are durable commits on the server),
each rated against the same direct calls.

Per-call figures are the time from one call's start to the next (so the commit side
includes its bookkeeping between calls). Startup (spawning the receiver) is excluded.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp import Client, StdioServerParameters

from bench.stores import Stores, add_options

ROOT = Path(__file__).resolve().parents[1]
RECEIVER = ROOT / "tests" / "servers" / "receiver.py"


@dataclass(frozen=True)
class Figures:
    """What one side measured."""

    name: str
    calls: int
    total_s: float
    median_ms: float
    p99_ms: float


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))] if ordered else 0.0


def _figures(name: str, starts: list[float], end: float) -> Figures:
    gaps = [b - a for a, b in zip(starts, [*starts[1:], end], strict=True)]
    total = end - starts[0] if starts else 0.0
    median = statistics.median(gaps) * 1000 if gaps else 0.0
    return Figures(name, len(starts), total, median, _p99(gaps) * 1000)


async def direct(log: Path, arguments: list[dict[str, Any]], order_id: str) -> Figures:
    """N calls straight to the receiver."""
    params = StdioServerParameters(command=sys.executable, args=[str(RECEIVER)],
                                   env={"RECEIVER_LOG": str(log)})
    starts: list[float] = []
    async with Client(params) as client:
        for i, args in enumerate(arguments, start=1):
            starts.append(time.perf_counter())
            meta = {"awl/ref": f"receiver/deliver#{i}", "awl/order": order_id, "awl/attempt": 1}
            result = await client.session.send_request(
                types.CallToolRequest(params=types.CallToolRequestParams(
                    name="deliver", arguments=args, _meta=meta)), types.CallToolResult)
            if result.is_error:
                raise RuntimeError(f"direct call {i} failed: {result.content}")
        end = time.perf_counter()
    return _figures("direct", starts, end)


class _Timed:
    """An upstream pool that notes when each call starts."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.starts: list[float] = []

    async def call(self, server: str, tool: str, arguments: Mapping[str, Any] | None = None,
                   *, meta: Mapping[str, Any] | None = None, timeout: float | None = None,
                   before_send: Callable[[], Awaitable[None]] | None = None,
                   ) -> types.CallToolResult:
        self.starts.append(time.perf_counter())
        result: types.CallToolResult = await self.pool.call(
            server, tool, arguments, meta=meta, timeout=timeout, before_send=before_send)
        return result


async def committed(folder: Path, n: int, store_url: str | None = None,
                    name: str = "commit") -> tuple[Figures, Figures, str]:
    """Commit an approved order of ``n`` held calls, then commit it again (on the
    PostgreSQL store ``store_url`` names, else on a SQLite desk in ``folder``)."""
    from gateway._commit import commit
    from gateway._config import load_config
    from gateway._upstream import UpstreamPool
    from tests.gateway.commit_support import make_setup

    setup = make_setup(folder, [("receiver/deliver", {"to": f"person{i}", "body": "x" * 64})
                                for i in range(n)], store_url=store_url)
    async with UpstreamPool(load_config(setup.config)) as pool:
        timed = _Timed(pool)
        start = time.perf_counter()
        summary = await commit(setup.order_id, store=setup.store, pool_or_config=timed)
        end = time.perf_counter()
        if not summary.ok or len(timed.starts) != n:
            raise RuntimeError("the benchmark commit did not commit every effect")
        first = _figures(name, timed.starts, end)
        first = Figures(first.name, n, end - start, first.median_ms, first.p99_ms)
        again_start = time.perf_counter()
        summary = await commit(setup.order_id, store=setup.store, pool_or_config=timed)
        again_end = time.perf_counter()
    if len(timed.starts) != n or max(setup.counts().values()) != 1:
        raise RuntimeError("the second commit sent something")
    again = Figures(f"{name} again (sends nothing)", 0, again_end - again_start,
                    (again_end - again_start) / n * 1000, 0.0)
    order_id = setup.order_id
    setup.store.close()
    return first, again, order_id


def commit_name(store: str, stores: tuple[str, ...]) -> str:
    """The commit side's name: ``commit`` alone on SQLite, else ``commit (STORE)``."""
    return "commit" if stores == ("sqlite",) else f"commit ({store})"


async def run(n: int, stores: Stores | None = None) -> list[Figures]:
    """Measure the direct calls and the commit on each store, one after the other."""
    stores = stores or Stores(("sqlite",))
    with tempfile.TemporaryDirectory(prefix="awl-bench-commit-") as tmp:
        folder = Path(tmp)
        sides: list[Figures] = []
        order_id = ""
        for store in stores.names:
            where = folder / f"commit-{store}"
            with stores.fresh(store, where, "commit") as url:
                first, again, order_id = await committed(
                    where, n, None if store == "sqlite" else url,
                    commit_name(store, stores.names))
            sides += [first, again]
        arguments = [{"to": f"person{i}", "body": "x" * 64} for i in range(n)]
        bare = await direct(folder / "direct.jsonl", arguments, order_id)
        return [bare, *sides]


def report(figures: list[Figures]) -> str:
    """The table, with the commit's ratio to the direct calls."""
    lines = ["| side | calls | total s | median ms/effect | p99 ms/effect |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {f.name} | {f.calls} | {f.total_s:.2f} | {f.median_ms:.2f} | {f.p99_ms:.2f} |"
              for f in figures]
    bare = figures[0]
    if bare.median_ms > 0 and bare.total_s > 0:
        lines.append("")
        lines += [f"{first.name} / direct: median {first.median_ms / bare.median_ms:.2f}x, "
                  f"total {first.total_s / bare.total_s:.2f}x "
                  f"({first.median_ms - bare.median_ms:+.2f} ms per effect for the "
                  "write-ahead mark and the recorded outcome)"
                  for first in figures[1:] if first.calls and first.name != bare.name]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(prog="python -m bench.commit", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="100 effects, for a smoke run")
    parser.add_argument("--effects", type=int, help="how many effects (default 1000)")
    add_options(parser)
    args = parser.parse_args(argv)
    stores = Stores.of(parser, args)
    n = args.effects or (100 if args.quick else 1000)
    figures: list[Figures] = anyio.run(run, n, stores)
    print(report(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
