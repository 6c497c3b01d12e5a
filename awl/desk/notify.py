"""Webhooks for managers: subscriptions kept in the desk, and the deliverer (HOOK-1 to HOOK-6).

Subscribing. :func:`add_webhook` checks the URL, the event names and the orders, makes the
subscription its own signing secret (Standard Webhooks form, ``whsec_`` + base64) and keeps
it in the store; the secret is in the returned record and nowhere else the desk shows.

The outbox. The store writes each notification in the transaction of the event or effect
write that causes it (:mod:`awl.store.rules` decides which writes notify whom), so nothing
here is on the desk's write path: a report, a tool call or a commit never waits for a
receiver.

Delivering. :class:`Deliverer` claims due notifications for a lease (so two deliverers never
send one at once, and one killed mid-send leaves it to the next when the lease ends), POSTs
each as Standard Webhooks JSON signed with its subscription's secret (a URL's
``USER:PASSWORD@`` goes as an ``Authorization: Basic`` header, not to the host), and records
every attempt: a 2xx answer delivers it, anything else is retried after a delay that doubles
from ``backoff`` (with random jitter, at most ``max_backoff``) until ``retry_for`` seconds
after the event, when it is dead. It runs in threads, so it can sit beside any server
(``awl web``, ``awl serve``) or alone (``awl notify run``).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import logging
import random
import secrets
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from urllib.parse import quote, unquote_to_bytes, urlsplit

from standardwebhooks import Webhook as Signer

from awl.documents.display import visible, warnings
from awl.documents.errors import AWLError, BadRequest, NotFound
from awl.documents.limits import show_value
from awl.documents.models import parse_time
from awl.store.protocol import DeliveryAttempt, Notification, Store, Webhook, WebhookStore
from awl.store.rules import NOTIFY_EVENTS
from awl.store.urls import shown_url

__all__ = [
    "EVENTS",
    "PUBLIC_URL_ENV",
    "Deliverer",
    "add_webhook",
    "basic_auth",
    "check_events",
    "check_public_url",
    "check_url",
    "order_link",
    "remove_webhook",
    "webhook_store",
]

log = logging.getLogger("awl.notify")

EVENTS: tuple[str, ...] = NOTIFY_EVENTS
"""The event names a webhook may subscribe to."""

PUBLIC_URL_ENV = "AWL_PUBLIC_URL"
"""The environment variable naming the desk's public address (the approval page's base)."""

SECRET_BYTES = 32
MAX_SECONDS = 10**8
"""The longest time any of the deliverer's settings may name (about three years)."""
MAX_URL = 2048
_ANSWER_BYTES = 512
"""How much of a receiver's answer an attempt keeps (for the log)."""

Clock = Callable[[], datetime]


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --------------------------------------------------------------------------- subscribing

def webhook_store(store: Store) -> WebhookStore:
    """``store`` as a store that keeps webhooks; BadRequest, in one line, if it keeps none."""
    if not isinstance(store, WebhookStore):
        raise BadRequest(f"this desk's store ({type(store).__name__}) keeps no webhooks; "
                         "use a SQLite or PostgreSQL desk for webhooks")
    return store


