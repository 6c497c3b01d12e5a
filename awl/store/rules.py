"""The rules every store backend shares: state names, effect moves, scope limits, refs, call
records.

Each backend (memory, SQLite, ...) asks these functions rather than writing its own copy, so
the backends cannot drift apart on what they accept or how they say no.
"""


from __future__ import annotations

import json
import secrets
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, replace
from typing import Any, Literal, cast, get_args

from pydantic import ValidationError

from awl.documents.effect_states import STATES, EffectStateName, is_move, moves_from
from awl.documents.errors import BadRequest, Conflict, InvalidTransition, NotFound
from awl.documents.limits import escapes_nothing
from awl.documents.models import (
    CallOutcome,
    CallRecord,
    Event,
    Review,
    WorkOrder,
    WorkReport,
    parse_time,
)
from awl.documents.patterns import TOOL_NAME_RE, make_ref, parse_ref
from awl.documents.pointers import pointer
from awl.store.protocol import (
    BlockedRow,
    DeliveryAttempt,
    DeskOrder,
    EffectState,
    LockInfo,
    Notification,
    NotificationStateName,
    NotifyEventName,
    OrderRecord,
    PassRecord,
    Scope,
    Settlement,
    TrackRow,
    Webhook,
)

EFFECT_STATES: frozenset[str] = frozenset(STATES)

USD_TOLERANCE = 1e-9
"""How far a float sum of per-call prices may land above an exact usd limit and still be
within it (0.1 * 3 > 0.3)."""


def over_limit(calls: int, used: float, usd: float, *, max_calls: float | None,
               max_usd: float | None) -> Literal["tool_calls", "usd"] | None:
    """The limit one more call costing ``usd`` would pass, after ``calls`` counted calls
    that spent ``used`` usd; None when it fits (or no limit is set). Calls are checked first.
    """
    if max_calls is not None and calls + 1 > max_calls:
        return "tool_calls"
    if max_usd is not None and used + usd > max_usd + USD_TOLERANCE:
        return "usd"
    return None


def check_effect_state(state: str) -> EffectStateName:
    """``state`` as an effect state name; BadRequest when it is not one."""
    if state not in EFFECT_STATES:
        raise BadRequest(
            f"unknown effect state {state!r}; use one of {', '.join(sorted(EFFECT_STATES))}"
        )
    return cast(EffectStateName, state)


def check_first_event(order: WorkOrder, event: Event) -> None:
    """Refuse a first event that is not seq 1."""
    if event.seq != 1:
        raise BadRequest(f"the first event of order {order.id!r} must have seq 1, not {event.seq}")


def state_names(state: str | Sequence[str] | None) -> list[str] | None:
    """The states a ``list_orders`` filter asks for, sorted (None: any state; an empty
    list matches no order)."""
    if state is None:
        return None
    return [state] if isinstance(state, str) else sorted(set(state))


def seq_conflict(order_id: str, event: Event, actual: int) -> Conflict:
    """The Conflict for an append whose seq does not follow the stored one."""
    return Conflict(
        f"order {order_id!r} is at seq {actual}, but the event has seq {event.seq}; "
        "read the order again and retry",
        expected_seq=event.seq - 1,
        actual_seq=actual,
    )


def stale_order(order_id: str, expected: int, actual: int) -> Conflict:
    """The Conflict for a reservation made on an order read at an older seq."""
    return Conflict(
        f"order {order_id!r} is at seq {actual}, not {expected}; read the order again",
        expected_seq=expected,
        actual_seq=actual,
    )


def not_empty(held: Sequence[str]) -> BadRequest | None:
    """The refusal of a copy into a store that already holds ``held`` (``orders``,
    ``revocations``, ...); None when it holds nothing."""
    if not held:
        return None
    return BadRequest(f"the target store already holds {', '.join(held)}; copy into an "
                      "empty store (nothing was written)")


def order_exists_conflict(order_id: str, actual: int) -> Conflict:
    """The Conflict for creating an order whose id is taken."""
    return Conflict(
        f"an order with id {order_id!r} already exists; choose another id",
        expected_seq=0,
        actual_seq=actual,
    )


