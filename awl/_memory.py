"""The in-memory store: the reference implementation of :class:`awl._store.Store`.

Everything lives in dictionaries behind one lock, so every method is atomic against every
other thread. It keeps nothing across processes; use it for tests and short-lived desks.
The small checks both stores share (state names, scope limits, refs, call records) live
here too, so the two stores cannot drift apart on what they accept.
"""

from __future__ import annotations

import json
import threading
from _json import encode_basestring, make_encoder
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast, get_args

from pydantic import ValidationError

from awl._errors import BadRequest, Conflict, NotFound
from awl._models import CALL_ENDING, CallRecord, Event, Review, WorkOrder, WorkReport, parse_time
from awl._patterns import make_ref, parse_ref
from awl._store import (
    EffectState,
    EffectStateName,
    LockInfo,
    OrderRecord,
    PassRecord,
    Revocation,
    Scope,
    Settlement,
    TokenRecord,
    Usage,
)
from awl._track import TrackRow

__all__ = ["MemoryStore"]

EFFECT_STATES: frozenset[str] = frozenset(get_args(EffectStateName))

# A float sum of per-call prices may land a hair above an exact limit (0.1 * 3 > 0.3).
USD_TOLERANCE = 1e-9


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
        if scope.max_calls is not None and calls + 1 > scope.max_calls:
            return scope.name
        if scope.max_usd is not None and used + usd > scope.max_usd + USD_TOLERANCE:
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
        if max_calls is not None and calls + 1 > max_calls:
            return above_scope(order_id)
        if max_usd is not None and used + usd > max_usd + USD_TOLERANCE:
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


def new_call(
    order_id: str, n: int, *, attempt: int, tool: str, arguments: dict[str, Any],
    pass_jti: str | None, started_at: str,
) -> tuple[CallRecord, str]:
    """A reserved call's record (outcome pending, ended when it started) and its JSON text."""
    return stored_call({
        "order_id": order_id, "attempt": attempt, "tool": tool, "arguments": arguments,
        "pass_jti": pass_jti, "outcome": "pending", "started_at": started_at,
        "ended_at": started_at,
    }, n)


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
    """BadRequest unless these fields may end a call: a final outcome (not ``pending``), and
    each field valid as CallRecord has it (None meaning absent)."""
    if outcome == "pending":
        raise BadRequest("finish_call sets a final outcome; 'pending' is not one")
    fields: dict[str, Any] = {"outcome": outcome, "ended_at": ended_at}
    if result is not None:
        fields["result"] = result
    if error is not None:
        fields["error"] = error
    try:
        CALL_ENDING.model_validate(fields)
    except ValidationError as exc:
        raise _invalid("call ending", exc) from None


def outcome_conflict(order_id: str, ref: str, outcome: str) -> Conflict:
    """The Conflict for finishing a call whose outcome is ``outcome`` already."""
    return Conflict(f"call {ref!r} of order {order_id!r} already has outcome {outcome!r}; "
                    "an outcome is set once")


def _not_json(value: Any) -> Any:
    raise TypeError(f"a {type(value).__name__} is not JSON data")


# The C encoder behind json.dumps, made once (JSONEncoder.encode makes one per call): compact,
# UTF-8 as is, NaN and infinities refused. Without a markers dict it keeps no state between
# calls (so threads may share it); a circular value fails as too deep.
_encode_strict = make_encoder(None, _not_json, encode_basestring, None, ":", ",", False, False,
                              False)


def json_text(value: Any, what: str) -> str:
    """``value`` as the compact JSON text stores keep; BadRequest when it is not JSON data."""
    try:
        return "".join(_encode_strict(value, 0))
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
    where = "/".join(str(p) for p in first["loc"])
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


def effect_conflict(order_id: str, ref: str, actual: str | None,
                    expect: Sequence[str] | None) -> Conflict:
    """The Conflict for an effect whose state is not the expected one."""
    wanted = "absent" if expect is None else " or ".join(expect)
    return Conflict(
        f"effect {ref!r} of order {order_id!r} is {actual or 'absent'}, not {wanted}; "
        "someone else moved it first"
    )


