"""Immutable models of every AWL document.

The JSON Schemas in ``schemas/`` are normative for structure; these models agree with them
on every conformance case (a test checks it). Timestamps stay the strings they were written
as, so a document round-trips to the same JSON; :func:`parse_time` reads one.
"""

from __future__ import annotations

import functools
import re
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    create_model,
    model_validator,
)

from awl._patterns import NAME

__all__ = [
    "Artifact",
    "Budget",
    "CallRecord",
    "ContextItem",
    "Cost",
    "Criterion",
    "Decision",
    "Effect",
    "Event",
    "Evidence",
    "FileFocus",
    "Grant",
    "Handoff",
    "LineRange",
    "NextStep",
    "PassClaims",
    "Result",
    "Review",
    "Tried",
    "WorkOrder",
    "WorkReport",
    "parse_time",
]

_V = TypeVar("_V")

_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"
)


def parse_time(text: str) -> datetime:
    """Parse an RFC 3339 timestamp (with its offset) into an aware datetime."""
    return _parse_time(text)


# The same times are read again and again: an order's deadline on every gateway call, a call
# record's times each time the record is validated on its way into the store. datetimes are
# immutable, so the cache may share them.
@functools.lru_cache(maxsize=1024)
def _parse_time(text: str) -> datetime:
    if not _RFC3339.match(text):
        raise ValueError(f"not an RFC 3339 timestamp with an offset: {text[:64]!r}")
    return datetime.fromisoformat(text.upper().replace("Z", "+00:00"))


def _check_time(text: str) -> str:
    parse_time(text)
    return text


def _whole(value: Any) -> Any:
    # JSON has one number type and JSON Schema counts 5.0 as the integer 5; so do we.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Integer = Annotated[StrictInt, BeforeValidator(_whole)]
"""A JSON integer: a whole number, written ``5`` or ``5.0``; never a bool or a string."""

Timestamp = Annotated[StrictStr, AfterValidator(_check_time)]
"""An RFC 3339 timestamp with an offset, kept as written."""

Text = Annotated[StrictStr, Field(min_length=1)]
Principal = Annotated[StrictStr, Field(min_length=1, max_length=512)]
"""An agent or human reference, for example ``agent:researcher`` or ``human:ana``."""
ToolPattern = Annotated[StrictStr, Field(pattern=rf"^(\*|{NAME}/(\*|{NAME}))$")]
ToolName = Annotated[StrictStr, Field(pattern=rf"^{NAME}/{NAME}$")]
Number = Annotated[StrictFloat | StrictInt, Field(ge=0)]
Count = Annotated[Integer, Field(ge=0)]
JSONObject = dict[str, Any]

ORDER_SPEC = r"^awl/work-order@[0-9]+\.[0-9]+$"
REPORT_SPEC = r"^awl/work-report@[0-9]+\.[0-9]+$"
PASS_SPEC = r"^awl/delegation-pass@[0-9]+\.[0-9]+$"


class _Frozen(BaseModel):
    """Frozen, no unknown fields; the base of :class:`_Model` and of :class:`CallRecord`."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    def to_json(self) -> dict[str, Any]:
        """The document as JSON-ready data, exactly the fields that were set."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


def _not_null(value: _V) -> _V:
    if value is None:
        raise ValueError("null is not a value of this field; leave it out")
    return value


NotNull = AfterValidator(_not_null)
"""Refuses an explicit null for one optional field (an absent field is never validated)."""


class _Model(_Frozen):
    """Base of every nested model: frozen, no unknown fields, no null for an optional field."""

    _nullable: ClassVar[frozenset[str]] = frozenset()
    """Fields for which JSON null is a value rather than a missing field."""

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any) -> Any:
        # The schemas refuse null for an optional field (leave it out instead); refusing it here
        # too keeps both verdicts equal and keeps to_json() from ever writing such a null.
        # Most documents hold no null at all; the field names are gathered only when one does
        # (gathering them on every validation was half the cost of reading a call record).
        if isinstance(data, dict) and any(v is None for v in data.values()):
            names = {n for name, f in cls.model_fields.items() for n in (name, f.alias) if n}
            nulls = sorted(
                k for k, v in data.items() if v is None and k in names and k not in cls._nullable
            )
            if nulls:
                raise ValueError(f"null is not a value of {', '.join(nulls)}; leave it out")
        return data


class _Document(_Model):
    """Base of top-level documents: unknown fields refused except ``x-*`` extensions."""

    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True)

    @model_validator(mode="after")
    def _only_extensions(self) -> _Document:
        extra = self.__pydantic_extra__ or {}
        unknown = sorted(k for k in extra if not k.startswith("x-"))
        if unknown:
            raise ValueError(f"unknown fields: {', '.join(unknown)}")
        return self


