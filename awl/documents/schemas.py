"""The normative JSON Schemas and the conformance folder, wherever they are installed.

A wheel carries ``schemas/`` and ``conformance/`` as package data under ``awl/_data/``; an
editable install reads them from the repository's top level. Compiled validators are cached:
building one costs far more than running it.
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

# jsonschema ships no type hints (types-jsonschema is not a dependency).
from jsonschema import Draft202012Validator, FormatChecker  # type: ignore[import-untyped]
from jsonschema.exceptions import SchemaError  # type: ignore[import-untyped]
from referencing import Registry, Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from awl.documents.bounded import (
    PatternError,
    SchemaTooCostly,
    _show,
    bounded_errors,
    bounded_validator,
    meta_errors,
)
from awl.documents.errors import AWLError
from awl.documents.findings import Finding
from awl.documents.models import parse_time
from awl.documents.pointers import pointer

__all__ = [
    "SCHEMA_NAMES",
    "conformance_dir",
    "format_checker",
    "load_schema",
    "output_problem",
    "schema_dir",
    "schema_findings",
    "schema_problem",
    "validator",
]

SCHEMA_NAMES = ("order", "report", "pass", "call", "event", "review")
"""The documents that have a normative schema, by the short name the checks use."""

# File stems each short name may carry; the first one found wins.
_STEMS: Mapping[str, tuple[str, ...]] = {
    "order": ("order", "work-order"),
    "report": ("report", "work-report"),
    "pass": ("pass", "delegation-pass", "pass-claims"),
    "call": ("call", "call-record"),
    "event": ("event",),
    "review": ("review",),
}

_PACKAGE = Path(__file__).resolve().parent.parent
_MESSAGE_LIMIT = 300


def _data_folder(name: str) -> Path | None:
    # Installed wheels first; in an editable install the package sits in the repository.
    for candidate in (_PACKAGE / "_data" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    return None


def schema_dir() -> Path:
    """The folder holding the normative ``*.schema.json`` files.

    Raises:
        AWLError: when neither the package data nor a repository checkout has them.
    """
    folder = _data_folder("schemas")
    if folder is None:
        raise AWLError("the AWL schemas are not installed: reinstall awl-gateway")
    return folder


def conformance_dir() -> Path | None:
    """The shipped conformance folder, or None when this install has none."""
    return _data_folder("conformance")


def load_schema(name: str) -> dict[str, Any]:
    """The schema of one document type as JSON data (a fresh copy).

    Args:
        name: one of :data:`SCHEMA_NAMES`.

    Raises:
        KeyError: for a name that is not a document type.
        AWLError: when the schema file is missing.
    """
    return json.loads(json.dumps(_schema(name)))  # type: ignore[no-any-return]


@cache
def _schema(name: str) -> dict[str, Any]:
    stems = _STEMS[name]
    folder = schema_dir()
    for stem in stems:
        path = folder / f"{stem}.schema.json"
        if path.is_file():
            data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
            return data
    raise AWLError(f"schema {stems[0]}.schema.json is missing from {folder}")


@cache
def _registry() -> Registry[Any]:
    # Every schema is registered under its $id so one may $ref another.
    resources = []
    for path in sorted(schema_dir().glob("*.schema.json")):
        contents = json.loads(path.read_text(encoding="utf-8"))
        uri = contents.get("$id") if isinstance(contents, dict) else None
        if isinstance(uri, str):
            resources.append((uri, Resource.from_contents(contents, DRAFT202012)))
    return Registry().with_resources(resources)


def _is_timestamp(value: object) -> bool:
    if not isinstance(value, str):
        return True  # format applies to strings only
    try:
        parse_time(value)
    except ValueError:
        return False
    return True


@cache
def format_checker() -> FormatChecker:
    """The format checker the normative schemas run with.

    ``date-time`` is checked by the same parser the models use, so the schema and the models
    agree on what a timestamp is (jsonschema alone would skip it without an extra package).
    """
    checker = FormatChecker()
    checker.checks("date-time")(_is_timestamp)
    return checker


@cache
def validator(name: str) -> Draft202012Validator:
    """The compiled, cached validator for one document type (with format checks on)."""
    return Draft202012Validator(_schema(name), registry=_registry(),
                                format_checker=format_checker())


_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict, _REPR.maxlevel = 40, 40, 4, 4, 2


def _short(error: Any) -> str:
    """The error's message, with a long instance cut down so the message stays one short line."""
    message: str = error.message
    if len(message) <= _MESSAGE_LIMIT:
        return message
    message = message.replace(repr(error.instance), _REPR.repr(error.instance))
    return message if len(message) <= _MESSAGE_LIMIT else message[:_MESSAGE_LIMIT] + "…"


