"""Delegation Passes attacked by a holder who must not succeed: what the verifier and the
issuer refuse, each in one clear line (the forgeries of test_passes.py are not repeated)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx2
import pytest

from awl.cli import main
from awl.desk import Desk
from awl.documents.errors import AWLError, BadRequest, InvalidTransition, PassError
from awl.documents.models import Event, WorkOrder
from awl.mcp.transport import BearerAuth, Unauthorized
from awl.passes import (
    LEEWAY,
    MAX_TOKEN_BYTES,
    PASS_TYPE,
    KeyStore,
    issue_pass,
    issue_recorded_pass,
    unverified_claims,
    verify_pass,
)
from awl.store.memory import MemoryStore
from awl.store.protocol import PassRecord, Store
from awl.store.sqlite import SQLiteStore
from tests.awl.test_passes import AUD, NOW, ORDER


@pytest.fixture
def keys(tmp_path: Path) -> KeyStore:
    return KeyStore(tmp_path)


@pytest.fixture
def root(keys: KeyStore) -> str:
    return issue_pass(ORDER, subject="agent:worker", keys=keys, now=NOW)


def _verify(token: Any, keys: KeyStore, **kw: Any) -> Any:
    kw.setdefault("revoked", frozenset())
    kw.setdefault("audience", AUD)
    kw.setdefault("now", NOW)
    return verify_pass(token, jwks=keys.jwks(), **kw)


def _refusal(call: Callable[[], object]) -> PassError:
    with pytest.raises(PassError) as info:
        call()
    return info.value


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _with_header(token: str, header: dict[str, Any]) -> str:
    _, body, sig = token.split(".")
    return f"{_b64(json.dumps(header).encode())}.{body}.{sig}"


def _one_short_line(message: str) -> bool:
    return "\n" not in message and len(message) < 300


# -- verifying ----------------------------------------------------------------------------


@pytest.mark.parametrize("token", [None, b"a.b.c", 3, ["a.b.c"]])
def test_a_token_that_is_not_text_is_malformed(keys: KeyStore, token: Any) -> None:
    """Anything but a string is refused as malformed in one line, never a traceback."""
    refusal = _refusal(lambda: _verify(token, keys))
    assert refusal.reason == "malformed" and "JWS compact string" in refusal.message


@pytest.mark.spec("DP-2", "DP-3")
@pytest.mark.parametrize(("field", "reason"), [("typ", "malformed"), ("kid", "unknown_kid"),
                                               ("alg", "bad_algorithm")])
def test_a_huge_header_value_is_not_echoed_whole(keys: KeyStore, root: str, field: str,
                                                 reason: str) -> None:
    """A header value tens of kilobytes long (newlines and all) is named by a short excerpt:
    the refusal stays one short line."""
    header = {"alg": "EdDSA", "typ": PASS_TYPE, "kid": keys.current_kid}
    header[field] = "x\n" * 12_000
    token = _with_header(root, header)
    assert len(token) <= MAX_TOKEN_BYTES
    refusal = _refusal(lambda: _verify(token, keys))
    assert refusal.reason == reason and _one_short_line(refusal.message)


def test_many_unknown_header_fields_make_one_short_line(keys: KeyStore, root: str) -> None:
    """A header stuffed with unknown members is refused naming a few of them."""
    header: dict[str, Any] = {"alg": "EdDSA", "typ": PASS_TYPE, "kid": keys.current_kid}
    header.update({f"x{i:04d}" + "y" * 30: 1 for i in range(1000)})
    refusal = _refusal(lambda: _verify(_with_header(root, header), keys))
    assert refusal.reason == "malformed" and _one_short_line(refusal.message)
    assert "x0000" in refusal.message and "more" in refusal.message


@pytest.mark.spec("DP-3")
@pytest.mark.parametrize("kid", ["../../keys/current", "/etc/passwd", "https://evil/jwks",
                                 "", "k" * 5000, "a\nb"])
def test_a_kid_that_is_a_path_url_empty_or_huge_is_unknown(keys: KeyStore, root: str,
                                                           kid: str) -> None:
    """The kid only ever names an entry of the key set: a path, a URL, nothing or a huge
    string is an unknown kid, said in one short line."""
    token = _with_header(root, {"alg": "EdDSA", "typ": PASS_TYPE, "kid": kid})
    refusal = _refusal(lambda: _verify(token, keys))
    assert refusal.reason == "unknown_kid" and _one_short_line(refusal.message)


def test_duplicate_header_members_are_malformed(keys: KeyStore, root: str) -> None:
    """`{"alg":"none","alg":"EdDSA"}` is not read as either value: it is refused."""
    _, body, sig = root.split(".")
    for text in ('{"alg":"none","alg":"EdDSA","typ":"%s","kid":"%s"}',
                 '{"alg":"EdDSA","typ":"%s","kid":"%s","kid":"other"}'):
        head = _b64((text % (PASS_TYPE, keys.current_kid)).encode())
        assert _refusal(partial(_verify, f"{head}.{body}.{sig}", keys)).reason == "malformed"


@pytest.mark.parametrize("respell", [
    lambda t: t + ".", lambda t: t + ".x", lambda t: " " + t, lambda t: t + "\n",
    lambda t: t.replace(".", " .", 1), lambda t: t + "\u00e9", lambda t: t + "\x00",
])
def test_extra_segments_or_stray_characters_are_refused(keys: KeyStore, root: str,
                                                        respell: Callable[[str], str]) -> None:
    """Only the three parts exactly as issued verify: nothing before, between or after."""
    assert _verify(root, keys).jti
    assert _refusal(lambda: _verify(respell(root), keys)).reason == "malformed"


@pytest.mark.spec("DP-5")
@pytest.mark.parametrize("leeway", [float("nan"), float("inf"), -1, True, "30"])
def test_a_leeway_that_would_turn_time_checks_off_is_refused(keys: KeyStore,
                                                             leeway: Any) -> None:
    """NaN compares false with everything, so it would accept a pass expired years ago."""
    token = issue_pass(ORDER, subject="agent:worker", keys=keys, expires_in=60, now=NOW)
    assert _refusal(lambda: _verify(token, keys, now=NOW + 10**8)).reason == "expired"
    with pytest.raises(BadRequest, match="leeway"):
        _verify(token, keys, now=NOW + 10**8, leeway=leeway)
    assert _verify(token, keys, now=NOW + 60 + LEEWAY - 1, leeway=LEEWAY).jti


@pytest.mark.spec("DP-5", "DP-6")
def test_a_child_of_an_expired_parent_is_neither_issued_nor_accepted(keys: KeyStore) -> None:
    """Once its parent has expired no child is issued from it, and a child that outlives it
    (signed without the checks) is refused with the parent."""
    parent = issue_pass(ORDER, subject="agent:worker", keys=keys, expires_in=600, now=NOW)
    later = NOW + 600 + LEEWAY
    assert _refusal(lambda: issue_pass(ORDER, subject="s", keys=keys, parent_token=parent,
                                       tools=["fs/read"], now=later)).reason == "expired"
    # Within the leeway the parent still verifies, but nothing it grants outlives it.
    assert _refusal(lambda: issue_pass(ORDER, subject="s", keys=keys, parent_token=parent,
                                       tools=["fs/read"], now=NOW + 610)).reason == "P2"
    claims = unverified_claims(issue_pass(ORDER, subject="s", keys=keys, parent_token=parent,
                                          tools=["fs/read"], now=NOW))[1]
    claims["exp"] = NOW + 10_000
    outliving = keys.sign(claims, parent=parent)
    assert _refusal(lambda: _verify(outliving, keys, now=NOW + 5)).reason == "widened"


@pytest.mark.spec("DP-5")
def test_a_derived_pass_never_changes_audience(keys: KeyStore, root: str) -> None:
    """A sub-agent's pass is for its parent's audience: asking for another is refused, and a
    chain mixing audiences is refused by every verifier."""
    assert _refusal(lambda: issue_pass(ORDER, subject="s", keys=keys, parent_token=root,
                                       tools=["fs/read"], audience="awl:other", now=NOW)
                    ).reason == "wrong_audience"
    claims = unverified_claims(issue_pass(ORDER, subject="s", keys=keys, parent_token=root,
                                          tools=["fs/read"], now=NOW))[1]
    claims["aud"] = "awl:other"
    mixed = keys.sign(claims, parent=root)
    for audience in (AUD, "awl:other"):
        assert _refusal(partial(_verify, mixed, keys, audience=audience)
                        ).reason == "wrong_audience"


# -- issuing ------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [
    {"tools": "fs/read"}, {"tools": 5}, {"tools": {"fs/read": True}}, {"tools": b"fs/read"},
    {"budget": "usd=1"}, {"budget": [("usd", 1), ("tool_calls", 1)]}, {"budget": 3},
    {"subject": 5}, {"subject": None},
])
def test_arguments_of_the_wrong_shape_are_one_clear_error(keys: KeyStore, root: str,
                                                          kwargs: dict[str, Any]) -> None:
    """A string is no list of tools (it would grant a pattern per character), nor a list of
    pairs a budget: each is refused as a bad request naming the argument."""
    kwargs.setdefault("subject", "agent:sub")
    with pytest.raises(BadRequest) as info:
        issue_pass(ORDER, keys=keys, parent_token=root, now=NOW, **kwargs)
    name = next(k for k in kwargs if k != "subject" or len(kwargs) == 1)
    assert info.value.message.startswith(name) and _one_short_line(info.value.message)


_MANY_TOOLS = ORDER.model_copy(update={
    "tools": tuple(f"srv{i:02d}/" + "t" * 40 for i in range(60)), "staged": ()})


@pytest.mark.spec("DP-12")
def test_no_pass_is_signed_that_verifiers_refuse_unread(keys: KeyStore) -> None:
    """Each link carries its parent, so a chain under an order with many tools outgrows the
    size every verifier reads long before 8 links: the desk refuses to sign the first link
    over it (``too_large``), and every link it did sign verifies."""
    token = issue_pass(_MANY_TOOLS, subject="agent:worker", keys=keys, now=NOW)
    depth = 1
    while True:
        try:
            token = issue_pass(_MANY_TOOLS, subject=f"agent:s{depth}", keys=keys,
                               parent_token=token, now=NOW)
        except PassError as exc:
            assert exc.reason == "too_large" and _one_short_line(exc.message)
            break
        depth += 1
        assert len(token) <= MAX_TOKEN_BYTES
        assert len(_verify(token, keys).chain) == depth
    assert depth < 8
    huge = [f"fs/{i:06d}" for i in range(10_000)]
    assert _refusal(lambda: issue_pass(ORDER, subject="agent:worker", keys=keys, tools=huge,
                                       now=NOW)).reason == "too_large"


# -- with a store -------------------------------------------------------------------------


def _accepted(store: Store, order: WorkOrder = ORDER) -> Store:
    store.create_order(order, Event.model_validate(
        {"seq": 1, "at": "2026-01-01T00:00:00Z", "actor": "human:ana", "action": "create",
         "to": "offered"}))
    store.append(order.id, Event.model_validate(
        {"seq": 2, "at": "2026-01-01T00:01:00Z", "actor": "agent:worker", "action": "accept",
         "from": "offered", "to": "accepted"}), state="accepted")
    return store


class _EndingMidIssue:
    """A store whose order is cancelled, through the desk, just before a pass is recorded:
    the order's end and the issuing of a pass interleaved as two processes can."""

    desk: Desk | None = None

    def save_pass(self, record: PassRecord) -> None:
        desk, self.desk = self.desk, None
        if desk is not None:
            desk.cancel(record.order_id, "human:ana", "no longer needed")
        super().save_pass(record)  # type: ignore[misc]


