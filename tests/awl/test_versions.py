"""awl.documents.versions: the version a document is written under, and its published form.

The cross-implementation test (tests/test_published_awl.py) checks these against the
published package; here each function's own promises are pinned one by one.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from awl.documents.checks import iter_order_findings, iter_report_findings
from awl.documents.versions import (
    EXTENSION,
    READS,
    from_published,
    order_spec_for,
    report_spec_for,
    spec_for,
    to_published,
    uses_extensions,
)

CASES = Path(__file__).resolve().parents[2] / "conformance" / "cases"

ORDER: dict[str, Any] = {
    "spec": "awl/work-order@0.1", "id": "wo_v", "created_at": "2026-12-07T09:00:00Z",
    "from": "human:ana", "to": "agent:clerk", "goal": "Count the rows",
    "criteria": [{"id": "c1", "text": "The count"}, {"id": "c2", "text": "The file"}],
    "budget": {"tool_calls": 5}, "deadline": "2026-12-08T09:00:00Z", "tools": ["db/*"],
}
REPORT: dict[str, Any] = {
    "spec": "awl/work-report@0.1", "order_id": "wo_v", "from": "agent:clerk",
    "status": "done", "started_at": "2026-12-07T09:10:00Z",
    "finished_at": "2026-12-07T09:20:00Z", "result": {"summary": "42 rows"},
    "evidence": [{"criterion": "c1", "type": "note", "note": "counted"},
                 {"criterion": "c2", "type": "note", "note": "written"}],
    "cost": {"tool_calls": 2}, "tools_used": ["db/query"],
}
CHECK = {"kind": "json_path_equals", "path": "/result/summary", "value": "42 rows"}


def with_(doc: dict[str, Any], **members: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out.update(members)
    return out


# --------------------------------------------------------------------------- versions

@pytest.mark.parametrize(("members", "spec"), [
    ({}, "awl/work-order@0.1"),
    ({"handoff": {"summary": "so far"}}, "awl/work-order@0.2"),
    ({"continues": "wo_before"}, "awl/work-order@0.3"),
    ({"continues": "wo_before", "handoff": {"summary": "so far"}}, "awl/work-order@0.3"),
    ({"staged": ["db/write"]}, "awl/work-order@0.4"),
    ({"staged": [], "continues": "wo_before"}, "awl/work-order@0.4"),  # empty still uses it
    ({"staged": None, "continues": None, "handoff": None}, "awl/work-order@0.1"),
])
def test_an_order_is_written_under_the_lowest_version_that_has_its_members(
        members: dict[str, Any], spec: str) -> None:
    order = with_(ORDER, **members)
    assert order_spec_for(order) == spec
    assert spec_for(order, "order") == spec
    assert spec.split("@")[1] in READS["order"]


@pytest.mark.parametrize(("members", "spec"), [
    ({}, "awl/work-report@0.1"),
    ({"handoff": {"summary": "so far"}}, "awl/work-report@0.2"),
    ({"effects": []}, "awl/work-report@0.3"),
    ({"effects": [], "handoff": {"summary": "so far"}}, "awl/work-report@0.3"),
    ({"effects": None, "handoff": None}, "awl/work-report@0.1"),
])
def test_a_report_is_written_under_the_lowest_version_that_has_its_members(
        members: dict[str, Any], spec: str) -> None:
    report = with_(REPORT, **members)
    assert report_spec_for(report) == spec
    assert spec_for(report, "report") == spec
    assert spec.split("@")[1] in READS["report"]


def test_the_versions_read_are_the_published_ones() -> None:
    assert READS == {"order": ("0.1", "0.2", "0.3", "0.4"), "report": ("0.1", "0.2", "0.3"),
                     "pass": ("0.1", "0.2", "0.3")}


# --------------------------------------------------------------------------- published form

def test_a_document_without_extensions_is_its_own_published_form() -> None:
    for doc in (ORDER, REPORT, with_(ORDER, handoff={"summary": "s"}), [1], "text", None):
        assert to_published(doc) is doc
        assert from_published(doc) is doc
        assert not uses_extensions(doc)


def test_a_check_moves_to_x_awl_by_criterion_id_and_back() -> None:
    order = copy.deepcopy(ORDER)
    order["criteria"][1]["check"] = CHECK
    before = copy.deepcopy(order)
    out = to_published(order)
    assert order == before  # the input is never changed
    assert uses_extensions(order)
    assert out["criteria"] == [{"id": "c1", "text": "The count"}, {"id": "c2", "text": "The file"}]
    assert out[EXTENSION] == {"checks": {"c2": CHECK}}
    assert out["spec"] == "awl/work-order@0.1"
    assert from_published(out) == order


def test_handoff_extras_move_and_an_emptied_handoff_goes_with_them() -> None:
    extras = {"next_steps": ["send it"], "files": [{"path": "rows.csv"}]}
    report = with_(REPORT, handoff=dict(extras))
    assert report_spec_for(report) == "awl/work-report@0.2"
    out = to_published(report)
    assert "handoff" not in out  # a published handoff is never empty
    assert out[EXTENSION] == {"handoff": extras}
    assert out["spec"] == "awl/work-report@0.1"  # still the lowest that fits (DOC-6)
    back = from_published(out)
    assert back["handoff"] == extras and EXTENSION not in back


def test_handoff_extras_leave_the_published_members_in_place() -> None:
    order = with_(ORDER, spec="awl/work-order@0.2",
                  handoff={"summary": "half done", "next_steps": ["finish"]})
    out = to_published(order)
    assert out["handoff"] == {"summary": "half done"}
    assert out[EXTENSION] == {"handoff": {"next_steps": ["finish"]}}
    assert out["spec"] == "awl/work-order@0.2"
    assert from_published(out) == order


def test_a_version_chosen_above_the_lowest_is_kept() -> None:
    """Only a version that was the lowest to fit is lowered; one the writer chose stays."""
    report = with_(REPORT, spec="awl/work-report@0.3", handoff={"next_steps": ["go on"]})
    assert to_published(report)["spec"] == "awl/work-report@0.3"


def test_members_already_in_x_awl_are_kept_beside_the_moved_ones() -> None:
    order = copy.deepcopy(ORDER)
    order["criteria"][0]["check"] = CHECK
    order[EXTENSION] = {"origin": "desk-7"}
    out = to_published(order)
    assert out[EXTENSION] == {"origin": "desk-7", "checks": {"c1": CHECK}}
    back = from_published(out)
    assert back == order


def test_a_check_already_on_its_criterion_is_not_overwritten() -> None:
    order = copy.deepcopy(ORDER)
    order["criteria"][0]["check"] = CHECK
    other = {"kind": "json_path_equals", "path": "/status", "value": "done"}
    order[EXTENSION] = {"checks": {"c1": other, "c9": other}}
    back = from_published(order)
    assert back["criteria"][0]["check"] == CHECK
    assert back[EXTENSION] == {"checks": {"c1": other, "c9": other}}  # nowhere to put them


def test_a_handoff_member_already_there_is_not_overwritten() -> None:
    report = with_(REPORT, handoff={"summary": "s", "next_steps": ["mine"]})
    report[EXTENSION] = {"handoff": {"next_steps": ["theirs"], "files": [{"path": "a"}],
                                     "colour": "red"}}
    back = from_published(report)
    assert back["handoff"] == {"summary": "s", "next_steps": ["mine"], "files": [{"path": "a"}]}
    assert back[EXTENSION] == {"handoff": {"next_steps": ["theirs"], "colour": "red"}}


@pytest.mark.parametrize("carried", [
    "a string", ["a", "list"], 7, {"checks": "not a map"}, {"handoff": ["not", "a", "map"]},
    {"other": 1},
])
def test_an_x_awl_of_another_shape_is_left_as_it_is(carried: Any) -> None:
    doc = with_(ORDER, **{EXTENSION: carried})
    assert from_published(doc) is doc


def test_checks_are_not_put_back_into_criteria_that_are_not_a_list() -> None:
    doc = with_(ORDER, criteria="nonsense", **{EXTENSION: {"checks": {"c1": CHECK}}})
    assert from_published(doc) is doc


# --------------------------------------------------------------------------- every case

def case_documents() -> Iterator[tuple[str, str, dict[str, Any], dict[str, Any] | None]]:
    """(name, type, document, its order) for every order and report of the conformance cases."""
    for path in sorted(CASES.glob("*.json")):
        for group in json.loads(path.read_text(encoding="utf-8")):
            if group["type"] not in ("order", "report"):
                continue
            for test in group["tests"]:
                context = {**group.get("context", {}), **test.get("context", {})}
                if isinstance(test.get("document"), dict):
                    yield (test["description"], group["type"], test["document"],
                           context.get("order"))

def test_every_conformance_document_survives_the_round_trip_with_the_same_findings() -> None:
    """For every order and report of the conformance cases: its published form read back is
    the document as this specification keeps it (its version aside, when an emptied handoff
    lowered it), and the checks find the same in the published form as in the document."""
    seen = 0
    for name, kind, doc, order in case_documents():
        ours = from_published(doc)  # some cases are written in published form already
        out = to_published(ours)
        assert from_published(out) == ours or (  # spec aside, as above
            {k: v for k, v in from_published(out).items() if k != "spec"}
            == {k: v for k, v in ours.items() if k != "spec"}), name
        if kind == "order":
            found = [(f.rule, f.path) for f in iter_order_findings(doc)]
            again = [(f.rule, f.path) for f in iter_order_findings(out)]
        elif order is not None:
            found = [(f.rule, f.path) for f in iter_report_findings(doc, order)]
            again = [(f.rule, f.path) for f in iter_report_findings(out, order)]
        else:
            continue
        assert again == found, name
        seen += 1
    assert seen > 100
