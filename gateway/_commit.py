"""Committing approved effects: each runs at most once, whatever crashes, whoever re-runs.

:func:`commit` sends the effects the manager approved, once each, in the report's order;
:func:`retry` sends again one settled ``did_not_happen``. SPEC §15 is the contract: the checks
before anything runs (CM-1 to CM-4, LC-14, LC-22), ``$ref`` placeholders (CM-5), the
write-ahead and the states (CM-6 to CM-9, CM-13; the moves are
:data:`awl.documents.effect_states.TABLE`), the order's lock (CM-10), settlement and retry
(CM-11), what a commit prints (CM-12).

How this module keeps it: the ``held -> dispatching`` mark is written, durable, inside the
upstream pool's ``before_send`` hook, after the connection is up and before a byte of the
request is written. The pool raises :class:`~gateway._upstream.UpstreamUnavailable` before the
hook when it cannot connect (nothing marked: the effect stays ``held``), or with
``sent=False`` after it when the connection was gone (back to ``held``, ``unknown`` for a
retry); any other failure after the mark, a cancellation included, leaves ``unknown``. A desk
that cannot record an answer is asked again for up to a lease, then the effect stays
``dispatching`` and nothing more is sent. Orders above are read again before every send (one
past its deadline counts as expired before the desk writes so); arguments that are one
placeholder naming a non-object are ``skipped``. Results are kept as the wire carries them, so
pointers use its camelCase names (``/structuredContent/number``). Settlement and the effect
list send nothing: they live in :mod:`awl.desk` and are re-exported here.

Kill tests: :func:`commit` and :func:`retry` take ``after_dispatching``, called on the event
loop with the ref once its mark is durable and before its request is written, so a test can
``kill -9`` the committer at exactly that point.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, Protocol

import anyio
import mcp_types as types

from awl.desk import (
    Clock,
    Desk,
    EffectView,
    ancestors,
    drop_held,
    effect_of,
    ended_above,
    find_call,
    held_calls,
    list_effects,
    manager_only,
    settle,
    settle_events,
    staging_ancestor,
    valid_settlement,
)
from awl.desk import record_event as _log
from awl.documents import (
    AWLError,
    CallRecord,
    Conflict,
    InvalidTransition,
    NotFound,
    StoreUnavailable,
    WorkOrder,
    WorkReport,
    canonical_ref,
    format_time,
    json_equal,
    matches_any,
    parse_ref,
    parse_time,
    resolve_pointer,
    utc_now,
)
from awl.store import EffectState, OrderRecord, Revocation, Store
from gateway._config import GatewayConfig, load_config
from gateway._lock import DEFAULT_LEASE, LockLost, OrderLock
from gateway._names import split_canonical
from gateway._policy import allowed
from gateway._staging import Placeholder, placeholders
from gateway._telemetry import current as current_telemetry
from gateway._upstream import (
    UpstreamPool,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
)

__all__ = [
    "COMMIT_ACTOR",
    "CommitSummary",
    "EffectOutcome",
    "EffectView",
    "Mismatch",
    "Upstreams",
    "commit",
    "commit_sync",
    "drop_attempt",
    "list_effects",
    "lock_name",
    "retry",
    "retry_sync",
    "settle",
]

NO_EFFECT = "none"
"""The state an outcome shows for a listed call that has no effect (it was never held)."""

COMMIT_ACTOR = "awl:gateway"
"""The actor of the ``drop`` events the commit path writes."""

_RECORD_PAUSE = 0.2
"""Seconds between two attempts to record an effect's outcome in a desk that is busy."""

AfterDispatching = Callable[[str], None]
"""Called with an effect's ref once its ``dispatching`` mark is durable, before the send."""


class Upstreams(Protocol):
    """What the committer needs from an upstream pool: one tool call with ``_meta``."""

    async def call(self, server: str, tool: str, arguments: Mapping[str, Any] | None = None,
                   *, meta: Mapping[str, Any] | None = None, timeout: float | None = None,
                   before_send: Callable[[], Awaitable[None]] | None = None,
                   ) -> types.CallToolResult:
        """Send one ``tools/call`` and return the answer, awaiting ``before_send`` after
        the connection is up and before the request is written."""
        ...


UpstreamSource = Any
"""An :class:`Upstreams` (used as is), a loaded ``GatewayConfig``, a config mapping, or
the path of an upstream config file (a pool is opened and closed around the sends)."""


# --------------------------------------------------------------------------- results

@dataclass(frozen=True, slots=True)
class Mismatch:
    """One reason the pre-check refused to run anything.

    ``problem`` is a stable code: ``bad_ref``, ``duplicate``, ``not_recorded``,
    ``other_order``, ``tool``, ``arguments``, ``attempt``, ``not_held``, ``not_latest``,
    ``not_in_report``, ``not_allowed``, ``not_staged``, ``staged_above``, ``pass_revoked``,
    ``no_report``, ``no_approval``. ``path`` is a JSON pointer into the report
    (``/effects/2/arguments``) or, for the manager's choice, into the approving review
    (``/review/effects/0``).
    """

    ref: str
    path: str
    problem: str
    message: str

    def to_json(self) -> dict[str, str]:
        """JSON-ready data."""
        return {"ref": self.ref, "path": self.path, "problem": self.problem,
                "message": self.message}


