"""Every requirement SPEC.md numbers has a test that names it: a test module under tests/
that mentions its id, or a conformance case that lists it in its ``spec``. A new MUST without
a test, or a case citing an id SPEC does not define, fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFINED = re.compile(r"\*\*\[([A-Z]+-?[0-9]+[a-z]?)\]\*\*")
"""How SPEC.md defines a requirement: its id in bold brackets, ``**[GW-5]**``."""


def spec_ids() -> set[str]:
    return set(DEFINED.findall((ROOT / "SPEC.md").read_text(encoding="utf-8")))


def named(ident: str, text: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_-]){re.escape(ident)}(?![0-9A-Za-z])", text) is not None


def case_ids() -> dict[str, set[str]]:
    """The ids each conformance file's cases list in ``spec``."""
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / "conformance" / "cases").glob("*.json")):
        groups = json.loads(path.read_text(encoding="utf-8"))
        out[path.name] = {s for g in groups for s in g.get("spec", [])}
    return out


def test_every_spec_id_has_a_test_naming_it() -> None:
    ids = spec_ids()
    assert len(ids) > 150, "SPEC.md's ids were not found: did their markup change?"
    tests = "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "tests").rglob("*.py"))
                      if p.name != Path(__file__).name)
    cited = set().union(*case_ids().values())
    untested = sorted(i for i in ids if i not in cited and not named(i, tests))
    print(f"\nSPEC ids: {len(ids)}; named by a test or a conformance case: "
          f"{len(ids) - len(untested)}")
    assert untested == [], f"SPEC ids no test names: {untested}"


def test_conformance_cases_cite_only_ids_spec_defines() -> None:
    ids = spec_ids()
    unknown = {name: sorted(cited - ids) for name, cited in case_ids().items() if cited - ids}
    assert unknown == {}