def order_not_found(order_id: str) -> NotFound:
    """The NotFound for an absent order."""
    return NotFound(f"no order with id {order_id!r}")


def call_number(order_id: str, ref: str) -> tuple[int, str]:
    """The N and tool a ref names; NotFound when it is not a ref at all."""
    parsed = parse_ref(ref)
    if parsed is None:
        raise NotFound(f"{ref!r} is not a call ref (server/tool#N) of order {order_id!r}")
    return parsed.n, parsed.tool


def call_not_found(order_id: str, ref: str) -> NotFound:
    """The NotFound for a ref that names no recorded call."""
    return NotFound(f"order {order_id!r} has no recorded call {ref!r}")


def exceeded_scope(
    scopes: Sequence[Scope], spent: Callable[[frozenset[str] | None], tuple[int, float]],
    usd: float,
) -> str | None:
    """The name of the first scope one more call costing ``usd`` would exceed.

    ``spent(jtis)`` gives the counted calls and their summed usd so far under ``jtis``
    (all of the order's when None); it is asked only for scopes that set a limit.
    """
    for scope in scopes:
        if scope.max_calls is None and scope.max_usd is None:
            continue
        calls, used = spent(scope.jtis)
        if over_limit(calls, used, usd, max_calls=scope.max_calls, max_usd=scope.max_usd):
            return scope.name
    return None


MAX_CHAIN = 64
"""The most orders above an order that a reservation charges (a deeper chain, or a cycle in
a damaged store, stops there; the desk's chains are far shorter)."""


def above_scope(order_id: str) -> str:
    """The scope name a reservation returns for an order above the calling one."""
    return f"order {order_id}"


def exceeded_above(
    above: Sequence[tuple[str, float | None, float | None, int, float]], usd: float,
) -> str | None:
    """The scope name of the first order above that one more call costing ``usd`` exceeds.

    Each entry is ``(order_id, max tool_calls, max usd, calls charged, usd charged)``: an
    order's own counted calls plus those of every sub-order below it.
    """
    for order_id, max_calls, max_usd, calls, used in above:
        if over_limit(calls, used, usd, max_calls=max_calls, max_usd=max_usd):
            return above_scope(order_id)
    return None


def json_copy(value: Any, what: str) -> Any:
    """A fresh copy of ``value`` as JSON reads it back (tuples become lists, and so on).

    Both stores hand back exactly this, so what a caller gets never depends on the store
    (nor aliases what it passed in). BadRequest when ``value`` is not JSON data.
    """
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"{what} must be JSON data: {exc}") from None


def stored_lock(info: LockInfo) -> LockInfo:
    """The lock as a store keeps it (its data as JSON reads it back)."""
    return replace(info, data=json_copy(info.data, f"the data of lock {info.name!r}"))


def may_take(current: LockInfo | None, replace_: LockInfo | None) -> bool:
    """Whether a lock now held as ``current`` may be taken by one expecting ``replace_``."""
    return current is None or (replace_ is not None and current == stored_lock(replace_))


def dump_json(data: Any) -> str:
    """The compact JSON text a store keeps a document as."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


# The JSON texts a store keeping documents as text keeps effects, locks and passes as (the
# models' own documents are their to_json()); a text read back gives an equal object.

def effect_doc(effect: EffectState) -> str:
    """The JSON text of an effect state."""
    return dump_json(asdict(effect))


def read_effect(doc: str) -> EffectState:
    """The effect state an :func:`effect_doc` text holds."""
    data = json.loads(doc)
    settled = data.pop("settlement")
    return EffectState(**data, settlement=None if settled is None else Settlement(**settled))


def lock_doc(info: LockInfo) -> str:
    """The JSON text of a lock as stores keep it (see :func:`stored_lock`)."""
    return dump_json(asdict(stored_lock(info)))


def read_lock(doc: str) -> LockInfo:
    """The lock a :func:`lock_doc` text holds."""
    return LockInfo(**json.loads(doc))


def pass_doc(record: PassRecord) -> str:
    """The JSON text of an issued pass's record."""
    return dump_json(asdict(record))


def read_pass(doc: str) -> PassRecord:
    """The pass record a :func:`pass_doc` text holds."""
    return PassRecord(**json.loads(doc))


