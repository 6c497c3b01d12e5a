"""Every numbered rule, one passing and one failing document each, compared by rule and path."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from awl import (
    DocumentError,
    Finding,
    PassClaims,
    ValidationFailed,
    WorkOrder,
    WorkReport,
    is_valid_pass,
    iter_pass_findings,
    validate_pass,
)
from awl.documents.checks import (
    check,
    detect_type,
    is_valid_call,
    is_valid_event,
    is_valid_order,
    is_valid_report,
    is_valid_review,
    is_valid_suborder,
    iter_call_findings,
    iter_event_findings,
    iter_order_findings,
    iter_report_findings,
    iter_review_findings,
    iter_suborder_findings,
    json_equal,
    load_document,
    to_plain,
    validate_call,
    validate_event,
    validate_order,
    validate_report,
    validate_review,
    validate_suborder,
)
from awl.documents.schemas import SCHEMA_NAMES, load_schema, schema_findings, validator


def make_order(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "spec": "awl/work-order@0.3",
        "id": "wo_1",
        "created_at": "2026-10-01T09:00:00Z",
        "from": "agent:manager",
        "to": "agent:worker",
        "goal": "Email the CFO a three-line Q3 risk summary",
        "criteria": [{"id": "c1", "text": "Summary sent"}, {"id": "c2", "text": "Three lines"}],
        "budget": {"usd": 1, "tool_calls": 10},
        "deadline": "2026-10-02T09:00:00Z",
        "tools": ["filings/*", "gmail/*"],
        "staged": ["gmail/send"],
    }
    doc.update(changes)
    return {k: v for k, v in doc.items() if v is not None}


def make_report(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "spec": "awl/work-report@0.3",
        "order_id": "wo_1",
        "from": "agent:worker",
        "status": "done",
        "result": {"summary": "Sent"},
        "evidence": [
            {"criterion": "c1", "type": "tool_call", "ref": "gmail/send#2"},
            {"criterion": "c2", "type": "note", "note": "three lines"},
        ],
        "cost": {"usd": 0.2, "tool_calls": 2},
        "started_at": "2026-10-01T10:00:00Z",
        "finished_at": "2026-10-01T11:00:00Z",
        "tools_used": ["filings/search", "gmail/send"],
        "attempt": 1,
        "effects": [{"ref": "gmail/send#2", "tool": "gmail/send",
                     "arguments": {"to": "cfo@example.com", "body": "three lines"}}],
    }
    doc.update(changes)
    return {k: v for k, v in doc.items() if v is not None}


def make_call(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "ref": "filings/search#1",
        "order_id": "wo_1",
        "attempt": 1,
        "tool": "filings/search",
        "arguments": {"q": "Q3 risks"},
        "outcome": "ok",
        "started_at": "2026-10-01T10:01:00Z",
        "ended_at": "2026-10-01T10:01:02Z",
    }
    doc.update(changes)
    return {k: v for k, v in doc.items() if v is not None}


def make_calls() -> list[dict[str, Any]]:
    return [
        make_call(),
        make_call(ref="gmail/send#2", tool="gmail/send", outcome="held",
                  arguments={"body": "three lines", "to": "cfo@example.com"}),
    ]


def make_event(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"seq": 2, "at": "2026-10-01T09:05:00Z", "actor": "agent:worker",
                           "action": "accept", "from": "offered", "to": "accepted"}
    doc.update(changes)
    return doc


def make_review(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"order_id": "wo_1", "attempt": 1, "actor": "agent:manager",
                           "decision": "approve", "at": "2026-10-01T12:00:00Z"}
    doc.update(changes)
    return {k: v for k, v in doc.items() if v is not None}


def pairs(findings: Iterable[Finding]) -> set[tuple[str, str]]:
    return {(f.rule, f.path) for f in findings}


def rules(findings: Iterable[Finding]) -> set[str]:
    return {f.rule for f in findings}


# ----------------------------------------------------------------------------- fixtures pass

def test_fixtures_are_valid() -> None:
    """The reference order, report, call, event and review have no findings at all."""
    assert list(iter_order_findings(make_order())) == []
    assert list(iter_report_findings(make_report(), make_order(), make_calls())) == []
    assert list(iter_call_findings(make_call())) == []
    assert list(iter_event_findings(make_event())) == []
    assert list(iter_review_findings(make_review())) == []


def test_published_02_documents_validate() -> None:
    """A published-format @0.2 order and report, without staged, effects or continues, pass."""
    order = make_order(spec="awl/work-order@0.2", staged=None, tools=["filings/*"])
    report = make_report(spec="awl/work-report@0.2", effects=None, tools_used=["filings/search"],
                         evidence=[{"criterion": "c1", "type": "tool_call",
                                    "ref": "filings/search#call-1"},
                                   {"criterion": "c2", "type": "note"}])
    assert list(iter_order_findings(order)) == []
    assert list(iter_report_findings(report, order, [make_call()])) == []


# ----------------------------------------------------------------------------- version

@pytest.mark.parametrize("version", ["0.1", "0.2", "0.3", "0.4"])
def test_known_versions_pass(version: str) -> None:
    """Every version this reader knows passes rule V1: orders to 0.4, reports to 0.3."""
    assert "V1" not in rules(iter_order_findings(make_order(spec=f"awl/work-order@{version}")))
    if version != "0.4":
        assert "V1" not in rules(iter_report_findings(
            make_report(spec=f"awl/work-report@{version}")))


@pytest.mark.parametrize("version", ["1.0", "0.5", "2.3"])
def test_unknown_version_is_v1_and_stops(version: str) -> None:
    """An unknown version is one V1 finding at /spec, and no other rule runs; a report
    @0.4 is one (the published reports stop at 0.3)."""
    doc = make_order(spec=f"awl/work-order@{version}", goal="")
    assert pairs(iter_order_findings(doc)) == {("V1", "/spec")}
    for report_version in (version, "0.4"):
        report = make_report(spec=f"awl/work-report@{report_version}")
        assert pairs(iter_report_findings(report, make_order())) == {("V1", "/spec")}


def test_malformed_spec_is_a_schema_finding() -> None:
    """A spec that is not a versioned format name is a schema finding, not V1."""
    assert rules(iter_order_findings(make_order(spec="work-order"))) == {"O1"}
    assert rules(iter_order_findings(make_order(spec="awl/work-report@0.3"))) == {"O1"}


# ----------------------------------------------------------------------------- order

def test_o1_schema_failure_stops_other_rules() -> None:
    """A schema failure is O1 with its path, and semantic rules do not run after it."""
    doc = make_order(budget={"usd": -1}, deadline="2020-01-01T00:00:00Z")
    assert pairs(iter_order_findings(doc)) == {("O1", "/budget/usd")}


def test_o1_refuses_unknown_fields_but_not_extensions() -> None:
    """Unknown top-level fields are O1; x-* extensions and metadata are accepted."""
    assert rules(iter_order_findings(make_order(colour="red"))) == {"O1"}
    assert list(iter_order_findings(make_order(**{"x-team": 1}, metadata={"a": [1]}))) == []


def test_o1_checks_timestamps_as_dates() -> None:
    """A timestamp on a day that does not exist is O1."""
    assert pairs(iter_order_findings(make_order(created_at="2026-02-30T00:00:00Z"))) == {
        ("O1", "/created_at")}


@pytest.mark.spec("DOC-1")
def test_o1_non_object_document() -> None:
    """A document that is not an object is one O1 finding at the root."""
    docs: list[Any] = [[], "order", 3, None, True]
    for doc in docs:
        assert pairs(iter_order_findings(doc)) == {("O1", "")}


def test_o2_duplicate_criterion_ids() -> None:
    """The repeat of a criterion id is O2 at that criterion's id."""
    criteria = [{"id": "c1", "text": "a"}, {"id": "c2", "text": "b"}, {"id": "c1", "text": "c"}]
    assert pairs(iter_order_findings(make_order(criteria=criteria))) == {
        ("O2", "/criteria/2/id")}


