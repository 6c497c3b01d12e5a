"""The framework-neutral part of running an order with an agent framework.

Every integration does the same four things around the framework's own agent run:

1. start the gateway for the order as the framework's MCP server (:func:`gateway_command`
   gives the ``awl gateway`` command line each framework's stdio client runs);
2. after the run, draft the worker's report from the call log (:func:`draft_report`):
   ``effects`` are the attempt's held calls in order, ``tools_used`` and ``tool_call``
   evidence come from the log; the summary and which call proves which criterion are the
   caller's to say;
3. wait for the manager's review (:func:`wait_for_review`): a bounded long-poll on the
   desk, answered ``approved`` or ``rework`` with the manager's reason;
4. on approval, run the commit (:func:`commit_approved`), which sends each approved effect
   at most once, however often it is run.

:func:`work_order` strings them together. Everything it decides it reads from the desk, so
an agent process that ends while the report waits for review (a crash, a deploy) picks up
where the order is when it starts again: it waits for the same review, and the approval
reaches it.
"""

from __future__ import annotations

import inspect
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from awl.desk import AsyncDesk, Desk, OrderView
from awl.desk.home import DESK_FILE, ENV_VAR
from awl.desk.waiting import check_timeout
from awl.documents.errors import AWLError, BadRequest, DocumentError, Forbidden, NotFound
from awl.documents.limits import read_regular_file, show_value
from awl.documents.models import CallRecord
from awl.store.urls import STORE_ENV, open_store
from gateway import CommitSummary, commit, listable_effects, load_config, tools_used

# --------------------------------------------------------------------------- the gateway

STARTUP_TIMEOUT = 60.0
"""Seconds the gateway may take to start (its upstreams first) and answer the handshake;
the frameworks' own defaults (5 s) are too short on a busy machine."""


def missing_extra(module: str, extra: str) -> str:
    """The one line an integration module raises when its framework is not installed."""
    return (f"{module} needs the {extra} extra: pip install -e '.[{extra}]' in the "
            "awl-gateway checkout")


@dataclass(frozen=True)
class GatewayCommand:
    """How to start ``awl gateway`` for one order as a stdio MCP server."""

    command: str
    args: list[str]
    env: dict[str, str]
    cwd: str | None = None


def _path(value: object, name: str) -> Path:
    """``value`` as a path, or BadRequest naming the argument."""
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise BadRequest(f"{name} must be a path (a str or os.PathLike), not "
                         f"{show_value(value)}")
    return Path(value)


def _readable(path: Path, what: str) -> None:
    """BadRequest unless ``path`` is a regular file this process can read."""
    try:
        read_regular_file(path, what=what, max_bytes=0)
    except DocumentError as exc:
        raise BadRequest(exc.message) from None


def check_gateway(order_id: str, config: Path, *, home: Path | None, store: str | None,
                  pass_file: Path | None, env: Mapping[str, str]) -> None:
    """What the gateway for ``order_id`` would stop on at its start, checked here first.

    A gateway that cannot start ends its stdio stream with one line on its stderr, and the
    framework's MCP client says only that the connection closed; worse, a home folder given
    by mistake would be made, with a new, empty desk in it. So: the config is read and
    checked (with this process's environment, when the gateway gets it too), the home and
    the pass file must exist, and the order must be on the desk the gateway will open.

    Raises:
        BadRequest: the config, the home or the pass file cannot be used (one line: which
            and why).
        StoreUnavailable: there is no desk where the gateway would look (nothing is made).
        NotFound: the desk has no such order.
    """
    if env is os.environ:
        load_config(config)  # ConfigError, a BadRequest naming the key and what is allowed
    else:  # its $VARs are the gateway's environment's: only that it can be read
        _readable(config, "the gateway config")
    if home is not None and not home.is_dir():
        raise BadRequest(f"the AWL home {home} is not a folder (a typo?): give home= the "
                         "folder the desk is in; nothing was started")
    if pass_file is not None:
        _readable(pass_file, "the pass file")
    url = store if store is not None else env.get(STORE_ENV) or None
    if url is None:
        folder = home if home is not None else (
            Path(env[ENV_VAR]) if env.get(ENV_VAR) else Path.cwd() / ".awl")
        desk = open_store(folder.expanduser() / DESK_FILE, create=False)
    else:
        desk = open_store(url, create=False)
    try:
        desk.load(order_id)
    except NotFound:
        where = url if url is not None else f"in {folder}"
        raise NotFound(f"no order {order_id!r} on the desk {where}: check the id, and give "
                       "home= (or store=) the desk it was issued on; nothing was "
                       "started") from None
    finally:
        desk.close()


