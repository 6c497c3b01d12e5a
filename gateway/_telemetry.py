"""OpenTelemetry for operators, behind one switch: off, and never imported, unless asked for.

The gateway and the committer talk only to :func:`current`, which answers a
:class:`Telemetry`. Unless the environment asks for telemetry (SPEC OBS-1) that is the
no-op one defined here: its context managers are shared ``nullcontext`` objects and its
methods do nothing, so a call pays a few attribute lookups and nothing imports the
OpenTelemetry SDK. (The OpenTelemetry *API* is always loaded: the MCP SDK depends on it and
opens its own spans, which record nothing until an SDK provider is installed.) When the
environment asks for it, :mod:`gateway._otel` (which needs the ``agent-work-layer[otel]``
extra) builds the real one, once per process.

The switch, read once per process from the standard variables:

- ``OTEL_SDK_DISABLED=true`` turns everything off, whatever else is set.
- Traces are on when ``OTEL_TRACES_EXPORTER`` names ``otlp`` or ``console`` (a comma list),
  or, when it is unset, when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set. ``none`` turns them off.
- Metrics likewise, with ``OTEL_METRICS_EXPORTER`` and ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``.

With none of these set nothing is on: unlike the OpenTelemetry SDK's own default, a gateway
never sends to ``localhost:4318`` unasked. The exporters read the rest of ``OTEL_*``
(endpoint, headers, timeout, service name, resource attributes, export intervals)
themselves. ``console`` writes to stderr, since a stdio gateway's stdout is its MCP stream.

An application that runs the gateway in-process and sets up its own global providers calls
:func:`enable` instead.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from awl.documents.models import CallRecord, WorkOrder
    from awl.store.protocol import Store

__all__ = ["CallSpan", "EffectSpan", "Signals", "Telemetry", "current", "enable", "signals"]

EXPORTERS = ("otlp", "console")
"""The exporters the switch understands (``none`` turns a signal off)."""

INSTALL_HINT = "pip install 'agent-work-layer[otel]'"


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

_active: Telemetry | None = None


def _say(line: str) -> None:
    print(f"awl: telemetry: {line}", file=sys.stderr, flush=True)


def _from_env(env: Mapping[str, str]) -> Telemetry:
    wanted = signals(env)
    for problem in wanted.problems:
        _say(problem)
    if not wanted.on:
        return NOOP
    try:
        from gateway import _otel
    except ImportError:
        _say("OTEL_* settings ask for telemetry, but the OpenTelemetry SDK is not installed; "
             f"running without it. Install it with {INSTALL_HINT}")
        return NOOP
    try:
        return _otel.from_env(wanted)
    except Exception as exc:  # a bad OTEL_* value the SDK refuses must not stop the gateway
        what = str(exc) if isinstance(exc, RuntimeError) else f"{type(exc).__name__}: {exc}"
        _say(f"could not start OpenTelemetry ({what}); running without it")
        return NOOP


def current() -> Telemetry:
    """This process's telemetry: decided from the environment at the first call."""
    global _active
    if _active is None:
        _active = _from_env(os.environ)
    return _active


def enable() -> Telemetry:
    """Report to the global OpenTelemetry providers the application set up, whatever the
    environment says; gateways and commits started afterwards do. Needs the extra.

    Raises:
        ImportError: The OpenTelemetry SDK is not installed.
    """
    global _active
    from gateway import _otel

    _active = _otel.shared()
    return _active


def disable() -> None:
    """Record nothing from now on (gateways built afterwards)."""
    global _active
    _active = NOOP
