"""The real telemetry (SPEC OBS-1 to OBS-5): imported only when it is turned on.

It needs the ``awl-gateway[otel]`` extra (the OpenTelemetry SDK and its OTLP/HTTP
exporter). It reports to the global providers, the ones the MCP SDK's own spans go to: its
server middleware opens a ``SERVER`` span for every request the gateway serves (named
``tools/call {tool}``, parented by the trace context in the request's ``_meta``) and its
client opens a span for every request sent upstream and writes the current trace context
into that request's ``_meta``. So a tool call arriving over MCP gets the gateway's
attributes on the SDK's span instead of a second span of the same name, and the trace
context reaches the upstream (and a committed effect's, from its own span) without the
gateway writing it. A call made in-process through :meth:`gateway.Gateway.call` gets a span
of the gateway's own, parented by its ``meta``.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from types import FrameType
from typing import Any

from opentelemetry import context, metrics, trace
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.span import TraceState

from awl.documents import RELEASE, CallRecord
from awl.mcp import bound_meta, bound_tracestate
from gateway._names import split_canonical
from gateway._spans import CallSpan, EffectSpan, Signals, Telemetry, Watched

SCOPE = "awl.gateway"
VERSION = RELEASE
SERVICE = "awl-gateway"
"""``service.name`` unless ``OTEL_SERVICE_NAME`` (or the resource attributes) say otherwise."""

TOOL_ERROR = "tool_error"
"""``error.type`` of a call answered with a tool error (``isError``), as the MCP
conventions name it; the gateway's own code goes in ``awl.error.code``."""

_DURATION_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
"""Seconds; the MCP conventions' advice for ``mcp.server.operation.duration``."""

GRPC_MISSING = ("the OTLP protocol is grpc, which needs opentelemetry-exporter-otlp-proto-grpc; "
                "install it, or set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf")

_W3C = TraceContextTextMapPropagator()


def _parent(meta: Mapping[str, Any] | None) -> Context | None:
    """The remote parent named by ``traceparent``/``tracestate`` in ``meta`` (OBS-2); None
    when there is none (or it is not valid), so the span nests under the ambient one."""
    if not meta:
        return None
    bounded = bound_meta(meta)  # the W3C limits, as the upstream gets it
    carrier = {k: v for k in ("traceparent", "tracestate")
               if isinstance(v := bounded.get(k), str)}
    if "traceparent" not in carrier:
        return None
    context = _W3C.extract(carrier)
    if not trace.get_current_span(context).get_span_context().is_valid:
        return None
    return context


def _bound_current_state(stack: ExitStack, span: Span) -> None:
    """Make the context under ``span`` carry its ``tracestate`` bounded to the W3C limits
    (32 members, 512 characters), so the requests sent upstream from it do. The frames of
    a stdio or HTTP worker are bounded before the MCP SDK opens its span; an in-process
    client's ``_meta`` reaches the SDK as given."""
    found = span.get_span_context()
    header = found.trace_state.to_header()
    if not header:
        return
    kept = bound_tracestate(header)
    if kept == header:
        return
    bounded = SpanContext(found.trace_id, found.span_id, is_remote=found.is_remote,
                          trace_flags=found.trace_flags,
                          trace_state=TraceState.from_header([kept]) if kept else TraceState())
    token = context.attach(trace.set_span_in_context(NonRecordingSpan(bounded)))
    stack.callback(context.detach, token)


