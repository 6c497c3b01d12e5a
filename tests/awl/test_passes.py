"""Delegation Passes: keys, issuing, verifying every forgery, revocation."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import stat
import threading
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from awl.documents.conformance import run_conformance
from awl.documents.errors import BadRequest, InvalidTransition, PassError
from awl.documents.models import Event, WorkOrder
from awl.passes import (
    LEEWAY,
    MAX_CHAIN,
    PASS_SPEC,
    PASS_TYPE,
    KeyStore,
    issue_pass,
    issue_recorded_pass,
    iter_pass_findings,
    pass_scopes,
    record_pass,
    remaining_budget,
    revoke_order_passes,
    revoke_pass,
    unverified_claims,
    verify_pass,
)
from awl.store.memory import MemoryStore
from awl.store.protocol import OverBudget, Reserved, Scope, Store
from awl.store.sqlite import SQLiteStore

NOW = 1_800_000_000  # 2027-01-15; the order's deadline is 2030-01-01
DEADLINE = 1_893_456_000
AUD = "awl:gateway"
CASES = Path(__file__).resolve().parents[2] / "conformance" / "cases" / "passes.json"

ORDER = WorkOrder.model_validate({
    "spec": "awl/work-order@0.3",
    "id": "ord-1",
    "created_at": "2026-01-01T00:00:00Z",
    "from": "human:ana",
    "to": "agent:worker",
    "goal": "Answer the mail",
    "criteria": [{"id": "c1", "text": "the mail is answered"}],
    "budget": {"usd": 5, "tool_calls": 10},
    "deadline": "2030-01-01T00:00:00Z",
    "tools": ["fs/*", "web/search", "mail/*"],
    "staged": ["mail/send"],
})


@pytest.fixture
def keys(tmp_path: Path) -> KeyStore:
    return KeyStore(tmp_path)


@pytest.fixture
def root(keys: KeyStore) -> str:
    return issue_pass(ORDER, subject="agent:worker", keys=keys, now=NOW)


@pytest.fixture
def child(keys: KeyStore, root: str) -> str:
    return issue_pass(ORDER, subject="agent:sub", keys=keys, parent_token=root,
                      tools=["fs/read"], budget={"usd": 1, "tool_calls": 3},
                      expires_in=3600, now=NOW)


def _verify(token: str, keys: KeyStore, **kw: Any) -> Any:
    kw.setdefault("revoked", frozenset())
    kw.setdefault("audience", AUD)
    kw.setdefault("now", NOW)
    return verify_pass(token, jwks=keys.jwks(), **kw)


def _reason(call: Callable[[], object]) -> str:
    with pytest.raises(PassError) as info:
        call()
    return info.value.reason


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _segment(obj: dict[str, Any]) -> str:
    return _b64(json.dumps(obj).encode())


def _claims(token: str) -> dict[str, Any]:
    return unverified_claims(token)[1]


# -- keys ---------------------------------------------------------------------------------


@pytest.mark.spec("DP-4")
def test_first_use_creates_an_owner_only_key(tmp_path: Path) -> None:
    """The first key is made on first use, in a 0700 folder as a 0600 file."""
    keys = KeyStore(tmp_path)
    kid = keys.current_kid
    folder = tmp_path / "keys"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / f"{kid}.pem").stat().st_mode) == 0o600
    assert keys.kids() == [kid]


def test_kid_is_the_rfc7638_thumbprint(keys: KeyStore) -> None:
    """The kid is the SHA-256 thumbprint of the key's required JWK members."""
    jwk = keys.jwks()["keys"][0]
    canonical = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": jwk["x"]},
                           separators=(",", ":"), sort_keys=True).encode()
    assert jwk["kid"] == _b64(hashlib.sha256(canonical).digest())