def gateway_command(order_id: str, config: str | os.PathLike[str], *,
                    home: str | os.PathLike[str] | None = None, store: str | None = None,
                    pass_file: str | os.PathLike[str] | None = None, safe: bool = False,
                    env: Mapping[str, str] | None = None, check: bool = True) -> GatewayCommand:
    """The command line of the gateway for ``order_id``, run with this Python.

    Args:
        order_id: The order the agent works on.
        config: The gateway's upstream config file (the ``mcpServers`` shape).
        home: The desk's folder (default: ``AWL_HOME`` or ``./.awl``, read by the gateway).
        store: The desk's store URL (see :func:`awl.open_store`; default ``AWL_STORE``, else
            the SQLite file in the home). Given to the gateway as ``AWL_STORE`` in its
            environment, so a password in it stays out of the process list.
        pass_file: Run the connection under the Delegation Pass in this file.
        safe: Hold every tool the upstream does not mark read-only (``--safe``).
        env: The gateway's environment (default: this process's, so ``$VAR`` values in
            the config resolve as they do for ``awl gateway`` run from your shell). MCP
            stdio clients start servers with a bare environment unless told otherwise, so
            it is always given.
        check: First check, in this process, what the gateway would stop on at its start
            (:func:`check_gateway`: the config, the home, the pass file, the order on the
            desk), so a mistake is one clear error here rather than a closed connection
            inside the framework. It opens the desk for a moment.

    Raises:
        BadRequest: an argument of the wrong type, or (``check``) a config, home or pass
            file that cannot be used.
        StoreUnavailable: (``check``) no desk where the gateway would look.
        NotFound: (``check``) the desk has no such order.
    """
    if not isinstance(order_id, str) or not order_id.strip():
        raise BadRequest(f"order_id must be an order's id (a non-empty str), not "
                         f"{show_value(order_id)}")
    if store is not None and not isinstance(store, str):
        raise BadRequest(f"store must be a store URL (a str), not {show_value(store)}")
    config_path = _path(config, "config").resolve()
    home_path = None if home is None else _path(home, "home").expanduser().resolve()
    pass_path = None if pass_file is None else _path(pass_file, "pass_file").resolve()
    source = os.environ if env is None else env
    if check:
        check_gateway(order_id, config_path, home=home_path, store=store,
                      pass_file=pass_path, env=source)
    args = ["-m", "awl", "gateway", "--order", order_id, "--config", str(config_path)]
    if home_path is not None:
        args += ["--home", str(home_path)]
    if pass_path is not None:
        args += ["--pass-file", str(pass_path)]
    if safe:
        args.append("--safe")
    environ = dict(source)
    if store is not None:
        environ[STORE_ENV] = store
    return GatewayCommand(sys.executable, args, environ)


# --------------------------------------------------------------------------- the report

@dataclass(frozen=True)
class ReportDraft:
    """What the call log says about one attempt: the parts of the report it can fill in."""

    order_id: str
    attempt: int
    calls: tuple[CallRecord, ...]
    """The attempt's recorded calls, oldest first."""
    tools_used: list[str]
    """Every tool of the attempt that ran, failed or was held (what rule RX4 asks)."""
    effects: list[dict[str, Any]]
    """The attempt's held calls of staged tools, in order, as ``{ref, tool, arguments}``."""
    cost: dict[str, Any]
    """What the gateway counted for the order: ``tool_calls`` and ``usd``."""
    started_at: str | None = None

    def refs(self, tool: str | None = None, *, outcome: str | None = None) -> list[str]:
        """The refs of the attempt's calls, optionally of one tool or outcome."""
        return [c.ref for c in self.calls
                if (tool is None or c.tool == tool) and (outcome is None or c.outcome == outcome)]

    def evidence(self, criterion: str, tool: str | None = None, *, outcome: str | None = None,
                 note: str | None = None) -> list[dict[str, Any]]:
        """``tool_call`` evidence for ``criterion``: one item per matching call.

        Raises:
            BadRequest: no call of the attempt matches, so there is nothing to cite.
        """
        refs = self.refs(tool, outcome=outcome)
        if not refs:
            what = " ".join(filter(None, [tool, outcome])) or "any tool"
            raise BadRequest(f"attempt {self.attempt} of {self.order_id} recorded no call of "
                             f"{what} to cite for criterion {criterion}")
        return [{"criterion": criterion, "type": "tool_call", "ref": ref,
                 **({"note": note} if note else {})} for ref in refs]

    def report(self, *, summary: str, evidence: Sequence[Mapping[str, Any]],
               status: Literal["done", "failed", "blocked"] = "done",
               **fields: Any) -> dict[str, Any]:
        """The Work Report: the log's parts, plus the caller's summary, evidence and fields.

        ``fields`` add or replace top-level report fields (``handoff``, ``questions``,
        ``result`` with more than a summary, ...).
        """
        report: dict[str, Any] = {
            "status": status,
            "result": {"summary": summary},
            "evidence": [dict(e) for e in evidence],
            "cost": dict(self.cost),
            "tools_used": list(self.tools_used),
            "effects": [dict(e) for e in self.effects],
        }
        if self.started_at is not None:
            report["started_at"] = self.started_at
        report.update(fields)
        return report


