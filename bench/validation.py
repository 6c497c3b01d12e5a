"""Validation throughput: the same documents through the pydantic models, through the
normative JSON Schemas, and through the full numbered checks.

``python -m bench.validation [--quick]`` prints documents per second (median of several
rounds) and the ratios between the three paths.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from awl import WorkOrder, WorkReport, iter_order_findings, iter_report_findings
from awl.documents.schemas import validator

ORDER: dict[str, Any] = {
    "spec": "awl/work-order@0.3",
    "id": "wo_bench",
    "created_at": "2026-11-30T09:00:00Z",
    "from": "human:ana",
    "to": "agent:mailer",
    "goal": "Send the CFO a three-line summary of the Q3 risks.",
    "criteria": [{"id": "c1", "text": "Summary drafted"}, {"id": "c2", "text": "CFO emailed"}],
    "budget": {"usd": 1, "tool_calls": 20},
    "deadline": "2026-12-01T09:00:00Z",
    "tools": ["notes/*", "mail/send_email"],
    "staged": ["mail/send_email"],
}
REPORT: dict[str, Any] = {
    "spec": "awl/work-report@0.3",
    "order_id": "wo_bench",
    "from": "agent:mailer",
    "status": "done",
    "result": {"summary": "Drafted and queued the email."},
    "evidence": [
        {"criterion": "c1", "type": "tool_call", "ref": "notes/search_notes#1"},
        {"criterion": "c2", "type": "tool_call", "ref": "mail/send_email#2"},
    ],
    "cost": {"usd": 0.1, "tool_calls": 2},
    "finished_at": "2026-11-30T09:30:00Z",
    "tools_used": ["notes/search_notes", "mail/send_email"],
    "effects": [{"ref": "mail/send_email#2", "tool": "mail/send_email",
                 "arguments": {"to": "cfo@example.com", "subject": "Q3", "body": "..."}}],
}


def _rate(fn: Callable[[], object], n: int, rounds: int) -> float:
    """Median documents per second over ``rounds`` runs of ``n`` calls."""
    rates = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    n, rounds = (300, 3) if args.quick else (3000, 5)
    order_schema, report_schema = validator("order"), validator("report")
    order_model = WorkOrder.model_validate(ORDER)
    rows = [
        ("order", "model", _rate(lambda: WorkOrder.model_validate(ORDER), n, rounds)),
        ("order", "schema", _rate(lambda: order_schema.is_valid(ORDER), n, rounds)),
        ("order", "all checks", _rate(lambda: list(iter_order_findings(ORDER)), n, rounds)),
        ("report", "model", _rate(lambda: WorkReport.model_validate(REPORT), n, rounds)),
        ("report", "schema", _rate(lambda: report_schema.is_valid(REPORT), n, rounds)),
        ("report", "all checks",
         _rate(lambda: list(iter_report_findings(REPORT, order_model)), n, rounds)),
    ]
    print(f"{'document':<9} {'path':<11} {'docs/s':>10} {'x model':>9}")
    models = {doc: rate for doc, path, rate in rows if path == "model"}
    for doc, path, rate in rows:
        print(f"{doc:<9} {path:<11} {rate:>10,.0f} {models[doc] / rate:>8.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
