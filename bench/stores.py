"""Which stores a benchmark runs on: ``--store sqlite``, ``--store postgres`` or both.

``--store sqlite,postgres`` measures the two side by side in one run. The PostgreSQL server
is the one ``--postgres-url`` names, else ``AWL_TEST_POSTGRES`` (``scripts/postgres.sh``
starts one and prints its URL). Every measure gets a fresh, empty desk: a SQLite file in the
run's temporary folder, or a new schema in database ``awl_bench`` on the server (the store
URL's ``search_path`` names it), dropped when the measure ends.
"""

from __future__ import annotations

import argparse
import os
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

STORES = ("sqlite", "postgres")
POSTGRES_ENV = "AWL_TEST_POSTGRES"
DATABASE = "awl_bench"


def parse_stores(text: str) -> list[str]:
    """``sqlite,postgres`` as a list of store names, in the order given, each once.

    Raises:
        ValueError: a name is not one of :data:`STORES`, or none is given.
    """
    names: list[str] = []
    for part in text.split(","):
        name = part.strip().lower()
        if name == "postgresql":
            name = "postgres"
        if not name:
            continue
        if name not in STORES:
            raise ValueError(f"unknown store {part.strip()!r}: give {' or '.join(STORES)}, "
                             "or both separated by a comma")
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError(f"--store names no store: give {' or '.join(STORES)}")
    return names


def add_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--store`` and ``--postgres-url`` (read back with :func:`Stores.of`)."""
    parser.add_argument("--store", default="sqlite",
                        help="sqlite, postgres, or sqlite,postgres side by side (sqlite)")
    parser.add_argument("--postgres-url", metavar="URL",
                        help=f"the PostgreSQL server (default ${POSTGRES_ENV})")


def pass_through(args: argparse.Namespace) -> list[str]:
    """The ``--store``/``--postgres-url`` arguments to hand to another benchmark."""
    out = ["--store", args.store]
    if args.postgres_url:
        out += ["--postgres-url", args.postgres_url]
    return out


@dataclass(frozen=True)
class Stores:
    """The stores one run measures, and the PostgreSQL server when one is among them."""

    names: tuple[str, ...]
    server: str | None = None

    @classmethod
    def of(cls, parser: argparse.ArgumentParser, args: argparse.Namespace,
           env: dict[str, str] | None = None) -> Stores:
        """The stores ``args`` name; a one-line parser error when they cannot be used."""
        try:
            names = parse_stores(args.store)
        except ValueError as exc:
            parser.error(str(exc))
        server = None
        if "postgres" in names:
            server = args.postgres_url or (os.environ if env is None else env).get(
                POSTGRES_ENV)
            if not server:
                parser.error(f"--store postgres needs a server: give --postgres-url URL or "
                             f"set {POSTGRES_ENV} (export {POSTGRES_ENV}=$(bash "
                             "scripts/postgres.sh))")
        return cls(tuple(names), server)

    @contextmanager
    def fresh(self, name: str, folder: Path, label: str) -> Iterator[str]:
        """A store URL naming a new, empty desk on store ``name``, removed afterwards."""
        if name == "sqlite":
            folder.mkdir(parents=True, exist_ok=True)
            yield str(folder / f"{label}.sqlite3")
            return
        assert self.server is not None, "Stores.of checks a server is given"
        schema = f"bench_{label}_{uuid.uuid4().hex[:10]}"
        database = _database(self.server)
        with _admin(database) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        try:
            yield in_schema(database, schema)
        finally:
            with _admin(database) as conn:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")


def in_schema(url: str, schema: str) -> str:
    """``url`` with ``schema`` first on its search path."""
    parts = urlsplit(url)
    query = "&".join(q for q in (parts.query, f"options=-csearch_path%3D{schema}") if q)
    return parts._replace(query=query).geturl()


def _admin(url: str) -> Any:
    import psycopg

    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        last = str(exc).strip().splitlines()[-1]
        raise SystemExit(f"bench: cannot reach the PostgreSQL server ({last}); start one "
                         "with scripts/postgres.sh or give --postgres-url") from None


def _database(server: str) -> str:
    """The URL of database :data:`DATABASE` on ``server``, created on first use."""
    with _admin(server) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                             (DATABASE,)).fetchone()
        if found is None:
            conn.execute(f"CREATE DATABASE {DATABASE}")
    return urlsplit(server)._replace(path=f"/{DATABASE}").geturl()


def ratio(value: float, floor: float) -> str:
    """``value`` over its ``floor`` as the tables print it (``2.50x``), or ``-``."""
    return f"{value / floor:.2f}x" if floor > 0 else "-"


def columns(rows: Sequence[tuple[str, Sequence[str]]], heads: Sequence[str]) -> str:
    """A plain table: a measure per line, one value column per store."""
    width = max([len("measure"), *(len(name) for name, _ in rows)])
    sizes = [max([len(h), *(len(values[i]) for _, values in rows)]) for i, h in enumerate(heads)]
    lines = ["  ".join(["measure".ljust(width), *(h.rjust(s) for h, s in zip(heads, sizes,
                                                                           strict=True))]),
             "  ".join(["-" * width, *("-" * s for s in sizes)])]
    lines += ["  ".join([name.ljust(width), *(v.rjust(s) for v, s in zip(values, sizes,
                                                                         strict=True))])
              for name, values in rows]
    return "\n".join(lines)
