"""``awl gateway`` and ``awl gateway --commit`` on the store ``--store`` or ``AWL_STORE`` names."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from awl.integrations import gateway_command
from awl.store.protocol import Store
from awl.store.sqlite import SQLiteStore
from tests.gateway.commit_support import make_setup
from tests.gateway.gateway_support import ROOT, gateway_client, make_env, text

pytestmark = pytest.mark.slow  # each test starts gateway or committer processes


def _move_desk(home: Path, store: Store, to: Path) -> str:
    """Close the home's SQLite desk and move it out of the home; its URL."""
    assert isinstance(store, SQLiteStore)
    store.close()
    shutil.move(home / "desk.sqlite3", to)
    assert not (home / "desk.sqlite3-wal").exists()
    return f"sqlite:///{to}"


@pytest.mark.spec("BIND-14")
@pytest.mark.parametrize("how", ["--store", "AWL_STORE"])
@pytest.mark.anyio
async def test_the_gateway_serves_and_records_in_the_store_it_is_given(
        tmp_path: Path, how: str) -> None:
    """The gateway finds the order, and records its calls, in the store named by URL."""
    env = make_env(tmp_path)
    url = _move_desk(env.home, env.store, tmp_path / "elsewhere.sqlite3")
    extra = ("--store", url) if how == "--store" else ()
    env_extra = {"AWL_STORE": url} if how == "AWL_STORE" else None
    with anyio.fail_after(90):
        async with gateway_client(env, *extra, env_extra=env_extra) as client:
            answer = await client.call_tool("receiver__deliver", {"to": "ops", "body": "hi"})
            assert not answer.is_error, text(answer)
    with SQLiteStore(tmp_path / "elsewhere.sqlite3") as store:
        assert [c.ref for c in store.calls(env.order_id)] == ["receiver/deliver#1"]
    assert not (env.home / "desk.sqlite3").exists()


@pytest.mark.spec("BIND-14")
@pytest.mark.anyio
async def test_gateway_command_hands_the_store_to_the_gateway_out_of_sight(
        tmp_path: Path) -> None:
    """``gateway_command(store=URL)`` gives the URL in the environment (a password in it
    stays off the command line), and the gateway it starts uses that store."""
    env = make_env(tmp_path)
    url = _move_desk(env.home, env.store, tmp_path / "elsewhere.sqlite3")
    cmd = gateway_command(env.order_id, env.config, home=env.home, store=url)
    assert cmd.env["AWL_STORE"] == url and url not in cmd.args
    params = StdioServerParameters(command=cmd.command, args=cmd.args,
                                   env={**cmd.env, "PYTHONPATH": str(ROOT)}, cwd=str(env.home))
    with anyio.fail_after(90), open(env.home / "gateway.err", "a") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            listed = await client.list_tools()
    assert "receiver__deliver" in [t.name for t in listed.tools]
    assert not (env.home / "desk.sqlite3").exists()


@pytest.mark.spec("BIND-14")
def test_commit_sends_the_approved_effects_of_the_store_it_is_given(tmp_path: Path) -> None:
    """``--commit --store URL`` commits from that store; without it there is no desk in the
    home (the desk moved), and none is made there."""
    setup = make_setup(tmp_path, [("receiver/deliver", {"to": "cfo", "body": "q3"})])
    url = _move_desk(setup.home, setup.store, tmp_path / "elsewhere.sqlite3")
    base = [sys.executable, "-m", "awl", "gateway", "--order", setup.order_id, "--config",
            str(setup.config), "--commit", "--home", str(setup.home), "--json"]
    environ = {**os.environ, "PYTHONPATH": str(ROOT)}
    environ.pop("AWL_STORE", None)
    missing = subprocess.run(base, capture_output=True, text=True, env=environ, timeout=120)
    assert missing.returncode == 1 and "STORE_UNAVAILABLE: there is no desk" in missing.stderr
    assert not (setup.home / "desk.sqlite3").exists()
    done = subprocess.run([*base, "--store", url], capture_output=True, text=True,
                          env=environ, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [e["state"] for e in json.loads(done.stdout)["effects"]] == ["committed"]
    assert list(setup.counts().values()) == [1]
    with SQLiteStore(tmp_path / "elsewhere.sqlite3") as store:
        assert [e.state for e in store.effects(setup.order_id)] == ["committed"]
