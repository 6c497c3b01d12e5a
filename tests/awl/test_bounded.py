"""Schemas from outside never run away (DOC-16): RE2 patterns, bounded work, every door.

Issue 23 items 1 and 3: a backtracking pattern and a repetition count too large to compile,
through the library, ``awl validate``, ``awl order create``, the desk's MCP tools and the
gateway's check of a held call's arguments.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

import awl.documents.bounded
from awl.desk import Desk as LibraryDesk
from awl.documents.bounded import SchemaTooCostly, bounded_errors, bounded_validator
from awl.documents.checks import iter_order_findings, iter_report_findings
from awl.store.sqlite import SQLiteStore
from gateway._staging import check_arguments
from tests.awl.server_support import MANAGER, WORKER, order_fields, serve_as
from tests.awl.test_checks import make_order, make_report
from tests.gateway.gateway_support import connect, make_env

BACKTRACKS = {"type": "string", "pattern": "(a+)+$"}
EVIL_OUTPUT = "a" * 40 + "!"
HUGE_REPEAT = "a{99999999999}"


def _findings(found: Any) -> list[tuple[str, str]]:
    return [(f.rule, f.path) for f in found]


def _awl(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "awl", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, check=False)


@pytest.mark.spec("DOC-16", "R11")
def test_a_backtracking_pattern_is_judged_in_linear_time() -> None:
    order = make_order(output_schema=BACKTRACKS)
    assert list(iter_order_findings(order)) == []
    started = time.monotonic()
    found = list(iter_report_findings(
        make_report(result={"summary": "x", "output": EVIL_OUTPUT}), order))
    assert _findings(found) == [("R11", "/result/output")]
    long_text = "a" * 200_000 + "!"
    found = list(iter_report_findings(
        make_report(result={"summary": "x", "output": long_text}), order))
    assert _findings(found) == [("R11", "/result/output")]
    assert time.monotonic() - started < 2
    ok = make_report(result={"summary": "x", "output": "a" * 40})
    assert list(iter_report_findings(ok, order)) == []


@pytest.mark.spec("DOC-16", "O4")
@pytest.mark.parametrize(("pattern", "says"), [
    (HUGE_REPEAT, "repetition count 99999999999 is above the 1000 allowed"),
    ("a{2,1001}", "repetition count 1001"),
    ("(?=a)b", "look-around"),
    ("(a)\\1", "back-references"),
])
def test_patterns_re2_cannot_run_are_o4_findings(pattern: str, says: str) -> None:
    for schema in ({"type": "string", "pattern": pattern},
                   {"type": "object", "patternProperties": {pattern: {}}},
                   {"items": {"properties": {"x": {"pattern": pattern}}}}):
        found = list(iter_order_findings(make_order(output_schema=schema)))
        assert _findings(found) == [("O4", "/output_schema")], schema
        assert says in found[0].message


@pytest.mark.spec("DOC-16", "R11")
def test_ecma_escapes_and_literal_braces_keep_their_meaning() -> None:
    order = make_order(output_schema={"type": "string", "pattern": "^\\u00e9{2}[{]x\\{3}$"})
    assert list(iter_order_findings(order)) == []
    good = make_report(result={"summary": "x", "output": "éé{x{3}"})
    assert list(iter_report_findings(good, order)) == []
    bad = make_report(result={"summary": "x", "output": "ee{x{3}"})
    assert _findings(iter_report_findings(bad, order)) == [("R11", "/result/output")]


def _exponential_refs(depth: int) -> dict[str, Any]:
    defs: dict[str, Any] = {
        f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]}
        for i in range(depth)}
    defs[f"d{depth}"] = {"type": "number"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


@pytest.mark.slow
@pytest.mark.spec("DOC-16", "R11")
def test_a_schema_whose_work_doubles_per_level_stops_at_its_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    schema = _exponential_refs(60)  # 2**60 applications unbounded
    validator = bounded_validator(schema)
    started = time.monotonic()
    with pytest.raises(SchemaTooCostly, match="more than 5,000 steps"):
        bounded_errors(validator, "text", steps=5000)
    with pytest.raises(SchemaTooCostly, match=r"more than 0\.2 s"):
        bounded_errors(validator, "text", steps=10**12, seconds=0.2)
    assert time.monotonic() - started < 3
    # Through the report check: R11 says the schema is too costly, the order stays valid.
    monkeypatch.setattr(awl.documents.bounded, "MAX_SCHEMA_STEPS", 20_000)
    order = make_order(output_schema=schema)
    assert list(iter_order_findings(order)) == []
    found = list(iter_report_findings(make_report(result={"summary": "x", "output": "s"}),
                                      order))
    assert _findings(found) == [("R11", "/result/output")]
    assert "too costly to apply" in found[0].message and "20,000 steps" in found[0].message


@pytest.mark.slow
@pytest.mark.spec("DOC-16", "R11")
def test_unique_items_is_not_quadratic_and_keeps_json_equality(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted, not timed: each item's canonical form is made once (a handful of calls per
    item, however many items), and jsonschema's pairwise comparison is never reached."""
    import importlib

    from awl.documents import bounded

    order = make_order(output_schema={"type": "array", "uniqueItems": True})

    def judged(output: Any) -> list[tuple[str, str]]:
        return _findings(iter_report_findings(
            make_report(result={"summary": "x", "output": output}), order))

    made = 0
    canonical = bounded._canonical

    def counted(value: Any) -> Any:
        nonlocal made
        made += 1
        return canonical(value)

    def pairwise(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("uniqueItems compared every pair")

    monkeypatch.setattr(bounded, "_canonical", counted)
    monkeypatch.setattr(importlib.import_module("jsonschema._utils"), "uniq", pairwise)
    items = 20_000
    assert judged([{"n": i, "tags": [i, str(i)]} for i in range(items)]) == []
    assert items <= made <= 6 * items  # the item, its two members, the list and its two
    assert judged([{"a": 1, "b": [1.0]}, {"b": [1], "a": 1.0}]) == [("R11", "/result/output")]
    assert judged([1, True, "1", [1], {"1": 1}, None, False, 0]) == []


@pytest.mark.slow
@pytest.mark.spec("DOC-16", "GW-9")
def test_a_held_calls_arguments_meet_the_upstream_schema_in_bounded_time() -> None:
    schema = {"type": "object", "properties": {"q": BACKTRACKS}}
    started = time.monotonic()
    problems = check_arguments({"q": EVIL_OUTPUT}, schema, earlier={})
    assert len(problems) == 1 and problems[0].startswith("/q: ")
    assert time.monotonic() - started < 1
    # An upstream schema with a pattern RE2 refuses is the upstream's own mistake: not
    # judged here (the upstream judges the call), and never a crash.
    broken = {"type": "object", "properties": {"q": {"type": "string", "pattern": HUGE_REPEAT}}}
    assert check_arguments({"q": "a"}, broken, earlier={}) == []
    refs = _exponential_refs(60)
    costly = {"type": "object", "properties": {"q": {"$ref": refs["$ref"]}},
              "$defs": refs["$defs"]}
    problems = check_arguments({"q": "text"}, costly, earlier={})
    assert len(problems) == 1 and "too costly to check" in problems[0]


# ----------------------------------------------------------------------------- the CLI

@pytest.mark.slow
@pytest.mark.spec("DOC-16", "O4", "R11", "BIND-1")
def test_awl_validate_and_order_create_judge_bad_patterns_quickly(tmp_path: Path) -> None:
    order_path = tmp_path / "order.json"
    order_path.write_text(json.dumps(make_order(output_schema=BACKTRACKS)))
    report_path = tmp_path / "report.json"
    report_path.write_text(json.dumps(make_report(result={"summary": "x",
                                                           "output": EVIL_OUTPUT})))
    started = time.monotonic()
    result = _awl("validate", report_path, "--order", order_path, timeout=20)
    assert result.returncode == 1 and "R11" in result.stdout
    assert "Traceback" not in result.stderr

    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps(make_order(output_schema={"type": "string",
                                                          "pattern": HUGE_REPEAT})))
    result = _awl("validate", huge, timeout=20)
    assert result.returncode == 1 and "O4" in result.stdout and "repetition count" in result.stdout
    assert "Traceback" not in result.stderr

    fields = order_fields(output_schema={"type": "string", "pattern": HUGE_REPEAT})
    create = tmp_path / "create.json"
    create.write_text(json.dumps(fields))
    result = _awl("order", "create", create, "--as", MANAGER, "--home", tmp_path / "home",
                  timeout=20)
    assert result.returncode != 0
    assert "O4" in result.stderr + result.stdout and "Traceback" not in result.stderr
    assert time.monotonic() - started < 30


