"""The checks of a pass's every link: signature, claims, times, audience, issuer, chain.

:func:`awl.passes.verify.verify_pass` is the entry point; this module holds what needs PyJWT
and cryptography, so that only a process verifying a pass loads them.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast

import jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from awl.documents.checks import PassFacts, check_structure, issued_ahead, pass_rule_findings
from awl.documents.errors import DocumentError
from awl.documents.models import PassClaims
from awl.passes.common import (
    ALGORITHM,
    MAX_CHAIN,
    MAX_TOKEN_BYTES,
    PASS_TYPE,
    b64decode,
    json_object,
    refuse,
    shown,
)

__all__ = ["verified_chain"]

_HEADER_FIELDS = frozenset({"alg", "typ", "kid", "parent"})


_BASE64_ANY = re.compile(r"[A-Za-z0-9_+/-]*=*")


# Which verification reason a broken narrowing rule becomes.
_RULE_REASON = {"P2": "malformed", "P3": "chain_broken", "P4": "widened", "P5": "widened",
                "P6": "widened", "P7": "staged_delegated", "P8": "chain_broken"}


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


def _split(token: str) -> dict[str, Any]:
    """The token's protected header, checked for shape before anything is verified."""
    if not isinstance(token, str) or len(token) > MAX_TOKEN_BYTES:
        size = f", not {len(token)}" if isinstance(token, str) else ""
        raise refuse("malformed", f"a pass is a JWS compact string of at most "
                      f"{MAX_TOKEN_BYTES} bytes{size}")
    parts = token.split(".")
    if len(parts) != 3:
        raise refuse("malformed", "a pass has three dot-separated parts")
    decoded = []
    for name, part in zip(("header", "claims", "signature"), parts, strict=True):
        try:
            decoded.append(b64decode(part))
        except ValueError as exc:
            # Base64 of some spelling is a respelt token; anything else is not one at all.
            reason = "not_canonical" if _BASE64_ANY.fullmatch(part) else "malformed"
            raise refuse(reason, f"the pass {name} is {exc}: send the token exactly as it "
                          "was issued") from None
    try:
        header = json_object(decoded[0])
    except (ValueError, binascii.Error, DocumentError) as exc:
        raise refuse("malformed", f"the pass header is not base64url JSON: {exc}") from None
    alg = header.get("alg")
    if alg != ALGORITHM:
        raise refuse("bad_algorithm", f"algorithm {shown(alg)} is refused: passes are "
                      f"signed with {ALGORITHM} only")
    unknown = sorted(set(header) - _HEADER_FIELDS)
    if unknown:
        names = ", ".join(shown(name, 40) for name in unknown[:5])
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise refuse("malformed", f"unexpected header fields {names}{more}")
    if header.get("typ") != PASS_TYPE:
        raise refuse("malformed", f"typ {shown(header.get('typ'))} is not {PASS_TYPE!r}")
    if not isinstance(header.get("kid"), str):
        raise refuse("unknown_kid", "the pass header names no kid")
    if "parent" in header and not isinstance(header["parent"], str):
        raise refuse("malformed", "the parent header is not a token")
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
        raise refuse("malformed", f"the pass claims are not a JSON object: {exc}") from None
    if model is None:
        first = found[0]
        raise refuse("unsupported_version" if first.rule == "V1" else "malformed",
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
            raise refuse("unknown_kid", f"no published key has kid {shown(kid)} (another "
                          "desk's, or retired)")
        try:
            payload = jwt.api_jws.decode_complete(token, key, algorithms=[ALGORITHM])["payload"]
        except jwt.InvalidSignatureError:
            raise refuse("bad_signature", "the pass signature does not verify") from None
        except jwt.PyJWTError as exc:
            raise refuse("malformed", f"unreadable pass: {exc}") from None
        claims = _read_claims(payload)
        if claims.jti in self.revoked:
            raise refuse("revoked", f"pass {claims.jti} is revoked")
        if self.now >= claims.exp + self.leeway:
            raise refuse("expired", f"pass {claims.jti} expired at {claims.exp}")
        if self.now < claims.nbf - self.leeway:
            raise refuse("not_yet_valid", f"pass {claims.jti} is not valid before "
                          f"{claims.nbf}")
        if issued_ahead(claims, self.now, self.leeway):
            raise refuse("issued_in_future", f"pass {claims.jti} says it was issued at "
                          f"{claims.iat}, later than now ({int(self.now)}) beyond the "
                          f"{self.leeway:g} s leeway")
        if claims.iss != self.issuer:
            raise refuse("wrong_issuer", f"pass {claims.jti} is issued by {claims.iss!r}, "
                          f"not {self.issuer!r}")
        if claims.aud != self.audience:
            raise refuse("wrong_audience", f"pass {claims.jti} is for {claims.aud!r}, "
                          f"not {self.audience!r}")
        parent = header.get("parent")
        if (parent is None) != (claims.grant.parent_jti is None):
            raise refuse("chain_broken", f"pass {claims.jti}: parent_jti and the parent "
                          "token come together or not at all")
        return kid, claims, parent

    def chain(self, token: str) -> tuple[str, list[PassClaims]]:
        """The kid of ``token`` and every link's claims, worker's pass first."""
        if not isinstance(token, str):
            raise refuse("malformed", f"a pass is a JWS compact string, not "
                          f"{shown(token)}")
        links: list[PassClaims] = []
        kid = ""
        next_token: str | None = token
        while next_token is not None:
            if len(links) == MAX_CHAIN:
                raise refuse("chain_too_long", f"a chain has at most {MAX_CHAIN} links")
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
            raise refuse("malformed", f"worker's pass {root.jti} does not state staged tools")
        facts = PassFacts.of_root(root)
        for parent, child in zip([None, *links[:-1]], links, strict=True):
            for finding in pass_rule_findings(child, facts, parent, None, None):
                raise refuse(_RULE_REASON[finding.rule],
                              f"pass {child.jti}: {finding.rule} {finding.path}: "
                              f"{finding.message}")




def verified_chain(token: str, *, jwks: Mapping[str, Any], revoked: Container[str],
                   audience: str, issuer: str, now: float, leeway: float
                   ) -> tuple[str, list[PassClaims]]:
    """The kid of ``token`` and every link's verified claims, the worker's pass first (see
    :func:`~awl.passes.verify.verify_pass`, whose arguments these are; ``now`` in epoch
    seconds).

    Raises:
        PassError: with ``reason`` one of :data:`~awl.passes.verify.REASONS`.
    """
    return _Check(_public_keys(jwks), revoked, audience, issuer, now, leeway).chain(token)