def check_url(url: str, *, what: str = "a webhook URL") -> str:
    """``url`` if it is an absolute http(s) URL with a host; BadRequest saying why not.

    A refusal quotes the URL with its password hidden (:func:`~awl.store.urls.shown_url`),
    whichever door it came through: the CLI, the desk, the library."""
    if not isinstance(url, str):
        raise BadRequest(f"{what} is text, not {show_value(url)}")
    if len(url) > MAX_URL:
        raise BadRequest(f"{what} may have at most {MAX_URL} characters, not {len(url)}")
    shown = show_value(shown_url(url))
    if any(c.isspace() or not c.isprintable() for c in url):
        raise BadRequest(f"{what} may not contain spaces or control characters: {shown}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        # urlsplit names the port it could not read: the password's end, when that holds
        # an unescaped / ? or # (https://ana:pa/ss@host); say why without quoting it.
        why = ("its port is not a number" if str(exc).startswith("Port could not be cast")
               else str(exc))
        raise BadRequest(f"{what} is not a URL ({why}): {shown}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadRequest(f"{what} must start with http:// or https:// and name a host, "
                         f"not {shown}")
    if port == 0:
        raise BadRequest(f"{what} names port 0: {shown}")
    if parts.fragment:
        raise BadRequest(f"{what} may not have a #fragment: {shown}")
    return url


def check_public_url(url: str, *, what: str = "the public URL") -> str:
    """The desk's public address (the approval page's base URL) without a trailing slash;
    BadRequest, its message starting with ``what``, saying why not."""
    check_url(url, what=what)
    if urlsplit(url).query:
        raise BadRequest(f"{what} may not have a ?query: {show_value(shown_url(url))}")
    return url.rstrip("/")


def check_events(events: str | Iterable[str]) -> tuple[str, ...]:
    """The event names as a tuple in the desk's order; BadRequest for an unknown or none.

    A string is split at commas (as ``--events submitted,blocked`` gives it)."""
    if not isinstance(events, str | Iterable):
        raise BadRequest(f"events are event names, not {show_value(events)}")
    names = events.split(",") if isinstance(events, str) else list(events)
    if any(not isinstance(n, str) for n in names):
        raise BadRequest("event names must be strings")
    wanted = {n.strip() for n in names if n.strip()}
    unknown = sorted(n for n in wanted if n not in EVENTS)
    if unknown:
        raise BadRequest(f"unknown event {', '.join(map(repr, unknown))}; use some of "
                         f"{', '.join(EVENTS)}")
    if not wanted:
        raise BadRequest(f"a webhook needs at least one event: some of {', '.join(EVENTS)}")
    return tuple(e for e in EVENTS if e in wanted)


def _check_orders(store: Store, orders: str | Iterable[str] | None) -> tuple[str, ...] | None:
    if orders is None:
        return None
    if not isinstance(orders, str | Iterable):
        raise BadRequest(f"orders are order ids, not {show_value(orders)}")
    names = orders.split(",") if isinstance(orders, str) else list(orders)
    if any(not isinstance(n, str) for n in names):
        raise BadRequest("order ids must be strings")
    ids = tuple(dict.fromkeys(n.strip() for n in names if n.strip()))
    if not ids:
        raise BadRequest("--orders names no order; leave it out to hear about every order")
    for order_id in ids:
        store.load(order_id)  # NotFound names it
    return ids


def new_secret() -> str:
    """A fresh signing secret: ``whsec_`` + the base64 of 32 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def add_webhook(store: Store, url: str, events: str | Iterable[str], *,
                orders: str | Iterable[str] | None = None,
                now: datetime | None = None) -> Webhook:
    """Check and keep a webhook subscription (HOOK-1); the record carries its new secret.

    Raises:
        BadRequest: the URL, an event name or ``orders`` is not acceptable.
        NotFound: an order named in ``orders`` does not exist.
    """
    keeper = webhook_store(store)
    webhook = Webhook(
        id=f"wh_{secrets.token_hex(6)}", url=check_url(url), events=check_events(events),
        secret=new_secret(), orders=_check_orders(store, orders),
        created_at=_stamp(now or _utc_now()))
    keeper.add_webhook(webhook)
    return webhook


def remove_webhook(store: Store, webhook_id: str, *, now: datetime | None = None) -> None:
    """Forget a webhook; its pending notifications die with it (HOOK-6). NotFound if absent."""
    if not webhook_store(store).remove_webhook(webhook_id, at=_stamp(now or _utc_now())):
        raise NotFound(f"no webhook with id {webhook_id!r}; `awl notify list` shows them")


def display(data: dict[str, object]) -> dict[str, object]:
    """What a receiver that shows a notification to a person should show (SEC-14):
    ``display``, the shown form of each top-level text field whose shown form differs from
    it (what would not show written ``<U+XXXX>``), and ``warnings``, one line for each such
    field or look-alike identifier; empty when every field shows as it is. The fields
    themselves stay exact."""
    shown: dict[str, str] = {}
    said: list[str] = []
    for name, value in data.items():
        if isinstance(value, str):
            text = visible(value, lines=True)
            if text != value:
                shown[name] = text
            said += [f"{name}: {line}" for line in warnings(value)]
    out: dict[str, object] = {}
    if shown:
        out["display"] = shown
    if said:
        out["warnings"] = said
    return out


def order_link(public_url: str, order_id: str) -> str:
    """The order's page on the approval page at ``public_url``: ``/order?id=`` and the id
    percent-encoded in full, as the page makes its own links (``awl.web._links``), so every
    id has one (a path segment would lose ``.`` and ``..``, or read ``x/call`` as an action)."""
    return f"{public_url.rstrip('/')}/order?id={quote(order_id, safe='')}"


# --------------------------------------------------------------------------- delivering

class Deliverer:
    """Delivers the desk's outbox (HOOK-4), in threads off the desk's write path.

    Args:
        store: the desk's store.
        public_url: the approval page's public address; each body then links the order.
        timeout: seconds one POST may take, connection included.
        retry_for: seconds after the event during which a failed notification is retried.
        backoff: the delay after the first failed attempt (seconds); it doubles each time.
        max_backoff: the longest delay between attempts.
        workers: how many POSTs may be in flight at once.
        poll: seconds between looks at an idle outbox.
        clock: the current time (tests pass a fake one).
        rng: where the jitter comes from.
    """

    def __init__(self, store: WebhookStore, *, public_url: str | None = None, timeout: float = 10.0,
                 retry_for: float = 86400.0, backoff: float = 2.0, max_backoff: float = 3600.0,
                 workers: int = 4, poll: float = 1.0, clock: Clock | None = None,
                 rng: random.Random | None = None) -> None:
        for name, value in (("timeout", timeout), ("retry_for", retry_for),
                            ("backoff", backoff), ("max_backoff", max_backoff), ("poll", poll)):
            if not 0 < value <= MAX_SECONDS:
                raise BadRequest(f"{name} must be a number of seconds above 0 and at most "
                                 f"{MAX_SECONDS:,}, not {show_value(value)}")
        self.store = store
        self.public_url = None if public_url is None else check_public_url(public_url)
        self.timeout = timeout
        self.retry_for = retry_for
        self.backoff = backoff
        self.max_backoff = max(backoff, max_backoff)
        self.workers = max(1, workers)
        self.poll = poll
        self._clock = clock or _utc_now
        self._rng = rng or random.Random()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._busy = 0
        self._idle = threading.Condition()

    @property
    def lease(self) -> float:
        """Seconds a claim lasts: longer than any one POST may take."""
        return 2 * self.timeout + 1.0

    def body(self, note: Notification) -> str:
        """The JSON text POSTed for ``note``: its payload, linked to the order's page when a
        public address is configured."""
        payload = note.payload
        if self.public_url is not None:
            payload = {**payload, "data": {**payload["data"],
                                           "url": order_link(self.public_url, note.order_id)}}
        shown = display(payload["data"])
        if shown:
            payload = {**payload, "data": {**payload["data"], **shown}}
        return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)

    def send(self, note: Notification, webhook: Webhook) -> DeliveryAttempt:
        """POST ``note`` once to ``webhook`` and say how it went (never raises)."""
        moment = self._clock().astimezone(UTC)
        text = self.body(note)
        headers = {
            "content-type": "application/json",
            "user-agent": "awl-gateway",
            "webhook-id": note.id,
            "webhook-timestamp": str(int(moment.timestamp())),
            "webhook-signature": Signer(webhook.secret).sign(note.id, moment, text),
        }
        started = time.perf_counter()
        status, error = _post(webhook.url, text.encode("utf-8"), headers, self.timeout)
        ms = round((time.perf_counter() - started) * 1000, 1)
        return DeliveryAttempt(at=_stamp(moment), status=status, error=error, ms=ms)

    def attempt(self, note: Notification, webhook: Webhook) -> Notification:
        """Send ``note`` once and record the attempt, delivered, due again or dead."""
        tried = self.send(note, webhook)
        if tried.error is None:
            return self.store.record_attempt(note.id, tried, state="delivered",
                                             next_at=tried.at)
        failures = len(note.attempts) + 1
        delay = min(self.max_backoff, self.backoff * 2 ** min(failures - 1, 60))
        delay *= self._rng.uniform(0.5, 1.0)
        due = parse_time(tried.at) + timedelta(seconds=delay)
        if due > parse_time(note.created_at) + timedelta(seconds=self.retry_for):
            return self.store.record_attempt(
                note.id, tried, state="dead", next_at=tried.at,
                error=f"not delivered within {self.retry_for:g} s of the event after "
                      f"{failures} attempts; the last: {tried.error}")
        return self.store.record_attempt(note.id, tried, state="pending", next_at=_stamp(due))

    def claim(self, limit: int) -> list[tuple[Notification, Webhook]]:
        """Claim up to ``limit`` due notifications for :attr:`lease` seconds."""
        now = self._clock()
        return self.store.claim_notifications(
            now=_stamp(now), lease_until=_stamp(now + timedelta(seconds=self.lease)),
            limit=limit)

    def deliver_due(self, limit: int | None = None) -> int:
        """Try what is due now (at most ``limit``, default ``workers``) once each, ``workers``
        at a time, and return how many were tried."""
        claimed = self.claim(limit or self.workers)
        if claimed:
            threads = min(self.workers, len(claimed))
            with ThreadPoolExecutor(threads, thread_name_prefix="awl-notify") as pool:
                list(pool.map(lambda pair: self._attempt_logged(*pair), claimed))
        return len(claimed)

    def _attempt_logged(self, note: Notification, webhook: Webhook) -> None:
        try:
            self.attempt(note, webhook)
        except Exception as exc:  # the store said no: the lease runs out, it is tried again
            log.warning("could not record the delivery of %s: %s", note.id, _said(exc))

    def run(self) -> None:
        """Deliver until :meth:`stop`: at most ``workers`` POSTs at once, each in a daemon
        thread of its own (so stopping never waits for a receiver), new work as soon as one
        ends, a look every ``poll`` seconds when the outbox is idle."""
        while not self._stop.is_set():
            with self._idle:
                while self._busy >= self.workers and not self._stop.is_set():
                    self._idle.wait(self.poll)
                free = self.workers - self._busy
            if self._stop.is_set():
                break
            try:
                claimed = self.claim(free)
            except Exception as exc:  # a busy or closed store: say so once, look again
                if self._stop.is_set():
                    break
                log.warning("the deliverer could not read the outbox: %s", _said(exc))
                claimed = []
            for note, webhook in claimed:
                with self._idle:
                    self._busy += 1
                threading.Thread(target=self._job, args=(note, webhook), daemon=True,
                                 name=f"awl-notify-{note.id}").start()
            if not claimed:
                self._stop.wait(self.poll)

    def _job(self, note: Notification, webhook: Webhook) -> None:
        try:
            self._attempt_logged(note, webhook)
        finally:
            with self._idle:
                self._busy -= 1
                self._idle.notify_all()

    def start(self) -> Deliverer:
        """Run :meth:`run` in a daemon thread; returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self.run, name="awl-deliverer", daemon=True)
            self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        """Whether the thread :meth:`start` made is running."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, wait: float = 1.0) -> None:
        """Stop delivering; a POST in flight is left to its lease (it is sent again later)."""
        self._stop.set()
        with self._idle:
            self._idle.notify_all()
        if self._thread is not None:
            self._thread.join(wait)

    def __enter__(self) -> Deliverer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _said(exc: Exception) -> str:
    return exc.message if isinstance(exc, AWLError) else f"{type(exc).__name__}: {exc}"


def _post(url: str, body: bytes, headers: dict[str, str],
          timeout: float) -> tuple[int | None, str | None]:
    """POST ``body``; (status, None) for a 2xx answer, else (status or None, why).

    ``timeout`` bounds the whole exchange: a timer shuts the socket when it runs out, so a
    receiver that trickles its answer cannot hold a worker longer. Redirects are not
    followed (a webhook URL names its receiver). A URL's userinfo is sent as Basic
    credentials (:func:`basic_auth`), never in the request line or ``Host``."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    credentials = basic_auth(url)
    if credentials is not None:
        headers = {**headers, "authorization": credentials}
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(host, parts.port, timeout=timeout,
                                           context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(host, parts.port, timeout=timeout)
    expired = threading.Event()

    def cut() -> None:
        expired.set()
        sock = conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(timeout, cut)
    timer.daemon = True
    timer.start()
    try:
        conn.request("POST", target, body=body, headers=headers)
        answer = conn.getresponse()
        text = answer.read(_ANSWER_BYTES).decode("utf-8", "replace")
        if 200 <= answer.status < 300:
            return answer.status, None
        said = _one_line(text)
        return answer.status, f"HTTP {answer.status}" + (f": {said}" if said else "")
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set() or isinstance(exc, TimeoutError):
            return None, f"no answer within {timeout:g} s"
        return None, _one_line(f"{type(exc).__name__}: {exc}", 300)
    finally:
        timer.cancel()
        conn.close()


def _one_line(text: str, limit: int = 200) -> str:
    """What a receiver said, as an attempt's record keeps it: one line of at most ``limit``
    printable characters. Its answer (or a malformed status line an error quotes) is the
    receiver's to choose: a control character in it would reach the operator's terminal
    through `awl notify log` (an escape sequence, a line break faking another attempt),
    and a U+0000 (NUL) would make the attempt one a PostgreSQL desk cannot keep, so it
    would never be recorded and the notification would be sent again at every lease, for
    ever. Each such character becomes U+FFFD."""
    line = " ".join(text.split())[:limit]
    return "".join(c if c.isprintable() else "\ufffd" for c in line)


def basic_auth(url: str) -> str | None:
    """The ``Authorization`` value a URL's userinfo (``https://USER:PASSWORD@host/...``)
    asks for: ``Basic`` and the base64 of ``USER:PASSWORD``, each percent-decoded (as
    bytes, so ``%C3%A9`` is the UTF-8 of é); None for a URL without userinfo."""
    parts = urlsplit(url)
    if not parts.username and parts.password is None:
        return None
    pair = unquote_to_bytes(parts.username or "") + b":" + unquote_to_bytes(parts.password or "")
    return "Basic " + base64.b64encode(pair).decode("ascii")


def describe(webhook: Webhook, *, secret: bool = False) -> dict[str, object]:
    """A webhook as ``awl notify`` prints it: its URL's password hidden (the receiver has
    it), its secret only when asked (once, at creation)."""
    shown: dict[str, object] = {"id": webhook.id, "url": shown_url(webhook.url),
                                "events": list(webhook.events),
                                "orders": None if webhook.orders is None else list(webhook.orders),
                                "created_at": webhook.created_at}
    if secret:
        shown["secret"] = webhook.secret
    return shown


def describe_notification(note: Notification) -> dict[str, object]:
    """A notification with its attempts, as ``awl notify log --json`` prints it."""
    return {"id": note.id, "webhook_id": note.webhook_id, "event": note.event,
            "order_id": note.order_id, "state": note.state, "created_at": note.created_at,
            "next_at": note.next_at, "error": note.error,
            "attempts": [{"at": a.at, "status": a.status, "error": a.error, "ms": a.ms}
                         for a in note.attempts]}