def new_call(
    order_id: str, n: int, *, attempt: int, tool: str, arguments: dict[str, Any],
    pass_jti: str | None, started_at: str,
) -> dict[str, Any]:
    """A reserved call's record (outcome pending, ended when it started) as JSON data.

    Each field is checked as CallRecord checks it, by hand: a gateway reserves on every
    call, and validating a whole record costs several times more. (A test holds these
    checks and CallRecord to the same answers.) ``arguments`` is the caller's object, checked
    to be an object: a store encodes the data (:func:`json_text`) or keeps its own copy
    (:func:`own_json`). BadRequest naming the first field that is wrong.
    """
    if not isinstance(order_id, str) or not order_id:
        raise _bad_call("order_id", "a non-empty string")
    if isinstance(attempt, float) and float.is_integer(attempt):
        attempt = int(attempt)  # as Integer reads 2.0
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        raise _bad_call("attempt", "a whole number of 1 or more")
    if not isinstance(tool, str) or TOOL_NAME_RE.fullmatch(tool) is None:
        raise _bad_call("tool", "a server/tool name")
    if not isinstance(arguments, dict):
        raise _bad_call("arguments", "a JSON object")
    if pass_jti is not None and not isinstance(pass_jti, str):
        raise _bad_call("pass_jti", "a string")
    _check_timestamp("call record", "started_at", started_at)
    data = {"ref": make_ref(tool, n), "order_id": order_id, "attempt": attempt, "tool": tool,
            "arguments": arguments}
    if pass_jti is not None:
        data["pass_jti"] = pass_jti
    data["outcome"] = "pending"
    data["started_at"] = data["ended_at"] = started_at
    return data


def _bad_call(field: str, what: str, record: str = "call record") -> BadRequest:
    """The BadRequest for a call record field that is not ``what``."""
    return BadRequest(f"not a valid {record}: /{field}: must be {what}")


def _check_timestamp(record: str, field: str, value: Any) -> None:
    """BadRequest unless ``value`` is a Timestamp, as the models read one."""
    if not isinstance(value, str):
        raise _bad_call(field, "an RFC 3339 timestamp string", record)
    try:
        parse_time(value)
    except ValueError as exc:
        raise BadRequest(f"not a valid {record}: /{field}: {exc}") from None


def own_json(value: Any, what: str) -> Any:
    """A copy of JSON data as a store keeps it: checked as :func:`json_text` checks, shared
    with no caller."""
    return _scan(json_text(value, what), 0)[0]


def record_from(data: dict[str, Any]) -> CallRecord:
    """The CallRecord of call data a store keeps (checked when it was stored), sharing
    nothing with it."""
    return read_call(json_text(data, "a call record"))


def record_order_id(fields: dict[str, Any]) -> str:
    """The order a call record to store belongs to; BadRequest when it names none."""
    order_id = fields.get("order_id")
    if not isinstance(order_id, str):
        raise BadRequest("a call record needs an 'order_id' string")
    return order_id


def stored_call(fields: dict[str, Any], n: int) -> tuple[CallRecord, str]:
    """A call record from its fields (None meaning absent) and its number, as stores keep it.

    Returns the record as read back from its JSON text, and that text. BadRequest when the
    fields do not form a valid record.
    """
    if "ref" in fields:
        raise BadRequest("the store numbers calls itself; leave out 'ref'")
    tool = fields.get("tool")
    if not isinstance(tool, str):
        raise BadRequest("a call record needs a 'tool' string")
    # Records leave out what is unknown (the models refuse null for optional fields).
    data = {"ref": make_ref(tool, n), **{k: v for k, v in fields.items() if v is not None}}
    text = json_text(data, "a call record")
    # One pass: the JSON text is validated as the record, and the record read back from it
    # is what the SQLite store hands out later (a fresh copy, never the caller's objects).
    return read_call(text), text


def make_call(fields: dict[str, Any], n: int) -> CallRecord:
    """A CallRecord from its fields (None meaning absent) and its number.

    BadRequest when they do not form a valid record.
    """
    return stored_call(fields, n)[0]


