"""Credential attacks on the desk MCP server: raw HTTP headers on 127.0.0.1 and the desk's
own tools, each through the door an outsider would use."""

from __future__ import annotations

import io
import json
from pathlib import Path

import anyio
import httpx2
import pytest

from awl.cli import main
from awl.desk import Desk as SyncDesk
from awl.server import issue_token
from awl.store.memory import MemoryStore
from awl.store.sqlite import SQLiteStore
from tests.awl.server_support import MANAGER, OUTSIDER, WORKER, order_fields
from tests.awl.test_server_http import _HEADERS, _INITIALIZE, desk_over_http
from tests.awl.test_server_tools import _working, desks


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.spec("SEC-7")
async def test_a_second_or_malformed_authorization_header_is_refused_by_the_desk(
        tmp_path: Path) -> None:
    """A desk request with two Authorization headers (whatever their order and scheme), or one
    that is not a single ``Bearer <token>``, gets 401 even when one of them is a good token."""
    store = SQLiteStore(tmp_path / "desk.sqlite3")
    manager, worker = issue_token(store, MANAGER), issue_token(store, WORKER)
    attacks = [
        ["Basic eA==", f"Bearer {manager}"],
        ["Bearer", f"Bearer {manager}"],
        [f"Bearer {manager}", "Token abc"],
        [f"Bearer {worker}", f"Bearer {manager}"],
        [f"Bearer {worker} {manager}"],
        [f"Bearer {worker},Bearer {manager}"],
        [f"Bearer {manager}=="],
    ]
    try:
        with anyio.fail_after(30):
            async with desk_over_http(store) as url, httpx2.AsyncClient(timeout=10) as http:
                codes = []
                for values in attacks:
                    headers = [*_HEADERS.items(), *(("Authorization", v) for v in values)]
                    answer = await http.post(url, json=_INITIALIZE, headers=headers)
                    codes.append(answer.status_code)
                good = await http.post(url, json=_INITIALIZE, headers={
                    **_HEADERS, "Authorization": f"Bearer {manager}"})
    finally:
        store.close()
    assert codes == [401] * len(attacks)
    assert good.status_code == 200


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.spec("SEC-8")
async def test_get_track_record_tells_nobody_about_orders_they_are_not_part_of() -> None:
    """Over the MCP desk: an outsider asking about a worker is refused, a manager sees only
    the orders it issued to that worker, and the worker sees all of its own."""
    other_manager = "human:bo"
    with anyio.fail_after(30):
        async with desks(MemoryStore(), MANAGER, WORKER, OUTSIDER, other_manager) as (
                m, w, o, bo):
            await _working(m, w)
            await _working(bo, w)
            await bo.call("create_work_order", order=order_fields())
            refused = await o.refused("get_track_record", worker=WORKER)
            of_worker_by_worker = await w.refused("get_track_record", worker=MANAGER)
            mine = await m.call("get_track_record", worker=WORKER)
            theirs = await bo.call("get_track_record", worker=WORKER)
            own = await w.call("get_track_record")
    assert refused["code"] == "FORBIDDEN" and of_worker_by_worker["code"] == "FORBIDDEN"
    assert WORKER in refused["message"] and "orders" not in refused
    assert (mine["orders"], theirs["orders"], own["orders"]) == (1, 2, 3)


@pytest.mark.spec("SEC-8")
def test_awl_track_as_an_outsider_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`awl track WORKER --as P` applies the same rule; without --as the operator sees all."""
    store = SQLiteStore(tmp_path / "desk.sqlite3")
    try:
        SyncDesk(store).create(order_fields(), MANAGER)
    finally:
        store.close()
    base = ["track", WORKER, "--home", str(tmp_path), "--json"]
    runs = []
    for extra in (["--as", OUTSIDER], ["--as", MANAGER], []):
        code = main([*base, *extra])
        runs.append((code, *capsys.readouterr()))
    (refused, _, err), (as_manager, out_manager, _), (operator, out_operator, _) = runs
    assert (refused, as_manager, operator) == (1, 0, 0)
    assert err.count("\n") == 1 and "FORBIDDEN" in err
    assert json.loads(out_manager)["orders"] == json.loads(out_operator)["orders"] == 1


@pytest.mark.spec("SEC-11")
def test_awl_token_revoke_reads_the_token_from_stdin(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`awl token revoke --token -` takes the token from stdin, so it never sits in the
    process list; the token is revoked."""
    store = SQLiteStore(tmp_path / "desk.sqlite3")
    try:
        token = issue_token(store, MANAGER)
    finally:
        store.close()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(f"{token}\n".encode())))
    code = main(["token", "revoke", "--token", "-", "--home", str(tmp_path), "--json"])
    capsys.readouterr()
    store = SQLiteStore(tmp_path / "desk.sqlite3")
    try:
        assert code == 0 and store.tokens() == []
    finally:
        store.close()
