"""Who a gateway call runs as: the order's worker, or the holder of a verified pass.

Its own module because the gateway, its desk tools and its pass-through handlers all read
it, and the gateway builds on the other two.
"""

from __future__ import annotations

from dataclasses import dataclass

from awl.documents import PassError
from awl.passes import VerifiedPass

__all__ = ["Authority"]


@dataclass(frozen=True, slots=True)
class Authority:
    """Who a call runs as: the order's worker (no token), or a pass holder.

    ``error`` says why a presented pass cannot be used (it stays None without a token).
    """

    token: str | None
    verified: VerifiedPass | None = None
    error: PassError | None = None

    @property
    def problem(self) -> str | None:
        """Why the pass cannot be used, for a refusal; None when it can (or there is none)."""
        return None if self.error is None else self.error.message
