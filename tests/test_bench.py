"""The benchmarks' arithmetic: ratios per run, the median over repeated runs, and the
``--store`` option that puts SQLite and PostgreSQL side by side."""

from __future__ import annotations

import argparse
import os
from contextlib import closing
from pathlib import Path

import pytest

from bench.gateway import CONTROL, Figures, Ratios, report, summary
from bench.stores import Stores, add_options


def _run(bare_ms: float, gateway_ms: float, bare_rate: float, gateway_rate: float) -> list[Figures]:
    return [Figures("direct", 1.0, 2.0, 900.0),
            Figures("bare proxy", bare_ms, 2 * bare_ms, bare_rate),
            Figures("gateway", gateway_ms, 2 * gateway_ms, gateway_rate)]


def test_ratios_compare_the_gateway_with_the_bare_proxy() -> None:
    ratios = Ratios.of(_run(8.0, 10.0, 300.0, 200.0))
    assert ratios == Ratios(1.25, 1.25, 1.5)
    targets = "the targets: 1.10x, p99 1.25x"
    assert f"OVER {targets}" in report(_run(8.0, 10.0, 300.0, 200.0), callers=16)
    assert f"within {targets}" in report(_run(8.0, 8.4, 300.0, 290.0), callers=16)
    assert Ratios.of(_run(8.0, 9.0, 300.0, 290.0)[:2]) is None


def test_the_cpu_per_call_is_compared_and_counts_in_the_verdict() -> None:
    """CPU per call of each target's process is a ratio like the others, held to 1.10x."""
    bare = Figures("bare proxy", 8.0, 16.0, 300.0, cpu_ms=1.0)
    lean, heavy = (Figures("gateway", 8.4, 16.8, 290.0, cpu_ms=cpu) for cpu in (1.05, 1.3))
    ratios = Ratios.of([bare, lean])
    assert ratios is not None and ratios.cpu is not None and round(ratios.cpu, 6) == 1.05
    assert ratios.within
    assert not Ratios(1.05, 1.3, 1.05, 1.05).within  # the p99 has its own target
    heavy_ratios = Ratios.of([bare, heavy])
    assert heavy_ratios is not None and not heavy_ratios.within
    assert "CPU per call 1.30x (OVER" in report([bare, heavy], callers=16)
    assert "| gateway | 8.40 | 16.80 | 290 | 1.300 |" in report([bare, heavy], callers=16)
    assert "| 300 | n/a |" in report(_run(8.0, 8.4, 300.0, 290.0), callers=16)


def test_the_postgres_gateways_round_trips_are_a_column_of_their_own() -> None:
    """Only a run that counted round trips has the column; the rows not counted show -."""
    from bench.round_trips import Counted

    counted = Figures("gateway (postgres)", 9.0, 18.0, 250.0, 1.5,
                      round_trips=Counted(2.0, 1.3125, 16, 100, 4))
    text = report([*_run(8.0, 8.4, 300.0, 290.0), counted], callers=16)
    assert "| CPU ms per call | round trips per call |" in text
    assert "| gateway (postgres) | 9.00 | 18.00 | 250 | 1.500 | 2.00 seq / 1.31 at 16 |" in text
    assert "| gateway | 8.40 | 16.80 | 290 | n/a | - |" in text
    assert "round trips" not in report(_run(8.0, 8.4, 300.0, 290.0), callers=16)


def test_summary_takes_the_median_of_the_runs_and_lists_each() -> None:
    runs = [Ratios(1.1, 1.0, 1.3), Ratios(1.2, 1.1, 1.1), Ratios(1.15, 1.2, 1.2)]
    text = summary(runs)
    assert text.splitlines()[0] == (
        "median of 3 runs, gateway / bare proxy: median 1.15x, p99 1.10x, "
        "time per call under load 1.20x (OVER the targets: 1.10x, p99 1.25x)")
    assert text.splitlines()[1] == (
        "under load, run by run: 1.30x, 1.10x, 1.20x (3 of 3 over the targets)")


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