def test_o3_deadline_after_created() -> None:
    """A deadline equal to or before created_at is O3; a later one passes."""
    assert pairs(iter_order_findings(make_order(deadline="2026-10-01T09:00:00Z"))) == {
        ("O3", "/deadline")}
    assert pairs(iter_order_findings(make_order(deadline="2026-10-01T10:00:00+02:00"))) == {
        ("O3", "/deadline")}
    assert list(iter_order_findings(make_order(deadline="2026-10-01T09:00:01Z"))) == []


def test_o4_output_schema_must_be_a_schema() -> None:
    """An output_schema the 2020-12 metaschema refuses is O4 at /output_schema."""
    assert pairs(iter_order_findings(make_order(output_schema={"type": "banana"}))) == {
        ("O4", "/output_schema")}
    assert pairs(iter_order_findings(make_order(output_schema={"pattern": "("}))) == {
        ("O4", "/output_schema")}
    good = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
    assert list(iter_order_findings(make_order(output_schema=good))) == []


def test_o5_staged_covered_by_tools() -> None:
    """A staged pattern no tools pattern covers is O5 at /staged/i."""
    doc = make_order(tools=["gmail/send"], staged=["gmail/send", "gmail/*", "github/x"])
    assert pairs(iter_order_findings(doc)) == {("O5", "/staged/1"), ("O5", "/staged/2")}
    assert list(iter_order_findings(make_order(tools=["*"], staged=["a/*", "b/c"]))) == []


def test_ox1_parent_and_continues_differ_from_id() -> None:
    """parent_id or continues equal to the order's own id is OX1 at that field."""
    assert pairs(iter_order_findings(make_order(parent_id="wo_1", continues="wo_1"))) == {
        ("OX1", "/parent_id"), ("OX1", "/continues")}
    assert list(iter_order_findings(make_order(parent_id="wo_0", continues="wo_00"))) == []


# ----------------------------------------------------------------------------- report

def test_r1_schema_failure_stops_other_rules() -> None:
    """A report schema failure is R1 with its path, and no other rule runs."""
    doc = make_report(status="finished", order_id="other")
    assert pairs(iter_report_findings(doc, make_order())) == {("R1", "/status")}


def test_r2_order_id_matches() -> None:
    """A report naming another order is R2 at /order_id."""
    found = iter_report_findings(make_report(order_id="wo_2"), make_order())
    assert pairs(found) == {("R2", "/order_id")}


