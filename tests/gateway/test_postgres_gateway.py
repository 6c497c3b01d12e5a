"""Committers in separate processes sharing one order in PostgreSQL: each effect delivered
once, a killed committer recovered without a manual step. The receiver's own log is the
truth of what was delivered. (Four gateway processes sharing one budget, on SQLite and
PostgreSQL alike: tests/gateway/test_gateway_budget.py.)"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client

from awl.passes import KeyStore, issue_recorded_pass, publish_keys
from awl.store.postgres import PostgresStore
from gateway._commit import commit_sync, lock_name
from gateway._config import load_config
from gateway._serve import open_gateway
from tests.gateway.commit_support import (
    Setup,
    finish,
    kill9,
    make_setup,
    start_committer,
    wait_for,
)
from tests.gateway.gateway_support import WORKER, make_env, text

DELIVER = "receiver/deliver"

pytestmark = pytest.mark.slow


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[PostgresStore]:
    store = PostgresStore(pg_url)
    yield store
    store.close()


def _setup(tmp_path: Path, pg_url: str, effects: int) -> Setup:
    return make_setup(tmp_path, [(DELIVER, {"to": f"r{i}", "body": "q3"})
                                 for i in range(effects)], store_url=pg_url)


@pytest.mark.spec("CM-6", "CM-10")
def test_eight_concurrent_committers_deliver_each_effect_once(tmp_path: Path,
                                                              pg_url: str) -> None:
    """8 ``--commit`` processes on one PostgreSQL order at once: every effect reaches the
    receiver exactly once, and the committers that waited find them committed."""
    setup = _setup(tmp_path, pg_url, 2)
    try:
        setup.control_receiver(delay=0.05)
        racers = [start_committer(setup, lock_wait=90) for _ in range(8)]
        results = [finish(p, timeout=120) for p in racers]
        assert [code for code, _, _ in results] == [0] * 8, results
        assert sorted(out.count("already committed") for _, out, _ in results) == [0] + [2] * 7
        assert setup.counts() == {r: 1 for r in setup.refs}
        assert {s.state for s in setup.states().values()} == {"committed"}
    finally:
        setup.store.close()


@pytest.mark.spec("CM-6", "CM-8", "CM-10")
def test_a_committer_killed_after_its_dispatching_mark_is_taken_over_at_once(
        tmp_path: Path, pg_url: str) -> None:
    """kill -9 right after the durable mark, before the send: the next committer takes the
    lock at once (no lease to wait out), records unknown, and the receiver never got it."""
    setup = _setup(tmp_path, pg_url, 2)
    try:
        marker = tmp_path / "dispatching.marker"
        proc = start_committer(setup, pause=(marker, setup.refs[1]))
        wait_for(marker.exists, timeout=60, what="the dispatching marker")
        assert setup.states()[setup.refs[1]].state == "dispatching"
        held = setup.store.get_lock(lock_name(setup.order_id))
        assert held is not None and held.pid == proc.pid
        kill9(proc)
        summary = commit_sync(setup.order_id, store=setup.store,
                              pool_or_config=load_config(setup.config), lock_wait=0)
        assert summary.recovered == (setup.refs[1],)
        states = setup.states()
        assert (states[setup.refs[0]].state, states[setup.refs[1]].state) == (
            "committed", "unknown")
        assert setup.counts() == {setup.refs[0]: 1}
        commit_sync(setup.order_id, store=setup.store,
                    pool_or_config=load_config(setup.config), lock_wait=0)
        assert setup.counts() == {setup.refs[0]: 1}
        assert setup.states()[setup.refs[1]].dispatches == 1
    finally:
        setup.store.close()


@pytest.mark.spec("DP-13")
@pytest.mark.anyio
async def test_a_gateway_on_another_host_verifies_with_the_published_keys(
        tmp_path: Path, pg_store: PostgresStore) -> None:
    """A gateway whose home holds no keys (another host) verifies the worker's pass with
    the public keys the desk published in the store, makes no key of its own, and refuses
    the pass from the next call on once the desk retires its key."""
    env = make_env(tmp_path, staged=[], store=pg_store)
    desk_keys = KeyStore(env.home)
    token = issue_recorded_pass(pg_store, env.order_id, keys=desk_keys, subject=WORKER)
    assert pg_store.published_keys() == desk_keys.jwks()
    far = tmp_path / "far"
    far.mkdir()
    with anyio.fail_after(60), open(os.devnull, "w") as quiet:
        async with (open_gateway(env.order_id, env.config, store=pg_store, home=far,
                                 pass_token=token, errlog=quiet) as gw,
                    Client(gw.server) as client):
            await gw.pool.wait_started(60)
            first = await client.call_tool("receiver__deliver", {"to": "a"})
            old = desk_keys.current_kid
            desk_keys.rotate()
            desk_keys.retire(old)
            publish_keys(pg_store, desk_keys)
            second = await client.call_tool("receiver__deliver", {"to": "b"})
    assert not first.is_error, text(first)
    assert second.is_error
    assert len(env.deliveries()) == 1
    assert KeyStore(far).key_files() == frozenset() and not (far / "keys").exists()
