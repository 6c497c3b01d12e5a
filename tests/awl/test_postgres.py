"""What the PostgreSQL store adds to the store contract: migrations shared by racing
processes, one-line errors, a commit lock the server lets go of when its holder dies, and
waits woken by NOTIFY. Every test runs against the real server of ``scripts/postgres.sh``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import psycopg
import pytest

from awl.cli import main
from awl.documents.errors import AWLError, Conflict
from awl.store.postgres import SCHEMA_VERSION, PostgresStore
from awl.store.protocol import LockInfo, OverBudget, Reservation, Reserved, Scope
from gateway._lock import OrderLock
from tests.awl.desk_support import open_at_once, reserved
from tests.awl.test_store import T0, create, ev, refusal, reserve
from tests.postgres_support import in_one_group

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=str(ROOT),
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _rows(url: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


def _awl(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str,
         store: str) -> tuple[int, str]:
    """Run the ``awl`` command with ``AWL_STORE=store``; its exit code and stderr."""
    monkeypatch.setenv("AWL_STORE", store)
    capsys.readouterr()
    code = main(list(args))
    return code, capsys.readouterr().err


def test_stores_opening_a_new_database_at_once_migrate_it_once(fresh_pg_url: str) -> None:
    """Four stores (each on connections of its own, as four processes would be) open one
    empty schema together: all succeed, and each version is applied once."""
    assert open_at_once(lambda: PostgresStore(fresh_pg_url).close()) == []
    assert _rows(fresh_pg_url, "SELECT version FROM awl_schema ORDER BY version") == [
        (v,) for v in range(1, SCHEMA_VERSION + 1)]


@pytest.mark.spec("BIND-16")
def test_a_database_from_a_newer_version_is_refused_with_nothing_written(
        fresh_pg_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A desk whose schema is newer than this code is refused in one line, untouched."""
    PostgresStore(fresh_pg_url).close()
    with psycopg.connect(fresh_pg_url, autocommit=True) as conn:
        conn.execute("INSERT INTO awl_schema (version) VALUES (%s)", (SCHEMA_VERSION + 1,))
    before = _rows(fresh_pg_url, "SELECT version FROM awl_schema ORDER BY version")
    with pytest.raises(AWLError, match=r"newer than this awl .* upgrade awl-gateway"):
        PostgresStore(fresh_pg_url)
    code, err = _awl(monkeypatch, capsys, "order", "list", store=fresh_pg_url)
    assert code == 1 and err.count("\n") == 1 and "newer than this awl" in err
    assert _rows(fresh_pg_url, "SELECT version FROM awl_schema ORDER BY version") == before
    assert _rows(fresh_pg_url, "SELECT COUNT(*) FROM orders") == [(0,)]


