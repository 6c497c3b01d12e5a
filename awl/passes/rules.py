"""The rules a pass's claims follow (V1, P1..P9): each link only narrows its parent and
its order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from awl.documents.checks import _no_invalid, _validated, check_structure, context_model
from awl.documents.findings import Finding
from awl.documents.limits import check_amounts
from awl.documents.models import PassClaims, WorkOrder, parse_time
from awl.documents.patterns import covered_by_any, overlap
from awl.documents.pointers import pointer
from awl.passes.common import LEEWAY, epoch


@dataclass(frozen=True, slots=True)
class OrderFacts:
    """What the P rules need about an order, from the order or from a worker's pass."""

    order_id: str
    manager: str | None
    tools: tuple[str, ...]
    budget: Mapping[str, float]
    deadline: str | None
    staged: tuple[str, ...]

    @classmethod
    def of_order(cls, order: WorkOrder) -> OrderFacts:
        return cls(order.id, order.manager, order.tools, order.budget.units(),
                   order.deadline, order.staged)

    @classmethod
    def of_root(cls, root: PassClaims) -> OrderFacts:
        g = root.grant
        return cls(g.order_id, g.manager, g.tools, g.budget.units(), g.deadline,
                   g.staged or ())


def _bad(rule: str, path: str, message: str) -> Finding:
    return Finding(rule, "invalid", path, message)


def _time_findings(claims: PassClaims, now: float | None) -> Iterator[Finding]:
    problems = []
    if claims.exp <= claims.nbf:
        problems.append(f"exp {claims.exp} is not after nbf {claims.nbf}")
    if claims.iat > claims.exp:
        problems.append(f"iat {claims.iat} is after exp {claims.exp}")
    if now is not None and claims.exp <= now:
        problems.append(f"exp {claims.exp} is not after the time of issue {int(now)}")
    if problems:
        yield _bad("P2", "/exp", "; ".join(problems))
    if now is not None and issued_ahead(claims, now, LEEWAY):
        yield _bad("P9", "/iat", f"iat {claims.iat} is more than {LEEWAY} s after the time "
                   f"{int(now)}: a pass is never dated in the future")


def issued_ahead(claims: PassClaims, now: float, leeway: float) -> bool:
    """Whether ``iat`` lies further ahead of ``now`` than the clock leeway (P9)."""
    return claims.iat > now + leeway


def _order_findings(claims: PassClaims, facts: OrderFacts) -> Iterator[Finding]:
    g = claims.grant
    if g.order_id != facts.order_id:
        yield _bad("P3", "/grant/order_id",
                   f"the pass is for order {g.order_id!r}, not {facts.order_id!r}")
    if g.manager is not None and facts.manager is not None and g.manager != facts.manager:
        yield _bad("P3", "/grant/manager",
                   f"the order's manager is {facts.manager!r}, not {g.manager!r}")


def _tool_findings(claims: PassClaims, facts: OrderFacts | None,
                   parent: PassClaims | None) -> Iterator[Finding]:
    if parent is not None:
        outer, whose = parent.grant.tools, "the parent pass"
    elif facts is not None:
        outer, whose = facts.tools, "the order"
    else:
        return
    for i, pattern in enumerate(claims.grant.tools):
        if not covered_by_any(outer, pattern):
            yield _bad("P4", pointer("grant", "tools", i),
                       f"{pattern} is not covered by {whose}'s tools {list(outer)}")


def _budget_findings(claims: PassClaims, facts: OrderFacts | None, parent: PassClaims | None,
                     remaining: Mapping[str, float] | None) -> Iterator[Finding]:
    if parent is not None:
        base, whose = parent.grant.budget.units(), "the parent pass"
    elif facts is not None:
        base, whose = dict(facts.budget), "the order"
    else:
        return
    granted = claims.grant.budget.units()
    for unit in sorted(base):
        limit = base[unit]
        if remaining is not None and unit in remaining:
            limit = min(limit, remaining[unit])
        where = pointer("grant", "budget", unit)
        if unit not in granted:
            yield _bad("P5", where, f"{whose} limits {unit}; the pass must limit it too")
        elif granted[unit] > limit:
            yield _bad("P5", where, f"{unit} {granted[unit]} is more than the {limit} that "
                       f"remains of {whose}'s budget")


def _expiry_findings(claims: PassClaims, facts: OrderFacts | None,
                     parent: PassClaims | None) -> Iterator[Finding]:
    problems = []
    if parent is not None and claims.exp > parent.exp:
        problems.append(f"exp {claims.exp} is after the parent pass's exp {parent.exp}")
    deadline = facts.deadline if facts is not None else None
    if deadline is not None and claims.exp > parse_time(deadline).timestamp():
        problems.append(f"exp {claims.exp} is after the order deadline {deadline}")
    if problems:
        yield _bad("P6", "/exp", "; ".join(problems))
    stated = claims.grant.deadline
    if (stated is not None and deadline is not None
            and parse_time(stated) != parse_time(deadline)):
        yield _bad("P6", "/grant/deadline",
                   f"the order's deadline is {deadline}, not {stated}")