def test_no_kid_begins_with_a_dash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key whose thumbprint begins with "-" is drawn again: the kid is typed as a command
    word (`awl pass retire KID`), where a leading dash would read as an option."""
    from awl.passes import keys as keys_module

    real = keys_module._thumbprint
    drawn: list[str] = []

    def dash_first(x: str) -> str:
        kid = real(x)
        drawn.append(kid)
        return "-" + kid[1:] if len(drawn) == 1 else kid

    monkeypatch.setattr(keys_module, "_thumbprint", dash_first)
    kid = KeyStore(tmp_path).current_kid
    # A real thumbprint begins with "-" one time in 64, so the redraw may need more draws.
    assert not kid.startswith("-") and drawn[0].lstrip("-") != kid.lstrip("-")
    assert kid == next(k for k in drawn[1:] if not k.startswith("-"))
    assert [p.name for p in (tmp_path / "keys").glob("*.pem")] == [f"{kid}.pem"]


def test_jwks_holds_only_public_parts(keys: KeyStore) -> None:
    """The JWKS document publishes no private member."""
    keys.rotate()
    for jwk in keys.jwks()["keys"]:
        assert set(jwk) == {"kty", "crv", "x", "kid", "alg", "use"}


@pytest.mark.spec("DP-4")
def test_a_key_file_open_to_others_is_refused(keys: KeyStore) -> None:
    """A key file group or others can read is never used."""
    kid = keys.current_kid
    os.chmod(keys.folder / f"{kid}.pem", 0o644)
    assert _reason(lambda: issue_pass(ORDER, subject="agent:worker", keys=keys, now=NOW)
                   ) == "insecure_key"


def test_a_damaged_key_file_is_one_clear_error(keys: KeyStore) -> None:
    """A key file that is not an Ed25519 PEM key is refused, not a crash."""
    (keys.folder / f"{keys.current_kid}.pem").write_bytes(b"not a key")
    assert _reason(keys.jwks) == "insecure_key"


@pytest.mark.spec("DP-4")
def test_a_key_folder_open_to_others_is_refused(keys: KeyStore) -> None:
    """A key folder group or others can enter is never used."""
    assert keys.current_kid
    os.chmod(keys.folder, 0o755)
    assert _reason(keys.jwks) == "insecure_key"


def test_concurrent_first_use_agrees_on_one_key(tmp_path: Path) -> None:
    """Processes racing to make the first key all end up signing with the same one."""
    kids: list[str] = []
    barrier = threading.Barrier(4)

    def first() -> None:
        barrier.wait()
        kids.append(KeyStore(tmp_path).current_kid)

    threads = [threading.Thread(target=first) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(kids)) == 1


@pytest.mark.spec("DP-4")
def test_rotation_keeps_old_passes_valid(keys: KeyStore, root: str) -> None:
    """After a rotation, passes signed by the old key verify until they expire."""
    old = keys.current_kid
    new = keys.rotate()
    assert new != old and keys.current_kid == new
    assert {k["kid"] for k in keys.jwks()["keys"]} == {old, new}
    assert _verify(root, keys).kid == old
    fresh = issue_pass(ORDER, subject="agent:worker", keys=keys, now=NOW)
    assert _verify(fresh, keys).kid == new
    assert _reason(lambda: _verify(root, keys, now=DEADLINE + LEEWAY)) == "expired"


# -- issuing ------------------------------------------------------------------------------


@pytest.mark.spec("DP-1")
def test_a_workers_pass_states_the_order(keys: KeyStore, root: str) -> None:
    """By default the worker's pass grants the order's tools, budget and deadline."""
    claims = _claims(root)
    assert claims["spec"] == PASS_SPEC and claims["sub"] == "agent:worker"
    assert claims["aud"] == AUD and claims["iat"] == claims["nbf"] == NOW
    assert claims["exp"] == DEADLINE
    assert claims["grant"] == {
        "order_id": "ord-1", "tools": ["fs/*", "web/search", "mail/*"],
        "budget": {"usd": 5, "tool_calls": 10}, "manager": "human:ana",
        "deadline": "2030-01-01T00:00:00Z", "staged": ["mail/send"],
    }
    header = unverified_claims(root)[0]
    assert header == {"alg": "EdDSA", "typ": PASS_TYPE, "kid": keys.current_kid}


@pytest.mark.spec("DP-1", "DP-9")
def test_a_derived_pass_defaults_to_the_delegable_tools(keys: KeyStore, root: str) -> None:
    """A sub-agent's pass gets the parent's tools minus any that reach a staged tool."""
    token = issue_pass(ORDER, subject="agent:sub", keys=keys, parent_token=root, now=NOW)
    claims = _claims(token)
    assert claims["grant"]["tools"] == ["fs/*", "web/search"]
    assert claims["grant"]["parent_jti"] == _claims(root)["jti"]
    assert claims["exp"] == DEADLINE
    assert unverified_claims(token)[0]["parent"] == root


def test_no_pass_is_signed_for_the_desk_itself(keys: KeyStore, root: str) -> None:
    """``awl:`` names are the desk's own: no door lets anyone act as one, so no derived pass
    names one as its holder (the worker's pass goes to the order's worker anyway)."""
    for subject in ("awl:desk", "awl:anything"):
        with pytest.raises(BadRequest, match="reserved for the desk"):
            issue_pass(ORDER, subject=subject, keys=keys, parent_token=root, now=NOW)


@pytest.mark.parametrize(("kwargs", "rule"), [
    ({"tools": ["shell/run"]}, "P4"),
    ({"tools": ["*"]}, "P4"),
    ({"budget": {"usd": 9, "tool_calls": 1}}, "P5"),
    ({"budget": {"usd": 1}}, "P5"),
    ({"remaining": {"usd": 0.5}, "budget": {"usd": 1, "tool_calls": 1}}, "P5"),
    ({"exp": DEADLINE + 1}, "P6"),
    ({"expires_in": -10}, "P2"),
])
@pytest.mark.spec("DP-7")
def test_a_workers_pass_never_exceeds_its_order(keys: KeyStore, kwargs: dict[str, Any],
                                                rule: str) -> None:
    """Asking the order for more than it grants is refused with the rule broken."""
    assert _reason(lambda: issue_pass(ORDER, subject="agent:worker", keys=keys, now=NOW,
                                      **kwargs)) == rule


@pytest.mark.parametrize(("kwargs", "rule"), [
    ({"tools": ["fs/*", "shell/run"]}, "P4"),
    ({"budget": {"usd": 6, "tool_calls": 1}}, "P5"),
    ({"budget": {"tool_calls": 1}}, "P5"),
    ({"expires_in": 10 * 365 * 86400}, "P6"),
    ({"tools": ["mail/send"]}, "P7"),
    ({"tools": ["mail/*"]}, "P7"),
])
@pytest.mark.spec("DP-7", "DP-9")
def test_a_derived_pass_only_narrows(keys: KeyStore, root: str, kwargs: dict[str, Any],
                                     rule: str) -> None:
    """A sub-agent's pass asking for more than its parent is refused with the rule broken."""
    assert _reason(lambda: issue_pass(ORDER, subject="s", keys=keys, parent_token=root,
                                      now=NOW, **kwargs)) == rule


