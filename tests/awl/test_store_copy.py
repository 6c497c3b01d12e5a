"""``awl store copy`` and :func:`awl.store.copy.copy_store`: a whole desk, between backends."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from awl.cli import main
from awl.desk.desk import Desk
from awl.desk.notify import webhook_store
from awl.documents.errors import BadRequest
from awl.store.copy import CopyMismatch, compare_stores, copy_store
from awl.store.memory import MemoryStore
from awl.store.protocol import (
    DeliveryAttempt,
    KeyDirectory,
    LockInfo,
    OrderRecord,
    PassRecord,
    Scope,
    Settlement,
    Store,
)
from awl.store.sqlite import SQLiteStore
from tests.awl.desk_support import (
    MANAGER,
    WORKER,
    Clock,
    effect,
    order_fields,
    report_fields,
    reserved,
)

HELPER = "agent:helper"
T = "2030-01-01T09:30:00Z"
ROOT = Path(__file__).resolve().parents[2]


def _hold(store: Store, order_id: str, n: int) -> str:
    made = reserved(store.reserve_call(order_id, attempt=1, tool="mail/send", arguments={"n": n},
                              pass_jti=None, usd=0.0, started_at=T, scopes=()))
    store.hold_call(order_id, made.ref, result={"content": []}, ended_at=T)
    return made.ref


def fill(store: Store) -> dict[str, str]:
    """A desk with something of everything a store holds; the ids of its orders."""
    desk = Desk(store, clock=Clock())
    # Two webhooks, so the orders' events below leave notifications in the outbox.
    hook = desk.add_webhook("https://hooks.example/awl", "submitted,blocked,committed")
    gone = desk.add_webhook("https://old.example/awl", "submitted")
    # An order worked, with calls of every kind, a sub-order, effects and an approval.
    a = desk.create(order_fields(), MANAGER)
    desk.accept(a.id, WORKER)
    desk.start(a.id, WORKER)
    store.save_pass(PassRecord(jti="p-root", order_id=a.id, parent_jti=None,
                               subject=WORKER, exp=1_900_000_000, issued_at=T))
    store.save_pass(PassRecord(jti="p-child", order_id=a.id, parent_jti="p-root",
                               subject=HELPER, exp=1_900_000_000, issued_at=T))
    searched = reserved(store.reserve_call(a.id, attempt=1, tool="filings/search",
                                  arguments={"q": "10-K", "pages": [1, 2]}, pass_jti="p-root",
                                  usd=0.5, started_at="2030-01-01T09:10:00+01:00",
                                  scopes=[Scope(jtis=None, max_calls=40)]))
    store.finish_call(a.id, searched.ref, outcome="ok", ended_at=T, error=None,
                      result={"content": [{"type": "text", "text": "fünf"}], "isError": False})
    store.record_call({"order_id": a.id, "attempt": 1, "tool": "mail/delete", "arguments": {},
                       "outcome": "refused", "error": "AWL_FORBIDDEN: not allowed",
                       "started_at": T, "ended_at": T})
    store.reserve_call(a.id, attempt=1, tool="filings/get", arguments={}, pass_jti="p-child",
                       usd=0.25, started_at=T, scopes=())  # left pending
    first, second = _hold(store, a.id, 4), _hold(store, a.id, 5)
    child = desk.create(order_fields(to=HELPER, parent_id=a.id, tools=["filings/*"],
                                     staged=None, budget={"usd": 1, "tool_calls": 3},
                                     **{"from": WORKER}), WORKER)
    for usd in (0.1, 0.2):
        store.reserve_call(child.id, attempt=1, tool="filings/search", arguments={},
                           pass_jti=None, usd=usd, started_at=T, scopes=())
    desk.report(a.id, WORKER, report_fields(effects=[effect(4), effect(5)],
                                            tools_used=["filings/search",
                                                        "mail/send"]))
    desk.review(a.id, MANAGER, "approve", effects=[first])
    store.set_effect(a.id, first, expect=["held"], state="dispatching", count_dispatch=True,
                     at=T)
    store.set_effect(a.id, first, expect=["dispatching"], state="unknown", error="timed out",
                     at=T)
    store.set_effect(a.id, first, expect=["unknown"], state="unknown", at=T,
                     settlement=Settlement("did_not_happen", "no mail in the outbox", MANAGER,
                                           T))
    store.set_effect(a.id, first, expect=["unknown"], state="dispatching", count_dispatch=True,
                     at=T)
    store.set_effect(a.id, first, expect=["dispatching"], state="committed", at=T,
                     result={"content": [], "isError": False})
    store.set_effect(a.id, second, expect=["held"], state="skipped", at=T)
    # An order sent back once, reported again and left submitted.
    b = desk.create(order_fields(), MANAGER)
    desk.accept(b.id, WORKER)
    desk.start(b.id, WORKER)
    desk.report(b.id, WORKER, report_fields())
    desk.review(b.id, MANAGER, "rework", "cite the figures")
    desk.report(b.id, WORKER, report_fields(status="blocked"))
    desk.answer(b.id, MANAGER, "Q3")
    # One declined, one cancelled.
    c = desk.create(order_fields(), MANAGER)
    desk.decline(c.id, WORKER, "busy")
    d = desk.create(order_fields(), MANAGER)
    desk.cancel(d.id, MANAGER, "not needed")
    store.revoke("p-child", reason="order ended", at=T)
    store.revoke("p-other", reason="leaked", at="2030-01-01T10:00:00Z")
    store.save_token("h" * 64, MANAGER, created_at=T)
    store.save_token("k" * 64, WORKER, created_at="2030-01-01T10:00:00Z")
    # The outbox in every state: one notification delivered, one retried after a failure
    # (still pending), and the removed webhook's pending ones dead.
    outbox = webhook_store(store)
    delivered, retried, *_ = outbox.notifications(webhook_id=hook.id, limit=None)[::-1]
    outbox.record_attempt(delivered.id, DeliveryAttempt(T, 200, None, 12.5),
                          state="delivered", next_at=T)
    outbox.record_attempt(retried.id, DeliveryAttempt(T, 503, "HTTP 503", 40.0),
                          state="pending", next_at="2030-01-01T09:31:00Z")
    desk.remove_webhook(gone.id)
    # A lock: it belongs to a running committer and is not copied.
    assert store.acquire_lock(LockInfo(name=f"commit:{a.id}", holder="x", pid=1, host="h",
                                       lease_until=2e9))
    return {"a": a.id, "child": child.id, "b": b.id, "c": c.id, "d": d.id}


@pytest.mark.spec("BIND-15")
def test_a_copy_between_memory_and_sqlite_reads_back_equal(tmp_path: Path) -> None:
    """Memory to SQLite and back: everything arrives, refs, totals and charges as they were."""
    source = MemoryStore()
    ids = fill(source)
    with SQLiteStore(tmp_path / "copy.sqlite3") as copied:
        counts = copy_store(source, copied)
        assert (counts.orders, counts.reports, counts.reviews, counts.calls) == (5, 3, 2, 7)
        assert (counts.effects, counts.passes, counts.revocations, counts.tokens) == (
            2, 2, 3, 2)
        assert (counts.webhooks, counts.notifications) == (1, 6)
        assert "1 webhooks (6 notifications)" in counts.line()
        assert compare_stores(source, copied) == []
        # The outbox as it stood, ids and attempts kept: no notification was written anew
        # for the events the copy replayed.
        assert copied.notifications(limit=None) == source.notifications(limit=None)
        assert Counter(n.state for n in copied.notifications(limit=None)) == {
            "pending": 3, "dead": 2, "delivered": 1}
        # A few reads spelt out, so the comparison itself is not all there is.
        assert [c.ref for c in copied.calls(ids["a"])] == [
            "filings/search#1", "mail/delete#2", "filings/get#3", "mail/send#4",
            "mail/send#5"]
        assert copied.usage(ids["a"]).tool_calls == 6  # 4 of its own and 2 of its sub-order
        assert copied.usage(ids["a"], frozenset({"p-root"})).usd == 0.5
        committed = copied.effects(ids["a"])[0]
        assert (committed.state, committed.dispatches) == ("committed", 2)
        assert committed.settlement is not None
        assert copied.get_lock(f"commit:{ids['a']}") is None
        back = MemoryStore()
        copy_store(copied, back)
        assert compare_stores(source, back) == []
        # The copy delivers: the retried notification is due again from it under the
        # webhook-id the receiver saw, with the attempt made from the source.
        retried = next(n for n in source.notifications(limit=None) if n.attempts
                       and n.state == "pending")
        due = copied.claim_notifications(now="2030-01-01T09:31:00Z",
                                         lease_until="2030-01-01T09:32:00Z", limit=10)
        assert retried.id in [n.id for n, _ in due]
        assert next(hook for _, hook in due) == source.webhooks()[0]
        assert next(n for n, _ in due if n.id == retried.id).attempts == retried.attempts


def test_the_comparison_finds_every_kind_of_difference(tmp_path: Path) -> None:
    """Each thing the copy carries is compared: changing one in the copy is found."""
    source = MemoryStore()
    ids = fill(source)
    copied = MemoryStore()
    copy_store(source, copied)
    copied.save_token("z" * 64, "human:eve", created_at=T)
    copied.revoke("p-late", reason="x", at=T)
    copied.finish_call(ids["a"], "filings/get#3", outcome="ok", result=None, error=None,
                       ended_at=T)
    copied.save_pass(PassRecord(jti="p-new", order_id=ids["b"], parent_jti=None,
                                subject=WORKER, exp=1, issued_at=T))
    copied.add_webhook(replace(copied.webhooks()[0], id="wh_new"))
    pending = copied.notifications(state="pending", limit=1)[0]
    copied.record_attempt(pending.id, DeliveryAttempt(T, 200, None, 1.0), state="delivered",
                          next_at=T)
    found = compare_stores(source, copied)
    assert found == [f"order {ids['b']}: its passes differ",
                     f"order {ids['a']}: its calls differ",
                     "the revocations differ", "the revoked passes differ",
                     "the desk tokens differ", "the webhooks differ",
                     "the notifications differ"]


@pytest.mark.spec("BIND-15")
def test_a_copy_and_its_comparison_go_page_by_page(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With pages of two orders the copy and the comparison still see every order (five:
    three pages), and an order too many in the copy is found with both counts."""
    monkeypatch.setattr("awl.store.copy.BATCH", 2)
    source = MemoryStore()
    fill(source)
    with SQLiteStore(tmp_path / "copy.sqlite3") as copied:
        assert copy_store(source, copied).orders == 5
        assert compare_stores(source, copied) == []
        desk = Desk(copied, clock=Clock())
        desk.create(order_fields(), MANAGER)
        assert compare_stores(source, copied) == [
            "the orders differ: 5 in the source, 6 in the copy (or listed in another order)"]


