"""The README's main job: examples/demo.py, run for real as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from awl import Desk, SQLiteStore
from gateway._commit import list_effects

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "demo.py"


def _run_demo(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWL_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, str(DEMO), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=110, check=False)


def _stable(report: dict[str, Any]) -> dict[str, Any]:
    """The report without what changes from run to run (order id, times)."""
    return {k: v for k, v in report.items()
            if k not in ("order_id", "started_at", "finished_at")}


def test_the_demo_sends_the_approved_email_once(tmp_path: Path) -> None:
    """The demo exits 0, its outbox holds one message after two commits, and it says so."""
    done = _run_demo(tmp_path, "--home", "desk")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    home = tmp_path / "desk"
    lines = (home / "outbox.jsonl").read_text(encoding="utf-8").splitlines()
    [message] = [json.loads(line) for line in lines if line.strip()]
    assert (message["to"], message["awl_ref"]) == ("team@example.com", "mail/send_email#3")
    assert ("The second commit sent nothing: the outbox still holds exactly 1 message."
            in done.stdout)
    for needed in ("pending:mail/send_email#3", "pending:mail/send_email#4",
                   "awl_submit_report", "already committed before this run",
                   "track record of agent:clerk", "# Handoff:", "AWL_HOME=desk"):
        assert needed in done.stdout, needed

    store = SQLiteStore(home / "desk.sqlite3")
    try:
        [view] = Desk(store).list()
        effects = {e.ref: (e.state, e.dispatches)
                   for e in list_effects(view.id, store=store)}
    finally:
        store.close()
    assert view.state == "approved"
    assert effects == {"mail/send_email#3": ("committed", 1),
                       "mail/send_email#4": ("dropped", 0)}
    # The README's example report is what the demo's worker really submits.
    example = json.loads((ROOT / "examples" / "report.json").read_text(encoding="utf-8"))
    assert view.latest_report is not None
    assert _stable(view.latest_report.to_json()) == _stable(example)


def test_the_demo_never_wipes_a_folder_it_did_not_make(tmp_path: Path) -> None:
    """Pointed at a non-empty folder it did not make, the demo stops and deletes nothing."""
    keep = tmp_path / "mine" / "notes.txt"
    keep.parent.mkdir()
    keep.write_text("important", encoding="utf-8")
    done = _run_demo(tmp_path, "--home", "mine")
    assert done.returncode == 1
    assert "DEMO FAILED" in done.stderr and "Traceback" not in done.stderr
    assert keep.read_text(encoding="utf-8") == "important"
    assert sorted(p.name for p in keep.parent.iterdir()) == ["notes.txt"]


def test_the_demo_script_installs_the_base_package_only(tmp_path: Path) -> None:
    """`bash scripts/demo.sh` in a fresh copy of the checkout makes its .venv with the base
    package alone (it installed the whole toolchain, 508 MB, before) and the demo runs."""
    import shutil

    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                            check=True, timeout=60).stdout.decode().split("\0")
    copy = tmp_path / "checkout"
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    python = getattr(sys, "_base_executable", sys.executable)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AWL_") and k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    done = subprocess.run(["bash", "scripts/demo.sh", "--home", "desk"], cwd=copy,
                          env={**env, "PYTHON": python}, capture_output=True, text=True,
                          timeout=600, check=False, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "every expectation held" in done.stdout
    assert "the base package only" in done.stderr
    frozen = subprocess.run([str(copy / ".venv" / "bin" / "python"), "-m", "pip", "list",
                             "--format=json"], capture_output=True, text=True, timeout=120,
                            check=True).stdout
    names = {p["name"].lower() for p in json.loads(frozen)}
    assert "awl-gateway" in names
    extras = {"pytest", "ruff", "mypy", "playwright", "psycopg", "opentelemetry-sdk",
              "pydantic-ai-slim", "openai-agents", "hypothesis", "import-linter"}
    assert not names & extras, sorted(names & extras)
    size = sum(f.stat().st_size for f in (copy / ".venv").rglob("*") if f.is_file())
    print(f"\ndemo .venv: {size / 2**20:.0f} MiB, {len(names)} distributions")
    # Run again, it installs nothing (the stamp is fresh).
    again = subprocess.run(["bash", "scripts/demo.sh", "--home", "desk2"], cwd=copy,
                           env={**env, "PYTHON": python}, capture_output=True, text=True,
                           timeout=300, check=False, stdin=subprocess.DEVNULL)
    assert again.returncode == 0 and "installing" not in again.stderr, again.stderr[-2000:]