def test_a_grandchild_narrows_its_parent_not_the_root(keys: KeyStore, child: str) -> None:
    """A pass derived from a derived pass is held to that parent's grant."""
    assert _reason(lambda: issue_pass(ORDER, subject="g", keys=keys, parent_token=child,
                                      tools=["fs/write"], now=NOW)) == "P4"
    token = issue_pass(ORDER, subject="g", keys=keys, parent_token=child, now=NOW)
    assert [c.sub for c in _verify(token, keys).chain] == ["agent:worker", "agent:sub", "g"]


@pytest.mark.spec("DP-7")
def test_a_workers_pass_goes_to_the_worker_only(keys: KeyStore) -> None:
    """A worker's pass for anyone but the order's worker is refused."""
    assert _reason(lambda: issue_pass(ORDER, subject="agent:other", keys=keys, now=NOW)
                   ) == "not_worker"


def test_a_parent_of_another_order_is_refused(keys: KeyStore, root: str) -> None:
    """A pass is never derived from a pass of another order."""
    other = ORDER.model_copy(update={"id": "ord-2"})
    assert _reason(lambda: issue_pass(other, subject="s", keys=keys, parent_token=root,
                                      tools=["fs/read"], now=NOW)) == "P3"


def test_only_staged_parent_tools_leave_nothing_to_delegate(keys: KeyStore) -> None:
    """A parent whose every tool reaches a staged tool has nothing to delegate by default."""
    order = ORDER.model_copy(update={"tools": ("mail/*",), "staged": ("mail/send",)})
    token = issue_pass(order, subject="agent:worker", keys=keys, now=NOW)
    assert _reason(lambda: issue_pass(order, subject="s", keys=keys, parent_token=token,
                                      now=NOW)) == "P7"


# -- verifying: every forgery has its own refusal --------------------------------------------


def _alg_none(keys: KeyStore, root: str, child: str) -> str:
    head = _segment({"alg": "none", "typ": PASS_TYPE, "kid": keys.current_kid})
    return f"{head}.{root.split('.')[1]}."


def _hmac_with_public_key(keys: KeyStore, root: str, child: str) -> str:
    jwk = keys.jwks()["keys"][0]
    public = keys.private_key(jwk["kid"]).public_key()
    secret = public.public_bytes(serialization.Encoding.PEM,
                                 serialization.PublicFormat.SubjectPublicKeyInfo)
    head = _segment({"alg": "HS256", "typ": PASS_TYPE, "kid": jwk["kid"]})
    body = root.split(".")[1]
    sig = hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{_b64(sig)}"


def _edited_claims(keys: KeyStore, root: str, child: str) -> str:
    head, body, sig = child.split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    claims["grant"]["tools"] = ["*"]
    return f"{head}.{_segment(claims)}.{sig}"


def _expired(keys: KeyStore, root: str, child: str) -> str:
    return issue_pass(ORDER, subject="agent:worker", keys=keys, expires_in=60, now=NOW - 3600)


def _not_yet_valid(keys: KeyStore, root: str, child: str) -> str:
    return issue_pass(ORDER, subject="agent:worker", keys=keys, now=NOW + 3600)


def _wrong_audience(keys: KeyStore, root: str, child: str) -> str:
    return issue_pass(ORDER, subject="agent:worker", keys=keys, audience="awl:other-gateway",
                      now=NOW)