@dataclass(frozen=True, slots=True)
class EffectOutcome:
    """Where one approved effect stands after a commit (or retry)."""

    ref: str
    tool: str
    state: str
    """The effect's state now: ``committed``, ``failed``, ``unknown``, ``skipped``,
    ``held`` (not run), ``dropped``; ``none`` for a listed call that was never held (the
    pre-check names it, and nothing runs)."""
    reason: str
    """A short explanation, for people."""
    sent: bool = False
    """Whether this run marked it ``dispatching`` (and so may have sent it)."""
    result: dict[str, Any] | None = None
    """The recorded result (wire form), when there is one."""

    def to_json(self) -> dict[str, Any]:
        """JSON-ready data."""
        out: dict[str, Any] = {"ref": self.ref, "tool": self.tool, "state": self.state,
                               "reason": self.reason, "sent": self.sent}
        if self.result is not None:
            out["result"] = self.result
        return out


@dataclass(frozen=True, slots=True)
class CommitSummary:
    """What one commit did."""

    order_id: str
    attempt: int
    effects: tuple[EffectOutcome, ...] = ()
    """Every approved effect, in the report's order."""
    dropped: tuple[str, ...] = ()
    """Held calls this run dropped (not approved, not listed, or of an older attempt)."""
    recovered: tuple[str, ...] = ()
    """Effects this run found ``dispatching`` (their committer was gone) and made ``unknown``."""
    mismatches: tuple[Mismatch, ...] = ()
    """Why nothing ran, when the pre-check failed."""
    took_over: str | None = None
    """The stale lock holder this run replaced, if any."""
    refused: str | None = None
    """Why nothing (more) ran and the held calls were dropped, when an order above this
    sub-order has ended, before the commit or while it ran (LC-22)."""

    @property
    def ok(self) -> bool:
        """Whether every approved effect is committed (and the pre-check passed)."""
        return (not self.mismatches and self.refused is None
                and all(e.state == "committed" for e in self.effects))

    def lines(self) -> list[str]:
        """The summary as lines for a terminal: one per effect, then totals."""
        ran = "nothing more ran" if any(e.sent for e in self.effects) else "nothing ran"
        out = [] if self.refused is None else [
            f"order {self.order_id}: {ran} and its held calls were dropped: {self.refused}"]
        out += [f"mismatch {m.ref} {m.path}: {m.message}" for m in self.mismatches]
        if self.mismatches:
            out.append(f"order {self.order_id}: nothing ran; {len(self.mismatches)} "
                       "mismatch(es) between the approved report and the call log")
        width = max((len(e.ref) for e in self.effects), default=0)
        tool_width = max((len(e.tool) for e in self.effects), default=0)
        for e in self.effects:
            out.append(f"{e.ref:<{width}}  {e.tool:<{tool_width}}  {e.state:<10}  {e.reason}")
        if self.recovered:
            out.append(f"found dispatching with no outcome (now unknown): "
                       f"{', '.join(self.recovered)}")
        if self.dropped:
            out.append(f"dropped: {', '.join(self.dropped)}")
        counts: dict[str, int] = {}
        for e in self.effects:
            counts[e.state] = counts.get(e.state, 0) + 1
        tally = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no effects"
        out.append(f"order {self.order_id} attempt {self.attempt}: {tally}")
        return out

    def to_json(self) -> dict[str, Any]:
        """JSON-ready data."""
        return {
            "order_id": self.order_id, "attempt": self.attempt, "ok": self.ok,
            "effects": [e.to_json() for e in self.effects],
            "dropped": list(self.dropped), "recovered": list(self.recovered),
            "mismatches": [m.to_json() for m in self.mismatches],
            "took_over": self.took_over, "refused": self.refused,
        }


class _AboveEnded(AWLError):
    """Raised before a mark when an order above the one committed has ended (LC-22)."""

    code = "INVALID_TRANSITION"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# --------------------------------------------------------------------------- helpers

def _stamp(clock: Clock) -> str:
    return format_time(clock())


def _above_ended(desk: Desk, store: Store, order: WorkOrder) -> str | None:
    """:func:`awl.desk.ended_above`, once the desk has expired every order above that is
    past its deadline: such an order has ended (LC-22) though its expiry is written only
    when the desk next reads it, which may not have happened yet."""
    if order.parent_id is None:
        return None
    for above in ancestors(store, order):
        with contextlib.suppress(NotFound, Conflict):
            desk.get(above.id)  # expires it first when it is active past its deadline
    return ended_above(store, order)


def lock_name(order_id: str) -> str:
    """The name of the store lock one committer of ``order_id`` holds."""
    return f"commit:{order_id}"