class _Paged(MemoryStore):
    """A memory store that records the size of every page of orders read from it, and can
    take an order in while it is being read (``intrude``: after that many pages)."""

    def __init__(self) -> None:
        super().__init__()
        self.limits: list[int | None] = []
        self.intrude: int | None = None

    def list_orders(self, **filters: Any) -> list[OrderRecord]:
        self.limits.append(filters.get("limit", 100))
        if self.intrude is not None and len(self.limits) > self.intrude:
            self.intrude = None
            Desk(self, clock=Clock()).create(order_fields(), MANAGER)
        return super().list_orders(**filters)


@pytest.mark.spec("BIND-15")
def test_a_copy_never_reads_the_source_whole_and_sees_it_change(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                ) -> None:
    """The copy reads its source a page of orders at a time (never every order at once),
    and an order created in the source while the copy reads it is a mismatch, not a copy
    that silently lacks it."""
    monkeypatch.setattr("awl.store.copy.BATCH", 2)
    source = _Paged()
    fill(source)
    source.limits.clear()  # the desk's own listings while it was filled (sub-orders, say)
    with SQLiteStore(tmp_path / "copy.sqlite3") as copied:
        assert copy_store(source, copied).orders == 5
    assert source.limits and all(limit is not None and limit <= 2 for limit in source.limits)
    changing = _Paged()
    fill(changing)
    changing.limits.clear()
    changing.intrude = 3  # once the ids are read, before the orders are
    with SQLiteStore(tmp_path / "second.sqlite3") as second:
        with pytest.raises(CopyMismatch, match="changed while it was being copied"):
            copy_store(changing, second)
        assert second.list_orders(limit=None) == []