class _MemoryEndingMidIssue(_EndingMidIssue, MemoryStore):
    pass


class _SQLiteEndingMidIssue(_EndingMidIssue, SQLiteStore):
    pass


@pytest.fixture(params=["memory", "sqlite"])
def racing(request: pytest.FixtureRequest, tmp_path: Path
           ) -> Iterator[_MemoryEndingMidIssue | _SQLiteEndingMidIssue]:
    made = (_MemoryEndingMidIssue() if request.param == "memory"
            else _SQLiteEndingMidIssue(tmp_path / "desk.sqlite3"))
    _accepted(made)
    yield made
    made.close()


@pytest.mark.spec("DP-8")
@pytest.mark.parametrize("derived", [False, True])
def test_a_pass_issued_while_its_order_ends_is_revoked(
        racing: _MemoryEndingMidIssue | _SQLiteEndingMidIssue, keys: KeyStore,
        derived: bool) -> None:
    """The order's end revokes the passes recorded by then; one recorded a moment later is
    revoked by the issuing itself, which then refuses: no pass of an ended order verifies."""
    parent = issue_recorded_pass(racing, "ord-1", keys=keys, subject="agent:worker", now=NOW)
    racing.desk = Desk(racing)
    with pytest.raises(InvalidTransition, match="cancelled"):
        issue_recorded_pass(racing, "ord-1", keys=keys, subject="agent:sub" if derived
                            else "agent:worker", parent_token=parent if derived else None,
                            tools=["fs/read"] if derived else None, now=NOW)
    issued = [p.jti for p in racing.passes("ord-1")]
    assert len(issued) == 2 and set(issued) <= set(racing.revoked())


