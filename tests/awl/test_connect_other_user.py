"""The deployment that keeps a worker with a shell out of the desk (SPEC BIND-30, BIND-32).

The desk, its keys, the gateway's configuration and a store credential live in a folder
only the desk's user (root here, as in CI) can enter; ``awl gateway --http`` serves the
order on 127.0.0.1 as that user. The worker runs as another OS user (``awl-worker``, made
by the test) with nothing but its pass file, and reaches the gateway only through ``awl
connect``. The test proves both halves with real processes: every attempt of the worker's
on the desk's files and on the gateway process fails and changes nothing, and the worker
still lists, calls a real upstream (which logs what reaches it), has a staged call held
and never delivered, and submits its report through its desk tools.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from awl.passes import KeyStore, issue_recorded_pass
from tests.connect_support import ROOT, connect_command, http_gateway
from tests.gateway.gateway_support import MANAGER, WORKER, Env, make_env
from tests.node_support import inspector
from tests.other_user import OtherUser, ReachablePython, other_user, reachable_folder
from tests.other_user import reachable_python as make_python
from tests.servers.receiver import read_log

pytestmark = [pytest.mark.slow]

PLANTED = "planted-store-password"
"""A store password the desk's gateway has in its environment and its service folder."""

ATTACKS = r"""
import json, os, sqlite3, subprocess, sys
plan = json.load(open(sys.argv[1]))

def attempt(action):
    try:
        action()
        return "done"
    except Exception as exc:
        return type(exc).__name__

def read(path):
    with open(path, "rb") as f:
        f.read(1)

def append(path):
    with open(path, "ab") as f:
        f.write(b"x")

def plant(folder):
    with open(os.path.join(folder, "planted"), "xb") as f:
        f.write(b"x")

def query(path):
    sqlite3.connect(f"file:{path}?mode=ro", uri=True).execute(
        "select count(*) from sqlite_master").fetchall()

found = {"read": {p: attempt(lambda p=p: read(p)) for p in plan["read"]},
         "write": {p: attempt(lambda p=p: append(p)) for p in plan["read"]},
         "plant": {p: attempt(lambda p=p: plant(p)) for p in plan["folders"]},
         "list": {p: attempt(lambda p=p: os.listdir(p)) for p in plan["folders"]},
         "sqlite": attempt(lambda: query(plan["desk"])),
         "proc": {p: attempt(lambda p=p: read(p)) for p in plan["proc"]},
         "commands": []}
for command in plan["commands"]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    found["commands"].append([done.returncode, done.stderr.strip()])
print(json.dumps(found))
"""

WORK = r"""
import json, sys
import anyio
from mcp import Client, StdioServerParameters, stdio_client

command, env = json.loads(sys.argv[1]), json.loads(sys.argv[2])

def texts(result):
    return [block.text for block in result.content if block.type == "text"]

async def main():
    params = StdioServerParameters(command=command[0], args=command[1:], env=env)
    with open("bridge.err", "w") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            names = sorted(t.name for t in (await client.list_tools()).tools)
            read = await client.call_tool("spy__read", {"text": "the worker was here"})
            held = await client.call_tool("spy__write", {"to": "everyone"})
            listed = await client.call_tool("awl_list_held_calls", {})
            report = {"status": "done", "result": {"summary": "read it, asked to write"},
                      "evidence": [{"criterion": "c1", "type": "tool_call",
                                    "ref": "spy/read#1"}],
                      "cost": {"tool_calls": 2, "usd": 0},
                      "tools_used": ["spy/read", "spy/write"],
                      "effects": listed.structured_content["effects"]}
            submitted = await client.call_tool("awl_submit_report", {"report": report})
    print(json.dumps({"names": names, "read": texts(read), "held": texts(held),
                      "submitted": submitted.structured_content,
                      "submitted_error": submitted.is_error}))

anyio.run(main)
"""


@pytest.fixture(scope="module")
def worker_user() -> OtherUser:
    return other_user()


