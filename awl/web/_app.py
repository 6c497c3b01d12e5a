"""The approval page: the desk's manager view as a small Starlette app (BIND-9 to BIND-13).

Every change goes through the desk's own operations (:class:`~awl.Desk`,
:mod:`awl.desk.effects`, and the gateway's commit path for running effects), acting as the
principal of the signed-in session and nothing else: whatever those refuse is refused here,
and the refusal is shown in words. Pages are rendered on the server and work without
JavaScript; one external script (``/static/live.js``) listens to server-sent events and
reloads the page when the desk changes.

:class:`ApprovalPage` holds one method per route and reaches the store only through its
:class:`~awl.desk.AsyncDesk`; :func:`build_app` puts its routes behind the
:class:`~awl.web._guard.Guard` (Host check, body limits, security headers).
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
from starlette.types import ASGIApp

from awl.desk import AsyncDesk, Desk, OrderView
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
from awl.web._guard import BODY_SECONDS, UNSAFE, Guard
from awl.web._links import ORDER, WORKER, legacy_target, link, order_url, worker_url
from awl.web._schemas import ToolSchemas
from awl.web._sessions import Session, Sessions
from awl.web._shown import exact, exact_json, fields, finalize
from gateway import commit, retry

__all__ = ["COOKIE", "ApprovalPage", "WebConfig", "build_app"]

COOKIE = "awl_session"

_HERE = Path(__file__).parent
_STATIC = {"live.js": "text/javascript", "approve.js": "text/javascript",
           "page.css": "text/css"}
_SOON = timedelta(hours=24)
_STATUS = {"FORBIDDEN": 403, "NOT_FOUND": 404, "INVALID_TRANSITION": 409, "CONFLICT": 409,
           "STORE_UNAVAILABLE": 503}

log = logging.getLogger("awl.web")

Handler = Callable[[Request], Awaitable[Response]]

FLASH_SESSIONS = 256
"""Sessions whose notes (what an action did, shown once on the next page) the page keeps
for them; past that, the notes of the session that acted longest ago are dropped."""
FLASH_NOTES = 20
"""Notes kept for one session (its latest)."""


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
    """A fingerprint of the desk's state (see :meth:`ApprovalPage._fingerprint`) in short
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
    """The approval page over ``store``, behind its :class:`~awl.web._guard.Guard`."""
    page = ApprovalPage(store, sessions, config, desk=desk)
    return Guard(Starlette(routes=page.routes()), page.cfg.hosts,
                 body_seconds=page.cfg.body_seconds)