def _derived(keys: KeyStore, root: str, **grant: Any) -> str:
    """A child signed with the real key but never checked by issue_pass (an issuer bug)."""
    parent = _claims(root)
    claims = {"spec": PASS_SPEC, "iss": parent["iss"], "sub": "agent:rogue", "aud": AUD,
              "jti": "rogue", "iat": NOW, "nbf": NOW, "exp": NOW + 600,
              "grant": {"order_id": "ord-1", "tools": ["fs/read"], "budget": {"usd": 1,
                        "tool_calls": 1}, "parent_jti": parent["jti"]}}
    exp = grant.pop("exp", None)
    if exp is not None:
        claims["exp"] = exp
    claims["grant"].update(grant)
    return keys.sign(claims, parent=root)


def _wider_than_parent(keys: KeyStore, root: str, child: str) -> str:
    return _derived(keys, child, tools=["fs/*"])


def _staged_smuggled(keys: KeyStore, root: str, child: str) -> str:
    return _derived(keys, root, tools=["mail/send"])


def _revoked_parent(keys: KeyStore, root: str, child: str) -> str:
    return child  # the test revokes the root


def _unknown_kid(keys: KeyStore, root: str, child: str) -> str:
    other = KeyStore(keys.folder.parent / "elsewhere")
    return issue_pass(ORDER, subject="agent:worker", keys=other, now=NOW)


def _dated_ahead(keys: KeyStore, root: str, child: str) -> str:
    claims = _claims(root)
    claims["iat"] = NOW + LEEWAY + 60  # valid from now (nbf), but "issued" in a minute
    return keys.sign(claims)


def _other_issuer(keys: KeyStore, root: str, child: str) -> str:
    return issue_pass(ORDER, subject="agent:worker", keys=keys, issuer="awl:other-desk",
                      now=NOW)


def _padded(keys: KeyStore, root: str, child: str) -> str:
    return child + "=="


FORGERIES: dict[str, tuple[Callable[[KeyStore, str, str], str], str]] = {
    "dated in the future": (_dated_ahead, "issued_in_future"),
    "signed by our key for another issuer": (_other_issuer, "wrong_issuer"),
    "padded": (_padded, "not_canonical"),
    "alg none": (_alg_none, "bad_algorithm"),
    "HS256 signed with the public key": (_hmac_with_public_key, "bad_algorithm"),
    "valid signature over edited claims": (_edited_claims, "bad_signature"),
    "expired": (_expired, "expired"),
    "not yet valid": (_not_yet_valid, "not_yet_valid"),
    "wrong audience": (_wrong_audience, "wrong_audience"),
    "child wider than its parent": (_wider_than_parent, "widened"),
    "staged tool smuggled into a child": (_staged_smuggled, "staged_delegated"),
    "revoked parent": (_revoked_parent, "revoked"),
    "unknown kid": (_unknown_kid, "unknown_kid"),
}


@pytest.mark.parametrize("name", sorted(FORGERIES))
@pytest.mark.spec("DP-2", "DP-3", "DP-5", "DP-6", "DP-8", "DP-9", "DP-11", "DP-14", "P9")
def test_every_forgery_is_refused_with_its_own_reason(keys: KeyStore, root: str, child: str,
                                                      name: str) -> None:
    """Each way an attacker forges a pass is refused, with a reason naming that way."""
    make, reason = FORGERIES[name]
    token = make(keys, root, child)
    revoked = {_claims(root)["jti"]} if name == "revoked parent" else set()
    assert _reason(lambda: _verify(token, keys, revoked=revoked)) == reason


@pytest.mark.spec("DP-10")
def test_forgery_reasons_are_all_distinct() -> None:
    """No two kinds of forgery share a refusal reason, except the two algorithm attacks."""
    reasons = [r for name, (_, r) in FORGERIES.items() if not name.startswith("HS256")]
    assert len(reasons) == len(set(reasons))


@pytest.mark.spec("DP-2")
def test_a_hmac_pass_signed_with_the_raw_public_key_is_refused(keys: KeyStore, root: str
                                                               ) -> None:
    """An HS256 pass keyed with the raw public key or its JWK text is refused too."""
    jwk = keys.jwks()["keys"][0]
    head = _segment({"alg": "HS256", "typ": PASS_TYPE, "kid": jwk["kid"]})
    body = root.split(".")[1]
    for secret in (base64.urlsafe_b64decode(jwk["x"] + "="), jwk["x"].encode(),
                   json.dumps(jwk).encode()):
        sig = _b64(hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest())
        assert _reason(partial(_verify, f"{head}.{body}.{sig}", keys)) == "bad_algorithm"


