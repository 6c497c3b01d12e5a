"""``bench.scale``: many gateways on one desk against as many bare proxies. Its arithmetic
and the shape of what it prints, never its timings."""

from __future__ import annotations

import os
import re

import pytest

from bench.scale import (
    BARE,
    Point,
    Sizes,
    curves,
    main,
    median_points,
    parse_counts,
    run_ratios,
    table,
)


def _point(target: str, processes: int, seconds: float, *, ok: int = 95, refused: int = 5,
           failed: int = 0, spent: int | None = 95) -> Point:
    desk = target != BARE
    return Point(target, processes, 100, seconds, 5.0 * processes, 9.0 * processes,
                 ok if desk else 100, refused if desk else 0, failed,
                 95 if desk else None, spent if desk else None)


def test_a_desk_is_exact_when_it_spent_what_succeeded_and_refused_only_once_spent() -> None:
    assert _point("gateway (sqlite)", 1, 1.0).exact
    assert _point(BARE, 1, 1.0).exact is None  # no desk to read
    assert not _point("gateway (sqlite)", 1, 1.0, spent=96).exact  # counted a call twice
    assert not _point("gateway (sqlite)", 1, 1.0, ok=96, spent=96).exact  # over the budget
    assert not _point("gateway (sqlite)", 1, 1.0, ok=90, refused=10, spent=90).exact  # refused
    assert not _point("gateway (sqlite)", 1, 1.0, failed=1).exact  # with budget left
    assert Sizes(callers=2, per_caller=10, warmup=3).budget(4) == 12 + 76


def test_the_table_rates_each_gateway_against_the_bare_proxies_at_its_count() -> None:
    points = [_point(BARE, 1, 1.0), _point("gateway (sqlite)", 1, 1.25),
              _point(BARE, 2, 0.5), _point("gateway (sqlite)", 2, 1.0, spent=94)]
    text = table(points)
    assert re.search(r"1 x bare proxy +100 +5\.00 +9\.00 +1\.00x +-", text)
    assert re.search(r"1 x gateway \(sqlite\) +80 .* 1\.25x +95 ok, 5 refused, spent 95/95: "
                     r"exact", text)
    assert "2.00x" in text and "spent 94/95: NOT EXACT" in text
    lines = curves(points).splitlines()
    assert lines[0] == ("gateway (sqlite) / bare proxies, time per call by processes: "
                        "1: 1.25x, 2: 2.00x; calls/s 1: 80, 2: 100; budget NOT EXACT")
    assert lines[1] == "bare proxies, calls/s by processes: 1: 100, 2: 200"


def test_the_medians_keep_a_run_that_was_not_exact() -> None:
    runs = [[_point(BARE, 1, s), _point("gateway (sqlite)", 1, 2 * s, spent=spent)]
            for s, spent in ((1.0, 95), (2.0, 94), (3.0, 95))]
    medians = {p.target: p for p in median_points(runs)}
    assert medians[BARE].seconds == pytest.approx(2.0)
    assert medians["gateway (sqlite)"].seconds == pytest.approx(4.0)
    assert medians["gateway (sqlite)"].exact is False
    runs[1][0] = _point(BARE, 1, 1.0)  # run 2: the gateway 4x the bare proxy's time
    assert run_ratios(runs) == ("median of 3 runs' ratios, gateway (sqlite) / bare proxies, "
                                "time per call by processes: 1: 2.00x")


def test_counts_of_processes_are_read_or_refused_in_one_line() -> None:
    assert parse_counts("1,2, 4") == [1, 2, 4]
    for bad in ("1,x", "0,2", ""):
        with pytest.raises(ValueError, match="--processes"):
            parse_counts(bad)


@pytest.mark.slow
@pytest.mark.timeout(600)  # 63 processes started on 2 cores: minutes on a busy machine
def test_a_quick_run_prints_every_count_and_target_with_an_exact_budget(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--quick``: 1, 2 and 4 real processes of each target (PostgreSQL's when the tests
    have a server), a row each, each gateway's desk exact, and a curve per gateway."""
    stores = "sqlite,postgres" if os.environ.get("AWL_TEST_POSTGRES") else "sqlite"
    assert main(["--quick", "--store", stores]) == 0
    out = capsys.readouterr().out
    targets = [BARE, *(f"gateway ({s})" for s in stores.split(","))]
    for processes in (1, 2, 4):
        for target in targets:
            row = next(line for line in out.splitlines()
                       if line.startswith(f"{processes} x {target} "))
            assert re.search(r" \d+ +\d+\.\d\d +\d+\.\d\d +\d+\.\d\dx ", row), row
            if target != BARE:
                assert row.endswith(": exact"), row
    for target in targets[1:]:
        assert re.search(rf"^{re.escape(target)} / bare proxies, time per call by processes: "
                         r"1: [\d.]+x, 2: [\d.]+x, 4: [\d.]+x; .*budget exact at every count$",
                         out, re.M)
    assert "bare proxies, calls/s by processes: 1: " in out