class Criterion(_Model):
    """One way the work will be judged."""

    id: Annotated[StrictStr, Field(min_length=1, max_length=64)]
    """Unique within the order; evidence names it."""
    text: Text
    """What must be true, in plain language."""


class _Amounts(_Model):
    usd: Number | None = None
    """Money, in US dollars."""
    tokens: Count | None = None
    """Model tokens, input plus output."""
    tool_calls: Count | None = None
    """Tool invocations, held ones included."""
    seconds: Number | None = None
    """Wall-clock working time."""

    def units(self) -> dict[str, float]:
        """The units that are set, with their values."""
        units = {"usd": self.usd, "tokens": self.tokens, "tool_calls": self.tool_calls,
                 "seconds": self.seconds}
        return {k: v for k, v in units.items() if v is not None}


class Budget(_Amounts):
    """Upper limits for a job: at least one unit."""

    @model_validator(mode="after")
    def _at_least_one(self) -> Budget:
        if not self.units():
            raise ValueError("a budget sets at least one of usd, tokens, tool_calls, seconds")
        return self


class Cost(_Amounts):
    """What a job actually spent, in budget units."""


class ContextItem(_Model):
    """A pointer to material the worker should read."""

    uri: Text
    note: StrictStr | None = None


class Decision(_Model):
    """A choice already made, and why."""

    text: Text
    why: StrictStr | None = None


class Tried(_Model):
    """An approach already attempted, and what came of it."""

    text: Text
    result: StrictStr | None = None


class NextStep(_Model):
    """A next step with its priority."""

    text: Text
    priority: Literal["high", "medium", "low"] = "medium"


class LineRange(_Model):
    """Lines of a file that matter, 1-based and inclusive."""

    start: Annotated[Integer, Field(ge=1)]
    end: Annotated[Integer, Field(ge=1)]
    note: StrictStr | None = None


class FileFocus(_Model):
    """A file that matters to whoever continues, with the lines to open."""

    path: Text
    note: StrictStr | None = None
    ranges: Annotated[tuple[LineRange, ...], Field(min_length=1)] | None = None