@pytest.mark.parametrize("alg", ["none", "None", "NONE", "HS256", "HS512", "RS256", "ES256",
                                 "PS256", "", None])
@pytest.mark.spec("DP-2")
def test_only_eddsa_is_accepted(keys: KeyStore, root: str, alg: str | None) -> None:
    """Any algorithm but EdDSA is refused before a key is looked at."""
    head = _segment({"alg": alg, "typ": PASS_TYPE, "kid": keys.current_kid})
    _, body, sig = root.split(".")
    assert _reason(lambda: _verify(f"{head}.{body}.{sig}", keys)) == "bad_algorithm"


@pytest.mark.spec("DP-2", "DP-3")
def test_a_key_of_another_type_under_a_known_kid_is_ignored(keys: KeyStore, root: str
                                                            ) -> None:
    """A JWKS entry that is not an Ed25519 key never verifies a pass."""
    kid = keys.current_kid
    jwks = {"keys": [{"kty": "oct", "k": _b64(b"secret"), "kid": kid}]}
    assert _reason(lambda: verify_pass(root, jwks=jwks, revoked=(), audience=AUD,
                                       now=NOW)) == "unknown_kid"


def test_a_key_from_another_desk_under_our_kid_is_refused(keys: KeyStore, tmp_path: Path,
                                                          root: str) -> None:
    """A pass signed by another key that claims our kid fails its signature."""
    other = KeyStore(tmp_path / "other")
    other_kid = other.current_kid
    claims = _claims(root)
    forged = other.sign(claims)
    head = _segment({"alg": "EdDSA", "typ": PASS_TYPE, "kid": keys.current_kid})
    _, body, sig = forged.split(".")
    assert other_kid != keys.current_kid
    assert _reason(lambda: _verify(f"{head}.{body}.{sig}", keys)) == "bad_signature"


@pytest.mark.parametrize("token", ["", "abc", "a.b", "a.b.c.d", "!!.!!.!!",
                                   _segment({"alg": "EdDSA"}) + ".e30.", "x" * 70_000])
def test_garbage_is_malformed(keys: KeyStore, token: str) -> None:
    """Input that is not a JWS compact token is refused as malformed."""
    assert _reason(lambda: _verify(token, keys)) in {"malformed", "unknown_kid"}


def test_a_foreign_header_field_or_type_is_malformed(keys: KeyStore, root: str) -> None:
    """A header with another typ or an unknown field is not a pass header."""
    _, body, sig = root.split(".")
    for header in ({"alg": "EdDSA", "typ": "JWT", "kid": keys.current_kid},
                   {"alg": "EdDSA", "typ": PASS_TYPE, "kid": keys.current_kid, "b64": False}):
        assert _reason(partial(_verify, f"{_segment(header)}.{body}.{sig}", keys)
                       ) == "malformed"


def test_signed_claims_that_are_not_a_pass_are_malformed(keys: KeyStore) -> None:
    """A correctly signed token whose claims break the schema is refused as malformed."""
    assert _reason(lambda: _verify(keys.sign({"sub": "x"}), keys)) == "malformed"
    claims = _claims(issue_pass(ORDER, subject="agent:worker", keys=keys, now=NOW))
    claims["spec"] = "awl/delegation-pass@9.0"
    assert _reason(lambda: _verify(keys.sign(claims), keys)) == "unsupported_version"


@pytest.mark.spec("DP-5")
def test_leeway_tolerates_small_skew(keys: KeyStore) -> None:
    """exp and nbf are honoured within the documented leeway and not beyond it."""
    token = issue_pass(ORDER, subject="agent:worker", keys=keys, expires_in=600, now=NOW)
    assert _verify(token, keys, now=NOW - LEEWAY + 1)
    assert _verify(token, keys, now=NOW + 600 + LEEWAY - 1)
    assert _reason(lambda: _verify(token, keys, now=NOW + 600 + LEEWAY)) == "expired"
    assert _reason(lambda: _verify(token, keys, now=NOW - LEEWAY - 1)) == "not_yet_valid"


@pytest.mark.parametrize(("grant", "reason"), [
    ({"budget": {"usd": 9, "tool_calls": 1}}, "widened"),
    ({"budget": {"usd": 1}}, "widened"),
    ({"exp": DEADLINE + 10}, "widened"),
    ({"tools": ["*"]}, "widened"),
    ({"tools": ["fs/read", "mail/*"]}, "staged_delegated"),
    ({"order_id": "ord-2"}, "chain_broken"),
    ({"parent_jti": "someone-else"}, "chain_broken"),
])
@pytest.mark.spec("DP-6", "DP-9")
def test_the_verifier_rechecks_every_link(keys: KeyStore, root: str, grant: dict[str, Any],
                                          reason: str) -> None:
    """A link the desk's key signed but that does not narrow its parent is refused."""
    assert _reason(lambda: _verify(_derived(keys, root, **grant), keys)) == reason


