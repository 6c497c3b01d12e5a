"""Versions of the documents, as the published AWL numbers them (SPEC.md section 3.2).

A reader accepts orders ``@0.1``-``@0.4`` and reports ``@0.1``-``@0.3`` (what the published
package reads), passes ``@0.1``-``@0.3``. A writer names the lowest version that has every
published member the document uses, so a reader that predates a member still reads the
documents that leave it out.

This implementation's extensions (a criterion's ``check``, a handoff's ``next_steps`` and
``files``) are members no published version has. :func:`to_published` moves them into one
top-level ``x-awl`` member, where a published reader accepts and ignores them, and
:func:`from_published` puts them back where this specification keeps them; every reader here
does that before it checks a document.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

__all__ = [
    "EXTENSION",
    "READS",
    "from_published",
    "order_spec_for",
    "report_spec_for",
    "spec_for",
    "to_published",
    "uses_extensions",
]

READS: Mapping[str, tuple[str, ...]] = {
    "order": ("0.1", "0.2", "0.3", "0.4"),
    "report": ("0.1", "0.2", "0.3"),
    "pass": ("0.1", "0.2", "0.3"),
}
"""The versions a reader accepts, per versioned document type (rule V1)."""

EXTENSION = "x-awl"
"""The top-level member that carries this implementation's extensions in published form."""

_HANDOFF_EXTRAS = ("next_steps", "files")


def order_spec_for(order: Mapping[str, Any]) -> str:
    """The lowest Work Order version that has every published member ``order`` uses:
    ``staged`` came in 0.4, ``continues`` in 0.3, ``handoff`` in 0.2."""
    if order.get("staged") is not None:
        return "awl/work-order@0.4"
    if order.get("continues") is not None:
        return "awl/work-order@0.3"
    return "awl/work-order@0.2" if order.get("handoff") is not None else "awl/work-order@0.1"


def report_spec_for(report: Mapping[str, Any]) -> str:
    """The lowest Work Report version that has every published member ``report`` uses:
    ``effects`` came in 0.3, ``handoff`` in 0.2."""
    if report.get("effects") is not None:
        return "awl/work-report@0.3"
    return "awl/work-report@0.2" if report.get("handoff") is not None else "awl/work-report@0.1"


def spec_for(doc: Mapping[str, Any], doc_type: str) -> str:
    """:func:`order_spec_for` or :func:`report_spec_for`, by ``doc_type``."""
    return order_spec_for(doc) if doc_type == "order" else report_spec_for(doc)


def uses_extensions(doc: Any) -> bool:
    """Whether an order or report carries a member no published version has, where this
    specification keeps it (a criterion's ``check``, a handoff's ``next_steps`` or ``files``)."""
    return to_published(doc) is not doc


def to_published(doc: Any) -> Any:
    """An order or report as a published reader reads it: each criterion's ``check`` moved to
    ``x-awl.checks`` (by criterion id) and the handoff's ``next_steps`` and ``files`` to
    ``x-awl.handoff`` (the handoff left out when nothing else is in it, and a version that was
    the lowest to fit lowered with it); ``doc`` itself when it has none of them."""
    if not isinstance(doc, Mapping):
        return doc
    checks: dict[str, Any] = {}
    criteria = doc.get("criteria")
    if isinstance(criteria, list):
        for c in criteria:
            if isinstance(c, Mapping) and "check" in c and isinstance(c.get("id"), str):
                checks[c["id"]] = c["check"]
    handoff = doc.get("handoff")
    extras = ({k: handoff[k] for k in _HANDOFF_EXTRAS if k in handoff}
              if isinstance(handoff, Mapping) else {})
    if not checks and not extras:
        return doc
    out = copy.deepcopy(dict(doc))
    carried: dict[str, Any] = dict(out.get(EXTENSION) or {}) if isinstance(
        out.get(EXTENSION), Mapping) else {}
    if checks:
        out["criteria"] = [
            {k: v for k, v in c.items() if k != "check"}
            if isinstance(c, Mapping) and c.get("id") in checks else c
            for c in out["criteria"]]
        carried["checks"] = checks
    if extras:
        rest = {k: v for k, v in out["handoff"].items() if k not in _HANDOFF_EXTRAS}
        if rest:
            out["handoff"] = rest
        else:  # a published handoff is never empty: it all goes along
            del out["handoff"]
        carried["handoff"] = extras
    out[EXTENSION] = carried
    spec = doc.get("spec")
    for kind, prefix in (("order", "awl/work-order@"), ("report", "awl/work-report@")):
        if isinstance(spec, str) and spec.startswith(prefix) and spec == spec_for(doc, kind):
            out["spec"] = spec_for(out, kind)  # still the lowest that fits (DOC-6)
    return out


def from_published(doc: Any) -> Any:
    """The reverse of :func:`to_published`: an ``x-awl`` member's ``checks`` and ``handoff``
    put back where this specification keeps them (a check on the criterion of that id, the
    next steps and files in the handoff), unless the document already has one there. An
    ``x-awl`` that is not of that shape is left as it is, an ``x-`` member checks ignore.
    ``doc`` itself when there is nothing to put back."""
    if not isinstance(doc, Mapping):
        return doc
    carried = doc.get(EXTENSION)
    if not isinstance(carried, Mapping):
        return doc
    checks = carried.get("checks")
    extras = carried.get("handoff")
    checks = checks if isinstance(checks, Mapping) else {}
    extras = extras if isinstance(extras, Mapping) and isinstance(
        doc.get("handoff", {}), Mapping) else {}
    criteria = doc.get("criteria")
    if not isinstance(criteria, list):
        checks = {}
    if not checks and not extras:
        return doc
    out = copy.deepcopy(dict(doc))
    left = {k: v for k, v in carried.items() if k not in ("checks", "handoff")}
    if checks:
        placed = set()
        for c in out["criteria"]:
            if isinstance(c, dict) and c.get("id") in checks and "check" not in c:
                c["check"] = checks[c["id"]]
                placed.add(c["id"])
        unplaced = {k: v for k, v in checks.items() if k not in placed}
        if unplaced:
            left["checks"] = unplaced
    if extras:
        handoff = out.setdefault("handoff", {})
        for key, value in extras.items():
            if key in _HANDOFF_EXTRAS and key not in handoff:
                handoff[key] = value
            else:
                left.setdefault("handoff", {})[key] = value
    if left:
        out[EXTENSION] = left
    else:
        del out[EXTENSION]
    return out
