"""What the sandbox adds to a desk-run check (SPEC SEC-15).

``python -m bench.check [--quick] [--runs N]``

A trivial check (``true``) on a small workspace (a git work tree of 20 files), run the way
the desk runs it: the reported snapshot, the tamper signals, a fresh copy and the run in the
sandbox. Beside it, the same run without the sandbox (``AWL_UNSAFE_UNSANDBOXED_CHECKS=1``
with no sandbox on offer, the supervisor in its place), the sandbox alone (``bwrap`` running
``true``) and the floor (``true`` as a plain subprocess). Medians and p90 of ``--runs``
runs; the target is under 0.3 s for the whole sandboxed check.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

from awl.desk import sandbox
from awl.desk.criteria import run_checks, take_snapshot
from awl.documents.models import Check

TRUE = Check(run=("true",))


def _workspace(folder: Path) -> Path:
    root = folder / "workspace"
    (root / "tests").mkdir(parents=True)
    for i in range(10):
        (root / f"module_{i}.py").write_text(f"def f{i}():\n    return {i}\n")
        (root / "tests" / f"test_{i}.py").write_text(f"def test_{i}():\n    assert True\n")
    git = ["git", "-c", "user.name=b", "-c", "user.email=b@b"]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "start"], cwd=root, check=True)
    return root


def _time(runs: int, step: Callable[[], object]) -> list[float]:
    step()  # warm
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        step()
        out.append(time.perf_counter() - started)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.check", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer runs")
    parser.add_argument("--runs", type=int, default=30, help="runs of each (default 30)")
    args = parser.parse_args(argv)
    runs = 5 if args.quick else args.runs
    why = sandbox.sandbox_problem()
    if why is not None:
        print(f"bench.check: {why}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="awl-bench-check-") as tmp:
        os.environ["AWL_HOME"] = str(Path(tmp) / "home")
        (Path(tmp) / "home").mkdir(mode=0o700)
        root = _workspace(Path(tmp))
        snapshot = take_snapshot(root)

        def checked() -> None:
            [run] = run_checks(root, [("c", TRUE)], snapshot)
            assert run.outcome == "passed", run

        def unsandboxed() -> None:
            with mock.patch.dict(os.environ, {sandbox.UNSAFE: "1"}), \
                    mock.patch.object(sandbox, "sandbox_problem", lambda: "off"):
                [run] = run_checks(root, [("c", TRUE)], snapshot)
            assert run.outcome == "passed" and not run.sandboxed, run

        folder = Path(tmp) / "bare"
        folder.mkdir()
        argv_ = sandbox.sandbox_argv(str(folder), str(folder), str(folder), ("true",),
                                     {"PATH": "/usr/bin:/bin"}, network=False, seconds=10,
                                     protected=(str(Path(tmp) / "home"),))
        rows = [
            ("floor: true as a subprocess", _time(runs, lambda: subprocess.run(["true"]))),
            ("the sandbox alone (bwrap true)", _time(runs, lambda: subprocess.run(argv_))),
            ("check without a sandbox (unsafe)", _time(runs, unsandboxed)),
            ("check in the sandbox (the desk's way)", _time(runs, checked)),
        ]
    floor = statistics.median(rows[0][1])
    unsafe = statistics.median(rows[2][1])
    print(f"{'trivial check, ' + str(runs) + ' runs':<40} {'median':>9} {'p90':>9} "
          f"{'x floor':>8} {'x unsafe':>9}")
    for name, times in rows:
        median = statistics.median(times)
        p90 = sorted(times)[int(0.9 * (len(times) - 1))]
        print(f"{name:<40} {median * 1000:>7.1f}ms {p90 * 1000:>7.1f}ms "
              f"{median / floor:>7.1f}x {median / unsafe:>8.2f}x")
    sandboxed = statistics.median(rows[3][1])
    print(f"the sandbox adds {(sandboxed - unsafe) * 1000:.0f} ms to a check; "
          f"a whole trivial check takes {sandboxed * 1000:.0f} ms (target under 300 ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
