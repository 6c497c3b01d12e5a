"""Running a criterion's check in an order's workspace, and what changed since the start.

The desk calls this module; the documents and checks layer never does (it does no I/O). A
workspace is a folder: the top of a git work tree, or a plain folder in no work tree. Its
snapshot, taken when the order starts, is a git tree object of the whole folder as it was.
In a git work tree that is the commit checked out (``head``) and a tree of the tracked and
untracked files (ignored ones left out), written into the work tree's own object store
through a temporary index, so the worker's own index is left alone. A plain folder is
written the same way into an object store the desk keeps (``snapshots`` under the AWL
home), and every file in it counts. When a check runs, the folder is written the same way
again and the two trees are compared: that is how edits to tests and to the files that
define how checks run are found (the tamper signals).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from awl.desk.home import home_dir

try:
    import fcntl
except ImportError:  # not POSIX: runs in one workspace are not made to take turns
    fcntl = None  # type: ignore[assignment]
from awl.documents.errors import BadRequest
from awl.documents.models import Check, Event

__all__ = [
    "ENV_KEPT",
    "CheckRun",
    "check_question",
    "latest_checks",
    "normalize",
    "run_check",
    "run_checks",
    "take_snapshot",
    "tamper_signals",
    "workspace_root",
]

ENV_KEPT = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT")
"""The only variables of the desk's own environment a check inherits."""

OUTPUT_LIMIT = 64 * 1024
"""Bytes of a check's output the desk keeps (the last ones)."""

TAIL_LINES = 20
"""Lines of output a check record keeps."""

_LINE_LIMIT = 300
_GIT_TIMEOUT = 60.0
_MAX_CHANGED = 2000
_MAX_BLOB = 1024 * 1024


# --------------------------------------------------------------------------- git

