"""The gateway's upstream configuration: which real MCP servers to connect to, and how.

The file uses the ``mcpServers`` shape MCP clients already read, so an operator can paste
the entries they already have::

    {
      "mcpServers": {
        "mail":   {"command": "uvx", "args": ["mail-mcp"], "env": {"TOKEN": "$MAIL_TOKEN"},
                   "costs": {"send_email": 0.01, "*": 0}, "hold": ["send_email"]},
        "github": {"url": "https://example.test/mcp",
                   "headers": {"Authorization": "Bearer ${GH_TOKEN}"}, "timeout": 60}
      },
      "gateway": {"safe_mode": true}
    }

A server entry is either stdio (``command`` with optional ``args``, ``env``, ``cwd``) or
streamable HTTP (``url`` with optional ``headers``). ``type`` may say which
(``"stdio"``, ``"http"`` or ``"streamable-http"``) and must then agree with the keys.
Optional per-server keys added by the gateway:

- ``timeout``: seconds one tool call may take before it is reported as timed out (default 30);
- ``connect_timeout``: seconds to start the server and finish the handshake (default 60);
- ``costs``: USD per call, by tool name; ``"*"`` is the price of every other tool (default 0);
- ``hold``: tool names the operator always wants held for approval; ``"*"`` holds them all;
- ``max_result_bytes``: the largest result passed on, in bytes of JSON (default 1 MiB,
  at least 1024); larger results are truncated (see :func:`gateway._results.bound_result`).

Top-level ``gateway`` settings: ``safe_mode`` (hold every allowed tool whose upstream
annotations do not mark it read-only; default false) and ``startup_wait`` (seconds after the
gateway starts during which ``tools/list`` waits for upstreams still starting, each until it
is up, has failed or has used its own ``connect_timeout``; default 20).

Values of ``env`` and ``headers`` may name environment variables as ``$NAME`` or
``${NAME}``; ``$$`` is a literal ``$``. A variable that is not set is an error, so a
missing secret never turns into an empty header. A relative ``cwd`` is resolved against the
config file's folder (against the current folder for a dict).

Anything else is refused with :class:`ConfigError`, naming the key, where it is, and what
is allowed there.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from awl.documents import (
    INT64_MAX,
    BadRequest,
    DocumentError,
    check_json_value,
    is_finite_number,
    loads,
    pointer,
    read_regular_file,
    show_value,
)

SERVER_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,40}")
"""Server names become the ``server`` part of canonical ``server/tool`` names.

Capped at 40 characters so an exposed name always keeps its ``__`` separator (see
:mod:`gateway._names`)."""

MAX_SECONDS = 365 * 24 * 3600
"""Longest ``timeout`` or ``connect_timeout`` accepted, in seconds."""
MAX_PRICE = 1e9
"""Largest per-call price in ``costs``, in USD."""
DEFAULT_STARTUP_WAIT = 20.0
"""Seconds the first ``tools/list`` waits at most, from the gateway's start, for servers
still starting: well under the 60 s an MCP client waits for an answer."""
DEFAULT_TIMEOUT = 30.0
DEFAULT_CONNECT_TIMEOUT = 60.0
DEFAULT_MAX_RESULT_BYTES = 1 << 20
MIN_RESULT_BYTES = 1024

_TOP_KEYS = ("gateway", "mcpServers")
_GATEWAY_KEYS = ("safe_mode", "startup_wait")
_COMMON_KEYS = ("connect_timeout", "costs", "hold", "max_result_bytes", "timeout", "type")
_STDIO_KEYS = ("args", "command", "cwd", "env")
_HTTP_KEYS = ("headers", "url")
_TYPES = {"stdio": "stdio", "http": "http", "streamable-http": "http", "streamableHttp": "http"}
_HEADER_NAME_RE = re.compile(r"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
"""An HTTP header name (a token of RFC 9110)."""
_HEADER_VALUE_RE = re.compile(r"(?:[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*)?")
"""A header value the HTTP client sends: visible ASCII, spaces and tabs only inside it."""
_VAR_RE = re.compile(
    r"\$(?:\$|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


class ConfigError(BadRequest):
    """The upstream configuration cannot be used; ``location`` points at the bad part.

    A :class:`awl.BadRequest` (code ``BAD_REQUEST``), so the CLI prints it as one line.
    ``location`` is a JSON pointer into the document (``/mcpServers/mail/timeout``), or
    ``""`` for the whole document.
    """

    def __init__(self, message: str, *, location: str) -> None:
        super().__init__(message)
        self.location = location


@dataclass(frozen=True, slots=True)
class StdioTransport:
    """Start the server as a child process and speak MCP over its stdin and stdout."""

    command: str
    """The program to run."""
    args: tuple[str, ...] = ()
    """Its arguments."""
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Extra environment variables (``$VAR`` already expanded), on top of a minimal
    inherited set (HOME, PATH, ...) chosen by the MCP SDK."""
    cwd: str | None = None
    """Working folder, absolute."""


