"""Upstream results made fit to pass on: bounded in size, and agreeing with the tool's schema.

:func:`bound_result` cuts a result larger than the server's ``max_result_bytes`` (GW-8,
GW-12, DOC-15): it keeps ``is_error``, the text blocks in order (at most
:data:`~awl.documents.limits.MAX_CONTENT_BLOCKS` of them) and as much of the structured content as
fits, shortening the longest strings first (every string longer than some length is cut to
that length), and ends with one text block
that says in words what was cut and by how much. Its time is linear in the result's size
(one sort of the string lengths aside), whatever the number of blocks.

:class:`OutputSchemas` makes a forwarded result agree with the ``outputSchema`` the gateway
advertises for its tool (GW-12, BIND-8), because MCP clients reject a result that does not:
a success whose structured content is missing or does not validate becomes a tool error that
says so (the call did run; its text follows), and an error's structured content that does
not validate is left out.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import mcp_types as types

from awl.documents import MAX_CONTENT_BLOCKS, escapes_nothing, pointer
from awl.mcp import coded_error

__all__ = [
    "AWL_UPSTREAM_BAD_RESULT",
    "TRUNCATED_META_KEY",
    "OutputSchemas",
    "bound_result",
    "result_size",
]

log = logging.getLogger("awl.gateway")

TRUNCATED_META_KEY = "awl/truncated"
"""Set in a bounded result's ``_meta``: ``{"bytes": original size, "limit": the limit}``."""

AWL_UPSTREAM_BAD_RESULT = "AWL_UPSTREAM_BAD_RESULT"
"""A success whose structured content does not fit the tool's advertised output schema."""

_NOTE_ROOM = 700
"""Bytes kept free for the closing note (it is about 300)."""
_ROUNDS = 4
"""Times the cut is redone with less room when the JSON came out larger than estimated."""
_EMPTY_TEXT_BLOCK = len('{"type":"text","text":""},')


def result_size(result: types.CallToolResult) -> int:
    """Bytes of the result's JSON as the wire carries it."""
    return len(result.model_dump_json(by_alias=True, exclude_none=True))


def _json_bytes(text: str) -> int:
    """Bytes ``text`` takes inside a JSON string (quotes not counted)."""
    if escapes_nothing(text):
        return len(text)
    return len(json.dumps(text, ensure_ascii=False).encode("utf-8", "surrogatepass")) - 2


def _prefix(text: str, room: int) -> str:
    """The longest start of ``text`` found cheaply whose JSON takes at most ``room`` bytes."""
    if room <= 0:
        return ""
    size = _json_bytes(text)
    if size <= room:
        return text
    keep = len(text) * room // size
    excess = _json_bytes(text[:keep]) - room
    if excess > 0:  # every character takes at least one byte, so one step is enough
        keep = max(keep - excess, 0)
    return text[:keep]


def _cap(sizes: list[int], room: int) -> int:
    """The largest length C with ``sum(min(s, C)) <= room`` (every size when they fit)."""
    ordered = sorted(sizes)
    left = room
    for i, size in enumerate(ordered):
        share = left // (len(ordered) - i)
        if size > share:
            return max(share, 0)
        left -= size
    return ordered[-1] if ordered else 0


class _Strings:
    """The string leaves of a JSON value, in a copy whose leaves can be replaced."""

    def __init__(self, value: Any) -> None:
        self.slots: list[tuple[Any, Any]] = []
        self.root = self._copy(value)

    def _copy(self, value: Any) -> Any:
        # Iterative, so a deeply nested value cannot exhaust the stack.
        holder: list[Any] = [value]
        todo: list[tuple[Any, Any]] = [(holder, 0)]
        while todo:
            parent, key = todo.pop()
            item = parent[key]
            if isinstance(item, str):
                self.slots.append((parent, key))
            elif isinstance(item, dict):
                members = parent[key] = dict(item)
                todo.extend((members, k) for k in members)
            elif isinstance(item, list):
                items = parent[key] = list(item)
                todo.extend((items, i) for i in range(len(items)))
        return holder[0]

    def texts(self) -> list[str]:
        return [parent[key] for parent, key in self.slots]

    def fill(self, texts: list[str]) -> Any:
        for (parent, key), text in zip(self.slots, texts, strict=True):
            parent[key] = text
        return self.root