def test_the_webhook_bench_compares_a_dead_receiver_with_none() -> None:
    """Dead receiver over no webhook: latency ratios, and calls/s the other way round."""
    from bench.notify import CONTROL, DEAD, NONE, Ratio
    from bench.notify import report as notify_report

    figures = [Figures(NONE, 2.0, 4.0, 400.0), Figures(DEAD, 2.2, 4.0, 320.0)]
    ratio = Ratio.of(figures)
    assert ratio is not None
    assert (round(ratio.median, 6), ratio.p99, ratio.under_load) == (1.1, 1.0, 1.25)
    assert Ratio.of(figures, CONTROL) is None
    lines = notify_report([*figures, Figures(CONTROL, 2.0, 2.0, 500.0)], callers=16,
                          note="n").splitlines()
    assert lines[-3:] == [
        "dead receiver / no webhook: median 1.10x, p99 1.00x, time per call under load 1.25x",
        "control / no webhook (two identical desks: this run's noise): median 1.00x, "
        "p99 0.50x, time per call under load 0.80x", "n"]


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


def test_the_startup_ratio_compares_the_gateway_with_the_bare_proxy_to_tools_list() -> None:
    from bench.startup import Timings, report, report_imports

    bare = Timings("bare proxy", [1.0, 1.2, 1.1], [1.1, 1.3, 1.2], [0.3, 0.4, 0.5])
    gateway = Timings("gateway", [1.0, 1.0, 1.0], [1.5, 1.6, 1.4], [0.2, 0.2, 0.2], 1, 2)
    lines = report([bare, gateway]).splitlines()
    assert lines[2] == "| bare proxy | 1100 | 1200 | 400 | 0 | 0 |"
    assert lines[3] == "| gateway | 1000 | 1500 | 200 | 1 | 2 |"
    assert lines[-1] == ("spawn to tools/list, gateway / bare proxy: 1.25x (within the 1.3x "
                         "target; medians of 3 spawns each)")
    gateway.tools_list[:] = [1.6, 1.6, 1.6]
    assert "1.33x (OVER the 1.3x target" in report([bare, gateway])
    assert report_imports({"MCP SDK only": (0.5, 500), "awl gateway": (0.6, 650)}) == (
        "imports: MCP SDK only 500 ms (500 modules), awl gateway 600 ms (650 modules): 1.20x")


def test_memory_is_judged_by_the_peak_against_each_target() -> None:
    from bench.memory import Resident, report

    lines = report([Resident("python + the MCP SDK only", 60.0, 61.0),
                    Resident("gateway, 3 upstreams", 70.2, 79.6),
                    Resident("desk server, 100,000 orders", 150.0, 180.4)]).splitlines()
    assert lines[2] == "| python + the MCP SDK only | 60 | 61 |  |"
    assert lines[3] == "| gateway, 3 upstreams | 70 | 80 | 80 (within) |"
    assert lines[4] == "| desk server, 100,000 orders | 150 | 180 | 100 (OVER by 80) |"


# --------------------------------------------------------------------------- --store

def test_store_names_are_read_in_order_each_once() -> None:
    from bench.stores import parse_stores

    assert parse_stores("sqlite") == ["sqlite"]
    assert parse_stores("postgres, SQLite,postgresql") == ["postgres", "sqlite"]
    with pytest.raises(ValueError, match="unknown store 'mysql': give sqlite or postgres"):
        parse_stores("sqlite,mysql")
    with pytest.raises(ValueError, match="names no store"):
        parse_stores(" , ")


def _parsed(argv: list[str], env: dict[str, str]) -> Stores:
    parser = argparse.ArgumentParser()
    add_options(parser)
    return Stores.of(parser, parser.parse_args(argv), env)


