"""Refusals as MCP tool errors: the one mapping the desk server and the gateway both use.

A tool error carries no structured content: clients check structured content against the
tool's output schema even on errors, and that schema describes the tool's success. So the
details go in ``_meta[ERROR_META]`` (BIND-8).
"""

from __future__ import annotations

import re
from typing import Any

import mcp_types as types

from awl.documents.errors import AWLError, InvalidTransition, PassError, ValidationFailed

__all__ = ["ERROR_META", "coded_error", "error_result", "text_result", "tool_error"]

ERROR_META = "awl/error"
"""The ``_meta`` member of a tool error that carries its code and details (BIND-8)."""

_MAX_FINDINGS_IN_TEXT = 20
_CODE = re.compile(r"[A-Z][A-Z0-9_]*")


def tool_error(exc: AWLError) -> types.CallToolResult:
    """A refusal as the tool error a model reads: ``CODE: message``, with the details in
    ``_meta`` (BIND-8).

    ``_meta["awl/error"]`` holds ``{code, message}`` and, where they apply, ``findings``
    (VALIDATION_FAILED), ``reason`` (a refused Delegation Pass), ``state`` and ``action``
    (INVALID_TRANSITION).
    """
    data: dict[str, Any] = {"code": exc.code, "message": exc.message}
    text = f"{exc.code}: {exc.message}"
    if isinstance(exc, ValidationFailed):
        data["findings"] = [f.to_dict() for f in exc.findings]
        text += "".join(f"\n{f.rule} {f.path or '/'}: {f.message}"
                        for f in exc.findings[:_MAX_FINDINGS_IN_TEXT])
    if isinstance(exc, PassError):
        data["reason"] = exc.reason
    if isinstance(exc, InvalidTransition):
        data.update(state=exc.state, action=exc.action)
    return error_result(text, data)


def coded_error(text: str) -> types.CallToolResult:
    """A refusal already written as ``CODE: message`` (the gateway's ``AWL_*`` refusals) as
    a tool error, ``{code, message}`` under :data:`ERROR_META` (BIND-8).

    Raises:
        ValueError: ``text`` does not start with a code (capitals, digits, ``_``) and ``: ``.
    """
    code, colon, message = text.partition(": ")
    if not colon or _CODE.fullmatch(code) is None:
        raise ValueError(f"a refusal starts with its code and a colon, not {text[:40]!r}")
    return error_result(text, {"code": code, "message": message})


def error_result(text: str, data: dict[str, Any]) -> types.CallToolResult:
    """A tool error with ``text`` for the model and ``data`` under :data:`ERROR_META`."""
    return text_result(text, error=True, meta={ERROR_META: data})


def text_result(text: str, *, error: bool = False, structured: Any = None,
                meta: dict[str, Any] | None = None) -> types.CallToolResult:
    """A result of one text block; ``structured`` content for a success only (BIND-8)."""
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content=structured, is_error=error, _meta=meta)
