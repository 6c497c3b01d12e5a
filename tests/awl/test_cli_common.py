"""What the command modules share (``awl.cli._common``), as a manager meets it: a wait in
seconds or hours that is no number of them, and a document, token or pass given on stdin
that never ends or is not UTF-8, are each one line, with nothing sent, served or read on."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from awl.cli import main
from awl.documents.limits import MAX_DOCUMENT_BYTES
from awl.store.sqlite import SQLiteStore
from tests.awl.desk_support import MANAGER
from tests.gateway.commit_support import make_setup


def one_line(err: str, start: str) -> None:
    assert err.startswith(start), err
    assert err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.parametrize(("flag", "value"), [
    ("--timeout", "0"), ("--timeout", "-5"), ("--timeout", "nan"), ("--timeout", "inf"),
    ("--lock-wait", "-1"), ("--lock-wait", "nan"), ("--lock-wait", "inf")])
def test_a_commit_or_retry_with_a_wait_that_is_no_wait_touches_no_effect(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str) -> None:
    """`--timeout 0` (or less) used to mark each approved effect `dispatching` and then call
    it `unknown` unsent ("no answer within -5 s; it may have run"), leaving the manager to
    settle each by hand; `nan` failed with a traceback after the first mark. Now the command
    says what the flag takes before anything is marked."""
    setup = make_setup(tmp_path, [("receiver/deliver", {"to": "a"})])
    try:
        for command in (
                ["gateway", "--order", setup.order_id, "--config", str(setup.config), "--commit"],
                ["effects", "retry", setup.order_id, setup.refs[0], "--config",
                 str(setup.config), "--as", MANAGER]):
            code = main([*command, "--home", str(setup.home), flag, value])
            one_line(capsys.readouterr().err, f"awl: {flag} takes a number of seconds")
            assert code == 2
        assert [e.state for e in setup.store.effects(setup.order_id)] == ["held"]
        assert not setup.log.exists()  # the receiver never heard of it
    finally:
        setup.store.close()


@pytest.mark.parametrize("hours", ["inf", "1e308", "nan", "8761"])
def test_awl_web_refuses_a_session_length_that_is_no_number_of_hours(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], hours: str) -> None:
    """`--session-hours inf` used to start the page, and every sign-in then failed with an
    Internal Server Error (the cookie's Max-Age cannot be infinite). The missing --config
    would be the next refusal: the hours are checked first."""
    code = main(["web", "--listen", "127.0.0.1:0", "--session-hours", hours, "--config",
                 str(tmp_path / "missing.json"), "--home", str(tmp_path), "--no-notify"])
    one_line(capsys.readouterr().err, "awl: --session-hours takes a number of hours above 0")
    assert code == 2


class _Endless(io.RawIOBase):
    """A pipe that never ends (``cat /dev/zero | awl ...``); reading well past a document's
    limit fails the test instead of filling memory."""

    def __init__(self) -> None:
        self.given = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        self.given += len(buffer)
        assert self.given <= 2 * MAX_DOCUMENT_BYTES, "read on past the document limit"
        buffer[:] = b" " * len(buffer)
        return len(buffer)


def stdin_of(raw: io.RawIOBase | bytes) -> io.TextIOWrapper:
    source = io.BufferedReader(raw) if isinstance(raw, io.RawIOBase) else io.BytesIO(raw)
    return io.TextIOWrapper(source, encoding="utf-8", errors="strict")


@pytest.mark.parametrize("words", [["order", "create", "-", "--as", MANAGER],
                                   ["validate", "-"]])
def test_a_document_on_an_endless_stdin_is_refused_at_its_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        words: list[str]) -> None:
    """`cat /dev/zero | awl order create -` used to read until memory ran out (a
    MemoryError traceback); now it reads one byte past the 8 MiB limit and says so."""
    monkeypatch.setenv("AWL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("sys.stdin", stdin_of(_Endless()))
    code = main(words)
    out, err = capsys.readouterr()
    assert code == 1
    assert "larger than 8 MiB" in out + err and "Traceback" not in out + err


@pytest.mark.parametrize(("words", "what"), [
    (["token", "revoke", "--token", "-"], "the token"),
    (["pass", "show", "-"], "the pass")])
def test_a_token_or_pass_on_stdin_that_is_not_utf8_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        words: list[str], what: str) -> None:
    """Under a UTF-8 locale ``sys.stdin`` decodes strictly, so a stray byte used to end in a
    UnicodeDecodeError traceback; nothing is revoked."""
    SQLiteStore(tmp_path / "desk.sqlite3").close()
    monkeypatch.setattr("sys.stdin", stdin_of(b"\xff\xfeawl_x\n"))
    code = main([*words, "--home", str(tmp_path)])
    one_line(capsys.readouterr().err, f"awl: {what} on stdin is not UTF-8 text")
    assert code == 2