def _put(document: Any, path: Sequence[str | int], value: Any) -> Any:
    if not path:
        return value
    here = document
    for part in path[:-1]:
        here = here[part]
    here[path[-1]] = value
    return document


def fill_refs(arguments: dict[str, Any],
              states: Mapping[str, EffectState]) -> tuple[dict[str, Any], str | None]:
    """Replace every ``$ref`` placeholder in ``arguments`` from the recorded results.

    Returns:
        The filled arguments and None, or the untouched arguments and why it cannot be
        filled (the reason the dependent effect is skipped).
    """
    found: list[Placeholder] = []
    for item in placeholders(arguments):
        if isinstance(item, str):
            return arguments, item
        found.append(item)
    if not found:
        return arguments, None
    filled = copy.deepcopy(arguments)
    for ph in found:
        target = states.get(ph.ref)
        if target is None:
            return arguments, f"needs {ph.ref}, which was not held"
        if target.state != "committed" or target.result is None:
            return arguments, f"needs {ph.ref}, which is {target.state}, not committed"
        try:
            value = resolve_pointer(target.result, ph.pointer)
        except KeyError:
            return arguments, f"the result of {ph.ref} has nothing at {ph.pointer or '(root)'}"
        filled = _put(filled, ph.path, copy.deepcopy(value))
    if not isinstance(filled, dict):
        # Arguments that are all one placeholder, pointing at a string, a number or a list:
        # no tool call can carry them (the pool's dict() made {"type": "text"} of a content
        # list, and raised past the mark for the rest).
        return arguments, (f"takes its arguments from {found[0].pointer or '(root)'} in the "
                           f"result of {found[0].ref}, which is {_json_type(filled)}, not an "
                           "object; a tool's arguments must be an object")
    return filled, None


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else type(value).__name__


def _result_json(result: types.CallToolResult) -> dict[str, Any]:
    data: dict[str, Any] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    return data


def _error_text(result: types.CallToolResult, limit: int = 300) -> str:
    for block in result.content:
        text = getattr(block, "text", None)
        if isinstance(text, str) and text.strip():
            return text.strip()[:limit]
    return "the upstream answered with an error"


def _report_attempt(record: OrderRecord, report: WorkReport) -> int:
    return report.attempt if report.attempt is not None else record.attempt


# --------------------------------------------------------------------------- upstreams

class _Upstreams:
    """Opens the upstream pool on first use, so a commit with nothing to send starts no
    upstream server."""

    def __init__(self, source: UpstreamSource, stack: AsyncExitStack) -> None:
        self._source = source
        self._stack = stack
        self._pool: Upstreams | None = None

    async def get(self) -> Upstreams:
        if self._pool is None:
            self._pool = await _open_pool(self._source, self._stack)
        return self._pool


async def _open_pool(source: UpstreamSource, stack: AsyncExitStack) -> Upstreams:
    if hasattr(source, "call") and callable(source.call):
        pool: Upstreams = source
        return pool
    config = source if isinstance(source, GatewayConfig) else load_config(source)
    opened: Upstreams = await stack.enter_async_context(UpstreamPool(config))
    return opened


# --------------------------------------------------------------------------- the plan

def _later(at: str, than: str) -> bool:
    """Whether time ``at`` is after ``than``; an unreadable time is taken as not later."""
    try:
        return parse_time(at) > parse_time(than)
    except ValueError:
        return False


@dataclass(frozen=True)
class _Revocations:
    """The desk's revocations and the order's pass lineage, to tell whether a held call's
    pass was valid when the call was held."""

    revocations: Mapping[str, Revocation]
    parents: Mapping[str, str | None]

    @classmethod
    def of(cls, store: Store, order_id: str) -> _Revocations:
        return cls(store.revocations(),
                   {p.jti: p.parent_jti for p in store.passes(order_id)})

    def problem(self, call: CallRecord) -> str | None:
        """Why the call's pass was not valid when it was held, or None when it was.

        A link of the chain revoked after the call started does not count: every pass is
        revoked when its order ends (approval included), and the call was made with
        authority in force. One revoked at the same moment or before does.
        """
        jti, seen = call.pass_jti, set()
        while jti is not None and jti not in seen:
            seen.add(jti)
            found = self.revocations.get(jti)
            if found is not None and not _later(found.at, call.started_at):
                via = "" if jti == call.pass_jti else f", derived from pass {jti}"
                return (f"pass {call.pass_jti}{via}, which was revoked at {found.at} "
                        f"({found.reason}), before the call at {call.started_at}")
            jti = self.parents.get(jti)
        return None


@dataclass
class _Plan:
    record: OrderRecord
    report: WorkReport | None
    attempt: int
    approved: list[CallRecord] = field(default_factory=list)
    drops: dict[str, str] = field(default_factory=dict)
    mismatches: list[Mismatch] = field(default_factory=list)


