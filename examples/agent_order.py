"""What the two framework examples share: the desk, the order, the script, the report.

``examples/pydantic_ai_agent.py`` and ``examples/openai_agents_agent.py`` each say only how
their framework runs one attempt through the gateway; the rest is here, on the library's
framework-neutral part (:mod:`awl.integrations`):

- a desk in ``--home`` (SQLite) with ``examples/outbox_server.py`` as the real upstream,
  which appends each sent email to ``outbox.jsonl`` and each call it receives to
  ``upstream-calls.jsonl``;
- the order of ``examples/order.json`` (fresh id and deadline), or ``--order ID`` to pick up
  an order already on the desk, wherever it is: working, waiting for review, approved;
- the scripted worker (:func:`scripted_step`) both frameworks' test models follow when no
  API key is set: search the notes, read the note found, draft the email (held), finish;
- the report, drafted from the call log, with this goal's summary and criterion mapping;
- the manager: ``--manager auto`` (default) approves from another thread as soon as the
  report is in; ``--manager none`` leaves the review to you (``awl review ...``), and the
  example waits for it on the desk, ``--review-timeout`` seconds at most.

Exit codes: 0 the order was approved and its effects committed; 1 it failed (one line on
stderr says why); 2 no review came in time (run it again with ``--order`` to wait on).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio

from awl import AWLError, Desk, OrderView, SQLiteStore
from awl.integrations import Attempt, ReviewTimeout, draft_report, work_order

EXAMPLES = Path(__file__).resolve().parent
MANAGER = "human:ana"
WORKER = "agent:clerk"
TEAM = "team@example.com"
INSTRUCTIONS = (
    "You work on a Work Order through the AWL gateway. Use the mail tools: find the note "
    "about the team offsite, read it, then send one email to team@example.com with the new "
    "address. Sending is held for the manager's approval: a 'pending:' answer means the "
    "email waits, which is what you want. Then answer with one sentence saying what you did.")


# --------------------------------------------------------------------------- the script

@dataclass(frozen=True)
class ToolStep:
    """The scripted model calls this tool next."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class FinalStep:
    """The scripted model ends the run with this answer."""

    text: str


def scripted_step(results: Sequence[tuple[str, str]],
                  rework_reason: str | None) -> ToolStep | FinalStep:
    """The scripted worker's next move, given the tool results so far as (tool, text).

    Both frameworks' test models call this; only how they read their messages differs.
    """
    done = [name for name, _ in results]
    if "mail__search_notes" not in done:
        return ToolStep("mail__search_notes", {"query": "offsite"})
    if "mail__get_note" not in done:
        found = re.search(r"\bn\d+\b", dict(results)["mail__search_notes"])
        return ToolStep("mail__get_note", {"id": found.group(0) if found else "n1"})
    if "mail__send_email" not in done:
        note = dict(results)["mail__get_note"]
        place = "the lake house" if "lake house" in note else "a new place (see the note)"
        body = f"Hi all, the offsite moved to {place}."
        if rework_reason:
            body += f" ({rework_reason})"
        return ToolStep("mail__send_email", {"to": TEAM, "subject": "Offsite: new address",
                                             "body": body})
    return FinalStep("Found the offsite note and drafted the email to the team; it waits for "
                     "approval.")


# --------------------------------------------------------------------------- the setting

@dataclass
class Setting:
    """The example's folder, desk and upstream config."""

    home: Path
    desk: Desk
    config: Path

    @property
    def outbox(self) -> Path:
        return self.home / "outbox.jsonl"

    def sent(self) -> list[dict[str, Any]]:
        """What the upstream really sent."""
        if not self.outbox.exists():
            return []
        return [json.loads(line) for line in self.outbox.read_text("utf-8").splitlines() if line]


def prepare(home: Path) -> Setting:
    """The desk in ``home`` and an upstream config for ``examples/outbox_server.py``."""
    home.mkdir(parents=True, exist_ok=True)
    document = json.loads((EXAMPLES / "upstream.json").read_text(encoding="utf-8"))
    document["mcpServers"]["mail"].update(
        command=sys.executable, args=[str(EXAMPLES / "outbox_server.py")], cwd=str(home),
        env={"OUTBOX_PATH": str(home / "outbox.jsonl"),
             "CALL_LOG_PATH": str(home / "upstream-calls.jsonl")})
    # A framework lists the tools once, when its run starts: let the gateway wait up to 30 s
    # for the mail upstream, so a busy machine still shows them (the default is 3 s).
    document.setdefault("gateway", {})["startup_wait"] = 30
    config = home / "upstream.json"
    config.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return Setting(home, Desk(SQLiteStore(home / "desk.sqlite3")), config)


def issue_order(desk: Desk) -> str:
    """The manager issues examples/order.json with a fresh id and a deadline in an hour."""
    fields = json.loads((EXAMPLES / "order.json").read_text(encoding="utf-8"))
    for key in ("id", "created_at"):
        fields.pop(key)
    deadline = datetime.now(UTC) + timedelta(hours=1)
    fields["deadline"] = deadline.isoformat(timespec="seconds").replace("+00:00", "Z")
    return desk.create(fields, MANAGER).id


