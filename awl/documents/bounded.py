"""JSON Schemas from outside, applied in bounded time (SPEC DOC-16).

An order's ``output_schema`` comes from a manager, an upstream tool's input schema from its
server; either may be hostile. Applied with the stock validator, a pattern such as
``(a+)+$`` backtracks for hours on a 41-character string, ``a{99999999999}`` raises
``OverflowError``, ``uniqueItems`` over objects compares every pair, and ``$ref`` chains can
multiply the work exponentially. Here:

- patterns (``pattern``, ``patternProperties``, ``format: regex``) run on RE2, whose time is
  linear in the text; a pattern RE2 cannot compile, or with a repetition count above 1,000,
  is not a valid pattern (:class:`PatternError`);
- ``uniqueItems`` sorts canonical forms instead of comparing pairs;
- every keyword application spends steps from a budget of :data:`MAX_SCHEMA_STEPS` and
  :data:`MAX_SCHEMA_SECONDS`; past either the check stops with :class:`SchemaTooCostly`.

This module depends only on :mod:`awl.documents.limits` and the schema libraries.
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

# Neither jsonschema nor google-re2 ships type hints.
import re2  # type: ignore[import-untyped]
from jsonschema import Draft202012Validator, FormatChecker  # type: ignore[import-untyped]
from jsonschema import validators as _validators
from jsonschema.exceptions import ValidationError  # type: ignore[import-untyped]

from awl.documents.errors import AWLError

__all__ = [
    "FORMAT_CHECKER",
    "MAX_REPEAT",
    "MAX_SCHEMA_SECONDS",
    "MAX_SCHEMA_STEPS",
    "PatternError",
    "SchemaTooCostly",
    "bounded_errors",
    "bounded_validator",
    "meta_errors",
]

MAX_SCHEMA_STEPS = 1_000_000
"""[DOC-16] Steps one schema check may take: a keyword applied to a value is one step, plus one
per enum member compared, per array item checked for uniqueness, per 256 characters a
pattern scans."""
MAX_SCHEMA_SECONDS = 5.0
"""[DOC-16] Seconds of work one schema check may take, whatever its steps."""
MAX_REPEAT = 1000
"""[DOC-16] Largest repetition count in a pattern (RE2's own limit)."""

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # RE2 would print every refused pattern on stderr
_REPEAT = re.compile(r"\{([0-9]*)(?:,([0-9]*))?\}")
_HEX4 = re.compile(r"[0-9A-Fa-f]{4}")


class PatternError(AWLError, ValueError):
    """A pattern the linear-time engine will not run; the message says why."""


class SchemaTooCostly(AWLError):
    """A schema check used up its :data:`MAX_SCHEMA_STEPS`."""


# --------------------------------------------------------------------------- patterns

def _translate(pattern: str) -> str:
    """The pattern in RE2's syntax: ECMA-262's ``\\uXXXX`` becomes ``\\x{XXXX}``.

    Raises:
        PatternError: a repetition count is above :data:`MAX_REPEAT` (RE2 would read a count
            it cannot hold as plain text, silently changing the pattern's meaning).
    """
    out: list[str] = []
    i, n, in_class = 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            if pattern[i + 1] == "u" and _HEX4.fullmatch(pattern, i + 2, i + 6):
                out.append("\\x{" + pattern[i + 2:i + 6] + "}")
                i += 6
                continue
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "{":
            m = _REPEAT.match(pattern, i)
            if m is not None and (m.group(1) or m.group(2)):
                for count in (m.group(1), m.group(2)):
                    if count and (len(count) > 6 or int(count) > MAX_REPEAT):
                        raise PatternError(f"repetition count {count[:20]} is above the "
                                           f"{MAX_REPEAT} allowed")
        out.append(c)
        i += 1
    return "".join(out)


@functools.lru_cache(maxsize=512)
def _compile(pattern: str) -> Any:
    try:
        return re2.compile(_translate(pattern), options=_OPTIONS)
    except re2.error as exc:
        message = exc.args[0] if exc.args else exc
        if isinstance(message, bytes):
            message = message.decode("utf-8", "replace")
        raise PatternError(f"{message}; write it without look-around or back-references, "
                           f"in RE2 syntax") from None
    except (UnicodeError, TypeError) as exc:  # a lone surrogate cannot be UTF-8
        raise PatternError(f"not a pattern RE2 can read ({exc})") from None


def _search(pattern: str, text: str) -> bool:
    _spend(1 + len(text) // 256)
    return _compile(pattern).search(text) is not None


def _show(value: str, limit: int = 60) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "…")


def _is_regex(instance: object) -> bool:
    if not isinstance(instance, str):
        return True
    _compile(instance)
    return True


FORMAT_CHECKER = FormatChecker(formats=())
"""2020-12's format checker with ``regex`` judged by RE2 (for O4's meta-schema check)."""
FORMAT_CHECKER.checkers = {**Draft202012Validator.FORMAT_CHECKER.checkers,
                           "regex": (_is_regex, PatternError)}


# --------------------------------------------------------------------------- step budget

class _Budget:
    __slots__ = ("deadline", "left", "seconds", "steps")

    def __init__(self, steps: int, seconds: float) -> None:
        self.steps = self.left = steps
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds


_BUDGET: ContextVar[_Budget | None] = ContextVar("awl_schema_budget", default=None)


def _spend(steps: int) -> None:
    budget = _BUDGET.get()
    if budget is None:
        return
    budget.left -= steps
    if budget.left < 0:
        raise SchemaTooCostly(f"the check took more than {budget.steps:,} steps")
    if time.monotonic() > budget.deadline:
        raise SchemaTooCostly(f"the check took more than {budget.seconds:g} s")


_Keyword = Callable[[Any, Any, Any, Any], Iterable[ValidationError] | None]


def _counted(keyword: _Keyword) -> _Keyword:
    def run(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
        _spend(1)
        found = keyword(validator, value, instance, schema)
        if found is not None:
            yield from found
    return run


def _pattern(validator: Any, pattern: Any, instance: Any, schema: Any
             ) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{_show(instance)} does not match {_show(pattern)}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any
                        ) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _canonical(value: Any) -> Any:
    # A hashable form in which two values are equal exactly when they are JSON-equal.
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return (type(value).__name__, value)
    if isinstance(value, int | float):
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        return ("number", value)
    if isinstance(value, Mapping):
        return ("object", frozenset((k, _canonical(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return ("array", tuple(_canonical(v) for v in value))
    return ("other", repr(value))


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any
                  ) -> Iterator[ValidationError]:
    if not unique or not validator.is_type(instance, "array"):
        return
    _spend(len(instance))
    seen: set[Any] = set()
    for item in instance:
        form = _canonical(item)
        if form in seen:
            yield ValidationError(f"{_show(repr(instance))} has non-unique elements")
            return
        seen.add(form)


def _weighted_enum(keyword: _Keyword) -> _Keyword:
    def run(validator: Any, value: Any, instance: Any, schema: Any) -> Iterable[ValidationError]:
        _spend(len(value) if isinstance(value, list) else 1)
        return keyword(validator, value, instance, schema) or ()
    return run


_CLASSES: dict[type[Any], type[Any]] = {}


def _bounded_class(base: type[Any]) -> type[Any]:
    known = _CLASSES.get(base)
    if known is not None:
        return known
    keywords: dict[str, _Keyword] = dict(base.VALIDATORS)
    if "pattern" in keywords:
        keywords["pattern"] = _pattern
    if "patternProperties" in keywords:
        keywords["patternProperties"] = _pattern_properties
    if "uniqueItems" in keywords:
        keywords["uniqueItems"] = _unique_items
    if "enum" in keywords:
        keywords["enum"] = _weighted_enum(keywords["enum"])
    counted = {name: _counted(keyword) for name, keyword in keywords.items()}
    extended: type[Any] = _validators.extend(base, validators=counted)
    _CLASSES[base] = extended
    return extended


def bounded_validator(schema: Mapping[str, Any] | bool, *, draft: type[Any] | None = None,
                      registry: Any = None, format_checker: Any = None) -> Any:
    """A validator for ``schema`` with RE2 patterns and the step budget's accounting.

    Args:
        schema: the schema.
        draft: the validator class whose rules apply (default: the one the schema's
            ``$schema`` names, else 2020-12).

    Use :func:`bounded_errors` to apply it within the step budget.
    """
    base: type[Any] = draft or _validators.validator_for(schema, default=Draft202012Validator)
    options: dict[str, Any] = {"format_checker": format_checker}
    if registry is not None:
        options["registry"] = registry
    return _bounded_class(base)(schema, **options)


def meta_errors(schema: Any, *, draft: type[Any] | None = None) -> list[ValidationError]:
    """Why ``schema`` is not a valid schema of its draft (default: its ``$schema``, else
    2020-12), formats asserted and patterns judged by RE2; empty when it is valid.

    The meta-schema is fixed, so this takes time linear in the schema's size.
    """
    base: type[Any] = draft or _validators.validator_for(schema, default=Draft202012Validator)
    meta = _META.get(base)
    if meta is None:
        meta = _META[base] = base(base.META_SCHEMA, format_checker=FORMAT_CHECKER)
    return sorted(meta.iter_errors(schema), key=lambda e: list(map(str, e.path)))


_META: dict[type[Any], Any] = {}


def bounded_errors(validator: Any, instance: Any, *, steps: int | None = None,
                   seconds: float | None = None) -> list[ValidationError]:
    """Every error of ``instance`` against a :func:`bounded_validator`, within the budget.

    Args:
        steps, seconds: the budget (default :data:`MAX_SCHEMA_STEPS`,
            :data:`MAX_SCHEMA_SECONDS`).

    Raises:
        SchemaTooCostly: ``steps`` or ``seconds`` ran out.
        PatternError: the schema has a pattern RE2 cannot run.
    """
    token = _BUDGET.set(_Budget(MAX_SCHEMA_STEPS if steps is None else steps,
                                MAX_SCHEMA_SECONDS if seconds is None else seconds))
    try:
        return list(validator.iter_errors(instance))
    finally:
        _BUDGET.reset(token)
