"""Immutable models of every AWL document.

The JSON Schemas in ``schemas/`` are normative for structure; these models agree with them
on every conformance case (a test checks it). Timestamps stay the strings they were written
as, so a document round-trips to the same JSON; :func:`parse_time` reads one.
"""

from __future__ import annotations

import functools
import re
import time
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)

from awl.documents.errors import BadRequest
from awl.documents.limits import MAX_EPOCH, check_epoch, check_instant
from awl.documents.patterns import NAME
from awl.documents.rule_ids import current_findings, current_findings_note

__all__ = [
    "CHECK_TIMEOUT",
    "Artifact",
    "Budget",
    "CallRecord",
    "Check",
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
    "answerers_of",
    "epoch_seconds",
    "format_epoch",
    "format_time",
    "parse_time",
    "stored_time",
    "utc_now",
]

_V = TypeVar("_V")

_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"
)


# The spelling format_time writes (UTC, milliseconds, ``Z``): every call record's times. Read
# without the cache: each is new, and thousands of them would flush the times read again.
_DESK_SPELLING = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z\Z")


def parse_time(text: str) -> datetime:
    """Parse an RFC 3339 timestamp (with its offset) into an aware datetime."""
    if isinstance(text, str) and _DESK_SPELLING.match(text):
        try:
            # A UTC time is within years 1 to 9999 in UTC as written: no check_instant.
            return datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"not a date and time that exists: {text[:64]!r}") from None
    return _parse_time(text)


def stored_time(text: str) -> datetime:
    """:func:`parse_time` of a timestamp already checked on its way into the store, by the
    quicker parse that reads the same instant from any text :func:`parse_time` accepts
    (and needs no cache, so thousands of distinct times, as a whole question queue's, do
    not flush it); what that parse refuses, or reads without an offset, goes to
    :func:`parse_time`."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return parse_time(text)
    return moment if moment.tzinfo is not None else parse_time(text)


# The same times are read again and again: an order's deadline on every gateway call, a call
# record's times each time the record is validated on its way into the store. datetimes are
# immutable, so the cache may share them.
@functools.lru_cache(maxsize=1024)
def _parse_time(text: str) -> datetime:
    if not _RFC3339.match(text):
        raise ValueError(f"not an RFC 3339 timestamp with an offset: {text[:64]!r}")
    try:
        moment = datetime.fromisoformat(text.upper().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not a date and time that exists: {text[:64]!r}") from None
    return check_instant(moment, name=f"the time {text[:64]!r}")


def answerers_of(manager: str, escalate_to: str | None) -> tuple[str, ...]:
    """Who may answer the questions of an order with this manager and ``escalate_to``: the
    manager, and ``escalate_to`` when it names someone else."""
    return (manager,) if escalate_to in (None, manager) else (manager, str(escalate_to))


_last_second: tuple[int, str] = (-1, "")
"""The last whole second :func:`format_time` wrote (since the epoch) and its text up to the
second: a gateway writes two times per call, nearly always within the same second."""


def format_time(moment: datetime) -> str:
    """An aware datetime as the RFC 3339 UTC text the desk writes (milliseconds, ``Z``);
    :func:`parse_time` reads it back."""
    global _last_second
    if moment.tzinfo is UTC and moment.year >= 1970:
        second = int(moment.timestamp())
        last = _last_second
        if last[0] != second:
            last = _last_second = (second, moment.isoformat(timespec="seconds")[:-6])
        return f"{last[1]}.{moment.microsecond // 1000:03d}Z"
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def format_epoch(seconds: float) -> str:
    """Seconds since the epoch (a pass's ``iat`` or ``exp``) as RFC 3339 UTC text, to the
    second (``2027-01-15T08:00:00Z``)."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def utc_now() -> datetime:
    """The clock's time, aware, in UTC: the default clock of the desk and the gateway."""
    return datetime.now(UTC)


def epoch_seconds(when: datetime | str | float | None, name: str = "now") -> float:
    """Seconds since the epoch for ``now``-like arguments (None: the clock).

    Raises:
        BadRequest: not an aware datetime, an RFC 3339 string or a number of seconds
            within years 1 to 9999 (DOC-14).
    """
    if when is None:
        return time.time()
    if isinstance(when, datetime):
        if when.tzinfo is None:
            raise BadRequest("a time without an offset is ambiguous: give an aware datetime")
        try:
            return check_instant(when, name=name).timestamp()
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
    if isinstance(when, str):
        try:
            return parse_time(when).timestamp()
        except ValueError as exc:
            raise BadRequest(f"{name}: {exc}") from None
    return float(check_epoch(when, name=name))


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


class _Model(BaseModel):
    """Base of every nested model: frozen, no unknown fields.

    An optional field refuses an explicit null (:data:`NotNull`), as the schemas do: leave
    the field out instead. This also keeps to_json() from ever writing such a null.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    def to_json(self) -> dict[str, Any]:
        """The document as JSON-ready data, exactly the fields that were set."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


def _not_null(value: _V) -> _V:
    if value is None:
        raise ValueError("null is not a value of this field; leave it out")
    return value


NotNull = AfterValidator(_not_null)
"""Refuses an explicit null for an optional field. Checked field by field, not over the whole
input: a whole-model check makes pydantic hand every document to Python first, which costs
as much as the validation itself. (An absent field is never validated.)"""

Maybe = Annotated[_V | None, NotNull]
"""An optional field: absent (None in Python) or a value, never an explicit JSON null."""

Several = Annotated[tuple[_V, ...], Field(min_length=1)]
"""One or more, in order."""


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


CHECK_TIMEOUT = 300
"""Seconds a criterion's check may run when its order names no timeout."""

EnvName = Annotated[StrictStr, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)]