def compose_report(desk: Desk, order_id: str, summary: str, started_at: str) -> dict[str, Any]:
    """The report: the call log's parts, with this goal's summary and criterion mapping."""
    draft = draft_report(desk, order_id, started_at=started_at)
    evidence = (draft.evidence("c1", "mail/get_note", outcome="ok",
                               note="the note gives the new address")
                + draft.evidence("c2", "mail/send_email", outcome="held",
                                 note="the email to the team, held for approval"))
    return draft.report(summary=summary, evidence=evidence)


def auto_manager(setting: Setting, order_id: str, stop: threading.Event) -> threading.Thread:
    """A manager in another thread: approves each report as soon as it is submitted."""
    def run() -> None:
        desk = Desk(setting.desk.store)
        while not stop.is_set():
            view = desk.get(order_id)
            if view.state == "submitted":
                desk.review(order_id, MANAGER, "approve")
                print(f"[manager] {MANAGER} approves attempt {view.attempt}", flush=True)
            elif not view.active:
                return
            desk.wait(order_id, view.seq, timeout=1.0)
    thread = threading.Thread(target=run, name="manager", daemon=True)
    thread.start()
    return thread


# --------------------------------------------------------------------------- main

RunAgent = Callable[[Setting, str, Attempt], Awaitable[str]]
"""Runs one attempt with the framework's agent through the gateway; returns its answer."""


async def run_order(setting: Setting, order_id: str, run_agent: RunAgent, *,
                    review_timeout: float) -> int:
    """The order, to its end; prints each step. Returns the exit code."""
    async def attempt(this: Attempt) -> dict[str, Any]:
        why = f" (sent back: {this.rework_reason})" if this.rework_reason else ""
        print(f"[worker] attempt {this.number}{why}: the agent runs through the gateway",
              flush=True)
        started_at = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        answer = await run_agent(setting, order_id, this)
        report = compose_report(setting.desk, order_id, answer, started_at)
        print(f"[worker] submits attempt {this.number}: effects "
              f"{[e['ref'] for e in report['effects']]}, evidence "
              f"{[e['ref'] for e in report['evidence']]}", flush=True)
        return report

    ran: list[int] = []

    def waiting(view: OrderView) -> None:
        already = "" if view.attempt in ran else f"; attempt {view.attempt} is already submitted"
        print(f"[worker] waiting for review of {order_id} (outbox: {len(setting.sent())} "
              f"sent{already})", flush=True)

    async def attempt_once(this: Attempt) -> dict[str, Any]:
        ran.append(this.number)
        return await attempt(this)

    outcome = await work_order(setting.desk, order_id, WORKER, attempt_once,
                               config=setting.config, review_timeout=review_timeout,
                               on_wait=waiting)
    verdict = outcome.verdict
    if verdict.decision != "approved" or outcome.commit is None:
        print(f"order {order_id} ended without approval: {verdict.reason}", file=sys.stderr)
        return 1
    print(f"[worker] attempt {verdict.attempt} approved; the commit ran:", flush=True)
    for line in outcome.commit.lines():
        print(f"    {line}", flush=True)
    print(f"outbox: {len(setting.sent())} sent", flush=True)
    return 0 if outcome.commit.ok else 1


def main(run_agent: RunAgent, description: str, argv: Sequence[str] | None = None) -> int:
    """The example's command line, around ``run_agent``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--home", default="agent-desk", metavar="DIR",
                        help="the desk's folder (default: ./agent-desk)")
    parser.add_argument("--order", metavar="ID",
                        help="pick up this order on the desk instead of issuing a new one")
    parser.add_argument("--manager", choices=("auto", "none"), default="auto",
                        help="auto: approve each report at once; none: wait for your review")
    parser.add_argument("--review-timeout", type=float, default=600.0, metavar="SECONDS",
                        help="how long to wait for the review (default 600)")
    args = parser.parse_args(argv)
    setting = prepare(Path(args.home).resolve())
    stop = threading.Event()
    began = time.monotonic()
    try:
        order_id = args.order or issue_order(setting.desk)
        print(f"order {order_id} on the desk in {setting.home}", flush=True)
        manager = auto_manager(setting, order_id, stop) if args.manager == "auto" else None
        code = anyio.run(lambda: run_order(setting, order_id, run_agent,
                                           review_timeout=args.review_timeout))
        if manager is not None:
            stop.set()
            manager.join()
    except ReviewTimeout as exc:
        print(f"no review yet: {exc}", file=sys.stderr)
        return 2
    except AWLError as exc:
        print(f"the order could not go on: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # the framework's own failure: say it in one line
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]  # type: ignore[assignment]
        print(f"the agent run failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        stop.set()
        setting.desk.store.close()
    print(f"done in {time.monotonic() - began:.1f} s", flush=True)
    return code
