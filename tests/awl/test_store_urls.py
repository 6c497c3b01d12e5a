"""Choosing the store by URL: :func:`awl.open_store`, ``--store`` and ``AWL_STORE``."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import stdio_client

import awl
from awl.cli import main
from awl.documents.errors import BadRequest, StoreUnavailable
from awl.store.memory import MemoryStore
from awl.store.sqlite import SQLiteStore
from awl.store.urls import open_store, shown_url
from tests.awl.desk_support import MANAGER, newer_desk, order_fields
from tests.awl.server_support import Desk as McpDesk
from tests.awl.server_support import serve_params

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_store_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AWL_STORE", raising=False)
    monkeypatch.delenv("AWL_ACTOR", raising=False)
    monkeypatch.setenv("AWL_HOME", str(tmp_path / "home"))


# -- open_store ------------------------------------------------------------------------------

@pytest.mark.spec("BIND-14")
def test_open_store_knows_each_kind_of_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           ) -> None:
    """A path, sqlite:PATH, sqlite:///PATH and memory: each open the store they name."""
    monkeypatch.chdir(tmp_path)
    assert awl.open_store is open_store
    assert isinstance(open_store("memory:"), MemoryStore)
    opened = [open_store(str(tmp_path / "a.sqlite3")), open_store(tmp_path / "b.sqlite3"),
              open_store("sqlite:c.sqlite3"), open_store(f"sqlite://{tmp_path}/d%20e.sqlite3"),
              open_store(f"SQLITE://localhost{tmp_path}/f.sqlite3")]
    for store in opened:
        assert isinstance(store, SQLiteStore)
        store.close()
    assert [s.path for s in opened if isinstance(s, SQLiteStore)] == [
        tmp_path / "a.sqlite3", tmp_path / "b.sqlite3", Path("c.sqlite3"),
        tmp_path / "d e.sqlite3", tmp_path / "f.sqlite3"]
    assert sorted(p.name for p in tmp_path.glob("*.sqlite3")) == [
        "a.sqlite3", "b.sqlite3", "c.sqlite3", "d e.sqlite3", "f.sqlite3"]


@pytest.mark.spec("BIND-16")
@pytest.mark.parametrize(("url", "said"), [
    ("", "empty"),
    ("mysql://u@h/db", "unknown store URL scheme 'mysql:'"),
    ("sqlite://server/desk.sqlite3", "names host 'server'"),
    ("sqlite:", "names no file"),
    ("sqlite:///", "names no file"),
    ("sqlite:desk.sqlite3?mode=ro", "no query"),
    ("memory:x", "takes nothing after the colon"),
    ("postgresql://ana:s3cret@db.example:99999/awl", "is malformed"),
])
def test_a_bad_store_url_is_one_line_and_creates_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, said: str) -> None:
    """Each malformed URL or unknown scheme is refused in words, its password hidden."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BadRequest) as caught:
        open_store(url)
    assert said in caught.value.message
    assert "s3cret" not in caught.value.message
    assert list(tmp_path.iterdir()) == []


def test_a_postgresql_url_without_the_postgresql_store_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An installation without awl.store.postgres says it has no PostgreSQL store."""
    monkeypatch.setitem(sys.modules, "awl.store.postgres", None)
    with pytest.raises(BadRequest, match="no PostgreSQL store"):
        open_store("postgresql://ana@localhost/awl")


