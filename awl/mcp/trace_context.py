"""W3C trace context a client sends in ``_meta``, bounded to what the W3C allows.

A worker's ``traceparent`` and ``tracestate`` go on to spans and to upstream servers
(OBS-2). They are the worker's own text, so :func:`bound_meta` keeps them only as W3C Trace
Context (Level 1) permits: a ``traceparent`` that does not parse is dropped, and the
``tracestate`` with it (a list without its parent means nothing); a ``tracestate`` keeps
its well-formed members, the first of each key, at most :data:`MAX_MEMBERS` of them, and
is cut to :data:`MAX_TRACESTATE` characters the way the W3C says a propagator may (members
longer than 128 characters go first, then members from the end). Other keys are left as
they are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["MAX_MEMBERS", "MAX_TRACESTATE", "bound_meta", "bound_tracestate", "needs_bounding"]

MAX_MEMBERS = 32
"""The most list members a ``tracestate`` has (W3C Trace Context)."""
MAX_TRACESTATE = 512
"""The length, in characters, a ``tracestate`` is cut to (W3C Trace Context's bound for
propagating one whole)."""
_LONG_MEMBER = 128
"""Members longer than this are the first dropped when a ``tracestate`` is cut."""

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_KEY_CHARS = r"[a-z0-9_\-*/]"
_KEY = re.compile(rf"[a-z]{_KEY_CHARS}{{0,255}}"
                  rf"|[a-z0-9]{_KEY_CHARS}{{0,240}}@[a-z]{_KEY_CHARS}{{0,13}}")
_VALUE = re.compile(r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")
_OWS = " \t"


def _traceparent(value: Any) -> str | None:
    """``value`` as a valid ``traceparent``, or None. A version above ``00`` keeps the
    four fields this version defines (its longer form starts with them and a dash)."""
    if not isinstance(value, str) or len(value) > 512:
        return None
    found = _TRACEPARENT.match(value)
    if found is None:
        return None
    version, trace_id, parent_id, _flags = found.groups()
    rest = value[found.end():]
    if version == "ff" or (version == "00" and rest) or (rest and not rest.startswith("-")):
        return None
    if trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return found.group(0)


def bound_tracestate(value: Any) -> str | None:
    """``value``'s well-formed members (the first of each key, at most
    :data:`MAX_MEMBERS`), cut to :data:`MAX_TRACESTATE`; None when none is left."""
    if not isinstance(value, str):
        return None
    members: list[str] = []
    keys: set[str] = set()
    # A list longer than any W3C allows is read no further than it could matter.
    for part in value[:64 * 1024].split(","):
        member = part.strip(_OWS)
        key, eq, item = member.partition("=")
        if not eq or key in keys or not _KEY.fullmatch(key) or not _VALUE.fullmatch(item):
            continue
        keys.add(key)
        members.append(member)
        if len(members) == MAX_MEMBERS:
            break
    while members and len(",".join(members)) > MAX_TRACESTATE:
        long = next((i for i in reversed(range(len(members)))
                     if len(members[i]) > _LONG_MEMBER), None)
        members.pop(len(members) - 1 if long is None else long)
    return ",".join(members) or None


def bound_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    """``meta`` with its ``traceparent`` and ``tracestate`` bounded (see the module text);
    the same mapping's keys otherwise, in their order."""
    if "traceparent" not in meta and "tracestate" not in meta:
        return dict(meta)
    parent = _traceparent(meta.get("traceparent"))
    state = bound_tracestate(meta.get("tracestate")) if parent is not None else None
    out: dict[str, Any] = {}
    for key, value in meta.items():
        if key == "traceparent":
            if parent is not None:
                out[key] = parent
        elif key == "tracestate":
            if state is not None:
                out[key] = state
        else:
            out[key] = value
    return out


def needs_bounding(meta: Any) -> bool:
    """Whether :func:`bound_meta` would change ``meta`` (a mapping holding trace context)."""
    return isinstance(meta, Mapping) and ("traceparent" in meta or "tracestate" in meta) \
        and bound_meta(meta) != dict(meta)
