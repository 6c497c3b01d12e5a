"""The upstream tools' input schemas, for showing a held call's fields as its tool names
them (SPEC BIND-23): in the schema's order, each with its ``title`` and ``description``.

The store keeps a held call's arguments, not the schema its tool had, so the page asks the
upstreams of its ``--config`` (the ones its commit runs through) for their tool lists, once,
and keeps the answer for :data:`KEEP_SECONDS`. A page without ``--config``, or an upstream
that cannot be reached within :data:`LIST_SECONDS`, shows the fields in their stored order
and says why.
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Mapping
from typing import Any

import anyio

from gateway import UpstreamPool

__all__ = ["KEEP_SECONDS", "LIST_SECONDS", "ToolSchemas"]

KEEP_SECONDS = 300.0
"""How long a listing is used before the upstreams are asked again."""
LIST_SECONDS = 10.0
"""How long the page waits for the upstreams' tool lists."""

RETRY_SECONDS = 5.0
"""The least time between two listings."""

log = logging.getLogger("awl.web")


class ToolSchemas:
    """Input schemas by canonical tool name (``server/tool``), from ``config``'s upstreams."""

    def __init__(self, config: Any, *, keep: float = KEEP_SECONDS,
                 wait: float = LIST_SECONDS) -> None:
        self.config = config
        self.keep = keep
        self.wait = wait
        self._schemas: dict[str, dict[str, Any]] = {}
        self._at = -float("inf")
        self._why: str | None = None
        self._lock = anyio.Lock()

    async def get(self, tools: set[str]) -> tuple[Mapping[str, dict[str, Any]], str | None]:
        """The schemas of ``tools`` the upstreams give, and why some are missing (None when
        none is)."""
        if not tools:
            return {}, None
        if self.config is None:
            return {}, ("this page was started without --config, so the fields are in the "
                        "order they were stored, named as sent")
        async with self._lock:
            age = time.monotonic() - self._at
            # A tool no listing had yet (an upstream that came up since) is asked for again,
            # but not more often than every few seconds.
            if age >= self.keep or (not tools <= self._schemas.keys() and age > RETRY_SECONDS):
                await self._list()
        missing = sorted(tools - self._schemas.keys())
        why = None
        if missing:
            why = self._why or (f"no upstream lists {', '.join(missing)} now, so its fields "
                                "are in the order they were stored, named as sent")
        return {t: self._schemas[t] for t in tools if t in self._schemas}, why

    async def _list(self) -> None:
        self._at = time.monotonic()
        errors = io.StringIO()  # an upstream's stderr is not the page's business
        try:
            with anyio.fail_after(self.wait):
                async with UpstreamPool(self.config, errlog=errors, wait=True) as pool:
                    tools = await pool.tools()
        except Exception as exc:  # an upstream that will not start: said beside the fields
            said = " ".join(str(exc).split())[:200] or type(exc).__name__
            log.warning("the page could not list the upstream tools: %s", said)
            self._why = (f"the upstreams could not be asked for their tools ({said}), so the "
                         "fields are in the order they were stored, named as sent")
            return
        self._why = None
        self._schemas = {name: dict(tool.input_schema or {}) for name, tool in tools.items()}
