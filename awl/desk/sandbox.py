"""The sandbox a desk-run check runs in (SPEC SEC-15), built with bubblewrap.

A check runs the worker's code (a module the manager's test imports), so it is treated as
hostile: it gets its own mount, PID, IPC, UTS and network namespaces, sees only the system
folders and the toolchain read-only, a private ``/tmp`` and the one folder it is judged in,
runs as an unprivileged user, under limits, and everything it started dies with it. The desk
reads its exit status from ``bwrap``'s own, which nothing inside can reach.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from awl.documents.errors import BadRequest

__all__ = [
    "CHECK_UID",
    "LIMITS",
    "UNSAFE",
    "Limits",
    "Unavailable",
    "sandbox_argv",
    "sandbox_problem",
    "unsafe_allowed",
]

UNSAFE = "AWL_UNSAFE_UNSANDBOXED_CHECKS"
"""Set to ``1`` to let the desk run checks without a sandbox, with its own authority."""

CHECK_UID = 65534
"""The user (and group) a check runs as when the desk runs as root: ``nobody``."""

SYSTEM_FOLDERS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
                  "/opt")
"""Folders a check sees read-only (those that exist), beside the toolchain."""

EXTRA_MOUNTS = "AWL_CHECK_MOUNTS"
"""Further folders, separated by ``:``, an operator lets checks see read-only."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What one check may use (each a resource limit of every process it starts)."""

    processes: int = 512
    memory: int = 8 * 1024**3
    """Bytes of address space per process."""
    file_size: int = 1024**3
    """Bytes the largest file it writes may have."""
    tmp_size: int = 1024**3
    """Bytes its private ``/tmp`` holds."""


LIMITS = Limits()


class Unavailable(BadRequest):
    """No sandbox can be made here; the message says why and what to do."""


