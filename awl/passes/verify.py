"""Verifying a pass and its whole chain with only the public keys and the revocation list."""

from __future__ import annotations

import binascii
import re
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, cast

import jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from awl.documents.checks import (
    LEEWAY,
    PassFacts,
    check_structure,
    issued_ahead,
    pass_rule_findings,
)
from awl.documents.errors import DocumentError, PassError
from awl.documents.models import Budget, PassClaims, epoch_seconds
from awl.documents.patterns import matches_any
from awl.passes.common import (
    ALGORITHM,
    DEFAULT_ISSUER,
    MAX_CHAIN,
    MAX_TOKEN_BYTES,
    PASS_TYPE,
    b64decode,
    json_object,
)

__all__ = ["REASONS", "VerifiedPass", "unverified_claims", "verify_pass"]

_HEADER_FIELDS = frozenset({"alg", "typ", "kid", "parent"})


_BASE64_ANY = re.compile(r"[A-Za-z0-9_+/-]*=*")


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

# Which verification reason a broken narrowing rule becomes.
_RULE_REASON = {"P2": "malformed", "P3": "chain_broken", "P4": "widened", "P5": "widened",
                "P6": "widened", "P7": "staged_delegated", "P8": "chain_broken"}


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


def _public_keys(jwks: Mapping[str, Any]) -> dict[str, Ed25519PublicKey]:
    found: dict[str, Ed25519PublicKey] = {}
    keys = jwks.get("keys") if isinstance(jwks, Mapping) else None
    for jwk in keys if isinstance(keys, list) else []:
        # Only Ed25519 keys can check an EdDSA pass; any other entry is skipped, never
        # reinterpreted (a key of another type is how algorithm confusion starts).
        if not (isinstance(jwk, Mapping) and jwk.get("kty") == "OKP"
                and jwk.get("crv") == "Ed25519" and isinstance(jwk.get("kid"), str)
                and jwk.get("alg", ALGORITHM) == ALGORITHM):
            continue
        try:
            found[jwk["kid"]] = Ed25519PublicKey.from_public_bytes(b64decode(jwk["x"]))
        except (KeyError, ValueError, binascii.Error):
            continue
    return found


def _refuse(reason: str, message: str) -> PassError:
    return PassError(message, reason=reason)


def _split(token: str) -> dict[str, Any]:
    """The token's protected header, checked for shape before anything is verified."""
    if not isinstance(token, str) or len(token) > MAX_TOKEN_BYTES:
        raise _refuse("malformed", f"a pass is a JWS compact string of at most "
                      f"{MAX_TOKEN_BYTES} bytes")
    parts = token.split(".")
    if len(parts) != 3:
        raise _refuse("malformed", "a pass has three dot-separated parts")
    decoded = []
    for name, part in zip(("header", "claims", "signature"), parts, strict=True):
        try:
            decoded.append(b64decode(part))
        except ValueError as exc:
            # Base64 of some spelling is a respelt token; anything else is not one at all.
            reason = "not_canonical" if _BASE64_ANY.fullmatch(part) else "malformed"
            raise _refuse(reason, f"the pass {name} is {exc}: send the token exactly as it "
                          "was issued") from None
    try:
        header = json_object(decoded[0])
    except (ValueError, binascii.Error, DocumentError) as exc:
        raise _refuse("malformed", f"the pass header is not base64url JSON: {exc}") from None
    alg = header.get("alg")
    if alg != ALGORITHM:
        raise _refuse("bad_algorithm", f"algorithm {alg!r} is refused: passes are signed "
                      f"with {ALGORITHM} only")
    unknown = sorted(set(header) - _HEADER_FIELDS)
    if unknown:
        raise _refuse("malformed", f"unexpected header fields {unknown}")
    if header.get("typ") != PASS_TYPE:
        raise _refuse("malformed", f"typ {header.get('typ')!r} is not {PASS_TYPE!r}")
    if not isinstance(header.get("kid"), str):
        raise _refuse("unknown_kid", "the pass header names no kid")
    if "parent" in header and not isinstance(header["parent"], str):
        raise _refuse("malformed", "the parent header is not a token")
    return header