def check_ending(outcome: str, result: dict[str, Any] | None, error: str | None,
                 ended_at: str) -> None:
    """BadRequest unless these fields may end a call with ``finish_call``: a final outcome
    (not ``pending``, and not ``held``, which only ``hold_call`` sets, CM-14), and each field
    valid as CallRecord has it (None meaning absent)."""
    if outcome == "pending":
        raise BadRequest("finish_call sets a final outcome; 'pending' is not one")
    if outcome == "held":
        raise BadRequest("finish_call does not hold a call: use hold_call, which records the "
                         "held call together with its effect state (CM-14)")
    _check_fields(outcome, result, error, ended_at)


def check_hold(result: dict[str, Any] | None, ended_at: str) -> None:
    """BadRequest unless these fields may end a call as ``held`` (see :func:`check_ending`)."""
    _check_fields("held", result, None, ended_at)


_OUTCOMES: frozenset[str] = frozenset(get_args(CallOutcome))


def _check_fields(outcome: str, result: dict[str, Any] | None, error: str | None,
                  ended_at: str) -> None:
    """The ending fields checked as CallRecord checks them, by hand (see :func:`new_call`);
    a result's values are checked as JSON data when it is stored."""
    if not isinstance(outcome, str) or outcome not in _OUTCOMES:
        raise _bad_call("outcome", "one of " + ", ".join(sorted(_OUTCOMES)), "call ending")
    if result is not None and (not isinstance(result, dict)
                               or not all(isinstance(key, str) for key in result)):
        raise _bad_call("result", "a JSON object", "call ending")
    if error is not None and not isinstance(error, str):
        raise _bad_call("error", "a string", "call ending")
    _check_timestamp("call ending", "ended_at", ended_at)


def outcome_conflict(order_id: str, ref: str, outcome: str) -> Conflict:
    """The Conflict for finishing a call whose outcome is ``outcome`` already."""
    return Conflict(f"call {ref!r} of order {order_id!r} already has outcome {outcome!r}; "
                    "an outcome is set once")


def _not_json(value: Any) -> Any:
    raise TypeError(f"a {type(value).__name__} is not JSON data")


# Made once and shared (it keeps no state between calls, so threads may share it): compact,
# UTF-8 as is, NaN and infinities refused, anything else that is not JSON data refused. With
# no circular check a value that contains itself fails as too deep, like a very deep one.
_STRICT = json.JSONEncoder(ensure_ascii=False, allow_nan=False, check_circular=False,
                           separators=(",", ":"), default=_not_json)
# The same encoder's C half, made once: JSONEncoder.encode makes it again for every value,
# and call records are encoded on every call.
_make_c = json.encoder.c_make_encoder  # type: ignore[attr-defined]
_C_STRICT = None if _make_c is None else _make_c(
    None, _not_json, json.encoder.encode_basestring, None, ":", ",", False, False, False)


# json.loads without its Python layers (the text is this module's own, compact and valid):
# a store copies arguments and results with it on every call.
_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _encode(value: Any) -> str:
    return _STRICT.encode(value) if _C_STRICT is None else "".join(_C_STRICT(value, 0))


def _quoted(text: str) -> str:
    """A string as :func:`_encode` writes it: printable ASCII without a quote or a backslash
    (a timestamp, an outcome) needs no escape, so the encoder is skipped."""
    if escapes_nothing(text):
        return f'"{text}"'
    return _encode(text)


def json_text(value: Any, what: str) -> str:
    """``value`` as the compact JSON text stores keep; BadRequest when it is not JSON data."""
    try:
        return _encode(value)
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"{what} must be JSON data: {exc}") from None
    except RecursionError:
        raise BadRequest(f"{what} must be JSON data: it is nested too deeply, or contains "
                         "itself") from None


def read_call(text: str) -> CallRecord:
    """The call record a JSON text holds; BadRequest, naming the first problem, if invalid."""
    try:
        return CallRecord.model_validate_json(text)
    except ValidationError as exc:
        raise _invalid("call record", exc) from None


def _invalid(what: str, exc: ValidationError) -> BadRequest:
    """The BadRequest naming the first problem pydantic found in a ``what``."""
    first = exc.errors()[0]
    where = pointer(*first["loc"])
    return BadRequest(f"not a valid {what}: {where}: {first['msg']}")