def test_r3_evidence_criterion_exists() -> None:
    """Evidence for a criterion the order lacks is R3 at /evidence/i/criterion."""
    evidence = [*make_report()["evidence"], {"criterion": "c9", "type": "note"}]
    found = iter_report_findings(make_report(evidence=evidence), make_order())
    assert pairs(found) == {("R3", "/evidence/2/criterion")}


def test_r4_done_needs_evidence_per_criterion() -> None:
    """A done report is R4 at /evidence once per criterion with no evidence."""
    found = list(iter_report_findings(make_report(evidence=[]), make_order()))
    assert [(f.rule, f.path) for f in found] == [("R4", "/evidence"), ("R4", "/evidence")]
    blocked = make_report(status="blocked", evidence=[], questions=["Which CFO?"])
    assert list(iter_report_findings(blocked, make_order())) == []


def test_r5_tools_used_covered() -> None:
    """A used tool the order's patterns do not admit is R5 at /tools_used/i."""
    found = iter_report_findings(make_report(tools_used=["gmail/send", "slack/post"]),
                                 make_order())
    assert pairs(found) == {("R5", "/tools_used/1")}


def test_r6_cost_sets_every_budget_unit() -> None:
    """A budgeted unit missing from cost is R6 at /cost, naming the unit."""
    found = iter_report_findings(make_report(cost={"usd": 0.5}), make_order())
    assert pairs(found) == {("R6", "/cost")}


def test_r7_cost_over_budget_is_a_limit() -> None:
    """Cost over budget is an R7 limit finding, which does not make the report invalid."""
    report = make_report(cost={"usd": 1.5, "tool_calls": 10})
    found = list(iter_report_findings(report, make_order()))
    assert [(f.rule, f.kind, f.path) for f in found] == [("R7", "limit", "/cost/usd")]
    assert is_valid_report(report, make_order())
    validate_report(report, make_order())


def test_r8_late_finish_is_a_limit() -> None:
    """Finishing after the deadline is an R8 limit finding at /finished_at."""
    report = make_report(finished_at="2026-10-02T09:00:01Z")
    found = list(iter_report_findings(report, make_order()))
    assert [(f.rule, f.kind, f.path) for f in found] == [("R8", "limit", "/finished_at")]


def test_r9_blocked_needs_questions() -> None:
    """A blocked report without questions (or with none) is R9 at /questions."""
    assert pairs(iter_report_findings(make_report(status="blocked"))) == {("R9", "/questions")}
    assert pairs(iter_report_findings(make_report(status="blocked", questions=[]))) == {
        ("R9", "/questions")}


def test_r10_failed_needs_error() -> None:
    """A failed report without an error is R10 at /error."""
    assert pairs(iter_report_findings(make_report(status="failed"))) == {("R10", "/error")}
    assert list(iter_report_findings(make_report(status="failed", error="timeout"))) == []


def test_r11_output_matches_output_schema() -> None:
    """A done report whose output breaks (or lacks) the order's output_schema is R11."""
    schema = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
    order = make_order(output_schema=schema)
    good = make_report(result={"summary": "s", "output": {"n": 3}})
    assert list(iter_report_findings(good, order)) == []
    for result in ({"summary": "s", "output": {"n": "3"}}, {"summary": "s"}):
        assert pairs(iter_report_findings(make_report(result=result), order)) == {
            ("R11", "/result/output")}
    failed = make_report(status="failed", error="x", result={"summary": "s"})
    assert list(iter_report_findings(failed, order)) == []


def test_r11_unusable_output_schema_is_a_finding() -> None:
    """An output_schema whose refs cannot be resolved yields R11, never an exception."""
    order = make_order(output_schema={"$ref": "https://example.com/none.json"})
    report = make_report(result={"summary": "s", "output": 1})
    assert pairs(iter_report_findings(report, order)) == {("R11", "/result/output")}
    looping = make_order(output_schema={"$ref": "#"})
    assert pairs(iter_report_findings(report, looping)) == {("R11", "/result/output")}


def test_r12_started_before_finished() -> None:
    """started_at after finished_at is R12 at /started_at."""
    found = iter_report_findings(make_report(started_at="2026-10-01T12:00:00Z"))
    assert pairs(found) == {("R12", "/started_at")}


def test_r14_effects_only_for_staged_tools() -> None:
    """An effect for a tool the order does not stage is R14 at /effects/i/tool."""
    effects = [{"ref": "gmail/draft#3", "tool": "gmail/draft", "arguments": {}}]
    found = iter_report_findings(make_report(effects=effects), make_order())
    assert pairs(found) == {("R14", "/effects/0/tool")}


def test_rx1_evidence_refs_well_formed() -> None:
    """A tool_call evidence without a ref that parses is RX1 at /evidence/i/ref; the draft
    spelling #call-N parses, and other evidence types carry free text."""
    evidence = [{"criterion": "c1", "type": "tool_call"},
                {"criterion": "c2", "type": "tool_call", "ref": "search"},
                {"criterion": "c2", "type": "tool_call", "ref": "filings/search#call-1"},
                {"criterion": "c2", "type": "citation", "ref": "https://example.com"}]
    found = iter_report_findings(make_report(evidence=evidence, effects=[]))
    assert pairs(found) == {("RX1", "/evidence/0/ref"), ("RX1", "/evidence/1/ref")}


