"""The page's side of the display rule (SPEC SEC-14, :mod:`awl.documents.display`).

Every value a template prints goes through :func:`finalize` (the Jinja environment's
``finalize``): a string is escaped with each marked character drawn as a box naming it, so
no template can forget the rule. A value that must reach the browser exactly as stored (a
form field, a ``data-`` attribute a script or a test reads, a raw JSON view) is printed
through the ``exact`` filter, which only escapes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup, escape

from awl.documents.display import Mark, pieces
from awl.documents.pointers import pointer

__all__ = ["Field", "exact", "exact_json", "fields", "finalize", "shown"]


def shown(text: str) -> Markup:
    """``text`` escaped, each marked character a ``<span class="mark">`` naming it (its
    kind in ``data-kind``, what it is in ``title``), the character itself left out."""
    out = []
    for piece in pieces(text, lines=True):
        if isinstance(piece, Mark):
            out.append(Markup('<span class="mark" data-kind="{}" title="{}">{}</span>').format(
                piece.kind, piece.title, piece.code))
        else:
            out.append(escape(piece))
    return Markup("").join(out)


def finalize(value: Any) -> Any:
    """What a template prints for ``value``: markup as it is, a string through
    :func:`shown`, anything else as Jinja prints it."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return shown(value)
    return value


def exact(value: Any) -> Markup:
    """``value`` escaped and nothing else: for form fields and attributes that must carry
    the stored text exactly."""
    return escape("" if value is None else str(value))


@dataclass(frozen=True)
class Field:
    """One top-level field of a held call's arguments, as the page shows it."""

    name: str
    """The argument's name, as sent."""
    label: str
    """The schema's ``title`` for it, else its name."""
    description: str | None
    """The schema's ``description`` for it."""
    where: str
    """A JSON pointer to it in the arguments."""
    value: Any
    """Its value as stored."""
    in_schema: bool
    """Whether the tool's schema names it."""

    @property
    def text(self) -> str | None:
        """The value when it is a string (shown as text, wrapped), else None."""
        return self.value if isinstance(self.value, str) else None

    @property
    def json(self) -> str:
        """The value as indented JSON (for anything but a string)."""
        return json.dumps(self.value, indent=2, ensure_ascii=False)


def fields(arguments: Mapping[str, Any], schema: Mapping[str, Any] | None) -> list[Field]:
    """The arguments' fields in the order the tool's input ``schema`` lists its
    ``properties``, labelled from it; those it does not list follow in their stored order."""
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    props = props if isinstance(props, Mapping) else {}
    order = [k for k in props if k in arguments] + [k for k in arguments if k not in props]
    out = []
    for key in order:
        spec = props.get(key)
        spec = spec if isinstance(spec, Mapping) else {}
        title, about = spec.get("title"), spec.get("description")
        out.append(Field(
            name=key, label=title if isinstance(title, str) and title.strip() else key,
            description=about if isinstance(about, str) and about.strip() else None,
            where=pointer(key), value=arguments[key], in_schema=key in props))
    return out


def exact_json(value: Any) -> str:
    """``value`` as JSON exactly as stored (its key order, every character past ASCII as a
    ``\\u`` escape), so nothing in it can hide."""
    return json.dumps(value, indent=2, ensure_ascii=True)
