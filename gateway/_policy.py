"""The gateway's decision for one tool call: forward it, hold it, or refuse it.

:func:`judge` is pure: everything it needs (the order and its state, the clock, what has
been spent, the pass grant, the operator's settings, the tool's annotations) comes in one
:class:`Facts` value, so every rule can be tested without a store or an upstream. The
gateway re-reads those facts from the store on every call (:func:`gateway._callpath.admit`)
and then asks :func:`judge`; the tool-call and USD limits are enforced once more,
atomically, when the store reserves the call.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol

from awl.desk import staging_ancestor
from awl.documents import WORKING, Grant, WorkOrder, is_tool_name, matches_any, parse_time
from awl.store import Scope, Usage, over_limit

AWL_FORBIDDEN = "AWL_FORBIDDEN"
"""The tool is not exposed, or neither the order nor the pass allows it."""
AWL_NOT_ACTIVE = "AWL_NOT_ACTIVE"
"""The order is not accepted or working."""
AWL_EXPIRED = "AWL_EXPIRED"
"""The order's deadline has passed."""
AWL_PASS_INVALID = "AWL_PASS_INVALID"
"""The Delegation Pass the worker runs under is revoked, expired or otherwise invalid."""
AWL_BUDGET_EXHAUSTED = "AWL_BUDGET_EXHAUSTED"
"""A budget unit (tool_calls, usd or seconds) of the order or of the pass is spent."""
AWL_UPSTREAM_UNAVAILABLE = "AWL_UPSTREAM_UNAVAILABLE"
"""The name is meant for a configured server that has not listed its tools: it could not be
started, so the name cannot be looked up (the reason follows the code)."""

REFUSAL_CODES = (
    AWL_BUDGET_EXHAUSTED,
    AWL_EXPIRED,
    AWL_FORBIDDEN,
    AWL_NOT_ACTIVE,
    AWL_PASS_INVALID,
    AWL_UPSTREAM_UNAVAILABLE,
)
"""Every code :func:`decide` can refuse with."""


@dataclass(frozen=True, slots=True)
class Decision:
    """What the gateway does with one call.

    ``action`` is ``forward`` (send it upstream now), ``hold`` (record it and wait for the
    manager's approval) or ``refuse`` (answer with ``code: message`` and send nothing).
    """

    action: Literal["forward", "hold", "refuse"]
    code: str | None = None
    message: str = ""

    @property
    def text(self) -> str:
        """The tool-error text a model reads: ``CODE: message``."""
        return f"{self.code}: {self.message}" if self.code else self.message


FORWARD = Decision("forward")
HOLD = Decision("hold")


def refuse(code: str, message: str) -> Decision:
    """A refusal with its code and a message that says what to do next."""
    return Decision("refuse", code, message)


def is_staged(
    tool: str,
    order: WorkOrder,
    *,
    hold: Iterable[str] = (),
    safe: bool = False,
    read_only: bool | None = None,
) -> bool:
    """Whether calls to ``tool`` are held instead of forwarded.

    A call is held when the order's ``staged`` patterns or the operator's ``hold`` patterns
    match the tool, or, in safe mode, when the upstream does not mark the tool read-only
    (a missing annotation counts as "may write", so a forgotten ``staged`` entry fails safe).
    """
    if matches_any(order.staged, tool) or matches_any(hold, tool):
        return True
    return safe and read_only is not True


def allowed(tool: str, order: WorkOrder, grant: Grant | None = None) -> bool:
    """Whether the order's patterns, and the pass's if there is one, admit ``tool``."""
    if not is_tool_name(tool) or not matches_any(order.tools, tool):
        return False
    return grant is None or matches_any(grant.tools, tool)


class _Limits(Protocol):
    """A budget's limits the gateway checks (an order's or a grant's ``budget``)."""

    @property
    def tool_calls(self) -> int | None: ...
    @property
    def usd(self) -> float | None: ...
    @property
    def seconds(self) -> float | None: ...


_NOTHING = Usage()
"""What nothing spent is: the usage of a scope whose usage was not read."""


