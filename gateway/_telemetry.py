"""OpenTelemetry for operators, behind one switch: off, and never imported, unless asked for.

The gateway and the committer talk only to :func:`current`, which answers a
:class:`Telemetry`. Unless the environment asks for telemetry (the standard variables, read
once per process, as SPEC OBS-1 lists them) that is the no-op one defined here: its context
managers are shared ``nullcontext`` objects and its methods do nothing, so a call pays a few
attribute lookups and nothing imports the OpenTelemetry SDK. (The OpenTelemetry *API* is
always loaded: the MCP SDK depends on it and opens its own spans, which record nothing until
an SDK provider is installed.) When asked, :mod:`gateway._otel` (the ``awl-gateway[otel]``
extra) builds the real one, once per process; unlike the SDK's own default it never sends to
``localhost:4318`` unasked, and the exporters read the rest of ``OTEL_*`` (endpoint,
headers, timeout, service name, resource attributes, export intervals) themselves.

An application that runs the gateway in-process and sets up its own global providers calls
:func:`enable` instead.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from gateway._spans import NOOP, CallSpan, EffectSpan, Signals, Telemetry, signals

__all__ = ["NOOP", "CallSpan", "EffectSpan", "Signals", "Telemetry", "current", "enable",
           "signals"]

INSTALL_HINT = "pip install -e '.[otel]' in the awl-gateway checkout"

_active: Telemetry | None = None


def _say(line: str) -> None:
    """One line on stderr, whatever ``line`` holds (the SDK's messages wrap and pad)."""
    print(f"awl: telemetry: {' '.join(line.split())}", file=sys.stderr, flush=True)


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