def _precheck(record: OrderRecord, calls: Sequence[CallRecord], revoked: _Revocations,
              above: Sequence[WorkOrder] = ()) -> _Plan:
    """Compare the approved report with the call log and recheck authority.

    ``above`` is the chain of orders the order was split from (parent first): a tool one
    of them stages never runs on this order's approval (LC-14)."""
    order = record.order
    if not record.reports:
        plan = _Plan(record, None, 0)
        plan.mismatches.append(Mismatch("", "", "no_report",
                                        f"order {order.id} has no report to commit"))
        return plan
    report = record.reports[-1]
    attempt = _report_attempt(record, report)
    plan = _Plan(record, report, attempt)
    bad = plan.mismatches.append
    review = next((r for r in reversed(record.reviews)
                   if r.attempt == attempt and r.decision == "approve"), None)
    if review is None:
        bad(Mismatch("", "", "no_approval",
                     f"attempt {attempt} of order {order.id} has no approving review"))
        return plan
    by_ref = {c.ref: c for c in calls}
    latest = max((c.attempt for c in calls), default=attempt)
    if latest > attempt:
        bad(Mismatch("", "/attempt", "not_latest",
                     f"the report is attempt {attempt} but the call log reaches attempt "
                     f"{latest}"))
    listed: dict[str, int] = {}
    effects = report.effects or ()
    for i, effect in enumerate(effects):
        where = f"/effects/{i}"
        parsed = parse_ref(effect.ref)
        if parsed is None or parsed.tool != effect.tool:
            bad(Mismatch(effect.ref, f"{where}/ref", "bad_ref",
                         f"effect {i} ref {effect.ref!r} is not a ref of {effect.tool}"))
            continue
        ref = str(parsed)
        if ref in listed:
            bad(Mismatch(ref, f"{where}/ref", "duplicate",
                         f"{ref} is listed twice (effects {listed[ref]} and {i})"))
            continue
        listed[ref] = i
        call = by_ref.get(ref)
        if call is None:
            bad(Mismatch(ref, f"{where}/ref", "not_recorded",
                         f"{ref} is not a recorded call of order {order.id}"))
            continue
        if call.order_id != order.id:
            bad(Mismatch(ref, f"{where}/ref", "other_order",
                         f"{ref} was recorded for order {call.order_id}, not {order.id}"))
        if call.tool != effect.tool:
            bad(Mismatch(ref, f"{where}/tool", "tool",
                         f"{ref} called {call.tool}, but the report says {effect.tool}"))
        if not json_equal(call.arguments, effect.arguments):
            bad(Mismatch(ref, f"{where}/arguments", "arguments",
                         f"{ref}: the report's arguments differ from the arguments held"))
        if call.attempt != attempt:
            bad(Mismatch(ref, where, "attempt",
                         f"{ref} was held in attempt {call.attempt}, not the approved "
                         f"attempt {attempt}"))
        if call.outcome != "held":
            bad(Mismatch(ref, where, "not_held",
                         f"{ref} was not held (its outcome is {call.outcome})"))
    if review.effects is None:
        chosen = list(listed)
    else:
        chosen = []
        for j, raw in enumerate(review.effects):
            ref = canonical_ref(raw)
            if ref not in listed:
                bad(Mismatch(ref, f"/review/effects/{j}", "not_in_report",
                             f"the manager approved {raw}, which the report does not list"))
            elif ref not in chosen:
                chosen.append(ref)
        chosen.sort(key=lambda r: listed[r])  # run in the report's order
    for ref in chosen:
        call = by_ref.get(ref)
        if call is None:
            continue
        where = f"/effects/{listed[ref]}"
        if not allowed(call.tool, order):
            bad(Mismatch(ref, f"{where}/tool", "not_allowed",
                         f"order {order.id} does not allow {call.tool}"))
        if not matches_any(order.staged, call.tool):
            bad(Mismatch(ref, f"{where}/tool", "not_staged",
                         f"order {order.id} does not stage {call.tool}"))
        stager = staging_ancestor(call.tool, above)
        if stager is not None:
            bad(Mismatch(ref, f"{where}/tool", "staged_above",
                         f"order {stager.id}, which order {order.id} is split from, stages "
                         f"{call.tool}; only its manager {stager.manager} can approve that, "
                         "so it never runs on this sub-order's approval"))
        problem = revoked.problem(call)
        if problem is not None:
            bad(Mismatch(ref, where, "pass_revoked", f"{ref} was held under {problem}"))
        plan.approved.append(call)
    chosen_set = set(chosen)
    for call in calls:
        if call.outcome != "held" or call.ref in chosen_set:
            continue
        if call.attempt < attempt:
            plan.drops[call.ref] = f"attempt {call.attempt} was sent back for rework"
        elif call.attempt > attempt:
            plan.drops[call.ref] = f"held in attempt {call.attempt}, after the approved one"
        elif call.ref in listed:
            plan.drops[call.ref] = "the manager did not approve it"
        else:
            plan.drops[call.ref] = "the approved report does not list it"
    return plan


# --------------------------------------------------------------------------- the committer

