"""A seeded soak: kill -9 the committer at random moments of a 20-effect commit, recover.

``AWL_SOAK_RUNS`` sets the number of runs (default 5, about 20 s) and ``AWL_SOAK_SEED``
the seed. Each run picks one way to die:

- ``mark``: right after a random effect's durable ``dispatching`` mark (test hook);
- ``receipt``: after the receiver logged a random effect and before it answers;
- ``random``: after the receiver logged a random number of deliveries, plus a random
  delay of up to 40 ms, so the kill lands anywhere in the send/answer/record cycle.

Sometimes the first recovery commit is killed too. A final commit then runs to the end.
Every run checks: no receiver count above 1; every effect ``committed`` (count 1) or
``unknown`` (count 0 or 1); nothing left ``held`` or ``dispatching``.
"""

from __future__ import annotations

import os
import random
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from gateway._commit import commit_sync
from gateway._config import load_config
from tests.gateway.commit_support import Setup, kill9, make_setup, start_committer, wait_for

pytestmark = pytest.mark.slow

DELIVER = "receiver/deliver"
RUNS = int(os.environ.get("AWL_SOAK_RUNS", "5"))
SEED = int(os.environ.get("AWL_SOAK_SEED", "20261130"))


def _wait_for_the_moment(setup: Setup, rng: random.Random, proc: subprocess.Popen[str],
                         mode: str, victim: str, marker: Path, before: int) -> None:
    """Wait until the moment ``mode`` kills at (or until the committer has finished)."""
    if mode == "mark":
        wait_for(lambda: marker.exists() or proc.poll() is not None, timeout=60,
                 what="the dispatching marker")
    elif mode == "receipt":
        wait_for(lambda: setup.counts().get(victim, 0) >= 1 or proc.poll() is not None,
                 timeout=60, what="the victim's delivery")
    else:
        target = before + rng.randrange(0, 20)
        wait_for(lambda: sum(setup.counts().values()) >= target or proc.poll() is not None,
                 timeout=60, what=f"{target} deliveries")
        time.sleep(rng.uniform(0, 0.04))  # the random moment itself, not a wait for a state


def _kill_somewhere(setup: Setup, rng: random.Random, folder: Path, figures: Counter[str]
                    ) -> None:
    """Start a committer and kill it at a moment chosen by ``rng`` (if it still runs)."""
    mode = rng.choice(["mark", "receipt", "random", "random"])
    victim = rng.choice(setup.refs)
    marker = folder / f"marker-{time.monotonic_ns()}"
    pause = (marker, victim) if mode == "mark" else None
    setup.control_receiver(hang_after=[victim] if mode == "receipt" else [],
                           delay=rng.choice([0, 0.002, 0.01]))
    before = sum(setup.counts().values())
    proc = start_committer(setup, pause=pause)
    try:
        _wait_for_the_moment(setup, rng, proc, mode, victim, marker, before)
    except BaseException:
        if proc.poll() is None:  # a failed wait must not leave the committer running
            kill9(proc)
        else:
            proc.communicate()
        raise
    if proc.poll() is None:
        kill9(proc)
        figures["kills"] += 1
        figures[f"kills:{mode}"] += 1
    else:
        proc.communicate()
        figures["finished before the kill"] += 1
    setup.control_receiver()


@pytest.mark.spec("CM-6", "CM-8")
def test_random_kills_never_deliver_twice_and_leave_unknowns_visible(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], store_url: str | None) -> None:
    """Across seeded random kills, counts stay at most 1 and unrecorded outcomes are unknown."""
    rng = random.Random(SEED)
    figures: Counter[str] = Counter()
    started = time.monotonic()
    for n in range(RUNS):
        folder = tmp_path / f"run{n}"
        setup = make_setup(folder, [(DELIVER, {"to": f"person{i}", "body": f"message {i}"})
                                    for i in range(20)], store_url=store_url)
        _kill_somewhere(setup, rng, folder, figures)
        if rng.random() < 0.3:  # the recovering committer dies too
            _kill_somewhere(setup, rng, folder, figures)
        final = commit_sync(setup.order_id, store=setup.store,
                            pool_or_config=load_config(setup.config))
        assert not final.mismatches
        counts = setup.counts()
        states = setup.states()
        assert max(counts.values(), default=0) <= 1, counts
        assert set(counts) <= set(setup.refs)
        for ref in setup.refs:
            state = states[ref].state
            assert state in ("committed", "unknown"), (ref, state)
            if state == "committed":
                assert counts.get(ref) == 1, (ref, counts.get(ref))
            figures[state] += 1
            if state == "unknown":
                figures[f"unknown with count {counts.get(ref, 0)}"] += 1
        figures["max count"] = max(figures["max count"], max(counts.values(), default=0))
        figures["runs"] += 1
        setup.store.close()
    figures["seconds"] = round(time.monotonic() - started)
    with capfd.disabled():
        print(f"\ncommit soak ({'SQLite' if store_url is None else 'PostgreSQL'}, seed {SEED}): "
              + ", ".join(
            f"{k}={v}" for k, v in sorted(figures.items())))
    assert figures["runs"] == RUNS
