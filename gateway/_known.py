"""What one gateway keeps between calls, behind one object: :class:`Known`.

Everything here is read once and kept because it does not change, or is kept until the
event that changes it: the order and the orders above it (an order never changes once
issued), the upstream tools and their name table (until an upstream lists anew), each
tool's cost, hold and read-only facts, the order's budget scope, the order's record as last
read, and the decisions that record alone decides (until another record is read). The call
path (:mod:`gateway._callpath`) asks this object; no decision code keeps anything itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import NamedTuple

import mcp_types as types

from awl.documents import WorkOrder, parse_time
from awl.store import OrderRecord, Scope
from gateway._config import GatewayConfig
from gateway._names import NameTable, split_canonical
from gateway._policy import Decision
from gateway._results import OutputSchemas
from gateway._worker_tools import WORKER_TOOL_NAMES

__all__ = ["Known", "ToolFacts"]


class ToolFacts(NamedTuple):
    """What the config and the upstream say of one tool."""

    usd: float
    """What a call costs (the server's ``cost``)."""
    hold: bool
    """Whether the operator's hold list holds it."""
    read_only: bool | None
    """The upstream's ``readOnlyHint``, if it gave one."""


class _Kept(NamedTuple):
    record: OrderRecord
    canonical: str
    decision: Decision
    usd: float
    deadline: datetime


class Known:
    """The caches of one gateway, each behind a named method; see the module text."""

    def __init__(self, config: GatewayConfig) -> None:
        self._config = config
        self.tools: Mapping[str, types.Tool] = {}
        """The upstream tools by canonical name, as the pool last listed them."""
        self.table = NameTable((), reserved=WORKER_TOOL_NAMES)
        """Exposed name to canonical name, for :attr:`tools`."""
        self.schemas = OutputSchemas()
        self.listed: frozenset[str] = frozenset()
        """The tools the worker last heard of."""
        self.record: OrderRecord | None = None
        """The order's record as last read (None: read it before deciding)."""
        self._order: WorkOrder | None = None
        self._order_scope: Scope | None = None
        self.timed_above: tuple[WorkOrder, ...] = ()
        """The orders above with a seconds budget (LC-15): the store checks the other
        units of every order above when it reserves a call."""
        self.staging_above: tuple[WorkOrder, ...] = ()
        """The orders above that stage tools: those tools are never called here (LC-14;
        C5 keeps them out of a sub-order the desk creates)."""
        self.above_ids: tuple[str, ...] = ()
        """Every order above: its calls run only while they are all active (LC-16)."""
        self._facts: dict[str, ToolFacts] = {}
        self._decisions: dict[str, _Kept] = {}

    # ------------------------------------------------------------------ the order

    def learn_order(self, order: WorkOrder, above: list[WorkOrder] | tuple[WorkOrder, ...]
                    ) -> None:
        """Keep the order and the orders above it (read once, at start)."""
        self._order = order
        self.timed_above = tuple(o for o in above if o.budget.seconds is not None)
        self.staging_above = tuple(o for o in above if o.staged)
        self.above_ids = tuple(o.id for o in above)

    @property
    def order(self) -> WorkOrder:
        if self._order is None:
            raise RuntimeError("call Gateway.start() first")
        return self._order

    def order_scope(self) -> Scope:
        """The order's own budget scope, checked by every reservation."""
        if self._order_scope is None:
            budget = self.order.budget
            self._order_scope = Scope(None, max_calls=budget.tool_calls, max_usd=budget.usd,
                                      name="order")
        return self._order_scope

    # ------------------------------------------------------------------ the tools

    def learn_tools(self, tools: Mapping[str, types.Tool]) -> NameTable:
        """The name table for ``tools``, rebuilt when the tool set changed; what was kept
        per tool is dropped when the pool lists anew (a restart may change annotations)."""
        if tools is not self.tools:
            if tools.keys() != self.tools.keys():
                self.table = NameTable(tools, reserved=WORKER_TOOL_NAMES)
            self.tools = tools
            self._facts.clear()
            self._decisions = {}
        return self.table

    def facts(self, canonical: str) -> ToolFacts:
        """``(usd, operator hold, readOnlyHint)`` of one upstream tool, kept per tool until
        an upstream lists its tools anew."""
        known = self._facts.get(canonical)
        if known is not None:
            return known
        tool = self.tools.get(canonical)
        server, bare = split_canonical(canonical)
        config = self._config.servers.get(server)
        usd = config.cost_of(bare) if config is not None else 0.0
        hold = config.holds(bare) if config is not None else False
        read_only = tool.annotations.read_only_hint if tool and tool.annotations else None
        facts = ToolFacts(usd, hold, read_only)
        self._facts[canonical] = facts
        return facts

    # ------------------------------------------------------------------ decisions

    # A decision to forward or hold depends on the order as read (its state, its log), the
    # catalog, the pass and the clock. Without a pass, a seconds budget, orders above or an
    # upstream that failed to start, the order's record and the catalog alone decide it
    # until the deadline: so it is kept per tool, for as long as that record is the one
    # read and the catalog is the one listed. (The budget's calls and usd are checked by
    # the store's reservation every time.)
    def keeps_decisions(self, record: OrderRecord, token: str | None,
                        unavailable: str | None) -> bool:
        """Whether a decision on ``record`` for this caller may be kept."""
        return (token is None and unavailable is None and not self.above_ids
                and record.order.budget.seconds is None)

    def kept_decision(self, record: OrderRecord, name: str, canonical: str | None,
                      token: str | None, now: datetime,
                      unavailable: str | None) -> tuple[Decision, float] | None:
        """The decision and cost kept for ``name`` on ``record`` that still hold at ``now``."""
        kept = self._decisions.get(name)
        if (kept is None or kept.record is not record or kept.canonical != canonical
                or now >= kept.deadline):
            return None
        if not self.keeps_decisions(record, token, unavailable):
            return None
        return kept.decision, kept.usd

    def keep_decision(self, record: OrderRecord, name: str, canonical: str,
                      decision: Decision, usd: float) -> None:
        self._decisions[name] = _Kept(record, canonical, decision, usd,
                                      parse_time(record.order.deadline))