@dataclass(frozen=True, slots=True)
class HttpTransport:
    """Connect to a streamable HTTP MCP endpoint."""

    url: str
    """The endpoint, ``http://`` or ``https://``."""
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Headers sent with every request (``$VAR`` already expanded)."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """One upstream MCP server and the gateway's settings for it."""

    name: str
    """The server part of canonical tool names, matching ``[A-Za-z0-9_.-]{1,40}``."""
    transport: StdioTransport | HttpTransport
    """How to reach it."""
    timeout: float = DEFAULT_TIMEOUT
    """Seconds one tool call may take."""
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    """Seconds to start the server and finish the MCP handshake."""
    costs: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    """USD per call by tool name; ``"*"`` prices every tool not named."""
    hold: frozenset[str] = frozenset()
    """Tool names always held for approval; ``"*"`` holds every tool of this server."""
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    """The largest tool result passed on, in bytes of JSON."""

    def cost_of(self, tool: str) -> float:
        """USD charged for one call of ``tool`` (the bare tool name, without the server)."""
        price = self.costs.get(tool)
        if price is None:
            price = self.costs.get("*", 0.0)
        return price

    def holds(self, tool: str) -> bool:
        """Whether the operator always wants calls of ``tool`` (bare name) held."""
        return tool in self.hold or "*" in self.hold


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """Settings for the gateway as a whole."""

    safe_mode: bool = False
    """Hold every allowed tool whose upstream annotations do not say ``readOnlyHint: true``."""
    startup_wait: float = DEFAULT_STARTUP_WAIT
    """Seconds from the gateway's start during which ``tools/list`` waits for upstreams that
    are still starting (each until it is up, has failed, or its ``connect_timeout`` has run
    out); later it lists at once what is up."""


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """A loaded, checked upstream configuration. Immutable."""

    servers: Mapping[str, ServerConfig]
    """Upstream servers by name, in file order."""
    gateway: GatewaySettings = GatewaySettings()
    """Gateway-wide settings."""
    source: str | None = None
    """The file it was read from, if any."""

    def server(self, name: str) -> ServerConfig:
        """The server called ``name``.

        Raises:
            KeyError: No server has that name.
        """
        return self.servers[name]


def load_config(source: str | os.PathLike[str] | Mapping[str, Any]) -> GatewayConfig:
    """Read and check an upstream configuration.

    Args:
        source: A path to a JSON file, or the already-parsed document.

    Raises:
        ConfigError: The file cannot be read, is not JSON, or breaks a rule above. The
            message names the key and its location and says what is allowed.
    """
    if not isinstance(source, str | os.PathLike):
        try:
            document = check_json_value(source, where="the gateway config")
        except DocumentError as exc:
            raise ConfigError(exc.message, location="") from None
        return _parse(document, base=Path.cwd(), origin=None)
    path = Path(source)
    try:
        data = read_regular_file(path, what="the gateway config")
    except DocumentError as exc:
        raise ConfigError(exc.message, location="") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: the gateway config is not UTF-8 text", location="") from None
    try:
        document = loads(text, where=f"{path}: the gateway config")
    except DocumentError as exc:
        raise ConfigError(exc.message, location="") from None
    return _parse(document, base=path.resolve().parent, origin=str(path))