@pytest.mark.spec("BIND-15")
def test_a_store_that_holds_anything_is_not_copied_into(tmp_path: Path) -> None:
    """A target with orders, revocations, tokens, webhooks or notifications is refused and
    left as it was, in memory and in SQLite."""
    source = MemoryStore()
    fill(source)
    note = source.notifications(limit=1)[0]
    for i, (seed, held) in enumerate((
            ("order", "orders"), ("revocation", "revocations"), ("token", "tokens"),
            ("webhook", "webhooks"), ("notification", "notifications"))):
        for target in (MemoryStore(), SQLiteStore(tmp_path / f"target-{i}.sqlite3")):
            if seed == "order":
                fill(target)
            elif seed == "revocation":
                target.revoke("j", reason="r", at=T)
            elif seed == "token":
                target.save_token("t" * 64, MANAGER, created_at=T)
            elif seed == "webhook":
                target.add_webhook(source.webhooks()[0])
            else:
                target.restore_notification(note)
            def held_now(store: Any) -> tuple[Any, ...]:
                return (store.list_orders(limit=None), store.revocations(), store.tokens(),
                        store.webhooks(), store.notifications(limit=None))
            before = held_now(target)
            with pytest.raises(BadRequest, match=f"already holds {held}"):
                copy_store(source, target)
            assert held_now(target) == before
            target.close()