def test_postgres_takes_its_server_from_the_option_else_the_environment(
        capsys: pytest.CaptureFixture[str]) -> None:
    env = {"AWL_TEST_POSTGRES": "postgresql://a@h/db"}
    assert _parsed([], {}) == Stores(("sqlite",), None)
    assert _parsed(["--store", "sqlite,postgres"], env) == Stores(("sqlite", "postgres"),
                                                                  "postgresql://a@h/db")
    assert _parsed(["--store", "postgres", "--postgres-url", "postgresql://b@h/db"],
                   env).server == "postgresql://b@h/db"
    with pytest.raises(SystemExit):
        _parsed(["--store", "postgres"], {})
    assert "--store postgres needs a server: give --postgres-url URL or set " \
           "AWL_TEST_POSTGRES" in capsys.readouterr().err.splitlines()[-1]


def test_a_schema_goes_on_the_search_path_after_the_urls_own_query() -> None:
    from bench.stores import in_schema

    assert in_schema("postgresql://u:p@h:5/db", "s1") == (
        "postgresql://u:p@h:5/db?options=-csearch_path%3Ds1")
    assert in_schema("postgresql://u@h/db?sslmode=require", "s1") == (
        "postgresql://u@h/db?sslmode=require&options=-csearch_path%3Ds1")


def test_the_runner_passes_the_stores_to_the_benchmarks_that_use_one() -> None:
    from bench.run import arguments

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=1)
    add_options(parser)
    args = parser.parse_args(["--quick", "--store", "sqlite,postgres",
                              "--postgres-url", "postgresql://u@h/db"])
    store = ["--store", "sqlite,postgres", "--postgres-url", "postgresql://u@h/db"]
    assert arguments("desk", args) == ["--quick", *store]
    assert arguments("gateway", args) == ["--quick", *store]
    assert arguments("commit", args) == ["--quick", *store]
    assert arguments("validation", args) == ["--quick"]
    assert arguments("telemetry", args) == ["--quick"]
    args.repeat = 3
    assert arguments("gateway", args) == ["--quick", *store, "--repeat", "3"]
    assert arguments("scale", args) == ["--quick", *store, "--repeat", "3"]
    assert arguments("desk", args) == ["--quick", *store]


def test_each_stores_gateway_is_rated_against_the_same_bare_proxy() -> None:
    from bench.gateway import gateway_name, gateways

    assert gateway_name("sqlite", ("sqlite",)) == "gateway"
    assert gateway_name("sqlite", ("sqlite", "postgres")) == "gateway (sqlite)"
    figures = [Figures("direct", 1.0, 2.0, 900.0), Figures("bare proxy", 8.0, 16.0, 300.0),
               Figures("gateway (sqlite)", 8.6, 17.2, 290.0),
               Figures("gateway (postgres)", 16.0, 24.0, 150.0)]
    assert gateways(figures) == ["gateway (sqlite)", "gateway (postgres)"]
    lines = report(figures, callers=16).splitlines()
    assert lines[-2] == ("gateway (sqlite) / bare proxy: median 1.07x, p99 1.07x, time per "
                         "call under load 1.03x (within the targets: 1.10x, p99 1.25x)")
    assert lines[-1] == ("gateway (postgres) / bare proxy: median 2.00x, p99 1.50x, time per "
                         "call under load 2.00x (OVER the targets: 1.10x, p99 1.25x)")
    assert summary([Ratios(2.0, 1.5, 2.0)], what="gateway (postgres)").startswith(
        "median of 1 runs, gateway (postgres) / bare proxy: median 2.00x")


def test_each_stores_commit_is_rated_against_the_same_direct_calls() -> None:
    from bench.commit import Figures as Side
    from bench.commit import commit_name
    from bench.commit import report as commit_report

    assert commit_name("sqlite", ("sqlite",)) == "commit"
    assert commit_name("postgres", ("sqlite", "postgres")) == "commit (postgres)"
    sides = [Side("direct", 100, 1.0, 10.0, 20.0), Side("commit (sqlite)", 100, 1.5, 12.0, 30.0),
             Side("commit (sqlite) again (sends nothing)", 0, 0.1, 1.0, 0.0),
             Side("commit (postgres)", 100, 3.0, 9.5, 60.0),
             Side("commit (postgres) again (sends nothing)", 0, 0.2, 2.0, 0.0)]
    assert commit_report(sides).splitlines()[-2:] == [
        "commit (sqlite) / direct: median 1.20x, total 1.50x (+2.00 ms per effect for the "
        "write-ahead mark and the recorded outcome)",
        "commit (postgres) / direct: median 0.95x, total 3.00x (-0.50 ms per effect for the "
        "write-ahead mark and the recorded outcome)"]


