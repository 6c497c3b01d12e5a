"""`awl notify`: subscriptions from the command line, and the deliverer as a real process
(alone, killed with kill -9 and restarted, and inside `awl serve` and `awl web`), on a desk
in SQLite (the home's file) and on one in PostgreSQL (``--store URL``)."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from awl.cli import main
from awl.desk.desk import Desk
from awl.store.protocol import Store, WebhookStore
from awl.store.sqlite import SQLiteStore
from awl.store.urls import open_store
from tests.awl.desk_support import MANAGER, WORKER, order_fields, report_fields
from tests.awl.hook_support import HANG, Receiver

ROOT = Path(__file__).resolve().parents[2]


def opened(home: Path, url: str | None) -> Store:
    """The desk's store: the home's SQLite file, or the one ``url`` names."""
    return SQLiteStore(home / "desk.sqlite3") if url is None else open_store(url)


def where(home: Path, url: str | None) -> list[str]:
    """The options that point a command at that desk."""
    return ["--home", str(home), *([] if url is None else ["--store", url])]


def submit(home: Path, url: str | None = None) -> str:
    """A fresh order, reported done on the desk: one ``submitted`` event."""
    deadline = (datetime.now(UTC) + timedelta(hours=1)).isoformat(timespec="seconds")
    with opened(home, url) as store:
        desk = Desk(store)
        view = desk.create(order_fields(deadline=deadline.replace("+00:00", "Z")), MANAGER)
        desk.accept(view.id, WORKER)
        desk.start(view.id, WORKER)
        desk.report(view.id, WORKER, report_fields())
        return view.id


def outbox(home: Path, url: str | None = None) -> list[dict[str, object]]:
    with opened(home, url) as store:
        assert isinstance(store, WebhookStore)
        return [{"state": n.state, "attempts": len(n.attempts), "id": n.id}
                for n in store.notifications()]


@contextmanager
def awl(*args: str) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("AWL_PUBLIC_URL", None)
    process = subprocess.Popen([sys.executable, "-m", "awl", *args], env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        assert process.stderr is not None
        err = process.stderr.read()
        process.stderr.close()
        assert b"Traceback" not in err, err.decode()


@pytest.mark.spec("HOOK-1", "BIND-14")
def test_add_list_remove_and_log(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 store_url: str | None) -> None:
    """`add --json` prints the secret once; `list` never does; `log` shows the outbox; a bad
    URL or event is one line."""
    desk = where(tmp_path, store_url)
    assert main(["notify", "add", "http://127.0.0.1:9/h", "--events", "submitted,failed",
                 "--json", *desk]) == 0
    added = json.loads(capsys.readouterr().out)
    assert added["secret"].startswith("whsec_") and added["events"] == ["submitted", "failed"]
    assert main(["notify", "list", "--json", *desk]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert listed == {k: v for k, v in added.items() if k != "secret"}
    assert main(["notify", "list", *desk]) == 0
    out = capsys.readouterr().out
    assert added["id"] in out and "whsec_" not in out
    order_id = submit(tmp_path, store_url)
    assert main(["notify", "log", *desk]) == 0
    out = capsys.readouterr().out
    assert f"  submitted  {order_id}  {added['id']}  pending  0 attempt(s)  next " in out
    assert main(["notify", "remove", added["id"], *desk]) == 0
    assert "will not be sent" in capsys.readouterr().out
    assert main(["notify", "log", "--json", *desk]) == 0
    [note] = json.loads(capsys.readouterr().out)
    assert (note["state"], note["error"]) == ("dead", "its webhook was removed")
    for bad in (["notify", "add", "mailto:a@b", "--events", "submitted"],
                ["notify", "add", "https://x.example/", "--events", "approved"],
                ["notify", "remove", "wh_nope"]):
        assert main([*bad, *desk]) == 1
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and err.startswith("awl: ")


@pytest.mark.spec("HOOK-4")
def test_notify_run_once_delivers_and_log_shows_the_attempts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], store_url: str | None) -> None:
    desk = where(tmp_path, store_url)
    with Receiver(500, 204) as receiver:
        assert main(["notify", "add", receiver.url, "--events", "submitted", *desk]) == 0
        submit(tmp_path, store_url)
        args = ["notify", "run", "--once", "--backoff", "0.01", *desk]
        assert main(args) == 0
        time.sleep(0.05)
        assert main(args) == 0
        assert len(receiver.received) == 2
    capsys.readouterr()
    assert main(["notify", "log", *desk]) == 0
    out = capsys.readouterr().out
    assert "  delivered  2 attempt(s)" in out
    assert "  HTTP 500  " in out and "HTTP 500: ok" in out
    assert "  HTTP 204  " in out and out.rstrip().endswith("delivered")


@pytest.mark.slow
@pytest.mark.spec("HOOK-3", "HOOK-4")
def test_a_deliverer_killed_mid_send_delivers_after_restart(tmp_path: Path,
                                                           store_url: str | None) -> None:
    """The event is written; `awl notify run` claims it and POSTs; it is killed with kill -9
    before any answer; a restarted deliverer sends it again when the lease runs out, with
    the same webhook-id, and it ends delivered."""
    desk = where(tmp_path, store_url)
    with Receiver(HANG, 204) as receiver:
        assert main(["notify", "add", receiver.url, "--events", "submitted", *desk]) == 0
        submit(tmp_path, store_url)
        run = ["notify", "run", "--notify-timeout", "1", "--poll", "0.05", *desk]
        with awl(*run) as first:
            receiver.wait_for(1, timeout=30)
            first.send_signal(signal.SIGKILL)
            assert first.wait(10) == -signal.SIGKILL
        [pending] = outbox(tmp_path, store_url)
        assert (pending["state"], pending["attempts"]) == ("pending", 0)
        started = time.monotonic()
        with awl(*run):
            got = receiver.wait_for(2, timeout=30)
            while outbox(tmp_path, store_url)[0]["state"] != "delivered":
                assert time.monotonic() - started < 30
                time.sleep(0.05)
    assert got[0].headers["webhook-id"] == got[1].headers["webhook-id"] == pending["id"]
    assert got[0].body == got[1].body
    assert outbox(tmp_path, store_url)[0]["attempts"] == 1


@pytest.mark.slow
@pytest.mark.spec("HOOK-4", "HOOK-5")
@pytest.mark.parametrize("command", [["serve", "--http", "127.0.0.1:0"],
                                     ["web", "--listen", "127.0.0.1:0"]])
def test_awl_serve_and_awl_web_deliver_while_they_run(tmp_path: Path, command: list[str],
                                                      store_url: str | None) -> None:
    """Each runs the deliverer beside its server; --public-url links the order's page."""
    desk = where(tmp_path, store_url)
    with Receiver() as receiver:
        assert main(["notify", "add", receiver.url, "--events", "submitted", *desk]) == 0
        with awl(*command, *desk, "--public-url", "https://desk.example"):
            order_id = submit(tmp_path, store_url)
            [request] = receiver.wait_for(1, timeout=30)
    assert request.json()["data"]["url"] == f"https://desk.example/order?id={order_id}"


