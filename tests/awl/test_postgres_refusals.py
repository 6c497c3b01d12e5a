"""Each way a PostgreSQL server refuses a desk gives its own one line of advice (BIND-16):
wrong credentials, nothing listening, a server full, a read-only server. The ``awl`` command
runs as its own process against the real server of ``scripts/postgres.sh``; its stderr is one
line, never a traceback, unless ``AWL_DEBUG=1`` asks for one. Refusals are made for real: a
role of the test's own with ``CONNECTION LIMIT 1`` and a connection held, or with
``default_transaction_read_only`` on.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from awl.documents.errors import StoreUnavailable
from awl.store.postgres import PostgresStore
from tests.postgres_support import server_url

ROOT = Path(__file__).resolve().parents[2]
SECRET = "role-secret-8c1f"
"""The password of the test's roles: never on the screen."""

pytestmark = [pytest.mark.spec("BIND-16"), pytest.mark.slow]  # the awl command as a process


def _awl(tmp_path: Path, store: str, *args: str, debug: bool = False,
         **settings: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("AWL_DEBUG", "AWL_STORE", "PGPASSWORD", "AWL_STORE_TIMEOUT")}
    env.update(PYTHONPATH=str(ROOT), AWL_HOME=str(tmp_path / "home"), AWL_STORE=store,
               **settings)
    if debug:
        env["AWL_DEBUG"] = "1"
    return subprocess.run([sys.executable, "-m", "awl", *args], cwd=str(ROOT), env=env,
                          capture_output=True, text=True, timeout=120)


def _as(url: str, user: str, password: str = SECRET, port: int | None = None) -> str:
    parts = urlsplit(url)
    return parts._replace(
        netloc=f"{user}:{password}@{parts.hostname}:{port or parts.port}").geturl()


def _check(tmp_path: Path, store: str, said: str, *args: str) -> str:
    """Run ``awl ARGS`` against ``store``: one line on stderr holding ``said`` and no
    traceback; with AWL_DEBUG=1 the same line after a traceback. The line."""
    args = args or ("order", "list")
    done = _awl(tmp_path, store, *args)
    err = done.stderr
    assert done.returncode == 1, (done.returncode, err)
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert said in err and "Traceback" not in err, err
    assert SECRET not in err and "awl-test" not in err, err
    debugged = _awl(tmp_path, store, *args, debug=True)
    assert debugged.returncode == 1
    assert "Traceback (most recent call last)" in debugged.stderr, debugged.stderr
    assert debugged.stderr.splitlines()[-1] == err.strip(), debugged.stderr
    assert SECRET not in debugged.stderr
    return err.strip()


@pytest.fixture
def role(pg_url: str) -> Iterator[str]:
    """A login role of the test's own (password :data:`SECRET`) that may use the desk in
    ``pg_url``'s schema; dropped after."""
    name = f"awl_t_{uuid.uuid4().hex[:10]}"
    schema = urlsplit(pg_url).query.rpartition("%3D")[2]
    PostgresStore(pg_url).close()  # the desk's tables, made by the owner
    with psycopg.connect(server_url(), autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {name} LOGIN PASSWORD '{SECRET}'")
    with psycopg.connect(pg_url, autocommit=True) as owner:
        owner.execute(f"GRANT USAGE ON SCHEMA {schema} TO {name}")
        owner.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA {schema} TO {name}")
        owner.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA {schema} TO {name}")
    try:
        yield name
    finally:
        with psycopg.connect(pg_url, autocommit=True) as owner:
            owner.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                          " WHERE usename = %s", (name,))
            owner.execute(f"DROP OWNED BY {name}")
        with psycopg.connect(server_url(), autocommit=True) as admin:
            admin.execute(f"DROP ROLE {name}")


def test_wrong_password_says_to_check_the_credentials(tmp_path: Path, pg_url: str,
                                                      role: str) -> None:
    line = _check(tmp_path, _as(pg_url, role, password="not-" + SECRET),
                  "refused the credentials in the store URL")
    assert "check its user name and password" in line and "not-role" not in line