def test_r15_effect_refs_are_tool_n_and_unique() -> None:
    """An effect ref naming another tool, numbered 0, in the draft spelling, or repeating an
    earlier one is R15 at /effects/i/ref, once per effect."""
    effects = [{"ref": "gmail/draft#2", "tool": "gmail/send", "arguments": {}},
               {"ref": "gmail/send#0", "tool": "gmail/send", "arguments": {}},
               {"ref": "gmail/send#call-2", "tool": "gmail/send", "arguments": {}},
               {"ref": "gmail/send#2", "tool": "gmail/send", "arguments": {}},
               {"ref": "gmail/send#2", "tool": "gmail/send", "arguments": {}},
               {"ref": "gmail/draft#2", "tool": "gmail/send", "arguments": {}}]
    found = list(iter_report_findings(make_report(effects=effects)))
    assert sorted((f.rule, f.path) for f in found) == [
        ("R15", f"/effects/{i}/ref") for i in (0, 1, 2, 4, 5)]


def test_r16_placeholders_name_earlier_effects() -> None:
    """A placeholder naming no earlier effect, or with a pointer not starting with /, is R16
    at its place; one without a pointer means the whole result; an object with other members
    is plain data."""
    first = {"ref": "gmail/send#2", "tool": "gmail/send",
             "arguments": {"body": {"$ref": "gmail/send#3"}}}
    second = {"ref": "gmail/send#3", "tool": "gmail/send", "arguments": {
        "a": {"$ref": "gmail/send#2"}, "b": [{"$ref": "gmail/send#2", "pointer": "/x~1y"}],
        "c": {"$ref": "gmail/send#2", "pointer": "x"}, "d": {"$ref": "nope", "also": 1}}}
    found = iter_report_findings(make_report(effects=[first, second]))
    assert pairs(found) == {("R16", "/effects/0/arguments/body"),
                            ("R16", "/effects/1/arguments/c")}


def test_rx2_refs_name_recorded_calls() -> None:
    """Refs that name no recorded call of this order are RX2."""
    evidence = [{"criterion": "c1", "type": "tool_call", "ref": "filings/search#9"},
                {"criterion": "c2", "type": "tool_call", "ref": "filings/search#call-1"}]
    report = make_report(evidence=evidence, effects=[
        {"ref": "gmail/send#7", "tool": "gmail/send", "arguments": {}}])
    other = make_call(ref="gmail/send#7", tool="gmail/send", order_id="wo_2", outcome="held")
    found = iter_report_findings(report, make_order(), [*make_calls(), other])
    assert pairs(found) == {("RX2", "/evidence/0/ref"), ("RX2", "/effects/0/ref")}


@pytest.mark.parametrize("change", [
    {"outcome": "ok"},
    {"arguments": {"to": "ceo@example.com", "body": "three lines"}},
    {"arguments": {"to": "cfo@example.com", "body": "three lines", "cc": None}},
    {"attempt": 2},
])
def test_rx3_effect_matches_its_call(change: dict[str, Any]) -> None:
    """An effect whose held call differs in outcome, arguments or attempt is RX3 at /effects/i."""
    calls = make_calls()
    calls[1].update(change)
    found = iter_report_findings(make_report(), make_order(), calls)
    assert ("RX3", "/effects/0") in pairs(found)


def test_rx3_compares_arguments_as_json() -> None:
    """Arguments equal as JSON (1 and 1.0, any key order) match; true never equals 1."""
    calls = make_calls()
    report = make_report(effects=[{"ref": "gmail/send#2", "tool": "gmail/send",
                                   "arguments": {"n": 1.0, "flag": True}}])
    calls[1]["arguments"] = {"flag": True, "n": 1}
    assert list(iter_report_findings(report, make_order(), calls)) == []
    calls[1]["arguments"] = {"flag": 1, "n": 1}
    assert pairs(iter_report_findings(report, make_order(), calls)) == {("RX3", "/effects/0")}


def test_rx4_tools_used_equals_called_tools() -> None:
    """tools_used that differs from the tools called in the attempt is RX4 at /tools_used."""
    calls = [*make_calls(), make_call(ref="filings/get#3", tool="filings/get")]
    assert pairs(iter_report_findings(make_report(), make_order(), calls)) == {
        ("RX4", "/tools_used")}
    refused = make_call(ref="filings/get#3", tool="filings/get", outcome="refused")
    earlier = make_call(ref="filings/list#4", tool="filings/list", attempt=2)
    assert list(iter_report_findings(make_report(), make_order(),
                                     [*make_calls(), refused, earlier])) == []


