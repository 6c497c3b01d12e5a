"""``awl validate`` and ``awl conformance``: check documents, and check this implementation."""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
from typing import Any, cast

from awl.cli._common import CLIError, add_json_option, read_document
from awl.documents.checks import DocType, check
from awl.documents.errors import AWLError
from awl.documents.findings import Finding

_TYPES = ("order", "report", "pass", "call", "event", "review")


def register(subparsers: Any) -> None:
    """Add ``validate`` and ``conformance`` to the ``awl`` command."""
    validate = subparsers.add_parser(
        "validate", help="check documents and print their findings",
        description="Check AWL documents against the schemas and every numbered rule. The type "
                    "is read from `spec` unless given. Exit 1 when a document has an invalid "
                    "finding or cannot be read; limit findings are printed but pass.")
    validate.add_argument("files", nargs="+", metavar="FILE", help="JSON document, or - for stdin")
    validate.add_argument("--type", choices=_TYPES, help="the document type (default: detect)")
    validate.add_argument("--order", metavar="ORDER.json",
                          help="the order a report answers or a pass grants")
    validate.add_argument("--parent", metavar="PARENT.json",
                          help="the parent order of a sub-order, or the parent pass claims")
    validate.add_argument("--calls", metavar="CALLS.json",
                          help="a JSON array of the order's call records (report rules RX2-RX4)")
    validate.add_argument("--sub-reports", metavar="REPORTS.json",
                          help="a JSON array of the latest report of each direct sub-order of "
                               "the order (report rule RX6)")
    add_json_option(validate, "print one array of results")
    validate.set_defaults(func=_validate)

    conformance = subparsers.add_parser(
        "conformance", help="run a conformance folder against this implementation",
        description="Run the language-neutral conformance cases and print every failure, then "
                    "`N passed, N failed`. Exit 1 when any case fails.")
    conformance.add_argument("path", nargs="?", metavar="DIR",
                             help="a conformance folder or case file (default: the shipped one)")
    add_json_option(conformance, "print the results")
    conformance.add_argument("-v", "--verbose", action="store_true",
                             help="also list the tests that passed")
    conformance.set_defaults(func=_conformance)


def _context(name: str | None, what: str) -> Any:
    if name is None:
        return None
    try:
        return read_document(name)
    except AWLError as exc:
        raise CLIError(_safe(f"{what} {name}: {exc.message}")) from None


_CONTROL = re.compile("[\x00-\x1f\x7f\u2028\u2029]")


def _safe(text: str) -> str:
    # Names, paths and messages may hold characters the terminal cannot encode, or line
    # breaks that would split a finding over two lines.
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256
                        else f"\\u{ord(m.group()):04x}", text)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _tolerant_output() -> None:
    # A terminal that cannot show a character gets an escape instead of a crash.
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")


def _validate(args: argparse.Namespace) -> int:
    _tolerant_output()
    order = _context(args.order, "--order")
    parent = _context(args.parent, "--parent")
    calls = _context(args.calls, "--calls")
    sub_reports = _context(args.sub_reports, "--sub-reports")
    results: list[dict[str, Any]] = []
    status = 0
    for name in args.files:
        try:
            findings = check(read_document(name), cast(DocType | None, args.type), order=order,
                             parent=parent, calls=calls, sub_reports=sub_reports)
        except AWLError as exc:
            results.append({"file": name, "valid": False, "error": exc.message})
            status = 1
            if not args.json:
                print(f"{_safe(name)}: cannot check: {_safe(exc.message)}", file=sys.stderr)
            continue
        valid = not any(f.kind == "invalid" for f in findings)
        status = status if valid else 1
        results.append({"file": name, "valid": valid,
                        "findings": [f.to_dict() for f in findings]})
        if not args.json:
            _print_findings(name, findings)
    if args.json:
        print(json.dumps(results, indent=2, ensure_ascii=True))
    return status


def _print_findings(name: str, findings: list[Finding]) -> None:
    if not findings:
        print(f"{_safe(name)}: valid")
    for f in findings:
        print(_safe(f"{name}: {f.rule} {f.kind} {f.path or '(document)'}: {f.message}"))


def _conformance(args: argparse.Namespace) -> int:
    _tolerant_output()
    from awl.documents.conformance import run_conformance

    run = run_conformance(args.path)
    if args.json:
        print(json.dumps(run.to_json(), indent=2, ensure_ascii=True))
        return 0 if run.failed == 0 else 1
    for result in run.results:
        if not result.passed:
            print(_safe(f"FAIL {result.name}: {result.reason}"))
        elif args.verbose:
            print(_safe(f"ok   {result.name}"))
    print(run.summary())
    return 0 if run.failed == 0 else 1
