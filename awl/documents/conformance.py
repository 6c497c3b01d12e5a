"""Run the language-neutral conformance suite against this implementation.

The runner contract is ``conformance/README.md``: a case file is an array of groups, each with
a document ``type``, a ``context`` and tests; a test's findings are compared with the expected
ones, schema rules by rule id only and every other rule as a multiset of ``(rule, path)``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

# jsonschema ships no type hints (types-jsonschema is not a dependency).
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

from awl.documents.checks import (
    iter_call_findings,
    iter_event_findings,
    iter_order_findings,
    iter_pass_findings,
    iter_report_findings,
    iter_review_findings,
    iter_suborder_findings,
    load_document,
)
from awl.documents.errors import AWLError, BadRequest, DocumentError
from awl.documents.findings import Finding
from awl.documents.pointers import pointer
from awl.documents.schemas import conformance_dir

__all__ = ["ConformanceResult", "ConformanceRun", "run_conformance", "run_test"]

SCHEMA_RULES = frozenset({"O1", "R1", "P1", "K1", "E1", "W1"})
"""Rules compared by id only: validators word and place structure errors differently."""

Status = Literal["passed", "failed", "skipped"]
Pair = tuple[str, str]


@dataclass(frozen=True, slots=True)
class ConformanceResult:
    """The outcome of one conformance test (or of a case file that could not be run)."""

    name: str
    """The test's description (unique across the suite), or the file's name."""
    file: str
    """The case file, relative to the folder run."""
    status: Status
    reason: str = ""
    """Why it failed or was skipped; empty when it passed."""
    expected: tuple[Pair, ...] = ()
    """The expected ``(rule, path)`` pairs (schema rules with the path they were written with)."""
    produced: tuple[Pair, ...] = ()
    """What this implementation produced."""

    @property
    def passed(self) -> bool:
        """Whether the test passed."""
        return self.status == "passed"

    def to_json(self) -> dict[str, Any]:
        """The result as JSON data."""
        return {"name": self.name, "file": self.file, "status": self.status,
                "reason": self.reason,
                "expected": [list(p) for p in self.expected],
                "produced": [list(p) for p in self.produced]}


@dataclass(frozen=True, slots=True)
class ConformanceRun:
    """Every result of one run, with the counts."""

    results: tuple[ConformanceResult, ...] = field(default_factory=tuple)

    def _count(self, status: Status) -> int:
        return sum(1 for r in self.results if r.status == status)

    @property
    def passed(self) -> int:
        """How many tests passed."""
        return self._count("passed")

    @property
    def failed(self) -> int:
        """How many tests failed (an unreadable case file counts as one)."""
        return self._count("failed")

    @property
    def skipped(self) -> int:
        """How many tests were skipped for a stated reason."""
        return self._count("skipped")

    def summary(self) -> str:
        """The runner contract's last line: ``N passed, N failed`` (then skips, if any)."""
        line = f"{self.passed} passed, {self.failed} failed"
        return line + (f", {self.skipped} skipped" if self.skipped else "")

    def to_json(self) -> dict[str, Any]:
        """The run as JSON data."""
        return {"passed": self.passed, "failed": self.failed, "skipped": self.skipped,
                "results": [r.to_json() for r in self.results]}


def run_conformance(path: str | Path | None = None) -> ConformanceRun:
    """Run a conformance folder (its ``cases/*.json``) or one case file.

    Args:
        path: a folder holding ``cases/`` (or case files directly), or a case file. Default:
            the suite shipped with this package.

    Raises:
        BadRequest: ``path`` does not exist or holds no case files.
    """
    root, files = _case_files(path)
    format_checker = _case_format(root)
    results: list[ConformanceResult] = []
    for file in files:
        results.extend(_run_file(file, _relative(file, root), format_checker))
    return ConformanceRun(tuple(results))


def _case_files(path: str | Path | None) -> tuple[Path, list[Path]]:
    if path is None:
        shipped = conformance_dir()
        if shipped is None:
            raise BadRequest("no conformance suite is installed; give a folder")
        path = shipped
    target = Path(path)
    if target.is_file():
        return target.parent, [target]
    if not target.is_dir():
        raise BadRequest(f"{target} is neither a conformance folder nor a case file")
    cases = target / "cases"
    files = sorted((cases if cases.is_dir() else target).glob("*.json"))
    files = [f for f in files if f.name != "case.schema.json"]
    if not files:
        raise BadRequest(f"{target} holds no case files (cases/*.json)")
    return target, files