def schema_findings(name: str, data: Any, rule: str) -> Iterator[Finding]:
    """Findings for every place ``data`` breaks the schema ``name``, under rule id ``rule``.

    ``data`` must already be plain JSON data (see :func:`awl.load_document`).
    """
    errors = sorted(validator(name).iter_errors(data),
                    key=lambda e: [str(p) for p in e.absolute_path])
    for error in errors:
        yield Finding(rule, "invalid", pointer(*error.absolute_path), _short(error))


def schema_problem(schema: Any) -> str | None:
    """Why ``schema`` (an order's ``output_schema``) is not a usable 2020-12 schema, in one
    line; None when it is (O4)."""
    try:
        errors = meta_errors(schema, draft=Draft202012Validator)
    except RecursionError:
        return "nested too deeply"
    if not errors:
        return _reference_problem(schema)
    error = errors[0]
    where = pointer(*error.absolute_path) or "/"
    if isinstance(error.cause, PatternError):
        return f"at {where}: pattern {_show(error.instance)} cannot be used: {error.cause}"
    return f"at {where}: {error.message[:200]}"


_DIALECT_2020 = frozenset({"https://json-schema.org/draft/2020-12/schema",
                           "https://json-schema.org/draft/2020-12/schema#"})


def _reference_problem(schema: Any) -> str | None:
    """Why a schema that fits the meta-schema still cannot be used: it declares another
    dialect, or a ``$ref`` / ``$dynamicRef`` names nothing inside it (nothing is fetched,
    R11), as the published package judges it."""
    if not isinstance(schema, Mapping):
        return None
    declared = schema.get("$schema")
    if declared is not None and declared not in _DIALECT_2020:
        return f"$schema {_show(declared)} is not JSON Schema 2020-12"
    resource = Resource.from_contents(dict(schema), default_specification=DRAFT202012)
    base = resource.id() or ""
    resolver = Registry().with_resource(base, resource).resolver(base_uri=base)
    for where, ref in _references(schema, ()):
        try:
            resolver.lookup(ref)
        except Unresolvable:
            return (f"at {pointer(*where) or '/'}: {_show(ref)} names nothing inside the "
                    "schema (nothing is fetched)")
    return None


def _references(value: Any, where: tuple[str | int, ...]
                ) -> Iterator[tuple[tuple[str | int, ...], str]]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key in ("$ref", "$dynamicRef") and isinstance(item, str):
                yield (*where, key), item
            elif key not in ("const", "enum", "default", "examples"):
                yield from _references(item, (*where, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _references(item, (*where, i))


def output_problem(schema: Mapping[str, Any], output: Any) -> str | None:
    """Why a report's ``output`` does not match the order's ``output_schema``, in one line,
    checked in bounded time (DOC-16); None when it matches (R11)."""
    # An empty registry: refs stay inside the schema and nothing is fetched from the network.
    try:
        checker = bounded_validator(schema, draft=Draft202012Validator, registry=Registry())
        errors = sorted(bounded_errors(checker, output), key=lambda e: e.path)
    except (SchemaError, Unresolvable, PatternError) as exc:
        return f"the schema cannot be applied ({str(exc).splitlines()[0][:200]})"
    except SchemaTooCostly as exc:
        return f"the schema is too costly to apply: {exc}; simplify the order's output_schema"
    except RecursionError:
        return "the schema recurses without end"
    if not errors:
        return None
    error = errors[0]
    return f"at {pointer(*error.absolute_path) or '/'}: {error.message[:200]}"
