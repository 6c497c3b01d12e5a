"""A property of random trees of orders, sub-orders and passes (issue 14, LC-14, LC-15).

Hypothesis draws a root order, then a sequence of steps: split an order into a sub-order
(by its worker or its manager, to anyone, with any tools, staged tools and budget, so most
attempts the desk must refuse), issue a worker's pass or a derived pass for a sub-agent,
and call a tool under an order, with or without a pass. Then each working order reports
its held calls as effects, its manager approves some of them (or all), and the commit runs.

Whatever was drawn:

- no held call is ever sent by the commit unless the manager of every order that stages its
  tool (the order it was held under, and every order above it) approved it, and no call of
  a tool an order above stages is ever forwarded; and
- the calls counted under any order, its own and its sub-orders' at any depth (forwarded
  ones, as the upstream logged them, plus held ones), never exceed its ``tool_calls`` budget,
  and their cost never its ``usd``.

The desk, the store, the gateway's decisions and the commit are the real ones, on a
MemoryStore. The upstream is an in-process stand-in that logs each call it receives: how a
call travels to a server is not under test here (the other gateway tests use real servers).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import anyio
import mcp_types as types
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from awl.desk import Desk
from awl.desk.lineage import ancestors, remaining_of, reports_below
from awl.documents.errors import AWLError
from awl.documents.models import WorkOrder, format_time
from awl.documents.patterns import covered_by_any, matches_any, overlap
from awl.passes import KeyStore, issue_recorded_pass
from awl.store.memory import MemoryStore
from gateway._commit import commit
from gateway._config import load_config
from gateway._gateway import Gateway
from gateway._upstream import UpstreamPool

pytestmark = pytest.mark.slow

MANAGER = "human:m"
PEOPLE = ("human:m", "agent:a", "agent:b", "agent:c", "agent:d")
OTHERS = ("agent:e", "agent:f")
TOOLS = ("up/read", "up/write", "up/send")
PATTERNS = ("up/*", "up/read", "up/write", "up/send")
COSTS = {"read": 0.0, "write": 0.1, "send": 0.25}
CONFIG = load_config({"mcpServers": {"up": {"command": "unused", "costs": COSTS}}})

PROPERTY = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class LoggingUpstream:
    """Answers every call and logs what reached it: (order, ref, tool)."""

    def __init__(self) -> None:
        self.config = CONFIG
        self.log: list[tuple[str, str, str]] = []
        self._tools = {name: types.Tool(name=name.split("/")[1],
                                        input_schema={"type": "object"}) for name in TOOLS}

    async def tools(self, *, refresh: bool = False) -> Mapping[str, types.Tool]:
        return self._tools

    def on_tools_listed(self, listener: Callable[[], Awaitable[None]]) -> None:
        """Its tools never change, so no listener is ever told of a new list."""

    async def wait_started(self, seconds: float) -> None:
        """It is up from the start."""

    async def call(self, server: str, tool: str, arguments: Mapping[str, Any] | None = None,
                   *, meta: Mapping[str, Any] | None = None, timeout: float | None = None,
                   before_send: Callable[[], Awaitable[None]] | None = None,
                   ) -> types.CallToolResult:
        if before_send is not None:
            await before_send()
        meta = dict(meta or {})
        self.log.append((str(meta["awl/order"]), str(meta["awl/ref"]), f"{server}/{tool}"))
        return types.CallToolResult(content=[types.TextContent(type="text", text="ok")])


def draw_budget(rnd: random.Random) -> dict[str, float]:
    return {"tool_calls": rnd.choice([0, 1, 2, 4, 6, 8]), "usd": rnd.choice([0.2, 0.5, 1.0, 2.0])}


def draw_patterns(rnd: random.Random, most: int) -> list[str]:
    return rnd.sample(PATTERNS, k=rnd.randint(0, most))


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> KeyStore:
    """One desk key for every example (signing is what passes need; a key per example would
    only slow the test)."""
    home = Path(tmp_path_factory.mktemp("keys"))
    store = KeyStore(home)
    kid = store.current_kid  # the first key is made on first use
    assert kid in str(store.jwks())
    return store


class World:
    """One drawn tree: the desk, its gateways, and what reached the upstream."""

    def __init__(self, keys: KeyStore) -> None:
        self.now = datetime.now(UTC).replace(microsecond=0)
        self.store = MemoryStore()
        self.desk = Desk(self.store, clock=lambda: self.now)
        self.keys = keys
        self.gateway_upstream = LoggingUpstream()
        self.commit_upstream = LoggingUpstream()
        self.orders: list[str] = []
        self.tokens: dict[str, list[str]] = {}
        self.gateways: dict[str, Gateway] = {}
        self.approved: dict[str, set[str]] = {}  # order -> refs its manager approved

    def order(self, index: int) -> WorkOrder:
        return self.store.load(self.orders[index % len(self.orders)]).order

    def add(self, fields: dict[str, Any], actor: str) -> None:
        try:
            view = self.desk.create(fields, actor)
        except AWLError:
            return  # refused: the desk's rules are what this test exercises
        self.desk.accept(view.id, view.order.to)
        self.desk.start(view.id, view.order.to)
        self.orders.append(view.id)

    def split(self, index: int, by_worker: bool, to: str, tools: list[str],
              staged: list[str], budget: dict[str, float], shape: str) -> None:
        """Try a sub-order: ``raw`` as drawn; ``tidy`` shaped to pass, so that trees grow;
        ``attack`` shaped to pass but for carrying the parent's staged tools (staged, as in
        the issue, or not)."""
        parent = self.order(index)
        creator = parent.to if by_worker else parent.manager
        if shape != "raw":
            tools = [p for p in tools or TOOLS if covered_by_any(parent.tools, p)
                     and not any(overlap(p, s) for s in parent.staged)]
            if shape == "attack":
                tools = [*tools, *parent.staged]
            staged = [p for p in staged if covered_by_any(tools, p)]
            if shape == "attack" and by_worker:
                staged = sorted({*staged, *parent.staged})
            left = remaining_of(parent, self.store.usage(parent.id), self.now,
                                below=reports_below(self.store, parent.id))
            budget = {unit: min(value, left.get(unit, value)) for unit, value in budget.items()}
        self.add({"to": to, "parent_id": parent.id, "goal": "a part", "tools": tools,
                  "staged": staged, "budget": budget, "deadline": parent.deadline,
                  "criteria": [{"id": "c1", "text": "done"}], "from": creator}, creator)

    def issue(self, index: int, derived: bool, tools: list[str]) -> None:
        order = self.order(index)
        try:
            token = issue_recorded_pass(self.store, order.id, keys=self.keys, subject=order.to,
                                        now=self.now)
            if derived:
                token = issue_recorded_pass(self.store, order.id, keys=self.keys,
                                            subject="agent:helper", parent_token=token,
                                            tools=tools or None, now=self.now)
        except AWLError:
            return
        self.tokens.setdefault(order.id, []).append(token)

    async def call(self, index: int, tool: str, which: int) -> None:
        order = self.order(index)
        gateway = self.gateways.get(order.id)
        if gateway is None:
            # A stand-in with the pool's calls these gateways make, not an UpstreamPool.
            pool = cast(UpstreamPool, self.gateway_upstream)
            gateway = Gateway(order.id, store=self.store, pool=pool,
                              jwks=self.keys.jwks(), clock=lambda: self.now)
            await gateway.start()
            self.gateways[order.id] = gateway
        tokens = [None, *self.tokens.get(order.id, [])]
        await gateway.call(tool.replace("/", "__"), {"n": len(self.gateway_upstream.log)},
                           token=tokens[which % len(tokens)])

    async def finish(self, index: int, chosen: list[int]) -> None:
        """The order's worker reports its held calls; its manager approves some; commit."""
        order = self.order(index)
        view = self.desk.get(order.id)
        if view.state != "working":
            return
        calls = self.store.calls(order.id, attempt=view.attempt)
        held = [c for c in calls if c.outcome == "held"]
        used = sorted({c.tool for c in calls if c.outcome in ("ok", "error", "held")})
        self.desk.report(order.id, order.to, {
            "status": "done", "result": {"summary": "done"},
            "evidence": [{"criterion": "c1", "type": "note", "note": "done"}],
            "cost": dict.fromkeys(order.budget.units(), 0), "tools_used": used,
            "effects": [{"ref": c.ref, "tool": c.tool, "arguments": c.arguments} for c in held]})
        refs = sorted({held[i % len(held)].ref for i in chosen} if held else set())
        # No choice drawn approves every effect (the review's default).
        self.desk.review(order.id, order.manager, "approve", effects=refs or None)
        self.approved[order.id] = set(refs) if refs else {c.ref for c in held}
        await commit(order.id, store=self.store, pool_or_config=self.commit_upstream,
                     desk=self.desk, now=lambda: self.now)

    def subtree(self, order_id: str) -> set[str]:
        """The order and every order below it."""
        out = {order_id}
        for other in self.orders:
            above = {a.id for a in ancestors(self.store, self.store.load(other).order)}
            if order_id in above:
                out.add(other)
        return out


