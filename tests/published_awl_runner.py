"""Runs the published AWL package (``agent-work-layer`` on PyPI, import ``agent_work_layer``)
for tests/test_published_awl.py, in the virtual environment that holds it (``.venv-published``,
which .ci/run makes). It never imports ``awl``: the two implementations meet only through
JSON.

Reads a JSON array of jobs on stdin and writes a JSON array of answers on stdout, one per job:

- ``{"op": "order", "doc"}``: the published order checks (O1-O5);
- ``{"op": "suborder", "doc", "parent"}``: the order checks, then, when O1 did not fire, the
  sub-order checks (C1-C3, C5);
- ``{"op": "report", "doc", "order"}``: the report checks (R1-R12, R14-R16);
- ``{"op": "spec_for", "type", "doc"}``: the version the published package would write;
- ``{"op": "write"}``: documents its own models write (see :func:`written`).

An answer is ``{"findings": [[rule, kind, path], ...]}``, ``{"spec": ...}``,
``{"documents": [...]}`` or ``{"error": "..."}`` (the package raised).
"""

from __future__ import annotations

import importlib
import json
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

awl_pub: Any = importlib.import_module("agent_work_layer")


def _findings(found: list[Any]) -> dict[str, Any]:
    return {"findings": [[f.rule, f.kind, f.path] for f in found]}


def run(job: dict[str, Any]) -> dict[str, Any]:
    op = job["op"]
    if op == "order":
        return _findings(awl_pub.validate_order(job["doc"]))
    if op == "suborder":
        found = awl_pub.validate_order(job["doc"])
        if not any(f.rule == "O1" for f in found):
            found += awl_pub.validate_child_order(job["doc"], job["parent"])
        return _findings(found)
    if op == "report":
        return _findings(awl_pub.validate_report(job["doc"], job["order"]))
    if op == "spec_for":
        pick = awl_pub.order_spec_for if job["type"] == "order" else awl_pub.report_spec_for
        return {"spec": pick(job["doc"])}
    if op == "write":
        return {"documents": written()}
    return {"error": f"unknown op {op!r}"}


def written() -> list[dict[str, Any]]:
    """Orders and reports the published models write, each with the versions they pick:
    ``{"type": "order", "doc"}`` or ``{"type": "report", "doc", "order": i}`` (``i`` the index
    of the order it answers in this list)."""
    m = awl_pub
    now = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
    later = now + timedelta(hours=8)
    criteria = [m.Criterion(id="c1", text="The three largest risks, each quoted"),
                m.Criterion(id="c2", text="Every quote has its section")]
    base: dict[str, Any] = {
        "created_at": now, "from_": "human:ana", "to": "agent:researcher",
        "goal": "Summarize the risk factors of the 2025 annual report", "criteria": criteria,
        "budget": {"usd": 2, "tool_calls": 20}, "deadline": later, "tools": ["filings/*"]}
    handoff = m.Handoff(summary="Sections 1A and 7 read", decisions=[
        m.Decision(text="Quote the 10-K, not the press release", why="it is the filing")],
        tried=[m.Attempt(text="search for 'risk'", result="too many hits")],
        open_questions=["Is FX one risk or two?"], next_step="Read section 7A")
    orders = [
        m.WorkOrder(id="wo_plain", **base),
        m.WorkOrder(id="wo_handoff", handoff=handoff, escalate_to="human:bo",
                    context=[m.ContextRef(uri="https://example.com/10-k", note="the filing")],
                    inputs={"ticker": "ACME"}, metadata={"team": "risk"}, **base),
        m.WorkOrder(id="wo_continues", continues="wo_plain", handoff=m.Handoff(
            summary="Picked up"), **base),
        m.WorkOrder(id="wo_staged", **{**base, "tools": ["filings/*", "gmail/send"]},
                    staged=["gmail/send"]),
        m.WorkOrder(id="wo_output", output_schema={
            "type": "object", "required": ["risks"],
            "properties": {"risks": {"type": "array", "minItems": 3, "maxItems": 3,
                                     "items": {"type": "string", "minLength": 1}}}},
            parent_id="wo_staged", **base),
    ]
    docs: list[dict[str, Any]] = [{"type": "order", "doc": o.to_dict()} for o in orders]
    evidence = [m.Evidence(criterion="c1", type="tool_call", ref="filings/search#1"),
                m.Evidence(criterion="c2", type="citation", ref="10-K 1A",
                           note="quoted")]
    report: dict[str, Any] = {
        "from_": "agent:researcher", "result": m.WorkResult(summary="Three risks found"),
        "evidence": evidence, "cost": {"usd": 0.5, "tool_calls": 6},
        "finished_at": now + timedelta(hours=1), "tools_used": ["filings/search"]}
    reports = [
        (0, m.WorkReport(order_id="wo_plain", status="done", **report)),
        (0, m.WorkReport(order_id="wo_plain", status="blocked", questions=["Which year?"],
                         **{**report, "evidence": []})),
        (0, m.WorkReport(order_id="wo_plain", status="failed", error="the site is down",
                         started_at=now + timedelta(minutes=5), attempt=2,
                         **{**report, "evidence": []})),
        (1, m.WorkReport(order_id="wo_handoff", status="done", handoff=handoff,
                         metadata={"model": "x"}, **report)),
        (3, m.WorkReport(order_id="wo_staged", status="done", effects=[
            m.Effect(ref="gmail/send#3", tool="gmail/send",
                     arguments={"to": "cfo@example.com", "body": "three risks"},
                     reversible=False),
            m.Effect(ref="gmail/send#4", tool="gmail/send",
                     arguments={"to": "ceo@example.com",
                                "body": {"$ref": "gmail/send#3", "pointer": "/id"}})],
            **{**report, "tools_used": ["filings/search", "gmail/send"]})),
        (4, m.WorkReport(order_id="wo_output", status="done", **{
            **report, "result": m.WorkResult(
                summary="Three risks", output={"risks": ["FX", "Supply", "Rates"]},
                artifacts=[m.Artifact(uri="file:///risks.md", media_type="text/markdown")])})),
    ]
    docs += [{"type": "report", "doc": r.to_dict(), "order": i} for i, r in reports]
    return docs


def main() -> int:
    jobs = json.load(sys.stdin)
    answers = []
    for job in jobs:
        try:
            answers.append(run(job))
        except Exception as exc:  # the published package raised: the test reports it
            answers.append({"error": f"{type(exc).__name__}: {exc}"})
    json.dump(answers, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
