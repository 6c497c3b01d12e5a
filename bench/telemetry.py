"""What tracing costs a gateway call: tracing off, and on with no collector to send to.

``python -m bench.telemetry [--quick] [--calls N] [--callers C] [--per-caller K]``

Three ``awl gateway`` processes, each for its own working order in its own SQLite home, in
front of the example outbox server, are measured side by side as :mod:`bench.gateway`
measures its targets (sequential latency taking turns, then bursts of concurrent callers):

- **tracing off**: no ``OTEL_*`` variable set, the default;
- **tracing on, no collector**: ``OTEL_EXPORTER_OTLP_ENDPOINT`` names a loopback port
  nothing listens on, so traces and metrics are on (SPEC OBS-1), every call gets its span
  and measurements, and every export fails in the background;
- **tracing off (control)**: a second gateway like the first: the run's noise.

The ratios compare each with the first (higher is slower). The tracing-on gateway's stderr
(where the exporters say each export failed) is kept aside and counted, not printed. It also
times, in this process, what the telemetry hooks cost a call when telemetry is off (the
no-op path every gateway without the ``OTEL_*`` settings runs), next to a tracing-off
call's median.
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import StdioServerParameters

from bench.gateway import ROOT, Figures, Ratios, _working_order, measure, outbox_config

OFF = "tracing off"
ON = "tracing on, no collector"
CONTROL = "tracing off (control)"


def _closed_port() -> int:
    """A loopback port nothing listens on (it was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def run(calls: int, callers: int, per_caller: int) -> tuple[list[Figures], int]:
    """Measure the three gateways in a fresh temporary folder; also answer how many
    failed exports the tracing-on gateway logged."""
    with tempfile.TemporaryDirectory(prefix="awl-bench-otel-") as tmp:
        folder = Path(tmp)
        config = outbox_config(folder)
        endpoint = f"http://127.0.0.1:{_closed_port()}"
        targets: list[tuple[str, StdioServerParameters, str]] = []
        for name, otel in ((OFF, {}), (ON, {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}),
                           (CONTROL, {})):
            home = folder / name.replace(" ", "-").replace(",", "")
            home.mkdir()
            order_id = _working_order(home, calls + callers * per_caller)
            targets.append((name, StdioServerParameters(
                command=sys.executable,
                args=["-m", "awl", "gateway", "--order", order_id, "--config", str(config),
                      "--home", str(home)],
                env={"PYTHONPATH": str(ROOT), **otel}, cwd=ROOT), "notes__get_note"))
        errors = folder / "tracing-on.err"
        with anyio.fail_after(300), errors.open("w") as errlog:
            figures = await measure(targets, calls=calls, callers=callers,
                                    per_caller=per_caller, errlogs={ON: errlog})
        failed = sum(1 for line in errors.read_text().splitlines()
                     if "Failed to export" in line or "Transient error" in line)
        return figures, failed


def noop_cost(rounds: int = 200_000) -> float:
    """Microseconds the telemetry hooks of one call and one effect cost when telemetry is
    off (the no-op :class:`~gateway._telemetry.Telemetry`)."""
    from gateway._telemetry import NOOP

    start = time.perf_counter()
    for _ in range(rounds):
        with NOOP.tool_call("notes__get_note", "wo_x", None, served=True) as span:
            span.done(tool="notes/get_note", ref="notes/get_note#1", attempt=1, outcome="ok",
                      code=None)
    return (time.perf_counter() - start) / rounds * 1e6


def report(figures: list[Figures], *, callers: int, failed_exports: int | None = None,
           noop_us: float | None = None) -> str:
    """The table, with tracing on and the control compared with tracing off."""
    lines = [
        f"| gateway | median ms | p99 ms | calls/s ({callers} callers) |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {f.name} | {f.median_ms:.2f} | {f.p99_ms:.2f} | {f.calls_per_s:.0f} |"
              for f in figures]
    on, control = Ratios.of(figures, ON, base=OFF), Ratios.of(figures, CONTROL, base=OFF)
    if on is not None or control is not None:
        lines.append("")
    if on is not None:
        lines.append(on.line(f"{ON} / {OFF}", verdict=False))
    if control is not None:
        lines.append(control.line(f"control / {OFF} (two identical gateways: this run's "
                                  "noise)", verdict=False))
    if failed_exports is not None:
        lines.append(f"with tracing on and no collector, the gateway logged {failed_exports} "
                     "failed export attempts")
    off = next((f for f in figures if f.name == OFF), None)
    if noop_us is not None and off is not None:
        lines.append(f"telemetry off, its hooks cost {noop_us:.2f} µs per call "
                     f"({noop_us / (off.median_ms * 10):.3f}% of the tracing-off median)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(prog="python -m bench.telemetry", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer calls, for a smoke run")
    parser.add_argument("--calls", type=int, help="sequential calls per gateway (default 400)")
    parser.add_argument("--callers", type=int, default=16, help="concurrent callers (16)")
    parser.add_argument("--per-caller", type=int, help="calls per concurrent caller (40)")
    args = parser.parse_args(argv)
    calls = args.calls or (60 if args.quick else 400)
    per_caller = args.per_caller or (5 if args.quick else 40)
    figures, failed = anyio.run(run, calls, args.callers, per_caller)
    print(report(figures, callers=args.callers, failed_exports=failed,
                 noop_us=noop_cost(20_000 if args.quick else 200_000)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
