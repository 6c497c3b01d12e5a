"""The official MCP conformance suite against the desk and the gateway, both eras (DOC-18).

Each target runs as the real command (``awl serve --http``, ``awl gateway --http`` in front
of the fixture ``tests/servers/everything.py``), reached through the Bearer relay. The suite
runs with ``--requirements REVISION`` and an expected-failures file made from SPEC.md's
exclusion table, so it exits 0 only when every required scenario passes except exactly
those SPEC excludes: a scenario that fails and is not excluded fails the test, and so does
an excluded one that passes (the exclusion is stale).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from awl.passes import KeyStore, issue_recorded_pass
from tests.bearer_relay import bearer_relay
from tests.gateway.gateway_support import ROOT, WORKER, make_env, server_entry
from tests.node_support import conformance

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

REVISIONS = ("2025-11-25", "2026-07-28")
_ROW = re.compile(r"^\| (desk|gateway) \| (both|2025-11-25|2026-07-28) \| ([^|]+) \| [^|]+ \|$")


def exclusions(target: str, revision: str) -> list[str]:
    """The scenarios (or ``scenario:check``) SPEC.md's DOC-18 table excludes."""
    text = (ROOT / "SPEC.md").read_text(encoding="utf-8")
    section = text.split("### 18.1 The official MCP conformance suite", 1)[1]
    names: list[str] = []
    for line in section.splitlines():
        m = _ROW.match(line.strip())
        if m and m.group(1) == target and m.group(2) in ("both", revision):
            names.extend(n.strip() for n in m.group(3).split(",") if n.strip())
    return names


@asynccontextmanager
async def serving(command: list[str], home: Path, pattern: str) -> AsyncIterator[str]:
    """Run an ``awl`` command that serves HTTP; yields the URL it prints on stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AWL_HOME": str(home)}
    async with await anyio.open_process(command, env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE) as proc:
        assert proc.stderr is not None
        seen = b""
        with anyio.fail_after(30):
            while (m := re.search(pattern.encode(), seen)) is None:
                chunk = await proc.stderr.receive()
                seen += chunk
        errors = home / "serve.err"

        async def drain() -> None:
            # Keep reading, or the server blocks once the pipe is full.
            with errors.open("ab") as out:
                out.write(seen)
                async for chunk in proc.stderr:  # type: ignore[union-attr]
                    out.write(chunk)

        async with anyio.create_task_group() as tg:
            tg.start_soon(drain)
            try:
                yield m.group(1).decode()
            finally:
                proc.terminate()
                tg.cancel_scope.cancel()


async def run_suite(url: str, target: str, revision: str, tmp: Path) -> tuple[int, str]:
    baseline = tmp / f"expected-{target}-{revision}.yaml"
    baseline.write_text("server:\n" + "".join(
        f"  - {name}\n" for name in exclusions(target, revision)), encoding="utf-8")
    done = await anyio.run_process(
        [*conformance(), "server", "--url", url,
         "--requirements", revision, "--expected-failures", str(baseline),
         "-o", str(tmp / f"results-{target}-{revision}")],
        check=False, cwd=tmp)
    out = done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
    return done.returncode, out[-6000:]


@pytest.mark.spec("DOC-18")
@pytest.mark.parametrize("revision", REVISIONS)
async def test_the_desk_passes_the_suite(tmp_path: Path, revision: str) -> None:
    conformance()
    home = tmp_path / "home"
    home.mkdir()
    token = subprocess.run([sys.executable, "-m", "awl", "token", "issue", "human:ana",
                            "--home", str(home)], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split()[-1]
    with anyio.fail_after(150):
        async with serving([sys.executable, "-m", "awl", "serve", "--http", "127.0.0.1:0",
                            "--home", str(home)], home, r"on (http://\S+/mcp)") as url, \
                bearer_relay(url, token) as relayed:
            code, out = await run_suite(relayed, "desk", revision, tmp_path)
    assert code == 0, out


@pytest.mark.spec("DOC-18", "GW-16")
@pytest.mark.parametrize("revision", REVISIONS)
async def test_the_gateway_passes_the_suite(tmp_path: Path, revision: str) -> None:
    conformance()
    env = make_env(tmp_path, servers={"everything": server_entry("everything")},
                   tools=["everything/*"], staged=[])
    token = issue_recorded_pass(env.store, env.order_id, keys=KeyStore(env.home), subject=WORKER)
    command = [sys.executable, "-m", "awl", "gateway", "--order", env.order_id, "--config",
               str(env.config), "--home", str(env.home), "--http", "127.0.0.1:0"]
    with anyio.fail_after(150):
        async with serving(command, env.home, r"on (http://\S+/mcp)") as url, \
                bearer_relay(url, token) as relayed:
            code, out = await run_suite(relayed, "gateway", revision, tmp_path)
    assert code == 0, out