def test_a_swapped_parent_breaks_the_chain(keys: KeyStore, root: str) -> None:
    """A derived pass whose parent header is another valid pass is refused."""
    other = issue_pass(ORDER, subject="agent:worker", keys=keys, now=NOW)
    claims = _claims(_derived(keys, root))
    assert _reason(lambda: _verify(keys.sign(claims, parent=other), keys)) == "chain_broken"
    assert _reason(lambda: _verify(keys.sign(claims), keys)) == "chain_broken"


@pytest.mark.spec("DP-6")
def test_a_root_without_staged_tools_is_malformed(keys: KeyStore, root: str) -> None:
    """A worker's pass that does not state the staged tools cannot be checked, so is refused."""
    claims = _claims(root)
    del claims["grant"]["staged"]
    assert _reason(lambda: _verify(keys.sign(claims), keys)) == "malformed"


@pytest.mark.spec("DP-6")
def test_a_chain_longer_than_the_limit_is_refused(keys: KeyStore, root: str) -> None:
    """Chains are bounded so a token cannot make the verifier walk forever."""
    token = root
    for i in range(MAX_CHAIN - 1):
        token = issue_pass(ORDER, subject=f"a{i}", keys=keys, parent_token=token,
                           tools=["fs/read"], now=NOW)
    assert len(_verify(token, keys).chain) == MAX_CHAIN
    deeper = _derived(keys, token, parent_jti=_claims(token)["jti"])
    assert _reason(lambda: _verify(deeper, keys)) == "chain_too_long"


@pytest.mark.spec("DP-6")
def test_verification_needs_only_the_jwks_and_revocations(keys: KeyStore, root: str,
                                                          child: str) -> None:
    """A verifier with a copy of the JWKS document and a set of jtis checks the whole chain."""
    jwks = json.loads(json.dumps(keys.jwks()))  # what a gateway fetched, nothing more
    verified = verify_pass(child, jwks=jwks, revoked=frozenset(), audience=AUD, now=NOW)
    assert verified.subject == "agent:sub" and verified.order_id == "ord-1"
    assert verified.jtis == (_claims(root)["jti"], _claims(child)["jti"])
    assert verified.staged == ("mail/send",)
    assert verified.allows("fs/read") and not verified.allows("fs/write")
    assert not verified.is_staged("fs/read") and verified.is_staged("mail/send")


@pytest.mark.spec("DP-8")
def test_revoking_a_child_leaves_its_parent_valid(keys: KeyStore, root: str, child: str
                                                  ) -> None:
    """Revocation reaches down a chain, never up."""
    revoked = {_claims(child)["jti"]}
    assert _verify(root, keys, revoked=revoked)
    assert _reason(lambda: _verify(child, keys, revoked=revoked)) == "revoked"


# -- claims findings ----------------------------------------------------------------------


def _findings(claims: Any, **context: Any) -> list[tuple[str, str]]:
    return [(f.rule, f.path) for f in iter_pass_findings(claims, **context)]


def test_issued_claims_have_no_findings(root: str, child: str) -> None:
    """What issue_pass signs passes every P rule against its order and parent."""
    assert _findings(_claims(root), order=ORDER.to_json(), now=NOW) == []
    assert _findings(_claims(child), order=ORDER, parent=_claims(root), now=NOW) == []


def test_wrong_facts_in_a_workers_pass_are_findings(root: str) -> None:
    """A worker's pass that misstates the order's manager, deadline or staged tools is invalid."""
    claims = _claims(root)
    claims["grant"].update(manager="human:bob", deadline="2031-01-01T00:00:00Z", staged=[])
    assert sorted(_findings(claims, order=ORDER)) == [
        ("P3", "/grant/manager"), ("P6", "/grant/deadline"), ("P7", "/grant/staged")]


def test_a_conformance_case_file_covers_every_pass_rule() -> None:
    """passes.json runs clean and has a valid and an invalid test for every P rule."""
    run = run_conformance(CASES)
    assert run.failed == 0 and run.passed >= 20, run
    groups = json.loads(CASES.read_text(encoding="utf-8"))
    seen: dict[str, set[bool]] = {}
    for group in groups:
        for test in group["tests"]:
            for rule in test.get("spec", group["spec"]):
                fails = any(f["rule"] == rule for f in test["findings"])
                seen.setdefault(rule, set()).add(fails)
    for rule in ["V1", *(f"P{i}" for i in range(1, 9))]:
        assert seen.get(rule) == {True, False}, rule


