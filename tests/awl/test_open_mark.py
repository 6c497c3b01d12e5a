"""A desk is migrated only while no process of an older awl has it open (BIND-22).

"A newer awl" is this code with one more migration (a table that can be made only once, so a
second run of it would fail): the module's migrations and schema version are patched for
the opens the test says are newer. "An older process" is a real one, holding a store of
today's code open, killed with ``kill -9`` where the test says so.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

import awl.store.postgres as pg_module
import awl.store.sqlite as sqlite_module
from awl.cli import main
from awl.documents.errors import StoreUnavailable
from awl.store.postgres import PostgresStore
from awl.store.sqlite import SQLiteStore
from tests.awl.desk_support import open_at_once
from tests.awl.test_store import create

ROOT = Path(__file__).resolve().parents[2]

_HOLD = """
import subprocess, sys
from awl.store.urls import open_store
store = open_store(sys.argv[1])
if len(sys.argv) > 2:  # an upstream it started, leaving open what may be left, outliving it
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             close_fds=False)
    print(child.pid, flush=True)
print("open", flush=True)
sys.stdin.read()
store.close()
"""


@contextmanager
def _held_open(url: str, *, child: bool = False) -> Iterator[subprocess.Popen[str]]:
    """A process of today's awl with the desk at ``url`` open, until the block ends."""
    with subprocess.Popen([sys.executable, "-c", _HOLD, url, *(["child"] if child else [])],
                          cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)},
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline().strip()
            proc.child = int(first) if child else None  # type: ignore[attr-defined]
            if child:
                first = proc.stdout.readline().strip()
            assert first == "open", first
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()


def _newer(monkeypatch: pytest.MonkeyPatch, module: object) -> int:
    """Make ``module``'s opens from now on those of an awl with one more migration."""
    migrations = module.MIGRATIONS  # type: ignore[attr-defined]
    monkeypatch.setattr(module, "MIGRATIONS", (*migrations, ("CREATE TABLE probe (x INTEGER)",)))
    monkeypatch.setattr(module, "SCHEMA_VERSION", len(migrations) + 1)
    return len(migrations) + 1


# SQLite ------------------------------------------------------------------------------------


def _sqlite_state(path: Path) -> tuple[int, bool]:
    """The desk's schema version and whether the newer migration's table exists."""
    conn = sqlite3.connect(path)
    try:
        version = conn.execute("SELECT MAX(version) FROM awl_schema").fetchone()[0]
        probe = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'probe'").fetchone()
        return int(version), probe is not None
    finally:
        conn.close()