def _case_format(root: Path) -> Draft202012Validator | None:
    # The case format comes with the suite being run: next to it, or one folder up.
    for folder in (root, root.parent):
        schema = folder / "case.schema.json"
        if schema.is_file():
            try:
                return Draft202012Validator(json.loads(schema.read_text(encoding="utf-8")))
            except (OSError, ValueError):
                return None
    shipped = conformance_dir()
    if shipped is not None and (shipped / "case.schema.json").is_file():
        text = (shipped / "case.schema.json").read_text(encoding="utf-8")
        return Draft202012Validator(json.loads(text))
    return None


def _relative(file: Path, root: Path) -> str:
    try:
        return file.relative_to(root).as_posix()
    except ValueError:
        return file.name


def _run_file(file: Path, name: str,
              case_format: Draft202012Validator | None) -> Iterator[ConformanceResult]:
    try:
        groups = load_document(file)  # a FIFO or a folder named *.json is refused (DOC-17)
    except DocumentError as exc:
        yield ConformanceResult(name, name, "failed", f"cannot read the case file: {exc}")
        return
    if case_format is not None:
        error = next(iter(case_format.iter_errors(groups)), None)
        if error is not None:
            where = pointer(*error.absolute_path) or "(file)"
            yield ConformanceResult(name, name, "failed",
                                    f"not a valid case file at {where}: {error.message[:200]}")
            return
    for group in groups:
        group_context = group.get("context") or {}
        for test in group["tests"]:
            context = {**group_context, **(test.get("context") or {})}
            yield run_test(group["type"], test, context, file=name)


def run_test(doc_type: str, test: Mapping[str, Any], context: Mapping[str, Any], *,
             file: str = "") -> ConformanceResult:
    """Run one conformance test of the given group ``type`` with its merged ``context``."""
    name = str(test.get("description", "(no description)"))
    expected = tuple((str(f["rule"]), str(f.get("path", ""))) for f in test.get("findings", []))
    if "skip" in test:
        return ConformanceResult(name, file, "skipped", str(test["skip"]), expected)
    try:
        produced = tuple((f.rule, f.path) for f in _run_checks(doc_type, test["document"],
                                                                 context))
    except AWLError as exc:
        return ConformanceResult(name, file, "failed",
                                 f"raised {type(exc).__name__}: {exc.message}", expected)
    except Exception as exc:  # a runner reports a crashing implementation; it does not crash
        return ConformanceResult(name, file, "failed",
                                 f"crashed with {type(exc).__name__}: {exc}", expected)
    reason = _difference(expected, produced)
    status: Status = "failed" if reason else "passed"
    return ConformanceResult(name, file, status, reason, expected, produced)


def _run_checks(doc_type: str, document: Any, context: Mapping[str, Any]) -> Iterator[Finding]:
    runners: dict[str, Callable[[], Iterator[Finding]]] = {
        "order": lambda: iter_order_findings(document),
        "suborder": lambda: iter_suborder_findings(document, context.get("parent"),
                                                    context.get("remaining")),
        "report": lambda: iter_report_findings(document, context.get("order"),
                                               context.get("calls"), context.get("checks"),
                                               context.get("sub_reports")),
        "pass": lambda: _pass_findings(document, context),
        "call": lambda: iter_call_findings(document),
        "event": lambda: iter_event_findings(document),
        "review": lambda: iter_review_findings(document),
    }
    runner = runners.get(doc_type)
    if runner is None:
        raise BadRequest(f"unknown group type {doc_type!r}")
    return runner()


def _pass_findings(document: Any, context: Mapping[str, Any]) -> Iterator[Finding]:
    return iter_pass_findings(document, order=context.get("order"), parent=context.get("parent"),
                              remaining=context.get("remaining"), now=context.get("now"))


def _difference(expected: tuple[Pair, ...], produced: tuple[Pair, ...]) -> str:
    want_schema = {rule for rule, _ in expected if rule in SCHEMA_RULES}
    got_schema = {rule for rule, _ in produced if rule in SCHEMA_RULES}
    want = Counter(p for p in expected if p[0] not in SCHEMA_RULES)
    got = Counter(p for p in produced if p[0] not in SCHEMA_RULES)
    if want_schema == got_schema and want == got:
        return ""
    missing = sorted((want - got).elements()) + [(r, "*") for r in sorted(want_schema - got_schema)]
    extra = sorted((got - want).elements()) + [(r, "*") for r in sorted(got_schema - want_schema)]
    parts = []
    if missing:
        parts.append("missing " + ", ".join(f"{r} {p or '(document)'}" for r, p in missing))
    if extra:
        parts.append("unexpected " + ", ".join(f"{r} {p or '(document)'}" for r, p in extra))
    return "; ".join(parts)
