"""Issue 23's inputs, one regression test each, through the door each one used (SEC-4).

Items 1 and 3 (patterns) are in test_bounded.py, item 9 (gateway configs) in
tests/gateway/test_config.py; items 2, 10 and 11 belong to the gateway's result and frame
handling.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from awl import BadRequest, ValidationFailed
from awl.cli import main
from awl.desk import Desk as LibraryDesk
from awl.desk import OrderView
from awl.passes import KeyStore, iter_pass_findings, verify_pass
from awl.store.sqlite import SQLiteStore
from tests.awl.server_support import MANAGER, WORKER, order_fields, serve_as
from tests.awl.test_cli_pass import ORDER
from tests.awl.test_cli_pass import home as home

ROOT = Path(__file__).resolve().parents[2]
YEAR_10000_IN_UTC = "9999-12-31T23:59:59-01:00"


def _awl(*args: str | bytes, home: Path, stdin: bytes | None = None
         ) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "AWL_HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.pop("AWL_ACTOR", None)
    return subprocess.run([sys.executable.encode(), b"-m", b"awl",
                           *(a if isinstance(a, bytes) else a.encode() for a in args)],
                          input=stdin, capture_output=True, timeout=60, check=False, env=env)


def _one_clear_line(done: subprocess.CompletedProcess[bytes]) -> str:
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode != 0, err
    assert "Traceback" not in err, err
    assert err.startswith("awl: ") and err.count("\n") == 1, err
    return err


# ----------------------------------------------------------------------------- item 4

@pytest.mark.spec("DOC-14", "O1")
def test_a_deadline_in_the_year_10000_in_utc_is_refused_at_creation(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "desk.sqlite3")
    try:
        with pytest.raises(ValidationFailed) as caught:
            LibraryDesk(store).create(order_fields(deadline=YEAR_10000_IN_UTC), MANAGER)
        assert [(f.rule, f.path) for f in caught.value.findings] == [("O1", "/deadline")]
    finally:
        store.close()


def _desk_with_an_order(tmp_path: Path, *, accepted: bool = False) -> tuple[Path, OrderView]:
    home = tmp_path / "home"
    home.mkdir()
    store = SQLiteStore(home / "desk.sqlite3")
    try:
        desk = LibraryDesk(store)
        view = desk.create(order_fields(), MANAGER)
        return home, desk.accept(view.id, WORKER) if accepted else view
    finally:
        store.close()


def _sign(home: Path, claims: dict[str, Any]) -> str:
    return KeyStore(home).sign(claims)


@pytest.mark.spec("DOC-14", "SEC-4")
@pytest.mark.parametrize(("change", "shown"), [
    ({"exp": 1e20}, "(not a time)"),
    ({"nbf": -1e20}, "(not a time)"),
    ({"exp": 10**30}, "(not a time)"),
    ({"grant": {"order_id": "ord-1", "tools": 5, "budget": {"usd": 1}}}, "5 (not a list)"),
    ({"grant": {"order_id": "ord-1", "tools": ["fs/*"], "budget": {"usd": 1},
                "staged": {"x": 1}}}, "(not a list)"),
])
def test_pass_show_describes_hostile_claims(capsys: pytest.CaptureFixture[str], home: Path,
                                            change: dict[str, Any], shown: str) -> None:
    assert main(["pass", "issue", "--order", "ord-1", "--to", "agent:worker",
                 "--home", str(home)]) == 0  # the home has keys now
    capsys.readouterr()
    claims: dict[str, Any] = {
        "spec": "awl/delegation-pass@0.3", "iss": "awl:desk", "sub": "agent:worker",
        "aud": "awl:gateway", "jti": "j1", "iat": 1, "nbf": 1, "exp": 2,
        "grant": {"order_id": "ord-1", "tools": ["fs/*"], "budget": {"usd": 1}}}
    claims.update(change)
    token = _sign(home, claims)
    code = main(["pass", "show", token, "--home", str(home)])
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in err
    assert shown in out
    assert "verdict   REFUSED" in out
    code = main(["pass", "show", token, "--home", str(home), "--json"])
    out, _ = capsys.readouterr()
    assert code == 1 and json.loads(out)["valid"] is False


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.spec("DOC-14", "SEC-4", "BIND-4")
async def test_issue_delegation_pass_refuses_before_signing(tmp_path: Path) -> None:
    """A lifetime past the year 9999 is BAD_REQUEST, and no pass was recorded."""
    home, view = _desk_with_an_order(tmp_path, accepted=True)
    with anyio.fail_after(60):
        async with serve_as(home, WORKER, "legacy") as w:
            for seconds in (1e300, 10**30, 300_000_000_000):
                refused = await w.refused("issue_delegation_pass", order_id=view.id,
                                          expires_in_seconds=seconds)
                assert refused["code"] == "BAD_REQUEST", refused
                assert "years 1 to 9999" in refused["message"]
            issued = await w.call("issue_delegation_pass", order_id=view.id)
    store = SQLiteStore(home / "desk.sqlite3")
    try:
        assert [p.jti for p in store.passes(view.id)] == [issued["jti"]]
    finally:
        store.close()


@pytest.mark.spec("DOC-14")
def test_the_public_pass_checks_refuse_a_bad_now_or_remaining(home: Path) -> None:
    claims = {"spec": "awl/delegation-pass@0.3", "iss": "awl:desk", "sub": "agent:worker",
              "aud": "awl:gateway", "jti": "j1", "iat": 1, "nbf": 1, "exp": 2,
              "grant": {"order_id": "ord-1", "tools": ["fs/*"], "budget": {"usd": 1}}}
    for now in ("yesterday", object(), float("nan"), 1e20, True, datetime(2026, 1, 1),
                "0001-01-01T00:00:00+01:00"):
        with pytest.raises(BadRequest, match=r"now|offset"):
            list(iter_pass_findings(claims, order=ORDER, now=now))  # type: ignore[arg-type]
    for remaining in (5, {"usd": "1"}, {"usd": float("inf")}, {1: 2}, {"usd": True}):
        with pytest.raises(BadRequest, match="remaining must map"):
            list(iter_pass_findings(claims, remaining=remaining))  # type: ignore[arg-type]
    with pytest.raises(BadRequest, match="now"):
        verify_pass(_sign(home, claims), jwks=KeyStore(home).jwks(), revoked=(),
                    audience="awl:gateway", now="later")


# ----------------------------------------------------------------------------- items 5, 6

@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.spec("DOC-12", "DOC-5", "BIND-4")
async def test_integers_beyond_64_bits_never_reach_sqlite(tmp_path: Path) -> None:
    home, view = _desk_with_an_order(tmp_path)
    with anyio.fail_after(60):
        async with serve_as(home, WORKER, "legacy") as w:
            for arguments in ({"offset": 2**63}, {"offset": 2**64}, {"limit": 2**63},
                              {"offset": 10**400}):
                refused = await w.refused("list_work_orders", **arguments)
                assert refused["code"] == "BAD_REQUEST", refused
            refused = await w.refused("wait_for_update", order_id=view.id, after_seq=2**63)
            assert refused["code"] == "BAD_REQUEST"
            # SPEC DOC-5: 1.0 is the integer 1.
            listed = await w.call("list_work_orders", offset=0.0, limit=2.0)
            assert [o["id"] for o in listed["orders"]] == [view.id]
            # The question queue pages by cursor, not offset (BIND-20); its limit is whole too.
            listed = await w.call("list_work_orders", role="answerer", limit=2.0)
            assert listed["orders"] == [] and "next" not in listed
    done = _awl("order", "list", "--limit", "18446744073709551616", home=home)
    assert "--limit must be a whole number from 1 to 9223372036854775807" in _one_clear_line(done)
    done = _awl("order", "follow", view.id, "--after", str(2**63), home=home)
    assert "--after must be a whole number" in _one_clear_line(done)
    done = _awl("order", "follow", view.id, "--timeout", "nan", home=home)
    assert "--timeout" in _one_clear_line(done)


@pytest.mark.spec("DOC-12")
def test_the_library_desk_refuses_out_of_range_integers(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "desk.sqlite3")
    try:
        desk = LibraryDesk(store)
        view = desk.create(order_fields(), MANAGER)
        for call in (lambda: desk.list(limit=2**63), lambda: desk.list(offset=-1),
                     lambda: desk.events(view.id, after=2**64),
                     lambda: desk.wait(view.id, after=2**63, timeout=0)):
            with pytest.raises(BadRequest, match="must be a whole number"):
                call()
        assert [v.id for v in desk.list(limit=1.0)] == [view.id]  # type: ignore[arg-type]
    finally:
        store.close()


@pytest.mark.spec("DOC-1", "SEC-4")
def test_the_library_desk_judges_wrong_shapes_and_types_with_its_own_errors() -> None:
    """Desk and AsyncDesk given an array for a document get the schema rule's finding (O1,
    R1; DOC-1), and a number, None or a list where text, effect refs, states or a timeout go
    get one BadRequest naming it: never a TypeError, AttributeError or pydantic error with a
    traceback. `dict([1])` ran before the desk's own "is it an object" test, and `.strip()`
    before any type test."""
    from awl import AWLError, MemoryStore
    from awl.desk import AsyncDesk
    from tests.awl.desk_support import Clock, submitted, working
    from tests.awl.desk_support import order_fields as fields_of_2030

    desk = LibraryDesk(MemoryStore(), clock=Clock())
    offered = desk.create(fields_of_2030(), MANAGER).id
    active = working(desk).id
    done = submitted(desk).id
    loose: Any = desk  # called as untyped code would call it
    loose_async: Any = AsyncDesk.of(desk)
    with pytest.raises(ValidationFailed) as order:
        loose.create([["to", WORKER]], MANAGER)
    assert [(f.rule, f.path) for f in order.value.findings] == [("O1", "")]
    with pytest.raises(ValidationFailed) as report:
        loose.report(active, WORKER, [1, 2])
    assert [(f.rule, f.path) for f in report.value.findings] == [("R1", "")]
    calls: list[tuple[str, Any]] = [
        ("a progress note is text", lambda: loose.progress(active, WORKER, 123)),
        ("a progress note is text", lambda: loose.progress(active, WORKER, None)),
        ("an answer is text", lambda: loose.answer(active, MANAGER, 5)),
        ("reason is text", lambda: loose.cancel(active, MANAGER, None)),
        ("reason is text", lambda: loose.decline(offered, WORKER, ["no"])),
        ("effects is a list of effect refs", lambda: loose.review(
            done, MANAGER, "approve", effects=[1])),
        ("effects is a list of effect refs", lambda: loose.review(
            done, MANAGER, "approve", effects="mail/send#1")),
        ("state is a state or a list", lambda: loose.list(state=5)),
        ("timeout must be a number", lambda: loose.wait(active, 99, timeout="1")),
        ("timeout must be a number", lambda: list(loose.follow(active, timeout="1"))),
        ("a webhook URL is text", lambda: loose.add_webhook(5, "submitted")),
        ("events are event names", lambda: loose.add_webhook("https://h.example/x", 5)),
        ("timeout must be a number", lambda: anyio.run(
            lambda: loose_async.wait(active, 99, timeout="1"))),
    ]
    for message, call in calls:
        with pytest.raises(AWLError, match=message) as caught:
            call()
        assert type(caught.value) is BadRequest, message
    assert [view.state for view in (desk.get(offered), desk.get(active), desk.get(done))] == [
        "offered", "working", "submitted"]


# ----------------------------------------------------------------------------- item 7

@pytest.mark.slow
@pytest.mark.spec("DOC-13", "SEC-4")
@pytest.mark.parametrize("argv", [
    (b"order", b"list", b"--worker", b"\xff"),
    (b"order", b"show", b"\xff"),
    (b"track", b"\xff"),
    (b"token", b"issue", b"\xffagent"),
    (b"validate", b"\xfe.json"),
])
def test_non_utf8_arguments_are_one_clear_line(tmp_path: Path, argv: tuple[bytes, ...]) -> None:
    err = _one_clear_line(_awl(*argv, home=tmp_path))
    assert "is not valid UTF-8 text" in err


# ----------------------------------------------------------------------------- item 8

@pytest.mark.slow
@pytest.mark.spec("DOC-12", "SEC-4")
@pytest.mark.parametrize("budget", ["usd=1e400", "usd=inf", "usd=nan", "seconds=-inf",
                                    "tokens=99999999999999999999", "tool_calls=" + "9" * 5000])
def test_pass_issue_budget_beyond_the_number_range_is_one_line(home: Path, budget: str) -> None:
    done = _awl("pass", "issue", "--order", "ord-1", "--to", "agent:worker", "--budget", budget,
                "--home", str(home), home=home)
    assert "--budget" in _one_clear_line(done)


# ----------------------------------------------------------------------------- item 12

@pytest.mark.slow
@pytest.mark.spec("DOC-17", "BIND-1", "SEC-4")
def test_every_cli_path_that_reads_a_file_refuses_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    good = tmp_path / "order.json"
    good.write_text(json.dumps(order_fields()))
    SQLiteStore(_home_file(tmp_path / "home")).close()  # `awl gateway` makes no desk
    for argv in (("validate", str(fifo)),
                 ("validate", str(good), "--order", str(fifo)),
                 ("order", "create", str(fifo), "--as", MANAGER),
                 ("work", "report", "wo_x", str(fifo), "--as", WORKER),
                 ("conformance", str(fifo)),
                 ("gateway", "--config", str(fifo), "--order", "wo_x")):
        done = _awl(*argv, home=tmp_path / "home")
        err = done.stderr.decode()
        assert done.returncode != 0 and "Traceback" not in err, (argv, err)
        assert "FIFO" in err or "not a regular file" in err or "is neither" in err, (argv, err)


# ----------------------------------------------------------------------------- broken pipe

@pytest.mark.slow
@pytest.mark.spec("SEC-4")
def test_a_reader_that_goes_away_gets_no_traceback(tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = SQLiteStore(_home_file(home))
    try:
        desk = LibraryDesk(store)
        for _ in range(40):
            desk.create(order_fields(goal="x" * 2000), MANAGER)
    finally:
        store.close()
    env = {**os.environ, "AWL_HOME": str(home), "PYTHONPATH": str(ROOT)}
    for argv in (["order", "list", "--json"], ["order", "list"], ["--help"]):
        pipeline = subprocess.run(
            f"{sys.executable} -m awl {' '.join(argv)} | head -c 1", shell=True,
            capture_output=True, timeout=60, check=False, env=env)
        assert len(pipeline.stdout) == 1
        assert b"Traceback" not in pipeline.stderr and b"Error" not in pipeline.stderr, (
            argv, pipeline.stderr)


def _home_file(home: Path) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    return home / "desk.sqlite3"


# ----------------------------------------------------------------------------- a failing store

@pytest.mark.spec("SEC-4")
def test_a_store_that_fails_under_a_command_is_one_line_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A desk file whose tokens table is gone (damaged, or written by another program) makes
    the store raise sqlite3's own error mid-command: `awl token list` says so in one
    INTERNAL line and exits 1, rather than printing a traceback."""
    import sqlite3
    from contextlib import closing

    SQLiteStore(tmp_path / "desk.sqlite3").close()
    with closing(sqlite3.connect(tmp_path / "desk.sqlite3")) as raw:
        raw.execute("DROP TABLE tokens")
        raw.commit()
    code = main(["token", "list", "--home", str(tmp_path)])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err.startswith("awl: INTERNAL: the command failed unexpectedly (OperationalError: "
                          "no such table: tokens); ") and err.count("\n") == 1


@pytest.mark.spec("SEC-4")
def test_a_nul_character_postgresql_cannot_keep_is_one_line_from_the_cli(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], pg_url: str) -> None:
    """PostgreSQL's jsonb cannot hold U+0000, which JSON and the other stores can: an order
    whose goal holds one is refused by the store, nothing written, and `awl order create`
    says so in one line (BAD_REQUEST, naming the character) instead of psycopg's
    traceback."""
    order = tmp_path / "order.json"
    order.write_text(json.dumps(order_fields(goal="before\u0000after")))
    code = main(["order", "create", str(order), "--as", MANAGER, "--store", pg_url,
                 "--home", str(tmp_path)])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err.startswith("awl: BAD_REQUEST: ") and "U+0000 (NUL)" in err and (
        err.count("\n") == 1), err
