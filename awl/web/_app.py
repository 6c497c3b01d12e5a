"""The approval page: the desk's manager view as a small Starlette app (BIND-9 to BIND-13).

Every change goes through the desk's own operations (:class:`~awl.Desk`,
:mod:`awl.desk.effects`, and the gateway's commit path for running effects), acting as the
principal of the signed-in session and nothing else: whatever those refuse is refused here,
and the refusal is shown in words. Pages are rendered on the server and work without
JavaScript; one external script (``/static/live.js``) listens to server-sent events and
reloads the page when the desk changes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import anyio.to_thread
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from awl.desk import Desk, OrderView
from awl.desk.access import check_party
from awl.desk.criteria import check_question
from awl.desk.effects import find_call, list_effects, manager_only, scope_of
from awl.desk.lineage import reports_below
from awl.desk.settlement import settle
from awl.desk.tokens import principal_for_token, token_hash
from awl.documents.checks import iter_report_findings
from awl.documents.display import scan
from awl.documents.errors import AWLError, BadRequest, Conflict, NotFound
from awl.documents.lifecycle import ACTIVE, TERMINAL
from awl.documents.limits import MAX_QUESTION_PAGE, QUESTION_PAGE
from awl.documents.models import parse_time
from awl.documents.patterns import parse_ref
from awl.documents.pointers import pointer
from awl.store.protocol import Store
from awl.store.urls import shown_url
from awl.web._links import ORDER, WORKER, legacy_target, link, order_url, worker_url
from awl.web._schemas import ToolSchemas
from awl.web._sessions import Session, Sessions
from awl.web._shown import exact, exact_json, fields, finalize
from gateway import commit, retry

__all__ = ["COOKIE", "CSP", "WebConfig", "build_app"]

COOKIE = "awl_session"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
"""The page's Content-Security-Policy: no inline script or style, nothing from elsewhere."""

_HERE = Path(__file__).parent
_STATIC = {"live.js": "text/javascript", "approve.js": "text/javascript",
           "page.css": "text/css"}
_SOON = timedelta(hours=24)
_STATUS = {"FORBIDDEN": 403, "NOT_FOUND": 404, "INVALID_TRANSITION": 409, "CONFLICT": 409}
_UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})

log = logging.getLogger("awl.web")

Handler = Callable[[Request], Awaitable[Response]]

FLASH_SESSIONS = 256
"""Sessions whose notes (what an action did, shown once on the next page) the page keeps
for them; past that, the notes of the session that acted longest ago are dropped."""
FLASH_NOTES = 20
"""Notes kept for one session (its latest)."""

MAX_BODY = 1024 * 1024
"""The largest request body the page reads, in bytes: a form of the page is far smaller, and
no field of a form may be longer anyway (the form parser's own limit)."""
BODY_SECONDS = 30.0
"""How long a request's body may take to arrive, in seconds, before it is refused."""


class WebConfig:
    """What the page needs besides the store.

    Args:
        upstream: the loaded gateway config the page commits with, or None (the page then
            shows the ``awl gateway … --commit`` command instead).
        upstream_path: the config's file name, for the commands the page shows.
        home: the desk's home folder as given, for the commands the page shows.
        store: the store URL as given (``--store``), for the commands the page shows (its
            password hidden).
        hosts: the ``Host`` values accepted (``host:port``); None accepts any (remote).
        public_url: the address browsers reach the page at (``--public-url``), or None; when
            it is ``https:`` the session cookie is ``Secure`` (as it is for any request that
            came over HTTPS, such as through a TLS proxy that says so).
        body_seconds: how long a request's body may take to arrive before it is refused.
    """

    def __init__(self, *, upstream: Any = None, upstream_path: str | None = None,
                 home: str | None = None, store: str | None = None,
                 hosts: frozenset[str] | None = None, public_url: str | None = None,
                 body_seconds: float | None = None) -> None:
        self.upstream = upstream
        self.upstream_path = upstream_path
        self.home = home
        self.store = store
        self.hosts = hosts
        self.public_url = public_url
        self.body_seconds = BODY_SECONDS if body_seconds is None else body_seconds


