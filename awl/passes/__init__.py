"""Delegation Passes: keys, the chain rules, JWS verification and issuing.

Above the store (keys, pass records and revocations live there), below the desk.

The gateway only verifies passes, with the names re-exported here: :func:`verify_pass` and
the :class:`VerifiedPass` it returns, the :class:`KeyStore` of a desk home and the
:class:`KeySet` that reads its public keys afresh, and :data:`DEFAULT_AUDIENCE`.
"""

from awl.passes.passes import DEFAULT_AUDIENCE, KeySet, KeyStore, VerifiedPass, verify_pass

__all__ = ["DEFAULT_AUDIENCE", "KeySet", "KeyStore", "VerifiedPass", "verify_pass"]