# -- with a store -------------------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made: Store = MemoryStore() if request.param == "memory" else SQLiteStore(
        tmp_path / "desk.sqlite3")
    made.create_order(ORDER, Event.model_validate(
        {"seq": 1, "at": "2026-01-01T00:00:00Z", "actor": "human:ana", "action": "create",
         "to": "offered"}))
    made.append("ord-1", Event.model_validate(
        {"seq": 2, "at": "2026-01-01T00:01:00Z", "actor": "agent:worker", "action": "accept",
         "from": "offered", "to": "accepted"}), state="accepted")
    yield made
    made.close()


@pytest.mark.spec("DP-8")
def test_an_orders_passes_are_recorded_and_revoked_together(store: Store, keys: KeyStore
                                                            ) -> None:
    """Ending an order revokes every pass issued for it, derived ones included."""
    root = issue_recorded_pass(store, "ord-1", keys=keys, subject="agent:worker", now=NOW)
    child = issue_recorded_pass(store, "ord-1", keys=keys, subject="agent:sub",
                                parent_token=root, tools=["fs/read"], now=NOW)
    jtis = [_claims(root)["jti"], _claims(child)["jti"]]
    records = store.passes("ord-1")
    assert [r.jti for r in records] == jtis
    assert records[1].parent_jti == jtis[0] and records[1].subject == "agent:sub"
    assert revoke_order_passes(store, "ord-1", now=NOW) == jtis
    assert revoke_order_passes(store, "ord-1", now=NOW) == []
    assert set(jtis) <= set(store.revoked())
    assert _reason(lambda: _verify(child, keys, revoked=store.revoked())) == "revoked"


def test_revoke_by_hand_keeps_its_reason(store: Store) -> None:
    """A pass revoked on demand is listed with the reason given."""
    revoke_pass(store, "abc", "leaked in a log", now=NOW)
    assert store.revoked() == {"abc": "leaked in a log"}


def test_spent_budget_is_not_granted_again(store: Store, keys: KeyStore) -> None:
    """A new pass gets at most what remains after the calls already made under its parent."""
    root = issue_recorded_pass(store, "ord-1", keys=keys, subject="agent:worker", now=NOW)
    jti = _claims(root)["jti"]
    for i in range(4):
        store.reserve_call("ord-1", attempt=1, tool="fs/read", arguments={"i": i},
                           pass_jti=jti, usd=0.5, started_at="2027-01-15T08:00:00Z",
                           scopes=[Scope(jtis=None)])
    parent = _verify(root, keys)
    assert remaining_budget(store, ORDER, parent) == {"usd": 3.0, "tool_calls": 6}
    assert _reason(lambda: issue_recorded_pass(
        store, "ord-1", keys=keys, subject="s", parent_token=root, tools=["fs/read"],
        budget={"usd": 1, "tool_calls": 7}, now=NOW)) == "P5"
    token = issue_recorded_pass(store, "ord-1", keys=keys, subject="s", parent_token=root,
                                tools=["fs/read"], now=NOW)
    assert _claims(token)["grant"]["budget"] == {"usd": 3.0, "tool_calls": 6}


@pytest.mark.spec("DP-7")
def test_an_offered_order_grants_no_pass(keys: KeyStore) -> None:
    """No pass is issued before the worker accepts the order."""
    store = MemoryStore()
    store.create_order(ORDER, Event.model_validate(
        {"seq": 1, "at": "2026-01-01T00:00:00Z", "actor": "human:ana", "action": "create",
         "to": "offered"}))
    with pytest.raises(InvalidTransition):
        issue_recorded_pass(store, "ord-1", keys=keys, subject="agent:worker", now=NOW)


@pytest.mark.spec("DP-7")
def test_an_ended_order_grants_no_pass(store: Store, keys: KeyStore) -> None:
    """No pass is issued for an order that has ended."""
    store.append("ord-1", Event.model_validate(
        {"seq": 3, "at": "2026-01-02T00:00:00Z", "actor": "human:ana", "action": "cancel",
         "from": "accepted", "to": "cancelled"}), state="cancelled")
    with pytest.raises(InvalidTransition):
        issue_recorded_pass(store, "ord-1", keys=keys, subject="agent:worker", now=NOW)


def test_record_pass_reads_the_token(store: Store, keys: KeyStore, root: str) -> None:
    """Recording an issued token stores its jti, order, subject and expiry."""
    record = record_pass(store, root)
    assert record.order_id == "ord-1" and record.exp == DEADLINE and record.parent_jti is None
    assert store.passes("ord-1") == [record]


