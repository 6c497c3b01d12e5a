"""The telemetry the gateway and the committer record through, as types whose own methods
do nothing (:data:`NOOP`), and what the environment asks for (:func:`signals`).

:mod:`gateway._telemetry` decides which telemetry is active; :mod:`gateway._otel` (the
``[otel]`` extra) subclasses these with OpenTelemetry. They have their own module so that
one can build on them while the switch imports it only when asked.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

from awl.documents import CallRecord, WorkOrder
from awl.store import Store

__all__ = ["EXPORTERS", "NOOP", "CallSpan", "EffectSpan", "Signals", "Telemetry", "Watched",
           "signals"]

EXPORTERS = ("otlp", "console")
"""The exporters the switch understands (``none`` turns a signal off)."""



@dataclass(frozen=True, slots=True)
class Signals:
    """Which exporters the environment asks for, per signal (empty: that signal is off)."""

    traces: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    """One line per setting that was not understood (it is ignored)."""

    @property
    def on(self) -> bool:
        return bool(self.traces or self.metrics)


def _exporters(env: Mapping[str, str], name: str, endpoint: str,
               problems: list[str]) -> tuple[str, ...]:
    raw = env.get(name)
    if raw is None or not raw.strip():
        if env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(endpoint):
            return ("otlp",)
        return ()
    found: list[str] = []
    for part in (p.strip().lower() for p in raw.split(",")):
        if part in ("", "none"):
            continue
        if part in EXPORTERS:
            if part not in found:
                found.append(part)
        else:
            problems.append(f"{name}={part!r} is not an exporter the gateway has (it has "
                            f"{', '.join(EXPORTERS)} and none); ignored")
    return tuple(found)


def signals(env: Mapping[str, str]) -> Signals:
    """What ``env`` asks for (SPEC OBS-1)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return Signals()
    problems: list[str] = []
    traces = _exporters(env, "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                        problems)
    metrics = _exporters(env, "OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                         problems)
    return Signals(traces, metrics, tuple(problems))


class Watched(Protocol):
    """What the metrics read from a running gateway: its order and its store."""

    @property
    def order(self) -> WorkOrder: ...

    store: Store


class CallSpan:
    """One gateway tool call's span. This class is the no-op one."""

    __slots__ = ()

    def done(self, *, tool: str | None, ref: str | None, attempt: int | None, outcome: str,
             code: str | None) -> None:
        """How the call ended: the canonical ``tool`` (None: the name resolved to none), the
        call's ref and attempt (None: nothing was recorded), ``outcome`` as recorded (ok,
        error, held, refused) and the ``AWL_...`` code of a tool error."""


class EffectSpan:
    """One committed effect's span. This class is the no-op one."""

    __slots__ = ()

    def done(self, state: str, *, sent: bool) -> None:
        """The effect's state after this dispatch, and whether its request went out."""


class Telemetry:
    """Telemetry that records nothing: what every process has unless OBS-1 turns it on."""

    on = False

    def tool_call(self, name: str, order_id: str, meta: Mapping[str, Any] | None, *,
                  served: bool) -> AbstractContextManager[CallSpan]:
        """Around one ``tools/call`` of an upstream tool, exposed ``name``. ``served``: it
        came through the gateway's MCP server, whose SDK span is the current one."""
        return _NULL_CALL

    def effect(self, order_id: str, call: CallRecord) -> AbstractContextManager[EffectSpan]:
        """Around one dispatch of an approved effect."""
        return _NULL_EFFECT

    def watch(self, gateway: Watched) -> None:
        """Report this gateway's budget left and effects by state while it lives."""


_NULL_CALL: AbstractContextManager[CallSpan] = nullcontext(CallSpan())
_NULL_EFFECT: AbstractContextManager[EffectSpan] = nullcontext(EffectSpan())
NOOP = Telemetry()
