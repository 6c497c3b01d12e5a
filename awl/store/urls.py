"""Choosing a store by URL: what ``--store``, ``AWL_STORE`` and :func:`awl.open_store` take.

A store URL is one of:

- a path to a SQLite desk file (``desk.sqlite3``, ``/srv/awl/desk.sqlite3``), or the same as
  ``sqlite:PATH`` (relative) or ``sqlite:///ABSOLUTE/PATH`` (``sqlite:////ABSOLUTE/PATH``
  reads the same);
- ``memory:``, a desk that lives as long as the process (for tests and trials);
- ``postgresql://USER:PASSWORD@HOST:PORT/DATABASE`` (or ``postgres://``), the PostgreSQL store,
  loaded from :mod:`awl.store.postgres` only when asked for; its module provides
  ``PostgresStore(url)``.

Every mistake is one :class:`~awl.BadRequest` line that names the URL (its password hidden)
and what to write instead; nothing is created or written for a URL that is refused.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from awl.documents.errors import BadRequest, StoreUnavailable
from awl.store.memory import MemoryStore
from awl.store.protocol import Store
from awl.store.settings import (
    POOL_SIZE_ENV,
    TIMEOUT_ENV,
    store_settings,
)
from awl.store.sqlite import SQLiteStore

__all__ = ["POOL_SIZE_ENV", "STORE_ENV", "TIMEOUT_ENV", "USAGE", "open_store", "shown_url",
           "store_settings"]

STORE_ENV = "AWL_STORE"
"""The environment variable naming the store when no ``--store`` is given."""

USAGE = ("a SQLite file path, sqlite:///ABSOLUTE/PATH, memory:, or "
         "postgresql://USER@HOST/DATABASE")
"""What a store URL may be, as error messages say it."""

# A scheme as RFC 3986 spells it. One letter is a Windows drive (C:\desk.sqlite3), not one.
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):")
_POSTGRES = ("postgresql", "postgres")
# Where a URL's authority (``//[USER[:PASSWORD]@]HOST[:PORT]``) begins.
_AUTHORITY = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*://")


def shown_url(url: str) -> str:
    """``url`` as messages show it: any password replaced by ``***``, the rest as written.

    Read from the text, not from :func:`~urllib.parse.urlsplit`, so a URL that does not
    parse (``[`` unclosed, a port that is no number) is hidden too: the messages that quote
    it are the ones refusing it. A password holding an unescaped ``/``, ``?`` or ``#``
    (``https://ana:pa/ss@host/``) ends the host early and leaves a port that is no number;
    up to the ``@`` after it is then taken as the password as well."""
    start = _AUTHORITY.match(url)
    if start is None:
        return url
    head, rest = url[:start.end()], url[start.end():]
    ends = [i for i in (rest.find(stop) for stop in "/?#") if i != -1]
    authority = rest[:min(ends, default=len(rest))]
    userinfo, at, _ = authority.rpartition("@")
    if not at:
        tail = authority.rpartition("]")[2]  # an IPv6 host's colons are no port's
        port = tail.rpartition(":")[2] if ":" in tail else ""
        later = rest.find("@", len(authority))
        if not port or port.isdigit() or later == -1:
            return url
        userinfo = rest[:later]
    user, colon, _ = userinfo.partition(":")
    if not colon:
        return url
    return f"{head}{user}:***{rest[len(userinfo):]}"


def open_store(url: str | os.PathLike[str], *, create: bool = True) -> Store:
    """The store a URL names, opened (and, for a new SQLite file, created).

    Args:
        url: see the module's description; a :class:`os.PathLike` is a SQLite file.
        create: whether a SQLite file that does not exist yet is created (False: it is
            StoreUnavailable, and ``memory:``, always new and empty, is refused).

    Raises:
        BadRequest: the URL is malformed, names an unknown scheme, or names a PostgreSQL
            store when this installation has none.
        AWLError: the store could not be opened (each backend says why in one line: an
            unreachable server, refused credentials, a desk made by a newer version).

    Example:
        >>> store = open_store("memory:")
        >>> store.list_orders()
        []
    """
    if isinstance(url, os.PathLike):
        return _sqlite(Path(url), create)
    text = str(url).strip()
    if not text:
        raise BadRequest(f"the store URL is empty; give {USAGE}")
    match = _SCHEME.match(text)
    if match is None:
        return _sqlite(Path(text).expanduser(), create)
    scheme = match.group(1).lower()
    rest = text[match.end():]
    if scheme == "memory":
        if rest:
            raise BadRequest(f"store URL {text!r}: memory: takes nothing after the colon; "
                             "write just memory:")
        if not create:
            raise BadRequest("memory: names a new, empty desk; name a store that exists")
        return MemoryStore()
    if scheme == "sqlite":
        return _sqlite(_sqlite_path(text, rest), create)
    if scheme in _POSTGRES:
        return _postgres(text)
    raise BadRequest(f"unknown store URL scheme {scheme + ':'!r} in {shown_url(text)!r}; "
                     f"give {USAGE}")


def _sqlite_path(text: str, rest: str) -> Path:
    """The file a ``sqlite:`` URL names: ``sqlite:PATH`` or ``sqlite:///ABSOLUTE/PATH``."""
    if rest.startswith("//"):
        authority, _, path = rest[2:].partition("/")
        if authority not in ("", "localhost"):
            raise BadRequest(f"store URL {text!r} names host {authority!r}; a SQLite desk "
                             "is a local file: write sqlite:///ABSOLUTE/PATH")
        rest = "/" + path.lstrip("/")  # sqlite:////ABS (SQLAlchemy's spelling) reads the same
    if rest in ("", "/") or rest.endswith("/"):
        raise BadRequest(f"store URL {text!r} names no file; write sqlite:///ABSOLUTE/PATH "
                         "or sqlite:RELATIVE/PATH")
    if "?" in rest or "#" in rest:
        raise BadRequest(f"store URL {text!r}: a SQLite URL takes no query or fragment")
    return Path(unquote(rest)).expanduser()


def _sqlite(path: Path, create: bool) -> Store:
    if not create and not path.is_file():
        raise StoreUnavailable(f"there is no desk file at {path}; check the path")
    return SQLiteStore(path, timeout=store_settings()[0])


def _postgres(text: str) -> Store:
    _check_port(text)  # the rest is libpq's to judge (a missing host is the local socket)
    try:
        # Late: psycopg is the [postgres] extra, needed only for a postgresql:// URL.
        from awl.store.postgres import PostgresStore
    except ModuleNotFoundError as exc:
        if exc.name == "awl.store.postgres":
            raise BadRequest("this installation of awl has no PostgreSQL store; upgrade "
                             "awl-gateway, or use a SQLite desk") from None
        raise BadRequest(f"the PostgreSQL store needs {exc.name!r}, which is not installed; "
                         "pip install -e '.[postgres]' in the awl-gateway checkout") from None
    timeout, pool_size = store_settings()
    return PostgresStore(text, pool_size=pool_size, timeout=timeout)


def _check_port(text: str) -> None:
    try:
        urlsplit(text).port  # noqa: B018 - urlsplit checks the port only when it is read
    except ValueError as exc:
        # "Port could not be cast ... as 'pa'" quotes a password's start when it holds an
        # unescaped / ? or # (postgresql://ana:pa/ss@db/awl): say so without quoting it.
        why = ("its port is not a number" if str(exc).startswith("Port could not be cast")
               else str(exc))
        raise BadRequest(f"store URL {shown_url(text)!r} is malformed ({why}); write "
                         "postgresql://USER:PASSWORD@HOST:PORT/DATABASE (a / ? # or @ in "
                         "the password as %2F %3F %23 %40)") from None
