"""Webhook delivery on an operator's bad day: receivers that answer with control characters
or a NUL, a TLS endpoint with a certificate nobody signed, and two deliverers on one desk,
each against real sockets on 127.0.0.1 and a desk in SQLite and in PostgreSQL."""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from awl.cli import main
from awl.desk.desk import Desk
from awl.desk.notify import Deliverer, webhook_store
from tests.awl.desk_support import WORKER, report_fields
from tests.awl.hook_support import Receiver
from tests.awl.test_cli_notify import awl, opened, outbox, submit, where
from tests.awl.test_notify import working

PASSWORD = "s3cret-hunter2"


@contextmanager
def raw_receiver(answer: bytes, tls: ssl.SSLContext | None = None) -> Iterator[int]:
    """A listener on 127.0.0.1 that reads each request's head and sends ``answer`` as it is,
    then closes; yields its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)

    def handle(conn: socket.socket) -> None:
        try:
            conn.settimeout(5)
            if tls is not None:
                conn = tls.wrap_socket(conn, server_side=True)
            head = b""
            while b"\r\n\r\n" not in head:
                got = conn.recv(65536)
                if not got:
                    return
                head += got
            conn.sendall(answer)
        except OSError:  # a client that gave up on the handshake
            pass
        finally:
            conn.close()

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


@pytest.fixture
def desk(tmp_path: Path, store_url: str | None) -> Iterator[Desk]:
    with opened(tmp_path, store_url) as store:
        yield Desk(store)


HOSTILE_ANSWERS = {
    # A body with a NUL: a PostgreSQL desk cannot keep it, so the attempt was never
    # recorded and the notification went out again at every lease, for ever.
    "nul in the body": b"HTTP/1.1 500 Oops\r\nContent-Length: 12\r\n\r\nbad\x00thing!!!",
    # Escape sequences and line breaks reached the operator's terminal via `awl notify log`.
    "escapes in the body": (b"HTTP/1.1 503 No\r\nContent-Length: 30\r\n\r\n"
                            b"\x1b[2J\x1b]0;owned\x07\r\n    fake line\n"),
    # http.client quotes a malformed status line whole in its error.
    "a malformed status line": b"\x00\x1b[31mHTTP/9 nope\r\n\r\n",
}


@pytest.mark.spec("HOOK-4")
@pytest.mark.parametrize("answer", list(HOSTILE_ANSWERS.values()), ids=list(HOSTILE_ANSWERS))
def test_a_receivers_hostile_answer_is_recorded_as_one_printable_line(
        desk: Desk, answer: bytes) -> None:
    """Whatever a receiver answers, the failed attempt is recorded (on PostgreSQL too), its
    error one line of printable characters, and `awl notify log` shows it as such."""
    with raw_receiver(answer) as port:
        desk.add_webhook(f"http://127.0.0.1:{port}/hook", "submitted")
        desk.report(working(desk), WORKER, report_fields())
        assert Deliverer(webhook_store(desk.store), timeout=5, backoff=60).deliver_due() == 1
    [note] = desk.notifications()
    assert note.state == "pending"
    [attempt] = note.attempts
    assert attempt.error is not None and attempt.error.isprintable(), attempt.error
    assert "\ufffd" in attempt.error


@pytest.mark.spec("HOOK-4")
def test_awl_notify_log_shows_a_hostile_answer_on_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The log line of an attempt carries no escape sequence and no line break of the
    receiver's."""
    answer = HOSTILE_ANSWERS["escapes in the body"]
    with raw_receiver(answer) as port:
        assert main(["notify", "add", f"http://127.0.0.1:{port}/hook", "--events",
                     "submitted", "--home", str(tmp_path)]) == 0
        submit(tmp_path)
        assert main(["notify", "run", "--once", "--home", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["notify", "log", "--home", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) == 2, out  # the notification, and its one attempt
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert "HTTP 503" in lines[1] and "fake line" in lines[1]


def _self_signed(folder: Path) -> ssl.SSLContext:
    """A TLS server context with a certificate for 127.0.0.1 that no authority signed."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    return context


@pytest.mark.spec("HOOK-4")
def test_a_bad_certificate_is_a_failed_attempt_in_one_line_without_the_password(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An https receiver whose certificate no authority signed is never sent the body: the
    attempt fails in one line that says why, the notification waits for its retry, and no
    output (the command's, the log's) carries the URL's password."""
    posted = b"HTTP/1.1 204 No Content\r\n\r\n"
    with raw_receiver(posted, tls=_self_signed(tmp_path)) as port:
        url = f"https://ana:{PASSWORD}@127.0.0.1:{port}/hook"
        assert main(["notify", "add", url, "--events", "submitted",
                     "--home", str(tmp_path)]) == 0
        submit(tmp_path)
        assert main(["notify", "run", "--once", "--home", str(tmp_path)]) == 0
        assert main(["notify", "log", "--home", str(tmp_path)]) == 0
        assert main(["notify", "list", "--home", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert PASSWORD not in out + err
    [note] = outbox(tmp_path)
    assert (note["state"], note["attempts"]) == ("pending", 1)
    [attempt] = [line for line in out.splitlines() if line.startswith("    ")]
    assert "no answer" in attempt and "CERTIFICATE_VERIFY_FAILED" in attempt


@pytest.mark.slow
@pytest.mark.spec("HOOK-4")
def test_two_deliverers_on_one_desk_send_each_notification_once(
        tmp_path: Path, store_url: str | None) -> None:
    """Two `awl notify run` processes on one desk, each with several workers, and a receiver
    that takes its time: every notification reaches it once, and ends delivered after one
    attempt."""
    desk = where(tmp_path, store_url)
    with Receiver() as receiver:
        assert main(["notify", "add", receiver.url, "--events", "submitted", *desk]) == 0
        for _ in range(30):
            submit(tmp_path, store_url)
        run = ["notify", "run", "--notify-timeout", "5", "--poll", "0.01", *desk]
        with awl(*run), awl(*run):
            got = receiver.wait_for(30, timeout=60)
            end = time.monotonic() + 60
            while any(n["state"] != "delivered" for n in outbox(tmp_path, store_url)):
                assert time.monotonic() < end
                time.sleep(0.05)
            time.sleep(0.5)  # a second send would have come by now
    ids = Counter(r.headers["webhook-id"] for r in receiver.received)
    assert len(got) >= 30 and len(ids) == 30 and set(ids.values()) == {1}, ids
    assert {n["attempts"] for n in outbox(tmp_path, store_url)} == {1}