@pytest.mark.spec("RX6")
def test_rx6_a_report_s_tokens_cover_its_sub_orders_reports() -> None:
    """Fewer tokens than the given sub-order reports state is an RX6 limit finding at
    /cost/tokens naming both figures and each sub-order's share; a sub-order report without
    tokens counts 0, a report stating none is not judged, and stored report models are
    taken as they are (the desk's way), through ``check`` too."""
    order = make_order(budget={"usd": 1, "tool_calls": 10, "tokens": 1000})
    below = [make_report(order_id=f"wo_1.{n}", cost={"tokens": n * 100}) for n in (2, 4)]
    below.append(make_report(order_id="wo_1.9", cost={"usd": 0.1}))
    short = make_report(cost={"usd": 0.2, "tool_calls": 2, "tokens": 599})
    found = list(iter_report_findings(short, order, None, None, below))
    assert [(f.rule, f.kind, f.path) for f in found] == [("RX6", "limit", "/cost/tokens")]
    assert found[0].message.startswith("tokens spent 599 is less than the 600 its sub-orders "
                                       "reported (200 in 'wo_1.2', 400 in 'wo_1.4')")
    assert is_valid_report(short, order)  # a limit never makes a report invalid
    models = [WorkReport.model_validate(r) for r in below]
    assert check(short, order=order, sub_reports=models) == found
    covered = make_report(cost={"usd": 0.2, "tool_calls": 2, "tokens": 600})
    assert list(iter_report_findings(covered, order, None, None, below)) == []
    assert list(iter_report_findings(make_report(), None, None, None, below)) == []
    many = [make_report(order_id=f"wo_1.{n}", cost={"tokens": 1}) for n in range(7)]
    assert "1 in 'wo_1.4' and 2 more); " in next(iter_report_findings(
        make_report(cost={"tokens": 0}), None, None, None, many)).message
    for bad in ("reports", [{"spec": "awl/work-report@0.3"}]):
        with pytest.raises(DocumentError):
            list(iter_report_findings(short, order, None, None, bad))


def test_report_without_order_runs_own_rules_only() -> None:
    """Without its order, a report is checked by the rules that need none."""
    assert list(iter_report_findings(make_report(order_id="elsewhere", evidence=[]))) == []


def test_report_against_invalid_order_is_a_document_error() -> None:
    """An invalid order given as context raises DocumentError, not findings."""
    with pytest.raises(DocumentError):
        list(iter_report_findings(make_report(), make_order(goal="")))
    with pytest.raises(DocumentError):
        list(iter_report_findings(make_report(), make_order(), [{"ref": 1}]))
    with pytest.raises(DocumentError):
        list(iter_report_findings(make_report(), make_order(), "calls"))


# ----------------------------------------------------------------------------- sub-order

def make_child(**changes: Any) -> dict[str, Any]:
    base = make_order(id="wo_1.1", parent_id="wo_1", budget={"usd": 0.5, "tool_calls": 5},
                      deadline="2026-10-02T08:00:00Z", tools=["filings/search", "gmail/read"],
                      staged=["gmail/read"])
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def test_suborder_within_parent_passes() -> None:
    """A sub-order that only shrinks its parent's authority has no findings."""
    assert list(iter_suborder_findings(make_child(), make_order())) == []
    assert is_valid_suborder(make_child(), make_order())


def test_c1_child_budget_within_parent() -> None:
    """A larger budget unit is C1 at /budget/<unit>, a missing one C1 at /budget naming it."""
    found = list(iter_suborder_findings(make_child(budget={"usd": 2, "tokens": 5}),
                                        make_order()))
    assert pairs(found) == {("C1", "/budget/usd"), ("C1", "/budget")}
    assert "tool_calls" in next(f.message for f in found if f.path == "/budget")


@pytest.mark.spec("C1", "LC-15")
def test_c1_child_budget_within_what_the_parent_has_left() -> None:
    """With what remains of the parent's budget given, a child asking more than that is C1,
    even when it is within the parent's whole budget; a unit not given stays whole."""
    child = make_child(budget={"usd": 0.5, "tool_calls": 5})
    found = iter_suborder_findings(child, make_order(), {"tool_calls": 4, "usd": 0.5})
    assert pairs(found) == {("C1", "/budget/tool_calls")}
    assert "left" in next(f.message for f in iter_suborder_findings(
        child, make_order(), {"tool_calls": 4}))
    assert is_valid_suborder(child, make_order(), {"tool_calls": 5})
    with pytest.raises(ValidationFailed):
        validate_suborder(child, make_order(), {"usd": 0.25})


def test_c2_child_tools_covered() -> None:
    """A child pattern the parent's patterns do not cover is C2 at /tools/i."""
    found = iter_suborder_findings(make_child(tools=["filings/*", "*", "gmail/send"],
                                              staged=None),
                                   make_order(tools=["filings/*", "gmail/send"], staged=None))
    assert pairs(found) == {("C2", "/tools/1")}


def test_c3_child_deadline_within_parent() -> None:
    """A child deadline after the parent's is C3 at /deadline."""
    found = iter_suborder_findings(make_child(deadline="2026-10-03T00:00:00Z"), make_order())
    assert pairs(found) == {("C3", "/deadline")}


@pytest.mark.spec("C5")
def test_c5_a_staged_tool_is_never_handed_down() -> None:
    """A child pattern reaching a tool the parent stages is C5 at /tools/i, staged by the
    child or not: its held calls would be approved by the child's manager."""
    for staged in ([], ["gmail/send"], ["gmail/*"]):
        found = iter_suborder_findings(make_child(tools=["filings/*", "gmail/*"],
                                                  staged=staged), make_order())
        assert pairs(found) == {("C5", "/tools/1")}, staged
    found = iter_suborder_findings(make_child(tools=["gmail/send", "*"], staged=[]),
                                   make_order(tools=["*"]))
    assert pairs(found) == {("C5", "/tools/0"), ("C5", "/tools/1")}
    others = make_child(tools=["gmail/read", "gmail/drafts"], staged=["gmail/drafts"])
    assert list(iter_suborder_findings(others, make_order())) == []


