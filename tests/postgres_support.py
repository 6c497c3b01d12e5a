"""The PostgreSQL server the tests use (started by ``scripts/postgres.sh``), for tests.

``AWL_TEST_POSTGRES`` holds the server's URL (``.ci/run`` exports it). :func:`pg_url`, a
fixture, gives each test a fresh, empty schema of its own in database ``awl_tests`` (a
``CREATE SCHEMA`` takes milliseconds, a database far longer) as a store URL whose
``search_path`` names it; a used schema is emptied and handed to the next test. Without a
server the test is skipped on a developer's machine and fails under ``CI=true``: a missing
server never hides a test in CI.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import pytest

from tests.service_support import unavailable

ENV = "AWL_TEST_POSTGRES"
DATABASE = "awl_tests"


def missing(why: str) -> NoReturn:
    """Skip the test, or fail it under CI, because the server cannot be used."""
    unavailable(f"no PostgreSQL server for the tests ({why}): run "
                f"`export {ENV}=$(bash scripts/postgres.sh)`")


def server_url() -> str:
    """The server's URL (its ``postgres`` database); skips or fails without one."""
    url = os.environ.get(ENV)
    if not url:
        missing(f"{ENV} is not set")
    assert url is not None
    return url


def in_database(url: str, database: str, schema: str | None = None) -> str:
    """``url`` pointed at ``database`` (and, if given, at ``schema`` first on its path)."""
    parts = urlsplit(url)
    query = parts.query
    if schema is not None:
        query = "&".join(q for q in (query, f"options=-csearch_path%3D{schema}") if q)
    return parts._replace(path=f"/{database}", query=query).geturl()


_ready: set[str] = set()
_clean: list[str] = []
"""Schemas a test used and left emptied, migrated, for the next test (a new schema's
migration takes a few hundred ms, emptying one a few)."""


def _admin(url: str) -> Any:
    try:
        import psycopg
    except ImportError:
        missing("psycopg is not installed: pip install -e '.[postgres]'")
        raise
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        missing(str(exc).strip().splitlines()[-1])
        raise


def _drop_clean(tests: str) -> None:
    """Drop the schemas kept for reuse, at the end of the session (so none pile up)."""
    if _clean:
        with contextlib.suppress(Exception), _admin(tests) as conn:
            conn.execute(f"DROP SCHEMA {', '.join(_clean)} CASCADE")
        _clean.clear()


def _tests_database() -> str:
    """The URL of database ``awl_tests``, created on first use."""
    url = server_url()
    if url not in _ready:
        atexit.register(_drop_clean, in_database(url, DATABASE))
        with _admin(url) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                 (DATABASE,)).fetchone()
            if found is None:
                import psycopg

                # Another pytest process (an xdist worker) may create it at the same moment:
                # it then exists, which is all this needs.
                with contextlib.suppress(psycopg.errors.DuplicateDatabase,
                                         psycopg.errors.UniqueViolation):
                    conn.execute(f"CREATE DATABASE {DATABASE}")
        _ready.add(url)
    return in_database(url, DATABASE)


def _new_schema(tests: str) -> str:
    schema = f"t_{uuid.uuid4().hex[:16]}"
    with _admin(tests) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return schema


def _empty(tests: str, schema: str) -> bool:
    """Delete every row of a used schema, so the next test finds it as a new desk would;
    False (and the schema dropped) when it is not simply a migrated desk."""
    from awl.store.postgres import SCHEMA_VERSION

    with _admin(tests) as conn:
        tables = [row[0] for row in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)).fetchall()]
        version = None
        if "awl_schema" in tables:
            version = conn.execute(
                f"SELECT MAX(version) FROM {schema}.awl_schema").fetchone()[0]
        if version != SCHEMA_VERSION:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
            return False
        with conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")  # no FK order
            for table in tables:
                if table != "awl_schema":
                    conn.execute(f"DELETE FROM {schema}.{table}")
    return True


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A store URL naming an empty schema of its own (maybe migrated by an earlier test)."""
    tests = _tests_database()
    schema = _clean.pop() if _clean else _new_schema(tests)
    try:
        yield in_database(server_url(), DATABASE, schema)
    finally:
        if _empty(tests, schema):
            _clean.append(schema)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest) -> str | None:
    """Each backend a desk can live in, for tests that must hold on both: None for the home's
    SQLite file, else the URL of an empty PostgreSQL schema (see :func:`pg_url`)."""
    if request.param == "sqlite":
        return None
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
def desk_url(store_url: str | None, tmp_path: Path) -> str:
    """Like :func:`store_url`, but always a URL to pass on (``--store``, ``open_store``):
    a SQLite file of the test's own for the SQLite backend."""
    return store_url if store_url is not None else str(tmp_path / "desk.sqlite3")


@pytest.fixture
def fresh_pg_url() -> Iterator[str]:
    """A store URL naming a brand-new schema with no tables, dropped after the test."""
    tests = _tests_database()
    schema = _new_schema(tests)
    try:
        yield in_database(server_url(), DATABASE, schema)
    finally:
        with _admin(tests) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def in_one_group(url: str, first: threading.Thread, rest: list[threading.Thread], *,
                 then: Callable[[], None] | None = None) -> None:
    """Start ``first`` (a reservation of order ``o1``) while a connection of its own holds
    the order's row, so it waits for the row alone, in its one statement; call ``then``;
    start ``rest``, which wait for it and are written as one group; let the row go and wait
    for them all."""
    import psycopg

    with psycopg.connect(url) as holder:
        holder.execute("SELECT 1 FROM orders WHERE id = 'o1' FOR UPDATE")
        first.start()
        time.sleep(0.3)
        if then is not None:
            then()
        for t in rest:
            t.start()
        time.sleep(0.5)
        holder.rollback()
    for t in [first, *rest]:
        t.join(30)
