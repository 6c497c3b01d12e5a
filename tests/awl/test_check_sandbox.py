"""A worker's code inside a desk-run check, attacking the desk (SPEC SEC-15, LC-18, LC-19).

Each test plants hostile code in the workspace (a module the manager's test imports, or the
check's command itself), runs the checks the way the desk does, and then looks, from
outside, at what the attack was after: the desk's files and keys unchanged, the order's
state untouched, nothing left running, the failing work still refused.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from awl import Desk
from awl.desk import sandbox
from awl.desk.criteria import run_check, run_checks, take_snapshot
from awl.documents.models import Check
from awl.store.sqlite import SQLiteStore
from tests.awl.check_support import assert_stopped, check_folder
from tests.awl.desk_support import MANAGER, WORKER, order_fields, report_fields
from tests.awl.test_criteria_checks import CALC_BROKEN, TEST, _git, _workspace

PYTEST = (sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests")
CHECK = Check(run=PYTEST)


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("AWL_HOME", str(home))
    monkeypatch.delenv(sandbox.UNSAFE, raising=False)
    if sandbox.sandbox_problem() is not None and os.environ.get("CI") != "true":
        pytest.skip(f"no sandbox here: {sandbox.sandbox_problem()}")
    return home


def _run(root: Path, module: str, check: Check = CHECK) -> tuple[str, str]:
    """Plant ``module`` as calc.py (the module the test imports) after the start, run the
    check as the desk does; its outcome and its output."""
    snapshot = take_snapshot(root)
    (root / "calc.py").write_text(module)
    [run] = run_checks(root, [("c1", check)], snapshot)
    return run.outcome, "\n".join(run.tail) + (run.error or "")


def _probe(name: str) -> str:
    """A calc.py that tries ``name`` (a Python expression) at import, then fails the test."""
    return (f"import os\ntry:\n    print('GOT', repr({name}))\nexcept Exception as exc:\n"
            f"    print('REFUSED', type(exc).__name__)\n" + CALC_BROKEN)


@pytest.mark.spec("SEC-15")
def test_the_desk_home_its_keys_and_store_are_not_there(tmp_path: Path, _home: Path) -> None:
    desk = Desk(SQLiteStore(_home / "desk.sqlite3"))
    keys = _home / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    (keys / "k1.pem").write_text("SECRET KEY")
    before = {p: p.read_bytes() for p in _home.rglob("*") if p.is_file()}
    root = _workspace(tmp_path, "git")
    module = ("import os, pathlib\n"
              f"home = pathlib.Path({str(_home)!r})\n"
              "for p in [home, home / 'keys' / 'k1.pem', home / 'desk.sqlite3']:\n"
              "    try:\n"
              "        print('GOT', p, p.read_bytes()[:20] if p.is_file() else os.listdir(p))\n"
              "    except OSError as exc:\n"
              "        print('REFUSED', p, type(exc).__name__)\n"
              "    try:\n"
              "        (home / 'planted').write_text('x')\n"
              "        print('WROTE')\n"
              "    except OSError:\n"
              "        pass\n" + CALC_BROKEN)
    outcome, output = _run(root, module)
    assert outcome == "failed"
    assert "GOT" not in output and "WROTE" not in output and "REFUSED" in output
    assert {p: p.read_bytes() for p in _home.rglob("*") if p.is_file()
            and "snapshots" not in p.parts and "checks" not in p.parts} == {
        p: b for p, b in before.items() if "snapshots" not in p.parts}
    assert not (_home / "planted").exists()
    del desk


@pytest.mark.spec("SEC-15")
def test_a_check_cannot_approve_the_workers_own_order(tmp_path: Path, _home: Path) -> None:
    """The attack that got through: a helper started from the imported module ran
    ``awl review --approve`` as the manager. Inside the sandbox there is no desk to open,
    and nothing it started outlives the check."""
    desk = Desk(SQLiteStore(_home / "desk.sqlite3"))
    root = _workspace(tmp_path, "git")
    order = desk.create(order_fields(criteria=[{"id": "c1", "text": "tests pass",
                                                "check": {"run": list(PYTEST)}}]),
                        MANAGER, workspace=root)
    desk.accept(order.order.id, WORKER)
    desk.start(order.order.id, WORKER)
    home = str(_home)
    (root / "calc.py").write_text(
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time, subprocess, sys; time.sleep(1); "
        f"subprocess.run([sys.executable, \"-m\", \"awl\", \"--home\", {home!r}, \"review\", "
        f"\"{order.order.id}\", \"--approve\", \"--as\", \"{MANAGER}\"])'], "
        "start_new_session=True)\n"
        "def add(a, b):\n    return a + b\n")
    with pytest.raises(Exception, match=r"R19|check"):
        desk.report(order.order.id, WORKER, report_fields())
    import time
    time.sleep(2)
    view = desk.get(order.order.id, viewer=MANAGER)
    assert view.state == "working"


@pytest.mark.spec("SEC-15")
def test_another_processes_environment_and_another_workspace_are_not_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPASSWORD", "planted-secret")
    other = tmp_path / "other-workspace"
    other.mkdir()
    (other / "secret.txt").write_text("the other worker's work")
    root = _workspace(tmp_path, "folder")
    module = ("import os\n"
              "for pid in os.listdir('/proc'):\n"
              "    if pid.isdigit():\n"
              "        try:\n"
              "            if b'planted' in open(f'/proc/{pid}/environ', 'rb').read():\n"
              "                print('ENV-LEAK')\n"
              "        except OSError:\n"
              "            pass\n"
              "try:\n"
              f"    print('OTHER', open({str(other / 'secret.txt')!r}).read())\n"
              "except OSError as exc:\n"
              "    print('NO-OTHER', type(exc).__name__)\n" + CALC_BROKEN)
    outcome, output = _run(root, module)
    assert outcome == "failed"
    assert "ENV-LEAK" not in output and "the other worker's work" not in output
    assert "NO-OTHER" in output


@pytest.mark.spec("SEC-15")
def test_no_network_unless_the_check_asks(tmp_path: Path) -> None:
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    script = ("import socket\ntry:\n"
              f"    socket.create_connection(('127.0.0.1', {port}), timeout=2); print('REACHED')\n"
              "except OSError as exc:\n    print('CUT', type(exc).__name__)")
    folder = check_folder(tmp_path)
    cut = run_check(folder, "c1", Check(run=(sys.executable, "-c", script)))
    reached = run_check(folder, "c1", Check(run=(sys.executable, "-c", script), network=True))
    server.close()
    assert cut.tail == ("CUT ConnectionRefusedError",)
    assert reached.tail == ("REACHED",)


@pytest.mark.spec("SEC-15")
def test_a_fork_bomb_stops_at_the_process_limit_and_leaves_nothing(tmp_path: Path) -> None:
    folder = check_folder(tmp_path)
    beat = folder / "beat"
    script = ("import os, time, sys\n"
              "n = 0\n"
              "while True:\n"
              "    try:\n"
              "        if os.fork() == 0:\n"
              "            while True:\n"
              f"                open({str(beat)!r}, 'a').write('.'); time.sleep(0.2)\n"
              "        n += 1\n"
              "    except OSError:\n"
              "        print('LIMIT', n, flush=True); break\n"
              "time.sleep(1)\n")
    run = run_check(folder, "c1", Check(run=(sys.executable, "-c", script), timeout=30))
    assert run.tail and run.tail[0].startswith("LIMIT")
    assert int(run.tail[0].split()[1]) < sandbox.LIMITS.processes
    assert_stopped(beat)


@pytest.mark.spec("SEC-15")
def test_a_file_larger_than_the_limit_cannot_be_written(tmp_path: Path) -> None:
    folder = check_folder(tmp_path)
    limits = sandbox.Limits(file_size=1024 * 1024)
    argv = sandbox.sandbox_argv(
        str(folder), str(folder), str(folder),
        ("dd", "if=/dev/zero", f"of={folder / 'big'}", "bs=1M", "count=4"), {},
        network=False, seconds=10, protected=(), limits=limits)
    import subprocess

    done = subprocess.run(argv, capture_output=True, check=False)
    assert done.returncode != 0
    assert (folder / "big").stat().st_size <= 1024 * 1024


@pytest.mark.spec("LC-18", "SEC-15")
def test_os_exit_zero_at_import_is_no_silent_pass(tmp_path: Path) -> None:
    root = _workspace(tmp_path, "git")
    outcome, _ = _run(root, "import os\nos._exit(0)\n")
    assert outcome == "question"
    hidden = "import importlib\ngetattr(importlib.import_module('o' + 's'), '_ex' + 'it')(0)\n"
    root2 = _workspace(tmp_path / "two", "git")
    snapshot = take_snapshot(root2)
    (root2 / "calc.py").write_text(hidden)
    [run] = run_checks(root2, [("c1", Check(run=PYTEST))], snapshot)
    assert run.outcome == "question"
    assert any("without finishing its run" in s for s in run.signals)


@pytest.mark.spec("LC-18", "LC-19")
def test_a_test_that_restores_its_own_text_while_it_runs_is_seen(tmp_path: Path) -> None:
    root = _workspace(tmp_path, "git")
    snapshot = take_snapshot(root)
    test = root / "tests" / "test_calc.py"
    cheat = ("import pathlib\n"
             f"pathlib.Path(__file__).write_text({TEST!r})\n"
             "def test_add():\n    pass\n")
    test.write_text(cheat)
    [run] = run_checks(root, [("c1", Check(run=PYTEST))], snapshot)
    assert run.outcome == "question"
    assert any("test_calc.py" in s for s in run.signals)
    assert test.read_text() == cheat  # the run was on a copy: the workspace is as reported


@pytest.mark.spec("LC-19")
def test_a_replace_ref_hides_no_edit(tmp_path: Path) -> None:
    root = _workspace(tmp_path, "git")
    snapshot = take_snapshot(root)
    test = root / "tests" / "test_calc.py"
    test.write_text(TEST.replace("== 5", "== 5 or True"))
    # the worker points every object of its repository's new tree at the old one
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "cheat")
    import subprocess

    def parse(name: str) -> str:
        return subprocess.run(["git", "rev-parse", name], cwd=root, capture_output=True,
                              text=True, check=True).stdout.strip()

    old, new = parse("HEAD~1^{tree}"), parse("HEAD^{tree}")
    _git(root, "replace", new, old)
    [run] = run_checks(root, [("c1", Check(run=PYTEST))], snapshot)
    assert run.outcome == "question"
    assert any("tests/test_calc.py" in s for s in run.signals)


@pytest.mark.spec("LC-19")
def test_a_conftest_linked_from_a_cache_folder_does_not_run(tmp_path: Path) -> None:
    root = _workspace(tmp_path, "folder")
    snapshot = take_snapshot(root)
    cache = root / "tests" / "__pycache__"
    cache.mkdir()
    (cache / "conftest.py").write_text(
        "import pytest\n@pytest.hookimpl(tryfirst=True)\n"
        "def pytest_runtest_call(item):\n    pytest.skip('hidden')\n")
    (root / "tests" / "conftest.py").symlink_to("__pycache__/conftest.py")
    [run] = run_checks(root, [("c1", Check(run=PYTEST))], snapshot)
    assert run.outcome != "passed"  # the copy has no cache folder: the failing test fails
    if run.outcome == "question":
        assert any("conftest.py" in s for s in run.signals)


@pytest.mark.spec("SEC-15")
def test_without_a_sandbox_the_desk_refuses_unless_the_operator_opts_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _home: Path) -> None:
    monkeypatch.setattr(sandbox, "sandbox_problem", lambda: "bwrap is not installed")
    desk = Desk(SQLiteStore(_home / "desk.sqlite3"))
    root = _workspace(tmp_path, "folder")
    fields = order_fields(criteria=[{"id": "c1", "text": "t", "check": {"run": ["true"]}}])
    with pytest.raises(Exception, match="runs no check here: bwrap is not installed"):
        desk.create(fields, MANAGER, workspace=root)
    monkeypatch.setenv(sandbox.UNSAFE, "1")
    [run] = run_checks(root, [("c1", Check(run=("true",)))], take_snapshot(root))
    assert run.outcome == "passed" and not run.sandboxed
    assert run.to_json()["check"]["unsandboxed"] is True
    assert "without a sandbox" in run.summary()
