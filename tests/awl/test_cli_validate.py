"""``awl validate`` and ``awl conformance`` as a user runs them: a real subprocess each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.awl.test_checks import make_child, make_order, make_report

pytestmark = pytest.mark.slow


def awl(*args: str | Path, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "awl", *map(str, args)], input=None
                          if stdin is None else stdin.decode("utf-8", "replace"),
                          capture_output=True, text=True, timeout=60, check=False)


def write(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def assert_one_line_error(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1
    assert len(result.stderr) < 400


def test_valid_document_exits_zero(tmp_path: Path) -> None:
    """A valid order prints FILE: valid and exits 0."""
    path = write(tmp_path / "order.json", make_order())
    result = awl("validate", path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{path}: valid"


@pytest.mark.spec("BIND-1")
def test_invalid_document_prints_findings_and_exits_one(tmp_path: Path) -> None:
    """An invalid order prints one line per finding (rule, kind, path) and exits 1."""
    path = write(tmp_path / "order.json", make_order(tools=["a/*"], staged=["b/c"]))
    result = awl("validate", path)
    assert result.returncode == 1
    assert result.stdout.startswith(f"{path}: O5 invalid /staged/0: ")


@pytest.mark.spec("BIND-1", "DOC-9")
def test_limit_findings_print_but_pass(tmp_path: Path) -> None:
    """A report over budget prints its R7 limit finding and still exits 0."""
    order = write(tmp_path / "order.json", make_order())
    report = write(tmp_path / "report.json", make_report(cost={"usd": 5, "tool_calls": 1}))
    result = awl("validate", report, "--order", order)
    assert result.returncode == 0, result.stdout
    assert f"{report}: R7 limit /cost/usd: " in result.stdout


@pytest.mark.spec("RX6")
def test_sub_reports_run_rx6(tmp_path: Path) -> None:
    """``--sub-reports`` gives the sub-orders' latest reports: a report stating fewer tokens
    than they did prints its RX6 limit finding (and still exits 0); without the option RX6
    does not run; a file that is not a list of reports is one line and a non-zero exit."""
    order = write(tmp_path / "order.json",
                  make_order(budget={"usd": 1, "tool_calls": 10, "tokens": 1000}))
    below = write(tmp_path / "below.json", [
        make_report(order_id=f"wo_1.{n}", cost={"tokens": n * 100}) for n in (2, 4)])
    report = write(tmp_path / "report.json",
                   make_report(cost={"usd": 0.2, "tool_calls": 2, "tokens": 599}))
    result = awl("validate", report, "--order", order, "--sub-reports", below)
    assert result.returncode == 0, result.stderr
    assert (f"{report}: RX6 limit /cost/tokens: tokens spent 599 is less than the 600 its "
            "sub-orders reported (200 in 'wo_1.2', 400 in 'wo_1.4')") in result.stdout
    assert awl("validate", report, "--order", order).stdout.strip() == f"{report}: valid"
    not_reports = write(tmp_path / "not-reports.json", {"reports": []})
    failed = awl("validate", report, "--order", order, "--sub-reports", not_reports)
    assert_one_line_error(failed)
    assert "sub_reports must be a list of work reports" in failed.stderr


@pytest.mark.spec("BIND-1")
def test_json_output(tmp_path: Path) -> None:
    """--json prints one array with each file's verdict and findings."""
    order = write(tmp_path / "order.json", make_order())
    child = write(tmp_path / "child.json", make_child(parent_id="wo_9"))
    good = write(tmp_path / "good.json", make_child())
    result = awl("validate", "--json", "--parent", order, child, good)
    assert result.returncode == 1
    out = json.loads(result.stdout)
    assert [r["valid"] for r in out] == [False, True]
    assert [(f["rule"], f["path"]) for f in out[0]["findings"]] == [("CX1", "/parent_id")]
    assert out[0]["findings"][0]["kind"] == "invalid"


@pytest.mark.spec("BIND-1")
def test_type_option_and_stdin(tmp_path: Path) -> None:
    """--type overrides detection, and - reads the document from stdin."""
    result = awl("validate", "--type", "report", "-", stdin=json.dumps(make_order()).encode())
    assert result.returncode == 1
    assert result.stdout.startswith("-: R1 invalid")