def test_the_desk_table_puts_the_stores_side_by_side_against_the_memory_floor() -> None:
    from bench.desk import STEPS, Column, over_target, table

    steps = dict.fromkeys(STEPS, 1.0)
    reads = [("track record, busiest worker (20 orders)", 25.0), ("list newest 50", 3.0),
             ("get one order", 40.0)]
    columns = {"sqlite": Column(50.0, steps, 1.0, reads),
               "postgres": Column(20.0, steps, 2.0, [(n, ms / 10) for n, ms in reads])}
    text = table(columns, (100.0, dict.fromkeys(STEPS, 0.5)), count=10, orders=1000)
    lines = text.splitlines()
    assert lines[0] == "memory store (the floor): 100.0 cycles/s"
    ratios = next(line for line in lines if "/ memory store (the floor)" in line).split()
    assert ratios[-2:] == ["2.00x", "5.00x"]
    assert lines[-2] == ("sqlite: list pages, track records and question queue pages "
                         "OVER the 20 ms target: track record, busiest worker (20 orders)")
    assert lines[-1] == ("postgres: list pages, track records and question queue pages "
                         "within the 20 ms target")
    row = next(line for line in lines if line.strip().startswith("track record, busiest"))
    assert "25.00 ms 1.25x" in row  # each read also against the 20 ms target
    assert over_target([*reads, ("question queue of one manager, first page", 21.0),
                        ("question queue, the page after 45 questions", 19.0),
                        ("question queue, first page of every blocked order", 99.0)]) == [
        "track record, busiest worker (20 orders)",
        "question queue of one manager, first page",
        "question queue, first page of every blocked order"]


