"""What the command modules share (``awl.cli._common``), as a manager meets it: a wait in
seconds or hours that is no number of them, and a document, token or pass given on stdin
that never ends or is not UTF-8, are each one line, with nothing sent, served or read on."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from awl.cli import main
from awl.cli._common import check_address
from awl.documents.limits import MAX_DOCUMENT_BYTES, show_value
from awl.store.sqlite import SQLiteStore
from awl.store.urls import shown_url
from tests.awl.desk_support import MANAGER
from tests.gateway.commit_support import make_setup

ROOT = Path(__file__).resolve().parents[2]


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


# -- --listen and --http: HOST:PORT ---------------------------------------------------------

ADDRESS_FLAGS = [
    (["web"], "--listen", "127.0.0.1:8766"),
    (["serve"], "--http", "127.0.0.1:8765"),
    (["gateway", "--order", "wo_x", "--config", "upstreams.json"], "--http", "127.0.0.1:8765"),
]
"""Each command that listens, with its address flag and the example its refusals give."""

NOT_HOST_PORT = "is not HOST:PORT with a port from 0 to 65535; write for example {example}"
BAD_ADDRESSES = [
    ("", NOT_HOST_PORT),
    ("localhost:http", NOT_HOST_PORT),
    ("127.0.0.1:65536", NOT_HOST_PORT),
    ("127.0.0.1", NOT_HOST_PORT),
    ("http://127.0.0.1:8765/mcp", "is a URL, not HOST:PORT; write 127.0.0.1:8765 (no http://"),
    ("http://ana:s3cret@127.0.0.1:8765", "is a URL, not HOST:PORT; write 127.0.0.1:8765 "),
    ("127.0.0.1:8765/mcp", "is a URL, not HOST:PORT; write 127.0.0.1:8765 (no http://"),
    ("my host:8765", "names no host: 'my host' is neither a host name nor an IP address"),
    ("0.0.0.0:8765", "is not a loopback address, so other machines could connect; write "
                     "127.0.0.1:8765 to serve this machine only, or add --allow-remote"),
    ("[::]:0", "is not a loopback address"),
]


@pytest.mark.spec("SEC-2")
@pytest.mark.parametrize(("address", "says"), BAD_ADDRESSES,
                         ids=[repr(a) for a, _ in BAD_ADDRESSES])
@pytest.mark.parametrize(("command", "flag", "example"), ADDRESS_FLAGS,
                         ids=[c[0] for c, _, _ in ADDRESS_FLAGS])
def test_a_bad_listen_or_http_address_names_its_flag_before_the_desk_is_opened(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], flag: str,
        example: str, address: str, says: str) -> None:
    """`awl web --listen`, `awl serve --http` and `awl gateway --http` refused a bad address
    as "'…' is not HOST:PORT …" (exit 1) or "refusing to serve on …", never naming the flag;
    a URL (http://127.0.0.1:8765/mcp) got the HOST:PORT lecture without the address to
    write; the gateway opened the desk before refusing a remote address. Now each is one
    line naming the flag, what is wrong and what to write, exit 2 (a usage error, as the
    CLI's other flags), before the desk is opened."""
    code = main([*command, flag, address, "--home", str(tmp_path)])
    out, err = capsys.readouterr()
    assert (code, out) == (2, ""), err
    one_line(err, f"awl: {flag} {show_value(shown_url(address))} ")
    assert says.format(example=example) in err
    assert "s3cret" not in err
    assert not (tmp_path / "desk.sqlite3").exists()


@pytest.mark.parametrize(("command", "flag"), [("web", "--listen"), ("serve", "--http")])
def test_a_taken_port_names_its_flag(command: str, flag: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A port in use is no usage error (exit 1), but the line names the flag to change;
    `awl web` makes no desk first. (`awl gateway --http`: tests/gateway/
    test_upstream_closing.py.)"""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main([command, flag, f"127.0.0.1:{port}", "--no-notify",
                     "--home", str(tmp_path)])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    one_line(err, f"awl: BAD_REQUEST: {flag} '127.0.0.1:{port}': cannot listen on "
                  f"127.0.0.1:{port} (")
    if command == "web":
        assert not (tmp_path / "desk.sqlite3").exists()


def test_a_good_address_reads_as_before() -> None:
    """What the listening flags took, they still take: HOST:PORT, [IPv6]:PORT, a bare PORT
    (127.0.0.1's), a host name; a remote one with --allow-remote."""
    assert check_address("127.0.0.1:8765", flag="--http", allow_remote=False) == (
        "127.0.0.1", 8765)
    assert check_address("[::1]:0", flag="--http", allow_remote=False) == ("::1", 0)
    assert check_address("9000", flag="--listen", allow_remote=False) == ("127.0.0.1", 9000)
    assert check_address("localhost:0", flag="--http", allow_remote=False) == ("localhost", 0)
    assert check_address("0.0.0.0:80", flag="--http", allow_remote=True) == ("0.0.0.0", 80)
    assert check_address("desk.internal:80", flag="--http", allow_remote=True) == (
        "desk.internal", 80)


@pytest.mark.slow
@pytest.mark.spec("SEC-2")
def test_each_listening_flag_and_public_url_is_one_line_from_the_command(
        tmp_path: Path) -> None:
    """The same from the real `awl` process: exit 2, one line naming the flag, nothing on
    stdout, no desk made."""
    cases = [
        (["web", "--listen", "0.0.0.0:8766"], "awl: --listen '0.0.0.0:8766' is not a loopback"),
        (["serve", "--http", "http://127.0.0.1:8765/mcp"],
         "awl: --http 'http://127.0.0.1:8765/mcp' is a URL, not HOST:PORT; write "
         "127.0.0.1:8765"),
        (["gateway", "--order", "wo_x", "--config", "upstreams.json", "--http", "1.2.3.4:80"],
         "awl: --http '1.2.3.4:80' is not a loopback address"),
        (["notify", "run", "--once", "--public-url", "desk.example"],
         "awl: --public-url must start with http:// or https:// and name a host"),
        (["serve", "--as", "human:ana", "--public-url", "https://desk.example/#top"],
         "awl: --public-url may not have a #fragment"),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("AWL_PUBLIC_URL", None)
    for words, start in cases:
        done = subprocess.run([sys.executable, "-m", "awl", *words, "--home", str(tmp_path)],
                              env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=60, check=False)
        assert (done.returncode, done.stdout) == (2, ""), done.stderr
        one_line(done.stderr, start)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("value", ["bogus", "tracecontext,", "tracecontext, nope"])
def test_an_unknown_otel_propagator_is_one_line_not_a_valueerror(value: str) -> None:
    """The MCP SDK loads every propagator OTEL_PROPAGATORS names as it is imported, telemetry
    on or not: a name no package provides stopped `awl gateway` and `awl serve` with
    "INTERNAL ... ValueError". The real command now says which name, in one line, exit 2."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "awl", "serve", "--as", "human:ana", "--no-notify"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        env={**os.environ, "OTEL_PROPAGATORS": value, "AWL_HOME": "/nonexistent/awl"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("awl: OTEL_PROPAGATORS names ") and (
        done.stderr.count("\n") == 1), done.stderr
    assert "which no installed package provides (installed: baggage, tracecontext)" in (
        done.stderr)
