"""Property tests: generated valid documents pass and round-trip; any mutation is judged calmly."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from awl import AWLError, DocumentError, WorkOrder, WorkReport
from awl.documents.checks import (
    check,
    iter_call_findings,
    iter_event_findings,
    iter_order_findings,
    iter_report_findings,
    iter_review_findings,
    iter_suborder_findings,
    load_document,
)
from tests.awl.test_checks import (
    make_call,
    make_calls,
    make_event,
    make_order,
    make_report,
    make_review,
)

pytestmark = pytest.mark.slow

FAST = settings(max_examples=120, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_.-", min_size=1, max_size=8)
words = st.text(min_size=1, max_size=20).filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF
                                                                   for c in s))
principals = st.builds(lambda kind, who: f"{kind}:{who}", st.sampled_from(["agent", "human"]),
                       names)
moments = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2090, 1, 1),
                       timezones=st.just(UTC))
offsets = st.sampled_from([0, 2, -5, 9])


def stamp(moment: datetime, hours: int) -> str:
    if hours == 0:
        moment = moment.astimezone(UTC)
        return moment.strftime("%Y-%m-%dT%H:%M:%S") + (
            f".{moment.microsecond:06d}" if moment.microsecond else "") + "Z"
    return moment.astimezone(timezone(timedelta(hours=hours))).isoformat()


def tool_for(pattern: str, name: str) -> str:
    if pattern == "*":
        return f"any/{name}"
    if pattern.endswith("/*"):
        return f"{pattern[:-2]}/{name}"
    return pattern


@st.composite
def orders(draw: st.DrawFn) -> dict[str, Any]:
    created = draw(moments)
    deadline = created + draw(st.timedeltas(min_value=timedelta(seconds=1),
                                           max_value=timedelta(days=400)))
    servers = draw(st.lists(names, min_size=1, max_size=3, unique=True))
    tools = [draw(st.sampled_from([f"{s}/*", f"{s}/{draw(names)}"])) for s in servers]
    if draw(st.booleans()):
        tools.append("*")
    staged = [tool_for(p, draw(names)) for p in draw(st.lists(st.sampled_from(tools),
                                                              max_size=2))]
    ids = draw(st.lists(names, min_size=1, max_size=4, unique=True))
    units = draw(st.lists(st.sampled_from(["usd", "tokens", "tool_calls", "seconds"]),
                          min_size=1, max_size=4, unique=True))
    budget: dict[str, Any] = {}
    for unit in units:
        budget[unit] = (draw(st.integers(0, 10**9)) if unit in ("tokens", "tool_calls")
                        else draw(st.one_of(st.integers(0, 10**6),
                                            st.floats(0, 1e6, allow_nan=False))))
    doc: dict[str, Any] = {
        "spec": draw(st.sampled_from(["awl/work-order@0.1", "awl/work-order@0.2",
                                      "awl/work-order@0.3"])),
        "id": draw(names),
        "created_at": stamp(created, draw(offsets)),
        "from": draw(principals),
        "to": draw(principals),
        "goal": draw(words),
        "criteria": [{"id": i, "text": draw(words)} for i in ids],
        "budget": budget,
        "deadline": stamp(deadline, draw(offsets)),
        "tools": tools,
    }
    if staged:
        doc["staged"] = staged
    if draw(st.booleans()):
        doc["escalate_to"] = draw(principals)
    if draw(st.booleans()):
        doc["inputs"] = {"n": draw(st.integers()), "tags": draw(st.lists(words, max_size=3))}
    if draw(st.booleans()):
        doc["context"] = [{"uri": "https://example.com/a", "note": draw(words)}]
    if draw(st.booleans()):
        doc["handoff"] = {"summary": draw(words), "decisions": [{"text": draw(words)}]}
    if draw(st.booleans()):
        doc["output_schema"] = {"type": "object", "required": ["n"]}
    if draw(st.booleans()):
        doc["parent_id"] = doc["id"] + "-p"
    if draw(st.booleans()):
        doc["continues"] = doc["id"] + "-c"
    if draw(st.booleans()):
        doc["x-team"] = draw(words)
    return doc


@st.composite
def order_and_report(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    order = draw(orders())
    created = datetime.fromisoformat(order["created_at"].replace("Z", "+00:00"))
    deadline = datetime.fromisoformat(order["deadline"].replace("Z", "+00:00"))
    finished = created + (deadline - created) * draw(st.floats(0, 1))
    started = created + (finished - created) * draw(st.floats(0, 1))
    tools_used = sorted({tool_for(p, draw(names)) for p in draw(
        st.lists(st.sampled_from(order["tools"]), max_size=3))})
    status = draw(st.sampled_from(["done", "blocked", "failed"]))
    evidence = [{"criterion": c["id"], "type": draw(st.sampled_from(["note", "citation"]))}
                for c in order["criteria"]]
    if tools_used:
        evidence.append({"criterion": order["criteria"][0]["id"], "type": "tool_call",
                         "ref": f"{tools_used[0]}#{draw(st.integers(1, 999))}"})
    cost: dict[str, Any] = {}
    for unit, limit in order["budget"].items():
        part = draw(st.floats(0, 1))
        cost[unit] = int(limit * part) if isinstance(limit, int) else limit * part
    doc: dict[str, Any] = {
        "spec": "awl/work-report@" + order["spec"].rsplit("@", 1)[1],
        "order_id": order["id"],
        "from": order["to"],
        "status": status,
        "result": {"summary": draw(words)},
        "evidence": evidence,
        "cost": cost,
        "finished_at": stamp(finished, 0),
        "started_at": stamp(started, draw(offsets)),
        "tools_used": tools_used,
        "attempt": draw(st.integers(1, 5)),
    }
    if status == "done" and "output_schema" in order:
        doc["result"]["output"] = {"n": draw(st.integers())}
    if status == "blocked":
        doc["questions"] = [draw(words)]
    if status == "failed":
        doc["error"] = draw(words)
    effects = [{"ref": f"{tool}#{n}", "tool": tool, "arguments": {"i": n}}
               for n, tool in enumerate(order.get("staged", []), start=1)]
    if effects:
        doc["effects"] = effects
    return order, doc


@FAST
@given(orders())
def test_generated_orders_pass_and_round_trip(order: dict[str, Any]) -> None:
    """A generated valid order has no findings and its model dumps back to the same JSON."""
    assert list(iter_order_findings(order)) == []
    assert WorkOrder.model_validate(order).to_json() == order


@FAST
@given(order_and_report())
def test_generated_reports_pass_and_round_trip(pair: tuple[dict[str, Any], dict[str, Any]]
                                               ) -> None:
    """A generated valid report has no findings against its order and round-trips."""
    order, report = pair
    assert list(iter_report_findings(report, order)) == []
    assert WorkReport.model_validate(report).to_json() == report


# ----------------------------------------------------------------------------- mutations

def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


json_leaves = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30)
               | st.sampled_from(["awl/work-order@9.9", "2026-02-30T00:00:00Z", "a/b#1", "*",
                                  "gmail/send", "", "done", "held", "x-extra"]))
_HOSTILE = (
    lambda: b"bytes", lambda: float("nan"), lambda: float("inf"), lambda: -float("inf"),
    lambda: 10 ** 5000, lambda: "x" * 200_000, lambda: _deep(200), lambda: _deep(63),
    lambda: {1: "int key"}, lambda: {("t",): 1}, lambda: frozenset({1}), lambda: object(),
    lambda: "\ud800", lambda: {"\udfff": 1}, lambda: (1, 2), lambda: 1 + 2j,
    lambda: Ellipsis, lambda: bytearray(b"x"), lambda: True, lambda: -(2 ** 80),
)
# Drawn by index and built late: hypothesis prints its strategies, and some of these refuse.
hostile = st.integers(0, len(_HOSTILE) - 1).map(lambda i: _HOSTILE[i]())
values = st.recursive(json_leaves | hostile,
                      lambda kids: st.lists(kids, max_size=3)
                      | st.dictionaries(st.text(max_size=8), kids, max_size=3),
                      max_leaves=8)


def mutate(doc: Any, data: st.DataObject) -> Any:
    """Apply a few random edits: replace, delete or add somewhere in the document."""
    doc = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(1, 3))):
        # Walk down a random path to a container, then edit one of its slots.
        node = doc
        while isinstance(node, dict | list) and node and data.draw(st.booleans()):
            key = data.draw(st.sampled_from(sorted(node) if isinstance(node, dict)
                                            else list(range(len(node)))))
            child = node[key]
            if not isinstance(child, dict | list):
                break
            node = child
        if isinstance(node, dict):
            action = data.draw(st.sampled_from(["set", "delete", "add"]))
            if node and action != "add":
                key = data.draw(st.sampled_from(sorted(node)))
                if action == "delete":
                    del node[key]
                else:
                    node[key] = data.draw(values)
            else:
                node[data.draw(st.text(max_size=8))] = data.draw(values)
        elif isinstance(node, list):
            replace: bool = data.draw(st.booleans())
            if node and replace:
                node[data.draw(st.integers(0, len(node) - 1))] = data.draw(values)
            else:
                node.append(data.draw(values))
        else:
            return data.draw(values)
    return doc


def judged(run: Any) -> None:
    """The run yields findings or raises one of the library's errors, nothing else."""
    try:
        found = list(run())
    except AWLError as exc:
        assert isinstance(exc, DocumentError), exc
        assert exc.message and "\n" not in exc.message
        return
    for finding in found:
        assert finding.kind in ("invalid", "limit")
        assert finding.path == "" or finding.path.startswith("/")
        assert len(finding.message) < 1000
        json.dumps(finding.to_dict())