def _elapsed(usage: Usage, now: datetime) -> float:
    if usage.first_call_at is None:
        return 0.0
    return (now - parse_time(usage.first_call_at)).total_seconds()


def _budget_problem(
    who: str,
    limits: _Limits,
    usage: Usage | None,
    *,
    now: datetime,
    usd: float,
) -> str | None:
    used = usage or _NOTHING
    calls, money = limits.tool_calls, limits.usd
    over = over_limit(used.tool_calls, used.usd, usd, max_calls=calls, max_usd=money)
    if over == "tool_calls":
        return f"{who} has used {used.tool_calls} of {calls:g} tool_calls"
    if over == "usd":
        return (f"{who} has spent {used.usd:g} of {money:g} usd and this call costs {usd:g}")
    seconds = limits.seconds
    if seconds is not None:
        elapsed = _elapsed(used, now)
        if elapsed >= seconds:
            return (f"{who} has run {elapsed:.0f} of {seconds:g} seconds since its first "
                    "tool call")
    return None


@dataclass(frozen=True, slots=True)
class Facts:
    """Everything :func:`judge` decides one call on, in one value."""

    order: WorkOrder
    """The order the call runs under."""
    state: str
    """The order's current state, as just read from the store."""
    now: datetime
    """The current time (timezone-aware)."""
    tool: str | None
    """The canonical ``server/tool`` name, or None when the requested name does not resolve
    to an exposed upstream tool."""
    requested: str | None = None
    """The name the worker asked for, quoted in a refusal."""
    usage: Usage | None = None
    """What the order has spent so far (calls, USD, time of its first call)."""
    usd: float = 0.0
    """What this call costs."""
    grant: Grant | None = None
    """The Delegation Pass grant the worker runs under, if any."""
    pass_usage: Usage | None = None
    """What has been spent under the pass (and passes derived from it)."""
    pass_problem: str | None = None
    """Why the pass is no longer valid (revoked, expired), or None."""
    passes_above: Sequence[tuple[str, Grant, Usage]] = ()
    """``(jti, grant, usage)`` of each pass the caller's derives from whose grant has a
    ``seconds`` budget, with what was spent under it (its own calls and its derived
    passes'): a derived pass runs no longer than any pass above it (their ``tool_calls``
    and ``usd`` the store checks exactly)."""
    hold: Iterable[str] = ()
    """The operator's always-held patterns."""
    safe: bool = False
    """Safe mode: hold every tool not annotated read-only."""
    read_only: bool | None = None
    """The upstream's ``readOnlyHint`` for the tool, if it gave one."""
    unavailable: str | None = None
    """When ``tool`` is None because the server the name is meant for could not be
    started: why (the refusal then says so instead of ``AWL_FORBIDDEN``)."""
    above: Sequence[tuple[WorkOrder, Usage]] = ()
    """For a sub-order, orders it was split from whose budget must be checked here, each
    with what is charged to it (its sub-orders' spending included): a call is charged to
    every order above (LC-15). The store checks their ``tool_calls`` and ``usd`` exactly;
    ``seconds`` is checked only here."""
    staging_above: Sequence[WorkOrder] = ()
    """For a sub-order, the orders above it that stage tools: a tool one of them stages is
    forbidden here (LC-14), since only that order's manager may approve it."""
    ended_above: tuple[str, str] | None = None
    """For a sub-order, ``(order id, state)`` of an order above it that has ended: its
    authority is gone, so the call is refused as not active (LC-16)."""


def decide(**facts: Any) -> Decision:
    """Decide what happens to one call: :func:`judge` on ``Facts(**facts)`` (the keywords
    are the fields of :class:`Facts`)."""
    return judge(Facts(**facts))


