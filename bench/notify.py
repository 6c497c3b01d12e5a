"""Webhooks off the call path: gateway calls with a dead receiver subscribed, and with none.

``python -m bench.notify [--quick] [--calls N] [--callers C] [--per-caller K]``

Two ``awl gateway`` processes, each for a working order in its own fresh SQLite desk, in
front of the example outbox server; a client calls its read-only ``get_note`` tool:

- **no webhook**: a desk with no subscription;
- **dead receiver**: a desk with four subscriptions to every event, all pointing at an
  address that accepts connections and never answers, a backlog of notifications in its
  outbox, and ``awl notify run`` delivering them all along (its POSTs hang until their
  timeout, then are retried), writing its claims and attempts to the same desk file;
- **no webhook (control)**: a second desk like the first, whose ratio to it is this run's
  noise.

They are measured side by side, taking turns as in :mod:`bench.gateway`: the median and
p99 latency of sequential calls, then calls per second with ``--callers`` concurrent
callers. The ratio line is dead receiver over no webhook (1.00x: no slower).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
from mcp import StdioServerParameters

from bench.gateway import (
    OUTBOX_SERVER,
    ROOT,
    Figures,
    _working_order,
    call_options,
    call_sizes,
    measure,
)

NONE = "no webhook"
DEAD = "dead receiver"
CONTROL = "no webhook (control)"
HOOKS = 4
BACKLOG = 20
"""Orders reported in the dead receiver's desk before the run: one notification each per
subscription."""


@dataclass(frozen=True)
class Ratio:
    """The dead receiver's figures over no webhook's in one run (higher is slower)."""

    median: float
    p99: float
    under_load: float

    @classmethod
    def of(cls, figures: list[Figures], name: str = DEAD) -> Ratio | None:
        """Target ``name``'s ratios to no webhook; None when the run lacks either."""
        by = {f.name: f for f in figures}
        none, other = by.get(NONE), by.get(name)
        if none is None or other is None:
            return None
        return cls(other.median_ms / none.median_ms, other.p99_ms / none.p99_ms,
                   none.calls_per_s / other.calls_per_s)

    def line(self, what: str) -> str:
        return (f"{what}: median {self.median:.2f}x, p99 {self.p99:.2f}x, "
                f"time per call under load {self.under_load:.2f}x")


def _backlog(home: Path, url: str) -> None:
    """Subscriptions to ``url`` and :data:`BACKLOG` submitted orders (their notifications)."""
    from awl.desk.desk import Desk
    from awl.store.sqlite import SQLiteStore

    with SQLiteStore(home / "desk.sqlite3") as store:
        desk = Desk(store)
        for _ in range(HOOKS):
            desk.add_webhook(url, "submitted,blocked,expired,unknown,committed,failed")
        deadline = (datetime.now(UTC) + timedelta(hours=1)).isoformat(timespec="seconds")
        for i in range(BACKLOG):
            view = desk.create({
                "to": "agent:bench", "goal": f"Backlog {i}",
                "criteria": [{"id": "c1", "text": "done"}], "budget": {"tool_calls": 5},
                "deadline": deadline.replace("+00:00", "Z"), "tools": ["notes/*"],
            }, "human:bench")
            desk.accept(view.id, "agent:bench")
            desk.start(view.id, "agent:bench")
            desk.report(view.id, "agent:bench", {
                "status": "done", "result": {"summary": "done"},
                "evidence": [{"criterion": "c1", "type": "note", "note": "done"}],
                "cost": {"tool_calls": 0}, "tools_used": []})


def _tried(home: Path) -> tuple[int, int]:
    """(notifications, attempts recorded) in the desk's outbox."""
    from awl.store.sqlite import SQLiteStore

    with SQLiteStore(home / "desk.sqlite3") as store:
        notes = store.notifications(limit=None)
    return len(notes), sum(len(n.attempts) for n in notes)


async def run(calls: int, callers: int, per_caller: int) -> tuple[list[Figures], str]:
    """Measure both gateways in a fresh temporary folder; also say what the deliverer did."""
    with tempfile.TemporaryDirectory(prefix="awl-bench-") as tmp, socket.socket() as dead:
        dead.bind(("127.0.0.1", 0))
        dead.listen(128)  # accepted by the kernel, never read or answered
        url = f"http://127.0.0.1:{dead.getsockname()[1]}/hook"
        folder = Path(tmp)
        outbox_env = {"OUTBOX_PATH": str(folder / "outbox.jsonl")}
        config = folder / "upstream.json"
        config.write_text(json.dumps({"mcpServers": {"notes": {
            "command": sys.executable, "args": [str(OUTBOX_SERVER)], "env": outbox_env}}}))
        env = {"PYTHONPATH": str(ROOT)}
        targets: list[tuple[str, StdioServerParameters, str]] = []
        homes = {}
        for name in (NONE, DEAD, CONTROL):
            home = folder / name.replace(" ", "-").strip("()")
            home.mkdir()
            homes[name] = home
            order_id = _working_order(home, calls + callers * per_caller)
            targets.append((name, StdioServerParameters(
                command=sys.executable,
                args=["-m", "awl", "gateway", "--order", order_id, "--config", str(config),
                      "--home", str(home)], env=env, cwd=ROOT), "notes__get_note"))
        _backlog(homes[DEAD], url)
        deliverer = subprocess.Popen(
            [sys.executable, "-m", "awl", "notify", "run", "--home", str(homes[DEAD]),
             "--notify-timeout", "2", "--backoff", "0.5", "--poll", "0.05"],
            env={**os.environ, **env}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        try:
            time.sleep(1.0)  # let it claim its first POSTs
            with anyio.fail_after(300):
                figures = await measure(targets, calls=calls, callers=callers,
                                        per_caller=per_caller)
        finally:
            deliverer.terminate()
            deliverer.wait(10)
        notes, attempts = _tried(homes[DEAD])
    return figures, (f"the deliverer recorded {attempts} failed attempts on {notes} "
                     f"notifications meanwhile (each POST hung up to 2 s)")


def report(figures: list[Figures], *, callers: int, note: str = "") -> str:
    """The table, with the dead receiver's ratios to no webhook."""
    lines = [f"| target | median ms | p99 ms | calls/s ({callers} callers) |",
             "|---|---:|---:|---:|"]
    lines += [f"| {f.name} | {f.median_ms:.2f} | {f.p99_ms:.2f} | {f.calls_per_s:.0f} |"
              for f in figures]
    lines.append("")
    for name, what in ((DEAD, "dead receiver / no webhook"),
                       (CONTROL, "control / no webhook (two identical desks: this run's noise)")):
        ratio = Ratio.of(figures, name)
        if ratio is not None:
            lines.append(ratio.line(what))
    if note:
        lines.append(note)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(prog="python -m bench.notify", description=__doc__)
    call_options(parser)
    args = parser.parse_args(argv)
    calls, per_caller = call_sizes(args)
    figures, note = anyio.run(run, calls, args.callers, per_caller)
    print(report(figures, callers=args.callers, note=note), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
