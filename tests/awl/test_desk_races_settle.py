"""Two managers settling one unknown effect at the same moment (CM-11).

A settlement is final: the first one logged counts and a later one is refused. Two
settlements racing used to both reach the log: each checked there was none, each wrote its
``settle`` event, and the later one was then told "already settled", its event (with the
opposite verdict, say) staying in the log for every reader of the order. The settlement is
now decided in the same optimistic write as its event, so the refused one writes nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from awl.desk import Desk
from awl.desk.settlement import settle
from awl.documents.errors import InvalidTransition
from awl.documents.models import Event
from awl.store.protocol import Store
from awl.store.urls import open_store
from tests.awl.desk_support import (
    MANAGER,
    WORKER,
    effect,
    hold_effects,
    order_fields,
    report_fields,
)

REF = "mail/send#1"
T = "2030-01-01T09:00:00Z"


@pytest.fixture
def opened(desk_url: str) -> Iterator[Store]:
    store = open_store(desk_url)
    yield store
    store.close()


def unknown_effect(store: Store) -> str:
    """An approved order whose one effect was sent and never answered: ``unknown``."""
    desk = Desk(store)
    view = desk.create(order_fields(deadline="2099-01-01T00:00:00Z"), MANAGER)
    desk.accept(view.id, WORKER)
    desk.start(view.id, WORKER)
    hold_effects(store, view.id, [effect(1)])
    desk.report(view.id, WORKER, report_fields(effects=[effect(1)], tools_used=["mail/send"]))
    desk.review(view.id, MANAGER, "approve")
    store.set_effect(view.id, REF, expect=["held"], state="dispatching", count_dispatch=True,
                     at=T)
    store.set_effect(view.id, REF, expect=["dispatching"], state="unknown", at=T)
    return view.id


class RivalFirst:
    """A store that lets a rival write (on its own connection to the same desk) just before
    the first ``settle`` event goes through it: the two settlements interleave exactly."""

    def __init__(self, inner: Store, rival: Callable[[], object]) -> None:
        self.inner = inner
        self.rival: Callable[[], object] | None = rival

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def append(self, order_id: str, event: Event, **kwargs: Any) -> None:
        if event.action == "settle" and self.rival is not None:
            rival, self.rival = self.rival, None
            rival()
        self.inner.append(order_id, event, **kwargs)


def settles(store: Store, order_id: str) -> list[tuple[str, str]]:
    return [(e.actor, e.data["verdict"]) for e in store.events(order_id)
            if e.action == "settle" and e.data]


@pytest.mark.spec("CM-11")
def test_the_settlement_that_loses_the_race_writes_nothing(desk_url: str,
                                                           opened: Store) -> None:
    """Ana settles did-not-happen while Bo's happened is logged between her check and her
    write: hers is refused in one line naming Bo's, and the log holds Bo's alone."""
    order_id = unknown_effect(opened)
    other = open_store(desk_url)
    try:
        def bo_settles() -> object:
            return settle(order_id, REF, "happened", "the receiver has it", MANAGER,
                          store=other)

        racing = cast(Store, RivalFirst(opened, bo_settles))
        with pytest.raises(InvalidTransition) as refused:
            settle(order_id, REF, "did_not_happen", "nothing in the receiver's log",
                   MANAGER, store=racing)
    finally:
        other.close()
    assert "already settled as happened" in refused.value.message
    assert "\n" not in refused.value.message
    assert settles(opened, order_id) == [(MANAGER, "happened")]
    (state,) = opened.effects(order_id)
    assert state.settlement is not None and state.settlement.verdict == "happened"


# Waits for the go file, then runs the `awl` command: so two start at the same moment.
CHILD = r"""
import os, sys, time
from awl.cli import main
go = sys.argv[1]
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.0005)
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow
@pytest.mark.spec("CM-11")
def test_two_awl_effects_settle_at_once_log_one_settlement(
        tmp_path: Path, desk_url: str, opened: Store) -> None:
    """`awl effects settle --happened` and `--did-not-happen` started together, a few
    times over: each time one exits 0, the other 1 with one line, and the log holds one
    settlement, the one the effect shows."""
    env = {k: v for k, v in os.environ.items() if k not in ("AWL_ACTOR", "AWL_STORE")}
    for round_ in range(4):
        order_id = unknown_effect(opened)
        go = tmp_path / f"go{round_}"
        children = [
            subprocess.Popen(
                [sys.executable, "-c", CHILD, str(go), "effects", "settle", order_id, REF,
                 verdict, "--evidence", "looked", "--as", MANAGER, "--store", desk_url,
                 "--home", str(tmp_path / "home")],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for verdict in ("--happened", "--did-not-happen")]
        for child in children:
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
        go.touch()
        ended = [(child.communicate(timeout=120), child.returncode) for child in children]
        assert sorted(code for _, code in ended) == [0, 1], ended
        (err,) = [err for (_, err), code in ended if code == 1]
        assert err.startswith("awl: INVALID_TRANSITION: ") and err.count("\n") == 1, err
        logged = settles(opened, order_id)
        assert len(logged) == 1, logged
        (state,) = opened.effects(order_id)
        assert state.settlement is not None
        assert state.settlement.verdict == logged[0][1]