class Check(_Model):
    """A command the desk runs itself in the order's workspace to judge a criterion."""

    run: Annotated[tuple[Annotated[StrictStr, Field(min_length=1, max_length=4096)], ...],
                   Field(min_length=1, max_length=256)]
    """The argument vector, run without a shell; the first item is the program."""
    cwd: Maybe[Annotated[StrictStr, Field(min_length=1, max_length=1024)]] = None
    """Working folder relative to the workspace (OX2 keeps it inside)."""
    timeout: Maybe[Annotated[StrictFloat | StrictInt, Field(gt=0, le=3600)]] = None
    """Seconds before the command's process group is killed (default :data:`CHECK_TIMEOUT`)."""
    env: Maybe[Annotated[dict[EnvName, Annotated[StrictStr, Field(max_length=4096)]],
                         Field(max_length=64)]] = None
    """Variables the command gets beside the minimal environment."""
    network: Maybe[StrictBool] = None
    """Whether the command may use the network (SEC-15: without it, only its own loopback)."""

    @property
    def seconds(self) -> float:
        """The timeout in force."""
        return float(self.timeout if self.timeout is not None else CHECK_TIMEOUT)


class Criterion(_Model):
    """One way the work will be judged."""

    id: Annotated[StrictStr, Field(min_length=1, max_length=64)]
    """Unique within the order; evidence names it."""
    text: Text
    """What must be true, in plain language."""
    check: Maybe[Check] = None
    """A command the desk runs to judge it when the worker reports done."""


class _Amounts(_Model):
    usd: Maybe[Number] = None
    """Money, in US dollars."""
    tokens: Maybe[Count] = None
    """Model tokens, input plus output."""
    tool_calls: Maybe[Count] = None
    """Tool invocations, held ones included."""
    seconds: Maybe[Number] = None
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
    note: Maybe[StrictStr] = None


class Decision(_Model):
    """A choice already made, and why."""

    text: Text
    why: Maybe[StrictStr] = None


class Tried(_Model):
    """An approach already attempted, and what came of it."""

    text: Text
    result: Maybe[StrictStr] = None


class NextStep(_Model):
    """A next step with its priority."""

    text: Text
    priority: Literal["high", "medium", "low"] = "medium"


class LineRange(_Model):
    """Lines of a file that matter, 1-based and inclusive."""

    start: Annotated[Integer, Field(ge=1)]
    end: Annotated[Integer, Field(ge=1)]
    note: Maybe[StrictStr] = None


class FileFocus(_Model):
    """A file that matters to whoever continues, with the lines to open."""

    path: Text
    note: Maybe[StrictStr] = None
    ranges: Maybe[Several[LineRange]] = None


class Handoff(_Model):
    """The previous worker's account of where a job stands (not verified fact)."""

    summary: Maybe[Text] = None
    decisions: Maybe[tuple[Decision, ...]] = None
    tried: Maybe[tuple[Tried, ...]] = None
    open_questions: Maybe[tuple[Text, ...]] = None
    next_step: Maybe[Text] = None
    next_steps: Maybe[Several[NextStep]] = None
    files: Maybe[Several[FileFocus]] = None

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
    criteria: Several[Criterion]
    """How done will be judged."""
    budget: Budget
    """Upper limits for the job."""
    deadline: Timestamp
    """Latest allowed finish."""
    tools: tuple[ToolPattern, ...]
    """Tools the worker may call."""
    staged: tuple[ToolPattern, ...] = ()
    """Tools whose calls are held until the manager approves them."""
    escalate_to: Maybe[Principal] = None
    """Who answers when the worker is blocked; default the manager."""
    inputs: Maybe[JSONObject] = None
    """Structured inputs for the job."""
    context: Maybe[tuple[ContextItem, ...]] = None
    """Material to read."""
    handoff: Maybe[Handoff] = None
    """What earlier work on this job established."""
    output_schema: Maybe[JSONObject] = None
    """JSON Schema that ``result.output`` must match when done."""
    parent_id: Maybe[Annotated[StrictStr, Field(min_length=1)]] = None
    """The order this one was split from."""
    continues: Maybe[Annotated[StrictStr, Field(min_length=1)]] = None
    """The finished order this one replaces."""
    metadata: Maybe[JSONObject] = None
    """Free-form; ignored by checks."""

    @property
    def manager(self) -> str:
        """The manager's principal (the ``from`` field)."""
        return self.from_

    @property
    def answerers(self) -> tuple[str, ...]:
        """Who may answer the worker's questions (:func:`answerers_of`)."""
        return answerers_of(self.from_, self.escalate_to)


