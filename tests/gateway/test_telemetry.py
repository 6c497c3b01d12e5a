"""OpenTelemetry for operators (SPEC OBS-1 to OBS-5).

Spans and metrics are read from the OpenTelemetry SDK's in-memory exporter and reader,
installed as this test process's global providers (the ones the MCP SDK's own spans use)
and captured only while a test here runs. The upstream is the real receiver subprocess,
which logs the ``traceparent`` and ``tracestate`` of each request's ``_meta`` it gets, so
what reached the upstream is read from its log. The switch and the absent extra are tested
on ``awl gateway`` subprocesses.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from mcp import Client, StdioServerParameters, stdio_client
from mcp_types import RequestParamsMeta
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from awl.documents.errors import DocumentError
from gateway import _telemetry
from gateway._commit import commit
from gateway._config import load_config
from gateway._telemetry import Signals, signals
from tests.gateway.gateway_support import (
    MANAGER,
    ROOT,
    WORKER,
    Env,
    connect,
    final,
    server_entry,
)
from tests.gateway.gateway_support import make_env as _make_env

pytestmark = pytest.mark.anyio

PROBE = Path(__file__).with_name("otel_probe.py")
TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SPAN = 0x00F067AA0BA902B7
OTHER_TRACE = 0x0AF7651916CD43DD8448EB211C80319C


class _Capture(SpanProcessor):
    """Keeps the spans that end while a test of this module runs."""

    def __init__(self) -> None:
        self.active = False
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        if self.active:
            self.spans.append(span)


@functools.cache
def _providers() -> tuple[_Capture, InMemoryMetricReader]:
    capture = _Capture()
    provider = TracerProvider()
    provider.add_span_processor(capture)
    trace.set_tracer_provider(provider)
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    assert trace.get_tracer_provider() is provider, "another test set a tracer provider"
    return capture, reader


@pytest.fixture
def otel() -> Iterator[tuple[_Capture, InMemoryMetricReader]]:
    capture, reader = _providers()
    saved = _telemetry._active
    _telemetry.enable()
    capture.spans.clear()
    capture.active = True
    try:
        yield capture, reader
    finally:
        capture.active = False
        _telemetry._active = saved


def make_env(tmp: Path, **order: Any) -> Env:
    """A working order in front of the receiver alone (it logs the _meta it gets)."""
    log = tmp / "receiver.jsonl"
    return _make_env(tmp, servers={"receiver": server_entry(
        "receiver", env={"RECEIVER_LOG": str(log)})}, **order)


def _traceparent(trace_id: int, span_id: int) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-01"


def _ids(traceparent: str) -> tuple[int, int]:
    _version, trace_id, span_id, _flags = traceparent.split("-")
    return int(trace_id, 16), int(span_id, 16)


def _one(spans: list[ReadableSpan], name: str, **attributes: Any) -> ReadableSpan:
    found = [s for s in spans if s.name == name and all(
        (s.attributes or {}).get(k.replace("_", ".")) == v for k, v in attributes.items())]
    assert len(found) == 1, (name, attributes, [(s.name, s.attributes) for s in spans])
    return found[0]


def _points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    if data is None:  # nothing measured yet
        return []
    return [point for rm in data.resource_metrics for sm in rm.scope_metrics
            for metric in sm.metrics if metric.name == name
            for point in metric.data.data_points]


def _sum(reader: InMemoryMetricReader, name: str, **attributes: Any) -> float:
    """The counter's total (or the histogram's count) over points with these attributes."""
    total = 0.0
    for point in _points(reader, name):
        if all(point.attributes.get(k) == v for k, v in attributes.items()):
            value = getattr(point, "value", None)  # a sum's point; a histogram's has count
            total += float(value if value is not None else getattr(point, "count", 0))
    return total


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


# --------------------------------------------------------------------------- the switch

@pytest.mark.spec("OBS-1")
def test_only_the_standard_variables_turn_telemetry_on() -> None:
    """Nothing set: off (never the SDK's default localhost collector); an OTLP endpoint
    turns both signals on; an exporter list turns its signal on; OTEL_SDK_DISABLED wins."""
    assert signals({}) == Signals()
    assert not signals({"OTEL_SERVICE_NAME": "gw", "OTEL_PROPAGATORS": "tracecontext"}).on
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert signals(endpoint) == Signals(("otlp",), ("otlp",))
    assert signals({**endpoint, "OTEL_METRICS_EXPORTER": "none"}) == Signals(("otlp",), ())
    assert signals({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}) == (
        Signals(("otlp",), ()))
    assert signals({"OTEL_TRACES_EXPORTER": "console, otlp"}) == Signals(("console", "otlp"))
    assert signals({**endpoint, "OTEL_SDK_DISABLED": "TRUE"}) == Signals()
    odd = signals({"OTEL_TRACES_EXPORTER": "zipkin,console"})
    assert odd.traces == ("console",)
    assert odd.problems == ("OTEL_TRACES_EXPORTER='zipkin' is not an exporter the gateway "
                            "has (it has otlp, console and none); ignored",)


# --------------------------------------------------------------------------- traces

@pytest.mark.slow
@pytest.mark.spec("OBS-2", "OBS-3")
async def test_one_trace_runs_from_the_worker_through_the_gateway_to_the_upstream(
        tmp_path: Path, otel: tuple[_Capture, InMemoryMetricReader]) -> None:
    """The worker's trace context in _meta parents the gateway's span; the upstream gets a
    traceparent of the same trace, from a span under the gateway's; held and refused calls
    say so."""
    capture, _reader = otel
    env = make_env(tmp_path)
    worker = _worker_span()
    with anyio.fail_after(60):
        async with connect(env) as (gw, client):
            # The worker runs in its own trace. (An in-process client may hand the gateway
            # its context directly instead of in _meta: the direct call below, and the
            # gateway process in the console test, have nothing but their _meta.)
            with trace.use_span(worker):
                delivered = await client.call_tool("receiver__deliver", {"to": "ops"})
                held = await client.call_tool("receiver__create_issue", {"title": "Outage"})
                refused = await client.call_tool("receiver__nope", {})
                failed = await client.call_tool("receiver__reject", {"reason": "full"})
            # In-process, straight from a worker's _meta.
            direct = final(await gw.call("receiver__deliver", {"to": "it"}, meta={
                "traceparent": _traceparent(OTHER_TRACE, SPAN), "tracestate": "worker=2"}))
            # Trace context that is not one: the call runs in a trace of its own.
            odd = final(await gw.call("receiver__deliver", {"to": "odd"}, meta={
                "traceparent": 12345, "tracestate": ["x"]}))
            with pytest.raises(DocumentError):  # not recorded, not forwarded (GW-7)
                await gw.call("receiver__echo", {"text": float("nan")})
    assert not delivered.is_error and not direct.is_error and not held.is_error
    assert refused.is_error and failed.is_error
    spans = capture.spans
    by_id = {s.context.span_id: s for s in spans}

    served = _one(spans, "tools/call receiver__deliver", awl_ref="receiver/deliver#1")
    assert served.kind == SpanKind.SERVER
    assert (served.context.trace_id, served.parent.span_id) == (TRACE, SPAN)  # type: ignore[union-attr]
    assert {k: _attrs(served)[k] for k in (
            "mcp.method.name", "gen_ai.operation.name", "gen_ai.tool.name", "awl.order.id",
            "awl.tool", "awl.ref", "awl.attempt", "awl.outcome")} == {
        "mcp.method.name": "tools/call", "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "receiver__deliver", "awl.order.id": env.order_id,
        "awl.tool": "receiver/deliver", "awl.ref": "receiver/deliver#1", "awl.attempt": 1,
        "awl.outcome": "ok"}
    assert "error.type" not in _attrs(served)

    first, second, third = (d for d in env.deliveries() if d["tool"] == "deliver")
    assert first["ref"] == "receiver/deliver#1"
    upstream_trace, upstream_parent = _ids(first["traceparent"])
    assert upstream_trace == TRACE
    assert first["tracestate"] == "worker=1"
    # The upstream's parent is a span under the gateway's span.
    hop = by_id[upstream_parent]
    while hop.context.span_id != served.context.span_id:
        assert hop.parent is not None
        hop = by_id[hop.parent.span_id]

    # Straight from the _meta of a call (the in-process client above may share the worker's
    # context with the gateway; this call has only its _meta).
    own = _one(spans, "tools/call receiver__deliver", awl_ref=second["ref"])
    assert own.kind == SpanKind.SERVER
    assert (own.context.trace_id, own.parent.span_id) == (OTHER_TRACE, SPAN)  # type: ignore[union-attr]
    assert _ids(second["traceparent"])[0] == OTHER_TRACE
    assert second["tracestate"] == "worker=2"

    assert not odd.is_error
    lone = _one(spans, "tools/call receiver__deliver", awl_ref=third["ref"])
    assert lone.parent is None and lone.context.trace_id not in (TRACE, OTHER_TRACE)
    assert _ids(third["traceparent"])[0] == lone.context.trace_id  # the worker's was replaced

    pending = _one(spans, "tools/call receiver__create_issue")
    assert pending.context.trace_id == TRACE
    assert _attrs(pending)["awl.outcome"] == "held"
    assert _attrs(pending)["awl.ref"] == "receiver/create_issue#2"
    assert "error.type" not in _attrs(pending)
    assert pending.status.status_code != StatusCode.ERROR

    no = _one(spans, "tools/call receiver__nope")
    assert no.context.trace_id == TRACE
    assert {k: _attrs(no).get(k) for k in ("awl.outcome", "error.type", "awl.error.code")} == {
        "awl.outcome": "refused", "error.type": "tool_error", "awl.error.code": "AWL_FORBIDDEN"}
    # The name resolves to no tool: recorded under the unresolved name, named by no tool.
    assert "awl.tool" not in _attrs(no) and _attrs(no)["awl.ref"].endswith("#3")
    assert no.status.status_code == StatusCode.ERROR

    broken = _one(spans, "tools/call receiver__echo")
    assert _attrs(broken)["error.type"] == "DocumentError" and "awl.ref" not in _attrs(broken)
    assert broken.status.status_code == StatusCode.ERROR

    # The upstream answered with a tool error: the gateway has no code of its own for it.
    bad = _one(spans, "tools/call receiver__reject")
    assert {k: _attrs(bad).get(k) for k in ("awl.outcome", "error.type", "awl.error.code")} == {
        "awl.outcome": "error", "error.type": "tool_error", "awl.error.code": None}
    assert bad.status.status_code == StatusCode.ERROR


def _approve(env: Env, effects: list[tuple[str, str, dict[str, Any]]]) -> None:
    env.desk.report(env.order_id, WORKER, {
        "status": "done", "result": {"summary": "filed"},
        "evidence": [{"criterion": "c1", "type": "tool_call", "ref": effects[0][0]}],
        "cost": {"tool_calls": 3, "usd": 0},
        "tools_used": ["receiver/create_issue", "receiver/deliver", "receiver/reject"],
        "effects": [{"ref": ref, "tool": tool, "arguments": arguments}
                    for ref, tool, arguments in effects]})
    env.desk.review(env.order_id, MANAGER, "approve")


@pytest.mark.slow
@pytest.mark.spec("OBS-4", "OBS-5")
async def test_a_committed_effect_has_its_span_and_the_metrics_count(
        tmp_path: Path, otel: tuple[_Capture, InMemoryMetricReader]) -> None:
    """The commit's span for an effect names it, says how it ended, and parents the
    upstream's trace context; the metrics count calls by outcome, their duration, the
    budget left and the effects by state."""
    capture, reader = otel
    env = make_env(tmp_path, staged=["receiver/create_issue", "receiver/reject"])
    before = {o: _sum(reader, "awl.gateway.calls", **{"awl.outcome": o})
              for o in ("ok", "held", "refused")}
    timed = _sum(reader, "mcp.server.operation.duration")
    sent = {s: _sum(reader, "awl.commit.effects", **{"awl.outcome": s})
            for s in ("committed", "failed")}
    with anyio.fail_after(60):
        async with connect(env) as (gw, client):
            await client.call_tool("receiver__deliver", {"to": "ops"})
            held = await client.call_tool("receiver__create_issue", {"title": "Outage"})
            rejected = await client.call_tool("receiver__reject", {"reason": "full"})
            await client.call_tool("receiver__nope", {})
            ref, no_ref = (held.meta or {})["awl/ref"], (rejected.meta or {})["awl/ref"]
            order = {"awl.order.id": env.order_id}
            assert [p.value for p in _points(reader, "awl.order.budget.tool_calls.remaining")
                    if dict(p.attributes) == order] == [7]  # refusals never count
            assert [p.value for p in _points(reader, "awl.order.budget.usd.remaining")
                    if dict(p.attributes) == order] == [1.0]
            assert [(p.attributes["awl.effect.state"], p.value)
                    for p in _points(reader, "awl.effects")
                    if p.attributes["awl.order.id"] == env.order_id] == [("held", 2)]
            _approve(env, [(ref, "receiver/create_issue", {"title": "Outage"}),
                           (no_ref, "receiver/reject", {"reason": "full"})])
            summary = await commit(env.order_id, store=env.store,
                                   pool_or_config=load_config(env.config))
            assert sorted((p.attributes["awl.effect.state"], p.value)
                          for p in _points(reader, "awl.effects")
                          if p.attributes["awl.order.id"] == env.order_id) == [
                ("committed", 1), ("failed", 1)]
            assert gw.order.id == env.order_id
    assert [e.state for e in summary.effects] == ["committed", "failed"]
    after = {o: _sum(reader, "awl.gateway.calls", **{"awl.outcome": o})
             for o in ("ok", "held", "refused")}
    assert {o: after[o] - before[o] for o in after} == {"ok": 1, "held": 2, "refused": 1}
    assert _sum(reader, "mcp.server.operation.duration") - timed == 4
    assert {s: _sum(reader, "awl.commit.effects", **{"awl.outcome": s}) - sent[s]
            for s in sent} == {"committed": 1, "failed": 1}

    failed = _one(capture.spans, "tools/call reject")
    assert {k: _attrs(failed).get(k) for k in ("awl.ref", "awl.outcome", "error.type")} == {
        "awl.ref": no_ref, "awl.outcome": "failed", "error.type": "tool_error"}
    assert failed.status.status_code == StatusCode.ERROR

    effect = _one(capture.spans, "tools/call create_issue")
    assert effect.kind == SpanKind.CLIENT
    assert {k: _attrs(effect)[k] for k in (
        "mcp.method.name", "gen_ai.operation.name", "gen_ai.tool.name", "awl.tool",
        "awl.order.id", "awl.ref", "awl.attempt", "awl.outcome", "awl.effect.sent")} == {
        "mcp.method.name": "tools/call", "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "create_issue", "awl.tool": "receiver/create_issue",
        "awl.order.id": env.order_id, "awl.ref": ref, "awl.attempt": 1,
        "awl.outcome": "committed", "awl.effect.sent": True}
    assert "error.type" not in _attrs(effect)
    [delivery] = [d for d in env.deliveries() if d["ref"] == ref]
    upstream_trace, upstream_parent = _ids(delivery["traceparent"])
    assert upstream_trace == effect.context.trace_id
    by_id = {s.context.span_id: s for s in capture.spans}
    assert by_id[upstream_parent].parent.span_id == effect.context.span_id  # type: ignore[union-attr]


# --------------------------------------------------------------------------- processes

def _probe(env: Env, out: Path, *options: str,
           otel_env: dict[str, str]) -> StdioServerParameters:
    """``awl gateway`` for the env's order under the probe, with only these OTEL_* set."""
    plain = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return StdioServerParameters(
        command=sys.executable,
        args=[str(PROBE), str(out), *options, "--", "gateway", "--order", env.order_id,
              "--config", str(env.config), "--home", str(env.home)],
        env={**plain, "PYTHONPATH": str(ROOT), **otel_env}, cwd=str(env.home))


def _worker_span() -> NonRecordingSpan:
    return NonRecordingSpan(SpanContext(TRACE, SPAN, is_remote=True,
                                        trace_flags=TraceFlags(TraceFlags.SAMPLED),
                                        trace_state=TraceState([("worker", "1")])))


async def _run(env: Env, params: StdioServerParameters, err: Path) -> None:
    """One call through the gateway process, in the worker's trace (whether or not this
    test process records spans, its MCP client sends that trace in the request's _meta)."""
    with err.open("w") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            with trace.use_span(_worker_span()):
                meta = cast(RequestParamsMeta, {"traceparent": _traceparent(TRACE, SPAN)})
                result = await client.call_tool("receiver__deliver", {"to": "ops"}, meta=meta)
            assert not result.is_error, result


def _modules(out: Path) -> list[str]:
    """What the probe found imported when the gateway process ended."""
    found: list[str] = json.loads(out.read_text())["modules"]
    return found


@pytest.mark.slow
@pytest.mark.spec("OBS-1")
async def test_a_gateway_without_otel_settings_imports_no_opentelemetry_sdk(
        tmp_path: Path) -> None:
    """Without OTEL_* (and with OTEL_SDK_DISABLED=true beside an endpoint) the gateway
    never imports the SDK, an exporter, or its own OpenTelemetry module; the worker's
    trace context still reaches the upstream as it was sent."""
    env = make_env(tmp_path)
    settings: tuple[dict[str, str], ...] = ({}, {"OTEL_SDK_DISABLED": "true",
                     "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:  # two gateway processes side by side
            for i, otel_env in enumerate(settings):
                params = _probe(env, tmp_path / f"modules{i}.json", otel_env=otel_env)
                tg.start_soon(_run, env, params, tmp_path / f"gateway{i}.err")
    for i in range(len(settings)):
        assert _modules(tmp_path / f"modules{i}.json") == []
        assert "telemetry" not in (tmp_path / f"gateway{i}.err").read_text()
    assert [_ids(d["traceparent"])[0] for d in env.deliveries()] == [TRACE, TRACE]


@pytest.mark.slow
@pytest.mark.spec("OBS-1")
async def test_otel_settings_without_the_extra_say_so_once_and_the_gateway_serves(
        tmp_path: Path) -> None:
    """OTEL_* asks for traces but the SDK cannot be imported: one line says what to
    install, and every call is served as without telemetry."""
    env = make_env(tmp_path)
    out, err = tmp_path / "modules.json", tmp_path / "gateway.err"
    params = _probe(env, out, "--block-sdk", otel_env={"OTEL_TRACES_EXPORTER": "otlp"})
    with anyio.fail_after(60):
        await _run(env, params, err)
    assert _modules(out) == []
    lines = [line for line in err.read_text().splitlines() if "telemetry" in line]
    assert lines == [
        "awl: telemetry: OTEL_* settings ask for telemetry, but the OpenTelemetry SDK is "
        "not installed; running without it. Install it with "
        "pip install -e '.[otel]' in the awl-gateway checkout"]
    assert [d["ref"] for d in env.deliveries()] == ["receiver/deliver#1"]


@pytest.mark.slow
@pytest.mark.spec("OBS-1", "OBS-2")
async def test_otel_traces_exporter_console_turns_tracing_on_in_a_gateway_process(
        tmp_path: Path) -> None:
    """OTEL_TRACES_EXPORTER=console: the gateway process writes its spans to stderr (its
    stdout is the MCP stream, which stays clean), in the worker's trace; the OTLP exporter
    beside it (and the metrics the endpoint turns on) has no collector, and the call is
    served all the same."""
    env = make_env(tmp_path)
    out, err = tmp_path / "modules.json", tmp_path / "gateway.err"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    params = _probe(env, out, otel_env={
        "OTEL_TRACES_EXPORTER": "console,otlp", "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{closed}",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "1"})
    with anyio.fail_after(60):
        await _run(env, params, err)
    assert "gateway._otel" in _modules(out)
    text = err.read_text()
    decoder, spans, at = json.JSONDecoder(), [], 0
    while (start := text.find("{", at)) != -1:
        try:
            value, at = decoder.raw_decode(text, start)
        except ValueError:
            at = start + 1
            continue
        if isinstance(value, dict) and "context" in value:
            spans.append(value)
    served = [s for s in spans if s["name"] == "tools/call receiver__deliver"]
    assert len(served) == 1, spans
    assert served[0]["context"]["trace_id"] == f"0x{TRACE:032x}"
    assert served[0]["attributes"]["awl.outcome"] == "ok"
    assert served[0]["attributes"]["awl.ref"] == "receiver/deliver#1"
    [delivery] = env.deliveries()
    assert _ids(delivery["traceparent"])[0] == TRACE


@pytest.mark.slow
@pytest.mark.spec("OBS-2")
async def test_a_workers_tracestate_is_bounded_before_its_span_and_the_upstream(
        tmp_path: Path, otel: tuple[_Capture, InMemoryMetricReader]) -> None:
    """With telemetry on, a worker's ``tracestate`` of 30 members and 3,000 characters (its
    SDK client's context, or the ``_meta`` of an in-process call) reaches the upstream cut
    to the W3C's 512 characters, the worker's first members kept; the gateway's own span
    of an in-process call takes it bounded as its parent's."""
    capture, _reader = otel
    env = make_env(tmp_path)
    members = [(f"vendor{i}", "v" * 90) for i in range(30)]
    long_state = ",".join(f"{k}={v}" for k, v in members)
    worker = NonRecordingSpan(SpanContext(TRACE, SPAN, is_remote=True,
                                          trace_flags=TraceFlags(TraceFlags.SAMPLED),
                                          trace_state=TraceState(members)))
    with anyio.fail_after(60):
        async with connect(env) as (gw, client):
            with trace.use_span(worker):
                served = await client.call_tool("receiver__deliver", {"to": "ops"})
            direct = final(await gw.call("receiver__deliver", {"to": "it"}, meta={
                "traceparent": _traceparent(OTHER_TRACE, SPAN), "tracestate": long_state}))
    assert not served.is_error and not direct.is_error
    first, second = env.deliveries()
    for delivery, trace_id in ((first, TRACE), (second, OTHER_TRACE)):
        assert _ids(delivery["traceparent"])[0] == trace_id
        state = delivery["tracestate"]
        assert len(state) <= 512 and long_state.startswith(state), state
        assert state.count(",") + 1 == 5  # vendor0 to vendor4: 98 characters each
    own = _one(capture.spans, "tools/call receiver__deliver", awl_ref=second["ref"])
    assert own.parent is not None and own.parent.trace_state.to_header() == second["tracestate"]