class _Parser:
    def __init__(self, origin: str | None) -> None:
        self.prefix = f"{origin}: " if origin else ""

    def fail(self, where: tuple[str, ...], message: str) -> ConfigError:
        loc = pointer(*where)
        return ConfigError(f"{self.prefix}{loc or '/'}: {message}", location=loc)

    def obj(self, value: Any, where: tuple[str, ...]) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(where, f"must be a JSON object, not {_kind(value)}")
        return value

    def unknown_keys(self, value: Mapping[str, Any], where: tuple[str, ...],
                     allowed: tuple[str, ...], *, hint: str = "") -> list[tuple[str, str]]:
        """``(location, message)`` naming every key of ``value`` not in ``allowed``."""
        extra = [key for key in value if key not in allowed]
        if not extra:
            return []
        word = "key" if len(extra) == 1 else "keys"
        loc = pointer(*where)
        named = ", ".join(show_value(k) for k in extra[:_KEYS_SHOWN])
        if len(extra) > _KEYS_SHOWN:
            named += f" and {len(extra) - _KEYS_SHOWN} more"
        return [(loc, f"{loc or '/'}: unknown {word} {named}; "
                      f"allowed here: {', '.join(sorted(allowed))}{hint}")]

    def string(self, value: Any, where: tuple[str, ...], *, empty: bool = False) -> str:
        if not isinstance(value, str):
            raise self.fail(where, f"must be a string, not {_kind(value)}")
        if not empty and not value:
            raise self.fail(where, "must not be empty")
        if "\0" in value:  # no command line, folder, environment or header can carry one
            raise self.fail(where, "must not hold a NUL character (\\u0000)")
        return value

    def seconds(self, value: Any, where: tuple[str, ...]) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(where, f"must be a number of seconds, not {_kind(value)}")
        if not is_finite_number(value) or not 0 < value <= MAX_SECONDS:
            raise self.fail(where, f"must be more than 0 and at most {MAX_SECONDS} seconds "
                                   f"(a year), not {show_value(value)}")
        return float(value)

    def str_map(self, value: Any, where: tuple[str, ...]) -> Mapping[str, str]:
        out: dict[str, str] = {}
        for key, item in self.obj(value, where).items():
            out[key] = self.expand(self.string(item, (*where, key), empty=True), (*where, key))
        return MappingProxyType(out)

    def expand(self, text: str, where: tuple[str, ...]) -> str:
        def sub(m: re.Match[str]) -> str:
            name = m.group("braced") or m.group("bare")
            if name is None:
                return "$"
            found = os.environ.get(name)
            if found is None:
                raise self.fail(
                    where,
                    f"environment variable {name} is not set; set it or write $$ for a literal $",
                )
            return found

        return _VAR_RE.sub(sub, text)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _parse(document: Any, *, base: Path, origin: str | None) -> GatewayConfig:
    p = _Parser(origin)
    top = p.obj(document, ())
    _refuse_unknown_keys(p, top)
    if "mcpServers" not in top:
        raise p.fail((), "missing 'mcpServers': an object naming each upstream MCP server")
    entries = p.obj(top["mcpServers"], ("mcpServers",))
    servers: dict[str, ServerConfig] = {}
    for name, entry in entries.items():
        servers[name] = _server(p, name, entry, base)
    settings = GatewaySettings()
    if "gateway" in top:
        raw = p.obj(top["gateway"], ("gateway",))
        safe = raw.get("safe_mode", False)
        if not isinstance(safe, bool):
            raise p.fail(("gateway", "safe_mode"), f"must be true or false, not {_kind(safe)}")
        wait = p.seconds(raw.get("startup_wait", DEFAULT_STARTUP_WAIT),
                         ("gateway", "startup_wait"))
        settings = GatewaySettings(safe_mode=safe, startup_wait=wait)
    return GatewayConfig(servers=MappingProxyType(servers), gateway=settings, source=origin)


