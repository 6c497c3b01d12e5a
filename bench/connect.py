"""What ``awl connect`` adds: a call through the bridge against the same call over HTTP.

``python -m bench.connect [--quick] [--calls N] [--runs N]``

One ``awl gateway --http`` serves a working order in front of the example outbox server.
The MCP SDK's client makes ``--calls`` sequential ``notes__get_note`` calls twice per run,
taking turns: once over streamable HTTP with the pass as its Bearer token (what a client
that speaks HTTP itself does), once over stdio to ``awl connect`` (what a stdio-only client
does). The table gives each one's median and p99 per call and the ratio of the medians;
the start line is the bridge's own start: from spawning ``awl connect`` to the answer of
``tools/list`` (``initialize`` and ``tools/list`` written at once), median of the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx2
from mcp import Client, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from bench.gateway import ROOT, _working_order, outbox_config

_LINES = (json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {},
    "clientInfo": {"name": "bench", "version": "1"}}}) + "\n"
          + json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n"
          + json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}) + "\n").encode()


def _serve(folder: Path, calls: int) -> tuple[subprocess.Popen[bytes], str, Path]:
    """The gateway over HTTP for a fresh order; its process, URL and the pass file."""
    from awl.passes import KeyStore, issue_recorded_pass
    from awl.store.sqlite import SQLiteStore

    home = folder / "home"
    home.mkdir()
    order = _working_order(home, calls)
    config = outbox_config(folder, gateway={"startup_wait": 60})
    store = SQLiteStore(home / "desk.sqlite3")
    try:
        token = issue_recorded_pass(store, order, keys=KeyStore(home), subject="agent:bench")
    finally:
        store.close()
    pass_file = folder / "worker.pass"
    pass_file.write_text(token)
    process = subprocess.Popen(
        [sys.executable, "-m", "awl", "gateway", "--order", order, "--config", str(config),
         "--home", str(home), "--http", "127.0.0.1:0"], stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert process.stderr is not None
    said = b""
    while b" on http" not in said:
        line = process.stderr.readline()
        assert line, said.decode(errors="replace")
        said += line
    return process, said.decode().rsplit(" on ", 1)[1].strip(), pass_file


async def _calls(client: Client, calls: int) -> list[float]:
    await client.list_tools()
    times = []
    for _ in range(calls):
        began = time.perf_counter()
        result = await client.call_tool("notes__get_note", {"id": "n1"})
        times.append(time.perf_counter() - began)
        assert not result.is_error, result
    return times


async def _direct(url: str, token: str, calls: int) -> list[float]:
    async with (httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                   timeout=httpx2.Timeout(30, read=None)) as http,
                Client(streamable_http_client(url, http_client=http)) as client):
        return await _calls(client, calls)


async def _bridged(url: str, pass_file: Path, calls: int) -> list[float]:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "awl", "connect", url, "--pass-file",
                                      str(pass_file)],
        env={"PYTHONPATH": str(ROOT), "PATH": os.environ["PATH"]})
    async with Client(stdio_client(params)) as client:
        return await _calls(client, calls)


def _start(url: str, pass_file: Path) -> float:
    """Seconds from spawning the bridge to its ``tools/list`` answer."""
    began = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "awl", "connect", url, "--pass-file", str(pass_file)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**os.environ,
                                                              "PYTHONPATH": str(ROOT)})
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(_LINES)
    process.stdin.flush()
    while b'"id":2' not in process.stdout.readline().replace(b" ", b""):
        pass
    took = time.perf_counter() - began
    process.stdin.close()
    process.wait(30)
    process.stdout.close()
    return took


def _ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.connect", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="30 calls, one run")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    if args.quick:
        args.calls, args.runs = 30, 1
    with tempfile.TemporaryDirectory() as tmp:
        process, url, pass_file = _serve(Path(tmp), args.calls * 2 * args.runs + 10)
        try:
            token = pass_file.read_text()
            direct: list[float] = []
            bridged: list[float] = []
            starts: list[float] = []
            for _ in range(args.runs):
                direct += anyio.run(_direct, url, token, args.calls)
                bridged += anyio.run(_bridged, url, pass_file, args.calls)
                starts.append(_start(url, pass_file))
        finally:
            process.terminate()
            process.wait(10)
            assert process.stderr is not None
            process.stderr.close()
    print(f"awl connect: {args.runs} runs of {args.calls} sequential calls each")
    print(f"{'client':<28}{'median ms':>10}{'p99 ms':>10}")
    for name, times in (("HTTP, pass as Bearer", direct), ("stdio through awl connect", bridged)):
        print(f"{name:<28}{_ms(times, 0.5):>10.2f}{_ms(times, 0.99):>10.2f}")
    ratio = statistics.median(bridged) / statistics.median(direct)
    print(f"ratio (bridge / HTTP, median): {ratio:.2f}x")
    print(f"bridge start to tools/list answered: {1000 * statistics.median(starts):.0f} ms "
          "(median)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