@lru_cache(maxsize=1024)
def _read_claims(payload: bytes) -> PassClaims:
    """Claims from a signed payload, checked under V1 and P1.

    Cached by the payload bytes alone (the result depends on nothing else), because a gateway
    verifies the same passes on every call and the schema check is most of the cost.
    """
    try:
        _, model, found = check_structure(json_object(payload), "pass")
    except (ValueError, DocumentError) as exc:
        raise _refuse("malformed", f"the pass claims are not a JSON object: {exc}") from None
    if model is None:
        first = found[0]
        raise _refuse("unsupported_version" if first.rule == "V1" else "malformed",
                      f"bad pass claims: {first.rule} {first.path or '/'}: {first.message}")
    return cast(PassClaims, model)


@dataclass(frozen=True, slots=True)
class _Check:
    keys: Mapping[str, Ed25519PublicKey]
    revoked: Container[str]
    audience: str
    issuer: str
    now: float
    leeway: float

    def link(self, token: str) -> tuple[str, PassClaims, str | None]:
        """One link's kid, verified claims and parent token; the chain is not looked at."""
        header = _split(token)
        kid = header["kid"]
        key = self.keys.get(kid)
        if key is None:
            raise _refuse("unknown_kid", f"no published key has kid {kid!r} (another desk's, "
                          "or retired)")
        try:
            payload = jwt.api_jws.decode_complete(token, key, algorithms=[ALGORITHM])["payload"]
        except jwt.InvalidSignatureError:
            raise _refuse("bad_signature", "the pass signature does not verify") from None
        except jwt.PyJWTError as exc:
            raise _refuse("malformed", f"unreadable pass: {exc}") from None
        claims = _read_claims(payload)
        if claims.jti in self.revoked:
            raise _refuse("revoked", f"pass {claims.jti} is revoked")
        if self.now >= claims.exp + self.leeway:
            raise _refuse("expired", f"pass {claims.jti} expired at {claims.exp}")
        if self.now < claims.nbf - self.leeway:
            raise _refuse("not_yet_valid", f"pass {claims.jti} is not valid before "
                          f"{claims.nbf}")
        if issued_ahead(claims, self.now, self.leeway):
            raise _refuse("issued_in_future", f"pass {claims.jti} says it was issued at "
                          f"{claims.iat}, later than now ({int(self.now)}) beyond the "
                          f"{self.leeway:g} s leeway")
        if claims.iss != self.issuer:
            raise _refuse("wrong_issuer", f"pass {claims.jti} is issued by {claims.iss!r}, "
                          f"not {self.issuer!r}")
        if claims.aud != self.audience:
            raise _refuse("wrong_audience", f"pass {claims.jti} is for {claims.aud!r}, "
                          f"not {self.audience!r}")
        parent = header.get("parent")
        if (parent is None) != (claims.grant.parent_jti is None):
            raise _refuse("chain_broken", f"pass {claims.jti}: parent_jti and the parent "
                          "token come together or not at all")
        return kid, claims, parent

    def chain(self, token: str) -> tuple[str, list[PassClaims]]:
        """The kid of ``token`` and every link's claims, worker's pass first."""
        links: list[PassClaims] = []
        kid = ""
        next_token: str | None = token
        while next_token is not None:
            if len(links) == MAX_CHAIN:
                raise _refuse("chain_too_long", f"a chain has at most {MAX_CHAIN} links")
            link_kid, claims, next_token = self.link(next_token)
            kid = kid or link_kid
            links.append(claims)
        links.reverse()
        self.narrowing(links)
        return kid, links

    def narrowing(self, links: Sequence[PassClaims]) -> None:
        root = links[0]
        if root.grant.staged is None:
            # Without the order's staged tools no one could tell what must stay held.
            raise _refuse("malformed", f"worker's pass {root.jti} does not state staged tools")
        facts = PassFacts.of_root(root)
        for parent, child in zip([None, *links[:-1]], links, strict=True):
            for finding in pass_rule_findings(child, facts, parent, None, None):
                raise _refuse(_RULE_REASON[finding.rule],
                              f"pass {child.jti}: {finding.rule} {finding.path}: "
                              f"{finding.message}")


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
        leeway: clock skew tolerated on ``exp`` and ``nbf``, in seconds.

    Raises:
        PassError: with ``reason`` one of :data:`REASONS`.
        BadRequest: ``now`` is not a time within years 1 to 9999.
    """
    check = _Check(_public_keys(jwks), revoked, audience, issuer, epoch_seconds(now), leeway)
    kid, links = check.chain(token)
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
        raise _refuse("malformed", f"not a readable pass: {exc}") from None
