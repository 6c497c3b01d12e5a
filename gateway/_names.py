"""Exposed tool names: what the worker's model sees in place of canonical ``server/tool``.

Many model APIs accept only tool names matching ``^[a-zA-Z0-9_-]{1,64}$``, so the canonical
name (used in orders, reports, refs and logs) is shown in a plain or a hashed form (SPEC GW-1;
``notes/send_email`` → ``notes__send_email``, ``mail.v2/send`` → ``mail-v2__send``), and
looked up exactly (GW-2).

Why the forms never collide: only hashed forms end in ``_`` and 10 hex digits, plain forms in
one :class:`NameTable` are unique (a shared plain form hashes *all* of its names, so the
table does not depend on listing order), and hashed forms differ unless 40 bits of SHA-256
collide, which :class:`NameTable` checks and refuses. Every exposed upstream name contains
``__`` (server names are at most 40 characters, the hashed form keeps the first 53), so
names without it are free for the gateway's own tools. The same canonical names always give
the same table.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import TypeVar

from awl.documents import TOOL_NAME_RE, NotFound

EXPOSED_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""What model APIs accept as a tool name."""

SEPARATOR = "__"
"""Between server and tool in an exposed name; every exposed upstream name contains it."""

_V = TypeVar("_V")
_MAX = 64
_HASH_HEX = 10
_HASHED_TAIL_RE = re.compile(rf"_[0-9a-f]{{{_HASH_HEX}}}$")


def split_canonical(canonical: str) -> tuple[str, str]:
    """Split ``server/tool`` into its two parts.

    Raises:
        ValueError: ``canonical`` is not an exact ``server/tool`` name.
    """
    m = TOOL_NAME_RE.match(canonical)
    if m is None or canonical.endswith("\n"):
        raise ValueError(f"{canonical!r} is not a server/tool name")
    return m.group("server"), m.group("tool")


def plain_name(canonical: str) -> str:
    """Rule 1: ``server__tool`` with ``.`` turned into ``-``; may be too long or ambiguous."""
    server, tool = split_canonical(canonical)
    return server.replace(".", "-") + SEPARATOR + tool.replace(".", "-")


def server_of(exposed: str, servers: Iterable[str]) -> str | None:
    """The server among ``servers`` whose tools would be exposed with ``exposed``'s prefix.

    Both forms keep ``server + "__"`` (dots turned into ``-``) at the start, so this names
    the server an unresolved name was meant for (the longest match, if several fit).
    """
    fits = [s for s in servers if exposed.startswith(s.replace(".", "-") + SEPARATOR)]
    return max(fits, key=len, default=None)


def hashed_name(canonical: str) -> str:
    """Rule 2: the plain form cut short, plus ``_`` and 10 hex digits of SHA-256."""
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:_HASH_HEX]
    return plain_name(canonical)[: _MAX - _HASH_HEX - 1] + "_" + digest


def exposed_name(canonical: str) -> str:
    """The exposed name of ``canonical`` when nothing else in its table shares its plain form.

    Use :meth:`NameTable.exposed` for the name actually shown: within a table, names whose
    plain forms collide are all hashed.

    Raises:
        ValueError: ``canonical`` is not an exact ``server/tool`` name.
    """
    plain = plain_name(canonical)
    if len(plain) > _MAX or _HASHED_TAIL_RE.search(plain):
        return hashed_name(canonical)
    return plain


class NameTable:
    """Both directions of the mapping for one set of canonical tool names. Immutable.

    Args:
        canonical_names: Every upstream tool, as ``server/tool``. Duplicates are ignored.
        reserved: Exposed names the gateway uses for its own tools; a clash is refused.

    Raises:
        ValueError: A name is not ``server/tool``, or (practically never) two hashed names
            or a reserved name collide.
    """

    __slots__ = ("_by_canonical", "_by_exposed", "_parts")

    def __init__(self, canonical_names: Iterable[str], *, reserved: Iterable[str] = ()) -> None:
        names = sorted(set(canonical_names))
        plain_counts: dict[str, int] = {}
        for name in names:
            plain = exposed_name(name)
            plain_counts[plain] = plain_counts.get(plain, 0) + 1
        by_exposed: dict[str, str] = {}
        by_canonical: dict[str, str] = {}
        for name in names:
            shown = exposed_name(name)
            if plain_counts[shown] > 1:
                shown = hashed_name(name)
            if shown in by_exposed:
                raise ValueError(
                    f"tool names {by_exposed[shown]!r} and {name!r} both map to {shown!r}; "
                    "rename one upstream server"
                )
            by_exposed[shown] = name
            by_canonical[name] = shown
        for name in reserved:
            if name in by_exposed:
                raise ValueError(f"upstream tool {by_exposed[name]!r} would take the name {name!r}")
        self._by_exposed: Mapping[str, str] = MappingProxyType(by_exposed)
        self._by_canonical: Mapping[str, str] = MappingProxyType(by_canonical)
        # Split once here: a proxy resolves a name on every call.
        self._parts = {shown: split_canonical(name) for shown, name in by_exposed.items()}

    def exposed(self, canonical: str) -> str:
        """The exposed name of the canonical name ``canonical``.

        Raises:
            NotFound: ``canonical`` is not in the table.
        """
        try:
            return self._by_canonical[canonical]
        except KeyError:
            raise NotFound(f"no upstream tool is called {canonical!r}") from None

    def canonical(self, exposed: str) -> str:
        """The canonical ``server/tool`` behind the exposed name ``exposed``; exact match only.

        Raises:
            NotFound: ``exposed`` is not exactly a name in the table.
        """
        return _exact(self._by_exposed, exposed)

    def resolve(self, exposed: str) -> tuple[str, str]:
        """``(server, tool)`` behind the exposed name ``exposed``; exact match only.

        Raises:
            NotFound: ``exposed`` is not exactly a name in the table.
        """
        return _exact(self._parts, exposed)

    def __contains__(self, exposed: object) -> bool:
        return isinstance(exposed, str) and exposed in self._by_exposed

    def __iter__(self) -> Iterator[str]:
        """Exposed names, sorted by canonical name."""
        return iter(self._by_canonical.values())

    def __len__(self) -> int:
        return len(self._by_exposed)

    def items(self) -> Iterator[tuple[str, str]]:
        """``(canonical, exposed)`` pairs, sorted by canonical name."""
        return iter(self._by_canonical.items())


def _exact(table: Mapping[str, _V], exposed: str) -> _V:
    """``table[exposed]``; NotFound when ``exposed`` is not exactly one of its names."""
    try:
        return table[exposed]
    except (KeyError, TypeError):
        raise NotFound(f"no tool is exposed as {exposed!r}") from None
