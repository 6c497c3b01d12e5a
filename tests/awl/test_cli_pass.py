"""``awl pass``: issue, show, revoke, jwks and rotate from the command line."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from awl.cli import main
from awl.desk.home import default_store
from awl.documents.models import Event, WorkOrder
from awl.passes import MAX_CHAIN, unverified_claims, verify_pass

ORDER = WorkOrder.model_validate({
    "spec": "awl/work-order@0.3",
    "id": "ord-1",
    "created_at": "2026-01-01T00:00:00Z",
    "from": "human:ana",
    "to": "agent:worker",
    "goal": "Answer the mail",
    "criteria": [{"id": "c1", "text": "the mail is answered"}],
    "budget": {"usd": 5, "tool_calls": 10},
    "deadline": "2099-01-01T00:00:00Z",
    "tools": ["fs/*", "mail/*"],
    "staged": ["mail/send"],
})


@pytest.fixture
def home(tmp_path: Path) -> Path:
    store = default_store(tmp_path)
    store.create_order(ORDER, Event.model_validate(
        {"seq": 1, "at": "2026-01-01T00:00:00Z", "actor": "human:ana", "action": "create",
         "to": "offered"}))
    store.append("ord-1", Event.model_validate(
        {"seq": 2, "at": "2026-01-01T00:01:00Z", "actor": "agent:worker", "action": "accept",
         "from": "offered", "to": "accepted"}), state="accepted")
    store.close()
    return tmp_path


def _run(capsys: pytest.CaptureFixture[str], home: Path, *argv: str) -> tuple[int, str, str]:
    code = main(["pass", *argv, "--home", str(home)])
    out, err = capsys.readouterr()
    return code, out, err


def _issue(capsys: pytest.CaptureFixture[str], home: Path, *argv: str) -> str:
    code, out, err = _run(capsys, home, "issue", *argv)
    assert code == 0, err
    return out.strip()


def test_issue_prints_a_token_that_verifies(capsys: pytest.CaptureFixture[str], home: Path
                                            ) -> None:
    """`awl pass issue` prints one token that verifies against `awl pass jwks`."""
    token = _issue(capsys, home, "--order", "ord-1", "--to", "agent:worker")
    code, out, _ = _run(capsys, home, "jwks")
    assert code == 0
    verified = verify_pass(token, jwks=json.loads(out), revoked=(), audience="awl:gateway")
    assert verified.subject == "agent:worker" and verified.staged == ("mail/send",)


def test_issue_from_a_parent_with_narrower_terms(capsys: pytest.CaptureFixture[str],
                                                 home: Path) -> None:
    """--parent, --tools, --budget, --expires and --json make a narrower sub-agent pass."""
    root = _issue(capsys, home, "--order", "ord-1", "--to", "agent:worker")
    code, out, err = _run(capsys, home, "issue", "--parent", root, "--to", "agent:sub",
                          "--tools", "fs/read, mail/read", "--budget", "usd=1,tool_calls=2",
                          "--expires", "15m", "--json")
    assert code == 0, err
    result = json.loads(out)
    claims = unverified_claims(result["token"])[1]
    assert claims["jti"] == result["jti"] and claims["exp"] == result["exp"]
    assert claims["exp"] - claims["iat"] == 900
    assert claims["grant"]["tools"] == ["fs/read", "mail/read"]
    assert claims["grant"]["budget"] == {"usd": 1, "tool_calls": 2}
    assert claims["grant"]["order_id"] == "ord-1"


@pytest.mark.parametrize("given", ["", " ", ","])
def test_an_empty_tools_list_grants_no_tool_never_every_tool(
        capsys: pytest.CaptureFixture[str], home: Path, given: str) -> None:
    """`--tools ""` (say `--tools "$TOOLS"` with TOOLS unset) grants nothing, as `--tools ,`
    does: only a --tools left out takes the default, the most allowed. It granted every tool
    of the parent pass, or of the order (mail/*, which reaches the staged mail/send)."""
    root = _issue(capsys, home, "--order", "ord-1", "--to", "agent:worker", "--tools", "fs/*")
    child = _issue(capsys, home, "--parent", root, "--to", "agent:sub", "--tools", given)
    assert unverified_claims(child)[1]["grant"]["tools"] == []
    worker = _issue(capsys, home, "--order", "ord-1", "--to", "agent:worker", "--tools", given)
    assert unverified_claims(worker)[1]["grant"]["tools"] == []
    default = _issue(capsys, home, "--parent", root, "--to", "agent:sub")
    assert unverified_claims(default)[1]["grant"]["tools"] == ["fs/*"]


@pytest.mark.parametrize("grant", [5, "ord-1", ["ord-1"], None])
def test_a_parent_whose_grant_is_no_object_is_one_line(
        capsys: pytest.CaptureFixture[str], home: Path, grant: object) -> None:
    """A --parent whose claims hold a grant that is not an object (a forged or damaged
    token) ended in "INTERNAL ... AttributeError"; now it is the usage line it should be."""
    def part(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    forged = ".".join((part({"alg": "EdDSA", "typ": "awl-pass+jwt"}),
                       part({"grant": grant, "sub": "agent:worker"}), "c2ln"))
    code, out, err = _run(capsys, home, "issue", "--parent", forged, "--to", "agent:sub")
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "the parent pass names no order; give --order ID" in err


@pytest.mark.spec("SEC-4")
def test_a_refused_issue_names_the_rule_on_one_line(capsys: pytest.CaptureFixture[str],
                                                    home: Path) -> None:
    """Delegating a staged tool fails with exit 1 and one line naming P7."""
    root = _issue(capsys, home, "--order", "ord-1", "--to", "agent:worker")
    code, out, err = _run(capsys, home, "issue", "--parent", root, "--to", "agent:sub",
                          "--tools", "mail/send")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "P7" in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [
    ["--budget", "gold=1"], ["--budget", "usd=lots"], ["--budget", "tool_calls=1.5"],
    ["--expires", "soon"], ["--expires", "0s"],
])
def test_bad_arguments_are_one_line_errors(capsys: pytest.CaptureFixture[str], home: Path,
                                           argv: list[str]) -> None:
    """A malformed --budget or --expires is refused with exit 2 and one line."""
    code, _, err = _run(capsys, home, "issue", "--order", "ord-1", "--to", "w", *argv)
    assert code == 2 and err.count("\n") == 1


def test_an_unknown_order_is_not_found(capsys: pytest.CaptureFixture[str], home: Path) -> None:
    """Issuing for an order the desk does not have fails with NOT_FOUND."""
    code, _, err = _run(capsys, home, "issue", "--order", "nope", "--to", "w")
    assert code == 1 and "NOT_FOUND" in err


def test_show_describes_a_valid_chain(capsys: pytest.CaptureFixture[str], home: Path) -> None:
    """`awl pass show` prints subject, order, tools, budget, expiry, chain and a verdict."""
    root = _issue(capsys, home, "--order", "ord-1", "--to", "agent:worker")
    child = _issue(capsys, home, "--parent", root, "--to", "agent:sub", "--tools", "fs/read")
    code, out, _ = _run(capsys, home, "show", child)
    assert code == 0
    fields = dict(line.split(None, 1) for line in out.splitlines())
    assert fields["subject"] == "agent:sub"
    assert fields["order"].startswith("ord-1 (manager human:ana")
    assert fields["tools"] == "fs/read" and fields["staged"] == "mail/send"
    assert fields["budget"] == "tool_calls=10 usd=5"
    assert "agent:worker" in fields["chain"] and fields["chain"].endswith("(agent:sub)")
    assert fields["verdict"] == "valid"


def test_revoke_makes_show_refuse_the_chain(capsys: pytest.CaptureFixture[str], home: Path
                                            ) -> None:
    """After `awl pass revoke` of a parent, show refuses its child with exit 1."""
    root = _issue(capsys, home, "--order", "ord-1", "--to", "agent:worker")
    child = _issue(capsys, home, "--parent", root, "--to", "agent:sub", "--tools", "fs/read")
    jti = unverified_claims(root)[1]["jti"]
    code, _, _ = _run(capsys, home, "revoke", jti, "--reason", "leaked")
    assert code == 0
    code, out, _ = _run(capsys, home, "show", child, "--json")
    assert code == 1
    shown = json.loads(out)
    assert shown["valid"] is False and shown["reason"] == "revoked"
    assert [c["sub"] for c in shown["chain"]] == ["agent:worker", "agent:sub"]


def test_rotate_keeps_issued_passes_valid(capsys: pytest.CaptureFixture[str], home: Path
                                          ) -> None:
    """`awl pass rotate` adds a key; passes signed before it still show as valid."""
    token = _issue(capsys, home, "--order", "ord-1", "--to", "agent:worker")
    code, out, _ = _run(capsys, home, "rotate", "--json")
    assert code == 0 and len(json.loads(out)["kids"]) == 2
    assert _run(capsys, home, "show", token)[0] == 0


@pytest.mark.spec("SEC-4")
def test_show_of_garbage_is_one_line(capsys: pytest.CaptureFixture[str], home: Path) -> None:
    """A token that cannot be read is refused with one line, never a traceback."""
    code, _, err = _run(capsys, home, "show", "not-a-token")
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.slow
def test_the_installed_command_runs(home: Path) -> None:
    """The `awl` entry point exports the JWKS in a real process."""
    done = subprocess.run([sys.executable, "-m", "awl", "pass", "jwks", "--home", str(home)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["keys"][0]["kty"] == "OKP"


@pytest.mark.slow
@pytest.mark.spec("DP-12")
def test_awl_pass_issue_never_signs_a_chain_longer_than_verifiers_accept(
        capsys: pytest.CaptureFixture[str], home: Path) -> None:
    """Deriving link after link with `awl pass issue --parent`: every link up to the limit is
    issued and verifies; the one past it is refused in one line, and nothing is printed."""
    token = _issue(capsys, home, "--order", "ord-1", "--to", "agent:worker")
    for i in range(MAX_CHAIN - 1):
        token = _issue(capsys, home, "--parent", token, "--to", f"agent:sub{i}",
                       "--tools", "fs/read")
    code, out, _ = _run(capsys, home, "jwks")
    assert len(verify_pass(token, jwks=json.loads(out), revoked=(),
                           audience="awl:gateway").chain) == MAX_CHAIN
    code, out, err = _run(capsys, home, "issue", "--parent", token, "--to", "agent:deepest",
                          "--tools", "fs/read")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and f"at most {MAX_CHAIN} links" in err


def test_revoke_refuses_a_jti_this_desk_never_issued(capsys: pytest.CaptureFixture[str],
                                                     home: Path) -> None:
    """A mistyped jti is refused in one line and revokes nothing: the pass meant stays valid
    and the manager learns it at once; --not-issued-here revokes a foreign jti on purpose."""
    token = _issue(capsys, home, "--order", "ord-1", "--to", "agent:worker")
    jti = unverified_claims(token)[1]["jti"]
    code, out, err = _run(capsys, home, "revoke", jti[:-1] + ("0" if jti[-1] != "0" else "1"))
    assert code == 1 and out == ""
    assert err.startswith("awl: NOT_FOUND: this desk issued no pass with jti")
    assert len(err.strip().splitlines()) == 1
    assert _run(capsys, home, "show", token)[0] == 0
    store = default_store(home)
    try:
        assert store.revoked() == {}
    finally:
        store.close()
    code, out, _ = _run(capsys, home, "revoke", "jti-from-elsewhere", "--not-issued-here",
                        "--json")
    assert code == 0 and json.loads(out)["revoked"] == "jti-from-elsewhere"
    # Revoking again what is already revoked is still fine (idempotent).
    assert _run(capsys, home, "revoke", "jti-from-elsewhere")[0] == 0


def test_revoke_takes_the_pass_itself(capsys: pytest.CaptureFixture[str], home: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Given the whole pass (on the line or on stdin), revoke revokes its jti: before, the
    token was stored as a jti of its own and the pass stayed valid."""
    first = _issue(capsys, home, "--order", "ord-1", "--to", "agent:worker")
    second = _issue(capsys, home, "--order", "ord-1", "--to", "agent:worker")
    code, out, _ = _run(capsys, home, "revoke", first, "--json")
    assert code == 0 and json.loads(out)["revoked"] == unverified_claims(first)[1]["jti"]
    assert _run(capsys, home, "show", first)[0] == 1
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO((second + "\n").encode())))
    code, out, _ = _run(capsys, home, "revoke", "-")
    assert code == 0 and unverified_claims(second)[1]["jti"] in out
    assert _run(capsys, home, "show", second)[0] == 1
    code, _, err = _run(capsys, home, "revoke", "not.a.pass")
    assert code == 2 and "cannot read that pass" in err
