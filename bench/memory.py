"""Resident memory: a gateway with three upstreams, and the desk server on a large desk.

``python -m bench.memory [--quick] [--orders N]``

Each server is spawned over stdio, used (``tools/list``, then a few calls), and its resident
set read from ``/proc/PID/status`` (the process alone, not its upstreams): ``VmRSS`` now and
``VmHWM``, the peak. The floors measured in the same run: the bare proxy
(:mod:`bench.bare_proxy`, on the MCP SDK alone) in front of the same three upstreams, and a
Python process that has imported the MCP SDK's server and client and nothing else. Targets:
the gateway under 80 MB, the desk server under 100 MB with 100,000 orders (Linux only: it
reads ``/proc``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.desk import build
from bench.gateway import OUTBOX_SERVER, ROOT, _working_order
from bench.startup import INITIALIZE_PARAMS

GATEWAY_TARGET_MB = 80
DESK_TARGET_MB = 100
_SDK_ONLY = ("import mcp.server, mcp.client, mcp.server.stdio, anyio, time, sys; "
             "print('ready', flush=True); sys.stdin.read()")


@dataclass(frozen=True)
class Resident:
    """One process's resident memory (MB)."""

    name: str
    rss_mb: float
    peak_mb: float


def _status_mb(pid: int) -> tuple[float, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return (int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024)


class _Peer:
    """A JSON-RPC peer over a child's stdin and stdout."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, cwd=ROOT,
                                     env={"PYTHONPATH": str(ROOT), **(env or {})})
        self._id = 10

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._id += 1
        self.send({"jsonrpc": "2.0", "id": self._id, "method": method,
                   **({"params": params} if params is not None else {})})
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{method}: the server closed stdout")
            answer: dict[str, Any] = json.loads(line)
            if answer.get("id") == self._id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer

    def start(self) -> None:
        self.request("initialize", INITIALIZE_PARAMS)
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def call(self, tool: str, arguments: dict[str, Any]) -> None:
        result = self.request("tools/call", {"name": tool, "arguments": arguments})["result"]
        if result.get("isError"):
            raise RuntimeError(f"{tool}: {result['content']}")

    def measure(self, name: str) -> Resident:
        rss, peak = _status_mb(self.proc.pid)
        return Resident(name, rss, peak)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def gateways(folder: Path) -> list[Resident]:
    """The gateway and the bare proxy, each in front of three outbox servers."""
    home = folder / "home"
    home.mkdir()
    config = folder / "upstream.json"
    config.write_text(json.dumps({"mcpServers": {
        f"notes{i}": {"command": sys.executable, "args": [str(OUTBOX_SERVER)],
                      "env": {"OUTBOX_PATH": str(folder / f"outbox{i}.jsonl")}}
        for i in (1, 2, 3)}}))
    order_id = _working_order(home, 100, ("notes1/*", "notes2/*", "notes3/*"))
    out = []
    for name, argv in (
            ("bare proxy, 3 upstreams", [sys.executable, "-m", "bench.bare_proxy",
                                          "--config", str(config)]),
            ("gateway, 3 upstreams", [sys.executable, "-m", "awl", "gateway",
                                      "--order", order_id, "--config", str(config),
                                      "--home", str(home)])):
        peer = _Peer(argv)
        try:
            peer.start()
            peer.request("tools/list")
            for _ in range(20):
                for i in (1, 2, 3):
                    peer.call(f"notes{i}__get_note", {"id": "n1"})
            out.append(peer.measure(name))
        finally:
            peer.close()
    return out


def sdk_only() -> Resident:
    """A Python process that imported the MCP SDK and nothing else: the floor."""
    proc = subprocess.Popen([sys.executable, "-c", _SDK_ONLY], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout is not None and proc.stdin is not None
    try:
        proc.stdout.readline()
        rss, peak = _status_mb(proc.pid)
        return Resident("python + the MCP SDK only", rss, peak)
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def desk_server(folder: Path, orders: int) -> Resident:
    """``awl serve`` on a desk of ``orders`` orders, after listing and a track record."""
    home = folder / "desk-home"
    home.mkdir()
    build(home / "desk.sqlite3", orders)
    peer = _Peer([sys.executable, "-m", "awl", "serve", "--as", "human:m0",
                  "--home", str(home)])
    try:
        peer.start()
        peer.request("tools/list")
        for role in ("any", "manager", "answerer"):
            peer.call("list_work_orders", {"role": role, "limit": 200})
        peer.call("get_track_record", {"worker": "agent:busy"})
        time.sleep(0.2)
        return peer.measure(f"desk server, {orders:,} orders")
    finally:
        peer.close()


def report(rows: list[Resident]) -> str:
    """The table, and each server against its target."""
    lines = ["| process | resident MB | peak MB | target MB |", "|---|---:|---:|---:|"]
    for row in rows:
        target = (GATEWAY_TARGET_MB if row.name.startswith("gateway") else
                  DESK_TARGET_MB if row.name.startswith("desk") else None)
        verdict = "" if target is None else (
            f"{target} ({'within' if row.peak_mb <= target else 'OVER'}"
            f"{'' if row.peak_mb <= target else f' by {row.peak_mb - target:.0f}'})")
        lines.append(f"| {row.name} | {row.rss_mb:.0f} | {row.peak_mb:.0f} | {verdict} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smaller desk, for a smoke run")
    parser.add_argument("--orders", type=int, help="orders on the desk (default 100,000)")
    args = parser.parse_args(argv)
    orders = args.orders or (5_000 if args.quick else 100_000)
    if not Path("/proc/self/status").exists():
        print("skipped: resident memory is read from /proc (Linux only)")
        return 0
    with tempfile.TemporaryDirectory(prefix="awl-bench-") as tmp:
        folder = Path(tmp)
        rows = [sdk_only(), *gateways(folder), desk_server(folder, orders)]
    print(report(rows), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
