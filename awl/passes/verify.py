"""Verifying a pass and its whole chain with only the public keys and the revocation list.

What a verified pass is (:class:`VerifiedPass`) and :func:`verify_pass` live here; the checks
of each link, with PyJWT and cryptography, are :mod:`awl.passes.chain`'s, loaded with the
first pass verified.
"""

from __future__ import annotations

import binascii
from collections.abc import Container, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from awl.documents.checks import LEEWAY
from awl.documents.errors import BadRequest, DocumentError
from awl.documents.limits import is_finite_number, show_value
from awl.documents.models import Budget, PassClaims, epoch_seconds
from awl.documents.patterns import matches_any
from awl.passes.common import DEFAULT_ISSUER, MAX_CHAIN, b64decode, json_object, refuse

__all__ = ["REASONS", "VerifiedPass", "unverified_claims", "verify_pass"]


REASONS: Mapping[str, str] = {
    "malformed": "not a well-formed pass (token, header or claims)",
    "not_canonical": "a part of the token is not canonical unpadded base64url (DP-11)",
    "bad_algorithm": "the header names an algorithm other than EdDSA",
    "unknown_kid": "no key in the key set has the header's kid",
    "bad_signature": "the signature does not match the token",
    "unsupported_version": "the claims' spec version is not one this reader knows (V1)",
    "expired": "exp has passed (beyond the leeway)",
    "not_yet_valid": "nbf is still ahead (beyond the leeway)",
    "wrong_audience": "aud is not the verifier's audience",
    "wrong_issuer": "iss is not the issuer the verifier trusts (DP-14)",
    "issued_in_future": "iat is ahead of the verifier's clock beyond the leeway (P9)",
    "revoked": "this pass or one it derives from is revoked",
    "chain_broken": "the parent token does not belong to this pass (P3, P8)",
    "chain_too_long": f"more than {MAX_CHAIN} links",
    "widened": "a link grants more than its parent or its order (P4, P5, P6)",
    "staged_delegated": "a derived link grants a staged tool (P7)",
    "insecure_key": "a signing key file or folder is open to others, or unreadable",
}
"""Every reason code :func:`verify_pass` (and :class:`KeyStore`) may refuse with."""

@dataclass(frozen=True, slots=True)
class VerifiedPass:
    """A pass that verified, with its whole chain."""

    token: str
    """The token as presented."""
    kid: str
    """The key that signed it."""
    claims: PassClaims
    """Its claims."""
    chain: tuple[PassClaims, ...]
    """Every link's claims, the worker's pass first and this pass last."""

    @property
    def jti(self) -> str:
        """This pass's id (call records name it)."""
        return self.claims.jti

    @property
    def subject(self) -> str:
        """Who holds it."""
        return self.claims.sub

    @property
    def order_id(self) -> str:
        """The order its authority comes from."""
        return self.claims.grant.order_id

    @property
    def tools(self) -> tuple[str, ...]:
        """The tool patterns it grants."""
        return self.claims.grant.tools

    @property
    def budget(self) -> Budget:
        """Its own budget (every link's budget also applies: see :attr:`chain`)."""
        return self.claims.grant.budget

    @property
    def staged(self) -> tuple[str, ...]:
        """The order's staged patterns, from the worker's pass."""
        return self.chain[0].grant.staged or ()

    @property
    def jtis(self) -> tuple[str, ...]:
        """Every jti of the chain, the worker's pass first."""
        return tuple(c.jti for c in self.chain)

    def allows(self, tool: str) -> bool:
        """Whether the pass grants the exact tool name ``tool``."""
        return matches_any(self.tools, tool)

    def is_staged(self, tool: str) -> bool:
        """Whether calls to ``tool`` are held for the manager's approval."""
        return matches_any(self.staged, tool)


def verify_pass(
    token: str,
    *,
    jwks: Mapping[str, Any],
    revoked: Container[str],
    audience: str,
    issuer: str = DEFAULT_ISSUER,
    now: datetime | str | float | None = None,
    leeway: float = LEEWAY,
) -> VerifiedPass:
    """Verify a pass and its whole chain with only the public keys and the revocation list.

    Every link is checked the same way (canonical spelling, algorithm EdDSA only, known kid,
    signature, claims, not revoked, ``exp``/``nbf``/``iat`` within ``leeway`` seconds,
    audience, issuer), then each derived
    link is checked to narrow its parent and the order stated in the worker's pass.

    Args:
        token: the pass as presented.
        jwks: the desk's public JWKS document (:meth:`KeyStore.jwks`).
        revoked: revoked jtis (a set, or the mapping :meth:`awl.Store.revoked` returns).
        audience: who is verifying; every link's ``aud`` must equal it.
        issuer: the desk whose passes are trusted; every link's ``iss`` must equal it.
        now: the time to check against (default: the clock).
        leeway: clock skew tolerated on ``exp``, ``nbf`` and ``iat``, in seconds: a finite
            number, 0 or more.

    Raises:
        PassError: with ``reason`` one of :data:`REASONS`.
        BadRequest: ``now`` is not a time within years 1 to 9999, or ``leeway`` is not a
            finite number of seconds, 0 or more (NaN would turn every time check off).
    """
    if not is_finite_number(leeway) or leeway < 0:
        raise BadRequest(f"leeway must be a finite number of seconds, 0 or more, not "
                         f"{show_value(leeway)}")
    # PyJWT and cryptography load with the first pass verified (a gateway without one never
    # verifies any).
    from awl.passes.chain import verified_chain
    kid, links = verified_chain(token, jwks=jwks, revoked=revoked, audience=audience,
                                issuer=issuer, now=epoch_seconds(now), leeway=leeway)
    return VerifiedPass(token=token, kid=kid, claims=links[-1], chain=tuple(links))


def unverified_claims(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The header and claims of a token, NOT verified (for display only).

    Raises:
        PassError: ``malformed`` when the token cannot be read at all.
    """
    parts = token.split(".") if isinstance(token, str) else []
    try:
        if len(parts) != 3:
            raise ValueError("a pass has three dot-separated parts")
        return json_object(b64decode(parts[0])), json_object(b64decode(parts[1]))
    except (ValueError, binascii.Error, DocumentError) as exc:
        raise refuse("malformed", f"not a readable pass: {exc}") from None