def _with(url: str, *, password: str | None = None, port: int | None = None) -> str:
    parts = urlsplit(url)
    user = parts.username or ""
    host = parts.hostname or "127.0.0.1"
    netloc = f"{user}:{password or parts.password}@{host}:{port or parts.port}"
    return parts._replace(netloc=netloc).geturl()


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.spec("BIND-16")
def test_unreachable_server_and_wrong_credentials_are_one_line_each(
        pg_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An unreachable server and refused credentials each say what is wrong in one line."""
    cases = {
        _with(pg_url, port=_closed_port()): "cannot reach PostgreSQL at 127.0.0.1:",
        _with(pg_url, password="not-the-password"): "refused the credentials",
    }
    for url, message in cases.items():
        with pytest.raises(AWLError, match=message) as caught:
            PostgresStore(url)
        assert "\n" not in str(caught.value)
        assert "not-the-password" not in str(caught.value)
        code, err = _awl(monkeypatch, capsys, "order", "list", store=url)
        assert code == 1 and err.count("\n") == 1 and message in err, err


def test_a_deadlock_is_one_line_that_says_to_try_again(fresh_pg_url: str) -> None:
    """A real deadlock between two sessions becomes the server's own message and what to do,
    not the HINT line that ends the server's text."""
    import threading

    import psycopg

    from awl.store.postgres import _unavailable

    with psycopg.connect(fresh_pg_url, autocommit=True) as setup:
        setup.execute("CREATE TABLE pair (id INT PRIMARY KEY)")
        setup.execute("INSERT INTO pair VALUES (1), (2)")
    raised: list[BaseException] = []
    both = threading.Barrier(2)

    def lock(first: int, second: int) -> None:
        with psycopg.connect(fresh_pg_url) as conn:
            try:
                conn.execute("SELECT 1 FROM pair WHERE id = %s FOR UPDATE", (first,))
                both.wait(timeout=10)
                conn.execute("SELECT 1 FROM pair WHERE id = %s FOR UPDATE", (second,))
            except psycopg.Error as exc:
                raised.append(exc)

    threads = [threading.Thread(target=lock, args=pair) for pair in ((1, 2), (2, 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(raised) == 1 and "HINT" in str(raised[0])
    said = str(_unavailable(fresh_pg_url, raised[0]))
    assert "\n" not in said and "deadlock detected" in said and "try again" in said
    assert "HINT" not in said and "server log" not in said


_HOLDER = """
import sys, time
from awl.store.postgres import PostgresStore
from awl.store.protocol import LockInfo
store = PostgresStore(sys.argv[1])
# A holder on another host with an hour of lease: only the server can tell it is gone.
info = LockInfo(name="commit:o1", holder="far", pid=1, host="elsewhere",
                lease_until=time.time() + 3600)
assert store.acquire_lock(info)
print("held", flush=True)
time.sleep(120)
"""


@pytest.mark.spec("CM-10")
@pytest.mark.slow
def test_a_killed_holder_on_another_host_is_taken_over_at_once(pg_url: str) -> None:
    """kill -9 of a lock holder whose lease has an hour left: the next committer takes
    the lock at once, without waiting out the lease, and names the holder it replaced."""
    proc = _python(_HOLDER, pg_url)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with PostgresStore(pg_url) as store:
            lock = OrderLock(store, "commit:o1", lease=30)
            assert not lock.try_acquire()
            held = store.get_lock("commit:o1")
            assert held is not None and held.host == "elsewhere"
            proc.kill()
            proc.wait(30)
            killed = time.monotonic()
            while not lock.try_acquire():
                assert time.monotonic() - killed < 5, "the dead holder's lock was kept"
                time.sleep(0.01)
            took = time.monotonic() - killed
            assert store.get_lock("commit:o1") == lock.info
            # The server freed the lock, and the record the dead holder left names it.
            assert lock.took_over == held
            lock.release()
            again = OrderLock(store, "commit:o1", lease=30)
            assert again.try_acquire() and again.took_over is None  # released: nobody died
            again.release()
            assert store.get_lock("commit:o1") is None
    finally:
        proc.kill()
        proc.communicate()
    assert took < 5


@pytest.mark.spec("CM-10")
def test_a_live_holder_taken_over_can_no_longer_renew(pg_url: str) -> None:
    """A takeover of a holder whose lease ran out ends its lock: its renewal fails, so it
    sends nothing more, and a renewal by the new holder works."""
    with PostgresStore(pg_url) as old, PostgresStore(pg_url) as new:
        stale = LockInfo(name="commit:o1", holder="a", pid=1, host="h", lease_until=1.0)
        assert old.acquire_lock(stale)
        mine = LockInfo(name="commit:o1", holder="b", pid=2, host="h2",
                        lease_until=time.time() + 30)
        assert new.acquire_lock(mine, replace=stale)
        assert new.get_lock("commit:o1") == mine
        renewed = LockInfo(name="commit:o1", holder="a", pid=1, host="h", lease_until=2.0)
        assert not old.acquire_lock(renewed, replace=stale)
        assert new.acquire_lock(LockInfo(name="commit:o1", holder="b", pid=2, host="h2",
                                         lease_until=time.time() + 60), replace=mine)
        old.release_lock("commit:o1", "a")
        assert new.get_lock("commit:o1") is not None


def test_a_waiting_follower_is_woken_within_100_ms_of_an_event(pg_url: str) -> None:
    """A wait on one store (another host's desk) wakes as soon as another store writes."""
    with PostgresStore(pg_url) as writer, PostgresStore(pg_url) as follower:
        create(writer)
        assert follower.wait_for_events("o1", 0, 5.0) is True  # seq 1 is there already
        assert follower.wait_for_events("o1", 1, 0.05) is False
        lags = []
        for seq in range(2, 7):
            woke: list[float] = []

            def wait(after: int, woke: list[float]) -> None:
                if follower.wait_for_events("o1", after, 10.0):
                    woke.append(time.monotonic())

            waiter = threading.Thread(target=wait, args=(seq - 1, woke))
            waiter.start()
            time.sleep(0.1)  # the follower is waiting
            writer.append("o1", ev(seq, "note", "offered", "offered"), state="offered")
            written = time.monotonic()
            waiter.join(10)
            assert woke, f"the follower missed event {seq}"
            lags.append(woke[0] - written)
    lags.sort()
    print("wake lags (s):", [round(x, 4) for x in lags])
    assert lags[len(lags) // 2] < 0.1, lags  # the median wake, on a busy machine
    assert lags[-1] < 1.0, lags


@pytest.mark.spec("BIND-2")
@pytest.mark.anyio
async def test_wait_for_update_is_woken_by_another_hosts_write(pg_url: str) -> None:
    """``wait_for_update`` on one desk server wakes within 100 ms of a write made through
    another store (another host's desk): NOTIFY, where polling would lag up to 250 ms."""
    from awl.desk.desk import Desk
    from awl.server._server import DeskServer
    from tests.awl.server_support import MANAGER, WORKER, order_fields

    with PostgresStore(pg_url) as here, PostgresStore(pg_url) as there:
        server = DeskServer(here)
        other = Desk(there)
        oid = other.create(order_fields(), MANAGER).id
        lags = []
        for step in range(3):
            seq = other.get(oid).seq
            woke: list[float] = []
            written: list[float] = []

            async def wait(after: int, woke: list[float]) -> None:
                result = await server.call("wait_for_update", {
                    "order_id": oid, "after_seq": after, "timeout_seconds": 10}, actor=MANAGER)
                assert not result.is_error
                woke.append(time.monotonic())

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait, seq, woke)
                await anyio.sleep(0.6)  # long enough for a polling wait to reach its limit
                write = [other.accept, other.start, lambda o, w: other.progress(
                    o, w, "half way")][step]
                await anyio.to_thread.run_sync(write, oid, WORKER)
                written.append(time.monotonic())
            lags.append(woke[0] - written[0])
    lags.sort()
    assert lags[1] < 0.1, lags


@pytest.mark.spec("CM-10")
def test_a_committer_taken_over_stops_before_its_next_send(pg_url: str) -> None:
    """Once another host takes the lock over, the old holder's check before its next send
    fails at once, though its own lease has most of its time left."""
    from dataclasses import replace

    from gateway._lock import LockLost

    with PostgresStore(pg_url) as here, PostgresStore(pg_url) as there:
        lock = OrderLock(here, "commit:o1", lease=30)
        assert lock.try_acquire() and lock.info is not None
        lock.check()  # ours: nothing to say
        taker = replace(lock.info, holder="other", host="elsewhere")
        assert there.acquire_lock(taker, replace=lock.info)
        with pytest.raises(LockLost):
            lock.check()
        assert lock.lost and there.get_lock("commit:o1") == taker


@pytest.mark.spec("DP-13")
def test_pass_rotate_and_retire_with_a_store_publish_the_public_keys(
        pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`awl pass rotate --store URL` and `retire --store URL` publish the key set there, so
    gateways on other hosts trust exactly the desk's keys from their next request on."""
    from awl.passes import KeyStore

    keys = KeyStore(tmp_path)
    first = keys.current_kid
    assert main(["pass", "rotate", "--home", str(tmp_path), "--store", pg_url]) == 0
    with PostgresStore(pg_url) as store:
        published = store.published_keys()
        assert published == keys.jwks() and len(published["keys"]) == 2
        assert main(["pass", "retire", first, "--home", str(tmp_path), "--store", pg_url]) == 0
        assert store.published_keys() == keys.jwks()
        assert [k["kid"] for k in keys.jwks()["keys"]] == [keys.current_kid]
    capsys.readouterr()


@pytest.mark.spec("GW-5", "GW-20")
def test_one_statement_reservations_from_two_stores_number_and_count_exactly(
        pg_url: str) -> None:
    """Two stores (two gateways' worth) whose next reservations each take the one-statement
    path, racing from 40 threads on one order with a usd limit, with a refusal between:
    every call numbered once without a gap, exactly the limit reserved, the pass's own
    totals and the first call's time kept as the general path keeps them."""
    a, b = PostgresStore(pg_url), PostgresStore(pg_url)
    try:
        create(a)
        scope = [Scope(jtis=None, max_calls=100, max_usd=1.2, name="order")]
        first = reserve(a, jti="p1", usd=0.1, scopes=scope, at="2030-01-01T00:00:05Z")
        assert isinstance(first, Reserved) and first.record.ref == "srv/read#1"
        assert b.record_call(refusal()).ref == "srv/write#2"
        # Both now number their next call at once (the one-statement path).
        assert (a._next_n["o1"], b._next_n["o1"]) == (2, 3)
        results: list[Reservation] = []
        guard, barrier = threading.Lock(), threading.Barrier(40)

        def run(store: PostgresStore) -> None:
            barrier.wait()
            got = reserve(store, jti="p1", usd=0.1, scopes=scope)
            with guard:
                results.append(got)

        threads = [threading.Thread(target=run, args=(s,)) for s in [a, b] * 20]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        won = [r for r in results if isinstance(r, Reserved)]
        assert len(won) == 11 and results.count(OverBudget("order")) == 29
        calls = a.calls("o1")
        assert [int(c.ref.rpartition("#")[2]) for c in calls] == list(range(1, 14))
        assert sorted(c.ref for c in calls if c.tool == "srv/read") == sorted(
            ["srv/read#1", *(r.record.ref for r in won)])
        usage = b.usage("o1")
        assert (usage.tool_calls, round(usage.usd, 9)) == (12, 1.2)
        assert usage.first_call_at == T0
        assert b.usage("o1", frozenset({"p1"})).tool_calls == 12
        assert reserve(b, usd=0.1, scopes=scope) == OverBudget("order")
    finally:
        a.close()
        b.close()


def test_reservations_waiting_together_commit_together_exactly(pg_url: str) -> None:
    """Reservations of one order that wait while another is written are numbered and
    written in one transaction (group commit): none returns before it commits, a usd limit
    and a stale ``seq`` are held to as one at a time would hold them, refs have no gap, and
    a second store racing meanwhile numbers its own calls after them."""
    a, b = PostgresStore(pg_url), PostgresStore(pg_url)
    try:
        create(a)
        scope = [Scope(jtis=None, max_calls=100, max_usd=1.0, name="order")]
        assert reserved(reserve(a, usd=0.1, scopes=scope)).ref == "srv/read#1"
        before = a.reservation_batches
        results: list[Reservation | BaseException] = []
        guard = threading.Lock()

        def run(store: PostgresStore, seq: int | None = None) -> None:
            try:
                got: Reservation | BaseException = store.reserve_call(
                    "o1", attempt=1, tool="srv/read", arguments={}, pass_jti=None, usd=0.1,
                    started_at=T0, scopes=scope, seq=seq)
            except AWLError as exc:
                got = exc
            with guard:
                results.append(got)

        with psycopg.connect(pg_url) as holder:
            holder.execute("SELECT 1 FROM orders WHERE id = 'o1' FOR UPDATE")
            first = threading.Thread(target=run, args=(a,))
            first.start()
            time.sleep(0.3)  # the first reservation now waits for the row, alone
            rest = [threading.Thread(target=run, args=(a,)) for _ in range(12)]
            rest.append(threading.Thread(target=run, args=(a, 99)))  # a stale order
            rest.append(threading.Thread(target=run, args=(b,)))  # another gateway
            for t in rest:
                t.start()
            time.sleep(0.5)
            assert results == []  # nobody is answered before its commit
            assert len(a.calls("o1")) == 1
            holder.rollback()
        for t in [first, *rest]:
            t.join(30)
        won = sorted(int(r.record.ref.rpartition("#")[2]) for r in results
                     if isinstance(r, Reserved))
        assert won == list(range(2, 11))  # nine more fit in 1.0 usd
        assert results.count(OverBudget("order")) == 5
        stale = [r for r in results if isinstance(r, Conflict)]
        assert len(stale) == 1 and "99" in str(stale[0])
        assert a.reservation_batches - before == 1  # the twelve that waited: one group
        assert [c.ref for c in b.calls("o1")] == [f"srv/read#{n}" for n in range(1, 11)]
        usage = b.usage("o1")
        assert (usage.tool_calls, round(usage.usd, 9)) == (10, 1.0)
    finally:
        a.close()
        b.close()


def test_a_group_commit_that_fails_writes_none_of_it_and_leaves_the_store_working(
        pg_url: str) -> None:
    """A group whose insert fails (here a call row put in the way behind the store's
    back) fails every reservation in it with nothing of it written, and the connection is
    given back clean: the next reservation succeeds."""
    a = PostgresStore(pg_url)
    try:
        create(a)
        scope = [Scope(jtis=None, max_calls=100, max_usd=None, name="order")]
        assert reserved(reserve(a, scopes=scope)).ref == "srv/read#1"
        with psycopg.connect(pg_url, autocommit=True) as conn:  # call 3's number, taken
            conn.execute("INSERT INTO calls (order_id, n, attempt, counted, usd, started, doc)"
                         " SELECT order_id, 3, attempt, false, 0, started, doc FROM calls"
                         " WHERE order_id = 'o1' AND n = 1")
        results: list[Reservation | BaseException] = []
        guard = threading.Lock()

        def run() -> None:
            try:
                got: Reservation | BaseException = reserve(a, scopes=scope)
            except psycopg.IntegrityError as exc:  # a damaged store's own error, as it was
                got = exc
            with guard:
                results.append(got)

        before = a.reservation_batches
        in_one_group(pg_url, threading.Thread(target=run),
                     [threading.Thread(target=run) for _ in range(4)])
        assert a.reservation_batches == before  # the group did not commit
        assert len(results) == 5
        assert sum(isinstance(r, Reserved) for r in results) == 1  # the first, alone
        assert all(isinstance(r, psycopg.IntegrityError) for r in results
                   if not isinstance(r, Reserved))
        assert _rows(pg_url, "SELECT n FROM calls WHERE order_id = 'o1' ORDER BY n") == [
            (1,), (2,), (3,)]  # the group's call 4 and on: none written
        assert _rows(pg_url, "SELECT last_n, calls FROM orders WHERE id = 'o1'") == [(2, 2)]
        with psycopg.connect(pg_url, autocommit=True) as conn:  # out of the way again
            conn.execute("DELETE FROM calls WHERE order_id = 'o1' AND n = 3")
        for _ in range(a._pool_size + 1):  # every pooled connection: none left in a failed
            assert isinstance(reserve(a, scopes=scope), Reserved)  # transaction
        assert [c.ref for c in a.calls("o1")] == [f"srv/read#{n}" for n in range(1, 12)]
    finally:
        a.close()


# Webhooks and the outbox across hosts -------------------------------------------------------

@contextmanager
def _outbox_trigger(url: str, body: str) -> Iterator[None]:
    """A trigger running ``body`` (PL/pgSQL) before each row written to the outbox, for the
    length of the block (dropped after, so the next test's schema is a plain desk)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE FUNCTION awl_test_outbox() RETURNS trigger LANGUAGE plpgsql"
                     f" AS $$ BEGIN {body}; RETURN NEW; END $$")
        conn.execute("CREATE TRIGGER awl_test_outbox BEFORE INSERT ON outbox"
                     " FOR EACH ROW EXECUTE FUNCTION awl_test_outbox()")
        try:
            yield
        finally:
            conn.execute("DROP TRIGGER awl_test_outbox ON outbox")
            conn.execute("DROP FUNCTION awl_test_outbox()")


@pytest.mark.spec("HOOK-4")
def test_deliverers_on_two_hosts_never_claim_one_notification(pg_url: str) -> None:
    """Two stores (two hosts' deliverers), three threads each, claim a full outbox at once,
    a few at a time: every notification is claimed exactly once."""
    from tests.awl.test_store_outbox import T1, T2, hook, working

    with PostgresStore(pg_url) as one, PostgresStore(pg_url) as two:
        for k in range(20):
            one.add_webhook(hook(f"wh_{k}", ("submitted",)))
        for n in range(6):
            working(one, f"o{n}")
            one.append(f"o{n}", ev(4, "report", "working", "submitted"), state="submitted")
        total = len(one.notifications(limit=None))
        assert total == 120
        barrier = threading.Barrier(6)
        claimed: list[str] = []
        errors: list[BaseException] = []

        def claim(store: PostgresStore) -> None:
            try:
                barrier.wait()
                while got := store.claim_notifications(now=T1, lease_until=T2, limit=3):
                    claimed.extend(note.id for note, _ in got)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=claim, args=(store,))
                   for store in (one, two) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        assert len(claimed) == len(set(claimed)) == total
        assert {n.next_at for n in one.notifications(limit=None)} == {T2}


@pytest.mark.spec("HOOK-3")
def test_an_event_whose_notification_fails_is_not_written(pg_url: str) -> None:
    """The outbox refuses the row (a trigger raising): the append that caused it writes
    nothing, and so does an effect's move; both go through once the outbox takes rows."""
    from tests.awl.test_store import reserve
    from tests.awl.test_store_outbox import T1, hook, working

    with PostgresStore(pg_url) as store:
        store.add_webhook(hook())
        working(store)
        made = reserve(store, tool="srv/send")
        assert isinstance(made, Reserved)
        ref = made.record.ref
        store.hold_call("o1", ref, result=None, ended_at=T1)
        store.set_effect("o1", ref, expect=["held"], state="dispatching", at=T1)
        with _outbox_trigger(pg_url, "RAISE EXCEPTION 'the outbox refuses rows'"):
            with pytest.raises(psycopg.Error, match="the outbox refuses rows"):
                store.append("o1", ev(4, "report", "working", "submitted"), state="submitted")
            with pytest.raises(psycopg.Error, match="the outbox refuses rows"):
                store.set_effect("o1", ref, expect=["dispatching"], state="committed", at=T1)
        assert (store.load("o1").state, store.load("o1").seq) == ("working", 3)
        assert [e.state for e in store.effects("o1")] == ["dispatching"]
        assert store.notifications() == []
        store.append("o1", ev(4, "report", "working", "submitted"), state="submitted")
        store.set_effect("o1", ref, expect=["dispatching"], state="committed", at=T1)
        assert [n.event for n in store.notifications()] == ["committed", "submitted"]


_APPENDER = """
import sys
from awl.store.postgres import PostgresStore
from tests.awl.test_store import ev
store = PostgresStore(sys.argv[1])
store.append("o1", ev(4, "report", "working", "submitted"), state="submitted")
print("appended", flush=True)
"""


@pytest.mark.spec("HOOK-3")
@pytest.mark.slow
def test_a_writer_killed_between_an_event_and_its_notification_leaves_neither(
        pg_url: str) -> None:
    """kill -9 of a process whose append has written the event and is writing its
    notification (held there by a trigger): the server rolls both back."""
    from tests.awl.test_store_outbox import hook, working

    name = f"awl_kill_{os.getpid()}_{time.monotonic_ns()}"
    url = f"{pg_url}&application_name={name}"
    with PostgresStore(pg_url) as store:
        store.add_webhook(hook())
        working(store)
        with _outbox_trigger(pg_url, "PERFORM pg_sleep(3)"):
            proc = _python(_APPENDER, url)
            try:
                found = _backend_in(url, name, "PgSleep", "INSERT INTO outbox")
                proc.kill()
                assert proc.wait(10) == -9
            finally:
                proc.kill()
                proc.communicate()
            deadline = time.monotonic() + 30
            while _rows(pg_url, f"SELECT 1 FROM pg_stat_activity WHERE pid = {found}"):
                assert time.monotonic() < deadline, "the killed writer's backend stayed"
                time.sleep(0.05)
        assert (store.load("o1").state, store.load("o1").seq) == ("working", 3)
        assert len(store.events("o1")) == 3 and store.notifications() == []
        store.append("o1", ev(4, "report", "working", "submitted"), state="submitted")
        assert [n.event for n in store.notifications()] == ["submitted"]


def _backend_in(url: str, name: str, wait_event: str, query: str) -> int:
    """The server process of the connection named ``name`` once it waits on
    ``wait_event`` in a statement starting with ``query``."""
    deadline = time.monotonic() + 30
    while True:
        found = _rows(url, "SELECT pid FROM pg_stat_activity WHERE application_name = "
                      f"'{name}' AND wait_event = '{wait_event}' AND query LIKE '{query}%'")
        if found:
            return int(str(found[0][0]))
        assert time.monotonic() < deadline, f"no connection of {name} reached {query}"
        time.sleep(0.02)


@pytest.mark.spec("HOOK-6")
def test_a_webhook_removed_while_an_event_notifies_it_leaves_nothing_pending(
        pg_url: str) -> None:
    """Another host removes a webhook while an append that notifies it is between reading
    the webhooks and writing the notification: the removal waits for the append, then kills
    that notification, so none is left pending for a webhook that is gone."""
    from tests.awl.test_store_outbox import T1, T2, hook, working

    name = f"awl_race_{os.getpid()}_{time.monotonic_ns()}"
    with PostgresStore(f"{pg_url}&application_name={name}") as writer, \
            PostgresStore(pg_url) as other:
        writer.add_webhook(hook())
        working(writer)
        errors: list[BaseException] = []

        def append() -> None:
            try:
                writer.append("o1", ev(4, "report", "working", "submitted"), state="submitted")
            except BaseException as exc:
                errors.append(exc)

        with _outbox_trigger(pg_url, "PERFORM pg_sleep(1)"):
            thread = threading.Thread(target=append)
            thread.start()
            _backend_in(pg_url, name, "PgSleep", "INSERT INTO outbox")
            assert other.remove_webhook("wh_1", at=T1) is True
            thread.join(30)
        assert errors == []
        [note] = other.notifications()
        assert (note.state, note.error) == ("dead", "its webhook was removed")
        assert other.claim_notifications(now=T2, lease_until=T2, limit=5) == []


@pytest.mark.spec("GW-20", "GW-7")
def test_outcomes_waiting_together_commit_together_and_none_returns_before_it(
        pg_url: str) -> None:
    """Outcomes that wait while another group of outcomes commits are set in one statement
    (group commit), and no finish_call returns before its own outcome is committed; the
    same call finished twice in one group is set once, the other caller told so."""
    with PostgresStore(pg_url) as store:
        create(store)
        refs = [reserved(reserve(store)).ref for _ in range(20)]
        before = store.endings_batches
        errors: list[BaseException] = []
        returned: list[str] = []
        guard = threading.Lock()

        def finish(ref: str) -> None:
            try:
                store.finish_call("o1", ref, outcome="ok", result={"content": []}, error=None,
                                  ended_at=T0)
                with guard:
                    returned.append(ref)
            except AWLError as exc:
                with guard:
                    errors.append(exc)

        with psycopg.connect(pg_url) as holder:
            holder.execute("SELECT 1 FROM calls WHERE order_id = 'o1' AND n = 1 FOR UPDATE")
            first = threading.Thread(target=finish, args=(refs[0],))
            first.start()
            time.sleep(0.3)  # the first group ([#1]) now waits for the row
            rest = [threading.Thread(target=finish, args=(r,)) for r in [*refs[1:], refs[1]]]
            for t in rest:
                t.start()
            time.sleep(0.5)
            assert returned == [] and errors == []  # nobody is answered before its commit
            assert [c.outcome for c in store.calls("o1")] == ["pending"] * 20
            holder.rollback()
        for t in [first, *rest]:
            t.join(30)
        assert sorted(returned) == sorted(refs)
        assert len(errors) == 1 and "already has outcome 'ok'" in str(errors[0])
        assert [c.outcome for c in store.calls("o1")] == ["ok"] * 20
        assert store.endings_batches - before == 2


def _application_names(url: str) -> set[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT application_name FROM pg_stat_activity").fetchall()
    return {name for (name,) in rows}


def test_connections_name_their_host_and_process_unless_the_url_names_them(
        pg_url: str) -> None:
    """pg_stat_activity shows which awl process on which host holds each connection; an
    ``application_name`` in the URL is kept as it is."""
    mine = f"awl {socket.gethostname()} pid {os.getpid()}"
    with PostgresStore(pg_url) as store:
        store.schema_version()
        assert mine in _application_names(pg_url)
    joiner = "&" if "?" in pg_url else "?"
    with PostgresStore(f"{pg_url}{joiner}application_name=desk-a") as store:
        store.schema_version()
        names = _application_names(pg_url)
        assert "desk-a" in names and mine not in names


def _end_connections(url: str, name: str) -> int:
    """End every connection named ``name`` as a server restart ends them, and wait until
    their backends are gone (pg_terminate_backend only signals them); how many it ended."""
    with psycopg.connect(url, autocommit=True) as conn:
        ended = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = %s", (name,)).fetchone()
        deadline = time.monotonic() + 10
        while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                           (name,)).fetchone() != (0,):
            assert time.monotonic() < deadline, "the ended backends did not go away"
            time.sleep(0.01)
    assert ended is not None
    return int(ended[0])


@pytest.mark.spec("GW-20")
def test_calls_after_the_server_ended_every_connection_succeed(pg_url: str) -> None:
    """A server restart (or pg_terminate_backend, or an idle timeout) ends the store's
    pooled connections. Each used to fail the next call that took it, one StoreUnavailable
    per connection the pools held (up to eight each); a connection the server ended is now
    found so as it is taken, and another used."""
    name = "awl-ended-connections"
    with PostgresStore(f"{pg_url}&application_name={name}") as store:
        create(store)
        # Several connections in each pool, all idle afterwards.
        threads = [threading.Thread(target=lambda: [store.load("o1") for _ in range(20)])
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert reserve(store, "o1")
        assert _end_connections(pg_url, name) >= 2
        for _ in range(10):
            assert store.load("o1").seq == 1
            assert isinstance(reserve(store, "o1"), Reserved)
        assert len(store.calls("o1")) == 11


def test_a_wait_after_the_server_ended_its_listener_waits_and_hears(pg_url: str) -> None:
    """The listening connection ended too (a restart): every wait after it returned at
    once, so each waiter polled the server in a loop (1,680 waits a second here) and heard
    nothing. Now the next wait listens anew: it waits its time, and wakes on an event."""
    name = "awl-ended-listener"
    with PostgresStore(f"{pg_url}&application_name={name}") as follower, \
            PostgresStore(pg_url) as writer:
        create(writer)
        assert follower.wait_for_events("o1", 1, 0.05) is False  # listening
        _end_connections(pg_url, name)
        began = time.monotonic()
        assert follower.wait_for_events("o1", 1, 0.5) is False
        assert time.monotonic() - began >= 0.45
        woke: list[float] = []

        def wait() -> None:
            if follower.wait_for_events("o1", 1, 10.0):
                woke.append(time.monotonic())

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.2)
        writer.append("o1", ev(2, "note", "offered", "offered"), state="offered")
        written = time.monotonic()
        waiter.join(10)
        assert woke and woke[0] - written < 1.0


@pytest.mark.spec("GW-7", "GW-20")
def test_a_nul_in_a_call_is_refused_alone_and_one_in_a_result_is_kept_as_ufffd(
        pg_url: str) -> None:
    """PostgreSQL keeps no U+0000. A call whose arguments hold one used to fail inside a
    group commit, with every other reservation waiting in it (another worker's calls);
    an upstream answer holding one failed its outcome's group too, leaving calls that ran
    pending. Now such a call alone is refused (nothing recorded, so nothing is sent), and
    an answer's NUL is kept as U+FFFD, its outcome recorded."""
    with PostgresStore(pg_url) as store:
        create(store)
        assert reserved(reserve(store)).ref == "srv/read#1"
        results: dict[str, Reservation | BaseException] = {}

        def run(name: str, arguments: dict[str, Any]) -> None:
            try:
                results[name] = store.reserve_call(
                    "o1", attempt=1, tool="srv/read", arguments=arguments, pass_jti=None,
                    usd=0.0, started_at=T0, scopes=[])
            except AWLError as exc:
                results[name] = exc

        rest = [threading.Thread(target=run, args=(f"ok{i}", {"x": "fine\\u0000"}))
                for i in range(3)]
        rest.append(threading.Thread(target=run, args=("nul", {"x": "a\u0000b"})))
        # the first waits for the row; the rest join one group
        in_one_group(pg_url, threading.Thread(target=run, args=("first", {"x": 1})), rest)
        nul = results.pop("nul")
        assert isinstance(nul, AWLError) and nul.code == "BAD_REQUEST"
        assert "U+0000 (NUL)" in nul.message and "nothing was recorded or sent" in nul.message
        assert all(isinstance(r, Reserved) for r in results.values()), results
        calls = store.calls("o1")
        assert len(calls) == 5  # the first call and the four that fit, none with a NUL
        assert [c.arguments for c in calls[2:]] == [{"x": "fine\\u0000"}] * 3
        for i, call in enumerate(calls[1:]):
            store.finish_call("o1", call.ref, outcome="ok", ended_at=T0, error=None,
                              result={"content": [{"type": "text", "text": f"r{i}\u0000!"}]})
        kept = [c.result for c in store.calls("o1")[1:]]
        assert kept == [{"content": [{"type": "text", "text": f"r{i}\ufffd!"}]}
                        for i in range(4)]
        # A plain escape that only looks like one (a backslash, then u0000) is kept as is.
        assert calls[2].arguments["x"].endswith("\\u0000")


@pytest.mark.spec("CM-6")
def test_an_effect_whose_answer_holds_a_nul_is_recorded_committed(pg_url: str) -> None:
    """A committed effect whose upstream answer held U+0000 could not be recorded on
    PostgreSQL: it stayed dispatching (later unknown) though it ran. Its answer is now kept
    with U+FFFD, the state committed."""
    with PostgresStore(pg_url) as store:
        create(store)
        reserve(store, tool="srv/send", attempt=2)
        ref = "srv/send#1"
        store.set_effect("o1", ref, expect=None, state="held", at=T0)
        store.set_effect("o1", ref, expect=["held"], state="dispatching", count_dispatch=True,
                         at=T0)
        done = store.set_effect("o1", ref, expect=["dispatching"], state="committed",
                                result={"id": "a\u0000b", "n\u0000": 1}, at=T0)
        assert (done.state, done.result) == ("committed", {"id": "a\ufffdb", "n\ufffd": 1})
        assert store.effects("o1") == [done]