def test_cx1_parent_id_names_parent() -> None:
    """A child whose parent_id is missing or another id is CX1 at /parent_id."""
    assert pairs(iter_suborder_findings(make_child(parent_id="wo_9"), make_order())) == {
        ("CX1", "/parent_id")}
    assert pairs(iter_suborder_findings(make_child(parent_id=None), make_order())) == {
        ("CX1", "/parent_id")}


def test_suborder_includes_order_rules() -> None:
    """A sub-order is also checked as an order; a schema failure stops the C rules."""
    found = iter_suborder_findings(make_child(criteria=[{"id": "a", "text": "x"}] * 2,
                                              parent_id="wo_9"), make_order())
    assert pairs(found) == {("O2", "/criteria/1/id"), ("CX1", "/parent_id")}
    assert rules(iter_suborder_findings(make_child(goal=""), make_order())) == {"O1"}


# ----------------------------------------------------------------------------- call, event, review

def test_k_rules() -> None:
    """Call records: schema K1, ref matching the tool K2, ended after started K3."""
    assert pairs(iter_call_findings(make_call(outcome="maybe"))) == {("K1", "/outcome")}
    assert pairs(iter_call_findings(make_call(ref="filings/get#1"))) == {("K2", "/ref")}
    assert pairs(iter_call_findings(make_call(ref="filings/search"))) == {("K2", "/ref")}
    assert list(iter_call_findings(make_call(ref="filings/search#call-1"))) == []
    assert pairs(iter_call_findings(make_call(ended_at="2026-10-01T10:00:00Z"))) == {
        ("K3", "/ended_at")}


def test_e_rules() -> None:
    """Events: schema E1, and a triple outside the lifecycle table is E2 at /action."""
    assert pairs(iter_event_findings(make_event(seq=0))) == {("E1", "/seq")}
    assert pairs(iter_event_findings(make_event(to="working"))) == {("E2", "/action")}
    assert pairs(iter_event_findings(make_event(action="fly"))) == {("E2", "/action")}
    create = make_event(seq=1, action="create", to="offered", actor="agent:manager")
    create["from"] = None
    assert list(iter_event_findings(create)) == []
    progress = make_event(action="progress", to="working", data={"percent": 50})
    progress["from"] = "working"
    assert list(iter_event_findings(progress)) == []
    progress["to"] = "blocked"
    assert pairs(iter_event_findings(progress)) == {("E2", "/action")}


def test_w_rules() -> None:
    """Reviews: schema W1, rework needs a reason W2, approved effects are refs W3."""
    assert pairs(iter_review_findings(make_review(decision="maybe"))) == {("W1", "/decision")}
    assert pairs(iter_review_findings(make_review(decision="rework"))) == {("W2", "/reason")}
    assert pairs(iter_review_findings(make_review(decision="rework", reason=" "))) == {
        ("W2", "/reason")}
    assert list(iter_review_findings(make_review(decision="rework", reason="cite it"))) == []
    approve = make_review(effects=["gmail/send#3", "send it", "gmail/send#call-4"])
    assert pairs(iter_review_findings(approve)) == {("W3", "/effects/1")}


# ----------------------------------------------------------------------------- three ways to call

@pytest.mark.spec("DOC-9")
def test_validate_raises_with_findings_and_returns_model() -> None:
    """validate_* returns the model when valid and raises ValidationFailed with the findings."""
    assert isinstance(validate_order(make_order()), WorkOrder)
    with pytest.raises(ValidationFailed) as caught:
        validate_order(make_order(criteria=[{"id": "a", "text": "x"}] * 2))
    assert pairs(caught.value.findings) == {("O2", "/criteria/1/id")}
    assert validate_suborder(make_child(), make_order()).parent_id == "wo_1"
    assert validate_call(make_call()).tool == "filings/search"
    assert validate_event(make_event()).to == "accepted"
    assert validate_review(make_review()).decision == "approve"
    with pytest.raises(ValidationFailed):
        validate_report(make_report(status="failed"))
    assert not is_valid_order(make_order(goal=""))


def test_models_are_accepted_as_input() -> None:
    """A model is checked exactly like the JSON it dumps to."""
    model = validate_order(make_order())
    assert list(iter_order_findings(model)) == []
    assert list(iter_report_findings(make_report(), model)) == []
    assert check(model) == []