def draft_report(desk: Desk, order_id: str, *, started_at: str | None = None) -> ReportDraft:
    """Read the current attempt's calls from the desk's call log into a :class:`ReportDraft`.

    Raises:
        NotFound: no such order.
    """
    view = desk.get(order_id)
    calls = tuple(desk.calls(order_id, attempt=view.attempt))
    usage = desk.store.usage(order_id)
    return ReportDraft(order_id=order_id, attempt=view.attempt, calls=calls,
                       tools_used=tools_used(calls),
                       effects=listable_effects(view.order, calls),
                       cost={"tool_calls": usage.tool_calls, "usd": round(usage.usd, 6)},
                       started_at=started_at)


# --------------------------------------------------------------------------- the review

class ReviewTimeout(AWLError, TimeoutError):
    """No review came within the wait; the report still waits on the desk."""

    code = "TIMEOUT"


@dataclass(frozen=True)
class Verdict:
    """What became of a submitted attempt."""

    decision: Literal["approved", "rework", "ended"]
    """``approved``; ``rework`` (the order is working again, as the next attempt); or
    ``ended`` (cancelled or expired before any review)."""
    attempt: int
    """The attempt that was reviewed."""
    reason: str | None = None
    """The manager's reason (always given for a rework), or what ended the order."""
    effects: tuple[str, ...] | None = None
    """On approval: the effects the manager chose (None: all of the report's)."""
    state: str = ""
    """The order's state when the verdict was read."""


def _verdict(view: OrderView, attempt: int) -> Verdict | None:
    """The verdict on ``attempt`` if the desk has one; None while it waits for review."""
    for review in view.reviews:
        if review.attempt == attempt:
            decision: Literal["approved", "rework"] = (
                "approved" if review.decision == "approve" else "rework")
            return Verdict(decision, attempt, review.reason, review.effects, view.state)
    if view.state == "submitted" and attempt == view.attempt:
        return None
    if view.state in ("cancelled", "expired", "declined"):
        return Verdict("ended", attempt, f"the order was {view.state} before any review",
                       state=view.state)
    if attempt > view.attempt or view.state != "submitted":
        raise BadRequest(f"order {view.id} has no submitted report for attempt {attempt} "
                         f"(it is {view.state}, attempt {view.attempt}): submit one first")
    raise BadRequest(f"attempt {attempt} of order {view.id} was never reviewed (it is "
                     f"{view.state}, attempt {view.attempt}): wait for attempt "
                     f"{view.attempt} instead")


async def wait_for_review(desk: Desk, order_id: str, *, attempt: int | None = None,
                          timeout: float = 600.0) -> Verdict:
    """Wait for the manager's review of ``attempt`` (default: the latest report's).

    A long-poll on the desk: it sleeps until the order has a new event (at once for writes
    in this process, by a short growing poll of the store for other processes), never
    longer than ``timeout`` seconds in all. The verdict is read from the desk's state, so a
    process that starts after the review was given gets it at once.

    Raises:
        ReviewTimeout: no review within ``timeout``; the report still waits, so call again.
        BadRequest: the order has no submitted report for that attempt.
        NotFound: no such order.
    """
    timeout = check_timeout(timeout)
    if attempt is not None and (isinstance(attempt, bool) or not isinstance(attempt, int)
                                or attempt < 1):
        raise BadRequest(f"attempt must be an attempt's number (1 or more), not "
                         f"{show_value(attempt)}")
    waiter = AsyncDesk.of(desk)
    view = await waiter.get(order_id)
    if attempt is None:
        report = view.latest_report
        attempt = (view.attempt if view.state == "submitted" or report is None
                   else report.attempt or 1)
    end = time.monotonic() + max(0.0, timeout)
    while True:
        verdict = _verdict(view, attempt)
        if verdict is not None:
            return verdict
        left = end - time.monotonic()
        if left <= 0:
            raise ReviewTimeout(f"no review of order {order_id} attempt {attempt} within "
                                f"{timeout:g} s; the report still waits on the desk, so wait "
                                "again (or run the agent again) to get the decision")
        await waiter.wait(order_id, view.seq, timeout=left)
        view = await waiter.get(order_id)