def finished_call(old: dict[str, Any], n: int, ref: str, *, outcome: str,
                  result: dict[str, Any] | None, error: str | None,
                  ended_at: str) -> tuple[CallRecord, str]:
    """The record with its outcome set, and its JSON text; Conflict when it was set already.

    ``old`` is the stored record's JSON data, ``n`` its number; the new fields were checked
    with :func:`check_ending`.
    """
    if old["outcome"] != "pending":
        raise outcome_conflict(old["order_id"], ref, old["outcome"])
    fields = {**old, "outcome": outcome, "result": result, "error": error,
              "ended_at": ended_at}
    del fields["ref"]
    return stored_call(fields, n)


def ended_data(data: dict[str, Any], ref: str, *, outcome: str,
               result: dict[str, Any] | None, error: str | None,
               ended_at: str) -> dict[str, Any]:
    """Call data (as :func:`new_call` made it) with its outcome set, its result the store's
    own copy; Conflict when the outcome was set already.

    For a store that keeps call data: the stored data was checked when stored and the new
    fields with :func:`check_ending`, so only they are new.
    """
    if data["outcome"] != "pending":
        raise outcome_conflict(data["order_id"], ref, data["outcome"])
    ended = {**data, "outcome": outcome, "ended_at": ended_at}
    if result is not None:
        ended["result"] = own_json(result, "a call's result")
    if error is not None:
        ended["error"] = error
    return ended


def ended_doc(doc: str, started_at: str, *, outcome: str, result: dict[str, Any] | None,
              error: str | None, ended_at: str) -> str | None:
    """The JSON text of a reserved call's record ``doc`` (:func:`new_call`'s data as
    :func:`json_text` wrote it, started at ``started_at``) with its outcome set, as a store
    that keeps the text writes it; None when ``doc`` does not end as such a text ends.

    The new fields are checked with :func:`check_ending` first."""
    started = _quoted(started_at)
    tail = f',"outcome":"pending","started_at":{started},"ended_at":{started}}}'
    if not doc.endswith(tail):
        return None
    parts = [doc[:-len(tail)], ',"outcome":', _quoted(outcome), ',"started_at":', started,
             ',"ended_at":', _quoted(ended_at)]
    if result is not None:
        parts += (',"result":', json_text(result, "a call's result"))
    if error is not None:
        parts += (',"error":', _encode(error))
    parts.append("}")
    return "".join(parts)


def effect_conflict(order_id: str, ref: str, actual: str | None,
                    expect: Sequence[str] | None) -> Conflict:
    """The Conflict for an effect whose state is not the expected one."""
    wanted = "absent" if expect is None else " or ".join(expect)
    return Conflict(
        f"effect {ref!r} of order {order_id!r} is {actual or 'absent'}, not {wanted}; "
        "someone else moved it first"
    )


def check_move(record: CallRecord, old: str | None, new: str) -> None:
    """Refuse an effect move that is not a row of the effect state table (CM-13).

    Raises:
        InvalidTransition: ``old → new`` is not a row; the message names the moves ``old``
            allows.
    """
    if is_move(old, new):
        return
    allowed = moves_from(old)
    here = "absent" if old is None else old
    then = (f"{here} is final: no move leaves it" if not allowed
            else f"from {here} it may move only to {', '.join(allowed)}")
    raise InvalidTransition(
        f"effect {record.ref!r} of order {record.order_id!r} cannot move from {here} to "
        f"{new}; {then} (SPEC §15)", state=here, action=f"move to {new}")


def next_effect(
    old: EffectState | None, record: CallRecord, *, expect: Sequence[str] | None, state: str,
    attempt: int | None, result: dict[str, Any] | None, error: str | None,
    settlement: Settlement | None, count_dispatch: bool, at: str,
) -> EffectState:
    """The effect state ``set_effect`` writes, after its compare-and-set check and the check
    that the move is a row of the effect state table (:func:`check_move`)."""
    name = check_effect_state(state)
    result = json_copy(result, f"the result of effect {record.ref!r}")
    if expect is None:
        if old is not None:
            raise effect_conflict(record.order_id, record.ref, old.state, expect)
        check_move(record, None, name)
        return EffectState(
            order_id=record.order_id, ref=record.ref,
            attempt=record.attempt if attempt is None else attempt, state=name,
            result=result, error=error, settlement=settlement,
            dispatches=1 if count_dispatch else 0, updated_at=at,
        )
    if old is None:
        raise NotFound(f"order {record.order_id!r} has no effect {record.ref!r}")
    if old.state not in expect:
        raise effect_conflict(record.order_id, record.ref, old.state, expect)
    check_move(record, old.state, name)
    return replace(
        old, state=name, attempt=old.attempt if attempt is None else attempt,
        result=result, error=error,
        settlement=old.settlement if settlement is None else settlement,
        dispatches=old.dispatches + (1 if count_dispatch else 0), updated_at=at,
    )