def test_a_bad_public_url_is_one_line(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["notify", "run", "--once", "--public-url", "desk.example",
                 "--home", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and "awl: --public-url must start with http://" in err


PUBLIC_URL_COMMANDS = [
    ["notify", "run", "--once"],
    ["web", "--listen", "127.0.0.1:0"],
    ["serve", "--http", "127.0.0.1:0"],
    ["serve", "--as", "human:ana"],
]
"""Each command that takes --public-url (each runs a deliverer)."""

BAD_PUBLIC_URLS = [
    ("desk.example", "must start with http:// or https:// and name a host, not "
                     "'desk.example'"),
    ("ftp://desk.example", "must start with http:// or https://"),
    ("", "must start with http:// or https://"),
    ("https://desk.example/?tab=inbox", "may not have a ?query"),
    ("https://desk.example/#top", "may not have a #fragment"),
    ("https://desk.example:0/", "names port 0"),
    ("https://ana:hunter2@desk.example/#top", "may not have a #fragment: "
                                              "'https://ana:***@desk.example/#top'"),
]


@pytest.mark.spec("HOOK-5")
@pytest.mark.parametrize(("value", "says"), BAD_PUBLIC_URLS,
                         ids=[repr(v) for v, _ in BAD_PUBLIC_URLS])
@pytest.mark.parametrize("command", PUBLIC_URL_COMMANDS, ids=[c[0] + " " + c[1]
                                                              for c in PUBLIC_URL_COMMANDS])
def test_a_bad_public_url_names_its_flag_before_the_desk_is_opened(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        command: list[str], value: str, says: str) -> None:
    """A bad --public-url said "the public URL must ..." (exit 1), never naming the flag,
    after the desk was opened (and `awl web` had listened); on a desk that keeps no webhooks,
    or with --no-notify, it was never checked at all. Now it is one line naming the flag,
    what is wrong and what to write, exit 2, with nothing opened."""
    monkeypatch.delenv("AWL_PUBLIC_URL", raising=False)
    code = main([*command, "--public-url", value, "--home", str(tmp_path)])
    out, err = capsys.readouterr()
    assert (code, out) == (2, ""), err
    one_line(err, f"awl: --public-url {says}")
    assert err.rstrip().endswith("; write the approval page's address as browsers reach it, "
                                 "for example https://awl.example.com")
    assert "hunter2" not in err
    assert not (tmp_path / "desk.sqlite3").exists()


def test_a_bad_awl_public_url_names_the_variable_and_an_empty_one_is_none(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """$AWL_PUBLIC_URL, the default of --public-url, is refused naming itself (it is not on
    the command line to be found); set empty, it is no public URL, as unset (it was refused
    as "the public URL must start with http://", naming nothing)."""
    home = ["--home", str(tmp_path)]
    monkeypatch.setenv("AWL_PUBLIC_URL", "desk.example")
    assert main(["notify", "run", "--once", *home]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    one_line(err, "awl: $AWL_PUBLIC_URL (the default of --public-url) must start with "
                  "http:// or https://")
    assert not (tmp_path / "desk.sqlite3").exists()
    SQLiteStore(tmp_path / "desk.sqlite3").close()  # `notify run` delivers a desk's outbox
    # --public-url comes before the variable.
    assert main(["notify", "run", "--once", "--public-url", "https://desk.example", *home]) == 0
    monkeypatch.setenv("AWL_PUBLIC_URL", "")
    assert main(["notify", "run", "--once", *home]) == 0
    capsys.readouterr()


@pytest.mark.spec("HOOK-4")
def test_notify_run_sends_a_urls_credentials_as_basic_auth(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`awl notify add https://USER:PASSWORD@host/...` then `awl notify run`: the receiver
    got no credentials (the userinfo was dropped). Now it gets `Authorization: Basic` of
    USER:PASSWORD, percent-decoded, and nothing the commands print has the password."""
    home = ["--home", str(tmp_path)]
    with Receiver() as receiver:
        url = receiver.url.replace("http://", "http://hook-user:pa%2Fss%40word@")
        assert main(["notify", "add", url, "--events", "submitted", *home]) == 0
        submit(tmp_path)
        assert main(["notify", "run", "--once", *home]) == 0
        [request] = receiver.wait_for(1)
        assert main(["notify", "list", *home]) == 0
        assert main(["notify", "log", "--json", *home]) == 0
    headers = {k.lower(): v for k, v in request.headers.items()}
    assert headers["authorization"] == "Basic " + base64.b64encode(
        b"hook-user:pa/ss@word").decode()
    assert request.path == "/hook"
    out, err = capsys.readouterr()
    assert "hook-user:***@127.0.0.1" in out
    assert "pa%2Fss" not in out + err and "pa/ss" not in out + err


@pytest.mark.spec("BIND-14")
def test_notify_commands_use_the_store_that_awl_store_or_store_names(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With AWL_STORE naming a SQLite file elsewhere, every `awl notify` command works on that
    file and not on the home's desk; `--store` comes before AWL_STORE."""
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    monkeypatch.setenv("AWL_STORE", str(elsewhere / "desk.sqlite3"))
    assert main(["notify", "add", "http://127.0.0.1:9/h", "--events", "submitted",
                 "--json", "--home", str(home)]) == 0
    added = json.loads(capsys.readouterr().out)
    assert not (home / "desk.sqlite3").exists()
    with SQLiteStore(elsewhere / "desk.sqlite3") as store:
        assert [w.id for w in store.webhooks()] == [added["id"]]
    submit(elsewhere)  # its submitted event is in the outbox there
    assert main(["notify", "list", "--json", "--home", str(home)]) == 0
    assert [w["id"] for w in json.loads(capsys.readouterr().out)] == [added["id"]]
    assert main(["notify", "log", "--json", "--home", str(home)]) == 0
    assert [n["webhook_id"] for n in json.loads(capsys.readouterr().out)] == [added["id"]]
    assert main(["notify", "run", "--once", "--home", str(home)]) == 0
    capsys.readouterr()
    assert outbox(elsewhere)[0]["attempts"] == 1  # tried (nothing listens on port 9)
    # --store names another desk, whatever AWL_STORE says.
    other = tmp_path / "other.sqlite3"
    assert main(["notify", "list", "--json", "--store", str(other)]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["notify", "remove", added["id"], "--home", str(home)]) == 0
    capsys.readouterr()
    with SQLiteStore(elsewhere / "desk.sqlite3") as store:
        assert store.webhooks() == []


@pytest.mark.spec("BIND-14")
def test_notify_on_a_postgresql_store_opens_it(
        tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A PostgreSQL URL in AWL_STORE is opened by `awl notify`: the subscription is kept
    there, or, on a store that keeps no webhooks yet, refused in one line."""
    from awl.store.postgres import PostgresStore
    from awl.store.protocol import WebhookStore

    monkeypatch.setenv("AWL_STORE", pg_url)
    code = main(["notify", "add", "http://127.0.0.1:9/h", "--events", "submitted",
                 "--json", "--home", str(tmp_path)])
    out, err = capsys.readouterr()
    assert not (tmp_path / "desk.sqlite3").exists()
    with PostgresStore(pg_url) as store:
        if isinstance(store, WebhookStore):
            assert code == 0, err
            assert [w.id for w in store.webhooks()] == [json.loads(out)["id"]]
        else:
            assert code == 1 and out == ""
            assert err.count("\n") == 1 and "keeps no webhooks" in err


def run_awl(*args: str) -> subprocess.CompletedProcess[str]:
    """``awl ARGS...`` as a process, to its end."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("AWL_PUBLIC_URL", None)
    return subprocess.run([sys.executable, "-m", "awl", *args], env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
                          check=False)


def one_line(err: str, start: str) -> None:
    assert err.startswith(start), err
    assert err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.slow
@pytest.mark.spec("HOOK-1")
def test_a_webhook_urls_password_is_shown_hidden_everywhere(tmp_path: Path) -> None:
    """`awl notify list` printed a URL's password (https://user:secret@host/...) as given.
    Now `add`, `list` (text and --json), a refused URL, `run` and `log` show it as ***, as a
    store URL is shown; the desk keeps the URL whole, to POST to."""
    url, shown = "http://ana:s3cret@127.0.0.1:9/h", "http://ana:***@127.0.0.1:9/h"
    home = ["--home", str(tmp_path)]
    added = run_awl("notify", "add", url, "--events", "submitted", *home)
    assert added.returncode == 0, added.stderr
    assert added.stdout.splitlines()[0].split("  ")[1] == shown
    as_json = run_awl("notify", "add", url, "--events", "failed", "--json", *home)
    assert json.loads(as_json.stdout)["url"] == shown
    listed = run_awl("notify", "list", *home)
    assert [line.split("  ")[2] for line in listed.stdout.splitlines()] == [shown, shown]
    listed_json = run_awl("notify", "list", "--json", *home)
    assert [w["url"] for w in json.loads(listed_json.stdout)] == [shown, shown]
    refused = [run_awl("notify", "add", bad, "--events", "submitted", *home)
               for bad in (f"{url}#top", url.replace(":9/", ":0/"), url.replace(":9/", ":x/"))]
    for done in refused:
        assert done.returncode == 1
        one_line(done.stderr, "awl: BAD_REQUEST: a webhook URL ")
        assert "'http://ana:***@127.0.0.1:" in done.stderr
    submit(tmp_path)
    ran = run_awl("notify", "run", "--once", "--backoff", "0.01", *home)
    logged = [run_awl("notify", "log", *home), run_awl("notify", "log", "--json", *home)]
    assert "ConnectionRefusedError" in logged[0].stdout  # the attempts were made and logged
    for done in [added, as_json, listed, listed_json, *refused, ran, *logged]:
        assert "s3cret" not in done.stdout + done.stderr, done.args
    with SQLiteStore(tmp_path / "desk.sqlite3") as store:
        assert [w.url for w in store.webhooks()] == [url, url]


DELIVERER_WAITS = [
    (["notify", "run", "--once"], "--notify-timeout"),
    (["notify", "run", "--once"], "--retry-for"),
    (["notify", "run", "--once"], "--backoff"),
    (["notify", "run", "--once"], "--poll"),
    (["web", "--listen", "127.0.0.1:0"], "--notify-timeout"),
    (["serve", "--http", "127.0.0.1:0"], "--notify-timeout"),
    (["serve", "--as", "human:ana"], "--notify-timeout"),
]
"""Each command that runs a deliverer, with each of its waits in seconds."""

NO_WAITS = ["0", "-1", "nan", "inf", "-inf", "1e308"]


@pytest.mark.parametrize("value", NO_WAITS)
@pytest.mark.parametrize(("command", "flag"), DELIVERER_WAITS,
                         ids=[" ".join([*c[:2], f]) for c, f in DELIVERER_WAITS])
def test_a_deliverer_wait_that_is_no_wait_names_its_flag(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], flag: str,
        value: str) -> None:
    """`awl notify run --retry-for 0` said "retry_for must be a number of seconds ...", and
    `awl web` / `awl serve` with `--notify-timeout 0` said "timeout ...", after opening the
    desk and listening: the deliverer's own parameter names. Now each refuses in one line
    naming the flag, before the desk is opened."""
    code = main([*command, f"{flag}={value}", "--home", str(tmp_path)])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    one_line(err, f"awl: {flag} takes a number of seconds above 0 and at most ")
    assert not (tmp_path / "desk.sqlite3").exists()


@pytest.mark.slow
@pytest.mark.parametrize(("command", "flag"), DELIVERER_WAITS,
                         ids=[" ".join([*c[:2], f]) for c, f in DELIVERER_WAITS])
def test_a_deliverer_wait_that_is_no_wait_is_one_line_from_the_command(
        tmp_path: Path, command: list[str], flag: str) -> None:
    """The same as a process: one line naming the flag, exit 2; a value that is no number is
    argparse's refusal, naming the flag too; never a traceback."""
    value = NO_WAITS[DELIVERER_WAITS.index((command, flag)) % len(NO_WAITS)]
    done = run_awl(*command, f"{flag}={value}", "--home", str(tmp_path))
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    one_line(done.stderr, f"awl: {flag} takes a number of seconds above 0 and at most ")
    assert done.stderr.rstrip().endswith(f"(a year), not {float(value):g}")
    garbage = run_awl(*command, flag, "soon", "--home", str(tmp_path))
    assert garbage.returncode == 2 and "Traceback" not in garbage.stderr
    assert garbage.stderr.splitlines()[-1].endswith(
        f"error: argument {flag}: invalid float value: 'soon'")
    assert not (tmp_path / "desk.sqlite3").exists()