MUTATE = settings(max_examples=250, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@MUTATE
@given(st.data())
def test_mutated_orders_are_judged(data: st.DataObject) -> None:
    """A randomly mutated order, alone or as a sub-order, yields findings or DocumentError."""
    doc = mutate(make_order(output_schema={"type": "object"}), data)
    judged(lambda: iter_order_findings(doc))
    judged(lambda: iter_suborder_findings(doc, make_order()))


@MUTATE
@given(st.data())
def test_mutated_reports_are_judged(data: st.DataObject) -> None:
    """A randomly mutated report, with its order and calls, yields findings or DocumentError."""
    order = make_order(output_schema={"type": "object", "properties": {"n": {"type": "integer"}}})
    doc = mutate(make_report(result={"summary": "s", "output": {"n": 1}}), data)
    judged(lambda: iter_report_findings(doc, order, make_calls()))


@MUTATE
@given(st.data())
def test_mutated_contexts_are_judged(data: st.DataObject) -> None:
    """A mutated order or call list given as context yields findings or DocumentError."""
    order = mutate(make_order(), data)
    calls = mutate(make_calls(), data)
    judged(lambda: iter_report_findings(make_report(), order, calls))


@MUTATE
@given(st.data())
def test_mutated_small_documents_are_judged(data: st.DataObject) -> None:
    """Mutated call records, events and reviews yield findings or DocumentError."""
    judged(lambda: iter_call_findings(mutate(make_call(), data)))
    judged(lambda: iter_event_findings(mutate(make_event(), data)))
    judged(lambda: iter_review_findings(mutate(make_review(), data)))
    judged(lambda: check(mutate(make_order(), data)))


@pytest.mark.spec("DOC-1")
@MUTATE
@given(st.binary(max_size=200) | st.text(max_size=200).map(lambda s: s.encode("utf-8",
                                                                                "surrogatepass")))
def test_random_bytes_are_read_or_refused(raw: bytes) -> None:
    """Arbitrary bytes either read as JSON or raise DocumentError with one line."""
    try:
        load_document(raw)
    except DocumentError as exc:
        assert "\n" not in exc.message


@pytest.mark.spec("DOC-1")
@MUTATE
@given(st.data())
def test_mutated_json_text_is_read_or_refused(data: st.DataObject) -> None:
    """A valid document's text, cut or spliced at random, reads or raises DocumentError."""
    text = json.dumps(make_report()).encode()
    cut = data.draw(st.integers(0, len(text)))
    junk = data.draw(st.binary(max_size=5))
    try:
        judged(lambda: check(load_document(text[:cut] + junk + text[cut + len(junk):]),
                             "report"))
    except DocumentError as exc:
        assert "\n" not in exc.message