def restored_effect(effect: EffectState, record: CallRecord) -> EffectState:
    """The effect state ``restore_effect`` writes for the call ``record``: ``effect`` as it
    is, its state name checked and its result as JSON reads it back."""
    check_effect_state(effect.state)
    return replace(effect, order_id=record.order_id, ref=record.ref,
                   result=json_copy(effect.result, f"the result of effect {record.ref!r}"))


def held_call(old: dict[str, Any], n: int, ref: str, effect: EffectState | None, *,
              result: dict[str, Any] | None, ended_at: str,
              ) -> tuple[CallRecord, str, EffectState]:
    """What ``hold_call`` writes: the record with outcome ``held``, its JSON text, and its
    new effect in state ``held`` (CM-14).

    ``old`` is the stored record's JSON data and ``n`` its number, ``effect`` its stored
    effect (None when it has none). Conflict when the call's outcome is set already or it
    has an effect; the fields were checked with :func:`check_hold`.
    """
    record, text = finished_call(old, n, ref, outcome="held", result=result, error=None,
                                 ended_at=ended_at)
    new = next_effect(effect, record, expect=None, state="held", attempt=None, result=None,
                      error=None, settlement=None, count_dispatch=False, at=ended_at)
    return record, text, new


def check_takeover(info: LockInfo, replace_: LockInfo | None) -> None:
    """Refuse a takeover of a lock with another name."""
    if replace_ is not None and replace_.name != info.name:
        raise BadRequest(f"cannot take over lock {replace_.name!r} as {info.name!r}")


def timestamp(text: str) -> float:
    """Seconds since the epoch for an RFC 3339 timestamp."""
    return parse_time(text).timestamp()


# Subscriptions and outbox ------------------------------------------------------------------

NOTIFY_EVENTS: tuple[str, ...] = get_args(NotifyEventName)
ORDER_EVENTS: frozenset[str] = frozenset({"submitted", "blocked", "expired"})
"""Notified when an order's event reaches the state of that name (HOOK-3)."""
EFFECT_EVENTS: frozenset[str] = frozenset({"unknown", "committed", "failed"})
"""Notified when an effect reaches the state of that name (HOOK-3)."""
NOTIFICATION_STATES: frozenset[str] = frozenset(get_args(NotificationStateName))


def order_event_kind(event: Event) -> str | None:
    """The notification an appended event calls for: its new state when it moves the order
    into ``submitted``, ``blocked`` or ``expired``; None for every other event."""
    if event.from_ != event.to and event.to in ORDER_EVENTS:
        return event.to
    return None


def effect_event_kind(old: EffectState | None, new: EffectState) -> str | None:
    """The notification an effect write calls for: its new state when it moves into
    ``unknown``, ``committed`` or ``failed`` (a write that keeps the state, such as a
    settlement, calls for none)."""
    if new.state in EFFECT_EVENTS and (old is None or old.state != new.state):
        return new.state
    return None


def wanted_by(webhooks: Iterable[Webhook], kind: str, order_id: str) -> list[Webhook]:
    """The webhooks that subscribe to ``kind`` for this order."""
    return [w for w in webhooks
            if kind in w.events and (w.orders is None or order_id in w.orders)]


def effect_counts(states: Iterable[str]) -> dict[str, int]:
    """How many of an order's effects (its held calls, CM-14) are in each state, by name."""
    return dict(sorted(Counter(states).items()))


