"""Several OS processes writing one SQLite desk at once."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from awl.documents.models import Event, WorkOrder
from awl.store.sqlite import SQLiteStore

pytestmark = pytest.mark.slow

T0 = "2030-01-01T00:00:00Z"
PROCESSES = 3

# Each child says it is ready, waits for the go file so that all of them write at the same
# time, then prints one JSON line: what it wrote, and its refused writes by error type.
APPEND_CHILD = r"""
import json, os, random, sys, time
from awl.documents.errors import Conflict
from awl.documents.models import Event
from awl.store.sqlite import SQLiteStore

path, go, name = sys.argv[1:4]
rounds, orders = int(sys.argv[4]), int(sys.argv[5])
store = SQLiteStore(path)
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
rng = random.Random(name)
written, refused = [], {}
for i in range(rounds):
    oid = f"o{rng.randrange(orders)}"
    seq = store.load(oid).seq
    note = f"{name}:{i}"
    event = Event.model_validate({"seq": seq + 1, "at": "2030-01-01T00:00:00Z",
        "actor": "agent:w", "action": "progress", "from": "working", "to": "working",
        "note": note})
    try:
        store.append(oid, event, state="working")
        written.append([oid, note])
    except Exception as exc:
        kind = "Conflict" if isinstance(exc, Conflict) and exc.actual_seq is not None else repr(exc)
        refused[kind] = refused.get(kind, 0) + 1
print(json.dumps({"written": written, "refused": refused}))
"""

RESERVE_CHILD = r"""
import json, os, sys, time
from awl.store.sqlite import SQLiteStore
from awl.store.protocol import OverBudget, Scope

path, go, name, tries = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
store = SQLiteStore(path)
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
got = []
for i in range(tries):
    r = store.reserve_call("o0", attempt=1, tool="srv/read", arguments={"by": name},
        pass_jti=name, usd=0.0, started_at="2030-01-01T00:00:00Z",
        scopes=[Scope(jtis=None, max_calls=20)])
    got.append(r.scope if isinstance(r, OverBudget) else r.record.ref)
print(json.dumps(got))
"""


def _order(order_id: str) -> WorkOrder:
    return WorkOrder.model_validate({
        "spec": "awl/work-order@0.3", "id": order_id, "created_at": T0, "from": "human:m",
        "to": "agent:w", "goal": "g", "criteria": [{"id": "c", "text": "t"}],
        "budget": {"tool_calls": 100}, "deadline": "2030-01-02T00:00:00Z", "tools": ["*"],
    })


def _desk(path: Path, orders: int) -> None:
    with SQLiteStore(path) as store:
        for i in range(orders):
            store.create_order(_order(f"o{i}"), Event.model_validate({
                "seq": 1, "at": T0, "actor": "human:m", "action": "create", "from": None,
                "to": "working"}))


def _run_children(tmp_path: Path, script: str, *args: str) -> list[Any]:
    go = tmp_path / "go"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / "desk.sqlite3"), str(go), f"p{i}",
             *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i in range(PROCESSES)
    ]
    for child in children:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
    go.touch()
    outputs = []
    for child in children:
        out, err = child.communicate(timeout=90)
        assert child.returncode == 0, err
        outputs.append(json.loads(out))
    return outputs


@pytest.mark.spec("LC-2")
def test_concurrent_appends_keep_every_log_whole(tmp_path: Path) -> None:
    """Processes racing on the same orders lose no write and refuse only with Conflict."""
    orders = 2
    _desk(tmp_path / "desk.sqlite3", orders)
    outputs = _run_children(tmp_path, APPEND_CHILD, "300", str(orders))
    written = [tuple(w) for out in outputs for w in out["written"]]
    refusals = Counter[str]()
    for out in outputs:
        refusals.update(out["refused"])
    assert set(refusals) <= {"Conflict"}, refusals
    assert len(written) + refusals["Conflict"] == PROCESSES * 300
    with SQLiteStore(tmp_path / "desk.sqlite3") as store:
        logged = []
        for i in range(orders):
            events = store.events(f"o{i}")
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
            assert store.load(f"o{i}").seq == len(events)
            logged += [(f"o{i}", e.note) for e in events[1:]]
    # Every acknowledged write is in the log exactly once, and nothing else is.
    assert sorted(logged) == sorted(written)
    assert refusals["Conflict"] > 0  # the race was real


def test_reserve_call_is_exact_across_processes(tmp_path: Path) -> None:
    """Processes racing for twenty calls reserve exactly twenty, numbered 1 to 20."""
    _desk(tmp_path / "desk.sqlite3", 1)
    outputs = _run_children(tmp_path, RESERVE_CHILD, "15")
    refs = [r for out in outputs for r in out if r != "order"]
    assert sorted(refs, key=lambda r: int(r.split("#")[1])) == [
        f"srv/read#{n}" for n in range(1, 21)]
    assert sum(out.count("order") for out in outputs) == PROCESSES * 15 - 20
    with SQLiteStore(tmp_path / "desk.sqlite3") as store:
        assert store.usage("o0").tool_calls == 20
        assert len(store.calls("o0")) == 20
