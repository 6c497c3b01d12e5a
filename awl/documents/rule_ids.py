"""Rule ids as they were before they followed the published AWL's (SPEC.md section 18.2).

A rule that is the same as a published one has the published id; this implementation's own
rules have an ``X`` after the letter (``RX6``). Findings kept from before the change (the
``limit`` findings an ``expire`` event stores, and their text in its note) read under the new
ids through :func:`current_rule` and :func:`current_findings_note`; the :class:`~awl.Event`
model applies both as it reads an event.

Only old ids that no rule has today are mapped: ``R13``-``R16``, ``C5`` and ``C6`` are rules of
today with another meaning, and none of them was ever stored (they are all ``invalid``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["RETIRED", "current_findings", "current_findings_note", "current_rule"]

RETIRED: Mapping[str, str] = {
    "O6": "OX1", "O7": "OX2", "R17": "RX3", "R18": "RX4", "R19": "RX5", "R20": "RX6",
}
"""Old ids that no rule has any more, each with the id its rule has now."""

_IN_NOTE = re.compile(r"(^|; )(" + "|".join(RETIRED) + r")(?= /| :)")


def current_rule(rule: str) -> str:
    """The id a stored finding's rule has now (``R20`` reads as ``RX6``)."""
    return RETIRED.get(rule, rule)


def current_findings(findings: Any) -> Any:
    """Stored findings (a list of ``{rule, kind, path, message}``) under today's ids; anything
    else is returned as it is."""
    if not isinstance(findings, list) or not any(
            isinstance(f, Mapping) and f.get("rule") in RETIRED for f in findings):
        return findings
    return [{**f, "rule": current_rule(f["rule"])}
            if isinstance(f, Mapping) and isinstance(f.get("rule"), str) else f
            for f in findings]


def current_findings_note(note: str) -> str:
    """An ``expire`` event's note (``R20 /cost/tokens: …; R7 /cost/usd: …``) under today's
    ids."""
    return _IN_NOTE.sub(lambda m: m.group(1) + RETIRED[m.group(2)], note)
