"""One upstream ``tools/call``, top to bottom: resolve, admit, forward, record, answer.

:func:`handle` runs the steps in order over one :class:`Call`, the call's facts, which each
step returns with what it learnt (``Call._replace``); what the gateway keeps between
calls it asks of :class:`~gateway._known.Known`, and the store it reaches only through
:meth:`Gateway.run_store <gateway.Gateway.run_store>` (on the loop, or in a store thread).

1. :func:`resolve`: the exposed name to ``server/tool`` by the name table; a name meant for
   a server that has not listed its tools waits for its start (or names why it is down).
   A name the table does not hold exactly resolves to nothing (refused ``AWL_FORBIDDEN``,
   recorded under :data:`UNRESOLVED_TOOL`).
2. :func:`admit` (store side): read the order again if the last read is stale, verify the
   pass again (DP-13: a revoked or expired pass stops at once), gather :class:`Facts` and
   :func:`~gateway._policy.judge` them. A refusal is recorded (``record_call``, never
   counted; an unverified pass names no one, so no ``pass_jti``). Otherwise
   ``reserve_call`` numbers the call and checks every budget scope in one transaction
   (order, pass links, orders above: LC-15), and fails as stale when the order's log grew
   since it was read: the call is then decided again. A held call is checked against the
   input schema and stored ``held`` (GW-9), answered ``pending:server/tool#N``.
3. :func:`forward`: send it upstream with ``_meta`` ``awl/ref``, ``awl/order``,
   ``awl/attempt`` (the worker's ``awl/*`` keys dropped), progress and input rounds
   passed on to the worker (GW-13..GW-15); an upstream fault becomes ``AWL_UPSTREAM_...``.
4. :func:`record`: ``finish_call`` with the outcome; a store that cannot take it keeps it
   in :class:`~gateway._unrecorded.Unrecorded` and the worker is told ``AWL_NOT_RECORDED``
   (GW-7: nothing forwarded is answered as if it had not run).
5. :func:`answer`: close the telemetry span and give the worker its ref in ``_meta``.

Before this module one forwarded call went through about 50 functions in 14 files, the
gateway re-entered after each helper; now the steps above are its whole story, and each
names what it needs of the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, Protocol, TypeVar

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from awl.documents import (
    AWLError,
    CallRecord,
    Conflict,
    DocumentError,
    WorkOrder,
    debugging,
    format_time,
    matches_any,
    parse_ref,
)
from awl.mcp import coded_error
from awl.passes import pass_scopes
from awl.store import OrderRecord, OverBudget, Scope, Store, stale_order
from gateway._authority import Authority
from gateway._config import GatewayConfig
from gateway._known import Known
from gateway._names import NameTable, server_of
from gateway._policy import Decision, Facts, budget_refusal, judge, refuse
from gateway._relay import Relay, worker_is_modern
from gateway._spans import CallSpan
from gateway._staging import check_arguments
from gateway._unrecorded import Unrecorded, one_line
from gateway._upstream import (
    RESERVED_META_PREFIX,
    UpstreamError,
    UpstreamPool,
    UpstreamRejected,
    UpstreamUnavailable,
)

__all__ = [
    "AWL_INVALID_ARGUMENTS",
    "AWL_UPSTREAM_ERROR",
    "UNRESOLVED_TOOL",
    "Call",
    "handle",
]

log = logging.getLogger("awl.gateway")

AWL_INVALID_ARGUMENTS = "AWL_INVALID_ARGUMENTS"
"""A held call's arguments do not fit the upstream's input schema, or a ``$ref`` is bad."""
AWL_UPSTREAM_ERROR = "AWL_UPSTREAM_ERROR"
"""Prefix of upstream faults: ``AWL_UPSTREAM_TIMEOUT``, ``AWL_UPSTREAM_UNAVAILABLE``, ..."""
AWL_NOT_RECORDED = "AWL_NOT_RECORDED"
"""A forwarded call whose outcome the store could not record: it may have run."""
AWL_CANCELLED = "AWL_CANCELLED"
"""The error recorded for a call the worker cancelled before the upstream answered."""

UNRESOLVED_TOOL = "awl-gateway.unresolved-name.not-an-upstream/unknown"
"""The tool recorded for a refused call whose name resolves to no upstream tool.