@pytest.mark.spec("LC-14", "LC-15", "C5", "C1", "GW-5", "CM-1")
@PROPERTY
@given(seed=st.integers(0, 2**32 - 1))
def test_no_staged_write_escapes_and_no_order_overspends(keys: KeyStore, seed: int) -> None:
    """For any tree the desk accepts and any calls made under it, every effect the commit
    sent was approved by the manager of each order that stages its tool, and no order's
    subtree counted more calls or usd than its budget.

    Each example is played from one seed (a failure names it), which keeps an example to
    a few milliseconds of drawing."""
    rnd = random.Random(seed)
    world = World(keys)
    world.add({"to": "agent:a", "goal": "the job", "criteria": [{"id": "c1", "text": "done"}],
               "tools": ["up/*"], "staged": rnd.sample(["up/write", "up/send"], rnd.randint(0, 2)),
               "budget": draw_budget(rnd),
               "deadline": format_time(world.now + timedelta(hours=2))}, MANAGER)
    assert world.orders, "the root order is valid"

    async def play() -> None:
        for _ in range(rnd.randint(0, 24)):
            # The newest orders more often, so calls reach the deep ones.
            index = max(rnd.randrange(len(world.orders)), rnd.randrange(len(world.orders)))
            kind = rnd.choices(["split", "pass", "call"], weights=[3, 1, 6])[0]
            if kind == "split":
                world.split(index, rnd.random() < 0.7, rnd.choice(PEOPLE + OTHERS),
                            draw_patterns(rnd, 3), draw_patterns(rnd, 2), draw_budget(rnd),
                            rnd.choices(["tidy", "attack", "raw"], weights=[5, 3, 2])[0])
            elif kind == "pass":
                world.issue(index, rnd.random() < 0.6, draw_patterns(rnd, 2))
            else:
                await world.call(index, rnd.choice(TOOLS), rnd.randrange(4))
        for index in reversed(range(len(world.orders))):  # sub-orders first
            chosen = [] if rnd.random() < 0.4 else [rnd.randrange(6) for _ in range(3)]
            await world.finish(index, chosen)

    anyio.run(play)

    for order_id, ref, tool in world.gateway_upstream.log:
        for stager in ancestors(world.store, world.store.load(order_id).order):
            assert not matches_any(stager.staged, tool), (
                f"{ref} of {order_id} was forwarded, but {stager.id} above it stages {tool}")
    for order_id, ref, tool in world.commit_upstream.log:
        held_under = world.store.load(order_id).order
        for stager in (held_under, *ancestors(world.store, held_under)):
            if matches_any(stager.staged, tool):
                approved = world.approved.get(stager.id, set()) if stager is held_under \
                    else set()
                assert ref in approved, (
                    f"{ref} of {order_id} ran without the approval of {stager.manager}, "
                    f"manager of {stager.id}, which stages {tool}")
    for order_id in world.orders:
        order = world.store.load(order_id).order
        below = world.subtree(order_id)
        forwarded = [(o, tool) for o, _ref, tool in world.gateway_upstream.log if o in below]
        held = [(o, c.tool) for o in below for c in world.store.calls(o) if c.outcome == "held"]
        counted = forwarded + held
        if order.budget.tool_calls is not None:
            assert len(counted) <= order.budget.tool_calls, (order_id, counted)
        if order.budget.usd is not None:
            cost = sum(COSTS[tool.split("/")[1]] for _o, tool in counted)
            assert cost <= order.budget.usd + 1e-9, (order_id, cost)