def next_effect(
    old: EffectState | None, record: CallRecord, *, expect: Sequence[str] | None, state: str,
    attempt: int | None, result: dict[str, Any] | None, error: str | None,
    settlement: Settlement | None, count_dispatch: bool, at: str,
) -> EffectState:
    """The effect state ``set_effect`` writes, after its compare-and-set check."""
    name = check_effect_state(state)
    result = json_copy(result, f"the result of effect {record.ref!r}")
    if expect is None:
        if old is not None:
            raise effect_conflict(record.order_id, record.ref, old.state, expect)
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
    return replace(
        old, state=name, attempt=old.attempt if attempt is None else attempt,
        result=result, error=error,
        settlement=old.settlement if settlement is None else settlement,
        dispatches=old.dispatches + (1 if count_dispatch else 0), updated_at=at,
    )


def check_takeover(info: LockInfo, replace_: LockInfo | None) -> None:
    """Refuse a takeover of a lock with another name."""
    if replace_ is not None and replace_.name != info.name:
        raise BadRequest(f"cannot take over lock {replace_.name!r} as {info.name!r}")


def timestamp(text: str) -> float:
    """Seconds since the epoch for an RFC 3339 timestamp."""
    return parse_time(text).timestamp()


@dataclass
class _Call:
    record: CallRecord
    counted: bool
    usd: float
    started: float


@dataclass
class _Charged:
    """What an order's sub-orders, at any depth, have spent: charged to its budget."""

    calls: int = 0
    usd: float = 0.0
    first: _Call | None = None  # their earliest call, counted or not


@dataclass
class _Order:
    order: WorkOrder
    state: str
    events: list[Event]
    reports: list[WorkReport]
    reviews: list[Review]
    calls: dict[int, _Call]
    effects: dict[int, EffectState]
    charged: _Charged = field(default_factory=_Charged)

    def record(self) -> OrderRecord:
        return OrderRecord(
            order=self.order, state=self.state, seq=self.events[-1].seq,
            reports=tuple(self.reports), reviews=tuple(self.reviews),
            updated_at=self.events[-1].at,
        )