# Each document type: (iter_*, is_valid_*, validate_*, a valid call, an invalid call, the
# invalid call's findings). Invalid documents break two rules where the type has two, so
# the raising form must carry all of them.
_FORMS: dict[str, tuple[Any, Any, Any, tuple[Any, ...], tuple[Any, ...], set[tuple[str, str]]]] = {
    "order": (iter_order_findings, is_valid_order, validate_order, (make_order(),),
              (make_order(deadline="2026-09-01T00:00:00Z", staged=["drive/upload"]),),
              {("O3", "/deadline"), ("O5", "/staged/0")}),
    "suborder": (iter_suborder_findings, is_valid_suborder, validate_suborder,
                 (make_child(), make_order()),
                 (make_child(parent_id="wo_9", deadline="2026-10-03T00:00:00Z"), make_order()),
                 {("C3", "/deadline"), ("CX1", "/parent_id")}),
    "report": (iter_report_findings, is_valid_report, validate_report,
               (make_report(), make_order(), make_calls()),
               (make_report(order_id="wo_9", started_at="2026-10-01T12:00:00Z"), make_order(),
                make_calls()),
               {("R2", "/order_id"), ("R12", "/started_at")}),
    "call": (iter_call_findings, is_valid_call, validate_call, (make_call(),),
             (make_call(ref="filings/get#1", ended_at="2026-10-01T10:00:00Z"),),
             {("K2", "/ref"), ("K3", "/ended_at")}),
    "event": (iter_event_findings, is_valid_event, validate_event, (make_event(),),
              (make_event(to="working"),), {("E2", "/action")}),
    "review": (iter_review_findings, is_valid_review, validate_review, (make_review(),),
               (make_review(decision="rework", reason=" ", effects=["gmail/send#3"]),),
               {("W2", "/reason"), ("W3", "/effects/0")}),
}


@pytest.mark.spec("DOC-9")
@pytest.mark.parametrize("doc_type", sorted(_FORMS))
def test_every_document_type_is_checked_three_ways(doc_type: str) -> None:
    """Findings, a boolean and a raising call agree, and the error carries every finding."""
    iter_findings, is_valid, validate, good, bad, expected = _FORMS[doc_type]
    assert list(iter_findings(*good)) == []
    assert is_valid(*good) is True
    validate(*good)
    assert pairs(iter_findings(*bad)) == expected
    assert is_valid(*bad) is False
    with pytest.raises(ValidationFailed) as caught:
        validate(*bad)
    assert pairs(caught.value.findings) == expected


@pytest.mark.spec("DOC-9")
def test_limit_findings_never_make_a_document_invalid() -> None:
    """A report over budget and late has its limit findings, yet is valid in every form."""
    report = make_report(cost={"usd": 5, "tool_calls": 2}, finished_at="2026-10-03T00:00:00Z")
    found = list(iter_report_findings(report, make_order(), make_calls()))
    assert {(f.rule, f.kind, f.path) for f in found} == {
        ("R7", "limit", "/cost/usd"), ("R8", "limit", "/finished_at")}
    assert is_valid_report(report, make_order(), make_calls()) is True
    assert validate_report(report, make_order(), make_calls()).finished_at == (
        "2026-10-03T00:00:00Z")


def make_claims(**grant: Any) -> dict[str, Any]:
    """A worker's pass for make_order(), valid from its creation to its deadline."""
    return {
        "spec": "awl/delegation-pass@0.3", "iss": "awl:desk", "sub": "agent:worker",
        "aud": "awl:gateway", "jti": "p1", "iat": 1790845200, "nbf": 1790845200,
        "exp": 1790931600,  # 2026-10-02T09:00:00Z, the order's deadline
        "grant": {"order_id": "wo_1", "tools": ["filings/*", "gmail/*"],
                  "budget": {"usd": 1, "tool_calls": 10}, **grant},
    }


@pytest.mark.spec("DOC-9")
def test_pass_claims_are_checked_three_ways_too() -> None:
    """Delegation Pass claims have a findings form, a boolean form and a raising form that
    agree, against the same context, and the error carries every finding."""
    good, order = make_claims(), make_order()
    assert list(iter_pass_findings(good, order=order)) == []
    assert is_valid_pass(good, order=order) is True
    assert validate_pass(good, order=order) == PassClaims.model_validate(good)
    bad = make_claims(order_id="wo_9", tools=["filings/*", "drive/*"])
    expected = {("P3", "/grant/order_id"), ("P4", "/grant/tools/1")}
    assert pairs(iter_pass_findings(bad, order=order)) == expected
    assert is_valid_pass(bad, order=order) is False
    with pytest.raises(ValidationFailed) as caught:
        validate_pass(bad, order=order)
    assert pairs(caught.value.findings) == expected
    assert is_valid_pass(bad) is True  # without the order, P3 and P4 have nothing to compare
    with pytest.raises(ValidationFailed) as caught:
        validate_pass({**good, "spec": "awl/delegation-pass@9.0"})
    assert rules(caught.value.findings) == {"V1"}


def test_check_detects_the_type() -> None:
    """check() reads the type from spec, or from the fields of specless documents."""
    assert detect_type(make_order()) == "order"
    assert detect_type(make_report()) == "report"
    assert detect_type(make_call()) == "call"
    assert detect_type(make_event()) == "event"
    assert detect_type(make_review()) == "review"
    assert pairs(check(make_report(order_id="x"), order=make_order())) == {("R2", "/order_id")}
    assert pairs(check(make_child(parent_id="x"), parent=make_order())) == {("CX1", "/parent_id")}
    with pytest.raises(DocumentError):
        check({"hello": 1})
    assert rules(check({"hello": 1}, "order")) == {"O1"}


# ----------------------------------------------------------------------------- reading

