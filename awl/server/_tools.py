"""The desk's MCP tools as data: names, descriptions, input and output schemas, annotations.

Documents inside inputs and outputs use the normative schemas of ``schemas/`` (orders,
reports, reviews, events), hoisted into each tool schema's ``$defs`` without their ``$id``:
a tool schema then resolves every ``$ref`` within itself, which is all MCP clients and model
APIs support. Output schemas close every object the desk builds itself
(``additionalProperties: false``), so a test that validates results against them notices
any field the code adds without declaring it.

Annotations are hints for clients and people: read-only tools say so; tools that end an
order for good (decline, cancel, approve) are marked destructive; a tool is idempotent when
repeating the same call changes nothing more (the second accept is refused, the second
progress note is a second note). No tool reaches outside the desk (``openWorldHint``
false).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import mcp_types as types

from awl.documents.effect_states import STATES as EFFECT_STATES
from awl.documents.lifecycle import STATES
from awl.documents.schemas import load_schema

__all__ = [
    "INSTRUCTIONS",
    "ORDER_TOOLS",
    "TOOLS",
    "TOOL_NAMES",
    "ToolSpec",
    "argument_schema",
]

INSTRUCTIONS = """\
This is an AWL work-order desk. You act as one principal, fixed by this connection; no tool \
takes an actor argument.
Managers: create_work_order, then follow with wait_for_update or get_work_order; \
answer_question when the worker is blocked; review_work_report approves (optionally only \
some effects) or sends the work back with a reason; cancel_work_order ends it.
Workers: list_work_orders role=worker, accept_work_order (or decline), start_work_order, \
post_progress, then submit_work_report: status done, blocked (with questions) or failed. \
A blocked order resumes when answered; a rework starts the next attempt.
Effects are calls a gateway held for approval: list them in the report's effects; the \
manager approves them and settles any whose outcome is unknown (list_effects, \
settle_effect).
Every order view has next_tools: what you may call on it now. Refusals are tool errors \
starting with a code (NOT_FOUND, FORBIDDEN, INVALID_TRANSITION, VALIDATION_FAILED, \
CONFLICT, BAD_REQUEST) and say what to do instead."""
"""What a connecting agent is told about the flow (the server's ``instructions``)."""

# --------------------------------------------------------------------------- schema parts

_DOCS = {"work_order": "order", "work_report": "report", "review": "review", "event": "event"}


def _rename_refs(node: Any, prefix: str) -> Any:
    if isinstance(node, dict):
        out = {k: _rename_refs(v, prefix) for k, v in node.items()}
        ref = out.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            out["$ref"] = f"#/$defs/{prefix}__{ref.removeprefix('#/$defs/')}"
        return out
    if isinstance(node, list):
        return [_rename_refs(v, prefix) for v in node]
    return node


@cache
def _hoisted(name: str) -> Mapping[str, Any]:
    """A normative schema as ``$defs`` entries: ``name`` itself, and ``name__<def>``."""
    schema = load_schema(_DOCS[name])
    for key in ("$schema", "$id"):
        schema.pop(key, None)
    defs = schema.pop("$defs", {})
    out = {name: _rename_refs(schema, name)}
    out.update({f"{name}__{key}": _rename_refs(value, name) for key, value in defs.items()})
    return out


def _relaxed(name: str, required: Iterable[str], description: str) -> Mapping[str, Any]:
    """The ``$defs`` of a document the desk completes: fewer members required."""
    defs = dict(_hoisted(name))
    body = copy.deepcopy(dict(defs[name]))
    body["required"] = list(required)
    body["description"] = description
    defs[f"{name}_input"] = body
    return defs


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/$defs/{name}"}


def _object(properties: Mapping[str, Any], required: Iterable[str] = ()) -> dict[str, Any]:
    """A closed object: members other than ``properties`` are refused."""
    return {"type": "object", "properties": dict(properties), "required": list(required),
            "additionalProperties": False}


def _with_defs(schema: dict[str, Any], *defs: Mapping[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for d in defs:
        merged.update(d)
    if merged:
        schema = {**schema, "$defs": dict(sorted(merged.items()))}
    return schema


def _string(description: str, **more: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **more}


_ORDER_ID = _string("The work order's id.", minLength=1, maxLength=128)
_STATE = {"enum": sorted(STATES)}
_ROLES = {"type": "array", "items": {"enum": ["manager", "worker", "answerer"]},
          "description": "Your roles on this order (answerer: you may answer its questions)."}
_TOOL_LIST = {"type": "array", "items": {"type": "string"}}
_SEQ = {"type": "integer", "minimum": 0}
_NUMBER_OR_NULL = {"type": ["number", "null"]}
_PATTERN = {"type": "string", "pattern": r"^(\*|[A-Za-z0-9_.-]+/(\*|[A-Za-z0-9_.-]+))$"}
_UNITS = ("usd", "tokens", "tool_calls", "seconds")

_VIEW_PROPERTIES: dict[str, Any] = {
    "order": _ref("work_order"),
    "state": {**_STATE, "description": "Where the order stands now."},
    "seq": {"type": "integer", "minimum": 1,
            "description": "The latest event's seq; wait_for_update after it for news."},
    "attempt": {"type": "integer", "minimum": 1,
                "description": "The attempt the next (or current) report belongs to."},
    "reports": {"type": "array", "items": _ref("work_report"),
                "description": "Every report, oldest first."},
    "reviews": {"type": "array", "items": _ref("review"),
                "description": "Every review, oldest first."},
    "updated_at": _string("When the latest event happened."),
    "open_questions": {**_TOOL_LIST, "description": "What the worker asks, while blocked."},
    "your_roles": _ROLES,
    "next_tools": {**_TOOL_LIST,
                   "description": "The tools you may call on this order in its state now."},
}
_VIEW_REQUIRED = tuple(_VIEW_PROPERTIES)
_VIEW_DEFS = (_hoisted("work_order"), _hoisted("work_report"), _hoisted("review"))

_VIEW_OUTPUT = _with_defs(_object(_VIEW_PROPERTIES, _VIEW_REQUIRED), *_VIEW_DEFS)

_SUMMARY = _object({
    "id": _ORDER_ID,
    "goal": _string("What the order is for."),
    "from": _string("The manager."),
    "to": _string("The worker."),
    "state": _STATE,
    "seq": {"type": "integer", "minimum": 1},
    "attempt": {"type": "integer", "minimum": 1},
    "deadline": _string("The latest finish."),
    "updated_at": _string("When the latest event happened."),
    "open_questions": _TOOL_LIST,
    "your_roles": _ROLES,
    "next_tools": _TOOL_LIST,
    "blocking": {"type": "integer", "minimum": 1,
                 "description": "With role=answerer: how many active orders wait on the answer."},
}, ("id", "goal", "from", "to", "state", "seq", "attempt", "deadline", "updated_at",
    "open_questions", "your_roles", "next_tools"))

_SETTLEMENT = _object({
    "verdict": {"enum": ["happened", "did_not_happen"]},
    "evidence": {"type": "string"}, "by": {"type": "string"}, "at": {"type": "string"},
}, ("verdict", "evidence", "by", "at"))

_EFFECT_VIEW = _object({
    "ref": _string("The held call, server/tool#N."),
    "tool": _string("Its canonical tool name."),
    "attempt": {"type": "integer", "minimum": 1},
    "arguments": {"type": "object", "description": "Exactly the arguments that were held."},
    "state": {"enum": list(EFFECT_STATES)},
    "dispatches": {"type": "integer", "minimum": 0},
    "updated_at": {"type": "string"},
    "retryable": {"type": "boolean"},
    "result": {"type": "object"},
    "error": {"type": "string"},
    "settlement": _SETTLEMENT,
}, ("ref", "tool", "attempt", "arguments", "state", "dispatches", "updated_at", "retryable"))

_UNIT_SPEND = _object({
    "orders": {"type": "integer", "minimum": 0}, "spent": {"type": "number"},
    "budget": {"type": "number"}, "median_ratio": _NUMBER_OR_NULL,
}, ("orders", "spent", "budget", "median_ratio"))

_COUNT = {"type": "integer", "minimum": 0}

# --------------------------------------------------------------------------- tools


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One desk tool: what clients see, plus which arguments are whole documents."""

    name: str
    title: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False
    documents: frozenset[str] = field(default_factory=frozenset)
    """Arguments that are AWL documents: the desk checks them and answers with findings."""

    def tool(self) -> types.Tool:
        """The MCP tool definition."""
        return types.Tool(
            name=self.name, title=self.title, description=self.description,
            input_schema=self.input_schema, output_schema=self.output_schema,
            annotations=types.ToolAnnotations(
                title=self.title, read_only_hint=self.read_only,
                destructive_hint=self.destructive, idempotent_hint=self.idempotent,
                open_world_hint=False))


def _order_only(required: Iterable[str] = (), **extra: Any) -> dict[str, Any]:
    return _object({"order_id": _ORDER_ID, **extra}, ("order_id", *required))


def _transition(name: str, title: str, description: str, *,
                extra: Mapping[str, Any] | None = None, required: Iterable[str] = (),
                destructive: bool = False, idempotent: bool = True) -> ToolSpec:
    props = {"order_id": _ORDER_ID, **(extra or {})}
    return ToolSpec(name=name, title=title, description=description,
                    input_schema=_object(props, ("order_id", *required)),
                    output_schema=_VIEW_OUTPUT, destructive=destructive,
                    idempotent=idempotent)


_ORDER_INPUT = _relaxed(
    "work_order", ("to", "goal", "criteria", "budget", "deadline", "tools"),
    "The Work Order. spec, id, created_at and from are filled in when left out; from must "
    "be you.")
_REPORT_INPUT = _relaxed(
    "work_report", ("status", "result", "evidence", "cost", "tools_used"),
    "The Work Report. spec, order_id, from, attempt and finished_at are filled in when left "
    "out.")

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="create_work_order", title="Create a work order",
        description=(
            "Manager: issue a work order to a worker: goal, criteria (how done is judged), "
            "budget, deadline, tools the worker may call and staged tools whose calls wait "
            "for your approval. You become its manager; its worker must be someone else. A "
            "sub-order sets parent_id: it gets at most what the parent has left, never a tool "
            "the parent stages, and its calls count against the parent too. An order "
            "that replaces a finished one sets continues (copy_handoff copies its handoff). "
            "Invalid orders are refused with VALIDATION_FAILED and the findings."),
        input_schema=_with_defs(_object({
            "order": _ref("work_order_input"),
            "copy_handoff": {"type": "boolean", "default": False,
                             "description": "With continues: copy the finished order's "
                                            "latest handoff when the order has none."},
        }, ("order",)), _ORDER_INPUT),
        output_schema=_VIEW_OUTPUT, documents=frozenset({"order"}),
    ),
    ToolSpec(
        name="list_work_orders", title="List work orders",
        description=(
            "The orders you are part of, newest first. role=worker: issued to you; "
            "role=manager: issued by you; role=answerer: blocked orders whose questions you "
            "may answer, most blocking first; role=any (default): issued by or to you. "
            "Filter by state; for the next page give before=the last order_id of this one "
            "(role=answerer: after=the next of this one)."),
        input_schema=_object({
            "role": {"enum": ["any", "manager", "worker", "answerer"], "default": "any"},
            "state": {"description": "Only orders in this state (or any of these states).",
                      "anyOf": [_STATE, {"type": "array", "items": _STATE, "minItems": 1}]},
            "limit": {"type": "integer", "minimum": 1, "maximum": 200, "default": 50},
            "offset": {"type": "integer", "minimum": 0, "default": 0},
            "before": {"type": "string", "minLength": 1,
                       "description": "The order_id of the last order of a page: the next "
                                      "page starts after it (as cheap however deep; for "
                                      "not for role=answerer)."},
            "after": {"type": "string", "minLength": 1,
                      "description": "With role=answerer: the next of the page before; the "
                                     "page after it in the queue (as cheap however deep)."},
        }),
        output_schema=_object({
            "role": {"enum": ["any", "manager", "worker", "answerer"]},
            "orders": {"type": "array", "items": _SUMMARY},
            "count": _COUNT,
            "next": {"type": "string", "description": (
                "With role=answerer, when more questions follow: give it as after= for the "
                "next page.")},
        }, ("role", "orders", "count")),
        read_only=True, idempotent=True,
    ),
    ToolSpec(
        name="get_work_order", title="Read a work order",
        description=(
            "One order with its state, reports, reviews, open questions and next_tools (what "
            "you may do now); include_events adds its whole event log."),
        input_schema=_order_only(include_events={
            "type": "boolean", "default": False, "description": "Add the event log."}),
        output_schema=_with_defs(
            _object({**_VIEW_PROPERTIES,
                     "events": {"type": "array", "items": _ref("event")}}, _VIEW_REQUIRED),
            *_VIEW_DEFS, _hoisted("event")),
        read_only=True, idempotent=True,
    ),
    _transition("accept_work_order", "Accept a work order",
                "Worker: take an offered order. Then start_work_order when you begin."),
    _transition("decline_work_order", "Decline a work order",
                "Worker: turn an offered order down for good, optionally saying why.",
                extra={"reason": _string("Why you decline.")}, destructive=True),
    _transition("start_work_order", "Start a work order",
                "Worker: begin an accepted order; it is then working."),
    _transition("post_progress", "Post progress",
                "Worker: tell the manager how the work goes: a short note and an optional "
                "percentage (accepted, working or blocked orders).",
                extra={"note": _string("What happened.", minLength=1),
                       "percent": {"type": "integer", "minimum": 0, "maximum": 100}},
                required=("note",), idempotent=False),
    ToolSpec(
        name="submit_work_report", title="Submit a work report",
        description=(
            "Worker: report on a working order. status done (evidence for every criterion) "
            "or failed (with error) submits it for review; blocked (with questions) waits "
            "for an answer. Cite gateway calls as evidence refs server/tool#N and list the "
            "held calls you want run as effects. Refused with VALIDATION_FAILED and the "
            "findings when a check fails."),
        input_schema=_with_defs(_object({"order_id": _ORDER_ID,
                                         "report": _ref("work_report_input")},
                                        ("order_id", "report")), _REPORT_INPUT),
        output_schema=_VIEW_OUTPUT, idempotent=True, documents=frozenset({"report"}),
    ),
    _transition("answer_question", "Answer a blocked order",
                "Manager or escalation contact: answer the questions of a blocked order; "
                "the worker resumes with your answer.",
                extra={"answer": _string("Your answer to the worker's questions.",
                                         minLength=1)}, required=("answer",)),
    _transition("review_work_report", "Review a work report",
                "Manager: decide on a submitted report. approve ends the order (effects: the "
                "refs of the report's effects that may run; leave out for all, [] for none). "
                "rework sends it back with a reason and starts the next attempt. Give attempt "
                "(the one you read) so the decision never lands on a later attempt's report "
                "(CONFLICT then: read the order again).",
                extra={"decision": {"enum": ["approve", "rework"]},
                       "reason": _string("Why; required for rework."),
                       "effects": {"type": "array", "items": {"type": "string"},
                                   "description": "approve only: the effect refs to run."},
                       "attempt": {"type": "integer", "minimum": 1,
                                   "description": "The attempt whose report you reviewed."}},
                required=("decision",), destructive=True),
    _transition("cancel_work_order", "Cancel a work order",
                "Manager: end an active order for good, saying why. Its held calls never run.",
                extra={"reason": _string("Why you cancel.", minLength=1)},
                required=("reason",), destructive=True),
    ToolSpec(
        name="wait_for_update", title="Wait for an order's news",
        description=(
            "Wait until the order has events after after_seq (at most timeout_seconds, up "
            "to 55) and return them; an empty list when the time ran out. Pass the seq you "
            "last saw."),
        input_schema=_order_only(after_seq={**_SEQ, "default": 0},
                                 timeout_seconds={"type": "number", "minimum": 0,
                                                  "maximum": 55, "default": 25}),
        output_schema=_with_defs(_object({
            "order_id": _ORDER_ID, "state": _STATE,
            "seq": {"type": "integer", "minimum": 1},
            "events": {"type": "array", "items": _ref("event")},
            "timed_out": {"type": "boolean"},
        }, ("order_id", "state", "seq", "events", "timed_out")), _hoisted("event")),
        read_only=True, idempotent=True,
    ),
    ToolSpec(
        name="issue_delegation_pass", title="Issue a Delegation Pass",
        description=(
            "A signed pass a gateway accepts without asking the desk. Without parent_token: "
            "the worker's pass for an accepted or working order (you are its worker or "
            "manager). With parent_token (a pass you hold): a narrower pass for a sub-agent "
            "(subject); staged tools are never delegated. Defaults grant the most allowed; "
            "asking for more is refused naming the rule."),
        input_schema=_order_only(
            subject=_string("Who will hold the pass (default: the order's worker)."),
            parent_token=_string("Derive from this pass, which you hold."),
            tools={"type": "array", "items": _PATTERN},
            budget=_object({u: {"type": "number", "minimum": 0} for u in _UNITS}),
            expires_in_seconds={"type": "number", "exclusiveMinimum": 0},
            audience=_string("Who will accept it (default awl:gateway, or the parent's).")),
        output_schema=_object({
            "token": _string("The pass; give it to its holder."),
            "jti": {"type": "string"}, "order_id": _ORDER_ID,
            "subject": {"type": "string"}, "audience": {"type": "string"},
            "issued_at": {"type": "integer"}, "expires_at": {"type": "integer"},
            "expires": _string("expires_at as a timestamp."),
            "tools": {"type": "array", "items": _PATTERN},
            "budget": _object({u: {"type": "number"} for u in _UNITS}),
            "parent_jti": {"type": "string"},
        }, ("token", "jti", "order_id", "subject", "audience", "issued_at", "expires_at",
            "expires", "tools", "budget")),
    ),
    ToolSpec(
        name="get_track_record", title="A worker's track record",
        description=(
            "How a worker's orders turned out: approved first time or after rework, failed, "
            "expired, cancelled, declined, active; spend against budget; median time from "
            "accept to approval. Default worker: you. You see all of your own orders; of "
            "another worker, only the orders you issued to it."),
        input_schema=_object({"worker": _string("The worker (default: you).", minLength=1)}),
        output_schema=_object({
            "worker": {"type": "string"}, "orders": _COUNT,
            "approved_first_time": _COUNT, "approved_after_rework": _COUNT,
            "rework_rounds": {"type": "object", "additionalProperties": _COUNT},
            "failed": _COUNT, "expired": _COUNT, "cancelled": _COUNT, "declined": _COUNT,
            "active": _COUNT,
            "spend": {"type": "object", "additionalProperties": _UNIT_SPEND},
            "median_seconds_to_approval": _NUMBER_OR_NULL,
        }, ("worker", "orders", "approved_first_time", "approved_after_rework",
            "rework_rounds", "failed", "expired", "cancelled", "declined", "active", "spend",
            "median_seconds_to_approval")),
        read_only=True, idempotent=True,
    ),
    ToolSpec(
        name="get_handoff", title="Handoff briefing",
        description=(
            "A short Markdown briefing for whoever continues the order: goal, status, "
            "decisions, what was tried, open questions, next steps. The handoff parts are "
            "the previous worker's account, not verified fact."),
        input_schema=_order_only(),
        output_schema=_object({"order_id": _ORDER_ID, "state": _STATE,
                               "markdown": {"type": "string"}},
                              ("order_id", "state", "markdown")),
        read_only=True, idempotent=True,
    ),
    ToolSpec(
        name="list_effects", title="List an order's effects",
        description=(
            "Every call a gateway held for the order, with its exact arguments and its "
            "state (held, dropped, dispatching, committed, failed, unknown, skipped)."),
        input_schema=_order_only(),
        output_schema=_object({"order_id": _ORDER_ID,
                               "effects": {"type": "array", "items": _EFFECT_VIEW}},
                              ("order_id", "effects")),
        read_only=True, idempotent=True,
    ),
    ToolSpec(
        name="settle_effect", title="Settle an unknown effect",
        description=(
            "Manager: record what you found out about an effect whose outcome is unknown "
            "(sent, never answered): happened, or did_not_happen (it may then be retried), "
            "with the evidence. Sends nothing."),
        input_schema=_order_only(
            ("ref", "verdict", "evidence"), ref=_string("The effect, server/tool#N.", minLength=1),
            verdict={"enum": ["happened", "did_not_happen"]},
            evidence=_string("What the verdict rests on.", minLength=1)),
        output_schema=_object({"order_id": _ORDER_ID, "effect": _EFFECT_VIEW},
                              ("order_id", "effect")),
    ),
)
"""Every desk tool, in the order ``tools/list`` shows them."""

TOOL_NAMES: tuple[str, ...] = tuple(spec.name for spec in TOOLS)
"""The published tool names."""

ORDER_TOOLS: dict[str, str] = {
    "accept": "accept_work_order", "decline": "decline_work_order",
    "start": "start_work_order", "progress": "post_progress",
    "report": "submit_work_report", "answer": "answer_question",
    "approve": "review_work_report", "rework": "review_work_report",
    "cancel": "cancel_work_order",
}
"""The tool behind each lifecycle action a principal performs."""


@cache
def _argument_schema(name: str) -> dict[str, Any]:
    spec = next(s for s in TOOLS if s.name == name)
    schema = copy.deepcopy(spec.input_schema)
    for arg in spec.documents:
        # Documents are judged by the desk's checks, which answer with numbered findings.
        schema["properties"][arg] = {"type": "object"}
    if spec.documents:
        schema.pop("$defs", None)
    return schema


def argument_schema(name: str) -> dict[str, Any]:
    """The schema the server checks a tool's arguments with (documents only as objects)."""
    return _argument_schema(name)