def test_nothing_listening_says_to_start_the_server_at_its_address(
        tmp_path: Path, pg_url: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    line = _check(tmp_path, _as(pg_url, "awl", port=port), "cannot reach PostgreSQL at")
    assert f"is the server running at 127.0.0.1:{port}?" in line, line


def test_a_server_that_never_answers_is_given_up_within_the_store_timeout(
        tmp_path: Path, pg_url: str) -> None:
    """Something listens at the address but never answers (a server hung, or a port some
    other program holds): refused within AWL_STORE_TIMEOUT, as a server out of reach."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)  # connections are taken by the kernel, never answered
        port = int(sock.getsockname()[1])
        began = time.monotonic()
        done = _awl(tmp_path, _as(pg_url, "awl", port=port), "order", "list",
                    AWL_STORE_TIMEOUT="2")
        took = time.monotonic() - began
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert f"is the server running at 127.0.0.1:{port}?" in done.stderr, done.stderr
    assert "timeout expired" in done.stderr and took < 8, (took, done.stderr)


def test_a_full_server_says_to_raise_its_connections_not_to_start_it(
        tmp_path: Path, pg_url: str, role: str) -> None:
    with psycopg.connect(server_url(), autocommit=True) as admin:
        admin.execute(f"ALTER ROLE {role} CONNECTION LIMIT 1")
    with psycopg.connect(_as(pg_url, role)):  # the role's one connection, held
        line = _check(tmp_path, _as(pg_url, role), "is full: it refused a new connection")
    assert "max_connections" in line and "AWL_PG_POOL_SIZE" in line, line
    assert "start" not in line.lower().split("(")[0] and "running at" not in line, line


def test_a_read_only_server_says_to_point_at_the_primary(tmp_path: Path, pg_url: str,
                                                         role: str) -> None:
    with psycopg.connect(server_url(), autocommit=True) as admin:
        admin.execute(f"ALTER ROLE {role} SET default_transaction_read_only = on")
    store = _as(pg_url, role)
    listed = _awl(tmp_path, store, "order", "list")  # reading works
    assert listed.returncode == 0, listed.stderr
    line = _check(tmp_path, store, "is read-only", "token", "issue", "ana")
    assert "point the store URL at the primary" in line and "nothing was written" in line
    with psycopg.connect(pg_url) as owner:
        assert owner.execute("SELECT COUNT(*) FROM tokens").fetchone() == (0,)


def test_a_user_without_rights_on_the_desk_says_to_grant_them(tmp_path: Path, pg_url: str,
                                                              role: str) -> None:
    schema = urlsplit(pg_url).query.rpartition("%3D")[2]
    with psycopg.connect(pg_url, autocommit=True) as owner:
        owner.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA {schema} FROM {role}")
    line = _check(tmp_path, _as(pg_url, role), "refused the store URL's user")
    assert "permission denied" in line and "grant it the rights" in line, line


def test_a_server_that_fills_up_under_a_running_store_is_named_full_within_its_bound(
        pg_url: str, role: str) -> None:
    """A store already open (a gateway, say) whose server then refuses every new connection
    (53300): the next operation is refused within the store's timeout of its start, saying
    the server is full, not that it is out of reach."""
    store = PostgresStore(_as(pg_url, role), timeout=2)
    try:
        store.list_orders()
        with psycopg.connect(server_url(), autocommit=True) as admin:
            admin.execute(f"ALTER ROLE {role} CONNECTION LIMIT 1")
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                          " WHERE usename = %s", (role,))
            with psycopg.connect(_as(pg_url, role)):  # the one connection left, taken
                began = time.monotonic()
                with pytest.raises(StoreUnavailable) as refused:
                    store.list_orders()
                took = time.monotonic() - began
    finally:
        store.close()
    said = str(refused.value)
    assert "is full: it refused a new connection within 2 s" in said, said
    assert "too many connections for role" in said and "running at" not in said, said
    assert 1.5 < took < 4, f"refused after {took:.1f} s"


@pytest.mark.parametrize(("said", "advice"), [
    ("FATAL:  the database system is starting up", "is restarting or shutting down"),
    ("FATAL:  the database system is shutting down", "retry once it is up"),
    ("FATAL:  terminating connection due to administrator command", "retry once it is up"),
    ("FATAL:  sorry, too many clients already", "raise the server's max_connections"),
    ("FATAL:  remaining connection slots are reserved for roles with the SUPERUSER "
     "attribute", "is full"),
    ('FATAL:  no pg_hba.conf entry for host "10.0.0.7", user "ana", database "awl", no '
     "encryption", "check its user name and password"),
    ('FATAL:  role "ana" does not exist', "refused the credentials"),
    ('FATAL:  database "awl" does not exist', "create it (createdb)"),
    ("could not translate host name \"db\" to address: Name or service not known",
     "is the server running at db:5432?"),
])
def test_each_refusal_libpq_words_gets_the_advice_of_its_cause(said: str, advice: str) -> None:
    """What libpq and the server say while connecting (psycopg gives no SQLSTATE then), as
    the store reads it: the advice of its cause, on one line, the password never in it."""
    from awl.store.postgres import _unavailable

    url = f"postgresql://ana:{SECRET}@db/awl"
    text = f'connection failed: connection to server at "10.0.0.7", port 5432 failed: {said}'
    line = str(_unavailable(url, psycopg.OperationalError(f"{text} {SECRET}\nHINT:  x")))
    assert advice in line and "\n" not in line and SECRET not in line, line
