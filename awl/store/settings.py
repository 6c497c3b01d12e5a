"""The environment's settings for every store: how long a wait on it may last, and how many
connections a PostgreSQL store opens (BIND-16). Its own module, below both the stores and
:mod:`awl.store.urls`, so each reads them without importing the other."""

from __future__ import annotations

import os

from awl.documents.errors import BadRequest

__all__ = ["POOL_SIZE_DEFAULT", "POOL_SIZE_ENV", "TIMEOUT_DEFAULT", "TIMEOUT_ENV",
           "store_settings"]

TIMEOUT_ENV = "AWL_STORE_TIMEOUT"
"""The environment variable bounding every wait on the store, in seconds from the start of
the operation (or gateway call) waiting: :data:`TIMEOUT_DEFAULT` unless set. On SQLite, how
long a write waits for another writer; on PostgreSQL, for a connection (a server out of
reach, full or restarting), a row another writer holds, and an answer."""

TIMEOUT_DEFAULT = 30.0

POOL_SIZE_ENV = "AWL_PG_POOL_SIZE"
"""The environment variable giving the most connections each of a PostgreSQL store's two
pools (writes, reads) opens in one process: :data:`POOL_SIZE_DEFAULT` unless set."""

POOL_SIZE_DEFAULT = 8


def store_settings() -> tuple[float, int]:
    """The store timeout and PostgreSQL pool size the environment sets (:data:`TIMEOUT_ENV`,
    :data:`POOL_SIZE_ENV`), their defaults for what it leaves unset; a value that is no
    number in range is refused in one line."""
    timeout, pool = TIMEOUT_DEFAULT, POOL_SIZE_DEFAULT
    given = os.environ.get(TIMEOUT_ENV, "").strip()
    if given:
        try:
            timeout = float(given)
        except ValueError:
            timeout = -1.0
        if not 0.1 <= timeout <= 3600:  # False for nan
            raise BadRequest(f"{TIMEOUT_ENV}={given[:40]!r} is not a number of seconds from "
                             f"0.1 to 3600; fix it, or unset it for {TIMEOUT_DEFAULT:g}")
    given = os.environ.get(POOL_SIZE_ENV, "").strip()
    if given:
        if not given.isdigit() or not 1 <= int(given) <= 1000:
            raise BadRequest(f"{POOL_SIZE_ENV}={given[:40]!r} is not a whole number from 1 "
                             f"to 1000; fix it, or unset it for {POOL_SIZE_DEFAULT}")
        pool = int(given)
    return timeout, pool
