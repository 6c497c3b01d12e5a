"""A stopping gateway sends the spans it still buffers (SPEC OBS-6).

The collector is a real OTLP/HTTP receiver on 127.0.0.1 that records the spans each
``POST /v1/traces`` brings; the gateway is a real ``awl gateway`` process, spoken to over
its stdin and stdout, stopped by a real SIGTERM or by its stdin closing. The batch
processor's delay is set far beyond the test, so a span reaches the collector only if the
gateway flushes it on its way out.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from gateway._otel import EXIT_FLUSH
from tests.gateway.gateway_support import gateway_params, server_entry
from tests.gateway.gateway_support import make_env as _make_env

pytestmark = pytest.mark.slow

SERVED = "tools/call receiver__deliver"


class _Collector(ThreadingHTTPServer):
    """Records ``(span name, attributes)`` of every span posted to ``/v1/traces``."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Receive)
        self.spans: list[tuple[str, dict[str, Any]]] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Receive(BaseHTTPRequestHandler):
    server: _Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/v1/traces":
            request = ExportTraceServiceRequest.FromString(body)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        attributes = {a.key: _value(a.value) for a in span.attributes}
                        self.server.spans.append((span.name, attributes))
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _value(value: Any) -> Any:
    """An OTLP ``AnyValue`` as Python (the scalar kinds the gateway's attributes use)."""
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@contextmanager
def _collector() -> Iterator[_Collector]:
    server = _Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def _gateway(tmp: Path, endpoint: str) -> Iterator[subprocess.Popen[bytes]]:
    """``awl gateway`` exporting traces to ``endpoint``, after one call it has answered."""
    log = tmp / "receiver.jsonl"
    env = _make_env(tmp, servers={"receiver": server_entry(
        "receiver", env={"RECEIVER_LOG": str(log)})})
    params = gateway_params(env, env_extra={
        "OTEL_TRACES_EXPORTER": "otlp", "OTEL_METRICS_EXPORTER": "none",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_TIMEOUT": "30",
        "OTEL_BSP_SCHEDULE_DELAY": "600000"})
    with (tmp / "gateway.err").open("wb") as err:
        proc = subprocess.Popen([params.command, *params.args], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, env=params.env,
                                cwd=params.cwd)
    try:
        _ask(proc, 1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                     "clientInfo": {"name": "t", "version": "1"}})
        _send(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        answer = _ask(proc, 2, "tools/call", {"name": "receiver__deliver",
                                              "arguments": {"to": "ops"}})
        assert not answer["result"].get("isError"), answer
        assert [json.loads(line)["arguments"] for line in log.read_text().splitlines()] == [
            {"to": "ops"}]
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()


def _send(proc: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
    assert proc.stdin is not None
    proc.stdin.write((json.dumps(message) + "\n").encode())
    proc.stdin.flush()


def _ask(proc: subprocess.Popen[bytes], n: int, method: str,
         params: dict[str, Any]) -> dict[str, Any]:
    assert proc.stdout is not None
    _send(proc, {"jsonrpc": "2.0", "id": n, "method": method, "params": params})
    while True:  # notifications may come first
        answer: dict[str, Any] = json.loads(proc.stdout.readline())
        if answer.get("id") == n:
            return answer


def _stopped(proc: subprocess.Popen[bytes], how: str) -> tuple[int, float]:
    """Stop the gateway by ``how`` (``sigterm`` or ``stdin``): its exit code and the
    seconds it took."""
    start = time.monotonic()
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    else:
        assert proc.stdin is not None
        proc.stdin.close()
    code = proc.wait(timeout=30)
    return code, time.monotonic() - start


@pytest.mark.spec("OBS-6")
@pytest.mark.parametrize("how", ["sigterm", "stdin"])
def test_a_stopping_gateway_sends_its_buffered_spans_first(tmp_path: Path, how: str) -> None:
    """Stopped by SIGTERM (it still ends by the signal) or by its stdin closing (it exits
    0), the gateway has sent the span of the call it served before it is gone."""
    with _collector() as collector, _gateway(tmp_path, collector.endpoint) as proc:
        assert collector.spans == []  # nothing is sent before the stop
        code, _took = _stopped(proc, how)
    assert code == (-signal.SIGTERM if how == "sigterm" else 0)
    served = [attrs for name, attrs in collector.spans if name == SERVED]
    assert len(served) == 1, collector.spans
    assert served[0]["awl.outcome"] == "ok"
    assert served[0]["awl.ref"] == "receiver/deliver#1"


@pytest.mark.spec("OBS-6")
@pytest.mark.parametrize("how", ["sigterm", "stdin"])
def test_a_collector_that_never_answers_does_not_hold_up_the_stop(
        tmp_path: Path, how: str) -> None:
    """The collector takes the connection and never answers (the exporter would wait its
    30 s timeout): the gateway still ends within its short flush bound."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with _gateway(tmp_path, endpoint) as proc:
            code, took = _stopped(proc, how)
    assert code == (-signal.SIGTERM if how == "sigterm" else 0)
    assert took < EXIT_FLUSH + 3, f"the gateway took {took:.1f} s to stop"
