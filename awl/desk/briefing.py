"""The handoff briefing: a short Markdown page for whoever continues an order.

It is built from the order, its reports and its log, and says in this order: the goal,
where the order stands, the open questions, the next steps by priority, the decisions
already made (the worker's, with their reasons, and the manager's answers, reworks and
reviews), what was tried, the files that matter with their line ranges, the criteria with
their evidence, and the latest events.

Handoff fields (``next_steps``, ``files``, ``decisions`` ...) come from the latest report
that has a handoff, field by field falling back to the order's own handoff. A handoff is
the worker's account, not verified fact; the page says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from awl.desk.criteria import check_question, latest_checks
from awl.documents.display import visible
from awl.documents.models import Event, Handoff, NextStep, Review, WorkOrder, WorkReport

__all__ = ["briefing"]

_PRIORITY = {"high": 0, "medium": 1, "low": 2}
_RECENT_EVENTS = 8


class _Record(Protocol):
    """What a briefing reads: an :class:`awl.OrderView` or a store record."""

    @property
    def order(self) -> WorkOrder: ...
    @property
    def state(self) -> str: ...
    @property
    def reports(self) -> tuple[WorkReport, ...]: ...
    @property
    def reviews(self) -> tuple[Review, ...]: ...
    @property
    def attempt(self) -> int: ...


def _one_line(text: str, limit: int = 100) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _field(sources: Sequence[Handoff], name: str) -> object:
    for handoff in sources:
        value = getattr(handoff, name)
        if value is not None:
            return value
    return None


def _amount(value: float) -> str:
    return f"{value:g}"


def briefing(record: _Record, events: Sequence[Event] = ()) -> str:
    """The Markdown briefing of an order.

    Args:
        record: the order with its state, reports and reviews (an :class:`awl.OrderView`
            or an :class:`awl.store.protocol.OrderRecord`).
        events: the order's log, oldest first (optional; without it the page has no
            manager decisions from the log and no recent events).

    Returns:
        Markdown text, ending with a newline.
    """
    order = record.order
    reports = record.reports
    latest = reports[-1] if reports else None
    attempt = record.attempt
    sources = [r.handoff for r in reversed(reports) if r.handoff is not None]
    if order.handoff is not None:
        sources.append(order.handoff)

    out: list[str] = [f"# Handoff: {_one_line(order.goal, 80)}", ""]
    head = (f"Order `{order.id}` · worker {order.to} · manager {order.manager} · "
            f"state **{record.state}** · attempt {attempt}")
    out.append(head)
    out.append(_budget_line(order, latest))
    links = []
    if order.parent_id:
        links.append(f"sub-order of `{order.parent_id}`")
    if order.continues:
        links.append(f"continues `{order.continues}`")
    if links:
        out.append("; ".join(links).capitalize())
    out += ["", "## Goal", "", order.goal.strip(), ""]

    out += ["## Status", "", _status(record, latest, events, attempt)]
    if latest is not None:
        out.append(f"Latest report (attempt {latest.attempt or attempt}, {latest.status}): "
                   f"{_one_line(latest.result.summary, 200) or '(no summary)'}")
        if latest.error:
            out.append(f"Error: {_one_line(latest.error, 200)}")
    summary = _field(sources, "summary")
    if isinstance(summary, str):
        out.append(f"Worker's summary: {_one_line(summary, 300)}")
    out.append("")

    questions = list(latest.questions or ()) if record.state == "blocked" and latest else []
    if record.state == "blocked" and events and events[-1].action == "block":
        questions = [str(q) for q in (events[-1].data or {}).get("questions", ())]
    checks = latest_checks(events)
    questions += [q for q in map(check_question, checks.values()) if q is not None]
    handoff_questions = _field(sources, "open_questions")
    if isinstance(handoff_questions, tuple):
        questions += [q for q in handoff_questions if q not in questions]
    if questions:
        out += ["## Open questions", ""]
        out += [f"- {_one_line(q, 300)}" for q in questions]
        out.append("")

    steps = _next_steps(sources, record, order)
    if steps:
        out += ["## Next steps", ""]
        out += [f"{i}. [{s.priority.upper()}] {_one_line(s.text, 300)}"
                for i, s in enumerate(steps, start=1)]
        out.append("")

    decisions = _decisions(sources, events)
    if decisions:
        out += ["## Decisions", "", *decisions, ""]

    tried = _tried(sources, reports, record.reviews)
    if tried:
        out += ["## What was tried", "", *tried, ""]

    files = _field(sources, "files")
    if isinstance(files, tuple) and files:
        out += ["## Files", ""]
        for focus in files:
            out.append(f"### {focus.path}")
            if focus.note:
                out.append(_one_line(focus.note, 300))
            for r in focus.ranges or ():
                span = f"Line {r.start}" if r.start == r.end else f"Lines {r.start}-{r.end}"
                out.append(f"- {span}" + (f": {_one_line(r.note, 200)}" if r.note else ""))
            out.append("")

    out += ["## Criteria", "", *_criteria(order, latest, checks), ""]

    if events:
        out += ["## Recent events", ""]
        for e in events[-_RECENT_EVENTS:]:
            move = e.to if e.from_ is None or e.from_ == e.to else f"{e.from_} → {e.to}"
            note = f": {_one_line(e.note, 120)}" if e.note else ""
            out.append(f"- #{e.seq} {e.at} {e.actor} {e.action} ({move}){note}")
        out.append("")

    if sources:
        out.append("_Handoff notes are the worker's account, not verified fact._")
    # Through the display rule (SEC-14): what would not show is written <U+XXXX>.
    return visible("\n".join(out).rstrip("\n"), lines=True) + "\n"


def _budget_line(order: WorkOrder, latest: WorkReport | None) -> str:
    budget = order.budget.units()
    parts = [f"{unit} {_amount(limit)}" for unit, limit in budget.items()]
    line = f"Deadline {order.deadline} · budget {', '.join(parts)}"
    if latest is not None:
        cost = latest.cost.units()
        spent = []
        for unit, limit in budget.items():
            if unit in cost:
                share = f" ({cost[unit] / limit:.0%})" if limit > 0 else ""
                spent.append(f"{unit} {_amount(cost[unit])}{share}")
        if spent:
            line += f" · spent {', '.join(spent)}"
    return line


def _status(record: _Record, latest: WorkReport | None, events: Sequence[Event],
            attempt: int) -> str:
    order = record.order
    state = record.state
    last = events[-1] if events else None
    since = f" since {last.at}" if last is not None else ""
    if state == "offered":
        return f"Offered to {order.to}; not accepted yet."
    if state == "accepted":
        return f"Accepted by {order.to}{since}; not started yet."
    if state == "working":
        progress = next((e for e in reversed(events) if e.action == "progress"), None)
        text = f"{order.to} is working on attempt {attempt}."
        if progress is not None:
            pct = (progress.data or {}).get("percent")
            share = f" ({_amount(pct)}%)" if isinstance(pct, int | float) else ""
            text += f" Last progress at {progress.at}{share}: {_one_line(progress.note or '')}"
        return text
    if state == "blocked":
        who = " or ".join(order.answerers)
        return f"Blocked on attempt {attempt}{since}, waiting for an answer from {who}."
    if state == "submitted":
        status = latest.status if latest else "a report"
        return (f"Attempt {attempt} was submitted ({status}){since}; waiting for review by "
                f"{order.manager}.")
    ended = next((e for e in reversed(events) if e.to == state and e.from_ != e.to), None)
    when = f" at {ended.at}" if ended is not None else ""
    why = f": {_one_line(ended.note, 200)}" if ended is not None and ended.note else "."
    by = f" by {ended.actor}" if ended is not None else ""
    return f"{state.capitalize()}{when}{by}{why}"


def _next_steps(sources: Sequence[Handoff], record: _Record,
                order: WorkOrder) -> list[NextStep]:
    steps: list[NextStep] = []
    listed = _field(sources, "next_steps")
    if isinstance(listed, tuple):
        steps += listed
    single = _field(sources, "next_step")
    if isinstance(single, str) and all(s.text != single for s in steps):
        steps.insert(0, NextStep(text=single, priority="high"))
    state = record.state
    if state == "blocked":
        steps.insert(0, NextStep(text=f"Answer the open questions: awl answer {order.id} TEXT",
                                 priority="high"))
    elif state == "submitted":
        steps.insert(0, NextStep(
            text=f"Review the report: awl review {order.id} --approve | --rework REASON",
            priority="high"))
    # sorted() is stable: equal priorities keep the worker's order.
    return sorted(steps, key=lambda s: _PRIORITY[s.priority])


def _decisions(sources: Sequence[Handoff], events: Sequence[Event]) -> list[str]:
    lines: list[str] = []
    made = _field(sources, "decisions")
    if isinstance(made, tuple):
        for d in made:
            why = f" — because {_one_line(d.why, 200)}" if d.why else ""
            lines.append(f"- **{_one_line(d.text, 200)}**{why}")
    for e in events:
        if e.action == "answer" and e.note:
            lines.append(f"- {e.actor} answered ({e.at}): {_one_line(e.note, 200)}")
        elif e.action in ("rework", "cancel", "decline") and e.note:
            lines.append(f"- {e.actor} chose {e.action} ({e.at}): {_one_line(e.note, 200)}")
        elif e.action == "approve":
            chosen = (e.data or {}).get("effects")
            scope = f", effects {', '.join(map(str, chosen))}" if isinstance(chosen, list) else ""
            reason = f": {_one_line(e.note, 200)}" if e.note else ""
            lines.append(f"- {e.actor} approved ({e.at}{scope}){reason}")
    return lines


def _tried(sources: Sequence[Handoff], reports: Sequence[WorkReport],
           reviews: Sequence[Review]) -> list[str]:
    lines: list[str] = []
    reworked = {r.attempt: r.reason for r in reviews if r.decision == "rework"}
    for i, report in enumerate(reports, start=1):
        n = report.attempt or i
        if report.status == "blocked":
            continue
        outcome: str = report.status
        if n in reworked:
            outcome += f", sent back: {_one_line(reworked[n] or '', 120)}"
        lines.append(f"- Attempt {n} ({outcome}): {_one_line(report.result.summary, 200)}")
    listed = _field(sources, "tried")
    if isinstance(listed, tuple):
        for t in listed:
            result = f" → {_one_line(t.result, 200)}" if t.result else ""
            lines.append(f"- {_one_line(t.text, 200)}{result}")
    return lines


_CHECK_MARK = {"passed": "x", "question": "?"}


def _criteria(order: WorkOrder, latest: WorkReport | None,
              checks: Mapping[str, Mapping[str, Any]]) -> list[str]:
    lines = []
    for c in order.criteria:
        proof = [e for e in (latest.evidence if latest else ()) if e.criterion == c.id]
        mark = "x" if proof else " "
        run = checks.get(c.id, {}).get("check")
        if c.check is not None:
            mark = _CHECK_MARK.get(run["outcome"], " ") if run else " "
        detail = ""
        if proof:
            detail = " — " + "; ".join(
                f"{e.type} {e.ref or ''}".rstrip() + (f" ({_one_line(e.note, 80)})"
                                                       if e.note else "")
                for e in proof)
        lines.append(f"- [{mark}] `{c.id}` {_one_line(c.text, 200)}{detail}")
        if c.check is not None:
            lines.append(f"  - check `{_one_line(' '.join(c.check.run), 120)}`: "
                         + (f"{run['outcome']}: {_one_line(str(run.get('summary', '')), 300)}"
                            if run else "not run yet (the desk runs it on a done report)"))
    return lines
