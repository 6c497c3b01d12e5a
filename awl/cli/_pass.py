"""``awl pass``: issue, show, revoke Delegation Passes and export the desk's public keys."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import time
from collections.abc import Iterator
from typing import Any

# Keys and issuing (PyJWT, cryptography) load when a command uses them: through the package.
from awl import passes
from awl.cli._common import CLIError, add_json_option, add_store_option, stdin_text
from awl.desk import Desk
from awl.desk.home import default_store, home_dir
from awl.documents.errors import AWLError, BadRequest, NotFound, PassError
from awl.documents.limits import INT64_MAX, check_epoch, show_value
from awl.documents.models import format_epoch
from awl.passes import (
    DEFAULT_AUDIENCE,
    VerifiedPass,
    revoke_pass,
    unverified_claims,
    verify_pass,
)
from awl.store.urls import STORE_ENV

_UNITS = {"usd": float, "tokens": int, "tool_calls": int, "seconds": float}
_DURATION = re.compile(r"^(?P<n>[0-9]+(?:\.[0-9]+)?)(?P<unit>[smhd]?)$")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def register(subparsers: Any) -> None:
    """Add ``pass`` and its subcommands to the ``awl`` command."""
    group = subparsers.add_parser(
        "pass", help="issue, show and revoke Delegation Passes",
        description="Delegation Passes: signed grants that only narrow. A worker's pass comes "
                    "from an order; a sub-agent's pass from a parent pass.")
    sub = group.add_subparsers(dest="pass_command", metavar="COMMAND", required=True)

    issue = sub.add_parser(
        "issue", help="issue a pass and print the token",
        description="Issue a pass for an order (the worker's) or from --parent (a sub-agent's). "
                    "Defaults grant the most the rules allow; asking for more is refused with "
                    "the rule it breaks.")
    issue.add_argument("--order", metavar="ID", help="the order (default: the parent's)")
    issue.add_argument("--to", required=True, metavar="SUBJECT", help="who will hold the pass")
    issue.add_argument("--tools", metavar="P,...", help="tool patterns to grant, comma-separated")
    issue.add_argument("--budget", metavar="UNIT=N,...",
                       help="limits to grant, e.g. usd=1,tool_calls=5")
    issue.add_argument("--expires", metavar="DURATION",
                       help="lifetime such as 90s, 15m, 1h, 2d (default: the parent's expiry, "
                            "else the order deadline)")
    issue.add_argument("--parent", metavar="TOKEN", help="derive from this pass (- for stdin)")
    issue.add_argument("--audience", metavar="A",
                       help=f"who will accept it (default: the parent's, else {DEFAULT_AUDIENCE})")
    _common(issue, desk=True)
    issue.set_defaults(func=_issue)

    show = sub.add_parser("show", help="decode a pass and check it",
                          description="Decode a pass, check it and its chain against this "
                                      "desk's keys and revocations, and print the verdict. "
                                      "Exit 1 when it is refused.")
    show.add_argument("token", metavar="TOKEN", help="the pass (- for stdin)")
    show.add_argument("--audience", metavar="A", help="check for this audience (default: its own)")
    _common(show, desk=True)
    show.set_defaults(func=_show)

    rev = sub.add_parser(
        "revoke", help="revoke a pass and every pass derived from it",
        description="Revoke a pass this desk issued, named by its jti (`awl pass show` prints "
                    "it) or given whole (- for stdin); every pass derived from it is refused "
                    "too. A jti this desk never issued is refused, since it is most likely "
                    "mistyped and the pass meant would stay valid.")
    rev.add_argument("jti", metavar="JTI|PASS", help="the pass's jti, or the pass (- for stdin)")
    rev.add_argument("--reason", default="revoked by hand", help="why (kept with the revocation)")
    rev.add_argument("--not-issued-here", action="store_true",
                     help="revoke the jti even though this desk has no record of issuing it "
                          "(a pass issued by the library's issue_pass, which records nothing)")
    _common(rev, desk=True)
    rev.set_defaults(func=_revoke)

    jwks = sub.add_parser("jwks", help="print the public key set (JWKS) verifiers need",
        description="Print the desk's public signing keys as a JSON Web Key Set, for gateways "
                    "that verify passes on other hosts.")
    _common(jwks)
    jwks.set_defaults(func=_jwks)

    rotate = sub.add_parser("rotate", help="make a new signing key; old passes stay valid",
        description="Make a new signing key and sign new passes with it. Passes signed with "
                    "older keys stay valid until they expire or their key is retired.")
    _common(rotate, desk=True)
    rotate.set_defaults(func=_rotate)

    retire = sub.add_parser(
        "retire", help="delete an old signing key: every pass it signed stops verifying",
        description="Delete a signing key that is no longer current (a leaked one, say). Every "
                    "pass it signed, and every pass derived from one, is refused from the next "
                    "request of any running gateway; the current key cannot be retired "
                    "(rotate first).")
    retire.add_argument("kid", metavar="KID", help="the key's kid (`awl pass jwks` lists them); "
                        "a kid beginning with '-' goes after `--`")
    _common(retire, desk=True)
    retire.set_defaults(func=_retire)


def _common(parser: argparse.ArgumentParser, *, desk: bool = False) -> None:
    """``--home`` and ``--json``; with ``desk`` (a command that opens the store) ``--store``."""
    parser.add_argument("--home", metavar="DIR", help="the desk's home (default: $AWL_HOME, "
                        "else ./.awl)")
    if desk:
        add_store_option(parser)
    add_json_option(parser)


def _fail(message: str) -> Exception:
    return CLIError(message)


def _token(text: str) -> str:
    token = stdin_text("the pass") if text == "-" else text
    return token.strip()


def _parse_budget(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        unit, sep, value = part.partition("=")
        unit = unit.strip()
        if not sep or unit not in _UNITS:
            raise _fail(f"--budget {part!r}: write UNIT=N with UNIT one of "
                        f"{', '.join(_UNITS)}")
        try:
            number = _UNITS[unit](value.strip())
        except ValueError:
            raise _fail(f"--budget {unit}: {value.strip()!r} is not a "
                        f"{'whole ' if _UNITS[unit] is int else ''}number") from None
        if number < 0:
            raise _fail(f"--budget {unit}: a limit is never negative")
        if not math.isfinite(number) or number > INT64_MAX:  # DOC-12: 1e400, inf, nan
            raise _fail(f"--budget {unit}: {value.strip()[:40]!r} is not a finite number up "
                        f"to {INT64_MAX}; give a real limit")
        out[unit] = int(number) if number == int(number) else number  # usd=1 stays 1
    if not out:
        raise _fail("--budget names no unit; e.g. usd=1,tool_calls=5")
    return out


def _parse_duration(text: str) -> float:
    m = _DURATION.match(text.strip())
    if m is None or float(m.group("n")) <= 0:
        raise _fail(f"--expires {text!r}: write a positive duration such as 90s, 15m, 1h, 2d")
    return float(m.group("n")) * _SECONDS[m.group("unit")]


def _issue(args: argparse.Namespace) -> int:
    parent = _token(args.parent) if args.parent is not None else None
    order_id = args.order
    if order_id is None:
        if parent is None:
            raise _fail("name the order with --order ID (or derive with --parent TOKEN)")
        grant = unverified_claims(parent)[1].get("grant")
        order_id = grant.get("order_id") if isinstance(grant, dict) else None
        if not isinstance(order_id, str):
            raise _fail("the parent pass names no order; give --order ID")
    # Only a --tools left out grants the default (the most allowed): an empty one, say
    # `--tools "$TOOLS"` with TOOLS unset, grants no tool rather than every one.
    tools = (None if args.tools is None
             else [t.strip() for t in args.tools.split(",") if t.strip()])
    budget = _parse_budget(args.budget) if args.budget is not None else None
    expires = _parse_duration(args.expires) if args.expires is not None else None
    home = home_dir(args.home)
    store = default_store(home, url=args.store)
    try:
        token = passes.issue_recorded_pass(
            store, order_id, keys=passes.KeyStore(home), subject=args.to,
            audience=args.audience, tools=tools, budget=budget, expires_in=expires,
            parent_token=parent)
    finally:
        store.close()
    if args.json:
        claims = unverified_claims(token)[1]
        print(json.dumps({"token": token, "jti": claims["jti"], "exp": claims["exp"]}))
    else:
        print(token)
    return 0


def _links(token: str) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """Header and claims of every link, this pass first, read without verifying."""
    current: str | None = token
    while current is not None:
        header, claims = unverified_claims(current)
        yield header, claims
        parent = header.get("parent")
        current = parent if isinstance(parent, str) else None


def _epoch(value: Any) -> int | float | None:
    """A claim that is a time within years 1 to 9999 (DOC-14), else None."""
    try:
        return check_epoch(value, name="the time")
    except BadRequest:
        return None


def _when(value: Any) -> str:
    epoch = _epoch(value)
    if epoch is None:
        return f"{show_value(value)} (not a time)"
    return format_epoch(epoch)


def _names(value: Any) -> str:
    """A claim that should be a list of patterns, shown whatever it holds."""
    if not isinstance(value, list):
        return f"{show_value(value)} (not a list)"
    return ", ".join(map(str, value)) or "(none)"


def _show(args: argparse.Namespace) -> int:
    token = _token(args.token)
    links = list(_links(token))
    _, claims = links[0]
    aud = claims.get("aud")
    audience: str = args.audience or (aud if isinstance(aud, str) else DEFAULT_AUDIENCE)
    home = home_dir(args.home)
    store = default_store(home, url=args.store)
    try:
        order_id = _object(claims.get("grant")).get("order_id")
        if isinstance(order_id, str):
            # Reading the order revokes its passes if it ended and its end was cut short
            # (a desk killed right after the ending event): never "valid" for an ended order.
            with contextlib.suppress(AWLError):
                Desk(store).get(order_id)
        revoked = store.revoked()
    finally:
        store.close()
    verified: VerifiedPass | None = None
    refusal: PassError | None = None
    try:
        verified = verify_pass(token, jwks=passes.KeyStore(home).jwks(), revoked=revoked,
                               audience=audience)
    except PassError as exc:
        refusal = exc
    chain = [c for _, c in reversed(links)]
    if args.json:
        print(json.dumps({
            "valid": verified is not None,
            "reason": refusal.reason if refusal else None,
            "message": refusal.message if refusal else None,
            "header": {k: v for k, v in links[0][0].items() if k != "parent"},
            "claims": claims,
            "chain": [{"jti": c.get("jti"), "sub": c.get("sub")} for c in chain],
        }, indent=2))
    else:
        for line in _describe(claims, chain, verified):
            print(line)
        verdict = "valid" if refusal is None else f"REFUSED ({refusal.reason}): {refusal.message}"
        print(f"{'verdict':<9} {verdict}")
    return 0 if refusal is None else 1


def _describe(claims: dict[str, Any], chain: list[dict[str, Any]],
              verified: VerifiedPass | None) -> Iterator[str]:
    grant = _object(claims.get("grant"))
    root = _object(chain[0].get("grant"))
    budget = _object(grant.get("budget"))
    exp = claims.get("exp")
    left = ""
    until = _epoch(exp)
    if until is not None:
        seconds = int(until - time.time())
        left = (f" (expires in {_span(seconds)})" if seconds > 0
                else f" (expired {_span(-seconds)} ago)")
    rows = [
        ("pass", claims.get("jti")),
        ("subject", claims.get("sub")),
        ("issuer", claims.get("iss")),
        ("audience", claims.get("aud")),
        ("order", f"{grant.get('order_id')} (manager {root.get('manager', '?')}, "
                  f"deadline {root.get('deadline', '?')})"),
        ("tools", _names(grant.get("tools", []))),
        ("staged", _names(root.get("staged", []))),
        ("budget", " ".join(f"{k}={v}" for k, v in budget.items()) or "(none)"),
        ("valid", f"{_when(claims.get('nbf'))} to {_when(exp)}{left}"),
        ("chain", " -> ".join(f"{c.get('jti')} ({c.get('sub')})" for c in chain)),
    ]
    if verified is not None:
        rows.append(("key", verified.kid))
    for name, value in rows:
        yield f"{name:<9} {value}"


def _object(value: Any) -> dict[str, Any]:
    # `show` prints whatever a token holds, even claims that are not a valid pass.
    return value if isinstance(value, dict) else {}


def _span(seconds: int) -> str:
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _revoke(args: argparse.Namespace) -> int:
    jti = _jti(args.jti)
    store = default_store(args.home, url=args.store)
    try:
        if (not args.not_issued_here and store.saved_pass(jti) is None
                and jti not in store.revoked()):
            raise NotFound(f"this desk issued no pass with jti {show_value(jti)}, so nothing "
                           "was revoked; `awl pass show TOKEN` prints a pass's jti (or give "
                           "the pass itself), and --not-issued-here revokes a jti issued "
                           "elsewhere")
        revoke_pass(store, jti, args.reason)
    finally:
        store.close()
    if args.json:
        print(json.dumps({"revoked": jti, "reason": args.reason}))
    else:
        print(f"revoked {jti}: passes derived from it are refused too")
    return 0


def _jti(text: str) -> str:
    """The jti named on the command line: as given, or read from a whole pass (- for stdin).
    Revoking only narrows, so the pass's claims are read without verifying them."""
    given = _token(text)
    if given.count(".") != 2:
        if not given:
            raise _fail("name the pass to revoke by its jti (or give the pass itself)")
        return given
    try:
        _, claims = unverified_claims(given)
    except PassError as exc:
        raise _fail(f"cannot read that pass: {exc.message}") from None
    jti = claims.get("jti")
    if not isinstance(jti, str) or not jti:
        raise _fail("that pass carries no jti to revoke")
    return jti