class _Committer:
    """One commit (or retry) of one order, holding its lock."""

    def __init__(self, store: Store, order_id: str, desk: Desk, clock: Clock,
                 upstreams: _Upstreams, lock: OrderLock, timeout: float | None,
                 after_dispatching: AfterDispatching | None = None) -> None:
        self.store = store
        self.order_id = order_id
        self.desk = desk
        self.clock = clock
        self.upstreams = upstreams
        self.lock = lock
        self.timeout = timeout
        self.after_dispatching = after_dispatching
        self.states: dict[str, EffectState] = {}
        self.telemetry = current_telemetry()
        self.stuck: str | None = None
        """Why this commit stopped sending: the desk could not record an outcome."""
        self.order: WorkOrder | None = None
        """The order committed, once loaded under the lock: an order above it that ends
        while the commit runs stops every send after that (LC-22)."""

    def at(self) -> str:
        return _stamp(self.clock)

    def load_states(self) -> None:
        self.states = {e.ref: e for e in self.store.effects(self.order_id)}

    def recover(self) -> list[str]:
        """Turn every ``dispatching`` mark into ``unknown``: its committer is gone, since
        we hold the lock it held; whether it sent the request nobody can say."""
        self.load_states()
        found: list[str] = []
        for ref, state in list(self.states.items()):
            if state.state != "dispatching":
                continue
            try:
                self.states[ref] = self.store.set_effect(
                    self.order_id, ref, expect=["dispatching"], state="unknown",
                    error="found dispatching by a later commit: its committer stopped "
                          "before recording an answer, so it may or may not have run",
                    at=self.at())
                found.append(ref)
            except Conflict:
                self.load_states()
        return found

    def set(self, ref: str, *, expect: Sequence[str], state: str,
            **kwargs: Any) -> EffectState:
        new = self.store.set_effect(self.order_id, ref, expect=expect, state=state,
                                    at=self.at(), **kwargs)
        self.states[ref] = new
        return new

    def drop(self, drops: Mapping[str, str]) -> list[str]:
        done = drop_held(self.desk, self.order_id, drops, actor=COMMIT_ACTOR, at=self.at())
        if done:
            self.load_states()
        return done

    async def dispatch(self, call: CallRecord, arguments: dict[str, Any],
                       expect: Sequence[str]) -> EffectOutcome:
        """:meth:`_send` inside the effect's span (OBS-4)."""
        with self.telemetry.effect(self.order_id, call) as span:
            outcome = await self._send(call, arguments, expect)
            span.done(outcome.state, sent=outcome.sent)
            return outcome

    async def _send(self, call: CallRecord, arguments: dict[str, Any],
                    expect: Sequence[str]) -> EffectOutcome:
        """Mark, send, record: the write-ahead protocol for one effect.

        The ``dispatching`` mark is made in the pool's ``before_send`` hook: after the
        connection to the upstream is up, before the request is written. So a server that
        cannot be started leaves the effect untouched, and the window in which a crash
        leaves an unsent effect ``unknown`` is as short as it can be.
        """
        ref = call.ref
        marked = False

        async def mark() -> None:
            nonlocal marked
            self.lock.check()  # never start a send on a lock we may have lost
            if self.order is not None and self.order.parent_id is not None:
                # Read again before every send, not once per commit: a manager who cancels
                # the order above while the commit runs stops what it has not sent yet.
                ended = _above_ended(self.desk, self.store, self.order)
                if ended is not None:
                    raise _AboveEnded(ended)
            self.set(ref, expect=expect, state="dispatching", count_dispatch=True)
            marked = True
            if self.after_dispatching is not None:
                self.after_dispatching(ref)

        pool = await self.upstreams.get()
        server, tool = split_canonical(call.tool)
        meta = {"awl/ref": ref, "awl/order": self.order_id, "awl/attempt": call.attempt}
        back_to = "held" if "held" in expect else "unknown"
        try:
            result = await pool.call(server, tool, arguments, meta=meta, timeout=self.timeout,
                                     before_send=mark)
        except UpstreamUnavailable as exc:
            if not marked:
                return self._outcome(call, reason=f"not sent: {exc.message}; commit again later")
            if not exc.sent:
                return await self._not_sent(call, back_to, exc.message)
            return await self._unknown(call, f"connection lost after sending: {exc.message}")
        except UpstreamTimeout as exc:
            return await self._unknown(call,
                                       f"no answer within {exc.timeout:g} s; it may have run")
        except UpstreamRejected as exc:
            if exc.rpc_code is None:  # it answered, but we cannot read whether it ran
                return await self._unknown(call, exc.message)
            return await self._record(call, "failed", None, exc.message[:500])
        except NotFound as exc:  # no such server in the config: nothing was marked
            return self._outcome(call, reason=f"not sent: {exc.message}")
        except BaseException as exc:
            if marked:
                # A bug or a cancellation after the mark: record what we know (it may have
                # been sent), never risk a second send.
                with anyio.CancelScope(shield=True):
                    await self._unknown(
                        call, f"interrupted after the mark: {type(exc).__name__}")
            raise
        if result.is_error:
            return await self._record(call, "failed", _result_json(result),
                                      _error_text(result))
        return await self._record(call, "committed", _result_json(result), None)

    async def _record(self, call: CallRecord, state: str, result: dict[str, Any] | None,
                      error: str | None, *, sent: bool = True) -> EffectOutcome:
        """Move the effect out of ``dispatching`` to what we learned, and say where it is.

        A desk that cannot be written just now (another writer holds it past the store's
        busy timeout, a database that went away) is asked again, for up to one lease: the
        effect ran (or may have), and what we know of it is only ours. A Conflict after
        which the effect is no longer ``dispatching`` means a later commit took over when
        our lease ran out and made it ``unknown``: it stays so, the manager settles it.
        When it cannot be written in time the effect stays ``dispatching`` (the next commit
        makes it ``unknown``), this commit sends nothing more, and the outcome says what
        the answer was."""
        deadline = time.monotonic() + self.lock.lease
        problem = ""
        while True:
            try:
                self.set(call.ref, expect=["dispatching"], state=state, result=result,
                         error=error)
                return self._outcome(call, sent=sent)
            except (Conflict, StoreUnavailable, OSError) as exc:  # busy, gone: ask again
                problem = getattr(exc, "message", None) or str(exc) or type(exc).__name__
                conflict = isinstance(exc, Conflict)
            try:
                self.load_states()
            except (StoreUnavailable, OSError):  # the store cannot be read either
                pass
            else:
                now = self.states.get(call.ref)
                if conflict and (now is None or now.state != "dispatching"):
                    return self._outcome(call, sent=sent)
            if time.monotonic() >= deadline:
                break
            await anyio.sleep(_RECORD_PAUSE)
        what = {"committed": "it was answered with a result",
                "failed": "it was answered with an error",
                "unknown": "no answer arrived",
                "held": "it was not sent"}.get(state, state)
        self.stuck = (f"the desk could not record the outcome of {call.ref} ({problem}); "
                      "nothing more was sent")
        reason = (f"{what}{': ' + error if error else ''}, but the desk could not record "
                  f"it ({problem}); it stays dispatching until the next commit marks it "
                  "unknown")
        return EffectOutcome(call.ref, call.tool, "dispatching", reason, sent=sent,
                             result=result)

    async def _unknown(self, call: CallRecord, reason: str) -> EffectOutcome:
        return await self._record(call, "unknown", None, reason)

    async def _not_sent(self, call: CallRecord, back_to: str, why: str) -> EffectOutcome:
        reason = f"not sent: the upstream could not be reached ({why}); commit again later"
        return await self._record(call, back_to, None, reason, sent=False)

    def _outcome(self, call: CallRecord, *, sent: bool = False,
                 reason: str | None = None) -> EffectOutcome:
        state = self.states.get(call.ref)
        name = state.state if state is not None else NO_EFFECT
        if reason is None:
            reason = _reason(state, sent=sent)
        return EffectOutcome(call.ref, call.tool, name, reason, sent=sent,
                             result=state.result if state is not None else None)

    async def run(self, call: CallRecord) -> EffectOutcome:
        """Commit one approved effect unless it already ran (or is past running)."""
        current = self.states.get(call.ref)
        if current is None:  # the pre-check lets only held calls through: a damaged store
            return self._outcome(call, reason="not run: the store has no effect for it")
        if current.state != "held":
            return self._outcome(call, reason=f"already {current.state} before this run"
                                 + (f": {current.error}" if current.error else ""))
        expect = ["held"]
        arguments, problem = fill_refs(dict(call.arguments), self.states)
        try:
            if problem is not None:
                self.set(call.ref, expect=expect, state="skipped", error=problem)
                return self._outcome(call)
            return await self.dispatch(call, arguments, expect)
        except Conflict as exc:
            # Someone moved it first (only possible without the lock): whatever they did, it
            # is theirs to report. Or the desk could not be written (busy): it is still
            # held, and this commit stops. Either way we never send it.
            self.load_states()
            now = self.states.get(call.ref)
            if now is not None and now.state in expect:
                self.stuck = f"the desk could not be written ({exc.message}); nothing more was sent"
                return self._outcome(call, reason=f"not sent: {self.stuck}")
            return self._outcome(call, reason="changed by another process; not sent")