@pytest.mark.spec("BIND-1")
def test_the_type_comes_from_spec_never_from_the_file_name(tmp_path: Path) -> None:
    """A report saved as an order's file name and an order saved as a report's are each
    judged by their spec: the report by the R rules, the order valid on its own."""
    order = write(tmp_path / "wo_1.report.json", make_order())
    report = write(tmp_path / "wo_1.order.json", make_report(order_id="wo_9"))
    result = awl("validate", "--order", order, report, order)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{report}: R2 invalid /order_id: ")
    assert lines[1] == f"{order}: valid"


@pytest.mark.spec("DOC-1", "BIND-1")
@pytest.mark.parametrize("content", [
    bytes(range(256)) * 4,
    b'{"spec": "awl/work-order@0.3", "id": "wo',
    b'"' + b"x" * (10 * 1024 * 1024) + b'"',
    b"[" * 5000,
    b'{"a": NaN}',
    b"",
])
def test_garbage_is_one_line_and_nonzero(tmp_path: Path, content: bytes) -> None:
    """Binary, truncated, huge or deep input gives one line, a non-zero exit, no traceback."""
    path = tmp_path / "garbage.json"
    path.write_bytes(content)
    result = awl("validate", path)
    assert_one_line_error(result)
    assert str(path) in result.stderr


def test_huge_string_of_known_type_is_a_short_finding(tmp_path: Path) -> None:
    """A long JSON string checked as an order is one short O1 line."""
    path = tmp_path / "string.json"
    path.write_bytes(b'"' + b"x" * (2 * 1024 * 1024) + b'"')
    result = awl("validate", "--type", "order", path)
    assert result.returncode == 1
    assert "O1 invalid" in result.stdout
    assert len(result.stdout) < 400


@pytest.mark.spec("BIND-1")
def test_missing_file_and_bad_context(tmp_path: Path) -> None:
    """A missing file or an unreadable --order is one line and a non-zero exit."""
    assert_one_line_error(awl("validate", tmp_path / "missing.json"))
    report = write(tmp_path / "report.json", make_report())
    broken = tmp_path / "broken.json"
    broken.write_text("{", encoding="utf-8")
    assert_one_line_error(awl("validate", report, "--order", broken))
    invalid = write(tmp_path / "invalid.json", make_order(goal=""))
    assert_one_line_error(awl("validate", report, "--order", invalid))


def _suite(folder: Path, expected: list[dict[str, str]]) -> Path:
    (folder / "cases").mkdir(parents=True)
    write(folder / "cases" / "orders.json", [{
        "description": "criterion ids are unique", "spec": ["O2"], "type": "order",
        "tests": [
            {"description": "distinct ids", "document": make_order(), "findings": []},
            {"description": "a repeat", "findings": expected,
             "document": make_order(criteria=[{"id": "a", "text": "x"}] * 2)},
            {"description": "not yet", "document": {}, "findings": [], "skip": "a known gap"},
        ]}])
    return folder


def test_conformance_command(tmp_path: Path) -> None:
    """awl conformance prints failures and ends with the summary line; exit 1 on a failure."""
    good = awl("conformance", _suite(tmp_path / "good", [{"rule": "O2",
                                                            "path": "/criteria/1/id"}]))
    assert good.returncode == 0, good.stdout
    assert good.stdout.strip().splitlines()[-1] == "2 passed, 0 failed, 1 skipped"
    bad = awl("conformance", "-v", _suite(tmp_path / "bad", [{"rule": "O2", "path": "/x"}]))
    assert bad.returncode == 1
    lines = bad.stdout.strip().splitlines()
    assert lines[-1] == "1 passed, 1 failed, 1 skipped"
    assert any(line.startswith("FAIL a repeat") for line in lines)
    assert any(line.startswith("ok   distinct ids") for line in lines)
    as_json = json.loads(awl("conformance", "--json", tmp_path / "bad").stdout)
    assert (as_json["passed"], as_json["failed"], as_json["skipped"]) == (1, 1, 1)


def test_conformance_missing_folder(tmp_path: Path) -> None:
    """A folder that does not exist is one line and a non-zero exit."""
    assert_one_line_error(awl("conformance", tmp_path / "nowhere"))
