"""Running a test's child process as another OS user, with a Python that user can reach.

CI runs as root in a clone that may sit in a folder only root can enter (root's home, a
``mktemp -d``), and the interpreter itself may live under root's home (pyenv): a child
started as another user with the clone's own ``.venv/bin/python`` cannot even start. So:

- :func:`other_user` makes (once, idempotently) the system user ``awl-worker`` and gives
  its ids; without root the test is skipped on a developer's machine and fails under
  ``CI=true`` (:func:`tests.service_support.unavailable`).
- :func:`reachable_python` builds, in a fresh folder every user may enter, a Python that
  user can run: the packages of this test's own environment (hard links where the file
  system allows, else copies) and this checkout's ``awl`` and ``gateway``, on an
  interpreter of the same version that the user can execute (this one's base interpreter,
  the system's, or a linked copy of the base installation). Only files are shared, each
  read-only to the user, so nothing the user runs can change this environment.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.service_support import unavailable

ROOT = Path(__file__).resolve().parent.parent
USER = "awl-worker"


@dataclass(frozen=True)
class OtherUser:
    """A user of this machine other than the one running the tests."""

    name: str
    uid: int
    gid: int

    def run(self, args: Sequence[str], *, env: Mapping[str, str], cwd: Path,
            timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """Run ``args`` as this user (its own uid and group, no other groups)."""
        return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, cwd=cwd, env=dict(env),
                              user=self.uid, group=self.gid, extra_groups=[])


def other_user() -> OtherUser:
    """The user ``awl-worker``, made if missing (root only)."""
    if os.geteuid() != 0:
        unavailable("running a process as another OS user needs root (CI runs as root)")
    try:
        found = pwd.getpwnam(USER)
    except KeyError:
        done = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home",
                               "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin",
                               USER], capture_output=True, text=True, timeout=60, check=False)
        try:  # another test process may have made it meanwhile
            found = pwd.getpwnam(USER)
        except KeyError:
            raise AssertionError(f"useradd {USER} failed: {done.stderr.strip()}") from None
    return OtherUser(USER, found.pw_uid, found.pw_gid)


def reachable_folder(prefix: str) -> Path:
    """A fresh folder under the system's temporary folder that every user may enter."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    folder.chmod(0o755)
    return folder


@dataclass(frozen=True)
class ReachablePython:
    """An interpreter command and the environment a user needs to run this checkout."""

    command: tuple[str, ...]
    env: dict[str, str]


def _link_or_copy(source: str, target: str) -> None:
    """A hard link to a file others may read already (its mode is never changed here),
    else a copy made readable."""
    if os.stat(source).st_mode & 0o004:
        try:
            os.link(source, target)
            return
        except OSError:
            pass
    shutil.copy2(source, target)
    os.chmod(target, os.stat(target).st_mode | 0o444)


def _open_folders(top: Path) -> None:
    """Every folder under ``top`` (made here) enterable and readable by all."""
    for item in (top, *top.rglob("*")):
        if item.is_dir() and not item.is_symlink():
            item.chmod(0o755)


def _copy_tree(source: Path, target: Path) -> None:
    shutil.copytree(source, target, symlinks=True, copy_function=_link_or_copy,
                    ignore=shutil.ignore_patterns("__editable__*", "*.pth"),
                    dirs_exist_ok=True)


def reachable_python(user: OtherUser, folder: Path) -> ReachablePython:
    """A Python ``user`` can run with this environment's packages and this checkout's
    ``awl`` and ``gateway``, laid out in ``folder`` (which every user may enter)."""
    site = folder / "site"
    _copy_tree(Path(sysconfig.get_paths()["purelib"]), site)
    for package in ("awl", "gateway"):
        shutil.copytree(ROOT / package, site / package, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    _open_folders(folder)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    env = {"PYTHONPATH": str(site), "PATH": "/usr/local/bin:/usr/bin:/bin",
           "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    base = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    candidates = [str(base), *(found for found in (shutil.which(version, path=p) for p in (
        "/usr/local/bin", "/usr/bin")) if found)]
    for candidate in candidates:
        if _runs(user, candidate, env, folder):
            return ReachablePython((candidate, "-s"), env)
    # No interpreter of this version the user can execute: a linked copy of the base
    # installation, its shared library found beside it.
    prefix = folder / "prefix"
    _copy_tree(Path(sys.base_prefix), prefix)
    _open_folders(prefix)
    env["LD_LIBRARY_PATH"] = str(prefix / "lib")
    candidate = str(prefix / "bin" / version)
    assert _runs(user, candidate, env, folder), f"{user.name} cannot run {candidate}"
    return ReachablePython((candidate, "-s"), env)


def _runs(user: OtherUser, python: str, env: Mapping[str, str], cwd: Path) -> bool:
    """Whether ``user`` can run ``python`` and import the bridge and the MCP SDK with it."""
    try:
        done = user.run([python, "-s", "-c", "import awl.mcp.bridge, mcp; print('ok')"],
                        env=env, cwd=cwd, timeout=60)
    except OSError:
        return False
    return done.returncode == 0 and done.stdout.strip() == "ok"
