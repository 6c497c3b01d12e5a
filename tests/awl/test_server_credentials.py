"""Credential attacks on the desk MCP server: raw HTTP headers on 127.0.0.1 and the desk's
own tools, each through the door an outsider would use."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx2
import pytest

from awl._sqlite import SQLiteStore
from awl.server import issue_token
from tests.awl.server_support import MANAGER, WORKER
from tests.awl.test_server_http import _HEADERS, _INITIALIZE, desk_over_http


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