def test_the_bulk_rows_spread_the_orders_as_the_desk_wrote_them() -> None:
    from bench.desk import MIX, bulk_rows

    batches = list(bulk_rows(100, batch=50))
    assert len(batches) > 1
    orders = [row for rows in batches for row in rows["orders"]]
    events = [row for rows in batches for row in rows["events"]]
    assert len(orders) == 100 and len({row[0] for row in orders}) == 100
    assert sum(1 for row in orders if row[4] == "agent:busy") == 20
    assert sum(row[3] for row in orders) == len(events)  # each order's seq is its events
    approved = sum(share for kind, share in MIX if kind in ("approved", "reworked"))
    assert sum(1 for row in orders if row[2] == "approved") == 100 * approved // 20


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_a_bulk_filled_desk_reads_like_one_the_desk_wrote(
        store: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    from awl import Desk, open_store
    from awl.desk.track import summarize
    from bench.desk import build, queue_place

    url = str(tmp_path / "large.sqlite3") if store == "sqlite" else request.getfixturevalue(
        "pg_url")
    build(url, 100, store)
    with closing(open_store(url)) as opened:
        desk = Desk(opened)
        assert desk.track("agent:busy").orders == 20
        assert [v.id for v in desk.list(limit=2)] == ["wo_bench0000099", "wo_bench0000098"]
        assert len(desk.list(state="approved", limit=None)) == 65  # 13 in 20 end approved
        assert desk.get("wo_bench0000007").order.to == "agent:w07"
        # The tallies and the question queue are filled as a migration fills them.
        assert desk.track("agent:busy") == summarize("agent:busy",
                                                     opened.track_rows("agent:busy"))
        assert desk.track("agent:busy", viewer="human:m0").orders == 4
        assert len(desk.questions().questions) == 5
        assert [len(desk.questions(f"human:m{i}").questions) for i in range(5)] == [1] * 5
        first = desk.questions(limit=2)
        assert [q.blocking for q in first.questions] == [1, 1]  # keyed as a migration keys
        assert queue_place(desk, None, None) == (5, None)
        assert queue_place(desk, None, 2, size=2) == (2, first.next)


def test_another_checkout_is_measured_in_the_same_run(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``--against DIR``: the other checkout's gateways join the run under their own names,
    their order made by that checkout's own code; a folder that is no checkout is refused
    in one line before anything starts."""
    from bench.gateway import (
        ROOT,
        against_names,
        against_targets,
        check_checkout,
        gateways,
        main,
    )

    assert check_checkout(ROOT) is None
    with pytest.raises(SystemExit) as stopped:
        main(["--against", str(tmp_path)])
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"python -m bench.gateway: error: --against: {tmp_path} is not a "
                            "checkout of awl-gateway")
    assert "git worktree add" in error
    config = tmp_path / "upstream.json"
    config.write_text('{"mcpServers": {}}')
    made = against_targets(ROOT, tmp_path, config, 10)
    assert [name for name, _, _ in made] == list(against_names(ROOT))
    sqlite, memory = (params for _, params, _ in made)
    assert sqlite.cwd == ROOT and sqlite.env == {"PYTHONPATH": str(ROOT)}
    order_id = sqlite.args[sqlite.args.index("--order") + 1]
    assert order_id.startswith("wo_")
    assert (tmp_path / "against-home" / "desk.sqlite3").is_file()
    assert memory.args[:2] == ["-m", "bench.memory_gateway"]
    figures = [Figures("bare proxy", 8.0, 16.0, 300.0),
               *(Figures(name, 8.8, 17.6, 280.0) for name in against_names(ROOT))]
    assert gateways(figures) == list(against_names(ROOT))
    assert f"{against_names(ROOT)[0]} / bare proxy: median 1.10x" in report(figures, callers=16)


def test_the_recording_floor_writes_each_call_before_answering(tmp_path: Path) -> None:
    """The floor row's proxy (a real subprocess in front of the outbox server, over stdio)
    appends a pending line before forwarding and the outcome with the result before
    answering, answers with the call's ``awl/ref``, and refuses past its budget without
    forwarding; the report rates it against the bare proxy with no verdict."""
    import json
    import sys

    import anyio
    import mcp_types as types
    from mcp import ClientSession, StdioServerParameters, stdio_client

    from bench.gateway import FLOOR, OUTBOX_SERVER, ROOT

    outbox = tmp_path / "outbox.jsonl"
    config = tmp_path / "upstream.json"
    config.write_text(json.dumps({"mcpServers": {"notes": {
        "command": sys.executable, "args": [str(OUTBOX_SERVER)],
        "env": {"OUTBOX_PATH": str(outbox)}}}}))
    journal = tmp_path / "journal.jsonl"
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "bench.recording_floor", "--config", str(config), "--journal",
              str(journal), "--calls", "1"],
        env={"PYTHONPATH": str(ROOT)}, cwd=ROOT)

    async def calls() -> list[types.CallToolResult]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            return [await s.call_tool("notes__send_email",
                                      {"to": to, "subject": "s", "body": "hi"})
                    for to in ("a", "b")]

    first, second = anyio.run(calls)
    assert not first.is_error and first.meta == {"awl/ref": "notes/send_email#1"}
    assert second.is_error and "AWL_BUDGET_EXCEEDED" in str(second.content[0])
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [(r["ref"], r["outcome"]) for r in lines] == [
        ("notes/send_email#1", "pending"), ("notes/send_email#1", "ok")]
    assert lines[0]["arguments"] == {"to": "a", "subject": "s", "body": "hi"}
    assert lines[1]["result"]["content"] == first.model_dump(
        by_alias=True, exclude_none=True)["content"]
    sent = [json.loads(line) for line in outbox.read_text().splitlines()]
    assert [m["to"] for m in sent] == ["a"]  # the refused call never reached the upstream
    figures = [Figures("bare proxy", 8.0, 16.0, 300.0), Figures(FLOOR, 8.4, 16.4, 290.0)]
    assert report(figures, callers=16).splitlines()[-1] == (
        "recording floor / bare proxy (the least recording costs): median 1.05x, "
        "p99 1.02x, time per call under load 1.03x")


def test_instructions_are_rated_against_the_pool_call(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``bench.instructions``: each target's count over the pool call's; without valgrind,
    one line saying what to install and nothing run; a counted run that fails is named."""
    import subprocess

    from bench.instructions import Count, count, main, report

    table = report([Count("pool call", 1_200_000), Count("gateway (memory store)", 1_680_000)])
    assert table.splitlines()[2:] == ["| pool call | 1200 | +0 k | 1.00x |",
                                      "| gateway (memory store) | 1680 | +480 k | 1.40x |"]
    assert report([Count("gateway (sqlite)", 1_800_000)]).splitlines()[2] == (
        "| gateway (sqlite) | 1800 | n/a | n/a |")
    served = report([Count("bare proxy", 2_800_000), Count("gateway (sqlite)", 3_220_000)],
                    "bare proxy").splitlines()
    assert served[0] == "| target | k instructions per call | over the bare proxy | ratio |"
    assert served[3] == "| gateway (sqlite) | 3220 | +420 k | 1.15x |"
    monkeypatch.setattr("bench.instructions.shutil.which", lambda name: None)
    assert main(["--quick"]) == 2
    capsys.readouterr()
    assert main(["--quick", "--served"]) == 2
    assert capsys.readouterr().err.strip() == (
        "bench.instructions: valgrind is not installed; install it (apt-get install -y "
        "valgrind) and run again")

    def failed(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, 1, "", "valgrind: no such tool\n")

    monkeypatch.setattr("bench.instructions.subprocess.run", failed)
    with pytest.raises(RuntimeError, match="the counted run of gateway on sqlite failed: "
                                           "valgrind: no such tool"):
        count("sqlite", "gateway", warm=1, calls=1)


def test_the_steps_split_the_gateways_extra_cpu_into_store_collector_and_own_work() -> None:
    """``bench.steps``: the extra over the pool call is the store's writes, the store's other
    threads, the collector's passes and the gateway's own work, which is what is left."""
    from bench.steps import Steps, report

    steps = Steps("sqlite", pool_us=500.0, gateway_us=800.0, writes_us=160.0,
                  background_us=10.0, collecting_us=5.0, alone_us=64.0)
    assert steps.extra_us == 300.0 and steps.own_us == 125.0
    rows = {line[:26].strip(): line[26:].strip() for line in report([steps]).splitlines()[2:]}
    assert rows == {"pool call (the floor)": "500 us", "gateway call": "800 us",
                    "extra over the pool call": "300 us (1.60x)",
                    "store writes in the loop": "160 us", "store's other threads": "10 us",
                    "garbage collection": "5 us", "gateway's own work": "125 us",
                    "store writes alone": "64 us", "in the loop over alone": "2.50x"}


@pytest.mark.slow
def test_the_steps_measure_a_real_gateway_on_each_store(
        capfd: pytest.CaptureFixture[str]) -> None:
    """A real run, in front of the outbox server: a column per store, the in-memory store
    first, and every store's writes took CPU time in and out of the loop."""
    from bench.steps import main, measure
    from bench.stores import Stores

    found = measure(Stores(("sqlite",)), 60)
    assert [s.store for s in found] == ["memory", "sqlite"]
    for steps in found:
        assert steps.pool_us > 0 and steps.gateway_us > 0
        assert steps.writes_us > 0 and steps.alone_us > 0
    with pytest.raises(SystemExit):
        main(["--calls", "3"])
    assert "--calls must be at least 30" in capfd.readouterr().err


@pytest.mark.slow
def test_the_check_bench_rates_the_sandboxed_check_against_the_floor_and_unsafe(
        capsys: pytest.CaptureFixture[str]) -> None:
    from awl.desk import sandbox
    from bench import check

    if sandbox.sandbox_problem() is not None and os.environ.get("CI") != "true":
        pytest.skip(str(sandbox.sandbox_problem()))
    assert check.main(["--runs", "3"]) == 0
    out = capsys.readouterr().out
    assert "check in the sandbox (the desk's way)" in out and "x unsafe" in out
    assert "the sandbox adds" in out
