"""Delegation Passes: signed grants that only narrow, checkable without the desk.

A pass is a JWS compact token (EdDSA over Ed25519) whose payload is a
:class:`~awl.PassClaims` document. The desk signs every pass with a key from its
:class:`KeyStore`; the public half is published as a JWKS document.

* The **worker's pass** is issued from an order. Its grant states what a verifier needs
  about the order: ``order_id``, ``manager``, ``deadline`` and the ``staged`` patterns.
* A **derived pass** (a sub-agent's) is issued from a parent pass. Its grant names the
  parent's ``jti`` and its protected header carries the parent token itself (``parent``),
  which carries its own parent, back to the worker's pass. So a verifier holding only the
  JWKS and the revocation list can check every link and re-check that each one narrows its
  parent (rules P3..P9 of SPEC.md).

Issuing refuses with :class:`~awl.PassError` whose ``reason`` is the broken rule id (``P4``);
verifying refuses with a stable reason code (see :data:`REASONS`).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import math
import os
import re
import secrets
import stat
import time
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from awl.documents.checks import (
    _no_invalid,
    _validated,
    check_structure,
    context_model,
    load_document,
)
from awl.documents.errors import BadRequest, DocumentError, InvalidTransition, NotFound, PassError
from awl.documents.findings import Finding
from awl.documents.lifecycle import WORKING
from awl.documents.limits import (
    MAX_EPOCH,
    MIN_EPOCH,
    check_amounts,
    check_epoch,
    check_instant,
    is_finite_number,
    show_value,
)
from awl.documents.models import Budget, PassClaims, WorkOrder, format_time, parse_time
from awl.documents.patterns import covered_by_any, matches_any, overlap
from awl.documents.pointers import pointer
from awl.store.protocol import PassRecord, Scope, Store, Usage

__all__ = [
    "ALGORITHM",
    "DEFAULT_AUDIENCE",
    "DEFAULT_ISSUER",
    "LEEWAY",
    "MAX_CHAIN",
    "PASS_SPEC",
    "PASS_TYPE",
    "REASONS",
    "KeySet",
    "KeyStore",
    "VerifiedPass",
    "is_valid_pass",
    "issue_pass",
    "issue_recorded_pass",
    "iter_pass_findings",
    "pass_scopes",
    "record_pass",
    "remaining_budget",
    "revoke_order_passes",
    "revoke_pass",
    "unverified_claims",
    "validate_pass",
    "verify_pass",
]

ALGORITHM = "EdDSA"
"""The only signature algorithm a pass may use; anything else is refused before any key is used."""
PASS_SPEC = "awl/delegation-pass@0.3"
"""What this implementation writes in ``spec``."""
PASS_TYPE = "awl-pass+jwt"
"""The ``typ`` header of every pass, so no other JWT the same key signs can pass for one."""
DEFAULT_ISSUER = "awl:desk"
"""``iss`` of the passes a desk signs."""
DEFAULT_AUDIENCE = "awl:gateway"
"""``aud`` of a worker's pass when none is asked for."""
LEEWAY = 30
"""Seconds of clock skew tolerated on ``exp``, ``nbf`` and ``iat``."""
MAX_CHAIN = 8
"""Most links in a chain (the worker's pass counts as one)."""
MAX_TOKEN_BYTES = 64 * 1024
"""Tokens longer than this are refused unread."""

_HEADER_FIELDS = frozenset({"alg", "typ", "kid", "parent"})
_COUNT_UNITS = frozenset({"tokens", "tool_calls"})
_KID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_B64URL = re.compile(r"[A-Za-z0-9_-]*")
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


# -- small codecs -------------------------------------------------------------------------


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes:
    """The bytes of canonical unpadded base64url text (DP-11), else ValueError.

    Canonical: the base64url alphabet only, no padding, and the unused low bits of the last
    character zero, so each byte string has exactly one spelling and a token cannot be
    respelt (``T==``, another last character) into one that still verifies.
    """
    if not isinstance(text, str) or _B64URL.fullmatch(text) is None or len(text) % 4 == 1:
        raise ValueError("not canonical unpadded base64url")
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64encode(data) != text:
        raise ValueError("not canonical base64url (the last character's unused bits are set)")
    return data