# The work tree is the worker's: git reads its config, so git runs with the same minimal
# environment as a check, never the desk's own, and without a file-system monitor program.
_GIT = ("git", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null")

SNAPSHOTS = "snapshots"
"""The folder under the AWL home that keeps the snapshots of plain-folder workspaces."""


@dataclass(frozen=True, slots=True)
class _Tree:
    """A workspace as git sees it: its folder, and the object store of a plain folder's
    snapshots (None for a git work tree, whose own store is used)."""

    root: Path
    objects: Path | None = None

    def git(self, *args: str, env: Mapping[str, str] | None = None,
            check: bool = True, limit: int | None = None) -> str:
        where: tuple[str, ...] = (f"--work-tree={self.root}",)  # never core.worktree's
        if self.objects is not None:
            where = (f"--git-dir={self.objects}", *where)
        else:
            where = (*_neutral_filters(self.root), *where)
        return _git(self.root, *where, *args, env=env, check=check, limit=limit)


# What the worker's own git configuration could otherwise change in what a snapshot sees:
# file modes and symbolic links recorded as they are, no line-ending conversion, no sparse
# checkout, and (see _neutral_filters) no clean filter rewriting a file as it is read.
_AS_IS = ("-c", "core.fileMode=true", "-c", "core.symlinks=true", "-c", "core.autocrlf=false",
          "-c", "core.sparseCheckout=false", "-c", "core.attributesFile=/dev/null")


def _neutral_filters(root: Path) -> tuple[str, ...]:
    """``-c`` options that empty every filter driver the work tree's configuration defines:
    a clean filter would otherwise hand git whatever it likes in place of a file (its
    original text, say), and an edit would not be seen."""
    out = _git(root, "config", "--name-only", "--get-regexp", r"^filter\.", check=False)
    names = {line.rsplit(".", 1)[0] for line in out.splitlines() if line.count(".") >= 2}
    options: list[str] = list(_AS_IS)
    for name in sorted(names):
        options += ["-c", f"{name}.clean=", "-c", f"{name}.process=",
                    "-c", f"{name}.required=false"]
    return tuple(options)


def _git(root: Path, *args: str, env: Mapping[str, str] | None = None,
         check: bool = True, limit: int | None = None) -> str:
    """Run git; with ``limit``, only the first ``limit`` bytes of its output are read (a
    huge file is never read whole into memory) and git is stopped there."""
    base = {name: os.environ[name] for name in ENV_KEPT if name in os.environ}
    command = next((a for a in args if not a.startswith("-") and "=" not in a), args[0])
    try:
        if limit is None:
            done = subprocess.run((*_GIT, *args), cwd=root, capture_output=True,
                                  timeout=_GIT_TIMEOUT,
                                  env={**base, "GIT_CONFIG_NOSYSTEM": "1", **(env or {})},
                                  check=False, stdin=subprocess.DEVNULL)
            returncode, stdout, stderr = done.returncode, done.stdout, done.stderr
        else:
            with subprocess.Popen((*_GIT, *args), cwd=root, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                  env={**base, "GIT_CONFIG_NOSYSTEM": "1", **(env or {})},
                                  ) as process:
                assert process.stdout is not None
                stdout = process.stdout.read(limit)
                process.kill()
                returncode, stderr = process.wait(timeout=_GIT_TIMEOUT), b""
    except FileNotFoundError:
        raise BadRequest("git is not installed; the desk uses it to snapshot a workspace; "
                         "install git") from None
    except subprocess.TimeoutExpired:
        raise BadRequest(f"git {command} in {root} took over {_GIT_TIMEOUT:.0f} s") from None
    if check and returncode != 0:
        why = stderr.decode("utf-8", "replace").strip().splitlines()
        raise BadRequest(f"git {command} failed in {root}: {why[-1] if why else 'no output'}")
    return stdout.decode("utf-8", "replace")


def workspace_root(path: str | os.PathLike[str]) -> Path:
    """``path`` as an absolute workspace folder, or :class:`BadRequest` saying why not.

    A workspace is the top folder of a git work tree or a folder in no work tree; a folder
    inside a work tree but not its top is refused (its snapshot would be ambiguous).
    """
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise BadRequest(f"workspace {path} is not a folder; give the folder the work happens "
                         "in")
    top = _git(root, "rev-parse", "--show-toplevel", check=False).strip()
    if top and Path(top).resolve() != root:
        raise BadRequest(f"workspace {root} is inside the git work tree {top} but not its top "
                         "folder; give the repository's top folder")
    return root


def _is_work_tree(root: Path) -> bool:
    top = _git(root, "rev-parse", "--show-toplevel", check=False).strip()
    return bool(top) and Path(top).resolve() == root


def _snapshot_store() -> Path:
    """The desk's object store for plain-folder snapshots, created on first use."""
    objects = home_dir() / SNAPSHOTS
    if not (objects / "HEAD").is_file():
        _git(home_dir(), "init", "--bare", "-q", str(objects))
    return objects.resolve()


# Byproduct folders (caches, installed packages) never enter a plain folder's snapshot.
_EXCLUDED = ("__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "node_modules",
             ".tox", ".nox")


def _write_tree(tree: _Tree, head: str | None) -> str:
    """The whole folder (for a work tree: tracked and untracked, minus ignored files) as a
    tree object."""
    with tempfile.TemporaryDirectory(prefix="awl-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        if head is not None:
            tree.git("read-tree", head, env=env)
        spec: tuple[str, ...] = ("--", ".")
        if tree.objects is not None:  # every file counts: --force takes ignored ones too
            spec = ("--force", "--", ".",
                    *(f":(exclude,glob)**/{name}/**" for name in _EXCLUDED))
        tree.git("add", "-A", *spec, env=env)
        return tree.git("write-tree", env=env).strip()


def _head(tree: _Tree) -> str | None:
    if tree.objects is not None:
        return None
    head = tree.git("rev-parse", "--verify", "-q", "HEAD", check=False).strip()
    return head or None


def take_snapshot(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The workspace as it is now: ``{"kind": "git", "head": commit, "tree": tree}`` for a
    git work tree, ``{"kind": "folder", "objects": store, "tree": tree}`` for a plain one."""
    root = workspace_root(path)
    if _is_work_tree(root):
        tree = _Tree(root)
        head = _head(tree)
        snapshot: dict[str, Any] = {"kind": "git", "tree": _write_tree(tree, head)}
        if head is not None:
            snapshot["head"] = head
        return snapshot
    tree = _Tree(root, _snapshot_store())
    return {"kind": "folder", "objects": str(tree.objects), "tree": _write_tree(tree, None)}


def _tree_of(root: Path, snapshot: Mapping[str, Any]) -> _Tree:
    """How to read ``root`` against ``snapshot``; BadRequest when the snapshot cannot be."""
    if snapshot.get("kind") == "folder":
        objects = Path(str(snapshot.get("objects", "")))
        if not (objects / "HEAD").is_file():
            raise BadRequest(f"the start snapshot's object store {objects} is gone")
        return _Tree(root, objects)
    return _Tree(root)


def _changes(tree: _Tree, snapshot: Mapping[str, Any]) -> tuple[str, list[tuple[str, str]]]:
    """The tree of the folder now and each ``(status, path)`` changed since the snapshot."""
    now = _write_tree(tree, _head(tree))
    out = tree.git("diff-tree", "-r", "--no-renames", "--name-status", "-z",
                   str(snapshot["tree"]), now)
    parts = [p for p in out.split("\0") if p]
    pairs = [(parts[i], parts[i + 1]) for i in range(0, len(parts) - 1, 2)]
    return now, [p for p in pairs if not _is_byproduct(p[1])]


_BYPRODUCT_FOLDERS = frozenset(_EXCLUDED)


def _is_byproduct(path: str) -> bool:
    """Files a run itself leaves behind (bytecode, caches): never the worker's edits."""
    parts = PurePosixPath(path).parts
    return path.endswith((".pyc", ".pyo")) or any(p in _BYPRODUCT_FOLDERS for p in parts)


def _blob(tree: _Tree, tree_id: str, path: str) -> str:
    return tree.git("cat-file", "-p", f"{tree_id}:{path}", check=False, limit=_MAX_BLOB)


# --------------------------------------------------------------------------- tamper signals

_SKIP_MARKERS = re.compile(
    r"pytest\.mark\.(?:skip|skipif|xfail)\b|pytest\.(?:skip|xfail|importorskip)\s*\("
    r"|unittest\.(?:skip|skipIf|skipUnless|expectedFailure)\b"
    r"|@(?:skip|skipIf|skipUnless|expectedFailure)\b"
    r"|\b(?:it|test|describe|context|suite)\.(?:skip|only|todo|fixme)\s*\("
    r"|\b(?:xit|xtest|xdescribe|fit|fdescribe)\s*\(|\bt\.Skip(?:Now|f)?\s*\(|#\[ignore\]")
_EXEMPTIONS = re.compile(
    r"#\s*noqa\b|#\s*type:\s*ignore\b|#\s*pragma:\s*no\s*cover\b|eslint-disable"
    r"|@ts-(?:ignore|expect-error|nocheck)\b|#\s*pylint:\s*disable\b|#!\[allow\(|#\[allow\(")
_TEST_NAME = re.compile(
    r"^(?:test_.*\.py|.*_test\.py|.*_test\.go|.*\.(?:test|spec)\.[cm]?[jt]sx?|.*Test\.java)$")
_TEST_FOLDERS = frozenset({"test", "tests", "__tests__", "spec", "specs"})
_CONFIG_NAMES = frozenset({
    "pyproject.toml", "setup.cfg", "setup.py", "tox.ini", "pytest.ini", "noxfile.py",
    "conftest.py", ".coveragerc", "mypy.ini", ".mypy.ini", "ruff.toml", ".ruff.toml",
    ".flake8", ".pylintrc", "package.json", "Makefile", "justfile", "Cargo.toml",
    ".pre-commit-config.yaml", ".gitlab-ci.yml", "Jenkinsfile", "azure-pipelines.yml",
    "tsconfig.json", ".eslintrc", ".eslintrc.json", ".eslintrc.js",
})
_CONFIG_PREFIXES = ("jest.config.", "vitest.config.", "eslint.config.", "playwright.config.",
                    "karma.conf.", "mocha")
_CI_FOLDERS = (".github/workflows/", ".circleci/", ".buildkite/")


def _is_test_file(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return bool(_TEST_NAME.match(parts[-1])) or any(p in _TEST_FOLDERS for p in parts[:-1])


def _is_config_file(path: str) -> bool:
    name = PurePosixPath(path).name
    return (name in _CONFIG_NAMES or name.startswith(_CONFIG_PREFIXES)
            or path.startswith(_CI_FOLDERS))


def _named_paths(root: Path, check: Check) -> set[str]:
    """Workspace paths (relative, POSIX) that the check's command names."""
    cwd = root / (check.cwd or ".")
    named: set[str] = set()
    for arg in check.run:
        if arg.startswith("-"):
            if "=" not in arg:
                continue
            arg = arg.split("=", 1)[1]
        arg = arg.split("::", 1)[0]
        if not arg:
            continue
        try:
            target = (cwd / arg).resolve()
            relative = target.relative_to(root)
        except (ValueError, OSError, RuntimeError):  # RuntimeError: a symbolic link loop
            continue
        if str(relative) != ".":
            named.add(relative.as_posix())
    return named


def _verb(status: str) -> str:
    return {"A": "added", "D": "deleted"}.get(status[:1], "edited")


def tamper_signals(path: str | os.PathLike[str], snapshot: Mapping[str, Any],
                   check: Check) -> list[str]:
    """What changed since ``snapshot`` that could make ``check`` pass without the work.

    New skip/only/xfail markers in test files, new lint or type exemptions, deleted or
    edited test files, edits to the files the command names (or under the folders it
    names), and edits to the files that define how checks run (project and CI
    configuration). A new test file is no signal unless it skips.
    """
    root = Path(path).resolve()
    try:
        tree = _tree_of(root, snapshot)
        now, changed = _changes(tree, snapshot)
    except BadRequest as exc:  # a snapshot that cannot be compared is no silent pass
        return [f"the workspace could not be compared with its start snapshot ({exc})"]
    old_tree = str(snapshot["tree"])
    named = _named_paths(root, check)
    signals: list[str] = []
    read = 0
    for status, file in changed:
        verb = _verb(status)
        in_named = file in named or any(file.startswith(n + "/") for n in named)
        # T: the type changed (a file became a symbolic link, say): an edit like any other
        if status.startswith("D") and _is_test_file(file):
            signals.append(f"deleted test file {file}")
        elif file in named:
            signals.append(f"{verb} {file}, which the check's command names")
        elif status.startswith(("D", "M", "T")) and in_named:
            signals.append(f"{verb} {file}, under a folder the check's command names")
        elif status.startswith(("M", "T")) and _is_test_file(file):
            signals.append(f"edited test file {file}")
        if _is_config_file(file):
            signals.append(f"{verb} {file}, which defines how checks run")
        if status.startswith("T"):
            signals.append(f"{file} changed type (a file, a symbolic link or a sub-module)")
        if status.startswith("D"):
            continue
        read += 1
        if read > _MAX_CHANGED:  # names are all judged; only so many files are read
            continue
        new = _blob(tree, now, file)
        old = _blob(tree, old_tree, file) if status.startswith(("M", "T")) else ""
        if _is_test_file(file) and _count(_SKIP_MARKERS, new) > _count(_SKIP_MARKERS, old):
            signals.append(f"new skip, only or xfail marker in {file}")
        if _count(_EXEMPTIONS, new) > _count(_EXEMPTIONS, old):
            signals.append(f"new lint or type exemption in {file}")
    if read > _MAX_CHANGED:
        signals.append(f"{read} files were added or edited; only the first {_MAX_CHANGED} "
                       "were searched for new skip markers and exemptions")
    return list(dict.fromkeys(signals))


def _count(pattern: re.Pattern[str], text: str) -> int:
    return sum(1 for _ in pattern.finditer(text))


# --------------------------------------------------------------------------- running

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
_NUMBER = re.compile(r"0x[0-9a-fA-F]+|\b[0-9a-f]{7,40}\b|\d+(?:\.\d+)?")


def _temp_roots() -> tuple[str, ...]:
    roots = {tempfile.gettempdir(), "/tmp", "/var/folders", "/private/var/folders"}
    return tuple(sorted(roots, key=len, reverse=True))


def normalize(text: str) -> str:
    """``text`` without what differs between two runs of the same failure.

    Colour codes go, paths under a temporary folder become ``<tmp>``, and numbers (counts,
    durations, line numbers, addresses, hashes) become ``N``.
    """
    text = _ANSI.sub("", text)
    for root in _temp_roots():
        text = re.sub(re.escape(root) + r"[^\s'\":]*", "<tmp>", text)
    return _NUMBER.sub("N", text).strip()


@dataclass(frozen=True, slots=True)
class CheckRun:
    """One run of one criterion's check."""

    criterion: str
    exit_code: int | None
    """The command's exit status; None when it did not start or was killed at the timeout."""
    duration: float
    """Seconds it ran."""
    tail: tuple[str, ...]
    """The last lines of its output (stdout and stderr together)."""
    timed_out: bool = False
    error: str | None = None
    """Why it could not run at all (a missing program, a missing folder)."""
    signals: tuple[str, ...] = field(default=())
    """Tamper signals found when it passed."""
    snapshot: Mapping[str, Any] | None = None
    """The snapshot it was compared with."""

    @property
    def outcome(self) -> str:
        """``passed``, ``question`` (passed, with tamper signals), ``failed`` or ``timeout``."""
        if self.timed_out:
            return "timeout"
        if self.exit_code != 0:
            return "failed"
        return "question" if self.signals else "passed"

    @property
    def signature(self) -> str:
        """Tells one failure from another: same signature, same failure (normalized)."""
        head = f"{self.outcome}:{self.exit_code}:{self.error or ''}\n"
        text = head + normalize("\n".join(self.tail))
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def summary(self) -> str:
        """One line saying how it went."""
        if self.error is not None:
            return f"could not run: {self.error}"
        if self.timed_out:
            return f"killed at its timeout after {self.duration:.1f} s"
        status = f"exit {self.exit_code} after {self.duration:.1f} s"
        if self.exit_code is not None and self.exit_code < 0:
            status = f"killed by {_signal_name(-self.exit_code)} after {self.duration:.1f} s"
        if self.signals:
            return f"{status}, but {'; '.join(self.signals)}"
        return status

    def to_json(self) -> dict[str, Any]:
        """The run as desk evidence of type ``check``."""
        body: dict[str, Any] = {
            "outcome": self.outcome, "exit_code": self.exit_code,
            "duration": round(self.duration, 3), "tail": list(self.tail),
            "signature": self.signature, "summary": self.summary(),
        }
        if self.timed_out:
            body["timed_out"] = True
        if self.error is not None:
            body["error"] = self.error
        if self.signals:
            body["signals"] = list(self.signals)
        if self.snapshot is not None:
            body["snapshot"] = dict(self.snapshot)
        return {"criterion": self.criterion, "type": "check", "check": body}

    @classmethod
    def from_json(cls, item: Mapping[str, Any]) -> CheckRun:
        """Read back what :meth:`to_json` wrote."""
        body = item["check"]
        return cls(criterion=str(item["criterion"]), exit_code=body.get("exit_code"),
                   duration=float(body.get("duration", 0.0)),
                   tail=tuple(body.get("tail", ())), timed_out=bool(body.get("timed_out")),
                   error=body.get("error"), signals=tuple(body.get("signals", ())),
                   snapshot=body.get("snapshot"))


def latest_checks(events: Iterable[Event], *,
                  on_report: bool = False) -> dict[str, dict[str, Any]]:
    """The latest recorded run of each criterion's check in an order's log, by criterion.

    With ``on_report``, only runs made on a worker's report count (not a manager's re-run).
    """
    latest: dict[str, dict[str, Any]] = {}
    for event in events:
        if on_report and "by" in (event.data or {}):
            continue
        for item in (event.data or {}).get("checks", ()):
            if (isinstance(item, Mapping) and isinstance(item.get("criterion"), str)
                    and isinstance(item.get("check"), Mapping)):
                latest[item["criterion"]] = dict(item)
    return latest


def check_question(item: Mapping[str, Any]) -> str | None:
    """The question a recorded run puts to the manager (LC-19), or None."""
    body = item["check"]
    if body.get("outcome") != "question":
        return None
    signals = "; ".join(str(s) for s in body.get("signals", ()))
    return (f"the check of criterion {item['criterion']} passed, but since the work started: "
            f"{signals}. Is the pass to be trusted?")


def _environment(check: Check) -> dict[str, str]:
    env = {name: os.environ[name] for name in ENV_KEPT if name in os.environ}
    env.update(check.env or {})
    return env


def _tail(data: bytes) -> tuple[str, ...]:
    lines = data.decode("utf-8", "replace").splitlines()
    return tuple(line[:_LINE_LIMIT] for line in lines[-TAIL_LINES:])


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


# The check runs under this small supervisor (``python -I -S``, so nothing in the workspace
# or the environment changes what it imports). On Linux it makes itself the subreaper of
# everything the check starts, so a daemon that leaves the process group and the session
# (setsid, double fork) is still its descendant; when the check ends, or the desk sends
# SIGTERM at the timeout, it kills every descendant it has and reports on the status pipe:
# ``exit N``, ``signal N``, ``timeout`` or ``error TEXT``, then ``left N``.
_SUPERVISOR = r"""
import os, signal, sys
status, argv = int(sys.argv[1]), sys.argv[2:]
os.set_inheritable(status, False)
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
except Exception:
    pass
class Stop(Exception):
    pass
def stop(*_):
    raise Stop
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(read)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        os.write(write, (exc.strerror or str(exc)).encode("utf-8", "replace")[:500])
    os._exit(127)
os.close(write)
why = b""
while True:
    chunk = os.read(read, 500)
    if not chunk:
        break
    why += chunk
signal.signal(signal.SIGTERM, stop)
me = os.getpid()
def descendants():
    parents = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name, "rb") as f:
                    parents[int(name)] = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    found, todo = [], [me]
    while todo:
        parent = todo.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        found += kids
        todo += kids
    return found
result = ""
try:
    _, code = os.waitpid(pid, 0)
    if os.WIFSIGNALED(code):
        result = "signal %d" % os.WTERMSIG(code)
    else:
        result = "exit %d" % os.WEXITSTATUS(code)
except Stop:
    result = "timeout"
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if why:
    result = "error " + why.decode("utf-8", "replace")
left = set()
for _ in range(200):
    alive = False
    for p in set(descendants()):
        try:
            os.kill(p, signal.SIGKILL)
            alive = True
            if p != pid:
                left.add(p)
        except OSError:
            pass
    while True:
        try:
            done, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if done == 0:
            break
    if not alive:
        break
os.write(status, ("%s\nleft %d\n" % (result, len(left))).encode("utf-8", "replace"))
"""

_GRACE = 5.0
"""Seconds the desk waits for the supervisor to clean up, and for the output to end."""


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def run_check(path: str | os.PathLike[str], criterion: str, check: Check) -> CheckRun:
    """Run ``check`` in the workspace at ``path``: no shell, its own process group (and on
    Linux every process it starts, even one that leaves the group) killed when it ends or at
    the timeout, output bounded to the last :data:`OUTPUT_LIMIT` bytes, and an environment
    of only :data:`ENV_KEPT` plus what the check names."""
    root = Path(path).resolve()
    try:
        cwd = (root / (check.cwd or ".")).resolve()
    except (OSError, RuntimeError) as exc:
        return CheckRun(criterion, None, 0.0, (),
                        error=f"cwd {check.cwd} cannot be resolved ({exc})")
    if cwd != root and root not in cwd.parents:
        return CheckRun(criterion, None, 0.0, (), error=f"cwd {check.cwd} leaves the workspace")
    if not cwd.is_dir():
        return CheckRun(criterion, None, 0.0, (), error=f"cwd {check.cwd} is not a folder")
    started = time.monotonic()
    status_read, status_write = os.pipe()
    try:
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _SUPERVISOR, str(status_write),
             *check.run], cwd=cwd, env=_environment(check), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            pass_fds=(status_write,))
    except OSError as exc:
        os.close(status_read)
        return CheckRun(criterion, None, 0.0, (),
                        error=f"{check.run[0]}: {exc.strerror or exc}")
    finally:
        os.close(status_write)
    assert process.stdout is not None
    kept, timed_out = _collect(process, process.stdout.fileno(), started + check.seconds)
    process.stdout.close()
    with os.fdopen(status_read, "rb") as status_file:
        report = status_file.read(4096).decode("utf-8", "replace").splitlines()
    duration = time.monotonic() - started
    tail = list(_tail(kept))
    ended = report[0] if report else ""
    left = report[1].removeprefix("left ") if len(report) > 1 else "0"
    if left.isdigit() and int(left):
        tail.append(f"[awl: the check left {left} process(es) running; the desk killed them]")
    tail = tail[-TAIL_LINES:]
    if ended.startswith("error "):
        return CheckRun(criterion, None, duration, tuple(tail),
                        error=f"{check.run[0]}: {ended.removeprefix('error ')}")
    if timed_out or ended == "timeout":
        return CheckRun(criterion, None, duration, tuple(tail), timed_out=True)
    code: int | None = process.returncode
    if ended.startswith(("exit ", "signal ")):
        number = int(ended.split()[1])
        code = -number if ended.startswith("signal ") else number
    elif code is not None and code < 0:
        # the supervisor itself was killed (by the check): what the check did is unknown
        return CheckRun(criterion, None, duration, tuple(tail),
                        error=f"its supervisor was killed by {_signal_name(-code)}; "
                              "the check's own exit is unknown")
    return CheckRun(criterion, code, duration, tuple(tail))


def _collect(process: subprocess.Popen[bytes], fd: int,
             deadline: float) -> tuple[bytes, bool]:
    """Read the output until the process ends (asking it to stop at ``deadline``) and the
    output closes; the last :data:`OUTPUT_LIMIT` bytes, and whether the deadline came.
    Whatever is still running afterwards in its group is killed, and output still held open
    by an escaped process is abandoned after :data:`_GRACE` seconds, never waited for."""
    kept: deque[bytes] = deque()
    size = 0
    timed_out = False
    stop_at: float | None = None  # when waiting for the supervisor and the output ends
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        open_ = True
        while True:
            now = time.monotonic()
            if process.poll() is not None:
                _kill_group(process.pid)  # also whatever it left running in its group
                if stop_at is None:
                    stop_at = now + _GRACE
            elif now >= deadline and not timed_out:
                timed_out = True
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)  # the supervisor kills the tree
                stop_at = now + _GRACE
            if not open_ and process.returncode is not None:
                break
            if stop_at is not None and now >= stop_at:
                _kill_group(process.pid)
                break
            wait = 0.05 if process.returncode is None else 0.2
            if not open_:
                time.sleep(wait)
                continue
            if not selector.select(timeout=wait):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                open_ = False
                continue
            kept.append(chunk)
            size += len(chunk)
            while size - len(kept[0]) >= OUTPUT_LIMIT:
                size -= len(kept.popleft())
    process.wait()
    return b"".join(kept)[-OUTPUT_LIMIT:], timed_out


def run_checks(path: str | os.PathLike[str], checks: Sequence[tuple[str, Check]],
               snapshot: Mapping[str, Any] | None) -> Iterator[CheckRun]:
    """Run each ``(criterion, check)``; a passing run is compared with ``snapshot``.

    ``path`` is the workspace as the desk resolved it when the order was created: when it
    resolves elsewhere now (the folder was swapped for a symbolic link), nothing runs there.
    """
    real = os.path.realpath(path)
    moved = real != os.path.abspath(path)
    with _workspace_lock(real):
        yield from _run_each(path, real, moved, checks, snapshot)


CHECKS_LOCKS = "checks"
"""The folder under the AWL home holding one lock file per workspace checks run in."""


@contextlib.contextmanager
def _workspace_lock(real: str) -> Iterator[None]:
    """Hold the workspace's check lock (an ``flock`` under the AWL home, let go when this
    process ends, however it ends): runs in one workspace take turns. Two at once (the
    worker's report and the manager's re-run) would disturb each other's output and fail
    spuriously, and the same spurious failure twice blocks the order."""
    if fcntl is None:
        yield
        return
    folder = home_dir() / CHECKS_LOCKS
    folder.mkdir(mode=0o700, exist_ok=True)
    name = hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    fd = os.open(folder / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the other run ends: each check has a timeout
        yield
    finally:
        os.close(fd)  # lets go of the lock


def _run_each(path: str | os.PathLike[str], real: str, moved: bool,
              checks: Sequence[tuple[str, Check]],
              snapshot: Mapping[str, Any] | None) -> Iterator[CheckRun]:
    """:func:`run_checks` under its workspace's lock."""
    for criterion, check in checks:
        if moved:
            yield CheckRun(criterion, None, 0.0, (), snapshot=snapshot,
                           error=f"the workspace {path} is now a symbolic link to {real}; "
                                 "checks run only in the folder the order was created with")
            continue
        run = run_check(path, criterion, check)
        signals: tuple[str, ...] = ()
        if run.outcome == "passed" and snapshot is not None:
            signals = tuple(tamper_signals(path, snapshot, check))
        yield CheckRun(run.criterion, run.exit_code, run.duration, run.tail,
                       timed_out=run.timed_out, error=run.error, signals=signals,
                       snapshot=snapshot)