def unsafe_allowed(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the operator opted in to unsandboxed checks (``AWL_UNSAFE_UNSANDBOXED_CHECKS=1``)."""
    return (os.environ if environ is None else environ).get(UNSAFE, "") == "1"


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


@functools.cache
def _probe(bwrap: str, root: bool) -> str | None:
    """None when a sandbox can be made with ``bwrap``, else why not (tried once a process)."""
    argv = _namespaces(bwrap, root, network=False)
    argv += [*_system_mounts(), "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    argv += _as_check_user(root, ["true"])
    try:
        done = subprocess.run(argv, capture_output=True, timeout=30, check=False,
                              stdin=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not start ({exc})"
    if done.returncode != 0:
        why = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"bwrap failed: {why[-1] if why else f'exit {done.returncode}'}"
    return None


def sandbox_problem() -> str | None:
    """None when checks can be sandboxed here, else one line: why not and what to do."""
    if not sys.platform.startswith("linux"):
        return (f"checks are sandboxed only on Linux (this is {sys.platform}); run the desk on "
                f"Linux, or set {UNSAFE}=1 to run checks with the desk's own authority")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return ("bubblewrap (bwrap) is not installed, and a check runs the worker's code: "
                f"apt-get install bubblewrap, or set {UNSAFE}=1 to run checks with the desk's "
                "own authority")
    root = _is_root()
    if root and shutil.which("setpriv") is None:
        return ("setpriv (util-linux) is not installed, so a check cannot drop root: install "
                f"util-linux, or set {UNSAFE}=1 to run checks with the desk's own authority")
    why = _probe(bwrap, root)
    if why is not None:
        hint = ("" if root else " (unprivileged user namespaces may be off: "
                "sysctl kernel.unprivileged_userns_clone=1, or run the desk as root)")
        return (f"the check sandbox cannot be made: {why}{hint}; or set {UNSAFE}=1 to run "
                "checks with the desk's own authority")
    return None


def _namespaces(bwrap: str, root: bool, *, network: bool) -> list[str]:
    argv = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--clearenv"]
    if not network:
        argv.append("--unshare-net")
    if root:
        # bwrap runs as root (no user namespace), so a check can be made a real unprivileged
        # user: files only root may read stay unreadable, and the process limit holds.
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user", "--uid", str(CHECK_UID), "--gid", str(CHECK_UID)]
    return argv


def _as_check_user(root: bool, argv: Sequence[str]) -> list[str]:
    if not root:
        return ["--", *argv]
    return ["--", "setpriv", f"--reuid={CHECK_UID}", f"--regid={CHECK_UID}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--", *argv]


def _system_mounts() -> list[str]:
    argv: list[str] = []
    for folder in SYSTEM_FOLDERS:
        if os.path.islink(folder):
            argv += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            argv += ["--ro-bind", folder, folder]
    return argv


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def toolchain(protected: Iterable[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """Folders beyond the system ones a check sees read-only: this Python's installation (and
    the one its virtual environment is made from), each folder on ``PATH`` (or the
    installation it is the ``bin`` of), and :data:`EXTRA_MOUNTS`; never one holding, or held
    in, a ``protected`` path (the desk's home, the workspace), nor ``/``."""
    environ = os.environ if environ is None else environ
    guarded = [os.path.realpath(p) for p in protected]
    wanted: list[str] = [sys.prefix, sys.base_prefix]
    for entry in environ.get("PATH", "").split(os.pathsep):
        if not os.path.isabs(entry) or not os.path.isdir(entry):
            continue
        real = os.path.realpath(entry)
        parent = os.path.dirname(real)
        if os.path.basename(real) == "bin" and os.path.isdir(os.path.join(parent, "lib")):
            wanted.append(parent)
        wanted.append(real)
    wanted += [p for p in environ.get(EXTRA_MOUNTS, "").split(":") if os.path.isabs(p)]
    kept: list[str] = []
    for path in sorted({os.path.realpath(p) for p in wanted if os.path.isdir(p)}):
        if path == "/" or any(_inside(g, path) or _inside(path, g) for g in guarded):
            continue
        if any(_inside(path, s) for s in SYSTEM_FOLDERS) or any(_inside(path, k) for k in kept):
            continue
        kept.append(path)
    return kept


def _folders_to(path: str, made: set[str]) -> list[str]:
    """``--dir`` options making each missing parent of ``path`` traversable (bwrap would copy
    the host folder's mode, and a 0700 ``/root`` would shut the check out of its Python)."""
    argv: list[str] = []
    parts = Path(path).parts[1:-1]
    for i in range(len(parts)):
        folder = "/" + "/".join(parts[: i + 1])
        if folder in made or any(_inside(folder, s) for s in SYSTEM_FOLDERS):
            continue
        made.add(folder)
        argv += ["--perms", "0755", "--dir", folder]
    return argv


def sandbox_argv(folder: str, target: str, cwd: str, argv: Sequence[str],
                 env: Mapping[str, str], *, network: bool, seconds: float,
                 protected: Iterable[str], limits: Limits = LIMITS) -> list[str]:
    """The command that runs ``argv`` in a sandbox where ``folder`` (the check's own copy of
    the workspace), shown at ``target``, is the only writable place besides a private
    ``/tmp``, with ``cwd`` (a path inside ``target``) its working folder. Raises
    :class:`Unavailable` when no sandbox can be made."""
    why = sandbox_problem()
    if why is not None:
        raise Unavailable(why)
    bwrap = shutil.which("bwrap")
    assert bwrap is not None
    root = _is_root()
    cpu = max(1, int(seconds) + 1)
    out = ["prlimit", f"--nproc={limits.processes}", f"--as={limits.memory}",
           f"--fsize={limits.file_size}", f"--cpu={cpu}", "--core=0", "--"]
    out += _namespaces(bwrap, root, network=network)
    out += _system_mounts()
    # The private /tmp first: a toolchain or workspace under /tmp is mounted over it after.
    out += ["--proc", "/proc", "--dev", "/dev", "--size", str(limits.tmp_size),
            "--tmpfs", "/tmp"]
    made: set[str] = set()
    for path in toolchain((*protected, folder, target)):
        out += [*_folders_to(path, made), "--ro-bind", path, path]
    out += [*_folders_to(target, made), "--bind", folder, target, "--chdir", cwd]
    for name, value in env.items():
        out += ["--setenv", name, value]
    return out + _as_check_user(root, argv)


def prepare_copy(folder: Path) -> None:
    """Hand the check's copy of the workspace to the user the check runs as."""
    if not _is_root():
        return
    os.lchown(folder, CHECK_UID, CHECK_UID)
    for top, dirs, files in os.walk(folder):
        for name in (*dirs, *files):
            os.lchown(os.path.join(top, name), CHECK_UID, CHECK_UID)