def _reason(state: EffectState | None, *, sent: bool) -> str:
    """What a person needs beside the state word: for a committed effect, whether this run
    sent it or found it committed already (and so sent nothing)."""
    if state is None:
        return "not run"
    if state.state == "committed":
        return ("sent once, and the server answered with a result" if sent else
                "committed earlier; not sent again")
    return state.error or ("not run" if state.state == "held" else state.state)


# --------------------------------------------------------------------------- commit

async def commit(
    order_id: str,
    *,
    store: Store,
    pool_or_config: UpstreamSource,
    desk: Desk | None = None,
    now: Clock | None = None,
    timeout: float | None = None,
    lease: float = DEFAULT_LEASE,
    lock_wait: float = 0.0,
    after_dispatching: AfterDispatching | None = None,
) -> CommitSummary:
    """Run the approved effects of ``order_id`` at most once each, in the report's order.

    Safe to run again at any time, from any process: effects that already ran (or may
    have) are reported, never sent again.

    Args:
        order_id: An approved order.
        store: The desk's store (the call log and the effect states).
        pool_or_config: An upstream pool with ``call(server, tool, arguments, meta=,
            timeout=)``, or a gateway config (loaded, a mapping, or a file path) to open one.
        desk: The desk used to log ``drop`` events (default one over ``store``).
        now: The clock for timestamps (default UTC now).
        timeout: Seconds each call may take (default: the server's configured timeout).
        lease: Seconds of the commit lock's lease, renewed while running.
        lock_wait: Seconds to wait for another live committer of the order to finish.
        after_dispatching: Called with each ref once its ``dispatching`` mark is durable,
            before its request is written (kill tests freeze there).

    Returns:
        The summary; :attr:`CommitSummary.ok` is true when every approved effect is
        committed. On a mismatch nothing ran and :attr:`CommitSummary.mismatches` says why.

    Raises:
        NotFound: No such order.
        InvalidTransition: The order is not approved.
        Conflict: Another live process is committing the order.
    """
    clock = now or utc_now
    desk = desk or Desk(store, clock=clock, conflict_retries=5)
    store.load(order_id)  # NotFound before taking any lock
    lock = OrderLock(store, lock_name(order_id), lease=lease, wait=lock_wait,
                     purpose=f"commit {order_id}")
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(lock)
        committer = _Committer(store, order_id, desk, clock, _Upstreams(pool_or_config, stack),
                               lock, timeout, after_dispatching)
        recovered = committer.recover()
        record = store.load(order_id)
        if record.state != "approved":
            raise InvalidTransition(
                f"cannot commit order {order_id!r}: it is {record.state}; only an approved "
                "order's effects run", state=record.state, action="commit")
        calls = store.calls(order_id)
        plan = _precheck(record, calls, _Revocations.of(store, order_id),
                         ancestors(store, record.order))
        took_over = None if lock.took_over is None else (
            f"pid {lock.took_over.pid} on {lock.took_over.host}")
        committer.order = record.order
        refused = _above_ended(desk, store, record.order)
        if refused is not None:  # the approval's authority is gone (LC-22): drop, send nothing
            dropped = committer.drop({c.ref: refused for c in held_calls(store, order_id)})
            outcomes = tuple(committer._outcome(c, reason=f"not run: {refused}")
                             for c in plan.approved)
            return CommitSummary(order_id, plan.attempt, outcomes, tuple(dropped),
                                 tuple(recovered), tuple(plan.mismatches), took_over, refused)
        if plan.mismatches:
            outcomes = tuple(committer._outcome(c, reason="not run: the pre-check failed")
                             for c in plan.approved)
            return CommitSummary(order_id, plan.attempt, outcomes, (), tuple(recovered),
                                 tuple(plan.mismatches), took_over)
        dropped = committer.drop(plan.drops)
        outcomes_list: list[EffectOutcome] = []
        pending = list(plan.approved)
        try:
            while pending and committer.stuck is None:
                outcomes_list.append(await committer.run(pending[0]))
                pending.pop(0)
            outcomes_list.extend(committer._outcome(c, reason=f"not run: {committer.stuck}")
                                 for c in pending)
        except LockLost:
            outcomes_list.extend(
                committer._outcome(c, reason="not run: this commit lost its lock; commit again")
                for c in pending)
        except _AboveEnded as exc:  # ended while we ran: the rest never runs (LC-22)
            refused = exc.reason
            dropped += committer.drop({c.ref: refused for c in held_calls(store, order_id)})
            outcomes_list.extend(committer._outcome(c, reason=f"not run: {refused}")
                                 for c in pending)
        return CommitSummary(order_id, plan.attempt, tuple(outcomes_list), tuple(dropped),
                             tuple(recovered), (), took_over, refused)
    raise AssertionError("unreachable")  # pragma: no cover