def test_every_link_of_a_chain_limits_the_call(store: Store, keys: KeyStore) -> None:
    """A call under a sub-agent's pass counts against that pass and every pass above it."""
    root = issue_recorded_pass(store, "ord-1", keys=keys, subject="agent:worker", now=NOW)
    child = issue_recorded_pass(store, "ord-1", keys=keys, subject="agent:sub",
                                parent_token=root, tools=["fs/read"],
                                budget={"usd": 1, "tool_calls": 2}, now=NOW)
    sibling = issue_recorded_pass(store, "ord-1", keys=keys, subject="agent:sib",
                                  parent_token=root, tools=["fs/read"],
                                  budget={"usd": 1, "tool_calls": 2}, now=NOW)
    verified = _verify(child, keys)
    scopes = pass_scopes(store, verified)
    jtis = {name: _claims(t)["jti"] for name, t in
            (("root", root), ("child", child), ("sibling", sibling))}
    assert [s.max_calls for s in scopes] == [10, 2]
    assert scopes[0].jtis == frozenset(jtis.values())
    assert scopes[1].jtis == frozenset({jtis["child"]})

    def call() -> object:
        return store.reserve_call("ord-1", attempt=1, tool="fs/read", arguments={},
                                  pass_jti=verified.jti, usd=0.25,
                                  started_at="2027-01-15T08:00:00Z", scopes=scopes)

    assert isinstance(call(), Reserved) and isinstance(call(), Reserved)
    assert call() == OverBudget(scopes[1].name)


# -- attacks on the token's spelling, the chain length, the issuer and the clock --------------


def _respelt_last(part: str) -> str:
    """``part`` with its last character replaced by one that decodes to the same bytes."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    unused = {2: 0b1111, 3: 0b11}[len(part) % 4]  # low bits the last character leaves unused
    index = alphabet.index(part[-1])
    return part[:-1] + alphabet[(index & ~unused) | (~index & unused & 1)]


@pytest.mark.spec("DP-11")
@pytest.mark.parametrize("spelling", ["padded", "padded header", "respelt signature",
                                      "respelt parent", "standard alphabet"])
def test_a_respelt_token_that_decodes_to_the_same_bytes_is_refused(
        keys: KeyStore, root: str, child: str, spelling: str) -> None:
    """A pass is taken only as issued: padding, a last character whose unused bits are set,
    or the '+/' alphabet make another string of the same bytes, and each is refused."""
    head, body, sig = child.split(".")
    if spelling == "padded":
        token = child + "=="
    elif spelling == "padded header":
        token = f"{head}==.{body}.{sig}"
    elif spelling == "respelt signature":
        token = f"{head}.{body}.{_respelt_last(sig)}"
    elif spelling == "respelt parent":
        r_head, r_body, r_sig = root.split(".")
        header = json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))
        header["parent"] = f"{r_head}.{r_body}.{_respelt_last(r_sig)}"
        token = keys.sign(_claims(child), parent=header["parent"])
    else:
        # Only a token holding '-' or '_' has a '+/' spelling; about one in thirty has
        # neither, so sign the same grant under other jtis until one does.
        parent = json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))["parent"]
        spelled, n = child, 0
        while "-" not in spelled and "_" not in spelled:
            n += 1
            spelled = keys.sign({**_claims(child), "jti": f"{_claims(child)['jti']}{n}"},
                                parent=parent)
        token = spelled.replace("-", "+").replace("_", "/")
        assert token != spelled
    assert _reason(lambda: _verify(token, keys)) == "not_canonical"
    assert _verify(child, keys).subject == "agent:sub"


@pytest.mark.spec("P9", "DP-5")
def test_iat_ahead_is_tolerated_within_the_leeway_only(keys: KeyStore, root: str) -> None:
    """A pass dated up to the leeway ahead of the verifier's clock verifies; further ahead it
    is refused, when verified and when its claims are checked with the time given."""
    claims = _claims(root)
    for ahead, ok in ((LEEWAY, True), (LEEWAY + 1, False)):
        claims["iat"] = NOW + ahead
        token = keys.sign(claims)
        if ok:
            assert _verify(token, keys).jti == claims["jti"]
        else:
            assert _reason(partial(_verify, token, keys)) == "issued_in_future"
        found = [(f.rule, f.path) for f in iter_pass_findings(claims, order=ORDER, now=NOW)]
        assert found == ([] if ok else [("P9", "/iat")])


@pytest.mark.spec("DP-14")
def test_a_verifier_trusts_one_issuer_on_every_link(keys: KeyStore, root: str) -> None:
    """Each link's iss must be the verifier's issuer: a child naming another issuer, or a
    verifier set to trust another desk, refuses the chain."""
    child_claims = _claims(_derived(keys, root))
    child_claims["iss"] = "awl:other-desk"
    assert _reason(lambda: _verify(keys.sign(child_claims, parent=root), keys)
                   ) == "wrong_issuer"
    assert _reason(lambda: _verify(root, keys, issuer="awl:other-desk")) == "wrong_issuer"
    assert _verify(root, keys, issuer="awl:desk").subject == "agent:worker"