def _staged_findings(claims: PassClaims, facts: OrderFacts | None) -> Iterator[Finding]:
    if facts is None:
        return
    g = claims.grant
    if g.staged is not None and set(g.staged) != set(facts.staged):
        yield _bad("P7", "/grant/staged",
                   f"the order stages {list(facts.staged)}, not {list(g.staged)}")
    if g.parent_jti is None:
        return  # the worker's own pass may hold staged tools: the gateway holds their calls
    for i, pattern in enumerate(g.tools):
        hit = [s for s in facts.staged if overlap(pattern, s) is not None]
        if hit:
            yield _bad("P7", pointer("grant", "tools", i),
                       f"{pattern} reaches staged {hit}: a staged tool is never delegated")


def _parent_findings(claims: PassClaims, parent: PassClaims | None) -> Iterator[Finding]:
    if parent is not None and claims.grant.parent_jti != parent.jti:
        yield _bad("P8", "/grant/parent_jti",
                   f"parent_jti {claims.grant.parent_jti!r} is not the parent's jti "
                   f"{parent.jti!r}")


def rule_findings(claims: PassClaims, facts: OrderFacts | None, parent: PassClaims | None,
                   remaining: Mapping[str, float] | None, now: float | None
                   ) -> Iterator[Finding]:
    yield from _time_findings(claims, now)
    if facts is not None:
        yield from _order_findings(claims, facts)
    yield from _tool_findings(claims, facts, parent)
    yield from _budget_findings(claims, facts, parent, remaining)
    yield from _expiry_findings(claims, facts, parent)
    yield from _staged_findings(claims, facts)
    yield from _parent_findings(claims, parent)


def iter_pass_findings(
    claims: Any,
    *,
    order: Any = None,
    parent: Any = None,
    remaining: Mapping[str, float] | None = None,
    now: datetime | str | float | None = None,
) -> Iterator[Finding]:
    """Findings for a pass's claims: V1, P1 (schema), then P2..P9.

    When V1 or P1 fails, nothing else runs (the later rules assume the structure).

    Args:
        claims: the claims, as JSON data or a :class:`~awl.PassClaims`.
        order: the order the pass is for (rules P3, P6, P7 and the fallback of P4, P5).
        parent: the parent pass's claims, for a derived pass (P4, P5, P6, P8).
        remaining: per budget unit, what is left of the parent's (or the order's) budget;
            a unit not given counts as its full limit.
        now: the time of issue; when given, P2 also wants ``exp`` after it and P9 wants
            ``iat`` no later than it plus the leeway.

    Raises:
        DocumentError: ``claims`` cannot be a JSON document at all, or ``order`` or
            ``parent`` is not a valid document.
        BadRequest: ``now`` is not a time within years 1 to 9999, or ``remaining`` does not
            map unit names to finite numbers.
    """
    remaining = check_amounts(remaining, name="remaining")
    t = None if now is None else epoch(now)
    _, model, found = check_structure(claims, "pass")
    yield from found
    if model is None:
        return
    order_model = None if order is None else context_model(order, "order", WorkOrder, "order")
    parent_model = (None if parent is None
                    else context_model(parent, "pass", PassClaims, "parent"))
    yield from rule_findings(cast(PassClaims, model),
                              OrderFacts.of_order(order_model) if order_model else None,
                              parent_model, remaining, t)


def is_valid_pass(
    claims: Any,
    *,
    order: Any = None,
    parent: Any = None,
    remaining: Mapping[str, float] | None = None,
    now: datetime | str | float | None = None,
) -> bool:
    """Whether a pass's claims have no ``invalid`` finding (DOC-9).

    Takes the same arguments as :func:`iter_pass_findings`.

    Raises:
        DocumentError: ``claims`` cannot be a JSON document at all, or ``order`` or
            ``parent`` is not a valid document.
        BadRequest: ``now`` is not a time within years 1 to 9999, or ``remaining`` does not
            map unit names to finite numbers.
    """
    return _no_invalid(iter_pass_findings(claims, order=order, parent=parent,
                                          remaining=remaining, now=now))


def validate_pass(
    claims: Any,
    *,
    order: Any = None,
    parent: Any = None,
    remaining: Mapping[str, float] | None = None,
    now: datetime | str | float | None = None,
) -> PassClaims:
    """A pass's claims as a model, when they have no ``invalid`` finding (DOC-9).

    Takes the same arguments as :func:`iter_pass_findings`. This checks the claims only;
    a token's signature and chain are :func:`verify_pass`'s.

    Raises:
        ValidationFailed: with every finding, when one is ``invalid``.
        DocumentError: ``claims`` cannot be a JSON document at all, or ``order`` or
            ``parent`` is not a valid document.
        BadRequest: ``now`` is not a time within years 1 to 9999, or ``remaining`` does not
            map unit names to finite numbers.
    """
    found = iter_pass_findings(claims, order=order, parent=parent, remaining=remaining,
                               now=now)
    return _validated(PassClaims, "delegation pass", found, claims)