class _Guard:
    """Every response gets the security headers; on loopback a foreign ``Host`` is refused
    before anything else runs (DNS rebinding, SEC-2); a request body is read here, whole,
    before the page sees it: at most ``max_body`` bytes (413), arriving within
    ``body_seconds`` (408), so no one, signed in or not, can make the page parse or spool
    more, or hold it waiting for a body that never comes."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str] | None, *,
                 max_body: int = MAX_BODY, body_seconds: float = BODY_SECONDS) -> None:
        self.app = app
        self.hosts = hosts
        self.max_body = max_body
        self.body_seconds = body_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(b"content-security-policy", CSP.encode()),
                            (b"x-content-type-options", b"nosniff"),
                            (b"referrer-policy", b"same-origin"),
                            (b"x-frame-options", b"DENY"),
                            (b"cache-control", b"no-store")]
                message = {**message, "headers": headers}
            await send(message)

        async def refuse(status: int, line: str) -> None:
            await PlainTextResponse(line, status_code=status)(scope, receive, send_with_headers)

        if self.hosts is not None:
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1").lower()
            if host not in self.hosts:
                await refuse(421, f"refused: Host {host!r} is not this page's address; open "
                                  f"http://{min(self.hosts)}/ instead")
                return
        if scope["method"] in _UNSAFE:
            body = await self._body(scope, receive, refuse)
            if body is None:
                return
            receive = _replay(body, receive)
        await self.app(scope, receive, send_with_headers)

    async def _body(self, scope: Scope, receive: Receive,
                    refuse: Callable[[int, str], Awaitable[None]]) -> bytes | None:
        """The request's whole body, or None once it was refused (or the client left)."""
        limit = _size(self.max_body)
        too_large = (f"refused: the request's body is larger than {limit}, more than any form "
                     "of this page sends")
        sent = dict(scope["headers"]).get(b"content-length")
        if sent is not None:
            if not sent.isdigit():
                await refuse(400, "refused: the request's Content-Length is not a whole number")
                return None
            if int(sent) > self.max_body:
                await refuse(413, too_large)
                return None
        chunks: list[bytes] = []
        size, whole, gone = 0, False, False
        with anyio.move_on_after(self.body_seconds):
            while not (whole or gone or size > self.max_body):
                message = await receive()
                gone = message["type"] != "http.request"
                chunk = message.get("body", b"")
                size += len(chunk)
                chunks.append(chunk)
                whole = not message.get("more_body", False)
        if gone:
            return None  # the client went away: there is no one to answer
        if size > self.max_body:
            await refuse(413, too_large)
            return None
        if not whole:
            await refuse(408, f"refused: the request's body did not arrive within "
                              f"{self.body_seconds:g} seconds")
            return None
        return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` whole, then what the client sends next (its
    disconnect)."""
    given = False

    async def again() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return again


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n % (1024 * 1024) == 0 else f"{n} bytes"


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def _placeholders(value: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[str, str, str]]:
    """Each ``$ref`` placeholder in held arguments: (where, ref, pointer)."""
    if isinstance(value, dict):
        if isinstance(value.get("$ref"), str):
            yield pointer(*path) or "/", value["$ref"], str(value.get("pointer", ""))
            return
        for key, item in value.items():
            yield from _placeholders(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _placeholders(item, (*path, i))


def _tally(tools: Iterable[str]) -> str:
    """Tool names with how many times each comes: ``mail/send x2, issues/open`` (with a
    times sign)."""
    counts: dict[str, int] = {}
    for tool in tools:
        counts[tool] = counts.get(tool, 0) + 1
    return ", ".join(t if n == 1 else f"{t} \u00d7{n}" for t, n in counts.items())


def _digest(fingerprint: str) -> str:
    """A fingerprint of the desk's state (see ``fingerprint`` in :func:`build_app`) in short
    form, as a page carries it (``data-since``): it names no order."""
    return hashlib.sha256(fingerprint.encode()).hexdigest()[:32]


_DIGEST = re.compile(r"[0-9a-f]{32}")
ORDER_PAGE = QUESTION_PAGE
"""Events and calls an order's page shows at a time."""
_NOT_SUBMITTED = tuple(sorted((ACTIVE | TERMINAL) - {"submitted"}))


def _page_size(text: str) -> int:
    """A page's ``?limit=``: a whole number from 1 to the largest page."""
    size = _whole(text, "limit")
    if not 1 <= size <= MAX_QUESTION_PAGE:
        raise BadRequest(f"limit must be from 1 to {MAX_QUESTION_PAGE}, not {size}")
    return size


def build_app(store: Store, sessions: Sessions, config: WebConfig | None = None, *,
              desk: Desk | None = None) -> ASGIApp:
    """The approval page over ``store``."""
    cfg = config or WebConfig()
    desk = desk or Desk(store, conflict_retries=5)
    env = Environment(loader=FileSystemLoader(_HERE / "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True))
    env.filters["pretty"] = _pretty
    # Every printed value goes through the display rule (SEC-14); `exact` opts out.
    env.finalize = finalize
    env.filters["exact"] = exact
    env.filters["exact_json"] = exact_json
    schemas = ToolSchemas(cfg.upstream)
    # Every address a page links to or posts to is made by these (see awl.web._links).
    env.globals.update(order_url=order_url, worker_url=worker_url, events_url=partial(
        link, "/events"))
    flashes: dict[str, list[str]] = {}
    committing: set[str] = set()
    finished: dict[str, int] = {}

    def note(session_id: str, lines: list[str]) -> None:
        """Keep ``lines`` to show on the session's next page. A session that never shows
        another (a script that does not follow the redirect, a browser closed or signed
        out just after acting) left its notes here for as long as the page ran, so only
        the latest :data:`FLASH_NOTES` of the latest :data:`FLASH_SESSIONS` are kept."""
        kept = flashes.pop(session_id, [])
        kept.extend(lines)
        del kept[:-FLASH_NOTES]
        flashes[session_id] = kept  # the most recent last
        while len(flashes) > FLASH_SESSIONS:
            del flashes[next(iter(flashes))]

    def page(name: str, session: Session | None, status: int = 200, *,
             keep_notes: bool = False, **context: Any) -> HTMLResponse:
        # keep_notes: the page is already stale and its event stream will reload it; the
        # notes wait for that reload instead of flashing by.
        notes = flashes.pop(session.id, []) if session is not None and not keep_notes else []
        body = env.get_template(name).render(me=session, flashes=notes, **context)
        return HTMLResponse(body, status_code=status)

    async def session_of(request: Request) -> Session | None:
        return await live(request.cookies.get(COOKIE))

    async def live(session_id: str | None) -> Session | None:
        """The session, if it has not ended, expired, nor had its token revoked."""
        session = await anyio.to_thread.run_sync(sessions.get, session_id)
        if session is not None and session.token_hash is not None:
            # A session started with a desk token ends when the token is revoked (SEC-6).
            holder = await anyio.to_thread.run_sync(store.principal_for, session.token_hash)
            if holder != session.principal:
                await anyio.to_thread.run_sync(sessions.end, session.id)
                flashes.pop(session.id, None)
                return None
        return session

    def signed_in(handler: Callable[[Request, Session], Awaitable[Response]]) -> Handler:
        async def run(request: Request) -> Response:
            session = await session_of(request)
            if session is None:
                if request.method in _UNSAFE:
                    return page("refused.html", None, 403, message=(
                        "you are not signed in (or your session expired); sign in again"))
                return RedirectResponse("/signin", status_code=303)
            if request.method in _UNSAFE:
                form = await request.form()
                sent = form.get("csrf")
                if not session.csrf_ok(sent if isinstance(sent, str) else None):
                    return page("refused.html", session, 403, message=(
                        "this form did not come from your page (its CSRF token is missing or "
                        "wrong); reload the page and try again"))
            try:
                return await handler(request, session)
            except AWLError as exc:
                back = _the(request, "id") if request.url.path.startswith(ORDER) else None
                return page("refused.html", session,
                            _STATUS.get(exc.code, 400), message=exc.message, order_id=back)
        return run

    def secure(request: Request) -> bool:
        """Whether the browser reaches the page over HTTPS, so the cookie is ``Secure``."""
        public = (cfg.public_url or "").lower()
        return request.url.scheme == "https" or public.startswith("https:")

    async def start_session(request: Request, principal: str,
                            token_hash: str | None = None) -> Response:
        session = await anyio.to_thread.run_sync(sessions.start, principal, token_hash)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, session.id, max_age=int(sessions.ttl), httponly=True,
                            samesite="strict", path="/", secure=secure(request))
        return response

    async def signin(request: Request) -> Response:
        if request.method == "GET":
            code = request.query_params.get("code")
            if code is None:
                return page("signin.html", None)
            principal = sessions.use_code(code)
            if principal is None:
                return page("signin.html", None, 403, message=(
                    "that sign-in link was used already or is not one this page printed; "
                    "sign in with a desk token, or restart `awl web` for a new link"))
            return await start_session(request, principal)
        if not _same_origin(request):
            return page("signin.html", None, 403,
                        message="this sign-in did not come from this page")
        form = await request.form()
        token = form.get("token")
        token = token.strip() if isinstance(token, str) else ""
        found = await anyio.to_thread.run_sync(principal_for_token, store, token)
        if found is None:
            return page("signin.html", None, 403, message=(
                "that is not a desk token of this desk (or it was revoked); make one with "
                "`awl token issue PRINCIPAL`"))
        return await start_session(request, found, token_hash(token))

    async def signout(request: Request, session: Session) -> Response:
        await anyio.to_thread.run_sync(sessions.end, session.id)
        flashes.pop(session.id, None)  # no page of this session will show them now
        response = RedirectResponse("/signin", status_code=303)
        response.delete_cookie(COOKIE, path="/", secure=secure(request), httponly=True,
                               samesite="strict")
        return response

    def inbox_data(me: str, after: str | None = None, limit: int = QUESTION_PAGE,
                   cursors: Mapping[str, str] | None = None) -> dict[str, Any]:
        cursors = cursors or {}
        sized = None if limit == QUESTION_PAGE else str(limit)
        mine = desk.list(manager=me, limit=None)
        # Reports to review and the other orders a page at a time (BIND-26), newest first,
        # each page after the last order of the one before (the desk's `before`).
        review, more_review = paged(partial(desk.list, state="submitted", manager=me),
                                    cursors.get("review_after"), limit)
        others, more_others = paged(partial(desk.list, state=_NOT_SUBMITTED, manager=me),
                                    cursors.get("others_after"), limit)
        unknown: list[tuple[OrderView, Any]] = []
        approved: list[tuple[OrderView, Any]] = []
        for view in mine:
            effects = list_effects(view.id, store=store)
            unknown += [(view, e) for e in effects if e.state == "unknown"]
            scope = scope_of(view, effects)
            if scope is not None:
                approved.append((view, scope))
        soon_by = desk.now() + _SOON
        working = [v for v in desk.list(worker=me, limit=None) if v.active]
        near = sorted({v.id: v for v in [*mine, *working]
                       if v.active and parse_time(v.order.deadline) <= soon_by}.values(),
                      key=lambda v: v.order.deadline)
        questions = desk.questions(actor=me, limit=limit, after=after)
        more = None if questions.next is None else link(
            "/", after=questions.next, limit=sized) + "#questions"
        return {"review": review, "questions": questions.questions, "more_questions": more,
                "more_review": more_review and link(
                    "/", review_after=more_review, limit=sized) + "#review",
                "more_others": more_others and link(
                    "/", others_after=more_others, limit=sized) + "#others",
                "unknown": unknown, "approved": approved, "near": near, "working": working,
                "others": others}

    def paged(lister: Callable[..., list[OrderView]], after: str | None,
              limit: int) -> tuple[list[OrderView], str | None]:
        """One page of orders after the order ``after`` (None: the first page), and the
        cursor of the next page (None: this is the last)."""
        views = lister(limit=limit + 1, before=after)
        return views[:limit], views[limit - 1].id if len(views) > limit else None

    async def inbox(request: Request, session: Session) -> Response:
        # The question queue a page at a time (BIND-20): ?after= the cursor of the page
        # before, as its "next page" link gives it, and ?limit= its size.
        limit = request.query_params.get("limit")
        since = _digest(await anyio.to_thread.run_sync(fingerprint, session.principal, ""))
        cursors = {name: value for name in ("review_after", "others_after")
                   if (value := _the(request, name)) is not None}
        data = await anyio.to_thread.run_sync(
            inbox_data, session.principal, request.query_params.get("after"),
            QUESTION_PAGE if limit is None else _page_size(limit), cursors)
        return page("inbox.html", session, watch="", since=since, **data)

    def order_data(order_id: str, me: str,
                   tool_schemas: Mapping[str, dict[str, Any]] | None = None,
                   schema_note: str | None = None, events_after: int = 0,
                   calls_after: int = 0) -> dict[str, Any]:
        view = desk.get(order_id)
        check_party(view.order, me)
        order = view.order
        calls = store.calls(order_id)
        effects = list_effects(order_id, store=store)
        report = view.latest_report
        findings = []
        if report is not None:
            findings = list(iter_report_findings(report.to_json(), order.to_json(),
                                                 [c.to_json() for c in calls], None,
                                                 reports_below(store, order_id) or None))
        evidence = {c.id: [e for e in (report.evidence if report else ())
                           if e.criterion == c.id] for c in order.criteria}
        checks = desk.check_results(order_id)
        attempt = view.attempt
        choosable = {e.ref for e in (report.effects or ())} if report else set()
        held = [e for e in effects if e.attempt == attempt and e.state == "held"]
        home = f" --home {shlex.quote(cfg.home)}" if cfg.home else ""
        if cfg.store:
            home += f" --store {shlex.quote(shown_url(cfg.store))}"
        upstream = shlex.quote(cfg.upstream_path or "upstream.json")
        return {
            "view": view, "order": order, "report": report, "findings": findings,
            "evidence": evidence, "checks": checks,
            "check_questions": {cid: check_question(run) for cid, run in checks.items()},
            "effects": effects, "held": held, "choosable": choosable,
            "placeholders": {e.ref: list(_placeholders(e.arguments)) for e in effects},
            # What a person reads of each held call (SEC-14, BIND-23): its fields in its
            # tool's schema order, labelled from it, and a warning for each string in it
            # that is not what it looks like.
            "fields": {e.ref: fields(e.arguments, (tool_schemas or {}).get(e.tool))
                       for e in held},
            "schema_note": schema_note,
            "warnings": {e.ref: [f.line() for f in scan(e.arguments)] for e in effects},
            "scope": scope_of(view, effects),
            "held_tools": _tally(e.tool for e in held if e.ref in choosable),
            "usage": store.usage(order_id),
            **paged_log(order_id, calls, events_after, calls_after),
            "is_manager": me == order.manager, "may_answer": me in order.answerers,
            "can_commit": cfg.upstream is not None, "committing": order_id in committing,
            "commit_command": f"awl gateway --order {shlex.quote(order_id)} --config "
                              f"{upstream}{home} --commit",
            "retry_command": lambda ref: (
                f"awl effects retry {shlex.quote(order_id)} {shlex.quote(ref)} --config "
                f"{upstream} --as {shlex.quote(order.manager)}{home}"),
            "attempts": list(zip(view.reports, [*view.reviews, *([None] * len(view.reports))],
                                 strict=False)),
        }

    def paged_log(order_id: str, calls: list[Any], events_after: int,
                  calls_after: int) -> dict[str, Any]:
        """The order's events and calls a page at a time (BIND-26): those after the seq
        ``events_after`` and after the call numbered ``calls_after``, with the links to the
        next pages (None on the last)."""
        events = store.events(order_id, after=events_after, limit=ORDER_PAGE + 1)
        numbered = [(ref.n if (ref := parse_ref(c.ref)) else 0, c) for c in calls]
        later = [(n, c) for n, c in numbered if n > calls_after][:ORDER_PAGE + 1]
        more_events = more_calls = None
        if len(events) > ORDER_PAGE:
            more_events = order_url(order_id, events_after=str(events[ORDER_PAGE - 1].seq),
                                    calls_after=str(calls_after) if calls_after else None
                                    ) + "#log"
        if len(later) > ORDER_PAGE:
            more_calls = order_url(order_id, calls_after=str(later[ORDER_PAGE - 1][0]),
                                   events_after=str(events_after) if events_after else None
                                   ) + "#calls"
        return {"events": events[:ORDER_PAGE], "more_events": more_events,
                "calls": [c for _, c in later[:ORDER_PAGE]], "more_calls": more_calls,
                "earlier_log": bool(events_after or calls_after)}

    def held_tools(order_id: str, me: str) -> set[str]:
        """The tools of the order's calls held for its current attempt (whose schemas the
        page shows them by), when the order waits for review."""
        view = desk.get(order_id)
        check_party(view.order, me)
        if view.state != "submitted":
            return set()
        return {e.tool for e in list_effects(order_id, store=store)
                if e.attempt == view.attempt and e.state == "held"}

    async def order_page(request: Request, session: Session) -> Response:
        oid = _order_id(request)
        # The state the page is made from, read before its data: the page's event stream
        # compares against it, so a change between the page and its stream still reloads
        # it. The commit runs are taken first, on the loop, where a run ends together with
        # its note: a run that ends while the page is read makes the page stale, and its
        # note waits for the reload.
        runs = commit_runs(oid)
        since = _digest(await anyio.to_thread.run_sync(fingerprint, session.principal, oid,
                                                       runs))
        held = await anyio.to_thread.run_sync(held_tools, oid, session.principal)
        tool_schemas, note = await schemas.get(held)
        after = {name: _whole(value, name) for name in ("events_after", "calls_after")
                 if (value := _the(request, name)) is not None}
        data = await anyio.to_thread.run_sync(partial(
            order_data, oid, session.principal, tool_schemas, note, **after))
        return page("order.html", session, keep_notes=commit_runs(oid) != runs, watch=oid,
                    since=since, **data)

    async def call_page(request: Request, session: Session) -> Response:
        oid = _order_id(request)
        ref = request.query_params.get("ref", "")

        def load() -> dict[str, Any]:
            view = desk.get(oid)
            check_party(view.order, session.principal)
            return {"view": view, "call": find_call(store, oid, ref)}

        data = await anyio.to_thread.run_sync(load)
        return page("call.html", session, **data)

    def done(session: Session, order_id: str, line: str) -> Response:
        note(session.id, [line])
        return RedirectResponse(order_url(order_id), status_code=303)

    def text(form: Mapping[str, Any], name: str) -> str:
        value = form.get(name)
        return value if isinstance(value, str) else ""

    async def review(request: Request, session: Session) -> Response:
        oid = _order_id(request)
        form = await request.form()
        decision = text(form, "decision")
        me = session.principal
        # The page's review forms name the attempt they showed: a decision is about what the
        # manager saw, never about a later attempt (sent back and submitted again elsewhere
        # meanwhile) that a stale page or tab would otherwise approve unseen. The desk checks
        # it in the review's own write.
        seen = text(form, "attempt")
        shown = _whole(seen, "attempt") if seen else None
        if decision == "approve":
            chosen = [v for v in form.getlist("effect") if isinstance(v, str)]
            everything = text(form, "all") == "1"
            if everything and text(form, "confirmed") == "":
                # Approving all is confirmed first (BIND-24): by the page's script, which
                # asks and fills in `confirmed`, or without it on a page that asks.
                return await confirm_all(oid, session, shown)
            if not everything and not chosen and text(form, "none") != "1":
                raise BadRequest("you ticked no effect: tick the ones to run and approve "
                                 "again, or approve the report without running any")
            effects = None if everything else chosen
            counted = _whole(text(form, "confirmed"), "confirmed") if everything else None

            def approve() -> None:
                if everything:
                    expect_all(oid, counted, shown)
                desk.review(oid, me, "approve", effects=effects, attempt=shown)

            await anyio.to_thread.run_sync(approve)
            what = "all effects" if effects is None else (
                f"{len(chosen)} effect(s): {', '.join(chosen)}" if chosen else "no effects")
            return done(session, oid, f"approved with {what}")
        if decision == "rework":
            reason = text(form, "reason").strip() or None
            await anyio.to_thread.run_sync(
                lambda: desk.review(oid, me, "rework", reason, attempt=shown))
            return done(session, oid, "sent back for rework; its held calls are dropped")
        raise BadRequest(f"decision must be approve or rework, not {decision!r}")

    def expect_all(order_id: str, count: int | None, attempt: int | None) -> None:
        """Approving all effects, as confirmed for ``count`` of them: refused when the
        report lists another number by now (the confirmation named those it showed). A
        report of another attempt is the review's own refusal (BIND-11)."""
        view = desk.get(order_id)
        if attempt is not None and attempt != view.attempt:
            return
        listed = len(view.latest_report.effects or ()) if view.latest_report else 0
        if count != listed:
            raise Conflict(f"you confirmed approving {count} effect(s), but the report lists "
                           f"{listed}; read the order again")

    async def confirm_all(order_id: str, session: Session, attempt: int | None) -> Response:
        """The page that asks before approving all effects (when no script asked)."""
        def load() -> dict[str, Any]:
            view = desk.get(order_id)
            manager_only(view.order, session.principal, "review")
            report = view.latest_report
            listed = list(report.effects or ()) if report else []
            return {"view": view, "order": view.order, "listed": listed,
                    "tools": _tally(e.tool for e in listed), "attempt": attempt}
        data = await anyio.to_thread.run_sync(load)
        return page("confirm.html", session, **data)

    async def answer(request: Request, session: Session) -> Response:
        oid = _order_id(request)
        words = text(await request.form(), "answer")
        await anyio.to_thread.run_sync(desk.answer, oid, session.principal, words)
        return done(session, oid, "answered; the worker carries on")

    async def cancel(request: Request, session: Session) -> Response:
        oid = _order_id(request)
        reason = text(await request.form(), "reason")
        await anyio.to_thread.run_sync(desk.cancel, oid, session.principal, reason)
        return done(session, oid, "cancelled")

    async def settle_effect(request: Request, session: Session) -> Response:
        oid = _order_id(request)
        form = await request.form()
        ref, verdict = text(form, "ref"), text(form, "verdict")
        if verdict not in ("happened", "did_not_happen"):
            raise BadRequest("choose whether the effect happened or did not happen")
        evidence = text(form, "evidence")
        view = await anyio.to_thread.run_sync(
            lambda: settle(oid, ref, verdict, evidence, session.principal,  # type: ignore[arg-type]
                           store=store, desk=desk))
        return done(session, oid, f"settled {view.ref} as {verdict.replace('_', ' ')}")

    def need_upstream(action: str) -> Any:
        if cfg.upstream is None:
            raise BadRequest(f"this page was started without --config, so it cannot {action}; "
                             "run the command shown on the order page, or restart `awl web` "
                             "with --config upstream.json")
        return cfg.upstream

    async def manager_of(oid: str, me: str, action: str) -> None:
        record = await anyio.to_thread.run_sync(store.load, oid)
        manager_only(record.order, me, action)

    async def run_commit(request: Request, session: Session) -> Response:
        oid = _order_id(request)
        upstream = need_upstream("run the commit")
        await manager_of(oid, session.principal, "commit")
        record = await anyio.to_thread.run_sync(store.load, oid)
        if record.state != "approved":
            raise BadRequest(f"order {oid!r} is {record.state}; only an approved order's "
                             "effects run")
        if oid in committing:
            # A second run would only meet the first one's lock, and its end would tell the
            # page that nothing runs while the first still does.
            raise Conflict(f"a commit of order {oid!r} is running already; its page follows "
                           "each effect's state")

        async def run() -> None:
            # After the answer: the page shows each effect's state as it changes.
            try:
                notes = (await commit(oid, store=store, pool_or_config=upstream,
                                      desk=desk)).lines()
            except AWLError as exc:  # another live committer holds the lock, say
                notes = [f"refused: {exc.message}"]
            except Exception as exc:  # a bug or a surprise: said on the page, one log line
                said = " ".join(str(exc).split())[:300]
                log.warning("the commit of order %s failed unexpectedly: %s: %s", oid,
                            type(exc).__name__, said)
                notes = [f"the commit failed unexpectedly ({type(exc).__name__}: {said}); an "
                         "effect it had marked dispatching stays so until the next commit "
                         "marks it unknown: look at each effect before you commit again"]
            finally:
                committing.discard(oid)
                finished[oid] = finished.get(oid, 0) + 1
            note(session.id, notes)

        committing.add(oid)
        return RedirectResponse(order_url(oid), status_code=303,
                                background=BackgroundTask(run))

    async def retry_effect(request: Request, session: Session) -> Response:
        oid = _order_id(request)
        ref = text(await request.form(), "ref")
        upstream = need_upstream("retry an effect")
        outcome = await retry(oid, ref, session.principal, store=store,
                              pool_or_config=upstream, desk=desk)
        return done(session, oid, f"retried {outcome.ref}: {outcome.state}, {outcome.reason}")

    async def track(request: Request, session: Session) -> Response:
        worker = _the(request, "name")
        if worker is None:
            raise BadRequest("this address names no worker: it needs one ?name=")
        record = await anyio.to_thread.run_sync(
            lambda: desk.track(worker, viewer=session.principal))
        return page("track.html", session, worker=worker, record=record.to_json())

    def commit_runs(order_id: str) -> tuple[bool, int]:
        """Whether a commit of the order runs now, and how many have ended."""
        return order_id in committing, finished.get(order_id, 0)

    def fingerprint(me: str, order_id: str, runs: tuple[bool, int] | None = None) -> str:
        """The state a page shows, to tell when it changed (``runs``: the order's commit
        runs as taken, else now)."""
        if order_id:
            view = desk.get(order_id)
            check_party(view.order, me)
            states = [(e.ref, e.state) for e in list_effects(order_id, store=store)]
            return json.dumps([view.seq, states, *(runs or commit_runs(order_id))])
        views = {v.id: v.seq for v in desk.list(manager=me, limit=None)}
        views.update({v.id: v.seq for v in desk.list(worker=me, limit=None)})
        return json.dumps(sorted(views.items()))

    async def events(request: Request, session: Session) -> Response:
        order_id = request.query_params.get("order", "")
        me = session.principal
        first = await anyio.to_thread.run_sync(fingerprint, me, order_id)
        # The state the page was made from (``since``, see order_page): a change between
        # the page and this stream is told at once. Anything else starts from now.
        since = request.query_params.get("since", "")
        changed = _DIGEST.fullmatch(since) is not None and since != _digest(first)

        async def stream() -> AsyncIterator[bytes]:
            last, quiet = first, time.monotonic()
            yield b"retry: 2000\n\n"
            if changed:
                yield b"event: change\ndata: changed\n\n"
            # Checked on every turn, as every request is: a revoked token ends the stream.
            while await live(session.id) is not None:
                if order_id:
                    # The desk's own wait: woken at once by writes through this desk,
                    # polling for writes by other processes.
                    seq = json.loads(last)[0]
                    await anyio.to_thread.run_sync(
                        partial(desk.wait, order_id, seq, timeout=1.0), abandon_on_cancel=True)
                else:
                    await anyio.sleep(0.5)
                now = await anyio.to_thread.run_sync(fingerprint, me, order_id)
                if now != last:
                    last = now
                    yield b"event: change\ndata: changed\n\n"
                elif time.monotonic() - quiet > 15:
                    quiet = time.monotonic()
                    yield b": still here\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    def legacy(kind: str) -> Handler:
        # The addresses of before (``/orders/ID``, ``/orders/ID/ACTION``, ``/workers/NAME``;
        # notifications sent earlier link the first): each is sent on to its address now, a
        # POST with its form (307 keeps both), when it names one order or worker.
        async def redirect(request: Request, session: Session) -> Response:
            rest = _sent_rest(request, f"/{kind}/")
            target = legacy_target(kind, rest, request.method, dict(request.query_params))
            if target is None:
                raise NotFound(f"this address names no {kind[:-1]} (a '.' or '..' in an "
                               "address is lost on its way); open it from the inbox")
            return RedirectResponse(target, status_code=307)
        return signed_in(redirect)

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC:
            return PlainTextResponse(f"no static file {name!r}", status_code=404)
        return FileResponse(_HERE / "static" / name, media_type=_STATIC[name])

    routes = [
        Route("/signin", signin, methods=["GET", "POST"]),
        Route("/signout", signed_in(signout), methods=["POST"]),
        Route("/", signed_in(inbox)),
        Route("/events", signed_in(events)),
        # An order id or a worker's name may be any string, '.', '..', 'x/call' and '50%'
        # among them: each goes in the query string (?id=, ?name=), never in the path.
        Route(ORDER, signed_in(order_page)),
        Route(f"{ORDER}/call", signed_in(call_page)),
        Route(f"{ORDER}/review", signed_in(review), methods=["POST"]),
        Route(f"{ORDER}/answer", signed_in(answer), methods=["POST"]),
        Route(f"{ORDER}/cancel", signed_in(cancel), methods=["POST"]),
        Route(f"{ORDER}/settle", signed_in(settle_effect), methods=["POST"]),
        Route(f"{ORDER}/retry", signed_in(retry_effect), methods=["POST"]),
        Route(f"{ORDER}/commit", signed_in(run_commit), methods=["POST"]),
        Route(WORKER, signed_in(track)),
        Route("/orders/{rest:path}", legacy("orders"), methods=["GET", "POST"]),
        Route("/workers/{rest:path}", legacy("workers")),
        Route("/static/{name}", static),
    ]
    return _Guard(Starlette(routes=routes), cfg.hosts, body_seconds=cfg.body_seconds)


def _the(request: Request, name: str) -> str | None:
    """The one non-empty value of ``name`` in the query string, else None (absent, empty or
    given twice: an address that names two orders names none)."""
    values = request.query_params.getlist(name)
    return values[0] if len(values) == 1 and values[0] else None


def _order_id(request: Request) -> str:
    """The order the address names (``?id=``)."""
    order_id = _the(request, "id")
    if order_id is None:
        raise BadRequest("this address names no order: it needs one ?id= (open the order "
                         "from the inbox)")
    return order_id


def _sent_rest(request: Request, prefix: str) -> str:
    """What follows ``prefix`` in the path as the client sent it (percent-encoded, so an
    encoded ``/`` stays apart from a literal one), or re-encoded from the decoded path when
    the server does not say (``raw_path`` is optional in ASGI)."""
    raw = request.scope.get("raw_path")
    sent = raw.decode("ascii", "replace") if isinstance(raw, bytes) else ""
    root = request.scope.get("root_path", "")
    if root and sent.startswith(root):
        sent = sent[len(root):]
    if sent.startswith(prefix):
        return sent[len(prefix):]
    return quote(request.path_params["rest"], safe="/")


def _whole(text: str, name: str) -> int:
    """A whole number given in the query string (the desk checks its range)."""
    try:
        return int(text, 10)
    except ValueError:
        raise BadRequest(f"{name} must be a whole number, not {text[:40]!r}") from None


def _same_origin(request: Request) -> bool:
    """Whether a form post came from this page: browsers say where a post came from in
    ``Sec-Fetch-Site`` and ``Origin``; a client that sends neither (a script, curl) is let
    through, as it carries no browser's cookies."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin is None or (origin == "null" and site is not None):
        return True
    return origin.split("://", 1)[-1] == request.headers.get("host", "")
