"""Self-checks of the shared conformance suite and of SPEC.md's requirement ids.

SPEC.md writes each requirement id in bold brackets at the very start of the paragraph or list
item that states the requirement, for example ``**[GW-3]** tools/list MUST ...`` or
``- **[O2]** Criterion ids MUST ...``. :func:`spec_ids` reads exactly those; an id written
anywhere else (mid-sentence, in a code span) is a reference, not a definition.

A requirement is covered when a conformance case cites it (a group's or test's ``spec``, or
an expected finding's ``rule``) or when a test under ``tests/`` is marked
``@pytest.mark.spec("ID", ...)``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator  # type: ignore[import-untyped, unused-ignore]

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "SPEC.md"
CONFORMANCE = ROOT / "conformance"
CASES = CONFORMANCE / "cases"
TESTS = ROOT / "tests"

ID = r"(?:[A-Z]+-[0-9]+|[A-Z]X?[0-9]+)"
"""A requirement id: ``AREA-N`` (``GW-3``), or a numbered check ``LN`` or ``LXN`` (``RX2``)."""
_DEFINITION = re.compile(rf"^(?:[-*] |[0-9]+\. )?\*\*\[(?P<id>{ID})\]\*\*", re.MULTILINE)
_MARKER = re.compile(r"mark\.spec\((?P<args>[^)]*)\)")
_QUOTED = re.compile(rf"[\"'](?P<id>{ID})[\"']")
_NORMATIVE = re.compile(r"\b(MUST|REQUIRED|SHALL)\b")
_CHECK = re.compile(r"^[A-Z]X?[0-9]+$")


def spec_ids(text: str) -> list[str]:
    """Requirement ids SPEC.md defines, in order of appearance (repeats kept)."""
    return [m.group("id") for m in _DEFINITION.finditer(text)]


def marked_ids(folder: Path = TESTS) -> set[str]:
    """Ids named by ``pytest.mark.spec(...)`` in any test module under ``folder``."""
    found: set[str] = set()
    for path in folder.rglob("*.py"):
        for marker in _MARKER.finditer(path.read_text(encoding="utf-8")):
            found.update(m.group("id") for m in _QUOTED.finditer(marker.group("args")))
    return found


def case_files() -> list[Path]:
    """Every case file of the suite."""
    return sorted(CASES.glob("*.json"))


def _groups() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in case_files():
        for group in json.loads(path.read_text(encoding="utf-8")):
            yield path, group


def _tests() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for _, group in _groups():
        for test in group["tests"]:
            yield group, test


def cited_ids() -> set[str]:
    """Ids the suite cites: ``spec`` of groups and tests, and expected finding rules."""
    found: set[str] = set()
    for group, test in _tests():
        found.update(group["spec"])
        found.update(test.get("spec", ()))
        found.update(f["rule"] for f in test["findings"])
    return found


def _blocks(text: str) -> Iterator[str]:
    """Paragraphs and list items of SPEC.md after its conventions, code and tables left out.
    Indented text after a blank line (the parts of a requirement listed under its id, one
    MUST each) belongs to the block above it, as it does in Markdown."""
    body = text.split("\n## 2.", 1)[1]
    block: list[str] = []
    blank = False
    for line in [*body.splitlines(), ""]:
        starts_item = re.match(r"^(?:[-*] |[0-9]+\. )", line) is not None
        if not line.strip():
            blank = True
            continue
        special = line.startswith(("#", "|", "```"))
        continues = not blank or (line.startswith(" ") and bool(block))
        blank = False
        if special or starts_item or not continues:
            if block:
                yield " ".join(block)
            block = [] if special else [line if starts_item else line.strip()]
        else:
            block.append(line.strip())
    if block:
        yield " ".join(block)


def test_spec_ids_are_unique() -> None:
    """Every requirement id is defined once in SPEC.md."""
    repeated = sorted(i for i, n in Counter(spec_ids(SPEC.read_text(encoding="utf-8"))).items()
                      if n > 1)
    assert not repeated, f"ids defined more than once in SPEC.md: {repeated}"


def test_every_must_has_an_id() -> None:
    """Every paragraph of SPEC.md that says MUST, REQUIRED or SHALL starts with its id."""
    missing = [block[:80] for block in _blocks(SPEC.read_text(encoding="utf-8"))
               if _NORMATIVE.search(block) and not _DEFINITION.match(block)]
    assert not missing, "requirements without an id:\n" + "\n".join(missing)


def test_case_files_match_the_case_format() -> None:
    """Every case file validates against conformance/case.schema.json."""
    schema = json.loads((CONFORMANCE / "case.schema.json").read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    validator = Draft202012Validator(schema)
    problems = []
    for path in case_files():
        data = json.loads(path.read_text(encoding="utf-8"))
        problems += [f"{path.name} {list(e.absolute_path)}: {e.message[:200]}"
                     for e in validator.iter_errors(data)]
    assert case_files(), "no case files"
    assert not problems, "\n".join(problems)


def test_test_descriptions_are_unique() -> None:
    """No two tests of the suite share a description."""
    counts = Counter(test["description"] for _, test in _tests())
    repeated = sorted(d for d, n in counts.items() if n > 1)
    assert not repeated, f"descriptions used more than once: {repeated}"


def test_every_cited_id_exists() -> None:
    """Every id a case or a spec marker cites is defined in SPEC.md."""
    defined = set(spec_ids(SPEC.read_text(encoding="utf-8")))
    unknown = sorted((cited_ids() | marked_ids()) - defined)
    assert not unknown, f"ids cited but not defined in SPEC.md: {unknown}"


def test_every_check_passes_and_fails_somewhere() -> None:
    """Each numbered check has a test where it fires and a test citing it where it does not."""
    checks = [i for i in spec_ids(SPEC.read_text(encoding="utf-8")) if _CHECK.match(i)]
    fires: set[str] = set()
    quiet: set[str] = set()
    for group, test in _tests():
        rules = {f["rule"] for f in test["findings"]}
        fires |= rules
        quiet |= (set(group["spec"]) | set(test.get("spec", ()))) - rules
    never_fails = [c for c in checks if c not in fires]
    never_passes = [c for c in checks if c not in quiet]
    assert not never_fails and not never_passes, (
        f"no failing case: {never_fails}; no passing case: {never_passes}")


def test_every_spec_id_is_covered() -> None:
    """Every SPEC.md requirement is cited by a conformance case or a spec-marked test."""
    defined = spec_ids(SPEC.read_text(encoding="utf-8"))
    covered = cited_ids() | marked_ids()
    uncovered = [i for i in defined if i not in covered]
    assert not uncovered, f"SPEC.md ids not covered yet: {uncovered}"