class MemoryStore:
    """A :class:`awl._store.Store` in memory, safe to share between threads.

    Example:
        >>> store = MemoryStore()
        >>> store.list_orders()
        []
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._orders: dict[str, _Order] = {}
        self._locks: dict[str, LockInfo] = {}
        self._revoked: dict[str, Revocation] = {}
        self._tokens: dict[str, TokenRecord] = {}
        self._passes: dict[str, PassRecord] = {}

    def _get(self, order_id: str) -> _Order:
        found = self._orders.get(order_id)
        if found is None:
            raise order_not_found(order_id)
        return found

    # Orders and their logs -----------------------------------------------------------
    def create_order(self, order: WorkOrder, event: Event) -> None:
        """Store a new order with its first event (seq 1); its state is ``event.to``."""
        check_first_event(order, event)
        with self._lock:
            old = self._orders.get(order.id)
            if old is not None:
                raise order_exists_conflict(order.id, old.events[-1].seq)
            self._orders[order.id] = _Order(
                order=order, state=event.to, events=[event],
                reports=[], reviews=[], calls={}, effects={},
            )

    def load(self, order_id: str) -> OrderRecord:
        """The order and all it carries. NotFound if absent."""
        with self._lock:
            return self._get(order_id).record()

    def append(
        self,
        order_id: str,
        event: Event,
        *,
        state: str,
        report: WorkReport | None = None,
        review: Review | None = None,
    ) -> None:
        """Append ``event`` if its seq follows the stored one, else Conflict."""
        with self._lock:
            found = self._get(order_id)
            seq = found.events[-1].seq
            if event.seq != seq + 1:
                raise seq_conflict(order_id, event, seq)
            found.events.append(event)
            found.state = state
            if report is not None:
                found.reports.append(report)
            if review is not None:
                found.reviews.append(review)

    def events(self, order_id: str, after: int = 0, limit: int | None = None) -> list[Event]:
        """Events with seq > ``after``, in order (at most ``limit``)."""
        with self._lock:
            # seq runs 1..n, so seq s sits at index s - 1.
            events = self._get(order_id).events[max(after, 0):]
        return events if limit is None else events[:limit]

    def track_rows(self, worker: str) -> list[TrackRow]:
        """One track row per order addressed to ``worker``, newest first."""
        with self._lock:
            return [
                TrackRow.of(o.record(), o.events[1] if len(o.events) > 1 else None)
                for o in reversed(self._orders.values()) if o.order.to == worker
            ]

    def list_orders(
        self,
        *,
        state: str | Sequence[str] | None = None,
        worker: str | None = None,
        manager: str | None = None,
        parent_id: str | None = None,
        limit: int | None = 100,
        offset: int = 0,
    ) -> list[OrderRecord]:
        """Orders matching every filter given, most recently created first."""
        states = {state} if isinstance(state, str) else None if state is None else set(state)
        with self._lock:
            found = [
                o.record() for o in reversed(self._orders.values())
                if (states is None or o.state in states)
                and (worker is None or o.order.to == worker)
                and (manager is None or o.order.manager == manager)
                and (parent_id is None or o.order.parent_id == parent_id)
            ]
        end = None if limit is None else offset + limit
        return found[offset:end]

    # Gateway call records --------------------------------------------------------------
    def reserve_call(
        self,
        order_id: str,
        *,
        attempt: int,
        tool: str,
        arguments: dict[str, Any],
        pass_jti: str | None,
        usd: float,
        started_at: str,
        scopes: Sequence[Scope],
        seq: int | None = None,
    ) -> CallRecord | str:
        """Atomically number and record a call that counts, or name the scope it exceeds."""
        with self._lock:
            found = self._get(order_id)
            if seq is not None and found.events[-1].seq != seq:
                raise stale_order(order_id, seq, found.events[-1].seq)
            def spent(jtis: frozenset[str] | None) -> tuple[int, float]:
                mine = [c.usd for c in found.calls.values()
                        if c.counted and (jtis is None or c.record.pass_jti in jtis)]
                if jtis is None:
                    return len(mine) + found.charged.calls, sum(mine) + found.charged.usd
                return len(mine), sum(mine)

            over = exceeded_scope(scopes, spent, usd)
            above = self._above(found)
            over = over or exceeded_above([
                (o.order.id, o.order.budget.tool_calls, o.order.budget.usd,
                 sum(1 for c in o.calls.values() if c.counted) + o.charged.calls,
                 sum(c.usd for c in o.calls.values() if c.counted) + o.charged.usd)
                for o in above], usd)
            if over is not None:
                return over
            n = len(found.calls) + 1
            record, _ = new_call(
                order_id, n, attempt=attempt, tool=tool, arguments=arguments,
                pass_jti=pass_jti, started_at=started_at,
            )
            call = found.calls[n] = _Call(record, True, usd, timestamp(started_at))
            self._charge(above, call)
            return record

    def _above(self, found: _Order) -> list[_Order]:
        """The orders above ``found``, its parent first (see :data:`MAX_CHAIN`)."""
        chain: list[_Order] = []
        seen = {found.order.id}
        parent_id = found.order.parent_id
        while parent_id is not None and parent_id not in seen and len(chain) < MAX_CHAIN:
            parent = self._orders.get(parent_id)
            if parent is None:
                break
            chain.append(parent)
            seen.add(parent_id)
            parent_id = parent.order.parent_id
        return chain

    @staticmethod
    def _charge(above: Sequence[_Order], call: _Call) -> None:
        """Charge a sub-order's call to every order above it."""
        for order in above:
            charged = order.charged
            if call.counted:
                charged.calls += 1
                charged.usd += call.usd
            if charged.first is None or call.started < charged.first.started:
                charged.first = call

    def record_call(self, record_fields: dict[str, Any]) -> CallRecord:
        """Number and store a call that does not count (a refusal)."""
        order_id = record_order_id(record_fields)
        with self._lock:
            found = self._get(order_id)
            n = len(found.calls) + 1
            record = make_call(record_fields, n)
            call = found.calls[n] = _Call(record, False, 0.0, timestamp(record.started_at))
            self._charge(self._above(found), call)
            return record

    def finish_call(
        self, order_id: str, ref: str, *, outcome: str, result: dict[str, Any] | None,
        error: str | None, ended_at: str,
    ) -> None:
        """Set the outcome of a reserved call."""
        check_ending(outcome, result, error, ended_at)
        with self._lock:
            n, call = self._call(order_id, ref)
            call.record, _ = finished_call(
                call.record.to_json(), n, ref, outcome=outcome, result=result, error=error,
                ended_at=ended_at,
            )

    def _call(self, order_id: str, ref: str) -> tuple[int, _Call]:
        n, tool = call_number(order_id, ref)
        call = self._get(order_id).calls.get(n)
        if call is None or call.record.tool != tool:
            raise call_not_found(order_id, ref)
        return n, call

    def calls(self, order_id: str, *, attempt: int | None = None) -> list[CallRecord]:
        """The order's call records by N."""
        with self._lock:
            return [
                c.record for _, c in sorted(self._get(order_id).calls.items())
                if attempt is None or c.record.attempt == attempt
            ]

    def usage(self, order_id: str, jtis: frozenset[str] | None = None) -> Usage:
        """Counted calls and USD so far (for the calls under ``jtis`` if given)."""
        with self._lock:
            found = self._get(order_id)
            mine = [c for c in found.calls.values() if jtis is None or c.record.pass_jti in jtis]
            charged = _Charged() if jtis is not None else replace(found.charged)
        counted = [c for c in mine if c.counted]
        starts = [*mine, *([] if charged.first is None else [charged.first])]
        first = min(starts, key=lambda c: c.started, default=None)
        return Usage(
            tool_calls=len(counted) + charged.calls,
            usd=sum(c.usd for c in counted) + charged.usd,
            first_call_at=None if first is None else first.record.started_at,
        )

    # Effects ---------------------------------------------------------------------------
    def effects(self, order_id: str) -> list[EffectState]:
        """Every effect state of the order, by N."""
        with self._lock:
            return [e for _, e in sorted(self._get(order_id).effects.items())]

    def set_effect(
        self, order_id: str, ref: str, *, expect: Sequence[str] | None, state: str,
        attempt: int | None = None, result: dict[str, Any] | None = None,
        error: str | None = None, settlement: Settlement | None = None,
        count_dispatch: bool = False, at: str,
    ) -> EffectState:
        """Move an effect to ``state`` if it is in one of ``expect``; Conflict otherwise."""
        with self._lock:
            n, call = self._call(order_id, ref)
            effects = self._orders[order_id].effects
            new = next_effect(
                effects.get(n), call.record, expect=expect, state=state, attempt=attempt,
                result=result, error=error, settlement=settlement,
                count_dispatch=count_dispatch, at=at,
            )
            effects[n] = new
            return new

    # Locks ----------------------------------------------------------------------------
    def acquire_lock(self, info: LockInfo, *, replace: LockInfo | None = None) -> bool:
        """Take the named lock if free, or if it is still exactly ``replace``."""
        check_takeover(info, replace)
        with self._lock:
            if not may_take(self._locks.get(info.name), replace):
                return False
            self._locks[info.name] = stored_lock(info)
            return True

    def get_lock(self, name: str) -> LockInfo | None:
        """The current holder of the named lock, if any."""
        with self._lock:
            current = self._locks.get(name)
        return None if current is None else stored_lock(current)

    def release_lock(self, name: str, holder: str) -> None:
        """Release the lock if ``holder`` holds it."""
        with self._lock:
            current = self._locks.get(name)
            if current is not None and current.holder == holder:
                del self._locks[name]

    # Passes and tokens -------------------------------------------------------------------
    def revoke(self, jti: str, *, reason: str, at: str) -> None:
        """Record that a pass is revoked (idempotent: the first reason and time are kept)."""
        with self._lock:
            self._revoked.setdefault(jti, Revocation(reason=reason, at=at))

    def revoked(self) -> dict[str, str]:
        """Every revoked jti with its reason."""
        with self._lock:
            return {jti: r.reason for jti, r in self._revoked.items()}

    def revocations(self) -> dict[str, Revocation]:
        """Every revoked jti with its reason and time."""
        with self._lock:
            return dict(self._revoked)

    def save_pass(self, record: PassRecord) -> None:
        """Remember an issued pass (saving a jti again replaces its record)."""
        with self._lock:
            self._passes[record.jti] = record

    def passes(self, order_id: str) -> list[PassRecord]:
        """The passes saved for an order, in the order they were first saved."""
        with self._lock:
            return [p for p in self._passes.values() if p.order_id == order_id]

    def save_token(self, token_hash: str, principal: str, *, created_at: str) -> None:
        """Remember a desk access token by its hash."""
        with self._lock:
            self._tokens[token_hash] = TokenRecord(token_hash, principal, created_at)

    def principal_for(self, token_hash: str) -> str | None:
        """The principal a token hash was issued to."""
        with self._lock:
            found = self._tokens.get(token_hash)
            return None if found is None else found.principal

    def tokens(self) -> list[TokenRecord]:
        """Every desk access token (by hash), oldest first."""
        with self._lock:
            return list(self._tokens.values())

    def drop_token(self, token_hash: str) -> bool:
        """Forget a token; False if there was no such token."""
        with self._lock:
            return self._tokens.pop(token_hash, None) is not None

    def close(self) -> None:
        """Nothing to release; present for the interface."""