class ApprovalPage:
    """The approval page: one method per route, over one desk.

    Every read and write of the store runs in a worker thread through :attr:`desk` (an
    :class:`~awl.desk.AsyncDesk`), so the event loop never blocks on the store, and the
    page's writes wake its own event streams at once.

    Args:
        store: the desk's store.
        sessions: the browsers signed in (kept in the store).
        config: what the page needs besides the store.
        desk: the desk to act through (by default one over ``store``).
    """

    def __init__(self, store: Store, sessions: Sessions, config: WebConfig | None = None, *,
                 desk: Desk | None = None) -> None:
        self.store = store
        self.sessions = sessions
        self.cfg = config or WebConfig()
        self.desk = AsyncDesk.of(desk or Desk(store, conflict_retries=5))
        self.schemas = ToolSchemas(self.cfg.upstream)
        self.env = _environment()
        self.flashes: dict[str, list[str]] = {}
        """The notes (what an action did) each session's next page shows, by session id."""
        self.committing: set[str] = set()
        """The orders a commit of this page runs for now."""
        self.finished: dict[str, int] = {}
        """How many commits of this page have ended, by order."""

    def routes(self) -> list[Route]:
        """The page's routes, for a :class:`~starlette.applications.Starlette` app."""
        signed_in = self._signed_in
        return [
            Route("/signin", self.signin, methods=["GET", "POST"]),
            Route("/signout", signed_in(self.signout), methods=["POST"]),
            Route("/", signed_in(self.inbox)),
            Route("/events", signed_in(self.events)),
            # An order id or a worker's name may be any string, '.', '..', 'x/call' and '50%'
            # among them: each goes in the query string (?id=, ?name=), never in the path.
            Route(ORDER, signed_in(self.order_page)),
            Route(f"{ORDER}/call", signed_in(self.call_page)),
            Route(f"{ORDER}/review", signed_in(self.review), methods=["POST"]),
            Route(f"{ORDER}/answer", signed_in(self.answer), methods=["POST"]),
            Route(f"{ORDER}/cancel", signed_in(self.cancel), methods=["POST"]),
            Route(f"{ORDER}/settle", signed_in(self.settle_effect), methods=["POST"]),
            Route(f"{ORDER}/retry", signed_in(self.retry_effect), methods=["POST"]),
            Route(f"{ORDER}/commit", signed_in(self.run_commit), methods=["POST"]),
            Route(WORKER, signed_in(self.track)),
            Route("/orders/{rest:path}", signed_in(partial(self._legacy, "orders")),
                  methods=["GET", "POST"]),
            Route("/workers/{rest:path}", signed_in(partial(self._legacy, "workers"))),
            Route("/static/{name}", self.static),
        ]

    # ----------------------------------------------------------------------- the frame

    def _note(self, session_id: str, lines: list[str]) -> None:
        """Keep ``lines`` to show on the session's next page. A session that never shows
        another (a script that does not follow the redirect, a browser closed or signed
        out just after acting) left its notes here for as long as the page ran, so only
        the latest :data:`FLASH_NOTES` of the latest :data:`FLASH_SESSIONS` are kept."""
        flashes = self.flashes
        kept = flashes.pop(session_id, [])
        kept.extend(lines)
        del kept[:-FLASH_NOTES]
        flashes[session_id] = kept  # the most recent last
        while len(flashes) > FLASH_SESSIONS:
            del flashes[next(iter(flashes))]

    def _page(self, name: str, session: Session | None, status: int = 200, *,
              keep_notes: bool = False, **context: Any) -> HTMLResponse:
        # keep_notes: the page is already stale and its event stream will reload it; the
        # notes wait for that reload instead of flashing by.
        notes = (self.flashes.pop(session.id, [])
                 if session is not None and not keep_notes else [])
        body = self.env.get_template(name).render(me=session, flashes=notes, **context)
        return HTMLResponse(body, status_code=status)

    def _done(self, session: Session, order_id: str, line: str) -> Response:
        self._note(session.id, [line])
        return RedirectResponse(order_url(order_id), status_code=303)

    async def _session_of(self, request: Request) -> Session | None:
        return await self._live(request.cookies.get(COOKIE))

    async def _live(self, session_id: str | None) -> Session | None:
        """The session, if it has not ended, expired, nor had its token revoked."""
        session = await self.desk.run(self.sessions.get, session_id)
        if session is not None and session.token_hash is not None:
            # A session started with a desk token ends when the token is revoked (SEC-6).
            holder = await self.desk.run(self.store.principal_for, session.token_hash)
            if holder != session.principal:
                await self.desk.run(self.sessions.end, session.id)
                self.flashes.pop(session.id, None)
                return None
        return session

    def _signed_in(self, handler: Callable[[Request, Session], Awaitable[Response]]
                   ) -> Handler:
        """``handler`` for a signed-in session only, its forms checked against CSRF, and
        the desk's refusals shown as a page."""
        async def run(request: Request) -> Response:
            session = await self._session_of(request)
            if session is None:
                if request.method in UNSAFE:
                    return self._page("refused.html", None, 403, message=(
                        "you are not signed in (or your session expired); sign in again"))
                return RedirectResponse("/signin", status_code=303)
            if request.method in UNSAFE:
                form = await request.form()
                sent = form.get("csrf")
                if not session.csrf_ok(sent if isinstance(sent, str) else None):
                    return self._page("refused.html", session, 403, message=(
                        "this form did not come from your page (its CSRF token is missing or "
                        "wrong); reload the page and try again"))
            try:
                return await handler(request, session)
            except AWLError as exc:
                back = _the(request, "id") if request.url.path.startswith(ORDER) else None
                heading = None
                if exc.code == "STORE_UNAVAILABLE":  # not the manager's doing: the operator's
                    log.warning("awl web: %s %s: %s", request.method, request.url.path,
                                exc.message)
                    heading = "The desk cannot be reached"
                return self._page("refused.html", session,
                                  _STATUS.get(exc.code, 400), message=exc.message,
                                  order_id=back, heading=heading)
        return run

    def _secure(self, request: Request) -> bool:
        """Whether the browser reaches the page over HTTPS, so the cookie is ``Secure``."""
        public = (self.cfg.public_url or "").lower()
        return request.url.scheme == "https" or public.startswith("https:")

    def _need_upstream(self, action: str) -> Any:
        if self.cfg.upstream is None:
            raise BadRequest(f"this page was started without --config, so it cannot {action}; "
                             "run the command shown on the order page, or restart `awl web` "
                             "with --config upstream.json")
        return self.cfg.upstream

    # ----------------------------------------------------------------------- signing in

    async def _start_session(self, request: Request, principal: str,
                             token_hash: str | None = None) -> Response:
        session = await self.desk.run(self.sessions.start, principal, token_hash)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, session.id, max_age=int(self.sessions.ttl), httponly=True,
                            samesite="strict", path="/", secure=self._secure(request))
        return response

    async def signin(self, request: Request) -> Response:
        """``/signin``: the form (GET), a printed sign-in link (``?code=``), or a desk
        token posted."""
        if request.method == "GET":
            code = request.query_params.get("code")
            if code is None:
                return self._page("signin.html", None)
            principal = self.sessions.use_code(code)
            if principal is None:
                return self._page("signin.html", None, 403, message=(
                    "that sign-in link was used already or is not one this page printed; "
                    "sign in with a desk token, or restart `awl web` for a new link"))
            return await self._start_session(request, principal)
        if not _same_origin(request):
            return self._page("signin.html", None, 403,
                              message="this sign-in did not come from this page")
        form = await request.form()
        token = form.get("token")
        token = token.strip() if isinstance(token, str) else ""
        found = await self.desk.run(principal_for_token, self.store, token)
        if found is None:
            return self._page("signin.html", None, 403, message=(
                "that is not a desk token of this desk (or it was revoked); make one with "
                "`awl token issue PRINCIPAL`"))
        return await self._start_session(request, found, token_hash(token))

    async def signout(self, request: Request, session: Session) -> Response:
        """``/signout``: the session ends, on every page that shares the store."""
        await self.desk.run(self.sessions.end, session.id)
        self.flashes.pop(session.id, None)  # no page of this session will show them now
        response = RedirectResponse("/signin", status_code=303)
        response.delete_cookie(COOKIE, path="/", secure=self._secure(request), httponly=True,
                               samesite="strict")
        return response

    # ----------------------------------------------------------------------- reading

    async def inbox(self, request: Request, session: Session) -> Response:
        """``/``: what waits for the signed-in principal."""
        # The question queue a page at a time (BIND-20): ?after= the cursor of the page
        # before, as its "next page" link gives it, and ?limit= its size.
        limit = request.query_params.get("limit")
        since = _digest(await self.desk.run(self._fingerprint, session.principal, ""))
        cursors = {name: value for name in ("review_after", "others_after")
                   if (value := _the(request, name)) is not None}
        data = await self.desk.run(
            self._inbox_data, session.principal, request.query_params.get("after"),
            QUESTION_PAGE if limit is None else _page_size(limit), cursors)
        return self._page("inbox.html", session, watch="", since=since, **data)

    def _inbox_data(self, me: str, after: str | None = None, limit: int = QUESTION_PAGE,
                    cursors: Mapping[str, str] | None = None) -> dict[str, Any]:
        desk, store = self.desk.desk, self.store
        cursors = cursors or {}
        sized = None if limit == QUESTION_PAGE else str(limit)
        mine = desk.list(manager=me, limit=None)
        # Reports to review and the other orders a page at a time (BIND-26), newest first,
        # each page after the last order of the one before (the desk's `before`).
        review, more_review = _paged(partial(desk.list, state="submitted", manager=me),
                                     cursors.get("review_after"), limit)
        others, more_others = _paged(partial(desk.list, state=_NOT_SUBMITTED, manager=me),
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

    async def order_page(self, request: Request, session: Session) -> Response:
        """``/order?id=``: one order, its report, held calls, effects and log."""
        oid = _order_id(request)
        # The state the page is made from, read before its data: the page's event stream
        # compares against it, so a change between the page and its stream still reloads
        # it. The commit runs are taken first, on the loop, where a run ends together with
        # its note: a run that ends while the page is read makes the page stale, and its
        # note waits for the reload.
        runs = self._commit_runs(oid)
        since = _digest(await self.desk.run(self._fingerprint, session.principal, oid, runs))
        held = await self.desk.run(self._held_tools, oid, session.principal)
        tool_schemas, note = await self.schemas.get(held)
        after = {name: _whole(value, name) for name in ("events_after", "calls_after")
                 if (value := _the(request, name)) is not None}
        data = await self.desk.run(self._order_data, oid, session.principal, tool_schemas,
                                   note, **after)
        return self._page("order.html", session, keep_notes=self._commit_runs(oid) != runs,
                          watch=oid, since=since, **data)

    def _order_data(self, order_id: str, me: str,
                    tool_schemas: Mapping[str, dict[str, Any]] | None = None,
                    schema_note: str | None = None, events_after: int = 0,
                    calls_after: int = 0) -> dict[str, Any]:
        desk, store, cfg = self.desk.desk, self.store, self.cfg
        view = desk.get(order_id)
        check_party(view.order, me)
        order = view.order
        calls = desk.calls(order_id)
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
            **self._paged_log(order_id, calls, events_after, calls_after),
            "is_manager": me == order.manager, "may_answer": me in order.answerers,
            "can_commit": cfg.upstream is not None, "committing": order_id in self.committing,
            "commit_command": f"awl gateway --order {shlex.quote(order_id)} --config "
                              f"{upstream}{home} --commit",
            "retry_command": lambda ref: (
                f"awl effects retry {shlex.quote(order_id)} {shlex.quote(ref)} --config "
                f"{upstream} --as {shlex.quote(order.manager)}{home}"),
            "attempts": list(zip(view.reports, [*view.reviews, *([None] * len(view.reports))],
                                 strict=False)),
        }

    def _paged_log(self, order_id: str, calls: list[Any], events_after: int,
                   calls_after: int) -> dict[str, Any]:
        """The order's events and calls a page at a time (BIND-26): those after the seq
        ``events_after`` and after the call numbered ``calls_after``, with the links to the
        next pages (None on the last)."""
        events = self.store.events(order_id, after=events_after, limit=ORDER_PAGE + 1)
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

    def _held_tools(self, order_id: str, me: str) -> set[str]:
        """The tools of the order's calls held for its current attempt (whose schemas the
        page shows them by), when the order waits for review."""
        view = self.desk.desk.get(order_id)
        check_party(view.order, me)
        if view.state != "submitted":
            return set()
        return {e.tool for e in list_effects(order_id, store=self.store)
                if e.attempt == view.attempt and e.state == "held"}

    async def call_page(self, request: Request, session: Session) -> Response:
        """``/order/call?id=&ref=``: one recorded call."""
        oid = _order_id(request)
        ref = request.query_params.get("ref", "")
        data = await self.desk.run(self._call_data, oid, ref, session.principal)
        return self._page("call.html", session, **data)

    def _call_data(self, order_id: str, ref: str, me: str) -> dict[str, Any]:
        view = self.desk.desk.get(order_id)
        check_party(view.order, me)
        # Read as every door reads them: one a gateway left pending reads as may-have-run.
        calls = self.desk.desk.calls(order_id)
        return {"view": view, "call": find_call(self.store, order_id, ref, calls=calls)}

    async def track(self, request: Request, session: Session) -> Response:
        """``/worker?name=``: a worker's track record."""
        worker = _the(request, "name")
        if worker is None:
            raise BadRequest("this address names no worker: it needs one ?name=")
        record = await self.desk.track(worker, viewer=session.principal)
        return self._page("track.html", session, worker=worker, record=record.to_json())

    # ----------------------------------------------------------------------- acting

    async def review(self, request: Request, session: Session) -> Response:
        """``/order/review?id=``: approve (all, some or none of the effects) or send back."""
        oid = _order_id(request)
        form = await request.form()
        decision = _text(form, "decision")
        me = session.principal
        # The page's review forms name the attempt they showed: a decision is about what the
        # manager saw, never about a later attempt (sent back and submitted again elsewhere
        # meanwhile) that a stale page or tab would otherwise approve unseen. The desk checks
        # it in the review's own write.
        seen = _text(form, "attempt")
        shown = _whole(seen, "attempt") if seen else None
        if decision == "approve":
            chosen = [v for v in form.getlist("effect") if isinstance(v, str)]
            everything = _text(form, "all") == "1"
            if everything and _text(form, "confirmed") == "":
                # Approving all is confirmed first (BIND-24): by the page's script, which
                # asks and fills in `confirmed`, or without it on a page that asks.
                return await self._confirm_all(oid, session, shown)
            if not everything and not chosen and _text(form, "none") != "1":
                raise BadRequest("you ticked no effect: tick the ones to run and approve "
                                 "again, or approve the report without running any")
            effects = None if everything else chosen
            counted = _whole(_text(form, "confirmed"), "confirmed") if everything else None
            await self.desk.run_write(self._approve, oid, me, effects, counted, shown)
            what = "all effects" if effects is None else (
                f"{len(chosen)} effect(s): {', '.join(chosen)}" if chosen else "no effects")
            return self._done(session, oid, f"approved with {what}")
        if decision == "rework":
            reason = _text(form, "reason").strip() or None
            await self.desk.review(oid, me, "rework", reason, attempt=shown)
            return self._done(session, oid, "sent back for rework; its held calls are dropped")
        raise BadRequest(f"decision must be approve or rework, not {decision!r}")

    def _approve(self, order_id: str, me: str, effects: list[str] | None,
                 counted: int | None, attempt: int | None) -> None:
        """Approve ``effects`` (None: all, as confirmed for ``counted`` of them)."""
        if effects is None:
            self._expect_all(order_id, counted, attempt)
        self.desk.desk.review(order_id, me, "approve", effects=effects, attempt=attempt)

    def _expect_all(self, order_id: str, count: int | None, attempt: int | None) -> None:
        """Approving all effects, as confirmed for ``count`` of them: refused when the
        report lists another number by now (the confirmation named those it showed). A
        report of another attempt is the review's own refusal (BIND-11)."""
        view = self.desk.desk.get(order_id)
        if attempt is not None and attempt != view.attempt:
            return
        listed = len(view.latest_report.effects or ()) if view.latest_report else 0
        if count != listed:
            raise Conflict(f"you confirmed approving {count} effect(s), but the report lists "
                           f"{listed}; read the order again")

    async def _confirm_all(self, order_id: str, session: Session,
                           attempt: int | None) -> Response:
        """The page that asks before approving all effects (when no script asked)."""
        data = await self.desk.run(self._confirm_data, order_id, session.principal, attempt)
        return self._page("confirm.html", session, **data)

    def _confirm_data(self, order_id: str, me: str, attempt: int | None) -> dict[str, Any]:
        view = self.desk.desk.get(order_id)
        manager_only(view.order, me, "review")
        report = view.latest_report
        listed = list(report.effects or ()) if report else []
        return {"view": view, "order": view.order, "listed": listed,
                "tools": _tally(e.tool for e in listed), "attempt": attempt}

    async def answer(self, request: Request, session: Session) -> Response:
        """``/order/answer?id=``: answer the worker's open question."""
        oid = _order_id(request)
        words = _text(await request.form(), "answer")
        await self.desk.answer(oid, session.principal, words)
        return self._done(session, oid, "answered; the worker carries on")

    async def cancel(self, request: Request, session: Session) -> Response:
        """``/order/cancel?id=``: cancel the order."""
        oid = _order_id(request)
        reason = _text(await request.form(), "reason")
        await self.desk.cancel(oid, session.principal, reason)
        return self._done(session, oid, "cancelled")

    async def settle_effect(self, request: Request, session: Session) -> Response:
        """``/order/settle?id=``: say whether an unknown effect happened."""
        oid = _order_id(request)
        form = await request.form()
        ref, verdict = _text(form, "ref"), _text(form, "verdict")
        if verdict not in ("happened", "did_not_happen"):
            raise BadRequest("choose whether the effect happened or did not happen")
        evidence = _text(form, "evidence")
        view = await self.desk.run_write(
            settle, oid, ref, verdict, evidence, session.principal,  # type: ignore[arg-type]
            store=self.store, desk=self.desk.desk)
        return self._done(session, oid, f"settled {view.ref} as {verdict.replace('_', ' ')}")

    async def run_commit(self, request: Request, session: Session) -> Response:
        """``/order/commit?id=``: run the approved effects, after the answer."""
        oid = _order_id(request)
        upstream = self._need_upstream("run the commit")
        record = await self.desk.run(self.store.load, oid)
        manager_only(record.order, session.principal, "commit")
        if record.state != "approved":
            raise BadRequest(f"order {oid!r} is {record.state}; only an approved order's "
                             "effects run")
        if oid in self.committing:
            # A second run would only meet the first one's lock, and its end would tell the
            # page that nothing runs while the first still does.
            raise Conflict(f"a commit of order {oid!r} is running already; its page follows "
                           "each effect's state")
        self.committing.add(oid)
        return RedirectResponse(order_url(oid), status_code=303, background=BackgroundTask(
            self._commit_in_background, oid, upstream, session.id))

    async def _commit_in_background(self, order_id: str, upstream: Any,
                                    session_id: str) -> None:
        """The commit :meth:`run_commit` started, after its answer: the page shows each
        effect's state as it changes, and the session's next page what the commit did."""
        try:
            notes = (await commit(order_id, store=self.store, pool_or_config=upstream,
                                  desk=self.desk.desk)).lines()
        except AWLError as exc:  # another live committer holds the lock, say
            notes = [f"refused: {exc.message}"]
        except Exception as exc:  # a bug or a surprise: said on the page, one log line
            said = " ".join(str(exc).split())[:300]
            log.warning("the commit of order %s failed unexpectedly: %s: %s", order_id,
                        type(exc).__name__, said)
            notes = [f"the commit failed unexpectedly ({type(exc).__name__}: {said}); an "
                     "effect it had marked dispatching stays so until the next commit "
                     "marks it unknown: look at each effect before you commit again"]
        finally:
            self.committing.discard(order_id)
            self.finished[order_id] = self.finished.get(order_id, 0) + 1
        self._note(session_id, notes)

    async def retry_effect(self, request: Request, session: Session) -> Response:
        """``/order/retry?id=``: send an effect settled as not having happened again."""
        oid = _order_id(request)
        ref = _text(await request.form(), "ref")
        upstream = self._need_upstream("retry an effect")
        outcome = await retry(oid, ref, session.principal, store=self.store,
                              pool_or_config=upstream, desk=self.desk.desk)
        return self._done(session, oid,
                          f"retried {outcome.ref}: {outcome.state}, {outcome.reason}")

    # ----------------------------------------------------------------------- live pages

    def _commit_runs(self, order_id: str) -> tuple[bool, int]:
        """Whether a commit of the order runs now, and how many have ended."""
        return order_id in self.committing, self.finished.get(order_id, 0)

    def _fingerprint(self, me: str, order_id: str,
                     runs: tuple[bool, int] | None = None) -> str:
        """The state a page shows, to tell when it changed (``runs``: the order's commit
        runs as taken, else now)."""
        desk = self.desk.desk
        if order_id:
            view = desk.get(order_id)
            check_party(view.order, me)
            states = [(e.ref, e.state) for e in list_effects(order_id, store=self.store)]
            return json.dumps([view.seq, states, *(runs or self._commit_runs(order_id))])
        views = {v.id: v.seq for v in desk.list(manager=me, limit=None)}
        views.update({v.id: v.seq for v in desk.list(worker=me, limit=None)})
        return json.dumps(sorted(views.items()))

    async def events(self, request: Request, session: Session) -> Response:
        """``/events``: a server-sent ``change`` event whenever the page shown changed."""
        order_id = request.query_params.get("order", "")
        me = session.principal
        first = await self.desk.run(self._fingerprint, me, order_id)
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
            while await self._live(session.id) is not None:
                if order_id:
                    # The desk's own wait, holding no thread: woken at once by writes
                    # through this page, polling for writes by other processes.
                    await self.desk.wait(order_id, json.loads(last)[0], timeout=1.0)
                else:
                    await anyio.sleep(0.5)
                now = await self.desk.run(self._fingerprint, me, order_id)
                if now != last:
                    last = now
                    yield b"event: change\ndata: changed\n\n"
                elif time.monotonic() - quiet > 15:
                    quiet = time.monotonic()
                    yield b": still here\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def _legacy(self, kind: str, request: Request, session: Session) -> Response:
        """The addresses of before (``/orders/ID``, ``/orders/ID/ACTION``, ``/workers/NAME``;
        notifications sent earlier link the first): each is sent on to its address now, a
        POST with its form (307 keeps both), when it names one order or worker."""
        rest = _sent_rest(request, f"/{kind}/")
        target = legacy_target(kind, rest, request.method, dict(request.query_params))
        if target is None:
            raise NotFound(f"this address names no {kind[:-1]} (a '.' or '..' in an "
                           "address is lost on its way); open it from the inbox")
        return RedirectResponse(target, status_code=307)

    async def static(self, request: Request) -> Response:
        """``/static/NAME``: the page's script and style sheet."""
        name = request.path_params["name"]
        if name not in _STATIC:
            return PlainTextResponse(f"no static file {name!r}", status_code=404)
        return FileResponse(_HERE / "static" / name, media_type=_STATIC[name])


def _environment() -> Environment:
    """The page's templates, every printed value through the display rule."""
    env = Environment(loader=FileSystemLoader(_HERE / "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True))
    env.filters["pretty"] = _pretty
    # Every printed value goes through the display rule (SEC-14); `exact` opts out.
    env.finalize = finalize
    env.filters["exact"] = exact
    env.filters["exact_json"] = exact_json
    # Every address a page links to or posts to is made by these (see awl.web._links).
    env.globals.update(order_url=order_url, worker_url=worker_url, events_url=partial(
        link, "/events"))
    return env


def _paged(lister: Callable[..., list[OrderView]], after: str | None,
           limit: int) -> tuple[list[OrderView], str | None]:
    """One page of orders after the order ``after`` (None: the first page), and the
    cursor of the next page (None: this is the last)."""
    views = lister(limit=limit + 1, before=after)
    return views[:limit], views[limit - 1].id if len(views) > limit else None


def _text(form: Mapping[str, Any], name: str) -> str:
    value = form.get(name)
    return value if isinstance(value, str) else ""


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
