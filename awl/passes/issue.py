"""Issuing passes: from an order or a parent pass, and for a stored order against what
remains of its budget.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Container, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from awl.documents.checks import iter_pass_findings
from awl.documents.errors import BadRequest, InvalidTransition, PassError
from awl.documents.lifecycle import TERMINAL, WORKING, is_desk_principal
from awl.documents.limits import MAX_EPOCH, MIN_EPOCH, check_amounts, is_finite_number, show_value
from awl.documents.models import Budget, WorkOrder, epoch_seconds, parse_time
from awl.documents.patterns import overlap
from awl.passes.common import (
    DEFAULT_AUDIENCE,
    DEFAULT_ISSUER,
    MAX_CHAIN,
    MAX_TOKEN_BYTES,
    PASS_SPEC,
)
from awl.passes.keys import KeyStore, publish_keys
from awl.passes.records import record_pass, remaining_budget, revoke_order_passes
from awl.passes.verify import VerifiedPass, unverified_claims, verify_pass
from awl.store.protocol import Store
from awl.store.rules import MAX_CHAIN as MAX_ORDERS_ABOVE

__all__ = ["issue_pass", "issue_recorded_pass"]

_COUNT_UNITS = frozenset({"tokens", "tool_calls"})



def _default_budget(base: Mapping[str, float],
                    remaining: Mapping[str, float] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for unit, limit in base.items():
        value = max(0.0, min(limit, (remaining or {}).get(unit, limit)))
        out[unit] = math.floor(value) if unit in _COUNT_UNITS else value
    return out


def _tool_list(tools: Iterable[str]) -> list[str]:
    # A string is iterable too, and would grant one "pattern" per character; a mapping would
    # grant its keys. Neither is what a caller meant, so both are refused by name.
    if isinstance(tools, str | bytes | Mapping) or not isinstance(tools, Iterable):
        raise BadRequest(f"tools must be a list of tool patterns such as ['fs/read'], not "
                         f"{show_value(tools)}")
    return list(tools)


def _budget_units(budget: Budget | Mapping[str, float]) -> dict[str, float]:
    if isinstance(budget, Budget):
        return budget.units()
    if not isinstance(budget, Mapping):
        raise BadRequest(f"budget must map units to limits, such as {{'usd': 1, "
                         f"'tool_calls': 5}}, not {show_value(budget)}")
    return dict(budget)


def _expiry(now: float, cap: float, expires_in: timedelta | float | None,
            exp: datetime | str | float | None) -> int:
    if expires_in is not None and exp is not None:
        raise BadRequest("give expires_in or exp, not both")
    if expires_in is not None:
        seconds = (expires_in.total_seconds() if isinstance(expires_in, timedelta)
                   else expires_in)
        if not is_finite_number(seconds) or not MIN_EPOCH <= now + seconds <= MAX_EPOCH:
            raise BadRequest(f"expires_in must be a number of seconds that ends within years "
                             f"1 to 9999, not {show_value(seconds)}")
        return math.floor(now + seconds)
    if exp is not None:
        return math.floor(epoch_seconds(exp, "exp"))
    return math.floor(cap)


def issue_pass(
    order: WorkOrder,
    *,
    subject: str,
    keys: KeyStore,
    audience: str | None = None,
    tools: Iterable[str] | None = None,
    budget: Budget | Mapping[str, float] | None = None,
    expires_in: timedelta | float | None = None,
    exp: datetime | str | float | None = None,
    parent_token: str | None = None,
    remaining: Mapping[str, float] | None = None,
    revoked: Container[str] = (),
    issuer: str = DEFAULT_ISSUER,
    now: datetime | str | float | None = None,
) -> str:
    """Issue a worker's pass from ``order``, or a derived pass from ``parent_token``.

    Defaults take the most the rules allow: the parent's (else the order's) tools, its
    budget capped by ``remaining``, and its ``exp`` (else the order deadline). Anything asked
    for beyond that is refused, never trimmed.

    Args:
        order: the order the authority comes from.
        subject: who will hold the pass (``sub``).
        keys: the desk's signing keys.
        audience: who will accept it; default the parent's, else :data:`DEFAULT_AUDIENCE`.
        tools: tool patterns to grant.
        budget: limits to grant, per unit.
        expires_in: lifetime from ``now`` (seconds or a timedelta).
        exp: absolute expiry instead of ``expires_in``.
        parent_token: the pass to derive from (verified here, chain and all).
        remaining: per unit, what is left of the parent's (or the order's) budget.
        revoked: revoked jtis, checked against the parent's chain.
        issuer: ``iss``.
        now: the time of issue (default: the clock).

    Raises:
        PassError: ``reason`` is the rule id the pass would break (``P4``, ``P7`` ...),
            ``not_worker`` for a worker's pass to anyone but the order's worker, or a
            verification reason when ``parent_token`` does not verify.
        BadRequest: a ``subject`` reserved for the desk (``awl:...``), or contradictory or
            malformed arguments (``now``, ``exp``, ``expires_in``
            or ``remaining`` that is not a time within years 1 to 9999 or a number, a
            ``subject`` that is not a string, ``tools`` that is not a list of patterns,
            ``budget`` that is not a mapping).
        PassError: ``too_large``: the signed token would be longer than
            :data:`~awl.passes.MAX_TOKEN_BYTES`, which every verifier refuses unread (grant
            fewer or broader tool patterns, or derive from a pass nearer the worker's).
    """
    t = epoch_seconds(now)
    if not isinstance(subject, str):
        raise BadRequest(f"subject must be a principal such as agent:researcher, not "
                         f"{show_value(subject)}")
    remaining = check_amounts(remaining, name="remaining")
    parent: VerifiedPass | None = None
    if parent_token is None and subject != order.to:
        raise PassError(f"a worker's pass goes to the order's worker {order.to}, not {subject}; "
                        "give a sub-agent a pass derived from the worker's",
                        reason="not_worker")
    if is_desk_principal(subject):  # no door lets anyone act as the desk, a pass neither
        raise BadRequest(f"{subject} is reserved for the desk itself; a pass goes to an agent "
                         "or a human, such as agent:researcher")
    if parent_token is not None:
        if audience is None:
            aud = unverified_claims(parent_token)[1].get("aud")
            audience = aud if isinstance(aud, str) else DEFAULT_AUDIENCE
        parent = verify_pass(parent_token, jwks=keys.jwks(), revoked=revoked,
                             audience=audience, issuer=issuer, now=t)
        if parent.order_id != order.id:
            raise PassError(f"the parent pass is for order {parent.order_id}, not {order.id}",
                            reason="P3")
        if len(parent.chain) >= MAX_CHAIN:
            # Never sign what no verifier would accept (DP-12).
            raise PassError(f"the parent pass is already link {len(parent.chain)} of a chain "
                            f"and verifiers accept at most {MAX_CHAIN} links; derive from a "
                            "pass nearer the worker's", reason="chain_too_long")
    audience = audience or DEFAULT_AUDIENCE
    base = parent.claims.grant if parent is not None else None
    if budget is None:
        budget_units = _default_budget(base.budget.units() if base else order.budget.units(),
                                       remaining)
    else:
        budget_units = _budget_units(budget)
    cap = parent.claims.exp if parent else parse_time(order.deadline).timestamp()
    if tools is not None:
        tool_list = _tool_list(tools)
    elif base is None:
        tool_list = list(order.tools)
    else:
        # By default a sub-agent gets every parent tool that reaches no staged tool.
        tool_list = [t for t in base.tools
                     if not any(overlap(t, s) is not None for s in order.staged)]
        if base.tools and not tool_list:
            raise PassError("every tool of the parent pass reaches a staged tool, which is "
                            "never delegated; name narrower tools", reason="P7")
    grant: dict[str, Any] = {"order_id": order.id, "tools": tool_list, "budget": budget_units}
    if parent is not None:
        grant["parent_jti"] = parent.jti
    else:
        grant.update(manager=order.manager, deadline=order.deadline, staged=list(order.staged))
    claims = {"spec": PASS_SPEC, "iss": issuer, "sub": subject, "aud": audience,
              "jti": secrets.token_hex(12), "iat": math.floor(t), "nbf": math.floor(t),
              "exp": _expiry(t, cap, expires_in, exp), "grant": grant}
    findings = list(iter_pass_findings(claims, order=order,
                                       parent=parent.claims if parent else None,
                                       remaining=remaining, now=t))
    if findings:
        first = findings[0]
        raise PassError("pass refused: " + "; ".join(f"{f.rule} {f.path}: {f.message}"
                                                     for f in findings), reason=first.rule)
    token = keys.sign(claims, parent=parent_token)
    if len(token) > MAX_TOKEN_BYTES:
        # Never sign what no verifier would read (as DP-12 for the chain's length).
        raise PassError(f"the pass would be {len(token)} bytes long and verifiers refuse a "
                        f"token over {MAX_TOKEN_BYTES} bytes unread; grant fewer or broader "
                        "tool patterns, or derive from a pass nearer the worker's",
                        reason="too_large")
    return token


def _refuse_ended_above(store: Store, order: WorkOrder) -> None:
    """InvalidTransition when an order above ``order`` has ended: a sub-order works only on
    the authority its parent still has (LC-16), so a pass issued under it would be one no
    gateway honours but a verifier holding only the key set would."""
    seen: set[str] = set()
    parent_id = order.parent_id
    while parent_id is not None and parent_id not in seen and len(seen) < MAX_ORDERS_ABOVE:
        seen.add(parent_id)
        above = store.load(parent_id)
        if above.state in TERMINAL:
            raise InvalidTransition(
                f"order {parent_id}, which order {order.id} is split from, is {above.state}; "
                "its sub-orders work on no more, so no pass is issued under them",
                state=above.state, action="issue_pass")
        parent_id = above.order.parent_id


def issue_recorded_pass(
    store: Store,
    order_id: str,
    *,
    keys: KeyStore,
    subject: str,
    audience: str | None = None,
    tools: Iterable[str] | None = None,
    budget: Budget | Mapping[str, float] | None = None,
    expires_in: timedelta | float | None = None,
    parent_token: str | None = None,
    issuer: str = DEFAULT_ISSUER,
    now: datetime | str | float | None = None,
) -> str:
    """Issue a pass for a stored order, against what remains of its budget, and record it.

    Raises:
        NotFound: no such order.
        InvalidTransition: the order is not accepted or working.
        PassError: as :func:`issue_pass`.
    """
    record = store.load(order_id)
    if record.state not in WORKING:
        raise InvalidTransition(f"order {order_id} is {record.state}; passes are issued while "
                                "it is accepted or working", state=record.state,
                                action="issue_pass")
    _refuse_ended_above(store, record.order)
    revoked = store.revoked()
    t = epoch_seconds(now)
    parent = None
    if parent_token is not None:
        aud = audience or unverified_claims(parent_token)[1].get("aud")
        parent = verify_pass(parent_token, jwks=keys.jwks(), revoked=revoked,
                             audience=aud if isinstance(aud, str) else DEFAULT_AUDIENCE,
                             issuer=issuer, now=t)
    token = issue_pass(record.order, subject=subject, keys=keys, audience=audience, tools=tools,
                       budget=budget, expires_in=expires_in, parent_token=parent_token,
                       remaining=remaining_budget(store, record.order, parent),
                       revoked=revoked, issuer=issuer, now=t)
    record_pass(store, token)
    # The order may have ended while the pass was being signed: its end revoked the passes
    # recorded by then, not this one. Whichever of the two wrote second sees the other, so
    # looking again after recording leaves no pass of an ended order unrevoked (DP-8).
    after = store.load(order_id)
    if after.state not in WORKING:
        revoke_order_passes(store, order_id, reason=f"order {after.state}", now=t)
        raise InvalidTransition(f"order {order_id} became {after.state} while the pass was "
                                "issued; the pass is revoked", state=after.state,
                                action="issue_pass")
    publish_keys(store, keys)
    return token
