"""The gateway benchmark's arithmetic: ratios per run and the median over repeated runs."""

from __future__ import annotations

from bench.gateway import CONTROL, Figures, Ratios, report, summary


def _run(bare_ms: float, gateway_ms: float, bare_rate: float, gateway_rate: float) -> list[Figures]:
    return [Figures("direct", 1.0, 2.0, 900.0),
            Figures("bare proxy", bare_ms, 2 * bare_ms, bare_rate),
            Figures("gateway", gateway_ms, 2 * gateway_ms, gateway_rate)]


def test_ratios_compare_the_gateway_with_the_bare_proxy() -> None:
    ratios = Ratios.of(_run(8.0, 10.0, 300.0, 200.0))
    assert ratios == Ratios(1.25, 1.25, 1.5)
    assert "OVER the 1.25x target" in report(_run(8.0, 10.0, 300.0, 200.0), callers=16)
    assert "within the 1.25x target" in report(_run(8.0, 9.0, 300.0, 290.0), callers=16)
    assert Ratios.of(_run(8.0, 9.0, 300.0, 290.0)[:2]) is None


def test_summary_takes_the_median_of_the_runs_and_lists_each() -> None:
    runs = [Ratios(1.1, 1.0, 1.3), Ratios(1.2, 1.1, 1.1), Ratios(1.15, 1.2, 1.2)]
    text = summary(runs)
    assert text.splitlines()[0] == (
        "median of 3 runs, gateway / bare proxy: median 1.15x, p99 1.10x, "
        "time per call under load 1.20x (within the 1.25x target)")
    assert text.splitlines()[1] == (
        "under load, run by run: 1.30x, 1.10x, 1.20x (1 of 3 over the target)")


def test_the_control_is_compared_with_the_bare_proxy_without_a_verdict() -> None:
    figures = [*_run(8.0, 9.0, 300.0, 290.0), Figures(CONTROL, 8.8, 17.6, 250.0)]
    control = Ratios.of(figures, CONTROL)
    assert control is not None
    assert round(control.median, 6) == 1.1 and round(control.under_load, 6) == 1.2
    lines = report(figures, callers=16).splitlines()
    assert lines[-2].startswith("gateway / bare proxy: median 1.12x")
    assert lines[-1] == ("control / bare proxy (two identical proxies: this run's noise): "
                         "median 1.10x, p99 1.10x, time per call under load 1.20x")


def test_summary_adds_the_control_run_by_run() -> None:
    runs = [Ratios(1.1, 1.0, 1.3), Ratios(1.2, 1.1, 1.1), Ratios(1.15, 1.2, 1.2)]
    controls = [Ratios(1.0, 1.0, 0.9), Ratios(1.02, 1.0, 1.1), Ratios(0.98, 1.0, 1.05)]
    lines = summary(runs, controls).splitlines()
    assert lines[2] == ("median of 3 runs, control / bare proxy: median 1.00x, p99 1.00x, "
                        "time per call under load 1.05x")
    assert lines[3] == "control under load, run by run: 0.90x, 1.10x, 1.05x"
    assert len(summary(runs).splitlines()) == 2


def test_the_telemetry_bench_compares_tracing_on_and_the_control_with_tracing_off() -> None:
    from bench.telemetry import CONTROL, OFF, ON
    from bench.telemetry import report as telemetry_report

    figures = [Figures(OFF, 8.0, 16.0, 300.0), Figures(ON, 8.8, 20.0, 250.0),
               Figures(CONTROL, 8.0, 16.0, 300.0)]
    lines = telemetry_report(figures, callers=16, failed_exports=4, noop_us=0.8).splitlines()
    assert lines[-1] == ("telemetry off, its hooks cost 0.80 µs per call (0.010% of the "
                         "tracing-off median)")
    lines.pop()
    assert lines[-3] == ("tracing on, no collector / tracing off: median 1.10x, p99 1.25x, "
                         "time per call under load 1.20x")
    assert lines[-2].startswith("control / tracing off (two identical gateways: this run's "
                                "noise): median 1.00x")
    assert lines[-1] == ("with tracing on and no collector, the gateway logged 4 failed "
                         "export attempts")