def commit_sync(order_id: str, **kwargs: Any) -> CommitSummary:
    """:func:`commit` for synchronous callers (runs its own event loop)."""
    return anyio.run(partial(commit, order_id, **kwargs))


# --------------------------------------------------------------------------- drops

def drop_attempt(order_id: str, attempt: int, *, store: Store, desk: Desk | None = None,
                 reason: str | None = None, actor: str = COMMIT_ACTOR,
                 now: Clock | None = None) -> list[str]:
    """Drop every still-held call of ``attempt``.

    The desk already does this itself on rework (and drops every held call when an order
    ends unapproved); this is for tools that tidy up by hand. Dropped calls never run. A
    ``drop`` event lists them. Calls already past ``held`` are left alone. Returns the refs
    dropped.
    """
    clock = now or utc_now
    desk = desk or Desk(store, clock=clock, conflict_retries=5)
    why = reason or f"attempt {attempt} was sent back for rework"
    calls = held_calls(store, order_id, attempts={attempt})
    return drop_held(desk, order_id, {c.ref: why for c in calls}, actor=actor,
                     at=_stamp(clock), note=why, data={"attempt": attempt})


# --------------------------------------------------------------------------- retry

async def retry(
    order_id: str,
    ref: str,
    by: str,
    *,
    store: Store,
    pool_or_config: UpstreamSource,
    desk: Desk | None = None,
    now: Clock | None = None,
    timeout: float | None = None,
    lease: float = DEFAULT_LEASE,
    lock_wait: float = 0.0,
    after_dispatching: AfterDispatching | None = None,
) -> EffectOutcome:
    """Send again an ``unknown`` effect the manager settled as ``did_not_happen``.

    Authority is checked as it is now: the order is approved, its deadline has not passed,
    and the tool is still allowed and staged; and the pass it was held under was valid when
    it was held (the revocation at the order's end comes later and does not count).
    The call carries the same ``awl/ref``, ``awl/order`` and ``awl/attempt`` as before, and
    follows the same write-ahead rules (it can end ``unknown`` again, needing a new
    settlement). A ``retry`` event is logged before the send.

    Raises:
        Forbidden: ``by`` is not the order's manager.
        InvalidTransition: The effect is not unknown, is not settled, was settled as
            happened, or the order no longer gives the authority to send it.
        Conflict: Another live process is committing the order.
    """
    clock = now or utc_now
    desk = desk or Desk(store, clock=clock, conflict_retries=5)
    record = store.load(order_id)
    manager_only(record.order, by, "retry")
    call = find_call(store, order_id, ref)
    lock = OrderLock(store, lock_name(order_id), lease=lease, wait=lock_wait,
                     purpose=f"retry {call.ref}")
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(lock)
        committer = _Committer(store, order_id, desk, clock, _Upstreams(pool_or_config, stack),
                               lock, timeout, after_dispatching)
        committer.recover()
        record = store.load(order_id)
        state = effect_of(store, order_id, call, "retry")
        if state.state != "unknown":
            raise InvalidTransition(
                f"effect {call.ref} is {state.state}; only an unknown effect settled as "
                "did_not_happen can be retried", state=state.state, action="retry")
        settlement = valid_settlement(state, settle_events(store.events(order_id))
                                      .get(call.ref))
        if settlement is None:
            raise InvalidTransition(
                f"effect {call.ref} is unknown and not settled; find out whether it ran, "
                f"then `awl effects settle {order_id} {call.ref} --happened|--did-not-happen`",
                state="unknown", action="retry")
        if settlement.verdict == "happened":
            raise InvalidTransition(
                f"effect {call.ref} was settled as happened by {settlement.by}; it can "
                "never be sent again", state="unknown", action="retry")
        _check_authority(record, call, _Revocations.of(store, order_id), clock(),
                         ancestors(store, record.order), store, desk)
        arguments, problem = fill_refs(dict(call.arguments), committer.states)
        if problem is not None:
            raise InvalidTransition(f"cannot retry {call.ref}: it {problem}",
                                    state="unknown", action="retry")
        _log(desk, order_id, by, "retry", note=f"retry {call.ref}",
             data={"ref": call.ref, "dispatches": state.dispatches})
        committer.order = record.order
        try:
            return await committer.dispatch(call, arguments, ["unknown"])
        except LockLost:
            raise Conflict(f"lost the commit lock of order {order_id!r} before sending "
                           f"{call.ref}; nothing was sent, retry again") from None
        except _AboveEnded as exc:
            raise InvalidTransition(f"cannot retry {call.ref}: {exc.reason}; nothing was sent",
                                    state=record.state, action="retry") from None
    raise AssertionError("unreachable")  # pragma: no cover


