"""Shared helpers for the commit tests: approved orders with held calls, the receiver, a
committer subprocess.

Orders are built through the desk (create, accept, start, report, review) with the held
calls written straight into the store the way the gateway writes them (a counted call with
outcome ``held`` and an effect in state ``held``), so these tests do not need a gateway
process. A report that the desk would refuse (tampered arguments) is appended directly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from awl.desk import Desk
from awl.documents.models import Event, WorkReport, format_time
from awl.store.protocol import EffectState, PassRecord, Store
from awl.store.sqlite import SQLiteStore
from tests.awl.desk_support import reserved
from tests.servers.receiver import counts, read_log

ROOT = Path(__file__).resolve().parents[2]
RECEIVER = ROOT / "tests" / "servers" / "receiver.py"
MANAGER = "human:ana"
WORKER = "agent:mailer"
SERVER = "receiver"

@dataclass
class Setup:
    """One approved order in a fresh home, with a receiver config."""

    home: Path
    store: Store
    desk: Desk
    order_id: str
    refs: list[str]
    config: Path
    log: Path
    control: Path
    extra: list[str] = field(default_factory=list)
    """Held calls that were not listed or not approved."""
    store_url: str | None = None
    """The ``AWL_STORE`` URL committers are run with (None: the home's SQLite desk)."""

    def counts(self) -> dict[str, int]:
        """Receiver deliveries per awl/ref."""
        return counts(str(self.log))

    def deliveries(self) -> list[dict[str, Any]]:
        """Every receiver log line."""
        return read_log(str(self.log))

    def states(self) -> dict[str, EffectState]:
        """Effect states by ref."""
        return {e.ref: e for e in self.store.effects(self.order_id)}

    def control_receiver(self, **settings: Any) -> None:
        """Change the receiver's faults (crash_after, hang_after, delay) for later calls."""
        self.control.write_text(json.dumps(settings), encoding="utf-8")


def write_config(folder: Path, log: Path, control: Path, *, timeout: float = 20.0) -> Path:
    """An upstream config with the receiver as the only server."""
    config = {"mcpServers": {SERVER: {
        "command": sys.executable,
        "args": [str(RECEIVER)],
        "env": {"RECEIVER_LOG": str(log), "RECEIVER_CONTROL": str(control),
                "PYTHONPATH": str(ROOT)},
        "timeout": timeout,
    }}}
    path = folder / "upstream.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def _now() -> str:
    return format_time(datetime.now(UTC))


def hold(store: Store, order_id: str, tool: str, arguments: dict[str, Any], *,
         attempt: int = 1, pass_jti: str | None = None) -> str:
    """Record a held call as the gateway does and return its ref."""
    at = _now()
    record = reserved(store.reserve_call(order_id, attempt=attempt, tool=tool, arguments=arguments,
                                pass_jti=pass_jti, usd=0.0, started_at=at, scopes=[]))
    store.hold_call(order_id, record.ref,
                    result={"content": [{"type": "text", "text": f"pending:{record.ref}"}]},
                    ended_at=at)
    return record.ref


def report_doc(effects: Sequence[dict[str, Any]], tools: Sequence[str],
               evidence_ref: str | None) -> dict[str, Any]:
    """A done report listing ``effects``."""
    evidence: dict[str, Any] = {"criterion": "c1", "type": "note", "note": "held for approval"}
    if evidence_ref is not None:
        evidence = {"criterion": "c1", "type": "tool_call", "ref": evidence_ref}
    return {
        "status": "done",
        "result": {"summary": "messages drafted and held"},
        "evidence": [evidence],
        "cost": {"usd": 0, "tool_calls": len(effects)},
        "tools_used": sorted(set(tools)),
        "effects": list(effects),
    }


def make_setup(
    folder: Path,
    calls: Sequence[tuple[str, dict[str, Any]]],
    *,
    approve: Sequence[int] | None = None,
    unlisted: Sequence[tuple[str, dict[str, Any]]] = (),
    tamper: dict[int, dict[str, Any]] | None = None,
    staged: Sequence[str] = ("receiver/deliver", "receiver/create_issue", "receiver/reject"),
    tools: Sequence[str] = ("receiver/*",),
    pass_jti: str | None = None,
    timeout: float = 20.0,
    deadline: datetime | None = None,
    rework_first: Sequence[tuple[str, dict[str, Any]]] = (),
    issued: bool = False,
    rewrite: Callable[[Store, str, list[dict[str, Any]]],
                      list[dict[str, Any]]] | None = None,
    store_url: str | None = None,
) -> Setup:
    """An approved order whose report lists the held ``calls`` (tool, arguments).

    Args:
        approve: indexes of the effects the manager approves (default all).
        unlisted: more held calls the report does not list.
        tamper: replacement arguments by effect index, written into the report (the desk
            would refuse such a report, so it is appended directly).
        rework_first: held calls of a first attempt that is sent back for rework.
        issued: record ``pass_jti`` as a pass issued for the order, so the desk revokes it
            when the order ends (at the approval).
        rewrite: given the store, the order id and the effects of the held ``calls``,
            returns the effects the report lists instead (appended directly, like
            ``tamper``); it may record more calls first.
        store_url: keep the order in the PostgreSQL store this URL names (and run
            committers with ``AWL_STORE`` set to it) instead of the home's SQLite desk.
    """
    home = folder / "home"
    home.mkdir(parents=True, exist_ok=True)
    store: Store
    if store_url is None:
        store = SQLiteStore(home / "desk.sqlite3")
    else:
        from awl.store.postgres import PostgresStore

        store = PostgresStore(store_url)
    desk = Desk(store)
    log, control = folder / "receiver.jsonl", folder / "receiver-control.json"
    control.write_text("{}", encoding="utf-8")
    config = write_config(folder, log, control, timeout=timeout)
    end = deadline or datetime.now(UTC) + timedelta(days=1)
    view = desk.create({
        "to": WORKER, "goal": "Send the held messages",
        "criteria": [{"id": "c1", "text": "messages sent"}],
        "budget": {"usd": 5, "tool_calls": 5000},
        "deadline": format_time(end),
        "tools": list(tools), "staged": list(staged),
    }, MANAGER)
    oid = view.id
    desk.accept(oid, WORKER)
    desk.start(oid, WORKER)
    if issued and pass_jti is not None:
        store.save_pass(PassRecord(jti=pass_jti, order_id=oid, parent_jti=None, subject=WORKER,
                                   exp=int(end.timestamp()), issued_at=_now()))
    attempt = 1
    if rework_first:
        old = [hold(store, oid, t, a, pass_jti=pass_jti) for t, a in rework_first]
        desk.report(oid, WORKER, report_doc(
            [{"ref": r, "tool": t, "arguments": a} for r, (t, a) in zip(old, rework_first,
                                                                         strict=True)],
            [t for t, _ in rework_first], old[0]))
        desk.review(oid, MANAGER, "rework", "try again")
        attempt = 2
    refs = [hold(store, oid, t, a, attempt=attempt, pass_jti=pass_jti) for t, a in calls]
    extra = [hold(store, oid, t, a, attempt=attempt, pass_jti=pass_jti) for t, a in unlisted]
    effects = [{"ref": r, "tool": t, "arguments": a}
               for r, (t, a) in zip(refs, calls, strict=True)]
    used = [t for t, _ in calls] + [t for t, _ in unlisted]
    doc = report_doc(effects, used, refs[0] if refs else None)
    if tamper or rewrite:
        for i, arguments in (tamper or {}).items():
            effects[i] = {**effects[i], "arguments": arguments}
        if rewrite is not None:
            effects = rewrite(store, oid, effects)
        record = store.load(oid)
        full = {**doc, "effects": effects, "spec": "awl/work-report@0.3", "order_id": oid,
                "from": WORKER, "finished_at": _now(), "attempt": attempt}
        event = Event.model_validate({
            "seq": record.seq + 1, "at": _now(), "actor": WORKER, "action": "report",
            "from": "working", "to": "submitted", "data": {"attempt": attempt,
                                                            "status": "done"}})
        store.append(oid, event, state="submitted", report=WorkReport.model_validate(full))
    else:
        desk.report(oid, WORKER, doc)
    chosen = None if approve is None else [refs[i] for i in approve]
    desk.review(oid, MANAGER, "approve", effects=chosen)
    return Setup(home, store, desk, oid, refs, config, log, control, extra, store_url)


def start_committer(setup: Setup, *, pause: tuple[Path, str] | None = None,
                    lock_wait: float = 0.0) -> subprocess.Popen[str]:
    """Run ``awl gateway --order ID --config FILE --commit`` in a child process; with
    ``pause`` (marker, ref), a committer that writes the ref to the marker right after its
    ``dispatching`` mark is durable and then freezes (:mod:`tests.gateway.committer`)."""
    if pause is None:
        command = ["-m", "awl", "gateway", "--order", setup.order_id, "--config",
                   str(setup.config), "--commit", "--home", str(setup.home),
                   "--lock-wait", str(lock_wait)]
    else:
        if lock_wait:
            raise ValueError("a pausing committer does not wait for the lock")
        marker, ref = pause
        command = ["-m", "tests.gateway.committer", setup.order_id, str(setup.config),
                   str(setup.home), str(marker), ref]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if setup.store_url is not None:
        env["AWL_STORE"] = setup.store_url
    return subprocess.Popen(
        [sys.executable, *command], cwd=str(ROOT), env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def kill9(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the process and reap it (so its pid is really gone)."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    if proc.stdout is not None:
        proc.stdout.close()
    if proc.stderr is not None:
        proc.stderr.close()


def wait_for(predicate: Any, *, timeout: float = 30.0, what: str = "condition") -> None:
    """Poll ``predicate`` until it is true (a bounded wait, never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.01)


def finish(proc: subprocess.Popen[str], timeout: float = 60.0) -> tuple[int, str, str]:
    """Wait for the committer and return (exit code, stdout, stderr)."""
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err