class KeyedMemoryStore(MemoryStore):
    """A memory store that also keeps a published key set (as the PostgreSQL store does)."""

    def __init__(self) -> None:
        super().__init__()
        self.jwks: dict[str, Any] | None = None

    def publish_keys(self, jwks: Mapping[str, Any]) -> None:
        self.jwks = json.loads(json.dumps(jwks))

    def published_keys(self) -> dict[str, Any] | None:
        return self.jwks


JWKS = {"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "k1", "x": "abc"}]}


@pytest.mark.spec("BIND-15")
def test_published_keys_go_with_the_copy_where_the_target_keeps_them(tmp_path: Path) -> None:
    """A key set published in the source is copied and compared; a target that keeps none
    is said to, and a target that has one already is refused."""
    source = KeyedMemoryStore()
    fill(source)
    source.publish_keys(JWKS)
    assert isinstance(source, KeyDirectory)
    keyed = KeyedMemoryStore()
    assert copy_store(source, keyed).public_keys == "copied"
    assert keyed.published_keys() == JWKS
    keyed.publish_keys({"keys": []})
    assert compare_stores(source, keyed)[-1] == "the published public keys differ"
    with SQLiteStore(tmp_path / "copy.sqlite3") as plain:
        counts = copy_store(source, plain)
    assert counts.public_keys == "not kept" and "the target keeps none" in counts.line()
    taken = KeyedMemoryStore()
    taken.publish_keys(JWKS)
    with pytest.raises(BadRequest, match="already holds published keys"):
        copy_store(source, taken)
    assert taken.list_orders() == []


# -- through the command ----------------------------------------------------------------------

def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.spec("BIND-15")
def test_awl_store_copy_copies_a_sqlite_desk_and_says_it_verified(tmp_path: Path) -> None:
    """`awl store copy` run as a process: a SQLite desk into a new file, verified."""
    desk_file = tmp_path / "desk.sqlite3"
    with SQLiteStore(desk_file) as source:
        fill(source)
    target = tmp_path / "new" / "copy.sqlite3"
    target.parent.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("AWL_STORE", None)
    done = subprocess.run([sys.executable, "-m", "awl", "store", "copy", "--from",
                           str(desk_file), "--to", f"sqlite:///{target}"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("copied 5 orders (")
    assert "verified: the copy reads back equal to the source" in done.stdout
    with SQLiteStore(desk_file) as source, SQLiteStore(target) as copied:
        assert compare_stores(source, copied) == []
    # Again into the same file: refused in one line, and the file is left as it is.
    before = _digest(target)
    again = subprocess.run([sys.executable, "-m", "awl", "store", "copy", "--from",
                            str(desk_file), "--to", str(target), "--json"],
                           capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 1 and again.stdout == ""
    assert again.stderr.count("\n") == 1 and "already holds orders" in again.stderr
    assert "Traceback" not in again.stderr
    assert _digest(target) == before


def test_awl_store_copy_prints_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json gives the counts and says the copy was verified."""
    with SQLiteStore(tmp_path / "desk.sqlite3") as source:
        fill(source)
    code = main(["store", "copy", "--from", str(tmp_path / "desk.sqlite3"), "--to",
                 str(tmp_path / "copy.sqlite3"), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    assert data["verified"] is True and data["copied"]["orders"] == 5
    assert data["copied"]["tokens"] == 2


def test_awl_store_copy_from_a_missing_desk_creates_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A source that does not exist is one line, and neither file is created."""
    code = main(["store", "copy", "--from", str(tmp_path / "typo.sqlite3"), "--to",
                 str(tmp_path / "copy.sqlite3")])
    _, err = capsys.readouterr()
    assert code == 1 and err.count("\n") == 1
    assert "no desk file at" in err and "typo.sqlite3" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.spec("BIND-15")
def test_awl_store_copy_moves_a_sqlite_desk_to_postgresql_and_back(
        tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """SQLite to PostgreSQL with `awl store copy`, verified, and back into a new SQLite
    file: the desk reads back equal at each step; a second copy into it is refused."""
    from awl.store.postgres import PostgresStore

    desk_file = tmp_path / "desk.sqlite3"
    with SQLiteStore(desk_file) as source:
        ids = fill(source)
    assert main(["store", "copy", "--from", str(desk_file), "--to", pg_url]) == 0
    out, err = capsys.readouterr()
    assert "verified: the copy reads back equal to the source" in out, err
    back = tmp_path / "back.sqlite3"
    assert main(["store", "copy", "--from", pg_url, "--to", str(back)]) == 0
    capsys.readouterr()
    with (SQLiteStore(desk_file) as source, PostgresStore(pg_url) as moved,
          SQLiteStore(back) as returned):
        assert compare_stores(source, moved) == []
        assert compare_stores(source, returned) == []
        assert moved.usage(ids["a"]).tool_calls == 6
    assert main(["store", "copy", "--from", str(desk_file), "--to", pg_url]) == 1
    assert "already holds orders" in capsys.readouterr().err


def test_a_copy_into_postgresql_analyzes_only_its_own_schema(
        pg_url: str, fresh_pg_url: str) -> None:
    """The planner's statistics a copy refreshes are its own desk's: another desk's schema in
    the same database is left alone (a bare ANALYZE locks every table of the database, and
    deadlocked with another desk's migration)."""
    import psycopg

    from awl.store.postgres import PostgresStore

    source = MemoryStore()
    fill(source)
    with PostgresStore(fresh_pg_url):  # another desk, migrated, in the same database
        pass
    with PostgresStore(pg_url) as target:
        copy_store(source, target)

    def analyzed(url: str) -> set[str]:
        with psycopg.connect(url, autocommit=True) as conn:
            return {name for (name,) in conn.execute(
                "SELECT relname FROM pg_stat_user_tables WHERE schemaname = current_schema()"
                " AND last_analyze IS NOT NULL").fetchall()}

    assert {"orders", "events", "outbox", "question_queue"} <= analyzed(pg_url)
    assert analyzed(fresh_pg_url) == set()


@pytest.mark.spec("BIND-15")
def test_postgresql_to_postgresql_carries_the_published_keys(
        pg_url: str, fresh_pg_url: str, tmp_path: Path) -> None:
    """Between two PostgreSQL stores the published key set goes too, and is compared; into
    SQLite, which keeps none, the copy says it did not carry them."""
    from awl.store.postgres import PostgresStore

    with PostgresStore(pg_url) as source, PostgresStore(fresh_pg_url) as target:
        fill(source)
        source.publish_keys(JWKS)
        assert copy_store(source, target).public_keys == "copied"
        assert target.published_keys() == JWKS
        assert compare_stores(source, target) == []
        with SQLiteStore(tmp_path / "plain.sqlite3") as plain:
            assert copy_store(target, plain).public_keys == "not kept"


# -- a copy killed half way -------------------------------------------------------------------

def _copy_process(source: Path, target: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("AWL_STORE", None)
    return subprocess.Popen([sys.executable, "-m", "awl", "store", "copy", "--from",
                             str(source), "--to", target], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _kill_when(copying: subprocess.Popen[str], writing: Any, after: float = 0.0) -> None:
    """``kill -9`` the copy ``after`` seconds once ``writing()`` says it fills its target."""
    deadline = time.monotonic() + 60
    while not writing():
        assert copying.poll() is None, copying.communicate()
        assert time.monotonic() < deadline, "the copy never started writing"
        time.sleep(0.01)
    time.sleep(after)
    assert copying.poll() is None, "the copy ended before it was killed"
    copying.send_signal(signal.SIGKILL)
    copying.communicate(timeout=10)
    assert copying.returncode == -signal.SIGKILL


def _large_desk(tmp_path: Path, orders: int) -> Path:
    from bench.desk import build

    source = tmp_path / "large.sqlite3"
    build(source, orders)
    return source


@pytest.mark.slow
@pytest.mark.spec("BIND-17")
def test_a_copy_killed_half_way_into_sqlite_leaves_it_empty(tmp_path: Path) -> None:
    """`kill -9` of `awl store copy` while it writes a SQLite target: the target holds
    nothing (the copy is one transaction), and a second copy into it succeeds."""
    source = _large_desk(tmp_path, 3000)
    target = tmp_path / "copy.sqlite3"
    wal = tmp_path / "copy.sqlite3-wal"
    copying = _copy_process(source, str(target))
    _kill_when(copying, lambda: wal.exists() and wal.stat().st_size > 2_000_000)
    with SQLiteStore(target) as left:
        assert left.list_orders(limit=1) == [] and left.tokens() == []
    again = _copy_process(source, str(target))
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert out.startswith("copied 3000 orders (") and "verified" in out
    with SQLiteStore(source) as a, SQLiteStore(target) as b:
        assert compare_stores(a, b) == []


@pytest.mark.slow
@pytest.mark.spec("BIND-17")
def test_a_copy_killed_half_way_into_postgresql_leaves_it_empty(
        tmp_path: Path, pg_url: str) -> None:
    """`kill -9` of `awl store copy` while it writes a PostgreSQL target: the server rolls
    the copy's one transaction back, so the target holds nothing and a second copy works."""
    import psycopg

    from awl.store.postgres import PostgresStore

    source = _large_desk(tmp_path, 3000)
    PostgresStore(pg_url).close()  # the schema, so the watcher can find the copy's lock
    with psycopg.connect(pg_url, autocommit=True) as watcher:
        def writing() -> bool:
            return watcher.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_locks AS l JOIN pg_class AS c"
                " ON c.oid = l.relation WHERE c.oid = 'orders'::regclass"
                " AND l.mode = 'ShareRowExclusiveLock' AND l.granted)").fetchone() == (True,)

        copying = _copy_process(source, pg_url)
        _kill_when(copying, writing, after=0.3)
    with PostgresStore(pg_url) as left:
        assert left.list_orders(limit=1) == [] and left.tokens() == []
    again = _copy_process(source, pg_url)
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert out.startswith("copied 3000 orders (") and "verified" in out


def _outbox_desk(path: Path, count: int, body: int) -> SQLiteStore:
    """A SQLite desk whose outbox holds ``count`` notifications of about ``body`` bytes."""
    from awl.store.protocol import Notification, Webhook

    store = SQLiteStore(path)
    hook = Webhook(id="wh_1", url="https://hooks.example/awl", events=("submitted",),
                   secret="whsec_" + "A" * 43, created_at="2030-01-01T00:00:00Z")
    notes = (Notification(id=f"msg_{i:06d}", webhook_id=hook.id, event="submitted",
                          order_id="wo_1", payload={"type": "submitted", "pad": "x" * body},
                          created_at="2030-01-01T00:00:00Z", next_at="2030-01-01T00:00:00Z")
             for i in range(count))
    store.restore([], revocations={}, tokens=[], webhooks=[hook], notifications=notes)
    return store


@pytest.mark.spec("BIND-15", "BIND-17")
def test_a_large_outbox_is_copied_and_compared_a_page_at_a_time(tmp_path: Path) -> None:
    """The copy read every notification at once and compared both outboxes whole: 100,000
    notifications took 1.39 GB. It now reads, writes and compares them a page at a time:
    20,000 notifications of 1 KB (20 MB) took 143 MB at the peak; now a few pages (about
    5 MB) are held at once."""
    import tracemalloc

    source = _outbox_desk(tmp_path / "a.sqlite3", 20_000, 1000)
    target = SQLiteStore(tmp_path / "b.sqlite3")
    try:
        tracemalloc.start()
        counts = copy_store(source, target)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert counts.notifications == 20_000
        assert compare_stores(source, target) == []
        first, last = target.notifications_after(limit=1), target.notifications(limit=1)
        assert (first[0].id, last[0].id) == ("msg_000000", "msg_019999")
        assert peak < 10_000_000, peak
    finally:
        source.close()
        target.close()