def _check_authority(record: OrderRecord, call: CallRecord, revoked: _Revocations,
                     moment: datetime, above: Sequence[WorkOrder], store: Store,
                     desk: Desk) -> None:
    order = record.order
    problems: list[str] = []
    if record.state != "approved":
        problems.append(f"the order is {record.state}, not approved")
    if parse_time(order.deadline) <= moment:
        problems.append(f"the order's deadline {order.deadline} has passed")
    if not allowed(call.tool, order):
        problems.append(f"the order does not allow {call.tool}")
    if not matches_any(order.staged, call.tool):
        problems.append(f"the order does not stage {call.tool}")
    stager = staging_ancestor(call.tool, above)
    if stager is not None:
        problems.append(f"order {stager.id}, which it is split from, stages {call.tool}")
    problem = revoked.problem(call)
    if problem is not None:
        problems.append(f"it was held under {problem}")
    if (ended := _above_ended(desk, store, order)) is not None:
        problems.append(ended)
    if problems:
        raise InvalidTransition(f"cannot retry {call.ref}: " + "; ".join(problems),
                                state=record.state, action="retry")


def retry_sync(order_id: str, ref: str, by: str, **kwargs: Any) -> EffectOutcome:
    """:func:`retry` for synchronous callers (runs its own event loop)."""
    return anyio.run(partial(retry, order_id, ref, by, **kwargs))