def _json_object(data: bytes) -> dict[str, Any]:
    # Strict reading (no duplicate names, no NaN): two readers of one token must never see
    # different values for the same name.
    value = load_document(data, max_bytes=MAX_TOKEN_BYTES)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def _epoch(when: datetime | str | float | None, name: str = "now") -> float:
    """Seconds since the epoch for ``now``-like arguments (None: the clock).

    Raises:
        BadRequest: not an aware datetime, an RFC 3339 string or a number of seconds
            within years 1 to 9999 (DOC-14).
    """
    if when is None:
        return time.time()
    if isinstance(when, datetime):
        if when.tzinfo is None:
            raise BadRequest("a time without an offset is ambiguous: give an aware datetime")
        try:
            return check_instant(when, name=name).timestamp()
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
    if isinstance(when, str):
        try:
            return parse_time(when).timestamp()
        except ValueError as exc:
            raise BadRequest(f"{name}: {exc}") from None
    return float(check_epoch(when, name=name))


def _thumbprint(x: str) -> str:
    # RFC 7638: the required members only, sorted, no whitespace.
    canonical = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": x},
                           separators=(",", ":"), sort_keys=True)
    return _b64encode(hashlib.sha256(canonical.encode("ascii")).digest())


def _public_x(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return _b64encode(raw)


# -- keys ---------------------------------------------------------------------------------


class KeyStore:
    """The desk's Ed25519 signing keys, kept under ``<home>/keys/``.

    The folder is created owner-only (0700) and every key file owner-only (0600); a key file
    or folder that group or others can open is refused, never used. ``kid`` is the key's
    RFC 7638 thumbprint. :meth:`rotate` makes a new current key and keeps the old ones in the
    JWKS, so passes they signed verify until they expire.

    Files: ``<kid>.pem`` (PKCS #8 private key) per key, and ``current`` naming the signing kid.
    """

    def __init__(self, home: str | os.PathLike[str]) -> None:
        self.folder = Path(home) / "keys"
        """Where the key files live."""

    # Files ---------------------------------------------------------------------------
    def _check_mode(self, path: Path, st: os.stat_result) -> None:
        if os.name == "nt":
            return  # POSIX modes do not describe Windows ACLs
        if st.st_mode & 0o077:
            mode = stat.S_IMODE(st.st_mode)
            kind = "folder" if stat.S_ISDIR(st.st_mode) else "file"
            fix = 700 if kind == "folder" else 600
            raise PassError(
                f"key {kind} {path} is open to group or others (mode {mode:04o}); "
                f"run `chmod {fix} {path}` and check nobody else copied it",
                reason="insecure_key")
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise PassError(f"key {path} belongs to another user; the desk's own keys only",
                            reason="insecure_key")

    def _ensure_folder(self) -> None:
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._check_mode(self.folder, self.folder.stat())

    def _write_new(self, name: str, data: bytes) -> None:
        # O_EXCL: a key file is written once, by one process, owner-only from the start.
        fd = os.open(self.folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def _read(self, name: str) -> bytes:
        path = self.folder / name
        fd = os.open(path, os.O_RDONLY)
        with os.fdopen(fd, "rb") as f:
            self._check_mode(path, os.fstat(f.fileno()))  # the file we read, not a swapped one
            return f.read()

    def _new_key(self) -> str:
        key = Ed25519PrivateKey.generate()
        kid = _thumbprint(_public_x(key.public_key()))
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        self._write_new(f"{kid}.pem", pem)
        return kid

    def _point_current(self, kid: str, *, replace: bool) -> None:
        tmp = f".current.{secrets.token_hex(8)}"
        self._write_new(tmp, kid.encode("ascii"))
        try:
            if replace:
                os.replace(self.folder / tmp, self.folder / "current")
            else:
                # link() fails when another process made the first key first; theirs wins.
                with contextlib.suppress(FileExistsError):
                    os.link(self.folder / tmp, self.folder / "current")
        finally:
            (self.folder / tmp).unlink(missing_ok=True)

    # Public ---------------------------------------------------------------------------
    @property
    def current_kid(self) -> str:
        """The kid new passes are signed with (a key is made on first use)."""
        self._ensure_folder()
        if not (self.folder / "current").exists():
            self._point_current(self._new_key(), replace=False)
        return self._read("current").decode("ascii").strip()

    def kids(self) -> list[str]:
        """Every kid kept, the current one included, sorted."""
        self._ensure_folder()
        return sorted(p.stem for p in self.folder.glob("*.pem"))

    def private_key(self, kid: str) -> Ed25519PrivateKey:
        """The private key ``kid``.

        Raises:
            PassError: ``unknown_kid`` when there is no such key, ``insecure_key`` when its
                file is open to others.
        """
        self._ensure_folder()
        # A kid is a base64url thumbprint; anything else never names a file here.
        if _KID.match(kid) is None or not (self.folder / f"{kid}.pem").is_file():
            raise PassError(f"no signing key {kid!r} in {self.folder}", reason="unknown_kid")
        try:
            key = serialization.load_pem_private_key(self._read(f"{kid}.pem"), password=None)
        except (ValueError, TypeError):
            key = None
        if not isinstance(key, Ed25519PrivateKey):
            raise PassError(f"key file {self.folder / kid}.pem is not an unencrypted Ed25519 "
                            "PEM key; remove it or restore it from a backup",
                            reason="insecure_key")
        return key

    def rotate(self) -> str:
        """Make a new current signing key and return its kid; old keys stay published."""
        self._ensure_folder()
        kid = self._new_key()
        self._point_current(kid, replace=True)
        return kid

    def retire(self, kid: str) -> None:
        """Delete key ``kid`` for good, so every pass it signed stops verifying (DP-13).

        Verifiers that read this folder (a :class:`KeySet`: the gateway, the desk) refuse
        those passes, and every pass derived from one, from their next request on.

        Raises:
            NotFound: there is no key ``kid``.
            BadRequest: ``kid`` is the current signing key (rotate first).
        """
        self._ensure_folder()
        if _KID.match(kid) is None or not (self.folder / f"{kid}.pem").is_file():
            raise NotFound(f"no signing key {kid!r} in {self.folder}; `awl pass jwks` lists "
                           "the kids")
        if kid == self.current_kid:
            raise BadRequest(f"{kid} is the current signing key; run `awl pass rotate` first, "
                             "then retire it")
        (self.folder / f"{kid}.pem").unlink()

    def key_files(self) -> frozenset[str]:
        """The names of the key files kept now: one directory listing, no key is read."""
        try:
            return frozenset(n for n in os.listdir(self.folder) if n.endswith(".pem"))
        except FileNotFoundError:
            return frozenset()

    def jwks(self) -> dict[str, Any]:
        """The public JWKS document: every kept key's public part, current key first."""
        current = self.current_kid
        keys = []
        for kid in sorted(self.kids(), key=lambda k: k != current):
            x = _public_x(self.private_key(kid).public_key())
            keys.append({"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid,
                         "alg": ALGORITHM, "use": "sig"})
        return {"keys": keys}

    def sign(self, claims: Mapping[str, Any], *, parent: str | None = None) -> str:
        """Sign ``claims`` as a pass with the current key, no questions asked.

        This is the raw signer under :func:`issue_pass`, which checks the claims first;
        call it directly only to make test tokens.
        """
        kid = self.current_kid
        headers: dict[str, Any] = {"typ": PASS_TYPE, "kid": kid}
        if parent is not None:
            headers["parent"] = parent
        payload = json.dumps(dict(claims), separators=(",", ":"), sort_keys=True)
        return jwt.api_jws.encode(payload.encode("utf-8"), self.private_key(kid),
                                  algorithm=ALGORITHM, headers=headers)


class KeySet:
    """The public key set of a desk's keys folder for a running verifier, always current.

    Calling it returns the JWKS document. It lists the folder on every call and reads the
    keys again whenever a key file was added (``awl pass rotate``) or removed (``awl pass
    retire``), so a long-running gateway trusts exactly the keys kept now, from the next
    request on, without a restart (DP-13).
    """

    def __init__(self, keys: KeyStore) -> None:
        self.keys = keys
        """Where the keys are read from."""
        self._known: tuple[frozenset[str], dict[str, Any]] | None = None

    def __call__(self) -> dict[str, Any]:
        names = self.keys.key_files()  # listed before reading: a change after it reloads
        known = self._known
        if known is not None and known[0] == names:
            return known[1]
        jwks = self.keys.jwks()
        self._known = (names, jwks)
        return jwks


# -- rules --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _OrderFacts:
    """What the P rules need about an order, from the order or from a worker's pass."""

    order_id: str
    manager: str | None
    tools: tuple[str, ...]
    budget: Mapping[str, float]
    deadline: str | None
    staged: tuple[str, ...]

    @classmethod
    def of_order(cls, order: WorkOrder) -> _OrderFacts:
        return cls(order.id, order.manager, order.tools, order.budget.units(),
                   order.deadline, order.staged)

    @classmethod
    def of_root(cls, root: PassClaims) -> _OrderFacts:
        g = root.grant
        return cls(g.order_id, g.manager, g.tools, g.budget.units(), g.deadline,
                   g.staged or ())


def _bad(rule: str, path: str, message: str) -> Finding:
    return Finding(rule, "invalid", path, message)


def _time_findings(claims: PassClaims, now: float | None) -> Iterator[Finding]:
    problems = []
    if claims.exp <= claims.nbf:
        problems.append(f"exp {claims.exp} is not after nbf {claims.nbf}")
    if claims.iat > claims.exp:
        problems.append(f"iat {claims.iat} is after exp {claims.exp}")
    if now is not None and claims.exp <= now:
        problems.append(f"exp {claims.exp} is not after the time of issue {int(now)}")
    if problems:
        yield _bad("P2", "/exp", "; ".join(problems))
    if now is not None and _issued_ahead(claims, now, LEEWAY):
        yield _bad("P9", "/iat", f"iat {claims.iat} is more than {LEEWAY} s after the time "
                   f"{int(now)}: a pass is never dated in the future")


def _issued_ahead(claims: PassClaims, now: float, leeway: float) -> bool:
    """Whether ``iat`` lies further ahead of ``now`` than the clock leeway (P9)."""
    return claims.iat > now + leeway


def _order_findings(claims: PassClaims, facts: _OrderFacts) -> Iterator[Finding]:
    g = claims.grant
    if g.order_id != facts.order_id:
        yield _bad("P3", "/grant/order_id",
                   f"the pass is for order {g.order_id!r}, not {facts.order_id!r}")
    if g.manager is not None and facts.manager is not None and g.manager != facts.manager:
        yield _bad("P3", "/grant/manager",
                   f"the order's manager is {facts.manager!r}, not {g.manager!r}")


def _tool_findings(claims: PassClaims, facts: _OrderFacts | None,
                   parent: PassClaims | None) -> Iterator[Finding]:
    if parent is not None:
        outer, whose = parent.grant.tools, "the parent pass"
    elif facts is not None:
        outer, whose = facts.tools, "the order"
    else:
        return
    for i, pattern in enumerate(claims.grant.tools):
        if not covered_by_any(outer, pattern):
            yield _bad("P4", pointer("grant", "tools", i),
                       f"{pattern} is not covered by {whose}'s tools {list(outer)}")


def _budget_findings(claims: PassClaims, facts: _OrderFacts | None, parent: PassClaims | None,
                     remaining: Mapping[str, float] | None) -> Iterator[Finding]:
    if parent is not None:
        base, whose = parent.grant.budget.units(), "the parent pass"
    elif facts is not None:
        base, whose = dict(facts.budget), "the order"
    else:
        return
    granted = claims.grant.budget.units()
    for unit in sorted(base):
        limit = base[unit]
        if remaining is not None and unit in remaining:
            limit = min(limit, remaining[unit])
        where = pointer("grant", "budget", unit)
        if unit not in granted:
            yield _bad("P5", where, f"{whose} limits {unit}; the pass must limit it too")
        elif granted[unit] > limit:
            yield _bad("P5", where, f"{unit} {granted[unit]} is more than the {limit} that "
                       f"remains of {whose}'s budget")


def _expiry_findings(claims: PassClaims, facts: _OrderFacts | None,
                     parent: PassClaims | None) -> Iterator[Finding]:
    problems = []
    if parent is not None and claims.exp > parent.exp:
        problems.append(f"exp {claims.exp} is after the parent pass's exp {parent.exp}")
    deadline = facts.deadline if facts is not None else None
    if deadline is not None and claims.exp > parse_time(deadline).timestamp():
        problems.append(f"exp {claims.exp} is after the order deadline {deadline}")
    if problems:
        yield _bad("P6", "/exp", "; ".join(problems))
    stated = claims.grant.deadline
    if (stated is not None and deadline is not None
            and parse_time(stated) != parse_time(deadline)):
        yield _bad("P6", "/grant/deadline",
                   f"the order's deadline is {deadline}, not {stated}")


def _staged_findings(claims: PassClaims, facts: _OrderFacts | None) -> Iterator[Finding]:
    if facts is None:
        return
    g = claims.grant
    if g.staged is not None and set(g.staged) != set(facts.staged):
        yield _bad("P7", "/grant/staged",
                   f"the order stages {list(facts.staged)}, not {list(g.staged)}")
    if g.parent_jti is None:
        return  # the worker's own pass may hold staged tools: the gateway holds their calls
    for i, pattern in enumerate(g.tools):
        hit = [s for s in facts.staged if overlap(pattern, s) is not None]
        if hit:
            yield _bad("P7", pointer("grant", "tools", i),
                       f"{pattern} reaches staged {hit}: a staged tool is never delegated")


def _parent_findings(claims: PassClaims, parent: PassClaims | None) -> Iterator[Finding]:
    if parent is not None and claims.grant.parent_jti != parent.jti:
        yield _bad("P8", "/grant/parent_jti",
                   f"parent_jti {claims.grant.parent_jti!r} is not the parent's jti "
                   f"{parent.jti!r}")


def _rule_findings(claims: PassClaims, facts: _OrderFacts | None, parent: PassClaims | None,
                   remaining: Mapping[str, float] | None, now: float | None
                   ) -> Iterator[Finding]:
    yield from _time_findings(claims, now)
    if facts is not None:
        yield from _order_findings(claims, facts)
    yield from _tool_findings(claims, facts, parent)
    yield from _budget_findings(claims, facts, parent, remaining)
    yield from _expiry_findings(claims, facts, parent)
    yield from _staged_findings(claims, facts)
    yield from _parent_findings(claims, parent)


def iter_pass_findings(
    claims: Any,
    *,
    order: Any = None,
    parent: Any = None,
    remaining: Mapping[str, float] | None = None,
    now: datetime | str | float | None = None,
) -> Iterator[Finding]:
    """Findings for a pass's claims: V1, P1 (schema), then P2..P9.

    When V1 or P1 fails, nothing else runs (the later rules assume the structure).

    Args:
        claims: the claims, as JSON data or a :class:`~awl.PassClaims`.
        order: the order the pass is for (rules P3, P6, P7 and the fallback of P4, P5).
        parent: the parent pass's claims, for a derived pass (P4, P5, P6, P8).
        remaining: per budget unit, what is left of the parent's (or the order's) budget;
            a unit not given counts as its full limit.
        now: the time of issue; when given, P2 also wants ``exp`` after it and P9 wants
            ``iat`` no later than it plus the leeway.

    Raises:
        DocumentError: ``claims`` cannot be a JSON document at all, or ``order`` or
            ``parent`` is not a valid document.
        BadRequest: ``now`` is not a time within years 1 to 9999, or ``remaining`` does not
            map unit names to finite numbers.
    """
    remaining = check_amounts(remaining, name="remaining")
    t = None if now is None else _epoch(now)
    _, model, found = check_structure(claims, "pass")
    yield from found
    if model is None:
        return
    order_model = None if order is None else context_model(order, "order", WorkOrder, "order")
    parent_model = (None if parent is None
                    else context_model(parent, "pass", PassClaims, "parent"))
    yield from _rule_findings(cast(PassClaims, model),
                              _OrderFacts.of_order(order_model) if order_model else None,
                              parent_model, remaining, t)


def is_valid_pass(
    claims: Any,
    *,
    order: Any = None,
    parent: Any = None,
    remaining: Mapping[str, float] | None = None,
    now: datetime | str | float | None = None,
) -> bool:
    """Whether a pass's claims have no ``invalid`` finding (DOC-9).

    Takes the same arguments as :func:`iter_pass_findings`.

    Raises:
        DocumentError: ``claims`` cannot be a JSON document at all, or ``order`` or
            ``parent`` is not a valid document.
        BadRequest: ``now`` is not a time within years 1 to 9999, or ``remaining`` does not
            map unit names to finite numbers.
    """
    return _no_invalid(iter_pass_findings(claims, order=order, parent=parent,
                                          remaining=remaining, now=now))


def validate_pass(
    claims: Any,
    *,
    order: Any = None,
    parent: Any = None,
    remaining: Mapping[str, float] | None = None,
    now: datetime | str | float | None = None,
) -> PassClaims:
    """A pass's claims as a model, when they have no ``invalid`` finding (DOC-9).

    Takes the same arguments as :func:`iter_pass_findings`. This checks the claims only;
    a token's signature and chain are :func:`verify_pass`'s.

    Raises:
        ValidationFailed: with every finding, when one is ``invalid``.
        DocumentError: ``claims`` cannot be a JSON document at all, or ``order`` or
            ``parent`` is not a valid document.
        BadRequest: ``now`` is not a time within years 1 to 9999, or ``remaining`` does not
            map unit names to finite numbers.
    """
    found = iter_pass_findings(claims, order=order, parent=parent, remaining=remaining,
                               now=now)
    return _validated(PassClaims, "delegation pass", found, claims)


# -- verifying ----------------------------------------------------------------------------


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
            found[jwk["kid"]] = Ed25519PublicKey.from_public_bytes(_b64decode(jwk["x"]))
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
            decoded.append(_b64decode(part))
        except ValueError as exc:
            # Base64 of some spelling is a respelt token; anything else is not one at all.
            reason = "not_canonical" if _BASE64_ANY.fullmatch(part) else "malformed"
            raise _refuse(reason, f"the pass {name} is {exc}: send the token exactly as it "
                          "was issued") from None
    try:
        header = _json_object(decoded[0])
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
        _, model, found = check_structure(_json_object(payload), "pass")
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
        if _issued_ahead(claims, self.now, self.leeway):
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
        facts = _OrderFacts.of_root(root)
        for parent, child in zip([None, *links[:-1]], links, strict=True):
            for finding in _rule_findings(child, facts, parent, None, None):
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
    check = _Check(_public_keys(jwks), revoked, audience, issuer, _epoch(now), leeway)
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
        return _json_object(_b64decode(parts[0])), _json_object(_b64decode(parts[1]))
    except (ValueError, binascii.Error, DocumentError) as exc:
        raise _refuse("malformed", f"not a readable pass: {exc}") from None


# -- issuing ------------------------------------------------------------------------------


def _default_budget(base: Mapping[str, float],
                    remaining: Mapping[str, float] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for unit, limit in base.items():
        value = max(0.0, min(limit, (remaining or {}).get(unit, limit)))
        out[unit] = math.floor(value) if unit in _COUNT_UNITS else value
    return out


def _expiry(now: float, cap: float, expires_in: timedelta | float | None,
            exp: datetime | str | float | None) -> int:
    if expires_in is not None and exp is not None:
        raise BadRequest("give expires_in or exp, not both")
    if expires_in is not None:
        seconds = (expires_in.total_seconds() if isinstance(expires_in, timedelta)
                   else expires_in)
        if not is_finite_number(seconds) or not MIN_EPOCH <= now + seconds <= MAX_EPOCH:
            raise BadRequest(f"expires_in must be a number of seconds that ends within years "
                             f"1 to 9999, not {show_value(seconds)}")
        return math.floor(now + seconds)
    if exp is not None:
        return math.floor(_epoch(exp, "exp"))
    return math.floor(cap)


def issue_pass(
    order: WorkOrder,
    *,
    subject: str,
    keys: KeyStore,
    audience: str | None = None,
    tools: Iterable[str] | None = None,
    budget: Budget | Mapping[str, float] | None = None,
    expires_in: timedelta | float | None = None,
    exp: datetime | str | float | None = None,
    parent_token: str | None = None,
    remaining: Mapping[str, float] | None = None,
    revoked: Container[str] = (),
    issuer: str = DEFAULT_ISSUER,
    now: datetime | str | float | None = None,
) -> str:
    """Issue a worker's pass from ``order``, or a derived pass from ``parent_token``.

    Defaults take the most the rules allow: the parent's (else the order's) tools, its
    budget capped by ``remaining``, and its ``exp`` (else the order deadline). Anything asked
    for beyond that is refused, never trimmed.

    Args:
        order: the order the authority comes from.
        subject: who will hold the pass (``sub``).
        keys: the desk's signing keys.
        audience: who will accept it; default the parent's, else :data:`DEFAULT_AUDIENCE`.
        tools: tool patterns to grant.
        budget: limits to grant, per unit.
        expires_in: lifetime from ``now`` (seconds or a timedelta).
        exp: absolute expiry instead of ``expires_in``.
        parent_token: the pass to derive from (verified here, chain and all).
        remaining: per unit, what is left of the parent's (or the order's) budget.
        revoked: revoked jtis, checked against the parent's chain.
        issuer: ``iss``.
        now: the time of issue (default: the clock).

    Raises:
        PassError: ``reason`` is the rule id the pass would break (``P4``, ``P7`` ...),
            ``not_worker`` for a worker's pass to anyone but the order's worker, or a
            verification reason when ``parent_token`` does not verify.
        BadRequest: for contradictory or malformed arguments (``now``, ``exp``, ``expires_in``
            or ``remaining`` that is not a time within years 1 to 9999 or a number).
    """
    t = _epoch(now)
    remaining = check_amounts(remaining, name="remaining")
    parent: VerifiedPass | None = None
    if parent_token is None and subject != order.to:
        raise PassError(f"a worker's pass goes to the order's worker {order.to}, not {subject}; "
                        "give a sub-agent a pass derived from the worker's",
                        reason="not_worker")
    if parent_token is not None:
        if audience is None:
            aud = unverified_claims(parent_token)[1].get("aud")
            audience = aud if isinstance(aud, str) else DEFAULT_AUDIENCE
        parent = verify_pass(parent_token, jwks=keys.jwks(), revoked=revoked,
                             audience=audience, issuer=issuer, now=t)
        if parent.order_id != order.id:
            raise PassError(f"the parent pass is for order {parent.order_id}, not {order.id}",
                            reason="P3")
        if len(parent.chain) >= MAX_CHAIN:
            # Never sign what no verifier would accept (DP-12).
            raise PassError(f"the parent pass is already link {len(parent.chain)} of a chain "
                            f"and verifiers accept at most {MAX_CHAIN} links; derive from a "
                            "pass nearer the worker's", reason="chain_too_long")
    audience = audience or DEFAULT_AUDIENCE
    base = parent.claims.grant if parent is not None else None
    if budget is None:
        budget_units = _default_budget(base.budget.units() if base else order.budget.units(),
                                       remaining)
    elif isinstance(budget, Budget):
        budget_units = budget.units()
    else:
        budget_units = dict(budget)
    cap = parent.claims.exp if parent else parse_time(order.deadline).timestamp()
    if tools is not None:
        tool_list = list(tools)
    elif base is None:
        tool_list = list(order.tools)
    else:
        # By default a sub-agent gets every parent tool that reaches no staged tool.
        tool_list = [t for t in base.tools
                     if not any(overlap(t, s) is not None for s in order.staged)]
        if base.tools and not tool_list:
            raise PassError("every tool of the parent pass reaches a staged tool, which is "
                            "never delegated; name narrower tools", reason="P7")
    grant: dict[str, Any] = {"order_id": order.id, "tools": tool_list, "budget": budget_units}
    if parent is not None:
        grant["parent_jti"] = parent.jti
    else:
        grant.update(manager=order.manager, deadline=order.deadline, staged=list(order.staged))
    claims = {"spec": PASS_SPEC, "iss": issuer, "sub": subject, "aud": audience,
              "jti": secrets.token_hex(12), "iat": math.floor(t), "nbf": math.floor(t),
              "exp": _expiry(t, cap, expires_in, exp), "grant": grant}
    findings = list(iter_pass_findings(claims, order=order,
                                       parent=parent.claims if parent else None,
                                       remaining=remaining, now=t))
    if findings:
        first = findings[0]
        raise PassError("pass refused: " + "; ".join(f"{f.rule} {f.path}: {f.message}"
                                                     for f in findings), reason=first.rule)
    return keys.sign(claims, parent=parent_token)


# -- with a store -------------------------------------------------------------------------


def _stamp(t: float) -> str:
    return format_time(datetime.fromtimestamp(t, UTC))


def record_pass(store: Store, token: str) -> PassRecord:
    """Remember an issued pass under its order, so the order's end can revoke it.

    Reads the token's claims without verifying them: call it with tokens you just issued.
    """
    _, data = unverified_claims(token)
    claims = PassClaims.model_validate(data)
    record = PassRecord(jti=claims.jti, order_id=claims.grant.order_id,
                        parent_jti=claims.grant.parent_jti, subject=claims.sub,
                        exp=claims.exp, issued_at=_stamp(claims.iat))
    store.save_pass(record)
    return record


def revoke_pass(store: Store, jti: str, reason: str, *,
                now: datetime | str | float | None = None) -> None:
    """Revoke one pass; every pass derived from it stops verifying too (idempotent)."""
    if not jti:
        raise BadRequest("name the pass to revoke by its jti")
    store.revoke(jti, reason=reason or "revoked", at=_stamp(_epoch(now)))


def revoke_order_passes(store: Store, order_id: str, *, reason: str = "order ended",
                        now: datetime | str | float | None = None) -> list[str]:
    """Revoke every pass issued for an order (the desk calls this when the order ends).

    Returns:
        The jtis newly revoked, in the order they were issued.
    """
    issued = store.passes(order_id)
    if not issued:  # most orders never get a pass; skip reading every revocation
        return []
    done = store.revoked()
    fresh = [p.jti for p in issued if p.jti not in done]
    at = _stamp(_epoch(now))
    for jti in fresh:
        store.revoke(jti, reason=reason, at=at)
    return fresh


def remaining_budget(store: Store, order: WorkOrder,
                     parent: VerifiedPass | None = None) -> dict[str, float]:
    """What is left to grant, per budget unit: of the order and of every link of ``parent``.

    A link's spending is the calls made under it and under every pass derived from it.
    Only ``usd`` and ``tool_calls`` are counted by the desk; other units count as unspent.
    """
    left = _minus(order.budget.units(), store.usage(order.id))
    if parent is not None:
        children = _children(store, order.id)
        for link in parent.chain:
            spent = store.usage(order.id, frozenset(_subtree(link.jti, children)))
            for unit, value in _minus(link.grant.budget.units(), spent).items():
                left[unit] = min(left.get(unit, value), value)
    return left


def pass_scopes(store: Store, verified: VerifiedPass) -> list[Scope]:
    """Budget scopes for a call made under ``verified``: one per link, the worker's first.

    A link's scope counts the calls made under it and under every pass derived from it (the
    ones the store has recorded, plus the links below it in this chain), against that link's
    ``tool_calls`` and ``usd`` limits. Give them to :meth:`awl.Store.reserve_call` with the
    order's own scope.
    """
    children = _children(store, verified.order_id)
    scopes = []
    for i, link in enumerate(verified.chain):
        below = {c.jti for c in verified.chain[i:]}
        units = link.grant.budget.units()
        tool_calls = units.get("tool_calls")
        scopes.append(Scope(
            jtis=frozenset(_subtree(link.jti, children) | below),
            max_calls=None if tool_calls is None else int(tool_calls),
            max_usd=units.get("usd"),
            name=f"pass {link.jti}"))
    return scopes


def _children(store: Store, order_id: str) -> dict[str, list[str]]:
    children: dict[str, list[str]] = {}
    for record in store.passes(order_id):
        if record.parent_jti is not None:
            children.setdefault(record.parent_jti, []).append(record.jti)
    return children


def _minus(budget: Mapping[str, float], spent: Usage) -> dict[str, float]:
    used = {"usd": spent.usd, "tool_calls": spent.tool_calls}
    return {unit: max(0.0, limit - used.get(unit, 0)) for unit, limit in budget.items()}


def _subtree(jti: str, children: Mapping[str, list[str]]) -> set[str]:
    out, todo = set(), [jti]
    while todo:
        current = todo.pop()
        if current not in out:
            out.add(current)
            todo.extend(children.get(current, ()))
    return out


def issue_recorded_pass(
    store: Store,
    order_id: str,
    *,
    keys: KeyStore,
    subject: str,
    audience: str | None = None,
    tools: Iterable[str] | None = None,
    budget: Budget | Mapping[str, float] | None = None,
    expires_in: timedelta | float | None = None,
    parent_token: str | None = None,
    issuer: str = DEFAULT_ISSUER,
    now: datetime | str | float | None = None,
) -> str:
    """Issue a pass for a stored order, against what remains of its budget, and record it.

    Raises:
        NotFound: no such order.
        InvalidTransition: the order is not accepted or working.
        PassError: as :func:`issue_pass`.
    """
    record = store.load(order_id)
    if record.state not in WORKING:
        raise InvalidTransition(f"order {order_id} is {record.state}; passes are issued while "
                                "it is accepted or working", state=record.state,
                                action="issue_pass")
    revoked = store.revoked()
    t = _epoch(now)
    parent = None
    if parent_token is not None:
        aud = audience or unverified_claims(parent_token)[1].get("aud")
        parent = verify_pass(parent_token, jwks=keys.jwks(), revoked=revoked,
                             audience=aud if isinstance(aud, str) else DEFAULT_AUDIENCE,
                             issuer=issuer, now=t)
    token = issue_pass(record.order, subject=subject, keys=keys, audience=audience, tools=tools,
                       budget=budget, expires_in=expires_in, parent_token=parent_token,
                       remaining=remaining_budget(store, record.order, parent),
                       revoked=revoked, issuer=issuer, now=t)
    record_pass(store, token)
    return token