def bound_result(result: types.CallToolResult, limit: int, *, label: str = "tool",
                 max_blocks: int = MAX_CONTENT_BLOCKS) -> types.CallToolResult:
    """``result`` if its JSON fits in ``limit`` bytes and it has at most ``max_blocks``
    content blocks, else a cut copy that does.

    Truncation rather than refusal: the call did run, and its effect must not look failed.
    Non-text blocks (images, audio, resources) of a cut result are left out; the closing
    text block says what was cut and ``_meta["awl/truncated"]`` records the original size.
    Limits under about 1 KiB may not be met.
    """
    blocks = result.content
    if len(blocks) <= max_blocks:
        size = result_size(result)
        if size <= limit:
            return result
    else:
        size = result_size(result)
    return _Bounder(result, size, limit, label, max_blocks).run()


class _Bounder:
    def __init__(self, result: types.CallToolResult, size: int, limit: int, label: str,
                 max_blocks: int) -> None:
        self.result = result
        self.size = size
        self.limit = limit
        self.label = label
        kept = result.content[:max_blocks]
        self.dropped_blocks = len(result.content) - len(kept)
        self.texts = [b.text for b in kept if isinstance(b, types.TextContent)]
        self.non_text = len(kept) - len(self.texts)
        meta = dict(result.meta or {})
        self.meta_dropped = bool(meta) and len(json.dumps(meta, default=str)) > limit // 4
        if self.meta_dropped:
            meta = {}
        self.meta = {**meta, TRUNCATED_META_KEY: {"bytes": size, "limit": limit}}
        self.structured: _Strings | None = None
        if result.structured_content is not None:
            self.structured = _Strings(result.structured_content)

    def _build(self, texts: list[str], structured: Any, note: str) -> types.CallToolResult:
        content: list[types.ContentBlock] = [types.TextContent(type="text", text=t)
                                             for t in texts]
        content.append(types.TextContent(type="text", text=note))
        return types.CallToolResult(content=content, structured_content=structured,
                                    is_error=self.result.is_error, _meta=self.meta)

    def run(self) -> types.CallToolResult:
        texts = self.texts
        # Blocks beyond what half the limit can frame, even empty, are left out too.
        room_for_blocks = max((self.limit // 2) // _EMPTY_TEXT_BLOCK, 0)
        if len(texts) > room_for_blocks:
            self.dropped_blocks += len(texts) - room_for_blocks
            texts = texts[:room_for_blocks]
        strings = self.structured.texts() if self.structured is not None else []
        structured_kept = self.structured is not None
        fixed = result_size(self._build([""] * len(texts), None, ""))
        if structured_kept:
            with_members = result_size(self._build([""] * len(texts),
                                                   self._empty_structured(), ""))
            if with_members - fixed > self.limit // 2:
                # The structured content's members alone take too much: leave it out.
                structured_kept, strings = False, []
            else:
                fixed = with_members
        sizes = [_json_bytes(t) for t in texts] + [_json_bytes(s) for s in strings]
        room = self.limit - fixed - _NOTE_ROOM
        for _ in range(_ROUNDS):
            cap = _cap(sizes, room)
            cut_texts = [_prefix(t, cap) for t in texts]
            cut_strings = [_prefix(s, cap) for s in strings]
            structured = (self.structured.fill(cut_strings)
                          if structured_kept and self.structured is not None else None)
            note = self._note(texts, cut_texts, strings, cut_strings, structured_kept, cap)
            bounded = self._build(cut_texts, structured, note)
            over = result_size(bounded) - self.limit
            if over <= 0:
                return bounded
            room -= over + 64
        note = self._note(texts, [""] * len(texts), strings, [], False, 0)
        return types.CallToolResult(content=[types.TextContent(type="text", text=note)],
                                    is_error=self.result.is_error, _meta=self.meta)

    def _empty_structured(self) -> Any:
        if self.structured is None:
            return None
        return self.structured.fill([""] * len(self.structured.slots))

    def _note(self, texts: list[str], cut_texts: list[str], strings: list[str],
              cut_strings: list[str], structured_kept: bool, cap: int) -> str:
        shortened = sum(1 for a, b in zip(texts, cut_texts, strict=True) if len(a) != len(b))
        left_out = (sum(len(a) - len(b) for a, b in zip(texts, cut_texts, strict=True))
                    + sum(len(a) - len(b) for a, b in zip(strings, cut_strings, strict=True)))
        parts = [f"[AWL: the {self.label} result was {self.size} bytes, over the gateway's "
                 f"limit of {self.limit} bytes, so it was cut"]
        if shortened:
            parts.append(f"{shortened} text block(s) shortened to at most {cap} characters "
                         f"({left_out} characters left out in all)")
        if self.dropped_blocks:
            parts.append(f"the last {self.dropped_blocks} content block(s) left out")
        if self.non_text:
            parts.append(f"{self.non_text} non-text block(s) (image, audio, resource) "
                         "left out")
        if self.structured is not None:
            if not structured_kept:
                parts.append("its structured content left out")
            elif any(len(a) != len(b) for a, b in zip(strings, cut_strings, strict=True)):
                parts.append("strings in its structured content shortened too")
        if self.meta_dropped:
            parts.append("its _meta left out")
        return "; ".join(parts) + ". Ask for less (a smaller range, page or file) to see the rest.]"


class OutputSchemas:
    """The output schemas the gateway advertises, and the check that results agree (GW-12).

    A schema that is not a valid JSON Schema is not advertised: no client could check
    against it, and a result could never be shown to agree with it.
    """

    def __init__(self) -> None:
        self._known: dict[str, tuple[types.Tool, Any]] = {}

    def _validator(self, canonical: str, tool: types.Tool) -> Any:
        known = self._known.get(canonical)
        if known is not None and known[0] is tool:
            return known[1]
        validator = None
        schema = tool.output_schema
        if schema is not None:
            # The JSON Schema stack loads with the first tool listed that has an output schema.
            from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
            from jsonschema.exceptions import SchemaError  # type: ignore[import-untyped]
            from jsonschema.validators import validator_for  # type: ignore[import-untyped]

            cls = validator_for(schema, default=Draft202012Validator)
            try:
                cls.check_schema(schema)
                validator = cls(schema)
            except SchemaError as exc:
                log.warning("%s: its output schema is not valid JSON Schema, so it is not "
                            "advertised: %s", canonical, exc.message)
        self._known[canonical] = (tool, validator)
        return validator

    def advertised(self, canonical: str, tool: types.Tool) -> Mapping[str, Any] | None:
        """The output schema to advertise for ``tool`` (None: advertise none)."""
        return tool.output_schema if self._validator(canonical, tool) is not None else None

    def conform(self, canonical: str, tool: types.Tool | None,
                result: types.CallToolResult) -> types.CallToolResult:
        """``result`` as a client of the advertised schema accepts it (see the module)."""
        validator = self._validator(canonical, tool) if tool is not None else None
        if validator is None:
            return result
        structured = result.structured_content
        problem = None if structured is None else _mismatch(validator, structured)
        if structured is not None and problem is None:
            return result
        if result.is_error:
            note = (f"[AWL: the error's structured content was left out: it does not match "
                    f"{canonical}'s output schema ({problem})]")
            return result.model_copy(update={
                "structured_content": None,
                "content": [*result.content, types.TextContent(type="text", text=note)]})
        why = ("has no structured content" if structured is None
               else f"has structured content that does not match its output schema ({problem})")
        if (result.meta or {}).get(TRUNCATED_META_KEY) is not None and structured is None:
            why = "was cut to the gateway's size limit and its structured content left out"
        head = (f"{AWL_UPSTREAM_BAD_RESULT}: {canonical} answered, but its result {why}; "
                "the call did run. What it answered follows as text.")
        refusal = coded_error(head)  # its code in _meta as every refusal has it (BIND-8)
        return result.model_copy(update={
            "structured_content": None, "is_error": True,
            "content": [*refusal.content, *result.content],
            "meta": {**(result.meta or {}), **(refusal.meta or {})}})


def _mismatch(validator: Any, value: Any) -> str | None:
    """Why ``value`` fails the schema (the first error, one line), or None when it fits."""
    try:
        error = next(iter(validator.iter_errors(value)), None)
    except Exception as exc:  # an unresolvable $ref, say: the schema cannot be applied
        return f"the schema cannot be applied: {type(exc).__name__}"
    if error is None:
        return None
    where = pointer(*error.absolute_path) or "top level"
    return f"at {where}: {error.message}"[:300]