class Handoff(_Model):
    """The previous worker's account of where a job stands (not verified fact)."""

    summary: Text | None = None
    decisions: Annotated[tuple[Decision, ...], Field(min_length=1)] | None = None
    tried: Annotated[tuple[Tried, ...], Field(min_length=1)] | None = None
    open_questions: Annotated[tuple[Text, ...], Field(min_length=1)] | None = None
    next_step: Text | None = None
    next_steps: Annotated[tuple[NextStep, ...], Field(min_length=1)] | None = None
    files: Annotated[tuple[FileFocus, ...], Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _not_empty(self) -> Handoff:
        if not self.model_dump(exclude_none=True):
            raise ValueError("a handoff is never empty")
        return self


class WorkOrder(_Document):
    """A bounded job from a manager to a worker. Never edited once issued."""

    spec: Annotated[StrictStr, Field(pattern=ORDER_SPEC)]
    """Format and version, ``awl/work-order@0.3``."""
    id: Annotated[StrictStr, Field(min_length=1, max_length=128)]
    """Unique order id."""
    created_at: Timestamp
    """When the order was issued."""
    from_: Principal = Field(alias="from")
    """The manager."""
    to: Principal
    """The worker."""
    goal: Text
    """What to achieve."""
    criteria: Annotated[tuple[Criterion, ...], Field(min_length=1)]
    """How done will be judged."""
    budget: Budget
    """Upper limits for the job."""
    deadline: Timestamp
    """Latest allowed finish."""
    tools: tuple[ToolPattern, ...]
    """Tools the worker may call."""
    staged: tuple[ToolPattern, ...] = ()
    """Tools whose calls are held until the manager approves them."""
    escalate_to: Principal | None = None
    """Who answers when the worker is blocked; default the manager."""
    inputs: JSONObject | None = None
    """Structured inputs for the job."""
    context: tuple[ContextItem, ...] | None = None
    """Material to read."""
    handoff: Handoff | None = None
    """What earlier work on this job established."""
    output_schema: JSONObject | None = None
    """JSON Schema that ``result.output`` must match when done."""
    parent_id: Annotated[StrictStr, Field(min_length=1)] | None = None
    """The order this one was split from."""
    continues: Annotated[StrictStr, Field(min_length=1)] | None = None
    """The finished order this one replaces."""
    metadata: JSONObject | None = None
    """Free-form; ignored by checks."""

    @property
    def manager(self) -> str:
        """The manager's principal (the ``from`` field)."""
        return self.from_

    @property
    def answerers(self) -> tuple[str, ...]:
        """Who may answer the worker's questions."""
        return (self.from_,) if self.escalate_to in (None, self.from_) else (
            self.from_, str(self.escalate_to))


class Artifact(_Model):
    """Something the work produced that a reviewer can open."""

    uri: Text
    media_type: StrictStr | None = None
    note: StrictStr | None = None


class Result(_Model):
    """What was produced."""

    _nullable = frozenset({"output"})

    summary: StrictStr
    output: Any = None
    artifacts: tuple[Artifact, ...] | None = None


class Evidence(_Model):
    """Proof for one criterion."""

    criterion: Text
    type: Literal["tool_call", "artifact", "citation", "note"]
    ref: StrictStr | None = None
    note: StrictStr | None = None


class Effect(_Model):
    """A held call the worker asks the manager to let run."""

    ref: StrictStr
    """The held call, ``server/tool#N``."""
    tool: ToolName
    """The canonical tool name, ``server/tool``."""
    arguments: JSONObject
    """The exact arguments that were held."""


class WorkReport(_Document):
    """The worker's account of one attempt."""

    spec: Annotated[StrictStr, Field(pattern=REPORT_SPEC)]
    order_id: Text
    from_: Principal = Field(alias="from")
    status: Literal["done", "blocked", "failed"]
    result: Result
    evidence: tuple[Evidence, ...]
    cost: Cost
    finished_at: Timestamp
    tools_used: tuple[ToolName, ...]
    started_at: Timestamp | None = None
    attempt: Annotated[Integer, Field(ge=1)] | None = None
    questions: tuple[Text, ...] | None = None
    error: Text | None = None
    handoff: Handoff | None = None
    effects: tuple[Effect, ...] | None = None
    metadata: JSONObject | None = None


class Grant(_Model):
    """What a Delegation Pass allows."""

    order_id: Text
    """The order the authority comes from."""
    tools: tuple[ToolPattern, ...]
    """Tool patterns the holder may call."""
    budget: Budget
    """Upper limits the holder may spend."""
    parent_jti: Text | None = None
    """The pass this one was derived from (absent on a worker's pass)."""
    manager: Principal | None = None
    """The order's manager; a worker's pass states it."""
    deadline: Timestamp | None = None
    """The order's deadline; a worker's pass states it."""
    staged: tuple[ToolPattern, ...] | None = None
    """The order's staged patterns; a worker's pass states them so a verifier without the
    desk knows which calls are held and that no derived pass may grant them."""


class PassClaims(_Document):
    """The claims of a signed Delegation Pass."""

    spec: Annotated[StrictStr, Field(pattern=PASS_SPEC)]
    iss: Principal
    sub: Principal
    aud: Principal
    jti: Annotated[StrictStr, Field(min_length=1, max_length=128)]
    iat: Annotated[Integer, Field(ge=0)]
    nbf: Annotated[Integer, Field(ge=0)]
    exp: Annotated[Integer, Field(ge=0)]
    grant: Grant


CallOutcome = Literal["pending", "ok", "error", "refused", "held"]
"""``pending``: reserved and counted, its answer not recorded yet (after a crash it stays
pending, which honestly says "sent, outcome not recorded")."""


class CallRecord(_Frozen):
    """One tool call as the gateway saw it; written before the worker gets an answer.

    The gateway validates two of these per call, so its optional fields refuse null one by
    one (:data:`NotNull`) rather than through :class:`_Model`'s check of the whole input,
    which makes pydantic hand the input to Python first and costs twice as much.
    """

    ref: StrictStr
    order_id: Text
    attempt: Annotated[Integer, Field(ge=1)]
    pass_jti: Annotated[StrictStr | None, NotNull] = None
    tool: ToolName
    arguments: JSONObject
    outcome: CallOutcome
    result: Annotated[JSONObject | None, NotNull] = None
    error: Annotated[StrictStr | None, NotNull] = None
    started_at: Timestamp
    ended_at: Timestamp


_ENDING: dict[str, Any] = {
    name: (CallRecord.model_fields[name].annotation, CallRecord.model_fields[name])
    for name in ("outcome", "result", "error", "ended_at")
}
CALL_ENDING: type[BaseModel] = create_model("CallEnding", __base__=_Frozen, **_ENDING)
"""The fields that end a call (outcome, result, error, ended_at), checked by CallRecord's own
rules: a store validates them before it sets them on a stored record."""


class Event(_Model):
    """One entry of an order's append-only log."""

    _nullable = frozenset({"from", "from_"})

    seq: Annotated[Integer, Field(ge=1)]
    at: Timestamp
    actor: Principal
    action: Text
    from_: StrictStr | None = Field(default=None, alias="from")
    to: StrictStr
    note: StrictStr | None = None
    data: JSONObject | None = None


class Review(_Model):
    """A manager's decision on a submitted report."""

    order_id: Text
    attempt: Annotated[Integer, Field(ge=1)]
    actor: Principal
    decision: Literal["approve", "rework"]
    reason: StrictStr | None = None
    effects: tuple[StrictStr, ...] | None = None
    at: Timestamp