def test_load_document_reads_json() -> None:
    """UTF-8 bytes, text and files all read to the same data; a byte-order mark is skipped."""
    doc = make_order()
    text = __import__("json").dumps(doc)
    assert load_document(text) == doc
    assert load_document(text.encode()) == doc
    assert load_document(b"\xef\xbb\xbf" + text.encode()) == doc


def test_load_document_reads_a_file(tmp_path: Path) -> None:
    """A path is read from disk; a missing file is a DocumentError."""
    path = tmp_path / "o.json"
    path.write_text('{"a": 1}', encoding="utf-8")
    assert load_document(path) == {"a": 1}
    with pytest.raises(DocumentError):
        load_document(tmp_path / "missing.json")


@pytest.mark.spec("DOC-1")
@pytest.mark.parametrize("source", [
    b"\xff\xfe{}",
    b'{"a": 1',
    b"",
    b'{"a": 1, "a": 2}',
    b'{"a": NaN}',
    b"[Infinity]",
    b"[-Infinity]",
    b"[1e999]",
    b"[" * 65 + b"]" * 65,
    b"[" * 100_000,
    b'"\\ud800"',
    b"1" * 5000,
    b"{} {}",
])
def test_load_document_refuses(source: bytes) -> None:
    """Non-UTF-8, broken JSON, duplicate keys, NaN, deep nesting and the like are refused."""
    with pytest.raises(DocumentError) as caught:
        load_document(source)
    assert "\n" not in caught.value.message


def test_load_document_limits_are_configurable() -> None:
    """The size and depth limits apply as given."""
    with pytest.raises(DocumentError):
        load_document(b'"' + b"a" * 100 + b'"', max_bytes=50)
    assert load_document(b"[[[1]]]", max_depth=3) == [[[1]]]
    with pytest.raises(DocumentError):
        load_document(b"[[[1]]]", max_depth=2)


@pytest.mark.spec("DOC-1")
@pytest.mark.parametrize(("source", "named"), [
    (b"\xff\xfe{}", "utf-8"),
    (b'{"a": 1', "json"),
    (b'{"a": 1, "a": 2}', "duplicate"),
    (b'{"a": NaN}', "nan"),
    (b"[-Infinity]", "infinity"),
    (b"[" * 65 + b"]" * 65, "64"),
    (b'"' + b"a" * (8 * 1024 * 1024 - 2) + b'" ', "8 mib"),
])
def test_unreadable_input_is_one_error_naming_its_problem(source: bytes, named: str) -> None:
    """Each way input fails to be a document gives one single-line error that says which."""
    with pytest.raises(DocumentError) as caught:
        load_document(source)
    assert named in caught.value.message.lower()
    assert "\n" not in caught.value.message


@pytest.mark.spec("DOC-1")
def test_default_limits_admit_64_levels_and_8_mib() -> None:
    """Exactly 64 levels of nesting and exactly 8 MiB read with the default limits."""
    deepest: Any = []
    for _ in range(63):
        deepest = [deepest]
    assert load_document(b"[" * 64 + b"]" * 64) == deepest
    big = b'"' + b"a" * (8 * 1024 * 1024 - 2) + b'"'
    assert len(load_document(big)) == 8 * 1024 * 1024 - 2


def test_to_plain_copies_and_refuses() -> None:
    """to_plain turns tuples into lists and refuses what JSON cannot hold."""
    source = {"a": (1, 2.5, "x", None, True)}
    assert to_plain(source) == {"a": [1, 2.5, "x", None, True]}
    for bad in ({"a": b"x"}, {1: "a"}, {"a": float("nan")}, {"a": object()}, {"a": {1, 2}},
                {"a": 10 ** 5000}):
        with pytest.raises(DocumentError):
            to_plain(bad)
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises(DocumentError):
        to_plain(loop)


def test_checks_never_change_their_input() -> None:
    """Checking a document leaves the caller's data as it was."""
    doc = make_report()
    before = copy.deepcopy(doc)
    list(iter_report_findings(doc, make_order(), make_calls()))
    assert doc == before


def test_json_equal() -> None:
    """JSON equality tells booleans from numbers and compares nested values."""
    assert json_equal({"a": [1, {"b": 2.0}]}, {"a": [1.0, {"b": 2}]})
    assert not json_equal(True, 1)
    assert not json_equal(0, False)
    assert not json_equal({"a": None}, {})
    assert not json_equal([1], [1, 2])
    assert not json_equal("1", 1)
    assert json_equal(None, None)


# ----------------------------------------------------------------------------- schemas

def test_every_schema_loads_and_is_cached() -> None:
    """Each document type has a 2020-12 schema with an $id, compiled once."""
    for name in SCHEMA_NAMES:
        schema = load_schema(name)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert schema["$id"].startswith("https://")
        assert validator(name) is validator(name)
    assert load_schema("order") is not load_schema("order")
    with pytest.raises(KeyError):
        load_schema("memo")


def test_schema_findings_carry_pointers() -> None:
    """Schema findings point at the member that broke the schema, under the given rule id."""
    found = list(schema_findings("order", make_order(criteria=[{"id": "", "text": "x"}]), "O1"))
    assert pairs(found) == {("O1", "/criteria/0/id")}