def _jwks(args: argparse.Namespace) -> int:
    jwks = passes.KeyStore(home_dir(args.home)).jwks()
    print(json.dumps(jwks, indent=None if args.json else 2))
    return 0


def _publish(args: argparse.Namespace, keys: passes.KeyStore) -> None:
    """Publish the public keys in the store named by ``--store`` or ``AWL_STORE`` (if any
    keeps them), for gateways on other hosts."""
    if not (args.store or os.environ.get(STORE_ENV)):
        return
    store = default_store(args.home, url=args.store)
    try:
        passes.publish_keys(store, keys)
    finally:
        store.close()


def _rotate(args: argparse.Namespace) -> int:
    keys = passes.KeyStore(home_dir(args.home))
    kid = keys.rotate()
    _publish(args, keys)
    if args.json:
        print(json.dumps({"kid": kid, "kids": keys.kids()}))
    else:
        print(f"new signing key {kid}; {len(keys.kids()) - 1} older key(s) still verify")
    return 0


def _retire(args: argparse.Namespace) -> int:
    keys = passes.KeyStore(home_dir(args.home))
    keys.retire(args.kid)
    _publish(args, keys)
    if args.json:
        print(json.dumps({"retired": args.kid, "kids": keys.kids()}))
    else:
        print(f"retired key {args.kid}: passes it signed are refused from the next request on")
    return 0
