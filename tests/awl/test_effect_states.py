"""The effect state table in code is SPEC §15's, cell by cell."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import cast

import pytest

from awl.documents.effect_states import (
    FINAL,
    STATES,
    TABLE,
    EffectMove,
    EffectStateName,
    is_move,
    moves_from,
)
from tests.test_conformance_suite import spec_ids

SPEC = Path(__file__).resolve().parents[2] / "SPEC.md"

Row = tuple[tuple[str, ...], str, tuple[str, ...]]
"""Who, when and the requirements of one move."""

Key = tuple[EffectStateName | None, EffectStateName]
"""A move: from (None: creation) and to."""


def _section(text: str) -> str:
    """SPEC §15, up to the next section."""
    return text.split("\n## 15. ", 1)[1].split("\n## ", 1)[0]


def _tables(section: str) -> dict[tuple[str, ...], list[list[str]]]:
    """The section's markdown tables by their header cells, each a list of rows of cells."""
    tables: dict[tuple[str, ...], list[list[str]]] = {}
    lines = section.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("|"):
            i += 1
            continue
        block = []
        while i < len(lines) and lines[i].startswith("|"):
            block.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
            i += 1
        assert set("".join(block[1])) <= set("-: "), f"a table without a rule: {block[0]}"
        tables[tuple(block[0])] = block[2:]
    return tables


def _state(cell: str) -> EffectStateName | None:
    """A state cell: ``(none)`` or one state in a code span (a name the code does not know
    fails here, naming it)."""
    if cell == "(none)":
        return None
    found = re.fullmatch(r"`([a-z_]+)`", cell)
    assert found, f"not a state cell: {cell!r}"
    assert found.group(1) in STATES, f"SPEC §15 names a state the code lacks: {cell}"
    return cast(EffectStateName, found.group(1))


def _to(cell: str) -> EffectStateName:
    state = _state(cell)
    assert state is not None, "(none) is only ever a from state"
    return state


def _names(cell: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in cell.split(","))


def spec_states(text: str) -> list[str]:
    """The states of SPEC §15's state table, in order."""
    rows = _tables(_section(text))[("state", "meaning")]
    return [re.sub("`", "", row[0]) for row in rows]


def spec_moves(text: str) -> dict[Key, Row]:
    """SPEC §15's effect moves table: (from, to) → (who, when, requirements)."""
    rows = _tables(_section(text))[("from", "to", "who", "when", "requirement")]
    moves: dict[Key, Row] = {}
    for frm, to, who, when, spec in rows:
        key = (_state(frm), _to(to))
        assert key not in moves, f"SPEC §15 lists the move {key} twice"
        moves[key] = (_names(who), when, _names(spec))
    return moves


def differences(spec: Mapping[Key, Row], code: Mapping[Key, EffectMove]) -> list[str]:
    """Every way the two tables differ, one line each (empty when they agree)."""
    out = [f"SPEC §15 has the move {key} and the code does not" for key in spec
           if key not in code]
    out += [f"the code has the move {key} and SPEC §15 does not" for key in code
            if key not in spec]
    for key in spec.keys() & code.keys():
        move = code[key]
        for column, theirs, ours in zip(("who", "when", "requirement"), spec[key],
                                        (move.who, move.when, move.spec), strict=True):
            if theirs != ours:
                out.append(f"{key} {column}: SPEC §15 says {theirs!r}, the code {ours!r}")
    return out


@pytest.mark.spec("CM-13")
def test_the_states_are_spec_s() -> None:
    """The code's states are SPEC §15's state table, in its order."""
    assert spec_states(SPEC.read_text(encoding="utf-8")) == list(STATES)


@pytest.mark.spec("CM-13")
def test_the_moves_are_spec_s_cell_by_cell() -> None:
    """Every row of SPEC §15's moves table is a row of the code's table with the same who,
    when and requirements, and the code has no other row."""
    text = SPEC.read_text(encoding="utf-8")
    moves = spec_moves(text)
    assert len(moves) == len(TABLE) > 0
    assert differences(moves, TABLE) == []
    defined = set(spec_ids(text))
    for key, (_, _, ids) in moves.items():
        assert set(ids) <= defined, f"{key} cites an id SPEC does not define: {ids}"


def test_a_move_added_to_one_side_only_is_found() -> None:
    """The comparison names a move that only SPEC has, one that only the code has, and a
    changed cell, so the test above fails when the two drift apart."""
    text = SPEC.read_text(encoding="utf-8")
    added = text.replace(
        "| `held` | `skipped` |",
        "| `committed` | `held` | commit | never | CM-6 |\n| `held` | `skipped` |", 1)
    assert differences(spec_moves(added), TABLE) == [
        "SPEC §15 has the move ('committed', 'held') and the code does not"]
    fewer = {k: v for k, v in TABLE.items() if k != ("dispatching", "held")}
    assert differences(spec_moves(text), fewer) == [
        "SPEC §15 has the move ('dispatching', 'held') and the code does not"]
    more: dict[Key, EffectMove] = {**TABLE, ("failed", "held"): EffectMove(
        ("commit",), "x", ("CM-7",))}
    assert differences(spec_moves(text), more) == [
        "the code has the move ('failed', 'held') and SPEC §15 does not"]
    other: dict[Key, EffectMove] = {**TABLE, ("held", "dropped"): replace(
        TABLE[("held", "dropped")], who=("desk",))}
    assert differences(spec_moves(text), other) == [
        "('held', 'dropped') who: SPEC §15 says ('desk', 'commit'), the code ('desk',)"]


def test_final_states_and_the_moves_each_state_allows() -> None:
    """Nothing leaves committed, failed, dropped or skipped; creation makes only held."""
    assert frozenset({"committed", "failed", "dropped", "skipped"}) == FINAL
    assert moves_from(None) == ("held",)
    assert moves_from("held") == ("dropped", "dispatching", "skipped")
    assert moves_from("unknown") == ("dispatching", "unknown")
    assert is_move("dispatching", "held") and not is_move("held", "committed")
    assert all(moves_from(s) == () for s in FINAL)