class Artifact(_Model):
    """Something the work produced that a reviewer can open."""

    uri: Text
    media_type: Maybe[StrictStr] = None
    note: Maybe[StrictStr] = None


class Result(_Model):
    """What was produced."""

    summary: StrictStr
    output: Any = None
    artifacts: Maybe[tuple[Artifact, ...]] = None


class Evidence(_Model):
    """Proof for one criterion."""

    criterion: Text
    type: Literal["tool_call", "artifact", "citation", "note"]
    ref: Maybe[StrictStr] = None
    note: Maybe[StrictStr] = None


class Effect(_Model):
    """A held call the worker asks the manager to let run."""

    ref: Annotated[StrictStr, Field(min_length=1)]
    """The held call, ``server/tool#N``."""
    tool: ToolName
    """The canonical tool name, ``server/tool``."""
    arguments: JSONObject
    """The exact arguments that were held."""
    reversible: Maybe[StrictBool] = None
    """The worker's word that the effect can be undone (a published member; checks ignore
    it)."""


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
    started_at: Maybe[Timestamp] = None
    attempt: Maybe[Annotated[Integer, Field(ge=1)]] = None
    questions: Maybe[tuple[Text, ...]] = None
    error: Maybe[Text] = None
    handoff: Maybe[Handoff] = None
    effects: Maybe[tuple[Effect, ...]] = None
    metadata: Maybe[JSONObject] = None


class Grant(_Model):
    """What a Delegation Pass allows."""

    order_id: Text
    """The order the authority comes from."""
    tools: tuple[ToolPattern, ...]
    """Tool patterns the holder may call."""
    budget: Budget
    """Upper limits the holder may spend."""
    parent_jti: Maybe[Text] = None
    """The pass this one was derived from (absent on a worker's pass)."""
    manager: Maybe[Principal] = None
    """The order's manager; a worker's pass states it."""
    deadline: Maybe[Timestamp] = None
    """The order's deadline; a worker's pass states it."""
    staged: Maybe[tuple[ToolPattern, ...]] = None
    """The order's staged patterns; a worker's pass states them so a verifier without the
    desk knows which calls are held and that no derived pass may grant them."""


class PassClaims(_Document):
    """The claims of a signed Delegation Pass."""

    spec: Annotated[StrictStr, Field(pattern=PASS_SPEC)]
    iss: Principal
    sub: Principal
    aud: Principal
    jti: Annotated[StrictStr, Field(min_length=1, max_length=128)]
    iat: Annotated[Integer, Field(ge=0, le=MAX_EPOCH)]
    nbf: Annotated[Integer, Field(ge=0, le=MAX_EPOCH)]
    exp: Annotated[Integer, Field(ge=0, le=MAX_EPOCH)]
    grant: Grant


CallOutcome = Literal["pending", "ok", "error", "refused", "held"]
"""``pending``: reserved and counted, its answer not recorded yet (after a crash it stays
pending, which honestly says "sent, outcome not recorded")."""


class CallRecord(_Model):
    """One tool call as the gateway saw it; written before the worker gets an answer."""

    ref: StrictStr
    order_id: Text
    attempt: Annotated[Integer, Field(ge=1)]
    pass_jti: Maybe[StrictStr] = None
    tool: ToolName
    arguments: JSONObject
    outcome: CallOutcome
    result: Maybe[JSONObject] = None
    error: Maybe[StrictStr] = None
    started_at: Timestamp
    ended_at: Timestamp


class Event(_Model):
    """One entry of an order's append-only log."""

    seq: Annotated[Integer, Field(ge=1)]
    at: Timestamp
    actor: Principal
    action: Text
    from_: StrictStr | None = Field(default=None, alias="from")
    to: StrictStr
    note: Maybe[StrictStr] = None
    data: Maybe[JSONObject] = None

    @model_validator(mode="before")
    @classmethod
    def _current_rule_ids(cls, value: Any) -> Any:
        """An ``expire`` event stored before the rule ids followed the published ones reads
        under today's ids (:mod:`awl.documents.rule_ids`)."""
        if not isinstance(value, dict) or value.get("action") != "expire":
            return value
        data, note = value.get("data"), value.get("note")
        if isinstance(data, dict) and "findings" in data:
            findings = current_findings(data["findings"])
            if findings is not data["findings"]:
                value = {**value, "data": {**data, "findings": findings}}
        if isinstance(note, str):
            now = current_findings_note(note)
            if now != note:
                value = {**value, "note": now}
        return value


class Review(_Model):
    """A manager's decision on a submitted report."""

    order_id: Text
    attempt: Annotated[Integer, Field(ge=1)]
    actor: Principal
    decision: Literal["approve", "rework"]
    reason: Maybe[StrictStr] = None
    effects: Maybe[tuple[StrictStr, ...]] = None
    at: Timestamp