def notification_payload(kind: str, order: WorkOrder, state: str, at: str,
                         counts: dict[str, int], *, event: Event | None = None,
                         effect: EffectState | None = None,
                         tool: str | None = None) -> dict[str, Any]:
    """The body of a notification (HOOK-5), as Standard Webhooks lays it out: ``type``,
    ``timestamp`` and ``data``. The deliverer adds ``data.url`` when a public address is
    configured."""
    data: dict[str, Any] = {
        "event": kind, "order_id": order.id, "goal": order.goal, "worker": order.to,
        "manager": order.manager, "state": state, "at": at, "effects": counts,
    }
    if event is not None:
        data.update(seq=event.seq, action=event.action, actor=event.actor)
        if event.note is not None:
            data["note"] = event.note
    if effect is not None:
        data.update(ref=effect.ref, tool=tool, attempt=effect.attempt)
        if effect.error is not None:
            data["error"] = effect.error
    scope = "order" if kind in ORDER_EVENTS else "effect"
    return {"type": f"{scope}.{kind}", "timestamp": at, "data": data}


def new_notifications(webhooks: Sequence[Webhook], kind: str | None, order_id: str, at: str,
                      payload: Callable[[str], dict[str, Any]]) -> list[Notification]:
    """The notifications a write calls for: one per webhook that wants ``kind`` for the
    order, each with a fresh id and due at ``at``. ``payload(kind)`` is asked once, and only
    when some webhook wants the event."""
    if kind is None:
        return []
    wanting = wanted_by(webhooks, kind, order_id)
    if not wanting:
        return []
    body = json_copy(payload(kind), "a notification's payload")
    return [Notification(id=f"msg_{secrets.token_hex(12)}", webhook_id=w.id, event=kind,
                         order_id=order_id, payload=body, created_at=at, next_at=at)
            for w in wanting]


def check_notification_state(state: str) -> NotificationStateName:
    """``state`` as a notification state name; BadRequest when it is not one."""
    if state not in NOTIFICATION_STATES:
        raise BadRequest(f"unknown notification state {state!r}; use one of "
                         f"{', '.join(sorted(NOTIFICATION_STATES))}")
    return cast(NotificationStateName, state)


def after_attempt(old: Notification, attempt: DeliveryAttempt, *, state: str, next_at: str,
                  error: str | None) -> Notification:
    """The notification ``record_attempt`` writes: the attempt added and the new state, except
    that a delivered notification stays delivered and a dead one stays dead unless this
    attempt delivered it (its webhook may have been removed while it was in flight)."""
    name = check_notification_state(state)
    attempts = (*old.attempts, attempt)
    if old.state == "delivered" or (old.state == "dead" and name != "delivered"):
        return replace(old, attempts=attempts)
    return replace(old, state=name, next_at=next_at, attempts=attempts,
                   error=error if name == "dead" else None)


def webhook_conflict(webhook_id: str) -> Conflict:
    """The Conflict for adding a webhook whose id is taken."""
    return Conflict(f"a webhook with id {webhook_id!r} already exists; choose another id")


def notification_conflict(notification_id: str) -> Conflict:
    """The Conflict for restoring a notification whose id is kept already."""
    return Conflict(f"a notification with id {notification_id!r} is kept already; copy into "
                    "an empty store")


def web_session_conflict() -> Conflict:
    """The Conflict for keeping a web session under a hash already kept."""
    return Conflict("a web session with this id is kept already; start another")


def notification_not_found(notification_id: str) -> NotFound:
    """The NotFound for an absent notification."""
    return NotFound(f"no notification with id {notification_id!r}")


WEBHOOK_REMOVED = "its webhook was removed"
"""Why a pending notification dies with its webhook."""


def orphaned(note: Notification, at: str) -> Notification:
    """A pending notification as its webhook's removal leaves it: dead, as of ``at``."""
    return replace(note, state="dead", next_at=at, error=WEBHOOK_REMOVED)


def read_record(doc: str, state: str, seq: int, updated_at: str, *,
                reports: Sequence[str] = (), reviews: Sequence[str] = ()) -> OrderRecord:
    """The record a store that keeps documents as JSON text reads back from its texts."""
    return OrderRecord(
        order=WorkOrder.model_validate_json(doc), state=state, seq=seq,
        reports=tuple(WorkReport.model_validate_json(d) for d in reports),
        reviews=tuple(Review.model_validate_json(d) for d in reviews),
        updated_at=updated_at,
    )