def _refuse_unknown_keys(p: _Parser, top: Mapping[str, Any]) -> None:
    """One error naming every unknown key of the file (BIND-5), before anything else is
    checked, so a config with several typos is fixed in one round."""
    found = p.unknown_keys(top, (), _TOP_KEYS)
    if isinstance(top.get("gateway"), Mapping):
        found += p.unknown_keys(top["gateway"], ("gateway",), _GATEWAY_KEYS)
    entries = top.get("mcpServers")
    for name, raw in (entries.items() if isinstance(entries, Mapping) else ()):
        kind = _kind_guess(raw) if isinstance(raw, Mapping) else None
        if kind is not None:  # else the entry's kind is refused on its own
            own = _STDIO_KEYS if kind == "stdio" else _HTTP_KEYS
            found += p.unknown_keys(
                raw, ("mcpServers", name), _COMMON_KEYS + own,
                hint=" (an entry is either stdio with 'command' or http with 'url')")
    if found:
        said = "; ".join(message for _, message in found[:_PLACES_SHOWN])
        if len(found) > _PLACES_SHOWN:
            said += f"; and unknown keys in {len(found) - _PLACES_SHOWN} more places"
        raise ConfigError(p.prefix + said, location=found[0][0])


_KEYS_SHOWN = 8
"""Unknown keys of one place a config error names (the rest are counted)."""
_PLACES_SHOWN = 5
"""Places with unknown keys a config error names: the line stays readable."""


def _kind_guess(raw: Mapping[str, Any]) -> str | None:
    """The entry's transport as :func:`_kind_of` decides it, or None where it refuses."""
    declared = raw.get("type")
    if declared is not None:
        return _TYPES.get(declared) if isinstance(declared, str) else None
    if ("command" in raw) != ("url" in raw):
        return "stdio" if "command" in raw else "http"
    return None