# -- the command line ---------------------------------------------------------------------


@pytest.fixture
def home(tmp_path: Path) -> Path:
    store = _accepted(SQLiteStore(tmp_path / "desk.sqlite3"), _MANY_TOOLS)
    store.close()
    return tmp_path


def _cli(capsys: pytest.CaptureFixture[str], home: Path, *argv: str) -> tuple[int, str, str]:
    code = main(["pass", *argv, "--home", str(home)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.spec("DP-12")
def test_awl_pass_issue_refuses_a_token_too_large_to_verify(
        capsys: pytest.CaptureFixture[str], home: Path) -> None:
    """`awl pass issue --parent` says in one line that the pass would be too large, prints
    no token and records nothing."""
    code, token, err = _cli(capsys, home, "issue", "--order", "ord-1", "--to", "agent:worker")
    assert code == 0, err
    for i in range(10):
        code, out, err = _cli(capsys, home, "issue", "--parent", token.strip(), "--to",
                              f"agent:s{i}")
        if code != 0:
            break
        token = out
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "verifiers refuse a token over" in err and "Traceback" not in err
    store = SQLiteStore(home / "desk.sqlite3")
    try:
        assert len(store.passes("ord-1")) == i + 1
    finally:
        store.close()


def test_every_library_refusal_is_an_awl_error(keys: KeyStore, root: str) -> None:
    """Whatever a holder hands the issuer or the verifier, the answer is an AWLError."""
    seven: Any = 7
    bad: list[Callable[[], object]] = [
        lambda: _verify(None, keys), lambda: _verify("x" * 10**6, keys),
        lambda: issue_pass(ORDER, subject="s", keys=keys, parent_token=None, now=NOW),
        lambda: issue_pass(ORDER, subject="s", keys=keys, parent_token="x.y.z", now=NOW),
        lambda: issue_pass(ORDER, subject="s", keys=keys, parent_token=root, tools=seven,
                           now=NOW),
        lambda: issue_pass(ORDER, subject=seven, keys=keys, parent_token=root, now=NOW),
    ]
    for call in bad:
        with pytest.raises(AWLError):
            call()


# -- over HTTP ----------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["kid", "typ", "alg", "\u20ac"])
def test_a_refusal_is_one_line_of_ascii_whatever_the_token_holds(keys: KeyStore, root: str,
                                                                  field: str) -> None:
    """Header values (and names) are shown escaped: a refusal is sent in a
    WWW-Authenticate header, which cannot carry characters beyond Latin-1."""
    header = {"alg": "EdDSA", "typ": PASS_TYPE, "kid": keys.current_kid}
    header[field] = "\u20ac\u2028\n" + "\u00e9" * 200
    message = _refusal(lambda: _verify(_with_header(root, header), keys)).message
    assert message.isascii() and _one_short_line(message)


@pytest.mark.anyio
@pytest.mark.parametrize("field", ["kid", "typ"])
async def test_a_bearer_pass_with_foreign_characters_gets_401_not_500(
        keys: KeyStore, root: str, field: str) -> None:
    """Through the HTTP door every gateway uses (BearerAuth, refusing with the verifier's
    reason and message), a pass whose kid or typ holds a euro sign is answered 401 with its
    reason; before, the refusal could not be written as a header and the answer was a 500."""
    async def authenticate(token: str | None) -> object:
        try:
            return _verify(token, keys)
        except PassError as exc:
            raise Unauthorized(f"{exc.reason}: {exc.message}") from None

    async def app(scope: Any, receive: Any, send: Any) -> None:  # never reached
        raise AssertionError("a refused request reached the app")

    header = {"alg": "EdDSA", "typ": PASS_TYPE, "kid": keys.current_kid}
    header[field] = "\u20ac"
    token = _with_header(root, header)
    transport = httpx2.ASGITransport(app=BearerAuth(app, authenticate))
    async with httpx2.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        answer = await client.post("/mcp", json={}, headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 401
    reason = {"kid": "unknown_kid", "typ": "malformed"}[field]
    assert answer.json()["error_description"].startswith(f"{reason}:")
    assert "\\u20ac" in answer.headers["www-authenticate"]


@pytest.mark.anyio
async def test_any_refusal_with_foreign_characters_is_a_401_one_ascii_line() -> None:
    """Whatever an authenticator refuses with (not only the verifier's own lines): a
    message with a euro sign and line breaks is escaped into the header, never a 500."""
    async def authenticate(token: str | None) -> object:
        raise Unauthorized("no such token \u20ac\nsecond line")

    async def app(scope: Any, receive: Any, send: Any) -> None:  # never reached
        raise AssertionError("a refused request reached the app")

    transport = httpx2.ASGITransport(app=BearerAuth(app, authenticate))
    async with httpx2.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        answer = await client.post("/mcp", json={}, headers={"Authorization": "Bearer x"})
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"].endswith(
        'error_description="no such token \\u20ac second line"')


def test_a_kid_with_a_trailing_newline_names_no_key_file(keys: KeyStore) -> None:
    """The kid check read ``^...$`` with ``match``, which lets a trailing newline through:
    a key file whose name ends so would have been read as a key. Only a whole kid is."""
    from awl.documents.errors import NotFound

    kid = keys.current_kid
    odd = keys.folder / f"{kid}\n.pem"
    odd.write_bytes((keys.folder / f"{kid}.pem").read_bytes())
    odd.chmod(0o600)
    with pytest.raises(PassError) as refused:
        keys.private_key(f"{kid}\n")
    assert refused.value.reason == "unknown_kid"
    with pytest.raises(NotFound):
        keys.retire(f"{kid}\n")