@pytest.fixture(scope="module")
def reachable(worker_user: OtherUser) -> Iterator[ReachablePython]:
    """A Python the worker's user can run, in a folder every user may enter."""
    folder = reachable_folder("awl-connect-")
    try:
        yield make_python(worker_user, folder / "python")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _service(folder: Path) -> tuple[Env, Path]:
    """The desk's side: a desk with one working order whose upstream is the spy server,
    its keys, the gateway's config and a store credential, in a folder of its own (0700)."""
    service = folder / "service"
    service.mkdir()
    spy = {"command": sys.executable, "args": [str(ROOT / "tests/gateway/spy_server.py")],
           "env": {"SPY_LOG": str(service / "spy.jsonl")}}
    env = make_env(service, servers={"spy": spy}, tools=["spy/*"], staged=["spy/write"])
    KeyStore(env.home)  # the signing key, made as the desk makes it
    (service / "pgpass").write_text(f"127.0.0.1:5432:awl:awl:{PLANTED}\n")
    service.chmod(0o700)
    return env, service


def _worker_folder(folder: Path, user: OtherUser, env: Env) -> tuple[Path, Path]:
    """The worker's own folder (its user's, 0700) with the pass file the operator gave it."""
    mine = folder / "worker"
    mine.mkdir()
    pass_file = mine / "worker.pass"
    pass_file.write_text(issue_recorded_pass(env.store, env.order_id, keys=KeyStore(env.home),
                                             subject=WORKER) + "\n")
    for path in (mine, pass_file):
        os.chown(path, user.uid, user.gid)
    mine.chmod(0o700)
    pass_file.chmod(0o600)
    return mine, pass_file


