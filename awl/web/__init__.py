"""The manager's approval page (``awl web``): see the proof, approve a subset, run it.

:func:`build_app` makes the ASGI app over a store; :func:`loopback_hosts` lists the
``Host`` values a loopback page accepts (DNS rebinding, SEC-2); the ``awl web`` command
(:mod:`awl.cli._web`) serves it with uvicorn.
"""

from __future__ import annotations

from awl.mcp.transport import LOOPBACK_NAMES
from awl.web._app import COOKIE, WebConfig, build_app
from awl.web._guard import CSP
from awl.web._sessions import Session, Sessions

__all__ = ["COOKIE", "CSP", "Session", "Sessions", "WebConfig", "build_app", "loopback_hosts"]


def loopback_hosts(host: str, port: int) -> frozenset[str]:
    """The ``Host`` header values a page listening on loopback ``host:port`` accepts."""
    shown = f"[{host}]" if ":" in host else host
    return frozenset(f"{name}:{port}" for name in {*LOOPBACK_NAMES, shown})
