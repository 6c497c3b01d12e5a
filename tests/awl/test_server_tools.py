"""The desk server's tools in-process: who may read what, refusals with their codes, passes,
and what an order's end tidies up."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from awl.desk import AsyncDesk
from awl.documents.errors import Conflict
from awl.mcp.errors import ERROR_META
from awl.passes import KeyStore
from awl.server import DeskServer
from awl.store.memory import MemoryStore
from awl.store.protocol import OrderRecord, Store
from tests.awl.server_support import (
    MANAGER,
    OUTSIDER,
    WORKER,
    Desk,
    hold_call,
    order_fields,
)

HELPER = "agent:helper"
ESCALATION = "human:bo"


@asynccontextmanager
async def desks(store: Store, *principals: str, keys: KeyStore | None = None,
                mode: str = "legacy") -> AsyncIterator[list[Desk]]:
    """One in-process connection per principal, all on one desk."""
    desk = AsyncDesk(store)
    async with AsyncExitStack() as stack:
        out = []
        for principal in principals:
            server = DeskServer(desk, principal=principal, keys=keys)
            client = await stack.enter_async_context(Client(server.server, mode=mode))
            out.append(Desk(client))
        yield out


async def _working(m: Desk, w: Desk, **fields: Any) -> str:
    created = await m.call("create_work_order", order=order_fields(**fields))
    oid: str = created["order"]["id"]
    await w.call("accept_work_order", order_id=oid)
    await w.call("start_work_order", order_id=oid)
    return oid


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.spec("BIND-3", "SEC-1")
async def test_only_the_parties_of_an_order_and_of_its_parents_may_read_it() -> None:
    """An outsider is refused every read of an order; the manager of a parent order may
    read the sub-orders split from it."""
    with anyio.fail_after(30):
        async with desks(MemoryStore(), MANAGER, WORKER, OUTSIDER) as (m, w, o):
            oid = await _working(m, w)
            for name, extra in (("get_work_order", {}), ("get_handoff", {}),
                                ("list_effects", {}), ("wait_for_update",
                                                       {"timeout_seconds": 0})):
                error = await o.refused(name, order_id=oid, **extra)
                assert error["code"] == "FORBIDDEN", name
            assert (await o.call("list_work_orders"))["orders"] == []
            parent = (await w.call("get_work_order", order_id=oid))["order"]
            sub = await w.call("create_work_order", order=order_fields(
                to=HELPER, parent_id=oid, tools=["files/read"], staged=[],
                budget={"usd": 1, "tool_calls": 5}, deadline=parent["deadline"]))
            assert sub["your_roles"] == ["manager", "answerer"]
            seen = await m.call("get_work_order", order_id=sub["order"]["id"])
            assert seen["your_roles"] == [] and seen["next_tools"] == []
            assert (await m.call("get_track_record", worker=WORKER))["orders"] == 1


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.spec("BIND-4")
async def test_refusals_are_tool_errors_with_a_code_a_model_can_act_on() -> None:
    """Bad arguments, unknown orders and tools, wrong states and invalid reports come back
    as tool errors whose code and data say what went wrong."""
    with anyio.fail_after(30):
        async with desks(MemoryStore(), MANAGER, WORKER) as (m, w):
            bad = await m.refused("get_work_order", order_id=7)
            assert bad["code"] == "BAD_REQUEST" and "order_id" in bad["message"]
            extra = await m.refused("get_work_order", order_id="x", actor=WORKER)
            assert extra["code"] == "BAD_REQUEST" and "actor" in extra["message"]
            assert (await m.refused("approve_everything"))["code"] == "BAD_REQUEST"
            missing = await m.refused("get_work_order", order_id="wo_nope")
            assert missing["code"] == "NOT_FOUND"
            too_long = await m.refused("wait_for_update", order_id="x", timeout_seconds=56)
            assert too_long["code"] == "BAD_REQUEST"

            created = await m.call("create_work_order", order=order_fields())
            oid = created["order"]["id"]
            early = await w.refused("start_work_order", order_id=oid)
            assert early["code"] == "INVALID_TRANSITION"
            assert (early["state"], early["action"]) == ("offered", "start")
            assert "accept" in early["message"] or "accepted" in early["message"]

            invalid = await m.refused("create_work_order",
                                      order=order_fields(criteria=[{"id": "c", "text": "a"},
                                                                   {"id": "c", "text": "b"}]))
            assert invalid["code"] == "VALIDATION_FAILED"
            assert [(f["rule"], f["path"]) for f in invalid["findings"]] == [
                ("O2", "/criteria/1/id")]

            await w.call("accept_work_order", order_id=oid)
            await w.call("start_work_order", order_id=oid)
            report = {"status": "done", "result": {"summary": "done"}, "evidence": [],
                      "cost": {"usd": 1}, "tools_used": ["web/search"]}
            refused = await w.refused("submit_work_report", order_id=oid, report=report)
            assert refused["code"] == "VALIDATION_FAILED"
            assert {(f["rule"], f["path"]) for f in refused["findings"]} == {
                ("R4", "/evidence"), ("R5", "/tools_used/0"), ("R6", "/cost")}
            review = await m.refused("review_work_report", order_id=oid, decision="rework",
                                     effects=["mail/send#1"])
            assert review["code"] == "BAD_REQUEST"


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.spec("LC-11", "DOC-5")
async def test_progress_takes_a_whole_percent_from_0_to_100() -> None:
    """post_progress declares percent an integer from 0 to 100, refuses a fraction, a boolean
    or a value past 100 as a bad request, and takes 40.0 as 40."""
    with anyio.fail_after(30):
        async with desks(MemoryStore(), MANAGER, WORKER) as (m, w):
            tools = {t.name: t for t in (await w.client.list_tools()).tools}
            percent = tools["post_progress"].input_schema["properties"]["percent"]
            assert percent == {"type": "integer", "minimum": 0, "maximum": 100}
            oid = await _working(m, w)
            for bad in (40.5, True, 101, -1):
                error = await w.refused("post_progress", order_id=oid, note="half", percent=bad)
                assert error["code"] == "BAD_REQUEST" and "percent" in error["message"], bad
            posted = await w.call("post_progress", order_id=oid, note="half", percent=40.0)
            news = await m.call("wait_for_update", order_id=oid, after_seq=posted["seq"] - 1,
                                timeout_seconds=10)
    assert [(e["action"], e["data"]) for e in news["events"]] == [("progress", {"percent": 40})]


@pytest.mark.anyio
@pytest.mark.spec("SEC-1")
async def test_nobody_issues_an_order_to_review_or_answer_themselves() -> None:
    """An order whose worker or escalation contact is its own manager is refused, so no
    connection ever holds both sides of one order."""
    with anyio.fail_after(30):
        async with desks(MemoryStore(), MANAGER) as (m,):
            for fields in ({"to": MANAGER}, {"escalate_to": MANAGER}):
                error = await m.refused("create_work_order", order=order_fields(**fields))
                assert error["code"] == "BAD_REQUEST", fields


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.spec("BIND-3")
async def test_the_escalation_contact_answers_and_nobody_unbound_acts() -> None:
    """The escalation contact finds the question in its queue and answers it; a server
    bound to no principal refuses every call."""
    store = MemoryStore()
    with anyio.fail_after(30):
        async with desks(store, MANAGER, WORKER, ESCALATION) as (m, w, e):
            oid = await _working(m, w, escalate_to=ESCALATION)
            report = {"status": "blocked", "result": {"summary": "stuck"}, "evidence": [],
                      "cost": {"usd": 0, "tool_calls": 0}, "tools_used": [],
                      "questions": ["Which board?"]}
            await w.call("submit_work_report", order_id=oid, report=report)
            queue = await e.call("list_work_orders", role="answerer")
            assert [(o["id"], o["your_roles"]) for o in queue["orders"]] == [
                (oid, ["answerer"])]
            assert (await e.call("answer_question", order_id=oid,
                                 answer="the main one"))["state"] == "working"
        async with Client(DeskServer(store).server) as client:
            result = await client.call_tool("list_work_orders", {})
            assert result.is_error
            assert result.structured_content is None
            assert (result.meta or {})[ERROR_META]["code"] == "FORBIDDEN"


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.spec("BIND-2")
async def test_passes_go_to_the_worker_and_narrow_for_sub_agents(tmp_path: Path) -> None:
    """The worker's pass is issued to the worker; only its holder derives a narrower pass
    from it, a staged tool is never delegated, and a desk without keys issues none."""
    store = MemoryStore()
    keys = KeyStore(tmp_path)
    with anyio.fail_after(30):
        async with desks(store, MANAGER, WORKER, OUTSIDER, keys=keys) as (m, w, o):
            oid = await _working(m, w)
            issued = await m.call("issue_delegation_pass", order_id=oid)
            assert issued["subject"] == WORKER and "parent_jti" not in issued
            token = issued["token"]
            other = await m.refused("issue_delegation_pass", order_id=oid, subject=OUTSIDER)
            assert (other["code"], other["reason"]) == ("FORBIDDEN", "not_worker")
            derived = await w.call("issue_delegation_pass", order_id=oid, parent_token=token,
                                   subject=HELPER, tools=["files/read"],
                                   budget={"usd": 1, "tool_calls": 3},
                                   expires_in_seconds=600)
            assert (derived["parent_jti"], derived["tools"]) == (issued["jti"], ["files/read"])
            staged = await w.refused("issue_delegation_pass", order_id=oid, parent_token=token,
                                     subject=HELPER, tools=["mail/send"])
            assert (staged["code"], staged["reason"]) == ("FORBIDDEN", "P7")
            stolen = await m.refused("issue_delegation_pass", order_id=oid, parent_token=token,
                                     subject=HELPER)
            assert stolen["code"] == "FORBIDDEN"
            outsider = await o.refused("issue_delegation_pass", order_id=oid)
            assert outsider["code"] == "FORBIDDEN"
        async with desks(store, WORKER) as (w,):
            keyless = await w.refused("issue_delegation_pass", order_id=oid)
            assert keyless["code"] == "BAD_REQUEST"


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.spec("BIND-2")
async def test_a_cancelled_order_drops_its_held_calls_and_revokes_its_passes(
        tmp_path: Path) -> None:
    """Cancelling through the server leaves no held call runnable and no pass usable."""
    store = MemoryStore()
    with anyio.fail_after(30):
        async with desks(store, MANAGER, WORKER, keys=KeyStore(tmp_path)) as (m, w):
            oid = await _working(m, w)
            issued = await w.call("issue_delegation_pass", order_id=oid)
            held = hold_call(store, oid, 1, "mail/send", {"to": "board@example.com"})
            cancelled = await m.call("cancel_work_order", order_id=oid, reason="not needed")
            assert cancelled["state"] == "cancelled"
            assert cancelled["seq"] == 5  # create accept start cancel, then the drop
            effects = await w.call("list_effects", order_id=oid)
            assert [(e["ref"], e["state"]) for e in effects["effects"]] == [
                (held.ref, "dropped")]
            assert issued["jti"] in store.revoked()


@pytest.mark.anyio
@pytest.mark.spec("BIND-2")
async def test_waiting_for_news_that_never_comes_times_out_empty() -> None:
    """wait_for_update answers with no events and timed_out once its time runs out."""
    with anyio.fail_after(30):
        async with desks(MemoryStore(), MANAGER) as (m,):
            created = await m.call("create_work_order", order=order_fields())
            news = await m.call("wait_for_update", order_id=created["order"]["id"],
                                after_seq=1, timeout_seconds=0.05)
            assert news == {"order_id": created["order"]["id"], "state": "offered", "seq": 1,
                            "events": [], "timed_out": True}


class _Counting(MemoryStore):
    """A store that counts how often an order is read."""

    loads = 0

    def load(self, order_id: str) -> OrderRecord:
        self.loads += 1
        return super().load(order_id)


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.spec("BIND-2")
async def test_a_long_poll_sleeps_between_reads_and_wakes_on_a_write() -> None:
    """A waiting wait_for_update reads the store a few times a second, not in a busy loop,
    and returns with the news once a write lands."""
    store = _Counting()
    server = DeskServer(store, principal=MANAGER)
    with anyio.fail_after(20):
        async with Client(server.server) as client:
            m = Desk(client)
            oid = (await m.call("create_work_order", order=order_fields()))["order"]["id"]
            before = store.loads
            quiet = await m.call("wait_for_update", order_id=oid, after_seq=1,
                                 timeout_seconds=0.6)
            assert quiet["timed_out"] and store.loads - before < 15
            news: dict[str, Any] = {}

            async def wait() -> None:
                news.update(await m.call("wait_for_update", order_id=oid, after_seq=1,
                                         timeout_seconds=55))

            with anyio.fail_after(5):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(wait)
                    await m.call("cancel_work_order", order_id=oid, reason="changed my mind")
            assert [e["action"] for e in news["events"]] == ["cancel"]


class _Racing(MemoryStore):
    """A store where another writer always got there first."""

    def append(self, order_id: str, event: Any, **kwargs: Any) -> None:
        raise Conflict("someone else wrote first", expected_seq=event.seq - 1,
                       actual_seq=event.seq)


class _Broken(MemoryStore):
    """A store that fails in a way no refusal describes."""

    def load(self, order_id: str) -> OrderRecord:
        raise RuntimeError("disk on fire")


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.spec("BIND-4", "SEC-4")
async def test_lost_races_and_failures_come_back_as_errors_not_crashes() -> None:
    """A write that keeps losing its race is a CONFLICT; an unexpected failure is an error
    result and the server keeps serving."""
    racing = _Racing()
    with anyio.fail_after(30):
        async with desks(racing, MANAGER, WORKER) as (m, w):
            created = await m.call("create_work_order", order=order_fields())
            error = await w.refused("accept_work_order", order_id=created["order"]["id"])
            assert error["code"] == "CONFLICT"
        async with desks(_Broken(), MANAGER) as (m,):
            failed = await m.refused("get_work_order", order_id="wo_1")
            assert failed["code"] == "INTERNAL" and "RuntimeError" in failed["message"]
            assert (await m.call("list_work_orders"))["count"] == 0


@contextmanager
def _listings(store: MemoryStore, asked: list[dict[str, Any]]) -> Iterator[None]:
    """Note in ``asked`` the arguments of every listing the store is asked for."""
    real = store.list_orders

    def spy(**kwargs: Any) -> list[OrderRecord]:
        asked.append(kwargs)
        return real(**kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store, "list_orders", spy)
        yield


@pytest.mark.anyio
@pytest.mark.spec("BIND-18")
async def test_a_deep_page_of_one_side_reads_only_that_page() -> None:
    """Listing as manager (or worker) at an offset asks the store for that page alone, not
    for every order up to it in full; the page is the one the full listing has there."""
    store = MemoryStore()
    asked: list[dict[str, Any]] = []
    async with desks(store, MANAGER, WORKER) as (m, w):
        for _ in range(5):
            await m.call("create_work_order", order=order_fields())
        every = [o["id"] for o in (await m.call("list_work_orders", role="manager"))["orders"]]
        with _listings(store, asked):
            for caller, role in ((m, "manager"), (w, "worker")):
                page = await caller.call("list_work_orders", role=role, limit=2, offset=3)
                assert [o["id"] for o in page["orders"]] == every[3:5]
    assert [(a["limit"], a["offset"]) for a in asked] == [(2, 3), (2, 3)]


@pytest.mark.anyio
@pytest.mark.spec("BIND-18")
async def test_every_role_pages_by_cursor_and_any_asks_the_store_for_its_page() -> None:
    """``before`` (the last order_id of a page) gives the next page for every role, and
    role=any asks the store for its page alone (by party), not every order up to it."""
    store = MemoryStore()
    asked: list[dict[str, Any]] = []
    async with desks(store, MANAGER, WORKER) as (m, w):
        for _ in range(5):
            oid = await _working(m, w)
            await w.call("submit_work_report", order_id=oid, report={
                "status": "blocked", "result": {"summary": "stuck"}, "evidence": [],
                "cost": {"usd": 0, "tool_calls": 0}, "tools_used": [],
                "questions": ["Which quarter?"]})
        every_any = [o["id"] for o in (await m.call("list_work_orders"))["orders"]]
        for caller, role in ((m, "any"), (m, "manager"), (w, "worker"), (m, "answerer")):
            every = [o["id"] for o in (await caller.call(
                "list_work_orders", role=role))["orders"]]
            assert len(every) == 5, role
            pages: list[list[str]] = []
            page = await caller.call("list_work_orders", role=role, limit=2)
            while page["orders"]:
                pages.append([o["id"] for o in page["orders"]])
                if role == "answerer":  # the queue pages by its own cursor (BIND-20)
                    if "next" not in page:
                        break
                    more: dict[str, Any] = {"after": page["next"]}
                else:
                    more = {"before": pages[-1][-1]}
                page = await caller.call("list_work_orders", role=role, limit=2, **more)
            assert pages == [every[:2], every[2:4], every[4:]], role
        with _listings(store, asked):
            page = await m.call("list_work_orders", limit=2, offset=3)
            assert [o["id"] for o in page["orders"]] == every_any[3:5]
    assert [(a["party"], a["limit"], a["offset"]) for a in asked] == [(MANAGER, 2, 3)]


@pytest.mark.anyio
@pytest.mark.spec("BIND-20")
async def test_the_answerer_queue_pages_by_after_and_shows_no_other_manager_s_question(
        ) -> None:
    """role=answerer gives `next` while more questions follow, and `after=next` the page
    after; another manager's question is on no page; a garbled cursor, a cursor for
    another role, `before` or `offset` with role=answerer and limit 0 are refused."""
    store = MemoryStore()
    blocked = {"status": "blocked", "result": {"summary": "stuck"}, "evidence": [],
               "cost": {"usd": 0, "tool_calls": 0}, "tools_used": [], "questions": ["Q?"]}
    with anyio.fail_after(60):
        async with desks(store, MANAGER, WORKER, ESCALATION) as (m, w, e):
            for manager in (m, e, m, m, e, m, m):
                oid = await _working(manager, w)
                await w.call("submit_work_report", order_id=oid, report=blocked)
            whole = (await m.call("list_work_orders", role="answerer", limit=200))
            assert "next" not in whole and whole["count"] == 5
            pages: list[list[str]] = []
            page = await m.call("list_work_orders", role="answerer", limit=2)
            while True:
                pages.append([o["id"] for o in page["orders"]])
                if "next" not in page:
                    break
                page = await m.call("list_work_orders", role="answerer", limit=2,
                                    after=page["next"])
            assert pages == [[o["id"] for o in whole["orders"]][i:i + 2] for i in (0, 2, 4)]
            theirs = {o["id"] for o in (await e.call(
                "list_work_orders", role="answerer"))["orders"]}
            assert len(theirs) == 2 and not theirs & {i for p in pages for i in p}
            cursor = (await m.call("list_work_orders", role="answerer", limit=1))["next"]
            for args in ({"after": "garbled"}, {"before": pages[0][0]}, {"offset": 1}):
                error = await m.refused("list_work_orders", role="answerer", **args)
                assert error["code"] == "BAD_REQUEST", args
                assert "\n" not in error["message"]
            assert (await m.refused("list_work_orders", role="manager", after=cursor))[
                "code"] == "BAD_REQUEST"
            await m.refused("list_work_orders", role="answerer", limit=0)


def _done(summary: str) -> dict[str, Any]:
    return {"status": "done", "result": {"summary": summary}, "tools_used": [],
            "evidence": [{"criterion": "c1", "type": "note", "note": "written"},
                         {"criterion": "c2", "type": "note", "note": "sent"}],
            "cost": {"usd": 1, "tool_calls": 1}}


@pytest.mark.anyio
@pytest.mark.spec("BIND-4", "LC-9")
async def test_a_stale_approval_never_lands_on_a_later_attempt() -> None:
    """The manager's agent reads attempt 1 and decides to approve it; meanwhile another of
    the manager's connections sends it back and the worker submits attempt 2. An approval
    naming the attempt it read is CONFLICT and changes nothing (without one there was no way
    to say what was approved, and it approved attempt 2 unread); naming attempt 2 approves
    it. The library takes the same attempt."""
    store = MemoryStore()
    with anyio.fail_after(30):
        async with desks(store, MANAGER, MANAGER, WORKER) as (reader, other, w):
            oid = await _working(reader, w)
            await w.call("submit_work_report", order_id=oid, report=_done("first"))
            read = await reader.call("get_work_order", order_id=oid)
            assert (read["state"], read["attempt"]) == ("submitted", 1)
            await other.call("review_work_report", order_id=oid, decision="rework",
                             reason="the board wants the appendix")
            await w.call("submit_work_report", order_id=oid, report=_done("second"))
            stale = await reader.refused("review_work_report", order_id=oid,
                                         decision="approve", attempt=read["attempt"])
            assert stale["code"] == "CONFLICT"
            assert "attempt 1" in stale["message"] and "attempt 2" in stale["message"]
            with pytest.raises(Conflict, match="you reviewed attempt 1"):  # the library too
                AsyncDesk(store).desk.review(oid, MANAGER, "approve", attempt=1)
            after = await reader.call("get_work_order", order_id=oid)
            assert (after["state"], after["seq"], after["attempt"]) == ("submitted", 6, 2)
            done = await reader.call("review_work_report", order_id=oid, decision="approve",
                                     attempt=2)
            assert done["state"] == "approved" and done["reviews"][-1]["attempt"] == 2