def _server(p: _Parser, name: str, entry: Any, base: Path) -> ServerConfig:
    where = ("mcpServers", name)
    if not SERVER_NAME_RE.fullmatch(name):
        raise p.fail(
            where,
            f"server name {show_value(name)} is not allowed; use 1 to 40 of A-Z a-z 0-9 _ . - "
            "(it becomes the server part of server/tool names)",
        )
    raw = p.obj(entry, where)
    kind = _kind_of(p, raw, where)

    transport: StdioTransport | HttpTransport
    if kind == "stdio":
        command = p.string(raw.get("command"), (*where, "command"))
        args_raw = raw.get("args", [])
        if not isinstance(args_raw, list):
            raise p.fail((*where, "args"), f"must be an array of strings, not {_kind(args_raw)}")
        args = tuple(
            p.string(a, (*where, "args", str(i)), empty=True) for i, a in enumerate(args_raw)
        )
        env = p.str_map(raw.get("env", {}), (*where, "env"))
        for key in env:
            # Else the server would fail only when started, and not say which key.
            if not key or "=" in key or "\0" in key:
                raise p.fail((*where, "env", key), "is not an environment variable name: "
                                                   "it must be non-empty, without '=' or NUL")
        cwd: str | None = None
        if "cwd" in raw:
            cwd = str(base / p.string(raw["cwd"], (*where, "cwd")))
        transport = StdioTransport(command=command, args=args, env=env, cwd=cwd)
    else:
        url = p.string(raw.get("url"), (*where, "url"))
        if not url.startswith(("http://", "https://")):
            raise p.fail((*where, "url"), f"{show_value(url)} is not an http:// or https:// URL")
        try:
            parts = urlsplit(url)
            host, _ = parts.hostname, parts.port  # the port raises ValueError out of range
        except ValueError as exc:
            raise p.fail((*where, "url"),
                         f"{show_value(url)} is not a usable URL ({exc})") from None
        if not host:
            raise p.fail((*where, "url"), f"{show_value(url)} names no host; write for example "
                                          "http://127.0.0.1:8000/mcp")
        headers = p.str_map(raw.get("headers", {}), (*where, "headers"))
        for key, text in headers.items():
            at = (*where, "headers", key)
            if not _HEADER_NAME_RE.fullmatch(key):
                raise p.fail(at, "is not an HTTP header name: use letters, digits and - _ .")
            if not _HEADER_VALUE_RE.fullmatch(text):
                # Checked here, not when connecting, where the HTTP client's error quotes the
                # value (often a secret from $VAR) to the log and to the worker. Never shown.
                raise p.fail(at, "the value (after $VAR expansion) cannot be sent as an HTTP "
                                 "header: it must be ASCII, without line breaks or spaces at "
                                 "either end; check it and any variable it names")
        transport = HttpTransport(url=url, headers=headers)

    timeout = p.seconds(raw.get("timeout", DEFAULT_TIMEOUT), (*where, "timeout"))
    connect_timeout = p.seconds(
        raw.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT), (*where, "connect_timeout")
    )
    costs: dict[str, float] = {}
    for tool, price in p.obj(raw.get("costs", {}), (*where, "costs")).items():
        at = (*where, "costs", tool)
        if isinstance(price, bool) or not isinstance(price, int | float):
            raise p.fail(at, f"must be a price in USD, not {_kind(price)}")
        if not is_finite_number(price) or not 0 <= price <= MAX_PRICE:
            raise p.fail(at, f"must be from 0 to {MAX_PRICE} USD, not {show_value(price)}")
        costs[tool] = float(price)
    hold_raw = raw.get("hold", [])
    if not isinstance(hold_raw, list):
        raise p.fail((*where, "hold"), f"must be an array of tool names, not {_kind(hold_raw)}")
    hold = frozenset(p.string(t, (*where, "hold", str(i))) for i, t in enumerate(hold_raw))
    limit = raw.get("max_result_bytes", DEFAULT_MAX_RESULT_BYTES)
    if (isinstance(limit, bool) or not isinstance(limit, int)
            or not MIN_RESULT_BYTES <= limit <= INT64_MAX):
        raise p.fail(
            (*where, "max_result_bytes"),
            f"must be a whole number of bytes, at least {MIN_RESULT_BYTES}, "
            f"not {show_value(limit)}",
        )
    return ServerConfig(
        name=name,
        transport=transport,
        timeout=timeout,
        connect_timeout=connect_timeout,
        costs=MappingProxyType(costs),
        hold=hold,
        max_result_bytes=limit,
    )


def _kind_of(p: _Parser, raw: Mapping[str, Any], where: tuple[str, ...]) -> str:
    declared = raw.get("type")
    if declared is not None:
        if not isinstance(declared, str) or declared not in _TYPES:
            raise p.fail(
                (*where, "type"),
                f"unsupported transport {show_value(declared)}; use one of: "
                f"{', '.join(sorted(_TYPES))}",
            )
        kind = _TYPES[declared]
        needed = "command" if kind == "stdio" else "url"
        if needed not in raw:
            raise p.fail(where, f"a {declared} server needs {needed!r}")
        return kind
    if "command" in raw and "url" in raw:
        raise p.fail(where, "has both 'command' and 'url'; a server is either stdio or http")
    if "command" in raw:
        return "stdio"
    if "url" in raw:
        return "http"
    raise p.fail(where, "needs 'command' (a stdio server) or 'url' (a streamable HTTP server)")
