"""The SQLite desk under what an operator's machine does to it: a damaged page, a full disk,
another process holding the file locked, a desk file or folder this user may not write.

Each failure is one AWLError naming the desk and what to do (never a raw ``sqlite3`` error),
nothing is half-written, and nothing waits past the store's timeout. Real files and real
processes throughout: the disk limit is RLIMIT_FSIZE in a child process, the lock is another
process's open transaction, and the read-only cases run their child as another user (with a
Python that user can reach, tests/other_user.py) when the tests run as root (root may write
anything).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from awl import Desk
from awl.documents.errors import AWLError, Conflict, StoreUnavailable
from awl.store.sqlite import SQLiteStore
from tests.awl.desk_support import MANAGER, order_fields
from tests.other_user import (
    OtherUser,
    ReachablePython,
    other_user,
    reachable_folder,
    reachable_python,
)

ROOT = Path(__file__).resolve().parents[2]


def _desk(path: Path, orders: int) -> list[str]:
    with SQLiteStore(path) as store:
        desk = Desk(store)
        return [desk.create(order_fields(goal=f"order {i} " + "x" * 400), MANAGER).id
                for i in range(orders)]


def _integrity(path: Path) -> tuple[str, int]:
    conn = sqlite3.connect(path)
    try:
        ok = conn.execute("PRAGMA integrity_check").fetchone()[0]
        count = conn.execute("SELECT COUNT(*) FROM orders").fetchone()[0]
    finally:
        conn.close()
    return str(ok), int(count)


def _child(code: str, *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh Python (this checkout importable), as this user."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("AWL_STORE", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=str(ROOT))


@dataclass(frozen=True)
class Unprivileged:
    """Who a read-only case runs its child as when the tests run as root (to whom a read-only
    file is writable): another user, with a Python that user can reach wherever the clone
    lives (a clone in a folder only root may enter once failed both cases)."""

    user: OtherUser
    python: ReachablePython


@pytest.fixture(scope="module")
def unprivileged() -> Iterator[Unprivileged | None]:
    if os.geteuid() != 0:
        yield None
        return
    user = other_user()
    folder = reachable_folder("awl-ro-python-")
    try:
        yield Unprivileged(user, reachable_python(user, folder / "python"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_damaged_page_is_one_line_naming_the_desk_for_reads_and_writes(
        tmp_path: Path) -> None:
    """A page of the desk overwritten with garbage: every read or write that meets it is
    StoreUnavailable saying the desk is damaged and to restore it, never sqlite3's
    DatabaseError; the writes that fail leave the file as it was."""
    path = tmp_path / "desk.sqlite3"
    ids = _desk(path, 60)
    with SQLiteStore(path) as store:
        store.checkpoint()
    data = path.read_bytes()
    page = data.index(b'"goal":"order 30 ') // 4096  # a page of the orders' rows
    with path.open("r+b") as file:
        file.seek(page * 4096 + 8)
        file.write(b"\xa5" * 4000)
    with SQLiteStore(path) as store:
        failures: list[AWLError] = []
        damaged: list[str] = []
        for order_id in ids:
            try:
                store.load(order_id)
            except AWLError as exc:
                failures.append(exc)
                damaged.append(order_id)
        assert damaged
        with pytest.raises(AWLError) as writing:
            Desk(store).accept(damaged[0], "agent:writer")
        failures.append(writing.value)
    for failure in failures:
        assert isinstance(failure, StoreUnavailable)
        assert str(path) in failure.message and "damaged" in failure.message
        assert "restore" in failure.message and "\n" not in failure.message


def test_a_full_disk_fails_the_write_in_one_line_and_leaves_the_desk_whole(
        tmp_path: Path) -> None:
    """A file-size limit (RLIMIT_FSIZE, as a full disk) stops a write half way: the process
    gets StoreUnavailable saying the disk refused, nothing else; the desk then passes
    integrity_check, holds every order that was acknowledged and nothing else, and takes
    writes again."""
    path = tmp_path / "desk.sqlite3"
    _desk(path, 3)
    code = f"""
import resource
from awl import Desk
from awl.documents.errors import AWLError
from awl.store.sqlite import SQLiteStore
from tests.awl.desk_support import MANAGER, order_fields
store = SQLiteStore({str(path)!r})
desk = Desk(store)
limit = {path.stat().st_size + 200_000}
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
made = 0
try:
    for _ in range(1000):
        desk.create(order_fields(goal="y" * 5000), MANAGER)
        made += 1
except AWLError as exc:
    print(made, type(exc).__name__, exc.message, sep="|")
"""
    done = _child(code)
    assert done.returncode == 0, done.stderr
    made, kind, message = done.stdout.strip().split("|")
    assert kind == "StoreUnavailable", done.stdout
    assert str(path) in message and "disk" in message and "retry" in message
    assert int(made) > 0
    assert _integrity(path) == ("ok", 3 + int(made))
    with SQLiteStore(path) as store:
        assert len(store.list_orders(limit=None)) == 3 + int(made)
        Desk(store).create(order_fields(), MANAGER)


HOLD = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
if sys.argv[2] == "exclusive":
    conn.execute("PRAGMA locking_mode = EXCLUSIVE")
    conn.execute("BEGIN EXCLUSIVE")
else:
    conn.execute("BEGIN IMMEDIATE")
conn.execute("INSERT INTO awl_schema (version) VALUES (0)")
print("held", flush=True)
time.sleep(120)
"""