def read_track_row(order_id: str, state: str, budget: str | None, latest: str | None,
                   reworks: int, accepted_at: str | None, approved_at: str | None) -> TrackRow:
    """A track row from the fields a store picked out of its documents: ``budget`` is the
    order's budget as JSON text, ``latest`` the JSON array ``[cost, status]`` of its latest
    report (None without one). A document without a budget (only a damaged store holds
    one) reads as an empty budget, so a migration filling tallies never stops at it."""
    cost, status = json.loads(latest) if latest is not None else (None, None)
    return TrackRow(order_id=order_id, state=state,
                    budget=json.loads(budget) if budget is not None else {}, cost=cost,
                    status=status, reworks=int(reworks), accepted_at=accepted_at,
                    approved_at=approved_at)


def first_track_row(order: WorkOrder, event: Event) -> TrackRow:
    """The track row of an order just created with ``event``."""
    return TrackRow.of(OrderRecord(order=order, state=event.to, seq=1))


def read_blocked_rows(rows: Sequence[Sequence[Any]]) -> list[BlockedRow]:
    """The blocked rows from the fields a store picked out of its question queue,
    ``(order_id, goal, worker, manager, escalate_to, deadline, seq, updated_at, latest,
    reworks, weight)`` each, where ``latest`` is the JSON array ``[attempt, questions]`` of
    the order's latest report (None without one).

    Every ``latest`` is parsed in one JSON array: a page may be hundreds of rows."""
    latest = json.loads(f"[{','.join(row[8] or 'null' for row in rows)}]")
    return [BlockedRow(row[0], row[1], row[2], row[3], row[4], row[5], int(row[6]), row[7],
                       last[0] if last else None, int(row[9]),
                       tuple(last[1] or ()) if last else (), int(row[10]))
            for row, last in zip(rows, latest, strict=True)]


# Copying a desk ----------------------------------------------------------------------------

def restored_orders(batch: Sequence[DeskOrder]) -> list[tuple[Any, ...]]:
    """The rows of a batch's orders: ``(id, JSON text, state, seq, worker, manager,
    parent_id, created_at, updated_at)``, the columns every store's ``orders`` table has."""
    return [(d.record.order.id, dump_json(d.record.order.to_json()), d.record.state,
             d.record.seq, d.record.order.to, d.record.order.manager,
             d.record.order.parent_id, d.record.order.created_at, d.record.updated_at)
            for d in batch]


def restored_rows(batch: Sequence[DeskOrder]) -> dict[str, list[tuple[str, int, str]]]:
    """The ``(order_id, seq or idx, JSON text)`` rows of a batch's events, reports and
    reviews, table by table, as a store that keeps them as text writes them."""
    return {
        "events": [(d.record.order.id, e.seq, dump_json(e.to_json()))
                   for d in batch for e in d.events],
        "reports": [(d.record.order.id, i, dump_json(r.to_json()))
                    for d in batch for i, r in enumerate(d.record.reports)],
        "reviews": [(d.record.order.id, i, dump_json(r.to_json()))
                    for d in batch for i, r in enumerate(d.record.reviews)],
    }


def check_restored_ref(record: CallRecord, n: int) -> None:
    """BadRequest unless a restored call's ref is the ``n`` the store numbers it."""
    if call_number(record.order_id, record.ref)[0] != n:
        raise BadRequest(f"call {record.ref} of order {record.order_id} cannot be restored as "
                         f"call {n}: the calls of an order go in N order, from 1, with no gap")


def restored_effects(order: DeskOrder) -> list[tuple[str, int, str]]:
    """The ``(order_id, N, JSON text)`` rows of an order's effects as ``restore_effect``
    writes each; NotFound for an effect of a call the order does not carry."""
    oid = order.record.order.id
    calls = {c.ref: c for c in order.calls}
    rows = []
    for effect in order.effects:
        record = calls.get(effect.ref)
        if record is None:
            raise call_not_found(oid, effect.ref)
        rows.append((oid, call_number(oid, effect.ref)[0],
                     effect_doc(restored_effect(effect, record))))
    return rows
