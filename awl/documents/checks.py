"""The numbered checks of SPEC.md, as findings.

Shaped like python-jsonschema: ``iter_*_findings`` yields every :class:`~awl.Finding`,
``is_valid_*`` says whether none is ``invalid``, and ``validate_*`` raises
:class:`~awl.ValidationFailed` carrying the findings (``limit`` findings never raise).

Every check first reads its input as plain JSON data, whatever it was given (a dict, a model,
or anything else): data that cannot be a JSON document at all (bytes, NaN, non-string keys,
nesting deeper than the limit) raises one :class:`~awl.DocumentError`; everything else yields
findings. Then the version (V1) and the schema rule run; when either fails, nothing else runs
for that document, because the later rules assume its structure.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypeVar, cast

from pydantic import BaseModel, ValidationError

from awl.documents.errors import BadRequest, DocumentError, ValidationFailed
from awl.documents.findings import Finding
from awl.documents.lifecycle import is_row
from awl.documents.limits import (
    MAX_DEPTH,
    MAX_DOCUMENT_BYTES,
    check_amounts,
    check_json_value,
    loads,
    read_regular_file,
)
from awl.documents.models import (
    CallRecord,
    Check,
    Effect,
    Event,
    PassClaims,
    Review,
    WorkOrder,
    WorkReport,
    epoch_seconds,
    parse_time,
)
from awl.documents.patterns import Ref, covered_by_any, matches_any, overlap, parse_ref
from awl.documents.pointers import pointer
from awl.documents.versions import READS, from_published

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_DEPTH",
    "KNOWN_VERSIONS",
    "LEEWAY",
    "DocType",
    "PassFacts",
    "check",
    "check_structure",
    "detect_type",
    "effect_ref",
    "is_valid_call",
    "is_valid_event",
    "is_valid_order",
    "is_valid_pass",
    "is_valid_report",
    "is_valid_review",
    "is_valid_suborder",
    "issued_ahead",
    "iter_call_findings",
    "iter_event_findings",
    "iter_order_findings",
    "iter_pass_findings",
    "iter_report_findings",
    "iter_review_findings",
    "iter_suborder_findings",
    "json_equal",
    "load_document",
    "pass_rule_findings",
    "placeholders",
    "reported_tokens",
    "to_plain",
    "validate_call",
    "validate_event",
    "validate_order",
    "validate_pass",
    "validate_report",
    "validate_review",
    "validate_suborder",
    "version_findings",
]

DEFAULT_MAX_BYTES = MAX_DOCUMENT_BYTES
"""Largest document :func:`load_document` reads, in bytes."""
DEFAULT_MAX_DEPTH = MAX_DEPTH
"""Deepest nesting of arrays and objects a document may have."""

KNOWN_VERSIONS = tuple(sorted({v for vs in READS.values() for v in vs}))
"""Every version this implementation reads of some document format; per format, see
:data:`awl.documents.versions.READS`."""

DocType = Literal["order", "report", "pass", "call", "event", "review"]

# The ``spec`` prefix of each versioned document, and its schema-rule id.
_SPEC_PREFIX: Mapping[str, str] = {
    "order": "awl/work-order@",
    "report": "awl/work-report@",
    "pass": "awl/delegation-pass@",
}
_SCHEMA_RULE: Mapping[str, str] = {
    "order": "O1", "report": "R1", "pass": "P1", "call": "K1", "event": "E1", "review": "W1",
}
_MODELS: Mapping[str, type[BaseModel]] = {
    "order": WorkOrder, "report": WorkReport, "pass": PassClaims,
    "call": CallRecord, "event": Event, "review": Review,
}
_VERSION_RE = re.compile(r"^awl/[a-z-]+@(?P<v>[0-9]+\.[0-9]+)$")
_M = TypeVar("_M", bound=BaseModel)


# --------------------------------------------------------------------------- reading input

def load_document(source: bytes | bytearray | str | os.PathLike[str], *,
                  max_bytes: int = DEFAULT_MAX_BYTES,
                  max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """Read one JSON document strictly.

    Args:
        source: the document as UTF-8 bytes, as text, or a path to a file holding it.
        max_bytes: the largest document accepted.
        max_depth: the deepest nesting of arrays and objects accepted.

    Returns:
        The JSON data (dicts, lists, str, int, float, bool, None).

    Raises:
        DocumentError: the input is not one UTF-8 JSON document within the limits, or it has
            duplicate keys, NaN or Infinity.
    """
    if isinstance(source, os.PathLike):
        source = read_regular_file(source, max_bytes=max_bytes, what="document")
    if isinstance(source, bytes | bytearray):
        if len(source) > max_bytes:
            raise DocumentError(f"document is larger than {_size(max_bytes)}; "
                                "split it or raise the limit")
        try:
            text = bytes(source).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DocumentError(f"document is not UTF-8 text (bad byte at offset {exc.start}); "
                                "save it as UTF-8 JSON") from None
    elif isinstance(source, str):
        text = source
    else:
        raise DocumentError(f"cannot read a document from {type(source).__name__}; "
                            "give bytes, text or a path")
    return loads(text, where="document", max_depth=max_depth, max_bytes=max_bytes)


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n % (1024 * 1024) == 0 else f"{n} bytes"


def _show(value: str, limit: int = 60) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "…")


def to_plain(value: Any, *, max_depth: int = DEFAULT_MAX_DEPTH,
             max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """A plain-JSON copy of ``value``: models dumped, tuples as lists, everything checked.

    Raises:
        DocumentError: ``value`` holds something JSON cannot (bytes, NaN, non-string keys,
            lone surrogates, other objects), nests deeper than ``max_depth``, or is larger
            than about ``max_bytes`` (the limits of :mod:`awl.documents.limits`).
    """
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return check_json_value(value, where="document", max_depth=max_depth, max_bytes=max_bytes)


# --------------------------------------------------------------------------- structure

def version_findings(data: Any, doc_type: str) -> list[Finding]:
    """Rule V1: a versioned document names a version this implementation reads.

    A ``spec`` that is not even of the form ``awl/<format>@X.Y`` is left to the schema rule.
    """
    prefix = _SPEC_PREFIX.get(doc_type)
    if prefix is None or not isinstance(data, dict):
        return []
    spec = data.get("spec")
    if not isinstance(spec, str) or not spec.startswith(prefix):
        return []
    m = _VERSION_RE.match(spec)
    known = READS[doc_type]
    if m is None or m.group("v") in known:
        return []
    return [Finding("V1", "invalid", "/spec",
                    f"version {m.group('v')} of {prefix[:-1]} is not one this reader knows "
                    f"({', '.join(known)})")]


def check_structure(doc: Any, doc_type: DocType) -> tuple[Any, BaseModel | None, list[Finding]]:
    """Read a document and run its version rule and schema rule.

    The building block of every ``iter_*_findings``; the pass checks use it too.

    Returns:
        ``(data, model, findings)``: the plain JSON data, the model (None when a finding
        stopped the checks), and the V1 / schema findings.

    Raises:
        DocumentError: ``doc`` cannot be a JSON document at all.
    """
    data = to_plain(doc)
    if doc_type in ("order", "report"):
        data = from_published(data)  # extensions carried in x-awl go back where they belong
    found = version_findings(data, doc_type)
    if found:
        return data, None, found
    rule = _SCHEMA_RULE[doc_type]
    from awl.documents.schemas import schema_findings
    found = list(schema_findings(doc_type, data, rule))
    if found:
        return data, None, found
    model_cls = _MODELS[doc_type]
    try:
        model = model_cls.model_validate(data, by_alias=True, by_name=False)
    except ValidationError as exc:
        # The schema is normative; the models agree with it on every conformance case. If
        # they ever differ, say so as a schema finding rather than fail.
        return data, None, [
            Finding(rule, "invalid", pointer(*err["loc"]), err["msg"])
            for err in exc.errors(include_url=False, include_input=False)
        ]
    return data, model, []


def context_model(doc: Any, doc_type: DocType, model_cls: type[_M], role: str) -> _M:
    """A document given as context (a report's order, a parent), which must be valid.

    Also used by the pass rules below (a pass's order and parent claims); not part of the
    package's public surface.

    Args:
        doc: The document, as JSON data or a model.
        doc_type: What it must be.
        model_cls: Its model class (for the return type).
        role: What it is to the document being checked, for the error (``parent``).

    Raises:
        DocumentError: It is not a valid ``doc_type``.
    """
    if type(doc) is model_cls and not version_findings({"spec": getattr(doc, "spec", None)},
                                                         doc_type):
        # A model was checked when it was made (models are frozen, and this package makes
        # none unchecked): a record the store read back, a document checked before it was
        # kept. Its schema is not checked again: for a report, checking its order and each
        # call record again took about half of all its checks' time.
        return doc
    _, model, found = check_structure(doc, doc_type)
    if model is None:
        first = found[0]
        raise DocumentError(f"the {role} given is not a valid {doc_type}: {first.rule} "
                            f"{first.path or '/'}: {first.message}")
    return cast(_M, model)


# --------------------------------------------------------------------------- order

def iter_order_findings(doc: Any) -> Iterator[Finding]:
    """Every finding of a Work Order on its own (V1, O1-O5, OX1, OX2).

    Raises:
        DocumentError: ``doc`` cannot be a JSON document at all.
    """
    _, model, found = check_structure(doc, "order")
    yield from found
    if model is not None:
        yield from _order_rules(cast(WorkOrder, model))


def _order_rules(order: WorkOrder) -> Iterator[Finding]:
    seen: set[str] = set()
    for i, criterion in enumerate(order.criteria):
        if criterion.id in seen:
            yield Finding("O2", "invalid", pointer("criteria", i, "id"),
                          f"criterion id {_show(criterion.id)} is used twice")
        seen.add(criterion.id)
    for i, criterion in enumerate(order.criteria):
        if criterion.check is not None:
            yield from _check_rules(criterion.check, i)
    if parse_time(order.deadline) <= parse_time(order.created_at):
        yield Finding("O3", "invalid", "/deadline", "deadline is not after created_at")
    if order.output_schema is not None:
        from awl.documents.schemas import schema_problem
        problem = schema_problem(order.output_schema)
        if problem is not None:
            yield Finding("O4", "invalid", "/output_schema",
                          f"output_schema is not a valid JSON Schema 2020-12: {problem}")
    for i, pattern in enumerate(order.staged):
        if not covered_by_any(order.tools, pattern):
            yield Finding("O5", "invalid", pointer("staged", i),
                          f"staged pattern {_show(pattern)} is not covered by tools")
    if order.parent_id is not None and order.parent_id == order.id:
        yield Finding("OX1", "invalid", "/parent_id", "parent_id is the order's own id")
    if order.continues is not None and order.continues == order.id:
        yield Finding("OX1", "invalid", "/continues", "continues is the order's own id")


def _check_rules(check: Check, i: int) -> Iterator[Finding]:
    """OX2: a criterion's check stays inside the workspace and holds no NUL character."""
    for j, arg in enumerate(check.run):
        if "\0" in arg:
            yield Finding("OX2", "invalid", pointer("criteria", i, "check", "run", j),
                          "a command argument cannot hold a NUL character")
    if check.cwd is not None and cwd_problem(check.cwd) is not None:
        yield Finding("OX2", "invalid", pointer("criteria", i, "check", "cwd"),
                      f"cwd {_show(check.cwd)} {cwd_problem(check.cwd)}")
    for name, value in sorted((check.env or {}).items()):
        if "\0" in value:
            yield Finding("OX2", "invalid", pointer("criteria", i, "check", "env", name),
                          f"the value of {_show(name)} cannot hold a NUL character")


def cwd_problem(cwd: str) -> str | None:
    """Why ``cwd`` is not a folder inside the workspace, or None when it is."""
    if "\0" in cwd:
        return "cannot hold a NUL character"
    if cwd.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", cwd):
        return "must be relative to the workspace, not absolute"
    if ".." in re.split(r"[/\\]", cwd):
        return "must stay inside the workspace (no .. segment)"
    return None


def is_valid_order(doc: Any) -> bool:
    """Whether the order has no ``invalid`` finding."""
    return _no_invalid(iter_order_findings(doc))


def validate_order(doc: Any) -> WorkOrder:
    """The order as a model, when it has no ``invalid`` finding.

    Raises:
        ValidationFailed: with every finding, when one is ``invalid``.
        DocumentError: ``doc`` cannot be a JSON document at all.
    """
    return _validated(WorkOrder, "work order", iter_order_findings(doc), doc)


# --------------------------------------------------------------------------- sub-order

def iter_suborder_findings(child: Any, parent: Any,
                           remaining: Mapping[str, float] | None = None) -> Iterator[Finding]:
    """Every finding of a sub-order: its own order findings, then C1-C3, CX1, C5 against
    ``parent``.

    Authority only shrinks: budget, tools and deadline stay within the parent's, and no
    tool the parent stages is handed down (its held calls would be approved by the
    sub-order's manager, not the parent's).

    Args:
        child: The sub-order.
        parent: The order it is split from.
        remaining: Per budget unit, what is left of the parent's budget (C1); the
            parent's whole budget when not given.

    Raises:
        DocumentError: ``child`` cannot be a JSON document, or ``parent`` is not a valid order.
    """
    parent_order = context_model(parent, "order", WorkOrder, "parent")
    _, model, found = check_structure(child, "order")
    yield from found
    if model is None:
        return
    order = cast(WorkOrder, model)
    yield from _order_rules(order)
    yield from _suborder_rules(order, parent_order,
                               check_amounts(remaining, name="remaining") or {})


def _suborder_rules(child: WorkOrder, parent: WorkOrder,
                    remaining: Mapping[str, float]) -> Iterator[Finding]:
    child_budget = child.budget.units()
    for unit, limit in parent.budget.units().items():
        value = child_budget.get(unit)
        left = remaining.get(unit)
        if value is None:
            yield Finding("C1", "invalid", "/budget",
                          f"the parent budgets {unit}; the sub-order must too")
        elif value > limit:
            yield Finding("C1", "invalid", pointer("budget", unit),
                          f"{unit} {value} is more than the parent's {limit}")
        elif left is not None and value > left:
            yield Finding("C1", "invalid", pointer("budget", unit),
                          f"{unit} {value} is more than the {left:g} left of the parent's "
                          f"{limit}")
    for i, pattern in enumerate(child.tools):
        if not covered_by_any(parent.tools, pattern):
            yield Finding("C2", "invalid", pointer("tools", i),
                          f"tool pattern {_show(pattern)} is not covered by the parent's tools")
    if parse_time(child.deadline) > parse_time(parent.deadline):
        yield Finding("C3", "invalid", "/deadline", "deadline is after the parent's deadline")
    if child.parent_id != parent.id:
        yield Finding("CX1", "invalid", "/parent_id",
                      f"parent_id must be the parent's id {_show(parent.id)}")
    for i, pattern in enumerate(child.tools):
        for staged in parent.staged:
            shared = overlap(pattern, staged)
            if shared is not None:
                yield Finding("C5", "invalid", pointer("tools", i),
                              f"the parent stages {_show(shared)}; a sub-order may not carry "
                              "it (its held calls would be approved by the sub-order's "
                              "manager, not the parent's); leave it out of tools")
                break


def is_valid_suborder(child: Any, parent: Any,
                      remaining: Mapping[str, float] | None = None) -> bool:
    """Whether the sub-order has no ``invalid`` finding against its parent."""
    return _no_invalid(iter_suborder_findings(child, parent, remaining))


def validate_suborder(child: Any, parent: Any,
                      remaining: Mapping[str, float] | None = None) -> WorkOrder:
    """The sub-order as a model, when it has no ``invalid`` finding against its parent.

    Raises:
        ValidationFailed: with every finding, when one is ``invalid``.
        DocumentError: ``child`` cannot be a JSON document, or ``parent`` is not a valid order.
    """
    return _validated(WorkOrder, "sub-order", iter_suborder_findings(child, parent, remaining),
                      child)


# --------------------------------------------------------------------------- report

def iter_report_findings(doc: Any, order: Any = None,
                         calls: Iterable[Any] | None = None,
                         checks: Iterable[Any] | None = None,
                         sub_reports: Iterable[Any] | None = None) -> Iterator[Finding]:
    """Every finding of a Work Report (V1, R1-R12, R14-R16, RX1-RX6).

    Args:
        doc: the report.
        order: the order it answers. Without it only the rules that need no order run
            (R1, R9, R10, R12, R15, R16, RX1).
        calls: the order's call records. With them RX2-RX4 run too.
        checks: the desk's runs of the order's criteria checks, as evidence of type
            ``check`` (``{criterion, type, check: {outcome, ...}}``). With them and the
            order, RX5 runs too.
        sub_reports: the latest report of each direct sub-order of the order that has one
            (reports or their JSON). With them RX6 runs too.

    Raises:
        DocumentError: ``doc`` cannot be a JSON document, or ``order`` / a call record / a
            sub-order's report is not a valid one.
    """
    order_model = None if order is None else context_model(order, "order", WorkOrder, "order")
    call_models = None if calls is None else _calls(calls)
    below = None if sub_reports is None else _sub_reports(sub_reports)
    data, model, found = check_structure(doc, "report")
    yield from found
    if model is None:
        return
    report = cast(WorkReport, model)
    yield from _report_own_rules(report)
    if order_model is not None:
        yield from _report_order_rules(report, data, order_model)
    if call_models is not None:
        yield from _report_call_rules(report, order_model, call_models)
    if checks is not None and order_model is not None:
        yield from _report_check_rules(report, order_model, _check_runs(checks))
    if below is not None:
        yield from _report_below_rules(report, below)


def _sub_reports(reports: Iterable[Any]) -> list[WorkReport]:
    if isinstance(reports, str | bytes | Mapping) or not isinstance(reports, Iterable):
        raise DocumentError("sub_reports must be a list of work reports")
    return [r if isinstance(r, WorkReport)  # a stored report was checked when it came in
            else context_model(r, "report", WorkReport, f"sub-order report #{i}")
            for i, r in enumerate(reports)]


def reported_tokens(reports: Iterable[WorkReport]) -> int:
    """The tokens sub-orders have spent, as their reports say: the sum of each report's
    ``cost.tokens`` (0 for one that states none). Given the latest report of each direct
    sub-order, it is what they took of their parent's tokens (LC-15, RX6)."""
    return sum(r.cost.tokens or 0 for r in reports)


def _report_below_rules(report: WorkReport, below: Sequence[WorkReport]) -> Iterator[Finding]:
    spent = report.cost.tokens
    total = reported_tokens(below)
    if spent is not None and spent < total:
        named = [f"{r.cost.tokens} in {_show(r.order_id, 40)}" for r in below if r.cost.tokens]
        more = f" and {len(named) - 5} more" if len(named) > 5 else ""
        yield Finding("RX6", "limit", "/cost/tokens",
                      f"tokens spent {spent} is less than the {total} its sub-orders reported "
                      f"({', '.join(named[:5])}{more}); the cost of an order includes its "
                      "sub-orders'")


def _check_runs(checks: Iterable[Any]) -> dict[str, Mapping[str, Any]]:
    if isinstance(checks, str | bytes | Mapping) or not isinstance(checks, Iterable):
        raise DocumentError("checks must be a list of check evidence items")
    runs: dict[str, Mapping[str, Any]] = {}
    for i, item in enumerate(checks):
        body = item.get("check") if isinstance(item, Mapping) else None
        if (not isinstance(body, Mapping) or not isinstance(item.get("criterion"), str)
                or item.get("type") != "check" or not isinstance(body.get("outcome"), str)):
            raise DocumentError(f"check #{i} is not a check evidence item "
                                "({criterion, type: check, check: {outcome, ...}})")
        runs[item["criterion"]] = body
    return runs


_CHECK_PASSED = frozenset({"passed", "question"})


def check_run_findings(order: Any, checks: Iterable[Any]) -> list[Finding]:
    """RX5 alone, for a ``done`` report on ``order`` given the desk's check runs."""
    order_model = context_model(order, "order", WorkOrder, "order")
    runs = _check_runs(checks)
    return list(_check_rules_done(order_model, runs))


def _report_check_rules(report: WorkReport, order: WorkOrder,
                        runs: Mapping[str, Mapping[str, Any]]) -> Iterator[Finding]:
    if report.status == "done":
        yield from _check_rules_done(order, runs)


def _check_rules_done(order: WorkOrder,
                      runs: Mapping[str, Mapping[str, Any]]) -> Iterator[Finding]:
    for i, criterion in enumerate(order.criteria):
        if criterion.check is None:
            continue
        run = runs.get(criterion.id)
        if run is None:
            yield Finding("RX5", "invalid", "/status",
                          f"the check of criterion {_show(criterion.id)} (/criteria/{i}/check) "
                          "was not run")
        elif run["outcome"] not in _CHECK_PASSED:
            tail = [str(line) for line in run.get("tail", ()) if isinstance(line, str)]
            last = " | ".join(tail[-5:]) or "no output"
            yield Finding("RX5", "invalid", "/status",
                          f"the check of criterion {_show(criterion.id)} (/criteria/{i}/check) "
                          f"did not pass: {run.get('summary') or run['outcome']}; output "
                          f"ends: {last[:1000]}")


def _calls(calls: Iterable[Any]) -> list[CallRecord]:
    if isinstance(calls, str | bytes | Mapping) or not isinstance(calls, Iterable):
        raise DocumentError("calls must be a list of call records")
    return [context_model(c, "call", CallRecord, f"call record #{i}") for i, c in enumerate(calls)]


def _report_own_rules(report: WorkReport) -> Iterator[Finding]:
    if report.status == "blocked" and not report.questions:
        yield Finding("R9", "invalid", "/questions", "a blocked report asks its questions")
    if report.status == "failed" and not report.error:
        yield Finding("R10", "invalid", "/error", "a failed report says what went wrong")
    started = report.started_at
    if started is not None and parse_time(started) > parse_time(report.finished_at):
        yield Finding("R12", "invalid", "/started_at", "started_at is after finished_at")
    for i, evidence in enumerate(report.evidence):
        if evidence.type == "tool_call" and (evidence.ref is None or parse_ref(evidence.ref)
                                             is None):
            yield Finding("RX1", "invalid", pointer("evidence", i, "ref"),
                          "tool_call evidence needs a ref of the form server/tool#N")
    listed: set[str] = set()
    for i, effect in enumerate(report.effects or ()):
        if effect_ref(effect) is None:
            yield Finding("R15", "invalid", pointer("effects", i, "ref"),
                          f"effect ref {_show(effect.ref)} is not "
                          f"{_show(effect.tool + '#<n>')}")
        elif effect.ref in listed:
            yield Finding("R15", "invalid", pointer("effects", i, "ref"),
                          f"effect {_show(effect.ref)} is listed twice")
        for where, target, at in placeholders(effect.arguments):
            path = pointer("effects", i, "arguments") + where
            if target not in listed:
                yield Finding("R16", "invalid", path,
                              f"{_show(target)} is not an effect listed before this one")
            elif at != "" and not at.startswith("/"):
                yield Finding("R16", "invalid", path, f"{_show(at)} is not a JSON pointer")
        listed.add(effect.ref)


def effect_ref(effect: Effect) -> Ref | None:
    """An effect's ref when it is well formed (R15): exactly ``<its tool>#N``. The draft
    spelling ``#call-N`` predates effects, so an effect never carries it."""
    ref = parse_ref(effect.ref)
    if ref is None or str(ref) != effect.ref or ref.tool != effect.tool:
        return None
    return ref


def placeholders(arguments: Any, where: str = "") -> Iterator[tuple[str, str, str]]:
    """Every placeholder for an earlier effect's result in held arguments (R16, GW-10), in
    document order: ``(pointer to it within the arguments, the ref it names, its pointer)``.
    A placeholder is an object whose members are ``$ref`` (a string) and, optionally,
    ``pointer`` (a string, ``""`` when absent)."""
    if isinstance(arguments, Mapping):
        target, at = arguments.get("$ref"), arguments.get("pointer", "")
        if (isinstance(target, str) and isinstance(at, str)
                and set(arguments) <= {"$ref", "pointer"}):
            yield where, target, at
            return
        for key, value in arguments.items():
            yield from placeholders(value, where + pointer(key))
    elif isinstance(arguments, list | tuple):
        for i, value in enumerate(arguments):
            yield from placeholders(value, where + pointer(i))


def _report_order_rules(report: WorkReport, data: Mapping[str, Any],
                        order: WorkOrder) -> Iterator[Finding]:
    if report.order_id != order.id:
        yield Finding("R2", "invalid", "/order_id",
                      f"order_id must be the order's id {_show(order.id)}")
    criteria = {c.id for c in order.criteria}
    for i, evidence in enumerate(report.evidence):
        if evidence.criterion not in criteria:
            yield Finding("R3", "invalid", pointer("evidence", i, "criterion"),
                          f"the order has no criterion {_show(evidence.criterion)}")
    if report.status == "done":
        proven = {e.criterion for e in report.evidence}
        for criterion in order.criteria:
            if criterion.id not in proven:
                yield Finding("R4", "invalid", "/evidence",
                              f"criterion {_show(criterion.id)} has no evidence")
                proven.add(criterion.id)  # a repeated criterion id needs saying only once
    for i, tool in enumerate(report.tools_used):
        if not matches_any(order.tools, tool):
            yield Finding("R5", "invalid", pointer("tools_used", i),
                          f"tool {_show(tool)} is not among the order's tools")
    cost = report.cost.units()
    for unit, limit in order.budget.units().items():
        spent = cost.get(unit)
        if spent is None:
            yield Finding("R6", "invalid", "/cost",
                          f"the order budgets {unit}; the report's cost must state it")
        elif spent > limit:
            yield Finding("R7", "limit", pointer("cost", unit),
                          f"{unit} spent {spent} is over the budget of {limit}")
    if parse_time(report.finished_at) > parse_time(order.deadline):
        yield Finding("R8", "limit", "/finished_at", "finished after the deadline")
    if report.status == "done" and order.output_schema is not None:
        result = data.get("result", {})
        if "output" not in result:
            yield Finding("R11", "invalid", "/result/output",
                          "the order has an output_schema; a done report gives result.output")
        else:
            from awl.documents.schemas import output_problem
            problem = output_problem(order.output_schema, result["output"])
            if problem is not None:
                yield Finding("R11", "invalid", "/result/output",
                              f"result.output does not match the output_schema: {problem}")
    for i, effect in enumerate(report.effects or ()):
        if not matches_any(order.staged, effect.tool):
            yield Finding("R14", "invalid", pointer("effects", i, "tool"),
                          f"tool {_show(effect.tool)} is not staged by the order")


def _report_call_rules(report: WorkReport, order: WorkOrder | None,
                       calls: Sequence[CallRecord]) -> Iterator[Finding]:
    order_id = order.id if order is not None else report.order_id
    ours = [c for c in calls if c.order_id == order_id]
    recorded = {}
    for call in ours:
        ref = parse_ref(call.ref)
        if ref is not None:
            recorded[str(ref)] = call
    for i, evidence in enumerate(report.evidence):
        ref = parse_ref(evidence.ref) if evidence.type == "tool_call" and evidence.ref else None
        if ref is not None and str(ref) not in recorded:
            yield Finding("RX2", "invalid", pointer("evidence", i, "ref"),
                          f"no call {str(ref)!r} is recorded for this order")
    attempt = report.attempt or 1
    for i, effect in enumerate(report.effects or ()):
        ref = effect_ref(effect)
        if ref is None:
            continue  # R15 has said it
        recorded_call = recorded.get(str(ref))
        if recorded_call is None:
            yield Finding("RX2", "invalid", pointer("effects", i, "ref"),
                          f"no call {str(ref)!r} is recorded for this order")
            continue
        call = recorded_call
        problems = []
        if call.outcome != "held":
            problems.append(f"the call's outcome is {call.outcome}, not held")
        if call.tool != effect.tool:
            problems.append(f"the call was to {call.tool}")
        if not json_equal(call.arguments, effect.arguments):
            problems.append("the arguments differ from the held call's")
        if call.attempt != attempt:
            problems.append(f"the call was made in attempt {call.attempt}")
        if problems:
            yield Finding("RX3", "invalid", pointer("effects", i), "; ".join(problems))
    if not ours:
        return  # no call of the order recorded: its tools were used outside a gateway
    called = {c.tool for c in ours
              if c.attempt == attempt and c.outcome in ("ok", "error", "held")}
    if set(report.tools_used) != called:
        missing = sorted(called - set(report.tools_used))
        extra = sorted(set(report.tools_used) - called)
        parts = ([f"called but not listed: {', '.join(missing)}"] if missing else []) + (
            [f"listed but not called: {', '.join(extra)}"] if extra else [])
        yield Finding("RX4", "invalid", "/tools_used",
                      f"tools_used differs from the recorded calls ({'; '.join(parts)})")


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: numbers by value (1 equals 1.0), booleans never equal numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return a is None and b is None


def is_valid_report(doc: Any, order: Any = None, calls: Iterable[Any] | None = None) -> bool:
    """Whether the report has no ``invalid`` finding (``limit`` findings are allowed)."""
    return _no_invalid(iter_report_findings(doc, order, calls))


def validate_report(doc: Any, order: Any = None,
                    calls: Iterable[Any] | None = None) -> WorkReport:
    """The report as a model, when it has no ``invalid`` finding.

    Raises:
        ValidationFailed: with every finding, when one is ``invalid``.
        DocumentError: ``doc`` cannot be a JSON document, or a context document is invalid.
    """
    return _validated(WorkReport, "work report", iter_report_findings(doc, order, calls), doc)


# --------------------------------------------------------------------------- call, event, review

def iter_call_findings(doc: Any) -> Iterator[Finding]:
    """Every finding of a gateway call record (K1-K3).

    Raises:
        DocumentError: ``doc`` cannot be a JSON document at all.
    """
    _, model, found = check_structure(doc, "call")
    yield from found
    if model is None:
        return
    call = cast(CallRecord, model)
    ref = parse_ref(call.ref)
    if ref is None:
        yield Finding("K2", "invalid", "/ref", f"ref {_show(call.ref)} is not server/tool#N")
    elif ref.tool != call.tool:
        yield Finding("K2", "invalid", "/ref",
                      f"ref {_show(call.ref)} names another tool than {_show(call.tool)}")
    if parse_time(call.ended_at) < parse_time(call.started_at):
        yield Finding("K3", "invalid", "/ended_at", "ended_at is before started_at")


def iter_event_findings(doc: Any) -> Iterator[Finding]:
    """Every finding of one lifecycle event (E1-E2).

    Raises:
        DocumentError: ``doc`` cannot be a JSON document at all.
    """
    _, model, found = check_structure(doc, "event")
    yield from found
    if model is None:
        return
    event = cast(Event, model)
    if not is_row(event.from_, event.action, event.to):
        yield Finding("E2", "invalid", "/action",
                      f"{_show(event.action)} from {_show(str(event.from_))} to "
                      f"{_show(event.to)} is not a row of the lifecycle table")


def iter_review_findings(doc: Any) -> Iterator[Finding]:
    """Every finding of a manager's review (W1-W3).

    Raises:
        DocumentError: ``doc`` cannot be a JSON document at all.
    """
    _, model, found = check_structure(doc, "review")
    yield from found
    if model is None:
        return
    review = cast(Review, model)
    if review.decision == "rework" and not (review.reason or "").strip():
        yield Finding("W2", "invalid", "/reason", "a rework says why")
    for i, ref in enumerate(review.effects or ()):
        if review.decision != "approve":
            yield Finding("W3", "invalid", pointer("effects", i),
                          "only an approval names effects to run")
        elif parse_ref(ref) is None:
            yield Finding("W3", "invalid", pointer("effects", i),
                          f"{_show(ref)} is not an effect ref server/tool#N")


def is_valid_call(doc: Any) -> bool:
    """Whether the call record has no ``invalid`` finding."""
    return _no_invalid(iter_call_findings(doc))


def is_valid_event(doc: Any) -> bool:
    """Whether the event has no ``invalid`` finding."""
    return _no_invalid(iter_event_findings(doc))


def is_valid_review(doc: Any) -> bool:
    """Whether the review has no ``invalid`` finding."""
    return _no_invalid(iter_review_findings(doc))


def validate_call(doc: Any) -> CallRecord:
    """The call record as a model, when it has no ``invalid`` finding.

    Raises:
        ValidationFailed: with every finding, when one is ``invalid``.
        DocumentError: ``doc`` cannot be a JSON document at all.
    """
    return _validated(CallRecord, "call record", iter_call_findings(doc), doc)


def validate_event(doc: Any) -> Event:
    """The event as a model, when it has no ``invalid`` finding.

    Raises:
        ValidationFailed: with every finding, when one is ``invalid``.
        DocumentError: ``doc`` cannot be a JSON document at all.
    """
    return _validated(Event, "event", iter_event_findings(doc), doc)


def validate_review(doc: Any) -> Review:
    """The review as a model, when it has no ``invalid`` finding.

    Raises:
        ValidationFailed: with every finding, when one is ``invalid``.
        DocumentError: ``doc`` cannot be a JSON document at all.
    """
    return _validated(Review, "review", iter_review_findings(doc), doc)


# --------------------------------------------------------------------------- pass claims

LEEWAY = 30
"""Seconds of clock skew tolerated on ``exp``, ``nbf`` and ``iat``."""


# -- rules --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PassFacts:
    """What the P rules need about an order, from the order or from a worker's pass."""

    order_id: str
    manager: str | None
    tools: tuple[str, ...]
    budget: Mapping[str, float]
    deadline: str | None
    staged: tuple[str, ...]

    @classmethod
    def of_order(cls, order: WorkOrder) -> PassFacts:
        return cls(order.id, order.manager, order.tools, order.budget.units(),
                   order.deadline, order.staged)

    @classmethod
    def of_root(cls, root: PassClaims) -> PassFacts:
        g = root.grant
        return cls(g.order_id, g.manager, g.tools, g.budget.units(), g.deadline,
                   g.staged or ())


def _bad(rule: str, path: str, message: str) -> Finding:
    return Finding(rule, "invalid", path, message)


def _time_findings(claims: PassClaims, now: float | None) -> Iterator[Finding]:
    problems = []
    if claims.exp <= claims.nbf:
        problems.append(f"exp {claims.exp} is not after nbf {claims.nbf}")
    if claims.iat > claims.exp:
        problems.append(f"iat {claims.iat} is after exp {claims.exp}")
    if now is not None and claims.exp <= now:
        problems.append(f"exp {claims.exp} is not after the time of issue {int(now)}")
    if problems:
        yield _bad("P2", "/exp", "; ".join(problems))
    if now is not None and issued_ahead(claims, now, LEEWAY):
        yield _bad("P9", "/iat", f"iat {claims.iat} is more than {LEEWAY} s after the time "
                   f"{int(now)}: a pass is never dated in the future")


def issued_ahead(claims: PassClaims, now: float, leeway: float) -> bool:
    """Whether ``iat`` lies further ahead of ``now`` than the clock leeway (P9)."""
    return claims.iat > now + leeway


def _order_findings(claims: PassClaims, facts: PassFacts) -> Iterator[Finding]:
    g = claims.grant
    if g.order_id != facts.order_id:
        yield _bad("P3", "/grant/order_id",
                   f"the pass is for order {g.order_id!r}, not {facts.order_id!r}")
    if g.manager is not None and facts.manager is not None and g.manager != facts.manager:
        yield _bad("P3", "/grant/manager",
                   f"the order's manager is {facts.manager!r}, not {g.manager!r}")


def _tool_findings(claims: PassClaims, facts: PassFacts | None,
                   parent: PassClaims | None) -> Iterator[Finding]:
    if parent is not None:
        outer, whose = parent.grant.tools, "the parent pass"
    elif facts is not None:
        outer, whose = facts.tools, "the order"
    else:
        return
    for i, pattern in enumerate(claims.grant.tools):
        if not covered_by_any(outer, pattern):
            yield _bad("P4", pointer("grant", "tools", i),
                       f"{pattern} is not covered by {whose}'s tools {list(outer)}")


def _budget_findings(claims: PassClaims, facts: PassFacts | None, parent: PassClaims | None,
                     remaining: Mapping[str, float] | None) -> Iterator[Finding]:
    if parent is not None:
        base, whose = parent.grant.budget.units(), "the parent pass"
    elif facts is not None:
        base, whose = dict(facts.budget), "the order"
    else:
        return
    granted = claims.grant.budget.units()
    for unit in sorted(base):
        limit = base[unit]
        if remaining is not None and unit in remaining:
            limit = min(limit, remaining[unit])
        where = pointer("grant", "budget", unit)
        if unit not in granted:
            yield _bad("P5", where, f"{whose} limits {unit}; the pass must limit it too")
        elif granted[unit] > limit:
            yield _bad("P5", where, f"{unit} {granted[unit]} is more than the {limit} that "
                       f"remains of {whose}'s budget")


def _expiry_findings(claims: PassClaims, facts: PassFacts | None,
                     parent: PassClaims | None) -> Iterator[Finding]:
    problems = []
    if parent is not None and claims.exp > parent.exp:
        problems.append(f"exp {claims.exp} is after the parent pass's exp {parent.exp}")
    deadline = facts.deadline if facts is not None else None
    if deadline is not None and claims.exp > parse_time(deadline).timestamp():
        problems.append(f"exp {claims.exp} is after the order deadline {deadline}")
    if problems:
        yield _bad("P6", "/exp", "; ".join(problems))
    stated = claims.grant.deadline
    if (stated is not None and deadline is not None
            and parse_time(stated) != parse_time(deadline)):
        yield _bad("P6", "/grant/deadline",
                   f"the order's deadline is {deadline}, not {stated}")


def _staged_findings(claims: PassClaims, facts: PassFacts | None) -> Iterator[Finding]:
    if facts is None:
        return
    g = claims.grant
    if g.staged is not None and set(g.staged) != set(facts.staged):
        yield _bad("P7", "/grant/staged",
                   f"the order stages {list(facts.staged)}, not {list(g.staged)}")
    if g.parent_jti is None:
        return  # the worker's own pass may hold staged tools: the gateway holds their calls
    for i, pattern in enumerate(g.tools):
        hit = [s for s in facts.staged if overlap(pattern, s) is not None]
        if hit:
            yield _bad("P7", pointer("grant", "tools", i),
                       f"{pattern} reaches staged {hit}: a staged tool is never delegated")


def _parent_findings(claims: PassClaims, parent: PassClaims | None) -> Iterator[Finding]:
    if parent is not None and claims.grant.parent_jti != parent.jti:
        yield _bad("P8", "/grant/parent_jti",
                   f"parent_jti {claims.grant.parent_jti!r} is not the parent's jti "
                   f"{parent.jti!r}")


def pass_rule_findings(claims: PassClaims, facts: PassFacts | None, parent: PassClaims | None,
                   remaining: Mapping[str, float] | None, now: float | None
                   ) -> Iterator[Finding]:
    yield from _time_findings(claims, now)
    if facts is not None:
        yield from _order_findings(claims, facts)
    yield from _tool_findings(claims, facts, parent)
    yield from _budget_findings(claims, facts, parent, remaining)
    yield from _expiry_findings(claims, facts, parent)
    yield from _staged_findings(claims, facts)
    yield from _parent_findings(claims, parent)


def iter_pass_findings(
    claims: Any,
    *,
    order: Any = None,
    parent: Any = None,
    remaining: Mapping[str, float] | None = None,
    now: datetime | str | float | None = None,
) -> Iterator[Finding]:
    """Findings for a pass's claims: V1, P1 (schema), then P2..P9.

    When V1 or P1 fails, nothing else runs (the later rules assume the structure).

    Args:
        claims: the claims, as JSON data or a :class:`~awl.PassClaims`.
        order: the order the pass is for (rules P3, P6, P7 and the fallback of P4, P5).
        parent: the parent pass's claims, for a derived pass (P4, P5, P6, P8).
        remaining: per budget unit, what is left of the parent's (or the order's) budget;
            a unit not given counts as its full limit.
        now: the time of issue; when given, P2 also wants ``exp`` after it and P9 wants
            ``iat`` no later than it plus the leeway.

    Raises:
        DocumentError: ``claims`` cannot be a JSON document at all, or ``order`` or
            ``parent`` is not a valid document.
        BadRequest: ``now`` is not a time within years 1 to 9999, or ``remaining`` does not
            map unit names to finite numbers.
    """
    remaining = check_amounts(remaining, name="remaining")
    t = None if now is None else epoch_seconds(now)
    _, model, found = check_structure(claims, "pass")
    yield from found
    if model is None:
        return
    order_model = None if order is None else context_model(order, "order", WorkOrder, "order")
    parent_model = (None if parent is None
                    else context_model(parent, "pass", PassClaims, "parent"))
    yield from pass_rule_findings(cast(PassClaims, model),
                              PassFacts.of_order(order_model) if order_model else None,
                              parent_model, remaining, t)


def is_valid_pass(
    claims: Any,
    *,
    order: Any = None,
    parent: Any = None,
    remaining: Mapping[str, float] | None = None,
    now: datetime | str | float | None = None,
) -> bool:
    """Whether a pass's claims have no ``invalid`` finding (DOC-9).

    Takes the same arguments as :func:`iter_pass_findings`.

    Raises:
        DocumentError: ``claims`` cannot be a JSON document at all, or ``order`` or
            ``parent`` is not a valid document.
        BadRequest: ``now`` is not a time within years 1 to 9999, or ``remaining`` does not
            map unit names to finite numbers.
    """
    return _no_invalid(iter_pass_findings(claims, order=order, parent=parent,
                                          remaining=remaining, now=now))


def validate_pass(
    claims: Any,
    *,
    order: Any = None,
    parent: Any = None,
    remaining: Mapping[str, float] | None = None,
    now: datetime | str | float | None = None,
) -> PassClaims:
    """A pass's claims as a model, when they have no ``invalid`` finding (DOC-9).

    Takes the same arguments as :func:`iter_pass_findings`. This checks the claims only;
    a token's signature and chain are :func:`verify_pass`'s.

    Raises:
        ValidationFailed: with every finding, when one is ``invalid``.
        DocumentError: ``claims`` cannot be a JSON document at all, or ``order`` or
            ``parent`` is not a valid document.
        BadRequest: ``now`` is not a time within years 1 to 9999, or ``remaining`` does not
            map unit names to finite numbers.
    """
    found = iter_pass_findings(claims, order=order, parent=parent, remaining=remaining,
                               now=now)
    return _validated(PassClaims, "delegation pass", found, claims)


# --------------------------------------------------------------------------- any document

def detect_type(doc: Any) -> DocType:
    """The document type: from ``spec`` for orders, reports and passes, else from its fields.

    Raises:
        DocumentError: the type cannot be told; name it explicitly.
    """
    if isinstance(doc, BaseModel):
        for name, model_cls in _MODELS.items():
            if isinstance(doc, model_cls):
                return cast(DocType, name)
    if isinstance(doc, Mapping):
        spec = doc.get("spec")
        if isinstance(spec, str):
            for name, prefix in _SPEC_PREFIX.items():
                if spec.startswith(prefix):
                    return cast(DocType, name)
        if "outcome" in doc and "ref" in doc:
            return "call"
        if "seq" in doc and "action" in doc:
            return "event"
        if "decision" in doc:
            return "review"
    raise DocumentError("cannot tell what kind of document this is (no known spec); "
                        "name the type (order, report, pass, call, event, review)")


def check(doc: Any, type: DocType | None = None, *, order: Any = None, parent: Any = None,
          calls: Iterable[Any] | None = None, remaining: Any = None,
          now: Any = None, checks: Iterable[Any] | None = None,
          sub_reports: Iterable[Any] | None = None) -> list[Finding]:
    """Every finding of any document, its type detected from ``spec`` unless given.

    Args:
        doc: the document (JSON data or a model).
        type: ``order``, ``report``, ``pass``, ``call``, ``event`` or ``review``.
        order: for a report, the order it answers; for a pass, the order it grants.
        parent: for an order, the parent order (runs the sub-order rules); for a pass, the
            parent pass's claims.
        calls: for a report, the order's call records.
        remaining: for a pass, the budget that remains for it; for a sub-order, what is
            left of the parent's budget.
        now: for a pass, the time to check against (seconds since the epoch).
        checks: for a report, the desk's runs of the order's criteria checks (RX5).
        sub_reports: for a report, the latest report of each direct sub-order of its order
            (RX6).

    Raises:
        DocumentError: the input cannot be read, its type cannot be told, or a context
            document is invalid.
        BadRequest: an unknown ``type``; for a pass, a ``now`` or ``remaining`` that
            :func:`iter_pass_findings` refuses.
    """
    doc_type = type or detect_type(doc)
    if doc_type == "order":
        if parent is not None:
            return list(iter_suborder_findings(doc, parent, remaining))
        return list(iter_order_findings(doc))
    if doc_type == "report":
        return list(iter_report_findings(doc, order, calls, checks, sub_reports))
    if doc_type == "pass":
        return list(iter_pass_findings(doc, order=order, parent=parent, remaining=remaining,
                                       now=now))
    singles: Mapping[str, Callable[[Any], Iterator[Finding]]] = {
        "call": iter_call_findings, "event": iter_event_findings,
        "review": iter_review_findings,
    }
    if doc_type not in singles:
        raise BadRequest(f"unknown document type {doc_type!r}; use order, report, pass, call, "
                         "event or review")
    return list(singles[doc_type](doc))


# --------------------------------------------------------------------------- helpers

def _no_invalid(findings: Iterable[Finding]) -> bool:
    return not any(f.kind == "invalid" for f in findings)


def _validated(model_cls: type[_M], what: str, findings: Iterable[Finding], doc: Any) -> _M:
    """The document as a model, or ValidationFailed carrying every finding."""
    found = list(findings)
    invalid = [f for f in found if f.kind == "invalid"]
    if invalid:
        first = invalid[0]
        more = f" (and {len(invalid) - 1} more)" if len(invalid) > 1 else ""
        raise ValidationFailed(f"invalid {what}: {first.rule} {first.path or '/'}: "
                               f"{first.message}{more}", findings=found)
    data = to_plain(doc)
    if model_cls in (WorkOrder, WorkReport):
        data = from_published(data)
    return model_cls.model_validate(data, by_alias=True, by_name=False)