def _holder(path: Path, how: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), how],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _stop(holder: subprocess.Popen[str]) -> None:
    holder.kill()
    holder.wait()
    if holder.stdout is not None:
        holder.stdout.close()


def test_a_desk_opens_and_reads_at_once_while_another_process_holds_its_write_lock(
        tmp_path: Path) -> None:
    """Another process sits in a write transaction: a store opens and reads at once (WAL
    readers never wait; opening used to take the write lock and fail after the timeout
    as if the file were not a desk), and a write waits the store's timeout, then is one
    Conflict naming the desk. The holder's write never lands."""
    path = tmp_path / "desk.sqlite3"
    ids = _desk(path, 2)
    holder = _holder(path, "immediate")
    try:
        began = time.monotonic()
        with SQLiteStore(path, timeout=1.5) as store:
            opened = time.monotonic() - began
            assert [r.order.id for r in store.list_orders()] == ids[::-1]
            began = time.monotonic()
            with pytest.raises(Conflict) as busy:
                Desk(store).create(order_fields(), MANAGER)
            waited = time.monotonic() - began
    finally:
        _stop(holder)
    assert opened < 1.0, opened
    assert 1.4 < waited < 15, waited
    assert str(path) in busy.value.message and "nothing was written" in busy.value.message
    assert _integrity(path) == ("ok", 2)


def test_a_process_holding_the_desk_exclusively_fails_the_open_in_bounded_time(
        tmp_path: Path) -> None:
    """A tool holding the file in exclusive locking mode keeps even readers out: the open
    gives up after the store's timeout, saying another process holds it locked."""
    path = tmp_path / "desk.sqlite3"
    _desk(path, 1)
    holder = _holder(path, "exclusive")
    try:
        began = time.monotonic()
        with pytest.raises(StoreUnavailable) as refused:
            SQLiteStore(path, timeout=1.0)
        waited = time.monotonic() - began
    finally:
        _stop(holder)
    assert waited < 15, waited
    assert "another process held it locked" in refused.value.message
    assert "not a desk" not in refused.value.message and "\n" not in refused.value.message


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A fresh folder every user may enter (pytest's own are its owner's only), removed
    after the test."""
    folder = Path(tempfile.mkdtemp(prefix="awl-ro-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        for item in folder.rglob("*"):
            if item.is_dir():
                item.chmod(0o755)
        shutil.rmtree(folder, ignore_errors=True)


READ_ONLY_WRITE = """
import sys
from awl import Desk
from awl.documents.errors import AWLError
from awl.store.sqlite import SQLiteStore
try:
    store = SQLiteStore(sys.argv[1])
    print("read", len(store.list_orders(limit=None)), flush=True)
    Desk(store).create(ORDER, MANAGER)
    print("wrote", len(store.list_orders(limit=None)))
except AWLError as exc:
    print(type(exc).__name__, exc.message, sep="|")
"""


def _as_user(path: Path, who: Unprivileged | None) -> subprocess.CompletedProcess[str]:
    """READ_ONLY_WRITE on ``path``, as ``who`` when given, else as this user."""
    code = (READ_ONLY_WRITE.replace("sys.argv[1]", repr(str(path)))
            .replace("ORDER", repr(order_fields())).replace("MANAGER", repr(MANAGER)))
    if who is None:
        return _child(code)
    return who.user.run([*who.python.command, "-c", code], env=who.python.env,
                        cwd=path.parent.parent, timeout=60)


def test_a_read_only_desk_file_reads_and_refuses_writes_in_one_line(
        reachable: Path, unprivileged: Unprivileged | None) -> None:
    """A desk file this user may only read: it opens and reads; a write is StoreUnavailable
    saying what to make writable (it was sqlite3's raw 'attempt to write a readonly
    database'), and nothing is written. Made writable again, it takes the write, although
    the read-only process left its -shm file read-only."""
    user = unprivileged
    folder = reachable / "desk"
    folder.mkdir()
    path = folder / "desk.sqlite3"
    _desk(path, 2)
    if user is not None:
        for item in (folder, *folder.iterdir()):
            os.chown(item, user.user.uid, user.user.gid)
    path.chmod(0o400)
    done = _as_user(path, user)
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "read 2", done.stdout + done.stderr
    kind, message = lines[1].split("|")
    assert kind == "StoreUnavailable" and str(path) in message
    assert "may not write" in message and "nothing was written" in message
    assert _integrity(path) == ("ok", 2)
    path.chmod(0o600)
    again = _as_user(path, user)
    assert again.stdout.strip().splitlines() == ["read 2", "wrote 3"], again.stdout + again.stderr


def test_a_desk_in_a_read_only_folder_is_one_line_at_open(
        reachable: Path, unprivileged: Unprivileged | None) -> None:
    """A folder this user may not write (no -wal or -shm can be made): the open is
    StoreUnavailable naming the desk, nothing is made in the folder."""
    user = unprivileged
    folder = reachable / "desk"
    folder.mkdir()
    path = folder / "desk.sqlite3"
    _desk(path, 1)
    if user is not None:
        for item in (folder, *folder.iterdir()):
            os.chown(item, user.user.uid, user.user.gid)
    before = sorted(p.name for p in folder.iterdir())
    folder.chmod(0o555)
    try:
        done = _as_user(path, user)
    finally:
        folder.chmod(0o755)
    kind, message = done.stdout.strip().split("|")
    assert kind == "StoreUnavailable", done.stdout + done.stderr
    assert message.startswith(f"cannot open the desk {path} ")
    assert sorted(p.name for p in folder.iterdir()) == before