def test_shown_urls_hide_the_password() -> None:
    """Messages show a URL with its password replaced."""
    assert shown_url("postgresql://ana:s3cret@db:5432/awl") == "postgresql://ana:***@db:5432/awl"
    assert shown_url("postgresql://ana@db/awl") == "postgresql://ana@db/awl"
    assert shown_url("/srv/desk.sqlite3") == "/srv/desk.sqlite3"
    assert shown_url("http://ana:s3 cret@db/h") == "http://ana:***@db/h"
    # An @ after the host is in the path: no userinfo.
    assert shown_url("https://db:8080/@ana") == "https://db:8080/@ana"
    assert shown_url("https://chat.example/@ana:s3") == "https://chat.example/@ana:s3"
    assert shown_url("http://[::1]/@ana:s3") == "http://[::1]/@ana:s3"


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://ana:s3cret@[db/awl", "postgresql://ana:***@[db/awl"),
    ("http://ana:s3cret@[::1/h", "http://ana:***@[::1/h"),
    ("http://ana:s3/cret@db/h", "http://ana:***@db/h"),
    ("http://ana:s3?cret@db:5432/h", "http://ana:***@db:5432/h"),
    ("http://ana:s3#cret@db/h#top", "http://ana:***@db/h#top"),
])
def test_shown_urls_hide_a_password_the_url_parser_cannot_read(url: str, shown: str) -> None:
    """shown_url read the password with urlsplit, so a URL it could not parse (an unclosed
    [) came back whole, and a password with an unescaped / ? or # (its host then ends early
    and its start reads as the port) was no password to it: the very messages refusing such
    a URL quoted it. Now it reads the text."""
    assert shown_url(url) == shown


def test_a_store_url_refused_for_its_port_never_quotes_the_password() -> None:
    """A password holding an unescaped / made urlsplit read its start as the port, and the
    refusal quoted "could not be cast to integer value as 'hun'" with the URL."""
    with pytest.raises(BadRequest) as caught:
        open_store("postgresql://ana:hun/ter2@db.example/awl")
    message = caught.value.message
    assert "its port is not a number" in message and "ana:***@db.example" in message
    assert "hun" not in message and "ter2" not in message


# -- SQLite that cannot be used -------------------------------------------------------------