@pytest.mark.spec("BIND-22")
def test_a_sqlite_desk_open_in_an_older_process_is_not_migrated_until_it_dies(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "desk.sqlite3"
    with SQLiteStore(path) as store:
        create(store, "o-1")
    today = sqlite_module.SCHEMA_VERSION
    with _held_open(str(path)) as older:
        with SQLiteStore(path) as same:  # the same version opens it beside the other
            assert same.load("o-1").order.id == "o-1"
        newer = _newer(monkeypatch, sqlite_module)
        before = path.read_bytes()
        with pytest.raises(StoreUnavailable) as refused:
            SQLiteStore(path)
        message = refused.value.message
        assert "\n" not in message
        assert (f"the desk {path} is at schema version {today} and open in another process "
                "of an older awl") in message
        assert "stop every process using it" in message
        assert _sqlite_state(path) == (today, False)
        assert path.read_bytes() == before
        older.send_signal(signal.SIGKILL)  # dies without closing anything
        older.wait(30)
        with SQLiteStore(path) as store:
            assert store.load("o-1").order.id == "o-1"
        assert _sqlite_state(path) == (newer, True)


@pytest.mark.spec("BIND-22")
def test_a_closed_store_no_longer_keeps_its_desk_from_being_migrated(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "desk.sqlite3"
    older = SQLiteStore(path)
    today = sqlite_module.SCHEMA_VERSION
    newer = _newer(monkeypatch, sqlite_module)
    with pytest.raises(StoreUnavailable, match="open in another process of an older awl"):
        SQLiteStore(path)
    capsys.readouterr()
    assert main(["order", "list", "--store", str(path)]) == 1  # the command says it in a line
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stop every process using it" in err
    assert _sqlite_state(path) == (today, False)
    older.close()
    SQLiteStore(path).close()
    assert _sqlite_state(path) == (newer, True)


@pytest.mark.spec("BIND-22")
def test_an_upstream_a_process_started_does_not_keep_the_desk_marked_after_it_dies(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A gateway starts its upstream servers; killed, it leaves them running. They must not
    hold its mark (it is not inherited)."""
    path = tmp_path / "desk.sqlite3"
    SQLiteStore(path).close()
    with _held_open(str(path), child=True) as older:
        child = older.child  # type: ignore[attr-defined]
        try:
            older.send_signal(signal.SIGKILL)
            older.wait(30)
            os.kill(child, 0)  # still running
            newer = _newer(monkeypatch, sqlite_module)
            SQLiteStore(path).close()
            assert _sqlite_state(path) == (newer, True)
        finally:
            os.kill(child, signal.SIGKILL)


@pytest.mark.spec("BIND-22")
def test_processes_opening_an_older_sqlite_desk_at_once_migrate_it_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "desk.sqlite3"
    SQLiteStore(path).close()
    newer = _newer(monkeypatch, sqlite_module)
    assert open_at_once(lambda: SQLiteStore(path).close()) == []
    assert _sqlite_state(path) == (newer, True)


# PostgreSQL --------------------------------------------------------------------------------


def _pg_state(url: str) -> tuple[int, bool]:
    with psycopg.connect(url, autocommit=True) as conn:
        version = conn.execute("SELECT MAX(version) FROM awl_schema").fetchone()
        probe = conn.execute("SELECT to_regclass('probe')").fetchone()
    assert version is not None and probe is not None
    return int(version[0]), probe[0] is not None


def _sessions_gone(url: str, pid: int) -> None:
    """Wait until the server has ended the sessions of the killed process ``pid`` (it does
    when it reads the closed socket: milliseconds over loopback)."""
    deadline = time.monotonic() + 30
    with psycopg.connect(url, autocommit=True) as conn:
        while conn.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE application_name"
                           " LIKE %s", (f"% pid {pid}",)).fetchone() != (0,):
            assert time.monotonic() < deadline, "the server kept the dead process's sessions"
            time.sleep(0.05)


@pytest.mark.spec("BIND-22")
def test_a_postgres_desk_open_in_an_older_process_is_not_migrated_and_names_it(
        fresh_pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with PostgresStore(fresh_pg_url) as store:
        create(store, "o-1")
    today = pg_module.SCHEMA_VERSION
    with _held_open(fresh_pg_url) as older:
        with PostgresStore(fresh_pg_url) as same:
            assert same.load("o-1").order.id == "o-1"
        newer = _newer(monkeypatch, pg_module)
        with pytest.raises(StoreUnavailable) as refused:
            PostgresStore(fresh_pg_url)
        message = refused.value.message
        assert "\n" not in message and "awl-test" not in message  # no password shown
        assert f"is at schema version {today} and open in another process of an older awl" \
            in message
        assert f"pid {older.pid})" in message  # the holder, by its application name
        assert "stop every process using it" in message
        assert _pg_state(fresh_pg_url) == (today, False)
        older.send_signal(signal.SIGKILL)
        older.wait(30)
        _sessions_gone(fresh_pg_url, older.pid)
        with PostgresStore(fresh_pg_url) as store:
            assert store.load("o-1").order.id == "o-1"
        assert _pg_state(fresh_pg_url) == (newer, True)


@pytest.mark.spec("BIND-22")
def test_a_postgres_process_whose_desk_was_migrated_while_it_was_cut_off_writes_nothing(
        fresh_pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its connections ended (a server restart, here its sessions terminated), a newer awl
    migrated the desk; when it connects again it finds that out and refuses everything."""
    older = PostgresStore(fresh_pg_url)
    try:
        create(older, "o-1")
        with psycopg.connect(fresh_pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                          " WHERE application_name = %s AND pid <> pg_backend_pid()",
                          (older._application,))
        newer = _newer(monkeypatch, pg_module)
        with PostgresStore(fresh_pg_url) as store:  # nothing holds the mark now
            assert store.load("o-1").order.id == "o-1"
        assert _pg_state(fresh_pg_url) == (newer, True)
        for attempt in (lambda: older.load("o-1"), lambda: create(older, "o-2")):
            with pytest.raises(StoreUnavailable) as refused:
                attempt()
            assert refused.value.message == (
                f"the desk at {older._where} was migrated past schema version {newer - 1} by a "
                "newer awl while this process had it open; nothing more is written from here: "
                "restart this process with the newer awl-gateway")
        with psycopg.connect(fresh_pg_url, autocommit=True) as conn:
            assert conn.execute("SELECT id FROM orders").fetchall() == [("o-1",)]
    finally:
        older.close()


@pytest.mark.spec("BIND-22")
def test_processes_opening_an_older_postgres_desk_at_once_migrate_it_once(
        fresh_pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    PostgresStore(fresh_pg_url).close()
    newer = _newer(monkeypatch, pg_module)
    assert open_at_once(lambda: PostgresStore(fresh_pg_url).close()) == []
    assert _pg_state(fresh_pg_url) == (newer, True)
