"""docs/upgrading.md: its SQLite blocks run as written, and the refusal it shows is the one an
older release gives a desk a newer one migrated."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.awl.desk_support import newer_desk

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "upgrading.md"


def blocks(language: str) -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    return [m.group(2) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)
            if m.group(1) == language]


def bash(body: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_the_backup_and_rollback_blocks_bring_the_desk_back(tmp_path: Path) -> None:
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "AWL_HOME": str(tmp_path / "home"), "AWL_ACTOR": "human:ana",
           "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT)}
    made = bash(f"awl order create {ROOT / 'examples' / 'order.json'}", tmp_path, env)
    assert made.returncode == 0, made.stderr
    upgrade, rollback = blocks("bash")
    done = bash(upgrade, tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert "wo_offsite_notice" in done.stdout
    assert (tmp_path / "home.before-upgrade" / "desk.sqlite3").is_file()
    assert (tmp_path / "home.before-upgrade" / "keys").is_dir() or not (
        tmp_path / "home" / "keys").exists()
    # A newer release migrates the desk: this release is now the older one.
    newer_desk(tmp_path / "home" / "desk.sqlite3")
    refused = bash("awl order list", tmp_path, env)
    assert refused.returncode == 1 and refused.stdout == ""
    [shown] = [line for line in blocks("") if "newer than this awl" in line]
    pattern = re.escape(shown.strip()).replace("…", ".*")
    pattern = re.sub(r"\d+", r"\\d+", pattern)
    assert re.fullmatch(pattern, refused.stderr.strip()), refused.stderr
    back = bash(rollback, tmp_path, env)
    assert back.returncode == 0, back.stderr
    assert "wo_offsite_notice" in back.stdout
