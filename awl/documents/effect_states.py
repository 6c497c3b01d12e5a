"""The states of an effect (a held call on its way to running at most once), as data.

SPEC §15 lists the states and every move between them; :data:`TABLE` is that table, row for
row (a test compares the two cell by cell). The store refuses any move that is not a row
(:func:`awl.store.rules.next_effect`), whichever backend keeps the effects.

Each row says who may make the move, when, and under which requirement. Creation is the row
from None: only a hold makes an effect (the store writes the held call and its effect in one
transaction, CM-14), so every held call has an effect state. ``committed``, ``failed``,
``dropped`` and ``skipped`` are final: no row leaves them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, get_args

__all__ = [
    "FINAL",
    "STATES",
    "TABLE",
    "EffectMove",
    "EffectStateName",
    "Mover",
    "is_move",
    "moves_from",
]

EffectStateName = Literal[
    "held", "dropped", "dispatching", "committed", "failed", "unknown", "skipped"
]

STATES: tuple[EffectStateName, ...] = get_args(EffectStateName)
"""Every effect state, in SPEC §15's order."""

Mover = Literal["gateway", "desk", "commit", "manager"]
"""Who makes a move: the gateway holding a call, the desk dropping on rework or an
unapproved end, the commit path (commit, retry, and drops of what an approval leaves out),
or the order's manager settling."""


@dataclass(frozen=True, slots=True)
class EffectMove:
    """One row of the table: who may move an effect this way, when, under which requirement."""

    who: tuple[Mover, ...]
    when: str
    spec: tuple[str, ...]


TABLE: Mapping[tuple[EffectStateName | None, EffectStateName], EffectMove] = {
    (None, "held"): EffectMove(("gateway",), "a staged call is held", ("GW-9", "CM-14")),
    ("held", "dropped"): EffectMove(
        ("desk", "commit"), "it will never run: not listed, not approved, reworked, the "
        "order ended unapproved, or an order above it ended", ("CM-4", "LC-22")),
    ("held", "skipped"): EffectMove(
        ("commit",), "a `$ref` it needs is not committed or does not resolve", ("CM-5",)),
    ("held", "dispatching"): EffectMove(
        ("commit",), "durably marked just before it is sent", ("CM-6",)),
    ("dispatching", "committed"): EffectMove(
        ("commit",), "answered with a result", ("CM-7",)),
    ("dispatching", "failed"): EffectMove(("commit",), "answered with an error", ("CM-7",)),
    ("dispatching", "unknown"): EffectMove(
        ("commit",), "no answer arrived, a later commit found it dispatching, or a retry's request "
        "provably never left",
        ("CM-7", "CM-8")),
    ("dispatching", "held"): EffectMove(
        ("commit",), "the request provably never left the committer", ("CM-7",)),
    ("unknown", "unknown"): EffectMove(
        ("manager",), "settled: the finding is kept on the effect", ("CM-11",)),
    ("unknown", "dispatching"): EffectMove(
        ("commit",), "a retry of an effect settled `did_not_happen`", ("CM-11",)),
}
"""Every legal move ``(from, to)``; ``from`` None is the effect's creation."""

FINAL: frozenset[EffectStateName] = frozenset(
    s for s in STATES if not any(f == s for f, _ in TABLE))
"""States no move leaves."""


def is_move(from_: str | None, to: str) -> bool:
    """Whether an effect may move from ``from_`` (None: it does not exist yet) to ``to``."""
    return (from_, to) in TABLE


def moves_from(state: str | None) -> tuple[EffectStateName, ...]:
    """The states an effect in ``state`` may move to, in SPEC §15's order."""
    return tuple(to for to in STATES if (state, to) in TABLE)
