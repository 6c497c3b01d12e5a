"""``awl gateway`` given an empty pass by the environment: refused in one line, never run as
the order's worker (SEC-11)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from awl.cli import main
from awl.desk import Desk
from awl.store.sqlite import SQLiteStore
from tests.awl.desk_support import MANAGER, WORKER, order_fields


@pytest.mark.spec("SEC-11")
@pytest.mark.parametrize("value", ["", " \n"])
def test_an_empty_awl_pass_is_refused_not_run_as_the_order_s_worker(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        value: str) -> None:
    """`AWL_PASS="$(cat helper.pass)"` with the file missing sets AWL_PASS to nothing. An
    empty `--pass` and an empty pass file are refused for this reason; an empty AWL_PASS was
    dropped instead, and the gateway served the sub-agent the whole order as its worker."""
    store = SQLiteStore(tmp_path / "desk.sqlite3")
    try:
        desk = Desk(store)
        order_id = desk.create(order_fields(deadline="2099-01-01T00:00:00Z"), MANAGER).id
        desk.accept(order_id, WORKER)
        desk.start(order_id, WORKER)
    finally:
        store.close()
    config = tmp_path / "upstream.json"
    config.write_text(json.dumps({"mcpServers": {}}))
    monkeypatch.setenv("AWL_PASS", value)
    code = main(["gateway", "--order", order_id, "--config", str(config),
                 "--home", str(tmp_path)])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err == ("awl: AWL_PASS is set but empty; put the token `awl pass issue` printed "
                   "in it, or unset AWL_PASS to run as the order's worker\n")


@pytest.mark.parametrize("extra", [[], ["--commit"]])
def test_a_home_with_no_desk_is_one_line_and_nothing_is_made(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str]) -> None:
    """`awl gateway --home TYPO` made the folder and an empty desk in it, then said the
    order was not found; a gateway serves an order already issued, so it makes nothing."""
    config = tmp_path / "upstream.json"
    config.write_text(json.dumps({"mcpServers": {}}))
    typo = tmp_path / "no-such-home"
    code = main(["gateway", "--order", "wo_1", "--config", str(config), "--home", str(typo),
                 *extra])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err == (f"awl: STORE_UNAVAILABLE: there is no desk at {typo / 'desk.sqlite3'}: "
                   "check --home (or $AWL_HOME, else ./.awl) names the folder the order was "
                   "issued in (`awl order create` makes a desk there); nothing was made\n")
    assert not typo.exists()