# ----------------------------------------------------------------------------- the desk

EVIL_REPORT = {"status": "done", "result": {"summary": "done", "output": EVIL_OUTPUT},
               "evidence": [{"criterion": "c1", "type": "note", "note": "written"},
                            {"criterion": "c2", "type": "note", "note": "sent"}],
               "cost": {"usd": 1, "tool_calls": 1}, "tools_used": []}


def _working_order(tmp_path: Path) -> tuple[Path, str]:
    """A desk home with a working order whose output_schema backtracks."""
    home = tmp_path / "home"
    home.mkdir()
    store = SQLiteStore(home / "desk.sqlite3")
    try:
        desk = LibraryDesk(store)
        view = desk.create(order_fields(output_schema=BACKTRACKS), MANAGER)
        desk.accept(view.id, WORKER)
        desk.start(view.id, WORKER)
        return home, view.id
    finally:
        store.close()


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.spec("DOC-16", "SEC-4", "O4", "R11")
async def test_the_backtracking_report_never_freezes_awl_serve(tmp_path: Path) -> None:
    """Issue 23's check: the report goes to a running `awl serve`, and another call on the
    same connection answers within a second; `a{99999999999}` is an O4 refusal."""
    home, order_id = _working_order(tmp_path)
    report = EVIL_REPORT
    answered: dict[str, float] = {}
    with anyio.fail_after(60):
        async with serve_as(home, WORKER, "legacy") as w:
            await w.call("list_work_orders")  # the server is up

            async def submit() -> None:
                refused = await w.refused("submit_work_report", order_id=order_id,
                                          report=report)
                assert refused["code"] == "VALIDATION_FAILED"
                assert [f["rule"] for f in refused["findings"]] == ["R11"]
                answered["submit"] = time.monotonic()

            async def meanwhile() -> None:
                await anyio.sleep(0.05)
                asked = time.monotonic()
                await w.call("get_work_order", order_id=order_id)
                answered["other"] = time.monotonic() - asked

            async with anyio.create_task_group() as tg:
                tg.start_soon(submit)
                tg.start_soon(meanwhile)
            assert answered["other"] < 1.0

            refused = await w.refused(
                "create_work_order",
                order={**order_fields(to=MANAGER), "output_schema": {"pattern": HUGE_REPEAT}})
            assert refused["code"] == "VALIDATION_FAILED"
            assert [f["rule"] for f in refused["findings"]] == ["O4"]


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.spec("DOC-16", "SEC-4", "R11", "GW-11")
async def test_the_backtracking_report_never_stalls_the_gateway(tmp_path: Path) -> None:
    """awl_submit_report with the backtracking output: refused at once (R11), and the
    gateway's other tools answer meanwhile."""
    env = make_env(tmp_path, output_schema=BACKTRACKS)
    answered: dict[str, float] = {}
    try:
        with anyio.fail_after(60):
            async with connect(env) as (_, client):
                async def submit() -> None:
                    result = await client.call_tool("awl_submit_report", {"report": {
                        "status": "done", "result": {"summary": "done", "output": EVIL_OUTPUT},
                        "evidence": [{"criterion": "c1", "type": "note", "note": "answered"}],
                        "cost": {"tool_calls": 0, "usd": 0}, "tools_used": []}})
                    assert result.is_error and "R11" in str(result.content)

                async def meanwhile() -> None:
                    await anyio.sleep(0.05)
                    asked = time.monotonic()
                    assert not (await client.call_tool("awl_get_order", {})).is_error
                    answered["other"] = time.monotonic() - asked

                async with anyio.create_task_group() as tg:
                    tg.start_soon(submit)
                    tg.start_soon(meanwhile)
        assert answered["other"] < 1.0
        assert env.view().state == "working"
    finally:
        env.store.close()


@pytest.mark.slow
@pytest.mark.spec("DOC-16", "R11", "SEC-4")
def test_awl_work_report_refuses_the_backtracking_report_at_once(tmp_path: Path) -> None:
    home, order_id = _working_order(tmp_path)
    report = tmp_path / "report.json"
    report.write_text(json.dumps(EVIL_REPORT))
    result = _awl("work", "report", order_id, report, "--as", WORKER, "--home", home, timeout=20)
    assert result.returncode != 0 and "R11" in result.stderr + result.stdout
    assert "Traceback" not in result.stderr
