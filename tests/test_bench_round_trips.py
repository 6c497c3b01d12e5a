"""The round trips the PostgreSQL store sends per gateway call, counted on the wire by
``bench.round_trips.Relay``: counts, never timings."""

from __future__ import annotations

import threading
import time

from awl.store.postgres import PostgresStore
from awl.store.protocol import Reserved, Scope
from bench.round_trips import Relay
from tests.awl.test_store import T0, create, reserve
from tests.postgres_support import in_one_group


def _settled(relay: Relay) -> int:
    """The relay's count once nothing has moved through it for a moment."""
    count = relay.turns
    while True:
        time.sleep(0.1)
        if relay.turns == count:
            return count
        count = relay.turns


def test_a_call_costs_one_round_trip_to_reserve_and_one_to_end(pg_url: str) -> None:
    """After the order's first call (the general path, which reads its row first), each
    reservation is one statement and each outcome another: two round trips a call."""
    with Relay.to(pg_url) as relay:
        store = PostgresStore(relay.url(pg_url))
        try:
            create(store)
            scope = [Scope(jtis=None, max_calls=100, max_usd=None, name="order")]
            first = reserve(store, scopes=scope)
            assert isinstance(first, Reserved)
            before = _settled(relay)
            for _ in range(5):
                got = reserve(store, scopes=scope)
                assert isinstance(got, Reserved)
                store.finish_call("o1", got.ref, outcome="ok", result={"content": []},
                                  error=None, ended_at=T0)
            assert _settled(relay) - before == 10
        finally:
            store.close()


def test_a_group_of_reservations_costs_two_round_trips_whatever_its_size(pg_url: str) -> None:
    """Reservations of one order that waited together: BEGIN with the row's lock and read,
    then every insert with the COMMIT; two round trips for the twelve."""
    with Relay.to(pg_url) as relay:
        store = PostgresStore(relay.url(pg_url))
        try:
            create(store)
            scope = [Scope(jtis=None, max_calls=100, max_usd=None, name="order")]
            assert isinstance(reserve(store, scopes=scope), Reserved)
            for _ in range(store._pool_size):  # every connection the group may take, open
                assert isinstance(reserve(store, scopes=scope), Reserved)
            results: list[object] = []
            batches = store.reservation_batches

            def run() -> None:
                results.append(reserve(store, scopes=scope))

            counted: list[int] = []
            in_one_group(pg_url, threading.Thread(target=run),
                         [threading.Thread(target=run) for _ in range(12)],
                         then=lambda: counted.append(_settled(relay)))
            assert all(isinstance(r, Reserved) for r in results) and len(results) == 13
            assert store.reservation_batches == batches + 1
            # the first's statement was sent before the count began: its answer is no turn
            assert _settled(relay) - counted[0] == 2
        finally:
            store.close()