class _Call(CallSpan):
    __slots__ = ("metric", "span")

    def __init__(self, span: Span, metric: dict[str, Any]) -> None:
        self.span = span
        self.metric = metric

    def done(self, *, tool: str | None, ref: str | None, attempt: int | None, outcome: str,
             code: str | None) -> None:
        span = self.span
        if tool is not None:
            span.set_attribute("awl.tool", tool)
        else:  # a name no table holds: keep it out of the metrics' tool names
            self.metric.pop("gen_ai.tool.name", None)
        if ref is not None:
            span.set_attribute("awl.ref", ref)
        if attempt is not None:
            span.set_attribute("awl.attempt", attempt)
        span.set_attribute("awl.outcome", outcome)
        self.metric["awl.outcome"] = outcome
        if code is not None or outcome == "error":
            span.set_attribute("error.type", TOOL_ERROR)
            self.metric["error.type"] = TOOL_ERROR
            if code is not None:
                span.set_attribute("awl.error.code", code)
                self.metric["awl.error.code"] = code
            span.set_status(StatusCode.ERROR, code)

    def failed(self, exc: BaseException) -> None:
        """The call ended with an exception (a protocol error, a cancellation)."""
        kind = type(exc).__qualname__
        self.span.set_attribute("error.type", kind)
        self.span.set_status(StatusCode.ERROR, str(exc)[:200] or kind)
        self.metric.setdefault("awl.outcome", "error")
        self.metric["error.type"] = kind


