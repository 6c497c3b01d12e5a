"""Shared helpers for the gateway tests: a home with a working order, upstream configs,
gateways in-process and as ``awl gateway`` subprocesses, and the upstreams' own logs.

The upstreams are real subprocess MCP servers: the example outbox server (its
``send_email`` appends to its own outbox file), the commit tests' receiver (it appends
every delivery to its own log), the flaky server, and the published ``mcp-server-time``.
What reached an upstream is read from those files, never from the gateway's records.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp import Client, StdioServerParameters, stdio_client

from awl.desk import Desk, OrderView
from awl.documents.models import CallRecord
from awl.store.protocol import Store
from awl.store.sqlite import SQLiteStore
from gateway._gateway import Gateway
from gateway._serve import open_gateway
from tests.service_support import unavailable

ROOT = Path(__file__).resolve().parents[2]
MANAGER = "human:ana"
WORKER = "agent:clerk"
SERVERS = ROOT / "tests" / "servers"


class Clock:
    """A clock the test moves by hand (starts at the real now, so passes verify)."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC).replace(microsecond=0)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


@dataclass
class Env:
    """A home folder with a desk, one order and the upstream config for it."""

    home: Path
    store: Store
    desk: Desk
    order_id: str
    config: Path
    outbox: Path
    receiver_log: Path

    def outbox_lines(self) -> list[dict[str, Any]]:
        """What the outbox server really sent."""
        if not self.outbox.exists():
            return []
        return [json.loads(x) for x in self.outbox.read_text().splitlines() if x.strip()]

    def deliveries(self) -> list[dict[str, Any]]:
        """What the receiver really got."""
        if not self.receiver_log.exists():
            return []
        return [json.loads(x) for x in self.receiver_log.read_text().splitlines() if x.strip()]

    def calls(self) -> list[CallRecord]:
        """The gateway's call records for the order."""
        return self.store.calls(self.order_id)

    def view(self) -> OrderView:
        """The order as the desk sees it now."""
        return self.desk.get(self.order_id)


def server_entry(name: str, **extra: Any) -> dict[str, Any]:
    """A stdio upstream entry for one of the test servers (``notes``, ``receiver``, ...)."""
    entry: dict[str, Any] = {"command": sys.executable, "args": [str(SERVERS / f"{name}.py")],
                             "env": {"PYTHONPATH": str(ROOT)}}
    env = extra.pop("env", {})
    entry["env"].update(env)
    entry.update(extra)
    return entry


def time_entry() -> dict[str, Any]:
    """The published ``mcp-server-time`` from the venv, as a stdio upstream."""
    found = shutil.which("mcp-server-time", path=str(Path(sys.executable).parent))
    assert found is not None, "mcp-server-time is a dev dependency"
    return {"command": found, "args": ["--local-timezone", "UTC"]}


def make_env(tmp: Path, *, servers: dict[str, dict[str, Any]] | None = None,
             gateway: dict[str, Any] | None = None, state: str = "working",
             clock: Clock | None = None, store: Store | None = None, **order: Any) -> Env:
    """A fresh home with an order in ``state`` (offered, accepted or working), kept in
    ``store`` (default the home's SQLite desk)."""
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    outbox = tmp / "outbox.jsonl"
    log = tmp / "receiver.jsonl"
    store = store if store is not None else SQLiteStore(home / "desk.sqlite3")
    desk = Desk(store, clock=clock)
    now = clock() if clock is not None else datetime.now(UTC)
    fields: dict[str, Any] = {
        "to": WORKER,
        "goal": "Answer the customer and file the follow-up",
        "criteria": [{"id": "c1", "text": "the customer got an answer"}],
        "budget": {"tool_calls": 10, "usd": 1},
        "deadline": (now + timedelta(hours=2)).isoformat().replace("+00:00", "Z"),
        "tools": ["notes/*", "receiver/*", "time/*", "flaky/*"],
        "staged": ["notes/send_email", "receiver/create_issue"],
    }
    fields.update(order)
    view = desk.create(fields, MANAGER)
    if state in ("accepted", "working"):
        desk.accept(view.id, WORKER)
    if state == "working":
        desk.start(view.id, WORKER)
    if servers is None:
        servers = {
            "notes": server_entry("notes", env={"OUTBOX_PATH": str(outbox)}),
            "receiver": server_entry("receiver", env={"RECEIVER_LOG": str(log)}),
        }
    # Tests list tools right after starting, on a busy machine: unless a test says otherwise,
    # tools/list waits for every upstream's start (the default startup_wait is 3 s).
    document: dict[str, Any] = {"mcpServers": servers,
                                "gateway": gateway if gateway is not None else {
                                    "startup_wait": 60}}
    config = tmp / "upstream.json"
    config.write_text(json.dumps(document), encoding="utf-8")
    return Env(home, store, desk, view.id, config, outbox, log)


@asynccontextmanager
async def connect(env: Env, **options: Any) -> AsyncIterator[tuple[Gateway, Client]]:
    """An in-process gateway for the env's order and an SDK client connected to it.

    The upstreams start in the background (GW-17); this waits for their first starts, so a
    test's timings do not include them."""
    with open(os.devnull, "w") as quiet:
        async with open_gateway(env.order_id, env.config, store=env.store, home=env.home,
                                errlog=quiet, **options) as gw, Client(gw.server) as client:
            await gw.pool.wait_started(60)
            yield gw, client


def gateway_params(env: Env, *extra: str, env_extra: dict[str, str] | None = None,
                   host: str | None = None) -> StdioServerParameters:
    """``awl gateway`` for the env's order, as a stdio server command; with ``host``, run in
    a UTS namespace of its own whose host name is ``host`` (see :func:`require_host_names`)."""
    command = [sys.executable, "-m", "awl", "gateway", "--order", env.order_id,
               "--config", str(env.config), "--home", str(env.home), *extra]
    if host is not None:
        command = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host, *command]
    return StdioServerParameters(
        command=command[0],
        args=command[1:],
        env={"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", ""), **(env_extra or {})},
        cwd=str(env.home),
    )


@asynccontextmanager
async def gateway_client(env: Env, *extra: str, env_extra: dict[str, str] | None = None,
                         host: str | None = None) -> AsyncIterator[Client]:
    """An SDK client connected to ``awl gateway`` running as a stdio subprocess (on a host
    name of its own with ``host``).

    The gateway's stderr goes to ``gateway.err`` in the home folder.
    """
    with open(env.home / "gateway.err", "a") as errlog:
        params = gateway_params(env, *extra, env_extra=env_extra, host=host)
        async with Client(stdio_client(params, errlog=errlog)) as client:
            yield client


def require_host_names() -> None:
    """Skip the test (fail it under ``CI=true``) unless processes can be given host names of
    their own (``unshare --uts``, which needs root): the stand-in for gateways on several
    hosts."""
    try:
        done = subprocess.run(["unshare", "--uts", "hostname", "awl-probe"],
                              capture_output=True, timeout=10, check=False)
        why = done.stderr.decode(errors="replace").strip() if done.returncode else ""
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = str(exc)
    if why:
        unavailable(f"cannot give a process a host name of its own ({why}); run as root")


def final(result: types.CallToolResult | types.InputRequiredResult) -> types.CallToolResult:
    """A call's final result (the tools of these tests never ask the worker for input)."""
    assert isinstance(result, types.CallToolResult), result
    return result


def text(result: types.CallToolResult) -> str:
    """The first text block of a result."""
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text
