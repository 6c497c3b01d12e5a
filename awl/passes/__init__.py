"""Delegation Passes: signed grants that only narrow, checkable without the desk.

A pass is a JWS compact token (EdDSA over Ed25519) whose payload is a
:class:`~awl.PassClaims` document. The desk signs every pass with a key from its
:class:`~awl.passes.keys.KeyStore`; the public half is published as a JWKS document.

* The **worker's pass** is issued from an order. Its grant states what a verifier needs
  about the order: ``order_id``, ``manager``, ``deadline`` and the ``staged`` patterns.
* A **derived pass** (a sub-agent's) is issued from a parent pass. Its grant names the
  parent's ``jti`` and its protected header carries the parent token itself (``parent``),
  which carries its own parent, back to the worker's pass. So a verifier holding only the
  JWKS and the revocation list can check every link and re-check that each one narrows its
  parent (rules P3..P9 of SPEC.md).

Issuing refuses with :class:`~awl.PassError` whose ``reason`` is the broken rule id (``P4``);
verifying refuses with a stable reason code (see :data:`~awl.passes.verify.REASONS`).

Modules, each importing only those named before it: ``common`` (the format's constants and
codecs), ``keys``, ``verify``, ``records`` (what the store keeps), ``issue``. The claim rules
(V1, P1..P9) are document checks, so they live with the others in
:mod:`awl.documents.checks` and are re-exported here.

The gateway only verifies passes, with :func:`verify_pass` and the :class:`VerifiedPass` it
returns, the :class:`KeyStore` of a desk home and the :class:`KeySet` that reads its public
keys afresh, and :data:`DEFAULT_AUDIENCE`.

Keys and issuing need PyJWT and cryptography, so their names load on first use
(:mod:`~awl.documents.lazy`); verifying loads them with the first pass verified. A gateway
without a pass loads neither.
"""

import typing

from awl.documents.checks import LEEWAY, is_valid_pass, iter_pass_findings, validate_pass
from awl.documents.lazy import lazy_exports as _lazy_exports
from awl.passes.common import (
    ALGORITHM,
    DEFAULT_AUDIENCE,
    DEFAULT_ISSUER,
    MAX_CHAIN,
    MAX_TOKEN_BYTES,
    PASS_SPEC,
    PASS_TYPE,
)
from awl.passes.records import (
    pass_scopes,
    record_pass,
    remaining_budget,
    revoke_order_passes,
    revoke_pass,
)
from awl.passes.verify import REASONS, VerifiedPass, unverified_claims, verify_pass

if typing.TYPE_CHECKING:
    from awl.passes.issue import issue_pass, issue_recorded_pass
    from awl.passes.keys import KeySet, KeyStore, PublishedKeySet, publish_keys

_ISSUE, _KEYS = "awl.passes.issue", "awl.passes.keys"
__getattr__, __dir__ = _lazy_exports(__name__, {
    "issue_pass": _ISSUE, "issue_recorded_pass": _ISSUE, "KeySet": _KEYS, "KeyStore": _KEYS,
    "PublishedKeySet": _KEYS, "publish_keys": _KEYS})

__all__ = [
    "ALGORITHM",
    "DEFAULT_AUDIENCE",
    "DEFAULT_ISSUER",
    "LEEWAY",
    "MAX_CHAIN",
    "MAX_TOKEN_BYTES",
    "PASS_SPEC",
    "PASS_TYPE",
    "REASONS",
    "KeySet",
    "KeyStore",
    "PublishedKeySet",
    "VerifiedPass",
    "is_valid_pass",
    "issue_pass",
    "issue_recorded_pass",
    "iter_pass_findings",
    "pass_scopes",
    "publish_keys",
    "record_pass",
    "remaining_budget",
    "revoke_order_passes",
    "revoke_pass",
    "unverified_claims",
    "validate_pass",
    "verify_pass",
]
