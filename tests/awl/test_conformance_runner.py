"""The conformance runner follows the runner contract of conformance/README.md."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from awl.documents import checks as _checks
from awl.documents import conformance as _conformance
from awl.documents.conformance import run_conformance, run_test
from awl.documents.errors import BadRequest
from awl.documents.schemas import conformance_dir
from tests.awl.test_checks import make_order, make_report


def suite(folder: Path, groups: list[dict[str, Any]]) -> Path:
    (folder / "cases").mkdir(parents=True, exist_ok=True)
    (folder / "cases" / "cases.json").write_text(json.dumps(groups), encoding="utf-8")
    return folder


def group(doc_type: str, tests: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"description": f"{doc_type} group", "spec": ["O1"], "type": doc_type,
            "tests": tests, **extra}


def single(doc_type: str, document: Any, findings: list[dict[str, str]],
           context: dict[str, Any] | None = None) -> Any:
    test = {"description": "t", "document": document, "findings": findings}
    return run_test(doc_type, test, context or {})


@pytest.mark.slow
@pytest.mark.spec("DOC-10")
def test_shipped_suite_passes() -> None:
    """Every shipped conformance test passes against this implementation."""
    run = run_conformance()
    failures = [f"{r.name}: {r.reason}" for r in run.results if r.status == "failed"]
    assert failures == []
    assert run.passed >= 150
    assert conformance_dir() is not None


@pytest.mark.slow
@pytest.mark.spec("DOC-10")
def test_every_case_of_the_repository_suite_runs_and_none_fails() -> None:
    """Running the repository's conformance folder runs every test of every case file once
    and reports 0 failed."""
    folder = Path(__file__).resolve().parents[2] / "conformance"
    expected = sorted(
        (f"cases/{path.name}", test["description"])
        for path in (folder / "cases").glob("*.json")
        for group in json.loads(path.read_text(encoding="utf-8"))
        for test in group["tests"])
    run = run_conformance(folder)
    assert sorted((r.file, r.name) for r in run.results) == expected
    assert [f"{r.name}: {r.reason}" for r in run.results if r.status == "failed"] == []
    assert run.failed == 0


def test_schema_rules_compare_by_rule_only() -> None:
    """A schema rule matches whatever its count and paths, but its presence must agree."""
    doc = make_order(goal="", budget={})
    assert single("order", doc, [{"rule": "O1", "path": "/nowhere"}]).passed
    assert single("order", doc, [{"rule": "O1"}]).passed
    missed = single("order", doc, [])
    assert missed.status == "failed"
    assert "unexpected O1" in missed.reason


def test_other_rules_compare_as_a_multiset() -> None:
    """Non-schema findings must match rule, path and count exactly."""
    report = make_report(evidence=[])
    context = {"order": make_order()}
    twice = [{"rule": "R4", "path": "/evidence"}] * 2
    assert single("report", report, twice, context).passed
    once = single("report", report, twice[:1], context)
    assert once.status == "failed"
    assert "unexpected R4 /evidence" in once.reason
    wrong_path = single("report", report, [{"rule": "R4", "path": "/x"}] * 2, context)
    assert "missing R4 /x, R4 /x" in wrong_path.reason


def test_context_merges_group_then_test(tmp_path: Path) -> None:
    """A test's context keys replace the group's, key by key."""
    other = make_order(id="wo_2")
    folder = suite(tmp_path, [group("report", [
        {"description": "group order", "document": make_report(), "findings": []},
        {"description": "test order", "document": make_report(), "context": {"order": other},
         "findings": [{"rule": "R2", "path": "/order_id"}]},
    ], context={"order": make_order()})])
    run = run_conformance(folder)
    assert (run.passed, run.failed) == (2, 0), run.to_json()


def test_skips_are_counted_with_their_reason(tmp_path: Path) -> None:
    """A test with skip is not run, is counted as skipped and keeps its reason."""
    folder = suite(tmp_path, [group("order", [
        {"description": "gap", "document": {}, "findings": [], "skip": "not yet"}])])
    run = run_conformance(folder / "cases" / "cases.json")
    assert run.summary() == "0 passed, 0 failed, 1 skipped"
    assert run.results[0].reason == "not yet"


def test_unreadable_or_malformed_case_file_fails(tmp_path: Path) -> None:
    """A case file that is not JSON, or not of the case format, counts as one failure."""
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "a.json").write_text("[{", encoding="utf-8")
    (tmp_path / "cases" / "b.json").write_text(json.dumps([{"tests": []}]), encoding="utf-8")
    run = run_conformance(tmp_path)
    assert [(r.file, r.status) for r in run.results] == [("cases/a.json", "failed"),
                                                         ("cases/b.json", "failed")]
    assert run.summary() == "0 passed, 2 failed"


def test_missing_folder_is_bad_request(tmp_path: Path) -> None:
    """A path that is neither a folder nor a case file is a BadRequest."""
    with pytest.raises(BadRequest):
        run_conformance(tmp_path / "none")
    with pytest.raises(BadRequest):
        run_conformance(tmp_path)


def test_errors_and_crashes_fail_the_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """An implementation that raises, or crashes, fails that test and the run goes on."""
    raised = single("report", make_report(), [], {"order": make_order(goal="")})
    assert raised.status == "failed"
    assert raised.reason.startswith("raised DocumentError")

    def broken(doc: Any) -> Any:
        raise TypeError("boom")

    monkeypatch.setattr(_conformance, "iter_order_findings", broken)
    crashed = single("order", make_order(), [])
    assert crashed.status == "failed"
    assert crashed.reason == "crashed with TypeError: boom"


def test_pass_cases_need_no_layer_above_the_documents(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass rules are document checks: with the pass package unimportable, pass cases
    still run and ``check`` still checks a pass (the layer contract keeps it so)."""
    monkeypatch.setitem(sys.modules, "awl.passes", None)
    result = single("pass", {}, [{"rule": "P1"}])
    assert result.status == "passed", result.reason
    assert {f.rule for f in _checks.check({"spec": "awl/delegation-pass@0.3"})} == {"P1"}
    with pytest.raises(BadRequest):
        _checks.check({"spec": "awl/delegation-pass@0.3"}, now="yesterday")


def test_unknown_group_type_fails() -> None:
    """A group type the runner does not know fails its tests."""
    assert single("memo", {}, []).status == "failed"
