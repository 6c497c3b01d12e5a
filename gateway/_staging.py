"""Checking a held call's arguments before it is recorded.

A held call runs only later, after the manager approves, so its arguments are checked now
against the upstream tool's input schema: the manager should never approve a call that
cannot run. A held call may carry placeholders ``{"$ref": "server/tool#M", "pointer":
"/..."}`` wherever a value goes; each stands for part of the result of an earlier held call
of the same attempt, filled in at commit time. The schema cannot judge a value that does
not exist yet, so schema errors at or inside a placeholder are not counted.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from awl.documents import CallRecord, parse_ref, pointer

REF_KEY = "$ref"
_CHECK_SECONDS = 1.0  # a held call's check runs on the gateway's loop: keep it short
POINTER_KEY = "pointer"

Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Placeholder:
    """One ``$ref`` value inside a held call's arguments."""

    path: Path
    """Where it sits in the arguments."""
    ref: str
    """The referenced held call, ``server/tool#M``."""
    pointer: str
    """The JSON pointer into that call's future result."""


def _is_placeholder_shape(value: object) -> bool:
    return isinstance(value, dict) and REF_KEY in value


def placeholders(arguments: Any, path: Path = ()) -> Iterator[Placeholder | str]:
    """Every placeholder in ``arguments``, or a problem text for a malformed one."""
    if _is_placeholder_shape(arguments):
        assert isinstance(arguments, dict)
        where = pointer(*path) or "/"
        extra = sorted(set(arguments) - {REF_KEY, POINTER_KEY})
        ref = arguments.get(REF_KEY)
        into = arguments.get(POINTER_KEY, "")
        if extra:
            yield f"the $ref value at {where} has unknown keys {extra}; use only $ref and pointer"
        elif not isinstance(ref, str) or parse_ref(ref) is None:
            yield f"the $ref at {where} must be a call ref like server/tool#3"
        elif not isinstance(into, str) or (into and not into.startswith("/")):
            yield f"the pointer at {where} must be a JSON pointer such as /structuredContent/id"
        else:
            yield Placeholder(path, str(parse_ref(ref)), into)
        return
    if isinstance(arguments, dict):
        for key, value in arguments.items():
            yield from placeholders(value, (*path, key))
    elif isinstance(arguments, list):
        for i, value in enumerate(arguments):
            yield from placeholders(value, (*path, i))


def _under(path: Path, roots: list[Path]) -> bool:
    return any(path[: len(root)] == root for root in roots)


def _counts(error: Any, roots: list[Path]) -> bool:
    """Whether a schema error is real, not caused by a value that does not exist yet."""
    if _under(tuple(error.absolute_path), roots):
        return False
    if error.context:
        # anyOf / oneOf: the branch failures are all about placeholders, so any branch might
        # accept the value once it is filled in.
        return any(_counts(sub, roots) for sub in error.context)
    return True


def _where(error: Any) -> str:
    return pointer(*error.absolute_path) or "/"


def check_arguments(
    arguments: Mapping[str, Any],
    schema: Mapping[str, Any] | None,
    *,
    earlier: Mapping[str, CallRecord],
) -> list[str]:
    """Problems that keep a held call from being recorded; empty when it may be held.

    Args:
        arguments: The call's arguments, exactly as the worker sent them.
        schema: The upstream tool's input schema (None: nothing to check).
        earlier: The held calls a placeholder may reference, by ref (earlier held calls of
            the same order and attempt).

    Returns:
        One plain sentence per problem, at most ten.
    """
    problems: list[str] = []
    roots: list[Path] = []
    for item in placeholders(dict(arguments)):
        if isinstance(item, str):
            problems.append(item)
            continue
        roots.append(item.path)
        target = earlier.get(item.ref)
        if target is None:
            problems.append(
                f"$ref {item.ref} does not name an earlier held call of this attempt; "
                "reference only refs you got back as pending:server/tool#N")
    if schema is not None:
        # The upstream's schema is applied as DOC-16 says: RE2 patterns, bounded work. The
        # JSON Schema stack loads with the first held call checked.
        from jsonschema.exceptions import SchemaError  # type: ignore[import-untyped]
        from referencing.exceptions import Unresolvable

        from awl.documents import (
            PatternError,
            SchemaTooCostly,
            bounded_errors,
            bounded_validator,
            meta_errors,
        )
        errors: list[Any] = []
        try:
            if not meta_errors(schema):
                validator = bounded_validator(schema)
                errors = [e for e in bounded_errors(validator, dict(arguments),
                                                    seconds=_CHECK_SECONDS)
                          if _counts(e, roots)]
        except (SchemaError, PatternError, Unresolvable, RecursionError):
            errors = []  # the upstream's own schema is broken; it will judge the call itself
        except SchemaTooCostly as exc:
            problems.append(f"the arguments are too costly to check against the tool's input "
                            f"schema ({exc}); send smaller arguments")
        for error in sorted(errors, key=lambda e: list(map(str, e.absolute_path))):
            problems.append(f"{_where(error)}: {error.message[:300]}")
    return problems[:10]
