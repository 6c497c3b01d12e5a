"""The integrations used carelessly: each mistake is one clear error at once, before a
gateway starts or a wait begins, and nothing is made or changed on the desk.

Before these checks a framework developer saw ``MCPError: Connection closed`` for an
unknown order, a missing config or a mistyped home (where the gateway also made a new,
empty desk), and a wait for an attempt that never had a report slept out its whole timeout.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from awl import BadRequest, Desk, Forbidden, NotFound, SQLiteStore, StoreUnavailable
from awl.integrations import Attempt, draft_report, gateway_command, wait_for_review, work_order
from tests.awl.desk_support import MANAGER, WORKER, order_fields


@pytest.fixture
def desk(tmp_path: Path) -> Any:
    home = tmp_path / "home"
    home.mkdir()
    store = SQLiteStore(home / "desk.sqlite3")
    yield Desk(store)
    store.close()


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "upstream.json"
    path.write_text(json.dumps({"mcpServers": {"mail": {"command": "true"}}}), encoding="utf-8")
    return path


def _working(desk: Desk) -> str:
    order_id = desk.create(order_fields(), MANAGER).id
    desk.accept(order_id, WORKER)
    desk.start(order_id, WORKER)
    return order_id


def _submitted(desk: Desk) -> str:
    order_id = _working(desk)
    draft = draft_report(desk, order_id)
    desk.report(order_id, WORKER, draft.report(summary="s", evidence=[
        {"criterion": c, "type": "artifact", "ref": "NOTES.md"} for c in ("c1", "c2")]))
    return order_id


def test_the_gateway_command_names_each_mistake_before_anything_starts(
        tmp_path: Path, desk: Desk) -> None:
    """Wrong types, a missing or broken config, a missing home or pass file, and an order
    the desk does not have: each one error naming it; the command line only when all is
    well; a mistyped home is not made."""
    home, config = tmp_path / "home", _config(tmp_path)
    order_id = _working(desk)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json", encoding="utf-8")
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"order_id": 123}, BadRequest, "order_id must be"),
        ({"order_id": ""}, BadRequest, "order_id must be"),
        ({"config": None}, BadRequest, "config must be a path"),
        ({"config": tmp_path / "nope.json"}, BadRequest, "No such file"),
        ({"config": broken}, BadRequest, "not valid JSON"),
        ({"home": tmp_path / "hmoe"}, BadRequest, "is not a folder"),
        ({"pass_file": tmp_path / "none.pass"}, BadRequest, "the pass file"),
        ({"order_id": "wo_nope"}, NotFound, f"no order 'wo_nope' on the desk in {home}"),
        ({"home": tmp_path}, StoreUnavailable, "there is no desk file"),
        ({"store": f"sqlite:///{tmp_path / 'other.sqlite3'}"}, StoreUnavailable,
         "there is no desk file"),
    ]
    for change, kind, text in cases:
        args: dict[str, Any] = {"order_id": order_id, "config": config, "home": home, **change}
        with pytest.raises(kind) as raised:
            gateway_command(args.pop("order_id"), args.pop("config"), **args)
        assert text in str(raised.value), (change, raised.value)
        assert "\n" not in str(raised.value)
    assert not (tmp_path / "hmoe").exists() and not (tmp_path / "other.sqlite3").exists()
    assert not (tmp_path / "desk.sqlite3").exists()
    command = gateway_command(order_id, config, home=home)
    assert command.args[command.args.index("--order") + 1] == order_id


def test_the_framework_modules_refuse_an_unknown_order_before_starting_a_gateway(
        tmp_path: Path, desk: Desk) -> None:
    """``gateway_toolset`` and ``gateway_server`` for an order the desk does not have raise
    NotFound at once (it was a closed connection once the agent ran)."""
    from awl.integrations.openai_agents import gateway_server
    from awl.integrations.pydantic_ai import gateway_toolset

    config, home = _config(tmp_path), tmp_path / "home"
    for make in (gateway_toolset, gateway_server):
        with pytest.raises(NotFound, match="no order 'wo_gone' on the desk"):
            make("wo_gone", config, home=home)


@pytest.mark.anyio
async def test_a_wait_with_a_wrong_argument_or_for_an_attempt_never_reported_ends_at_once(
        desk: Desk) -> None:
    """A timeout that is not a number of seconds, an attempt that is not one, or one
    beyond the order's: BadRequest at once (an attempt never reported waited out its whole
    timeout, then said the report still waited)."""
    order_id = _submitted(desk)
    bad: list[dict[str, Any]] = [{"timeout": "5"}, {"timeout": math.nan},
                                 {"attempt": "1"}, {"attempt": 0}, {"attempt": True},
                                 {"attempt": 2}]
    began = time.monotonic()
    for kwargs in bad:
        with anyio.fail_after(5), pytest.raises(BadRequest):
            await wait_for_review(desk, order_id, **{"timeout": 30, **kwargs})
    assert time.monotonic() - began < 5
    desk.review(order_id, MANAGER, "approve")
    verdict = await wait_for_review(desk, order_id, attempt=1, timeout=5)
    assert verdict.decision == "approved"


@pytest.mark.anyio
async def test_the_loop_refuses_a_run_that_is_not_async_and_another_worker(
        desk: Desk) -> None:
    """A plain function as ``run`` is BadRequest saying to make it async (it was Python's
    "can't be used in 'await' expression"); a worker the order is not for is Forbidden
    before the agent runs. The order stays as it was either way."""
    order_id = _working(desk)
    ran: list[int] = []

    def plain(attempt: Attempt) -> dict[str, Any]:
        ran.append(attempt.number)
        return {}

    async def agent(attempt: Attempt) -> dict[str, Any]:
        ran.append(attempt.number)
        return {}

    with pytest.raises(BadRequest, match="run must be an async function"):
        await work_order(desk, order_id, WORKER, plain, config={})  # type: ignore[arg-type]
    with pytest.raises(Forbidden, match="run it as its worker"):
        await work_order(desk, order_id, "agent:someone-else", agent, config={})
    assert ran == [1]
    view = desk.get(order_id)
    assert view.state == "working" and view.reports == ()
