"""The home folder and the default store."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from awl.desk.home import default_store, home_dir
from awl.documents.errors import BadRequest
from awl.store.sqlite import SQLiteStore

ROOT = Path(__file__).resolve().parents[2]


def test_explicit_folder_is_created_private_and_ignored(tmp_path: Path) -> None:
    """A home this call creates is mode 0700 and ignores itself in git."""
    home = home_dir(tmp_path / "a" / "home")
    assert home == tmp_path / "a" / "home"
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert (home / ".gitignore").read_text() == "*\n"


def test_env_var_then_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """AWL_HOME wins over ./.awl, and ./.awl is the fallback."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AWL_HOME", str(tmp_path / "env"))
    assert home_dir() == tmp_path / "env"
    monkeypatch.delenv("AWL_HOME")
    assert home_dir() == tmp_path / ".awl"
    assert (tmp_path / ".awl" / ".gitignore").exists()


def test_existing_folder_is_left_alone(tmp_path: Path) -> None:
    """An existing folder gets no .gitignore written into it."""
    assert home_dir(tmp_path) == tmp_path
    assert not (tmp_path / ".gitignore").exists()


def test_a_file_in_the_way_is_a_clear_error(tmp_path: Path) -> None:
    """A file where the home should be is refused."""
    (tmp_path / "f").write_text("x")
    with pytest.raises(BadRequest):
        home_dir(tmp_path / "f")


def test_default_store_lives_in_the_home(tmp_path: Path) -> None:
    """The default store is desk.sqlite3 in the home folder."""
    with default_store(tmp_path / "h") as store:
        assert isinstance(store, SQLiteStore)
        assert store.path == tmp_path / "h" / "desk.sqlite3"
        assert store.list_orders() == []


@pytest.mark.slow
@pytest.mark.spec("SEC-10", "DP-4")
@pytest.mark.parametrize("folder_mode", [None, 0o777])
def test_every_file_the_desk_makes_is_owner_only_under_a_permissive_umask(
        tmp_path: Path, folder_mode: int | None) -> None:
    """Under `umask 000`, with a new home or one open to everyone, `awl` commands that create
    the desk, write to it (so its -wal and -shm exist) and make its signing key leave every
    file 0600 and every folder they make 0700; no file is open to group or others."""
    home = tmp_path / "home"
    if folder_mode is not None:
        home.mkdir()
        home.chmod(folder_mode)
    env = {"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", ""), "AWL_HOME": str(home)}

    def awl(*argv: str) -> None:
        done = subprocess.run([sys.executable, "-m", "awl", *argv], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60,
                              preexec_fn=lambda: os.umask(0))
        assert done.returncode == 0, done.stderr

    awl("order", "create", str(ROOT / "examples" / "order.json"), "--as", "human:ana")
    awl("work", "accept", "wo_offsite_notice", "--as", "agent:clerk")
    awl("pass", "issue", "--order", "wo_offsite_notice", "--to", "agent:clerk")
    with default_store(home) as store:  # a reader holding the desk open keeps -wal and -shm
        store.list_orders()
        awl("work", "start", "wo_offsite_notice", "--as", "agent:clerk")
        files = {p.relative_to(home).as_posix(): stat.S_IMODE(p.stat().st_mode)
                 for p in home.rglob("*")}
    assert {"desk.sqlite3", "desk.sqlite3-wal", "desk.sqlite3-shm", "keys"} <= set(files)
    assert any(name.startswith("keys/") and name.endswith(".pem") for name in files)
    folders = {name for name in files if (home / name).is_dir()}
    assert {name: mode for name, mode in files.items() if name in folders} == {"keys": 0o700}
    assert {name: mode for name, mode in files.items() if name not in folders} == {
        name: 0o600 for name in files if name not in folders}
    if folder_mode is None:
        assert stat.S_IMODE(home.stat().st_mode) == 0o700 and ".gitignore" in files


@pytest.mark.spec("SEC-10")
def test_a_desk_file_left_open_by_an_older_version_is_closed_up(tmp_path: Path) -> None:
    """A desk file made 0644 before this rule is made owner-only when next opened, and so
    are the journals SQLite then makes beside it."""
    path = tmp_path / "desk.sqlite3"
    default_store(tmp_path).close()
    path.chmod(0o644)
    with default_store(tmp_path) as store:
        store.list_orders()
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.glob("desk*")}
    assert modes == {"desk.sqlite3": 0o600, "desk.sqlite3-wal": 0o600,
                     "desk.sqlite3-shm": 0o600, "desk.sqlite3-open": 0o600}


def test_an_empty_home_or_store_url_is_refused_not_taken_for_the_default(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--home ""`` and ``--store ""`` (a variable that is not set, say) are refused: before,
    the first made a desk in the working folder and the second opened the default desk."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AWL_HOME", str(tmp_path / "home"))
    with pytest.raises(BadRequest, match="empty path"):
        home_dir("")
    with pytest.raises(BadRequest, match="empty"):
        default_store(url="")
    with pytest.raises(BadRequest, match="empty path"):
        default_store("")
    assert list(tmp_path.iterdir()) == []


def test_the_cli_refuses_an_empty_home_or_store_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from awl.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AWL_HOME", str(tmp_path / "home"))
    for words in (["--home", ""], ["--store", ""]):
        assert main(["order", "list", *words]) == 1
        err = capsys.readouterr().err
        assert err.startswith("awl: BAD_REQUEST:") and err.count("\n") == 1 and "empty" in err
    assert list(tmp_path.iterdir()) == []