def judge(facts: Facts) -> Decision:
    """Decide what happens to one call.

    Checks run in this order, and the first that fails decides: the pass is still valid,
    the order is active, its deadline has not passed, the tool is exposed and allowed,
    budget is left (order, then pass). A call that passes them all is held if it is staged
    (see :func:`is_staged`) and forwarded otherwise.

    Returns:
        The decision; a refusal carries a code from :data:`REFUSAL_CODES`.
    """
    order, tool, now, usd, grant = facts.order, facts.tool, facts.now, facts.usd, facts.grant
    if facts.pass_problem is not None:
        return refuse(AWL_PASS_INVALID,
                      "the Delegation Pass you run under is not valid any more "
                      f"({facts.pass_problem}); stop calling tools and ask whoever issued it "
                      "for a new pass")
    inactive = inactive_refusal(order, facts.state, now, ended_above=facts.ended_above)
    if inactive is not None:
        return inactive
    name = tool if tool is not None else facts.requested or ""
    if tool is None and facts.unavailable is not None:
        return refuse(AWL_UPSTREAM_UNAVAILABLE,
                      f"tool {name[:100]!r} cannot be looked up: {facts.unavailable}; try "
                      "again later, or go on without it")
    if tool is None or not allowed(tool, order, grant):
        scope = "the order and your pass" if grant is not None else f"order {order.id}"
        return refuse(AWL_FORBIDDEN,
                      f"tool {name[:100]!r} is not allowed by {scope}; call only the tools "
                      "listed by tools/list")
    stager = staging_ancestor(tool, facts.staging_above)
    if stager is not None:
        return refuse(AWL_FORBIDDEN,
                      f"tool {tool!r} is staged by order {stager.id}, which order {order.id} "
                      f"is split from; only its manager {stager.manager} may approve it, so "
                      "it cannot be called here; call only the tools listed by tools/list")
    problem = _budget_problem(f"order {order.id}", order.budget, facts.usage, now=now, usd=usd)
    for parent, spent in facts.above:
        problem = problem or _budget_problem(
            f"order {parent.id}, which this order is split from,", parent.budget, spent,
            now=now, usd=usd)
    for jti, link, spent in facts.passes_above:
        problem = problem or _budget_problem(
            f"pass {jti}, which your pass derives from,", link.budget, spent, now=now, usd=usd)
    if problem is None and grant is not None:
        problem = _budget_problem("your pass", grant.budget, facts.pass_usage, now=now,
                                  usd=usd)
    if problem is not None:
        return refuse(AWL_BUDGET_EXHAUSTED,
                      f"{problem}; stop calling tools and submit your report")
    if is_staged(tool, order, hold=facts.hold, safe=facts.safe, read_only=facts.read_only):
        return HOLD
    return FORWARD


def inactive_refusal(order: WorkOrder, state: str, now: datetime, *,
                     ended_above: tuple[str, str] | None = None) -> Decision | None:
    """The refusal for anything done under an order that is not active, has an order above
    it that ended (``ended_above``: its id and state, LC-16), or is past its deadline at
    ``now``; None while it is accepted or working in time."""
    if state not in WORKING:
        return refuse(AWL_NOT_ACTIVE,
                      f"order {order.id} is {state}; tools run only while it is accepted or "
                      "working")
    if ended_above is not None:
        above_id, above_state = ended_above
        return refuse(AWL_NOT_ACTIVE,
                      f"order {above_id}, which order {order.id} is split from, is "
                      f"{above_state}; a sub-order's tools run only while every order above it "
                      "is active; stop and submit your report")
    if now >= parse_time(order.deadline):
        return refuse(AWL_EXPIRED,
                      f"order {order.id} passed its deadline {order.deadline}; stop and "
                      "submit your report")
    return None


def budget_refusal(scope: Scope | str, order_id: str) -> Decision:
    """The refusal for a reservation the store turned down on ``scope``'s limits, or on an
    order above (the name the store gave, ``order <id>``)."""
    if isinstance(scope, str):
        return refuse(AWL_BUDGET_EXHAUSTED,
                      f"{scope}, which order {order_id} is split from, has spent its budget "
                      "(its own calls and its sub-orders') or this call would pass it; stop "
                      "calling tools and submit your report")
    who = f"order {order_id}" if scope.jtis is None else "your pass"
    limits = [f"{n:g} {unit}" for n, unit in ((scope.max_calls, "tool_calls"),
                                              (scope.max_usd, "usd")) if n is not None]
    return refuse(AWL_BUDGET_EXHAUSTED,
                  f"{who} has spent its budget ({' and '.join(limits)}) or this call would "
                  "pass it; stop calling tools and submit your report")