class _Effect(EffectSpan):
    __slots__ = ("metric", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.metric: dict[str, Any] = {}

    def done(self, state: str, *, sent: bool) -> None:
        self.span.set_attributes({"awl.outcome": state, "awl.effect.sent": sent})
        self.metric.update({"awl.outcome": state, "awl.effect.sent": sent})
        if state != "committed":
            kind = TOOL_ERROR if state == "failed" else state
            self.span.set_attribute("error.type", kind)
            self.span.set_status(StatusCode.ERROR, kind)


class OTelTelemetry(Telemetry):
    """Spans and metrics through the global OpenTelemetry providers."""

    on = True

    def __init__(self) -> None:
        self._tracer = trace.get_tracer(SCOPE, VERSION)
        meter = metrics.get_meter(SCOPE, VERSION)
        self._calls = meter.create_counter(
            "awl.gateway.calls", unit="{call}",
            description="Tool calls of upstream tools, by outcome (ok, error, held, refused)")
        self._duration = meter.create_histogram(
            "mcp.server.operation.duration", unit="s",
            description="How long the gateway took to answer a tools/call",
            explicit_bucket_boundaries_advisory=list(_DURATION_BUCKETS))
        self._effects_sent = meter.create_counter(
            "awl.commit.effects", unit="{effect}",
            description="Approved effects a commit dispatched, by the state they ended in")
        self._watched: weakref.WeakSet[Any] = weakref.WeakSet()
        meter.create_observable_gauge(
            "awl.order.budget.tool_calls.remaining", callbacks=[self._calls_left],
            unit="{call}", description="Tool calls the order's budget has left")
        meter.create_observable_gauge(
            "awl.order.budget.usd.remaining", callbacks=[self._usd_left], unit="USD",
            description="USD the order's budget has left")
        meter.create_observable_gauge(
            "awl.effects", callbacks=[self._effect_states], unit="{effect}",
            description="The order's effects (held calls) by state")

    # ------------------------------------------------------------------ spans

    @contextmanager
    def tool_call(self, name: str, order_id: str, meta: Mapping[str, Any] | None, *,
                  served: bool) -> Iterator[CallSpan]:
        start = time.perf_counter()
        attributes: dict[str, Any] = {
            "mcp.method.name": "tools/call", "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name}
        metric = dict(attributes)
        attributes["awl.order.id"] = order_id
        with ExitStack() as stack:
            if served:  # the MCP SDK's server span for this request is the current one
                span = trace.get_current_span()
                span.set_attributes(attributes)
                _bound_current_state(stack, span)
            else:
                span = stack.enter_context(self._tracer.start_as_current_span(
                    f"tools/call {name}", context=_parent(meta), kind=SpanKind.SERVER,
                    attributes=attributes, record_exception=False,
                    set_status_on_exception=False))
            handle = _Call(span, metric)
            try:
                yield handle
            except BaseException as exc:
                handle.failed(exc)
                raise
            finally:
                self._calls.add(1, handle.metric)
                self._duration.record(time.perf_counter() - start, handle.metric)

    @contextmanager
    def effect(self, order_id: str, call: CallRecord) -> Iterator[EffectSpan]:
        _server, tool = split_canonical(call.tool)
        with self._tracer.start_as_current_span(
                f"tools/call {tool}", kind=SpanKind.CLIENT, record_exception=False,
                set_status_on_exception=False, attributes={
                    "mcp.method.name": "tools/call", "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": tool, "awl.tool": call.tool, "awl.order.id": order_id,
                    "awl.ref": call.ref, "awl.attempt": call.attempt}) as span:
            handle = _Effect(span)
            try:
                yield handle
            except BaseException as exc:
                span.set_attribute("error.type", type(exc).__qualname__)
                span.set_status(StatusCode.ERROR, type(exc).__qualname__)
                raise
            finally:
                if handle.metric:
                    self._effects_sent.add(1, handle.metric)

    # ------------------------------------------------------------------ metrics

    def watch(self, gateway: Watched) -> None:
        self._watched.add(gateway)

    def _each(self) -> Iterable[Watched]:
        yield from list(self._watched)

    def _calls_left(self, options: CallbackOptions) -> Iterable[Observation]:
        for gateway in self._each():
            limit = gateway.order.budget.tool_calls
            if limit is not None:
                try:
                    used = gateway.store.usage(gateway.order.id).tool_calls
                except Exception:  # a closed store: that gateway is gone
                    continue
                yield Observation(max(limit - used, 0), {"awl.order.id": gateway.order.id})

    def _usd_left(self, options: CallbackOptions) -> Iterable[Observation]:
        for gateway in self._each():
            limit = gateway.order.budget.usd
            if limit is not None:
                try:
                    used = gateway.store.usage(gateway.order.id).usd
                except Exception:
                    continue
                yield Observation(max(limit - used, 0.0), {"awl.order.id": gateway.order.id})

    def _effect_states(self, options: CallbackOptions) -> Iterable[Observation]:
        for gateway in self._each():
            try:
                effects = gateway.store.effects(gateway.order.id)
            except Exception:
                continue
            counts: dict[str, int] = {}
            for effect in effects:
                counts[effect.state] = counts.get(effect.state, 0) + 1
            for state, count in sorted(counts.items()):
                yield Observation(count, {"awl.order.id": gateway.order.id,
                                          "awl.effect.state": state})


# --------------------------------------------------------------------------- from the env

def _otlp_protocol(signal: str) -> str:
    return (os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
            or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")


def _span_exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(out=sys.stderr)
    if _otlp_protocol("TRACES") == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found, unused-ignore]
                OTLPSpanExporter as GrpcSpanExporter,
            )
        except ImportError:
            raise RuntimeError(GRPC_MISSING) from None
        return GrpcSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _metric_exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

        return ConsoleMetricExporter(out=sys.stderr)
    if _otlp_protocol("METRICS") == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (  # type: ignore[import-not-found, unused-ignore]
                OTLPMetricExporter as GrpcMetricExporter,
            )
        except ImportError:
            raise RuntimeError(GRPC_MISSING) from None
        return GrpcMetricExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter()


EXIT_FLUSH = 1.0
"""Seconds a process spends at exit sending what is still buffered: a collector that does
not answer must not hold up the exit (a stdio client gives its server about 2 s)."""


def from_env(wanted: Signals) -> OTelTelemetry:
    """Set up the global providers the environment asks for (OBS-1), unless the application
    already set its own, and answer the telemetry that reports to them.

    Their exporters read the other ``OTEL_*`` settings themselves; what the SDK says about
    them, or about a collector it cannot reach, goes to stderr as ``awl: telemetry:`` lines,
    each kind once (:class:`_SayOnce`). Every part is built before any provider is set, so
    a setting the SDK refuses leaves none half set up. At exit, and on SIGTERM, the
    providers are shut down, which sends what is still buffered, for at most
    :data:`EXIT_FLUSH` (OBS-6)."""
    _say_sdk_problems_once()
    given = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": SERVICE}
    resource = Resource.create(given)
    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None
    if wanted.traces and not isinstance(trace.get_tracer_provider(), TracerProvider):
        tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        for name in wanted.traces:
            tracer_provider.add_span_processor(BatchSpanProcessor(_span_exporter(name)))
    if wanted.metrics and not isinstance(metrics.get_meter_provider(), MeterProvider):
        try:
            readers = [PeriodicExportingMetricReader(_metric_exporter(n))
                       for n in wanted.metrics]
        except BaseException:
            if tracer_provider is not None:  # its batch thread is running: end it
                threading.Thread(target=tracer_provider.shutdown, daemon=True).start()
            raise
        meter_provider = MeterProvider(resource=resource, metric_readers=readers,
                                       shutdown_on_exit=False)
    providers: list[TracerProvider | MeterProvider] = []
    if tracer_provider is not None:
        trace.set_tracer_provider(tracer_provider)
        providers.append(tracer_provider)
    if meter_provider is not None:
        metrics.set_meter_provider(meter_provider)
        providers.append(meter_provider)
    if providers:
        stop = _Stop(providers)
        atexit.register(stop)
        stop.on_sigterm()
    return shared()


class _SayOnce(logging.Handler):
    """What the OpenTelemetry SDK logs (a setting it could not read, a collector it could
    not reach) as one ``awl: telemetry:`` line on stderr, each kind once: no traceback (the
    SDK logs some with one), and no line again at every export or retry of a long-running
    gateway."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self._said: set[tuple[str, str]] = set()
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            with self._guard:
                kind = (record.name, str(record.msg))
                if kind in self._said:
                    return
                self._said.add(kind)
            text = record.getMessage()
            exc = record.exc_info[1] if record.exc_info else None
            if exc is not None:
                text += f" ({type(exc).__name__}: {exc})"
            text = " ".join(text.split())[:500]
            sys.stderr.write(f"awl: telemetry: {text} (said once)\n")
            sys.stderr.flush()
        except Exception:  # a closed stderr: nothing to say it on
            pass


def _say_sdk_problems_once() -> None:
    """Show the SDK's warnings through :class:`_SayOnce`, where nobody else shows them: an
    application that set up logging (a handler on the root or the ``opentelemetry``
    logger) keeps getting them its own way; otherwise Python's last resort would print each
    bare, every time, tracebacks included."""
    sdk = logging.getLogger("opentelemetry")
    if sdk.handlers or logging.getLogger().handlers:
        return
    sdk.addHandler(_SayOnce())
    sdk.propagate = False


class _Stop:
    """Shuts the providers down side by side, once, waiting at most :data:`EXIT_FLUSH` for
    them however often it is called (at exit, and on SIGTERM, which may come during it)."""

    def __init__(self, providers: list[TracerProvider | MeterProvider]) -> None:
        self._providers = providers
        self._threads: list[threading.Thread] = []
        self._end = 0.0

    def __call__(self) -> None:
        if not self._threads:
            self._end = time.monotonic() + EXIT_FLUSH
            threads = [threading.Thread(target=p.shutdown, name="awl-otel-flush", daemon=True)
                       for p in self._providers]
            for thread in threads:
                thread.start()
            self._threads = threads
        for thread in self._threads:
            thread.join(max(self._end - time.monotonic(), 0))

    def on_sigterm(self) -> None:
        """Flush before SIGTERM ends the process (OBS-6), which it then does as it would
        have: by the signal. Only where nobody else handles SIGTERM, and only from the main
        thread (Python lets no other set a handler)."""
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL):
            signal.signal(signal.SIGTERM, self._terminated)

    def _terminated(self, signum: int, frame: FrameType | None) -> None:
        self()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


_shared: list[OTelTelemetry] = []


def shared() -> OTelTelemetry:
    """The process's one :class:`OTelTelemetry` (its instruments are made once)."""
    if not _shared:
        _shared.append(OTelTelemetry())
    return _shared[0]
