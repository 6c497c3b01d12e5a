"""The home folder and the default store."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from awl._errors import BadRequest
from awl._home import default_store, home_dir


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
        assert store.path == tmp_path / "h" / "desk.sqlite3"
        assert store.list_orders() == []