Its server part is longer than the 40 characters a configured server name may have, so it
can never be mistaken for a real tool."""

META_REF = "awl/ref"
META_ORDER = "awl/order"
META_ATTEMPT = "awl/attempt"

INPUT_ROUNDS = 10
"""How many ``input_required`` rounds the gateway answers for a handshake-era worker in
one call before it gives up (the SDK clients' own default)."""

STALE_RETRIES = 20
"""How many times a call is decided again because the order's log grew meanwhile."""

Answer = types.CallToolResult | types.InputRequiredResult
_T = TypeVar("_T")


class Gateway(Protocol):
    """What the steps need of their gateway (a :class:`~gateway.Gateway` is one)."""

    order_id: str
    store: Store
    pool: UpstreamPool
    relay: Relay
    config: GatewayConfig
    known: Known
    unrecorded: Unrecorded
    safe: bool

    @property
    def order(self) -> WorkOrder: ...
    def now(self) -> datetime: ...
    async def catalog(self) -> NameTable: ...
    async def run_store(self, func: Callable[..., _T], *args: Any) -> _T: ...
    def reload(self) -> OrderRecord: ...
    def verify(self, token: str | None) -> Authority: ...
    def ended_above(self) -> tuple[str, str] | None: ...


class Call(NamedTuple):
    """The facts of one upstream tool call; each step returns a copy with what it learnt
    (``call._replace(...)``). Immutable: a tuple, whose copies cost a fifth of a frozen
    dataclass's (``dataclasses.replace``), which is paid on every call."""

    name: str
    """The exposed name the worker asked for, exactly."""
    arguments: dict[str, Any]
    """The arguments: JSON values only (SEC-9), a copy of the call's own."""
    runs_under: str | None
    """The pass the call is decided under (None: the order's worker)."""
    caller: str | None = None
    """The pass the request named, for the relay's in-flight bookkeeping."""
    meta: Mapping[str, Any] | None = None
    """The request's ``_meta``; forwarded cleaned."""
    ctx: ServerRequestContext[Any] | None = None
    """The worker's request, when there is one (progress, logs, input rounds)."""
    input_responses: Mapping[str, Any] | None = None
    request_state: str | None = None
    # resolve
    canonical: str | None = None
    """``server/tool``, or None when the name resolves to no upstream tool."""
    server: str | None = None
    tool: str | None = None
    """The upstream's own name of the tool."""
    unavailable: str | None = None
    """Why the server the name is meant for is down, when it could not be started."""
    # admit
    started_at: str | None = None
    attempt: int | None = None
    jti: str | None = None
    """The verified pass's id (None: no pass, or one that did not verify)."""
    scopes: tuple[Scope, ...] = ()
    """The budget scopes the reservation checked: the order's, then the pass chain's."""
    decision: Decision | None = None
    ref: str | None = None
    """``server/tool#N`` once recorded (None: nothing was written)."""


@dataclass(frozen=True, slots=True, eq=False)
class Outcome:
    """What one call ended as: the worker's answer and what was (to be) recorded."""

    answer: Answer
    outcome: str
    """As recorded: ``ok``, ``error``, ``held`` or ``refused``."""
    result: dict[str, Any] | None = None
    error: str | None = None
    code: str | None = None
    """The ``AWL_...`` code of a tool error."""


async def handle(gw: Gateway, span: CallSpan, call: Call) -> Answer:
    """Run one upstream call through every step, in order."""
    call = await resolve(gw, call)
    call, decided = await admit(gw, call)
    if decided is not None:  # refused or held: nothing goes upstream
        return answer(span, call, decided)
    sent = await forward(gw, call)
    return answer(span, call, await record(gw, call, sent))


# ---------------------------------------------------------------------- 1. resolve

async def resolve(gw: Gateway, call: Call) -> Call:
    """``call`` with its canonical name, server and tool (or why its server is down)."""
    table = await gw.catalog()
    unavailable = None
    meant = server_of(call.name, gw.config.servers) if call.name not in table else None
    if meant is not None:
        # Meant for a server that may not have listed its tools yet: wait for its start,
        # or start it again after its backoff, then look again.
        try:
            await gw.pool.connect(meant)
        except UpstreamUnavailable as exc:
            unavailable = exc.message
        table = await gw.catalog()
    if call.name not in table:
        return call._replace(unavailable=unavailable)
    server, tool = table.resolve(call.name)
    return call._replace(canonical=table.canonical(call.name), server=server, tool=tool,
                   unavailable=unavailable)


# ---------------------------------------------------------------------- 2. admit

async def admit(gw: Gateway, call: Call) -> tuple[Call, Outcome | None]:
    """Decide ``call`` and write what was decided; the Outcome of a call answered without
    being forwarded (refused, held, arguments that do not fit), else None."""
    return await gw.run_store(_admit, gw, call)


def _admit(gw: Gateway, call: Call) -> tuple[Call, Outcome | None]:
    """:func:`admit` in the store's thread.

    The decision is made on the order as last read, and never written on a stale one:
    the reservation checks in its own transaction that the order's log has not grown
    since (a refusal checks it first), and when it has, the order is read again and the
    call decided again.
    """
    now = gw.now()
    started = format_time(now)
    record = gw.known.record
    for _ in range(STALE_RETRIES):
        if record is None:
            record = gw.reload()
        try:
            return _decide(gw, call, record, now, started)
        except Conflict as exc:
            if exc.expected_seq is None:  # not a stale order (a busy store, say)
                raise
            record = None
    # The log grew between every read and its reservation: answer with a protocol
    # error (nothing was written) rather than spin.
    raise Conflict(f"order {gw.order_id} changed {STALE_RETRIES} times while this call "
                   "was being decided; nothing was recorded, call again")


def _decide(gw: Gateway, call: Call, record: OrderRecord, now: datetime, started: str
            ) -> tuple[Call, Outcome | None]:
    """:func:`_admit` on the order as of ``record`` at ``now`` (written as ``started``);
    Conflict if it is stale. ``call`` is copied once, with all it learnt here."""
    known = gw.known
    canonical = call.canonical
    scopes: tuple[Scope, ...]
    kept = known.kept_decision(record, call.name, canonical, call.runs_under, now,
                               call.unavailable)
    if kept is not None:
        # Decided before on this very record: only the reservation is new.
        decision, usd = kept
        jti, scopes = None, (known.order_scope(),)
    else:
        facts, jti, scopes = _facts(gw, call, record, now)
        decision, usd = judge(facts), facts.usd
        if decision.action == "refuse":
            _check_fresh(gw, record)
            return _refused(gw, call._replace(started_at=started, attempt=record.attempt,
                                        jti=jti, scopes=scopes), decision)
        assert canonical is not None
        if known.keeps_decisions(record, call.runs_under, call.unavailable):
            known.keep_decision(record, call.name, canonical, decision, usd)
    assert canonical is not None
    reserved = gw.store.reserve_call(
        gw.order_id, attempt=record.attempt, tool=canonical, arguments=call.arguments,
        pass_jti=jti, usd=usd, started_at=started, scopes=list(scopes), seq=record.seq)
    if isinstance(reserved, OverBudget):
        hit = next((sc for sc in scopes if sc.name == reserved.scope), reserved.scope)
        return _refused(gw, call._replace(started_at=started, attempt=record.attempt,
                                    jti=jti, scopes=scopes),
                        budget_refusal(hit, gw.order_id))
    call = call._replace(started_at=started, attempt=reserved.attempt, jti=jti,
                   scopes=scopes, decision=decision, ref=reserved.ref)
    if decision.action == "hold":
        return _hold(gw, call, reserved.record)
    return call, None


def _facts(gw: Gateway, call: Call, record: OrderRecord, now: datetime
           ) -> tuple[Facts, str | None, tuple[Scope, ...]]:
    """What :func:`~gateway._policy.judge` decides ``call`` on, read now; with the verified
    pass's jti and the call's budget scopes (the order's, then one per pass link)."""
    known, store, order_id = gw.known, gw.store, gw.order_id
    authority = gw.verify(call.runs_under)  # again each call: revoked passes stop (DP-13)
    verified = authority.verified
    canonical = call.canonical
    usd, hold, read_only = known.facts(canonical) if canonical else (0.0, False, None)
    scopes = (known.order_scope(),) if verified is None else (
        known.order_scope(), *pass_scopes(store, verified))
    grant = verified.claims.grant if verified is not None else None
    # tool_calls and usd are checked exactly by reserve_call; reading the usage here is
    # needed only for a seconds budget (the time of the first call).
    usage = pass_usage = None
    if record.order.budget.seconds is not None:
        usage = store.usage(order_id)
    if grant is not None and grant.budget.seconds is not None:
        pass_usage = store.usage(order_id, scopes[-1].jtis)
    # Each pass above the caller's with a seconds budget: its clock runs from the first
    # call made under it or under any pass derived from it (a child issued late must not
    # outlast it).
    passes_above = [] if verified is None else [
        (link.jti, link.grant, store.usage(order_id, scope.jtis))
        for link, scope in zip(verified.chain[:-1], scopes[1:-1], strict=True)
        if link.grant.budget.seconds is not None]
    above = [(o, store.usage(o.id)) for o in known.timed_above]  # LC-15
    facts = Facts(
        order=record.order, state=record.state, now=now, tool=canonical,
        requested=call.name, usage=usage, usd=usd, grant=grant, pass_usage=pass_usage,
        pass_problem=authority.problem, passes_above=passes_above,
        hold=[canonical] if hold and canonical else (), safe=gw.safe, read_only=read_only,
        above=above, staging_above=known.staging_above, ended_above=gw.ended_above(),
        unavailable=call.unavailable)
    # A pass that did not verify names no one: its claims are not recorded.
    return facts, (verified.jti if verified is not None else None), scopes


def _check_fresh(gw: Gateway, record: OrderRecord) -> None:
    """Conflict (with ``expected_seq``) when the order's log has grown past ``record``."""
    if gw.store.events(gw.order_id, after=record.seq, limit=1):
        raise stale_order(gw.order_id, record.seq, record.seq + 1)


def _refused(gw: Gateway, call: Call, decision: Decision) -> tuple[Call, Outcome]:
    """Record a refusal (it never counts) and answer it ``CODE: message``; a name that
    resolved to nothing is recorded under :data:`UNRESOLVED_TOOL`."""
    record = gw.store.record_call({
        "order_id": gw.order_id, "attempt": call.attempt, "pass_jti": call.jti,
        "tool": call.canonical or UNRESOLVED_TOOL, "arguments": call.arguments,
        "outcome": "refused", "error": decision.text, "started_at": call.started_at,
        "ended_at": format_time(gw.now()),
    })
    call = call._replace(decision=decision, ref=record.ref, attempt=record.attempt)
    return call, Outcome(coded_error(decision.text), "refused", code=decision.code)


def _hold(gw: Gateway, call: Call, record: CallRecord) -> tuple[Call, Outcome]:
    """Check and store a held call (GW-9): its arguments against the input schema and the
    ``$ref`` s to earlier held calls of its attempt."""
    store = gw.store
    mine = parse_ref(record.ref)
    assert mine is not None
    earlier: dict[str, CallRecord] = {}
    for other in store.calls(gw.order_id, attempt=record.attempt):
        ref = parse_ref(other.ref)
        if other.outcome == "held" and ref is not None and ref.n < mine.n:
            earlier[str(ref)] = other
    tool = gw.known.tools.get(record.tool)
    schema = tool.input_schema if tool is not None else None
    problems = check_arguments(record.arguments, schema, earlier=earlier)
    ended = format_time(gw.now())
    if problems:
        text = (f"{AWL_INVALID_ARGUMENTS}: the call was not held because its arguments "
                f"do not fit {record.tool}: " + "; ".join(problems)
                + ". Fix them and call again.")
        store.finish_call(gw.order_id, record.ref, outcome="error", result=None,
                          error=text, ended_at=ended)
        # The call was made and counts, so it is answered with its ref like any other.
        refusal = coded_error(text)
        refusal.meta = {**(refusal.meta or {}), META_REF: record.ref}
        return (call._replace(decision=refuse(AWL_INVALID_ARGUMENTS, text)),
                Outcome(refusal, "error", code=AWL_INVALID_ARGUMENTS))
    order = gw.order
    if matches_any(order.staged, record.tool):
        advice = (f"Held for the manager's approval, not run. List it in your report's "
                  f"effects as {{\"ref\": \"{record.ref}\", \"tool\": \"{record.tool}\", "
                  "\"arguments\": <exactly these arguments>}; a later held call may use "
                  f"{{\"$ref\": \"{record.ref}\", \"pointer\": \"/structuredContent/...\"}} "
                  "for a value from its future result.")
    else:
        advice = f"Recorded, not run. {held_note(record.tool, order)}"
    pending = types.CallToolResult(
        content=[
            types.TextContent(type="text", text=f"pending:{record.ref}"),
            types.TextContent(type="text", text=advice),
        ],
        structured_content={"pending": record.ref, "status": "held"},
        meta={META_REF: record.ref},
    )
    store.hold_call(gw.order_id, record.ref, result=wire(pending), ended_at=ended)
    return call, Outcome(pending, "held")


def held_note(tool: str, order: WorkOrder) -> str:
    """What the worker is told about a held tool: listed as an effect, or never run (GW-9)."""
    if matches_any(order.staged, tool):
        return ("Held for the manager's approval: the call is recorded, not run, and answers "
                "pending:server/tool#N for your report's effects.")
    return (f"Held, and never run: the gateway holds {tool} (safe mode or the operator's "
            "hold list) but the order does not stage it, so no report may list its calls as "
            "effects (rule R14) and no approval runs them. Leave them out of your report's "
            "effects; if the work needs this tool, say so in your report.")


# ---------------------------------------------------------------------- 3. forward

async def forward(gw: Gateway, call: Call) -> Outcome:
    """Send ``call`` upstream; its result, or the upstream fault as a tool error."""
    ref, attempt, canonical = call.ref, call.attempt, call.canonical
    assert ref is not None and attempt is not None and canonical is not None
    assert call.server is not None
    outcome, result, error = "error", None, None
    answered: Answer
    try:
        with gw.relay.forwarding(call.server, call.ctx, call.caller):
            answered = await _rounds(gw, call, forward_meta(
                call.meta, ref=ref, order_id=gw.order_id, attempt=attempt))
        outcome = "error" if getattr(answered, "is_error", False) else "ok"
        result = wire(answered)  # what the upstream answered (bounded), as evidence
        if isinstance(answered, types.CallToolResult):
            answered = gw.known.schemas.conform(canonical, gw.known.tools.get(canonical),
                                                answered)
    except UpstreamError as exc:
        error = exc.refusal
        answered = coded_error(error)
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            await _finish(gw, ref, "error", None,
                          f"{AWL_CANCELLED}: the worker cancelled the call before the "
                          "upstream answered; the cancellation was passed on to the "
                          "upstream, and the call may have run")
        raise
    except Exception as exc:  # the gateway must outlive any upstream surprise
        log.error("awl gateway: call %s failed unexpectedly: %s: %s", ref,
                  type(exc).__name__, one_line(str(exc)), exc_info=debugging())
        error = f"{AWL_UPSTREAM_ERROR}: the call to {canonical} failed: {exc}"[:1000]
        answered = coded_error(error)
    return Outcome(answered, outcome, result, error)


async def _rounds(gw: Gateway, call: Call, meta: dict[str, Any]) -> Answer:
    """The upstream's answer, its progress passed on to the worker.

    A 2026-07-28 worker gets an ``input_required`` round as the upstream sent it and
    answers it by calling again; for a handshake-era worker the gateway asks it each
    input request itself and retries the upstream with its answers (GW-15)."""
    server, tool, args, ctx = call.server, call.tool, call.arguments, call.ctx
    assert server is not None and tool is not None
    progress = gw.relay.progress(ctx)
    answered = await gw.pool.call_round(
        server, tool, args, meta=meta, progress=progress,
        input_responses=call.input_responses, request_state=call.request_state)
    if ctx is None or worker_is_modern(ctx):
        return answered
    for _ in range(INPUT_ROUNDS):
        if not isinstance(answered, types.InputRequiredResult):
            return answered
        try:
            responses = await gw.relay.answer_rounds(ctx, server, answered)
        except MCPError as exc:
            raise UpstreamRejected(
                f"upstream {server!r} asked for input the worker did not give "
                f"({exc.error.message}); the call to {tool!r} did not finish",
                server=server, rpc_code=None) from None
        answered = await gw.pool.call_round(
            server, tool, args, meta=meta, progress=progress, input_responses=responses,
            request_state=answered.request_state)
    if isinstance(answered, types.InputRequiredResult):
        raise UpstreamRejected(
            f"upstream {server!r} still asked for input after {INPUT_ROUNDS} rounds of "
            f"the call to {tool!r}; the gateway gave up", server=server, rpc_code=None)
    return answered


def forward_meta(meta: Mapping[str, Any] | None, *, ref: str, order_id: str,
                 attempt: int) -> dict[str, Any]:
    """The ``_meta`` sent upstream: the worker's own keys, then the gateway's ``awl/*``.

    Protocol-reserved keys and progress tokens describe the worker's connection and are
    dropped; ``awl/*`` keys the worker sent are dropped too, so a worker cannot pose as
    another call.
    """
    if not meta:
        return {META_REF: ref, META_ORDER: order_id, META_ATTEMPT: attempt}
    out = {k: v for k, v in meta.items()
           if not k.startswith((RESERVED_META_PREFIX, "awl/"))
           and k not in ("progressToken", "progress_token")}
    out.update({META_REF: ref, META_ORDER: order_id, META_ATTEMPT: attempt})
    return out


def wire(result: Answer) -> dict[str, Any]:
    """The result as the wire carries it (camelCase), which is how call records keep it."""
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


# ---------------------------------------------------------------------- 4. record

async def record(gw: Gateway, call: Call, sent: Outcome) -> Outcome:
    """Store the outcome of a forwarded call; when the store cannot take it, the worker is
    told so (GW-7) and the outcome is kept to be written later."""
    assert call.ref is not None
    if await _finish(gw, call.ref, sent.outcome, sent.result, sent.error):
        return Outcome(sent.answer, sent.outcome, sent.result, sent.error,
                       _code(sent.error))
    # It was forwarded: it may have run, whatever the store says (GW-7).
    error = (f"{AWL_NOT_RECORDED}: the call {call.ref} was sent to {call.canonical} and may "
             "have run, but the desk's store could not record its outcome; the gateway "
             "keeps the outcome and records it as soon as the store is back. Do not call "
             f"again to be sure: check {call.ref} with awl_list_calls once the desk answers.")
    return Outcome(coded_error(error), "error", None, error, _code(error))


def _code(error: str | None) -> str | None:
    return error.split(":", 1)[0] if error else None


async def _finish(gw: Gateway, ref: str, outcome: str, result: dict[str, Any] | None,
                  error: str | None) -> bool:
    """Record the outcome of a forwarded call; False when the store could not take it
    (it is kept, to be written once the store is back: :mod:`gateway._unrecorded`)."""
    ended_at = format_time(gw.now())

    def finish() -> None:
        gw.store.finish_call(gw.order_id, ref, outcome=outcome, result=result, error=error,
                             ended_at=ended_at)

    try:
        await gw.run_store(finish)
    except DocumentError:
        raise
    except AWLError as exc:
        if isinstance(exc, Conflict) and "already has outcome" in exc.message:
            # The desk read it as left behind (stale, may have run) meanwhile: that
            # record stands, and the worker is told the same.
            log.warning("awl gateway: the outcome of call %s was not recorded: %s", ref,
                           exc.message)
            return False
        why = exc.message
    except Exception as exc:  # a driver's own error: the store is away all the same
        why = f"{type(exc).__name__}: {exc}"
    else:
        return True
    gw.unrecorded.keep(ref, outcome=outcome, result=result, error=error, ended_at=ended_at,
                       why=why)
    return False


# ---------------------------------------------------------------------- 5. answer

def answer(span: CallSpan, call: Call, done: Outcome) -> Answer:
    """Close the call's span and answer the worker; a forwarded call's answer carries its
    ref, which the worker cites as evidence (the answer is its only way to learn it)."""
    span.done(tool=call.canonical, ref=call.ref, attempt=call.attempt, outcome=done.outcome,
              code=done.code)
    reply = done.answer
    if call.decision is not None and call.decision.action == "forward":
        # The answer was made for this call alone, by the upstream pool or above: setting
        # its _meta in place saves a model copy per call.
        reply.meta = {**(reply.meta or {}), META_REF: call.ref}
    return reply