def _fingerprint(service: Path, env: Env) -> dict[str, str]:
    """Every file of the desk's side as it stands: the desk by its contents (a checkpoint
    may move bytes between the file and its journal), the spy upstream's log by the tool
    calls that reached it (the gateway's own start-up and keep-alive traffic to it is logged
    too, whenever it happens), the others by their bytes."""
    desk = env.home / "desk.sqlite3"
    with sqlite3.connect(f"file:{desk}?mode=ro", uri=True) as db:
        dumped = "\n".join(db.iterdump())
    prints = {"desk contents": hashlib.sha256(dumped.encode()).hexdigest()}
    for path in sorted(service.rglob("*")):
        if path.name == "spy.jsonl":
            calls = [m for m in read_log(str(path)) if m.get("method") == "tools/call"]
            prints["spy's tool calls"] = json.dumps(calls, sort_keys=True)
        elif path.is_file() and not path.name.startswith("desk.sqlite3"):
            prints[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return prints


@pytest.mark.spec("BIND-30", "BIND-32")
def test_a_worker_under_another_uid_cannot_touch_the_desk_and_works_through_the_bridge(
        worker_user: OtherUser, reachable: ReachablePython) -> None:
    """As another uid, with its pass file only: reading or writing the desk file, the keys,
    the gateway's config and the store credential, listing or planting in their folders,
    opening the desk with SQLite or the CLI (`awl review --approve` as the manager), and
    reading the gateway's environment all fail, and nothing changed. Through `awl connect`
    the same worker lists its tools, its read reaches the upstream, its staged write is held
    and never reaches it, and its report is submitted."""
    python = reachable
    case = reachable_folder("awl-deploy-")
    try:
        env, service = _service(case)
        mine, pass_file = _worker_folder(case, worker_user, env)
        gateway_env = {"PGPASSWORD": PLANTED, "PGPASSFILE": str(service / "pgpass")}
        with http_gateway(env.order_id, env.config, env.home, env=gateway_env,
                          errlog=service / "gateway.err") as (url, gateway):
            targets = [str(p) for p in sorted(service.rglob("*")) if p.is_file()]
            folders = [str(service), str(env.home), str(env.home / "keys")]
            awl = [*python.command, "-m", "awl"]
            plan = {"read": targets, "folders": folders,
                    "desk": str(env.home / "desk.sqlite3"),
                    "proc": [f"/proc/{gateway.pid}/environ", f"/proc/{gateway.pid}/mem"],
                    "commands": [
                        [*awl, "order", "list", "--home", str(env.home)],
                        [*awl, "review", env.order_id, "--approve", "--as", MANAGER,
                         "--home", str(env.home)]]}
            for name, text in (("attacks.py", ATTACKS), ("work.py", WORK),
                               ("plan.json", json.dumps(plan))):
                (mine / name).write_text(text)
                os.chown(mine / name, worker_user.uid, worker_user.gid)
            worker_env = {**python.env, "HOME": str(mine)}
            before = _fingerprint(service, env)
            attacked = worker_user.run([*python.command, "attacks.py", "plan.json"],
                                       env=worker_env, cwd=mine)
            after = _fingerprint(service, env)
            assert attacked.returncode == 0, attacked.stderr
            found = json.loads(attacked.stdout)

            bridge_env = {**python.env, "HOME": str(mine)}
            worked = worker_user.run(
                [*python.command, "work.py",
                 json.dumps(list(connect_command(url, pass_file, python=python.command[0]))),
                 json.dumps(bridge_env)], env=worker_env, cwd=mine)
            assert worked.returncode == 0, worked.stderr + (mine / "bridge.err").read_text()
            work = json.loads(worked.stdout)
        reached = [m for m in read_log(str(service / "spy.jsonl"))
                   if m.get("method") == "tools/call"]
        left = sorted(p.name for p in mine.iterdir())  # no desk home, nothing else made
    finally:
        shutil.rmtree(case, ignore_errors=True)

    # Nothing of the desk's side could be read, written, listed, planted or opened.
    assert set(found["read"]) == set(targets) and len(targets) >= 5, targets
    assert set(found["read"].values()) == {"PermissionError"}, found["read"]
    assert set(found["write"].values()) == {"PermissionError"}, found["write"]
    assert set(found["plant"].values()) == {"PermissionError"}, found["plant"]
    assert set(found["list"].values()) == {"PermissionError"}, found["list"]
    assert found["sqlite"] == "OperationalError"
    assert set(found["proc"].values()) == {"PermissionError"}, found["proc"]
    for code, said in found["commands"]:
        assert code != 0 and "Traceback" not in said and said.count("\n") == 0, said
    assert after == before
    assert PLANTED not in attacked.stdout

    # Through the bridge the worker does its work, and only what the pass allows.
    assert {"spy__read", "spy__write", "awl_submit_report"} <= set(work["names"])
    assert work["read"] == ["the worker was here"]
    assert work["held"][0] == "pending:spy/write#2"
    assert not work["submitted_error"] and work["submitted"]["state"] == "submitted"
    assert [m["params"]["name"] for m in reached] == ["read"]
    assert reached[0]["params"]["arguments"] == {"text": "the worker was here"}
    records = env.calls()
    assert [(r.ref, r.outcome) for r in records] == [("spy/read#1", "ok"),
                                                     ("spy/write#2", "held")]
    assert all(r.pass_jti is not None for r in records)  # under the pass, not as the worker
    assert left == ["attacks.py", "bridge.err", "plan.json", "work.py", "worker.pass"]
    assert env.view().state == "submitted"  # the manager's approval never came from it


@pytest.mark.spec("BIND-30")
def test_the_typescript_client_lists_tools_through_the_bridge(tmp_path: Path) -> None:
    """The MCP Inspector CLI (the TypeScript SDK's client) starts `awl connect` as its
    stdio server and lists the order's tools from the gateway behind it."""
    spy = {"command": sys.executable, "args": [str(ROOT / "tests/gateway/spy_server.py")],
           "env": {"SPY_LOG": str(tmp_path / "spy.jsonl")}}
    env = make_env(tmp_path, servers={"spy": spy}, tools=["spy/*"], staged=["spy/write"])
    pass_file = tmp_path / "worker.pass"
    pass_file.write_text(issue_recorded_pass(env.store, env.order_id, keys=KeyStore(env.home),
                                             subject=WORKER))
    with http_gateway(env.order_id, env.config, env.home) as (url, _):
        listed: Any = inspector(connect_command(url, pass_file), "tools/list",
                                env={"PYTHONPATH": str(ROOT)})
    names = {tool["name"] for tool in listed["tools"]}
    assert {"spy__read", "spy__write", "awl_get_order", "awl_submit_report"} <= names
