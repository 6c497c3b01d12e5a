"""What the store keeps about passes: issued records, revocations, what remains to grant
and the budget scopes of a call.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from awl.documents.errors import BadRequest
from awl.documents.models import PassClaims, WorkOrder, epoch_seconds, format_time
from awl.passes.verify import VerifiedPass, unverified_claims
from awl.store.protocol import PassRecord, Scope, Store, Usage

__all__ = ["pass_scopes", "record_pass", "remaining_budget", "revoke_order_passes", "revoke_pass"]


def _stamp(t: float) -> str:
    return format_time(datetime.fromtimestamp(t, UTC))


def record_pass(store: Store, token: str) -> PassRecord:
    """Remember an issued pass under its order, so the order's end can revoke it.

    Reads the token's claims without verifying them: call it with tokens you just issued.
    """
    _, data = unverified_claims(token)
    claims = PassClaims.model_validate(data)
    record = PassRecord(jti=claims.jti, order_id=claims.grant.order_id,
                        parent_jti=claims.grant.parent_jti, subject=claims.sub,
                        exp=claims.exp, issued_at=_stamp(claims.iat))
    store.save_pass(record)
    return record


def revoke_pass(store: Store, jti: str, reason: str, *,
                now: datetime | str | float | None = None) -> None:
    """Revoke one pass; every pass derived from it stops verifying too (idempotent)."""
    if not jti:
        raise BadRequest("name the pass to revoke by its jti")
    store.revoke(jti, reason=reason or "revoked", at=_stamp(epoch_seconds(now)))


def revoke_order_passes(store: Store, order_id: str, *, reason: str = "order ended",
                        now: datetime | str | float | None = None) -> list[str]:
    """Revoke every pass issued for an order (the desk calls this when the order ends).

    Returns:
        The jtis newly revoked, in the order they were issued.
    """
    issued = store.passes(order_id)
    if not issued:  # most orders never get a pass; skip reading every revocation
        return []
    done = store.revoked()
    fresh = [p.jti for p in issued if p.jti not in done]
    at = _stamp(epoch_seconds(now))
    for jti in fresh:
        store.revoke(jti, reason=reason, at=at)
    return fresh


def remaining_budget(store: Store, order: WorkOrder,
                     parent: VerifiedPass | None = None) -> dict[str, float]:
    """What is left to grant, per budget unit: of the order and of every link of ``parent``.

    A link's spending is the calls made under it and under every pass derived from it.
    Only ``usd`` and ``tool_calls`` are counted by the desk; other units count as unspent.
    """
    left = _minus(order.budget.units(), store.usage(order.id))
    if parent is not None:
        children = _children(store, order.id)
        for link in parent.chain:
            spent = store.usage(order.id, frozenset(_subtree(link.jti, children)))
            for unit, value in _minus(link.grant.budget.units(), spent).items():
                left[unit] = min(left.get(unit, value), value)
    return left


def pass_scopes(store: Store, verified: VerifiedPass) -> list[Scope]:
    """Budget scopes for a call made under ``verified``: one per link, the worker's first.

    A link's scope counts the calls made under it and under every pass derived from it (the
    ones the store has recorded, plus the links below it in this chain), against that link's
    ``tool_calls`` and ``usd`` limits. Give them to :meth:`awl.Store.reserve_call` with the
    order's own scope.
    """
    children = _children(store, verified.order_id)
    scopes = []
    for i, link in enumerate(verified.chain):
        below = {c.jti for c in verified.chain[i:]}
        units = link.grant.budget.units()
        tool_calls = units.get("tool_calls")
        scopes.append(Scope(
            jtis=frozenset(_subtree(link.jti, children) | below),
            max_calls=None if tool_calls is None else int(tool_calls),
            max_usd=units.get("usd"),
            name=f"pass {link.jti}"))
    return scopes


def _children(store: Store, order_id: str) -> dict[str, list[str]]:
    children: dict[str, list[str]] = {}
    for record in store.passes(order_id):
        if record.parent_jti is not None:
            children.setdefault(record.parent_jti, []).append(record.jti)
    return children


def _minus(budget: Mapping[str, float], spent: Usage) -> dict[str, float]:
    used = {"usd": spent.usd, "tool_calls": spent.tool_calls}
    return {unit: max(0.0, limit - used.get(unit, 0)) for unit, limit in budget.items()}


def _subtree(jti: str, children: Mapping[str, list[str]]) -> set[str]:
    out, todo = set(), [jti]
    while todo:
        current = todo.pop()
        if current not in out:
            out.add(current)
            todo.extend(children.get(current, ()))
    return out
