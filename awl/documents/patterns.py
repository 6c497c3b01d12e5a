"""Tool names, tool patterns and call refs.

A tool is named ``server/tool``. A pattern is ``server/tool``, ``server/*`` or ``*``.
A ref names one recorded call: ``server/tool#N`` with N counted from 1 per order; the
published drafts wrote ``server/tool#call-N``, which reads as the same ref.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

NAME = r"[A-Za-z0-9_.-]+"
TOOL_NAME_RE = re.compile(rf"^(?P<server>{NAME})/(?P<tool>{NAME})\Z")
PATTERN_RE = re.compile(rf"^(\*|{NAME}/(\*|{NAME}))\Z")
REF_RE = re.compile(rf"^(?P<server>{NAME})/(?P<tool>{NAME})#(?:call-)?(?P<n>[1-9][0-9]{{0,17}})\Z")


def is_tool_name(name: str) -> bool:
    """Whether ``name`` is an exact ``server/tool`` name."""
    return TOOL_NAME_RE.match(name) is not None


def is_pattern(pattern: str) -> bool:
    """Whether ``pattern`` is a well-formed tool pattern."""
    return PATTERN_RE.match(pattern) is not None


def matches(pattern: str, tool: str) -> bool:
    """Whether the pattern admits the exact tool name ``tool``."""
    if pattern == "*":
        return is_tool_name(tool)
    if pattern.endswith("/*"):
        m = TOOL_NAME_RE.match(tool)
        return m is not None and m.group("server") == pattern[:-2]
    return pattern == tool


def matches_any(patterns: Iterable[str], tool: str) -> bool:
    """Whether any of the patterns admits ``tool``."""
    return any(matches(p, tool) for p in patterns)


def covers(outer: str, inner: str) -> bool:
    """Whether every tool ``inner`` admits is admitted by ``outer``."""
    if outer == "*":
        return True
    if inner == "*":
        return False
    if outer.endswith("/*"):
        return inner.split("/", 1)[0] == outer[:-2]
    return outer == inner


def covered_by_any(outers: Iterable[str], inner: str) -> bool:
    """Whether one of ``outers`` covers ``inner``.

    Patterns form a tree (``*`` > ``server/*`` > ``server/tool``), so a pattern is covered by a
    set exactly when one member covers it.
    """
    return any(covers(o, inner) for o in outers)


def overlap(a: str, b: str) -> str | None:
    """The pattern admitting exactly the tools both admit, or None when they share none."""
    if covers(a, b):
        return b
    if covers(b, a):
        return a
    return None


@dataclass(frozen=True, slots=True)
class Ref:
    """A parsed call ref."""

    server: str
    tool_name: str
    n: int

    @property
    def tool(self) -> str:
        """The canonical ``server/tool`` name."""
        return f"{self.server}/{self.tool_name}"

    def __str__(self) -> str:
        return f"{self.server}/{self.tool_name}#{self.n}"


def parse_ref(text: str) -> Ref | None:
    """Parse ``server/tool#N`` (or the draft form ``#call-N``); None when malformed."""
    m = REF_RE.match(text)
    if m is None:
        return None
    return Ref(m.group("server"), m.group("tool"), int(m.group("n")))


def canonical_ref(text: str) -> str:
    """The ref in its canonical ``server/tool#N`` form; text that is no ref, unchanged."""
    parsed = parse_ref(text)
    return text if parsed is None else str(parsed)


def make_ref(tool: str, n: int) -> str:
    """The canonical ref for the ``n``-th call of an order, made to ``tool``."""
    return f"{tool}#{n}"