def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.spec("BIND-16")
def test_a_desk_from_a_newer_version_is_refused_by_the_cli_unchanged(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A desk file of a newer schema: one line saying to upgrade, and the file unchanged."""
    path = tmp_path / "desk.sqlite3"
    newer_desk(path)
    before = _digest(path)
    code = main(["order", "list", "--store", f"sqlite:///{path}"])
    _, err = capsys.readouterr()
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("awl: STORE_UNAVAILABLE: ") and "newer" in err and "upgrade" in err
    assert _digest(path) == before


@pytest.mark.spec("BIND-16")
@pytest.mark.parametrize("kind", ["missing folder", "not a desk", "a folder"])
def test_a_sqlite_file_that_cannot_be_a_desk_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    """A missing folder, a file that is not a database, a folder: one line, nothing made."""
    if kind == "missing folder":
        target = tmp_path / "nowhere" / "desk.sqlite3"
    elif kind == "not a desk":
        target = tmp_path / "notes.txt"
        target.write_text("shopping list\n" * 100)
    else:
        target = tmp_path / "folder"
        target.mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    code = main(["order", "list", "--store", str(target)])
    _, err = capsys.readouterr()
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith("awl: STORE_UNAVAILABLE: cannot open the desk ")
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    if kind == "not a desk":
        assert target.read_text() == "shopping list\n" * 100
    with pytest.raises(StoreUnavailable):
        open_store(target)


# -- the commands ---------------------------------------------------------------------------

def _create(capsys: pytest.CaptureFixture[str], folder: Path, *store: str) -> str:
    path = folder / "o.json"
    path.write_text(json.dumps(order_fields()), encoding="utf-8")
    code = main(["order", "create", str(path), "--as", MANAGER, "--json", *store])
    out, err = capsys.readouterr()
    assert code == 0, err
    order_id: str = json.loads(out)["order"]["id"]
    return order_id


def _ids(path: Path) -> list[str]:
    with SQLiteStore(path) as store:
        return [r.order.id for r in store.list_orders()]


@pytest.mark.spec("BIND-14")
def test_store_and_awl_store_choose_the_desk_and_home_stays_the_default(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """--store beats AWL_STORE, which beats the home's desk.sqlite3 (still the default)."""
    flag, env = tmp_path / "flag.sqlite3", tmp_path / "env.sqlite3"
    home = tmp_path / "home" / "desk.sqlite3"
    by_default = _create(capsys, tmp_path)
    assert _ids(home) == [by_default]
    by_flag = _create(capsys, tmp_path, "--store", f"sqlite:///{flag}")
    monkeypatch.setenv("AWL_STORE", f"sqlite:{env}")
    by_env = _create(capsys, tmp_path)
    both = _create(capsys, tmp_path, "--store", str(flag))
    assert (_ids(home), _ids(flag), _ids(env)) == ([by_default], [both, by_flag], [by_env])
    # Reads follow the same choice.
    assert main(["order", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [o["order"]["id"] for o in listed] == [by_env]
    monkeypatch.setenv("AWL_STORE", "mysql://x/y")
    assert main(["order", "list"]) == 1
    assert "unknown store URL scheme" in capsys.readouterr().err


@pytest.mark.spec("BIND-14")
def test_every_command_that_opens_a_desk_takes_store(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Work, review, effects, passes and tokens all read and write the store --store names."""
    url = f"sqlite:///{tmp_path / 'elsewhere.sqlite3'}"
    order_id = _create(capsys, tmp_path, "--store", url)
    for argv in (["work", "accept", order_id, "--as", "agent:writer"],
                 ["order", "show", order_id],
                 ["effects", "list", order_id],
                 ["pass", "issue", "--order", order_id, "--to", "agent:writer"],
                 ["token", "issue", "human:bo"], ["token", "list"]):
        code = main([*argv, "--store", url])
        _, err = capsys.readouterr()
        assert code == 0, (argv, err)
        if argv[0] != "token":
            assert main([*argv]) != 0, argv  # the home's desk has no such order
            capsys.readouterr()
    with SQLiteStore(tmp_path / "elsewhere.sqlite3") as store:
        assert store.load(order_id).state == "accepted"
        assert len(store.passes(order_id)) == 1
        assert [t.principal for t in store.tokens()] == ["human:bo"]
    with SQLiteStore(tmp_path / "home" / "desk.sqlite3") as store:
        assert store.list_orders() == [] and store.tokens() == []


@pytest.mark.spec("BIND-14")
def test_the_library_s_desk_opens_the_store_awl_store_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Desk()`` with no store opens what AWL_STORE names, as the commands do."""
    monkeypatch.setenv("AWL_STORE", f"sqlite:///{tmp_path / 'lib.sqlite3'}")
    desk = awl.Desk()
    order_id = desk.create(order_fields(), MANAGER).id
    desk.store.close()
    assert _ids(tmp_path / "lib.sqlite3") == [order_id]
    assert not (tmp_path / "home").exists()


def test_awl_store_in_a_process_names_the_desk(tmp_path: Path) -> None:
    """The real command in its own process, with AWL_STORE in its environment."""
    target = tmp_path / "env.sqlite3"
    spec = tmp_path / "o.json"
    spec.write_text(json.dumps(order_fields()), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AWL_STORE": f"sqlite:///{target}",
           "AWL_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "awl", "order", "create", str(spec), "--as",
                           MANAGER, "--json"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert _ids(target) == [json.loads(done.stdout)["order"]["id"]]
    assert not (tmp_path / "home" / "desk.sqlite3").exists()


@pytest.mark.spec("BIND-14")
@pytest.mark.anyio
async def test_awl_serve_serves_the_store_it_is_given(tmp_path: Path) -> None:
    """``awl serve --store URL`` serves that desk (the home keeps only the keys)."""
    path = tmp_path / "elsewhere.sqlite3"
    with SQLiteStore(path) as store:
        order_id = awl.Desk(store).create(order_fields(), MANAGER).id
    home = tmp_path / "home"
    home.mkdir()
    with anyio.fail_after(60), open(tmp_path / "serve.err", "a") as errlog:
        params = serve_params(home, "--as", MANAGER, "--store", f"sqlite:///{path}")
        async with Client(stdio_client(params, errlog=errlog)) as client:
            desk = McpDesk(client)
            listed = await desk.call("list_work_orders")
    assert [o["id"] for o in listed["orders"]] == [order_id]
    assert not (home / "desk.sqlite3").exists()
