"""Findings: what a check says about a document."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["invalid", "limit"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One numbered rule broken by a document.

    ``kind`` is ``invalid`` (the document is refused) or ``limit`` (accepted, recorded, and
    the order expires). ``path`` is a JSON pointer into the document the rule is about.
    """

    rule: str
    kind: Kind
    path: str
    message: str

    def to_dict(self) -> dict[str, str]:
        """The finding as the JSON object the conformance suite compares."""
        return {"rule": self.rule, "kind": self.kind, "path": self.path, "message": self.message}