# --------------------------------------------------------------------------- the commit

async def commit_approved(desk: Desk, order_id: str,
                          config: str | os.PathLike[str] | Mapping[str, Any]) -> CommitSummary:
    """Run the approved effects of ``order_id`` through the gateway's commit, once each.

    Safe to call again (after a crash too): effects that ran, or may have, are never sent
    again. See :func:`gateway.commit`.
    """
    return await commit(order_id, store=desk.store, pool_or_config=config, desk=desk)


# --------------------------------------------------------------------------- the loop

@dataclass(frozen=True)
class Attempt:
    """One run of the agent: which attempt, and why the manager sent the last one back."""

    order: OrderView
    number: int
    rework_reason: str | None = None
    """The manager's reason when the previous attempt was sent back, else None."""


@dataclass
class Outcome:
    """How :func:`work_order` ended."""

    verdict: Verdict
    commit: CommitSummary | None = None
    """The commit's summary, when the order was approved."""
    runs: list[int] = field(default_factory=list)
    """The attempts the agent ran in this process (none when it only waited or committed)."""


async def work_order(desk: Desk, order_id: str, worker: str,
                     run: Callable[[Attempt], Awaitable[dict[str, Any]]], *,
                     config: str | os.PathLike[str] | Mapping[str, Any],
                     review_timeout: float = 600.0, max_attempts: int = 5,
                     on_wait: Callable[[OrderView], object] | None = None) -> Outcome:
    """Run the order to its end: work, report, wait for review, rework or commit.

    ``run(attempt)`` runs the framework's agent through the gateway and returns the Work
    Report to submit (build it with :func:`draft_report`). The loop reads the order's state
    first, so it resumes where the order is: a submitted report is waited on, not redone;
    an approved order is committed (again: nothing is sent twice). ``on_wait(view)`` is
    called each time the loop starts waiting for a review (to tell someone, say).

    Raises:
        ReviewTimeout: no review within ``review_timeout``.
        BadRequest: the order is in a state this loop cannot move (blocked, declined), or
            ``max_attempts`` reworks were asked for.
        AWLError: the desk refused a step (an invalid report, say), with its findings.
    """
    if not callable(run):
        raise BadRequest(f"run must be an async function of the attempt, not {show_value(run)}")
    runs: list[int] = []
    view = desk.get(order_id)
    if view.order.to != worker:
        raise Forbidden(f"order {order_id} is {view.order.to}'s, not {show_value(worker)}'s: "
                        "run it as its worker", actor=str(worker), action="work")
    if view.state == "offered":
        view = desk.accept(order_id, worker)
    if view.state == "accepted":
        view = desk.start(order_id, worker)
    while True:
        if view.state == "working":
            if len(runs) >= max_attempts:
                raise BadRequest(f"order {order_id} was sent back {len(runs)} times in this run;"
                                 " stopping (raise max_attempts to go on)")
            last = view.latest_review
            reason = last.reason if last is not None and last.decision == "rework" else None
            pending = run(Attempt(view, view.attempt, reason))
            if not inspect.isawaitable(pending):
                raise BadRequest("run must be an async function (async def run(attempt)) "
                                 f"returning the report; it returned a {type(pending).__name__},"
                                 f" not an awaitable: the order is still {view.state}")
            report = await pending
            runs.append(view.attempt)
            view = desk.report(order_id, worker, report)
            continue
        if view.state == "submitted" or view.state == "approved":
            if view.state == "submitted" and on_wait is not None:
                on_wait(view)
            verdict = await wait_for_review(desk, order_id, timeout=review_timeout)
            if verdict.decision == "rework":
                view = desk.get(order_id)
                continue
            if verdict.decision == "ended":
                return Outcome(verdict, runs=runs)
            summary = await commit_approved(desk, order_id, config)
            return Outcome(verdict, summary, runs)
        if view.state in ("cancelled", "expired"):
            return Outcome(Verdict("ended", view.attempt, f"the order is {view.state}",
                                   state=view.state), runs=runs)
        raise BadRequest(f"order {order_id} is {view.state}: this loop runs accepted, working "
                         "and submitted orders (answer a blocked order's questions first)")
