"""Running a criterion's check, and what changed in the workspace since the order started.

The desk calls this module; the documents and checks layer never does (it does no I/O). A
workspace is a folder: the top of a git work tree, or a plain folder in no work tree. Its
snapshot is a git tree object of the folder's files, written into an object store the desk
keeps (``snapshots`` under the AWL home), never into the worker's repository, whose objects,
refs and configuration the worker controls (LC-17). When the worker reports, the folder is
snapshotted again before anything runs; the tamper signals come from comparing the two trees
(LC-19), and each check runs in the sandbox (awl.desk.sandbox, SEC-15) on a fresh copy made
from the reported tree, so what is judged is exactly what was compared (LC-18).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import re
import selectors
import shutil
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

from awl.desk import sandbox
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
    "checks_refused",
    "latest_checks",
    "normalize",
    "run_check",
    "run_checks",
    "take_snapshot",
    "tamper_signals",
    "workspace_root",
]

ENV_KEPT = ("PATH", "LANG", "LC_ALL", "SYSTEMROOT")
"""The only variables of the desk's own environment a check inherits (``HOME`` and
``TMPDIR`` are the sandbox's private ``/tmp``)."""

OUTPUT_LIMIT = 64 * 1024
"""Bytes of a check's output the desk keeps (the last ones)."""

TAIL_LINES = 20
"""Lines of output a check record keeps."""

_LINE_LIMIT = 300
_GIT_TIMEOUT = 60.0
_MAX_CHANGED = 2000
_MAX_BLOB = 1024 * 1024


# --------------------------------------------------------------------------- git

# Every git command here runs with the desk's own object store (--git-dir) and the
# workspace only as the files to read (--work-tree): the worker's repository (its objects,
# replace refs, grafts, alternates, hooks, filters, configuration) is never consulted, and
# neither are the system's and the user's git configuration.
_GIT = ("git", "--no-replace-objects", "-c", "core.fsmonitor=false",
        "-c", "core.hooksPath=/dev/null", "-c", "core.fileMode=true", "-c", "core.symlinks=true",
        "-c", "core.autocrlf=false", "-c", "core.sparseCheckout=false",
        "-c", "core.attributesFile=/dev/null", "-c", "core.excludesFile=/dev/null",
        "-c", "core.untrackedCache=false", "-c", "core.splitIndex=false",
        "-c", "index.sparse=false", "-c", "gc.auto=0")
_GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_NO_REPLACE_OBJECTS": "1", "GIT_ATTR_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0",
            "GIT_OPTIONAL_LOCKS": "0"}

SNAPSHOTS = "snapshots"
"""The folder under the AWL home that keeps the workspaces' snapshots."""


@dataclass(frozen=True, slots=True)
class _Tree:
    """A workspace as the desk's object store sees it: its folder, and the store."""

    root: Path
    objects: Path

    def git(self, *args: str, env: Mapping[str, str] | None = None,
            check: bool = True, limit: int | None = None) -> str:
        return _git(self.root, f"--git-dir={self.objects}", f"--work-tree={self.root}", *args,
                    env=env, check=check, limit=limit)


def _git(root: Path, *args: str, env: Mapping[str, str] | None = None,
         check: bool = True, limit: int | None = None) -> str:
    """Run git; with ``limit``, only the first ``limit`` bytes of its output are read (a
    huge file is never read whole into memory) and git is stopped there."""
    base = {name: os.environ[name] for name in ("PATH", "LANG", "LC_ALL") if name in os.environ}
    full = {**base, **_GIT_ENV, **(env or {})}
    command = next((a for a in args if not a.startswith("-") and "=" not in a), args[0])
    try:
        if limit is None:
            done = subprocess.run((*_GIT, *args), cwd=root, capture_output=True,
                                  timeout=_GIT_TIMEOUT, env=full, check=False,
                                  stdin=subprocess.DEVNULL)
            returncode, stdout, stderr = done.returncode, done.stdout, done.stderr
        else:
            with subprocess.Popen((*_GIT, *args), cwd=root, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                  env=full) as process:
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


def _top_level(root: Path) -> str:
    """The top of the git work tree ``root`` is in ("" for none): the nearest folder, from
    ``root`` up, holding a ``.git``. Found from the files alone, so no setting of the
    worker's repository (``core.worktree``, say) can move it."""
    for folder in (root, *root.parents):
        if os.path.lexists(folder / ".git"):
            return str(folder)
    return ""


def workspace_root(path: str | os.PathLike[str]) -> Path:
    """``path`` as an absolute workspace folder, or :class:`BadRequest` saying why not.

    A workspace is the top folder of a git work tree or a folder in no work tree; a folder
    inside a work tree but not its top is refused (its snapshot would be ambiguous).
    """
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise BadRequest(f"workspace {path} is not a folder; give the folder the work happens "
                         "in")
    top = _top_level(root)
    if top and Path(top).resolve() != root:
        raise BadRequest(f"workspace {root} is inside the git work tree {top} but not its top "
                         "folder; give the repository's top folder")
    return root


def _snapshot_store() -> Path:
    """The desk's object store for snapshots, created on first use."""
    objects = home_dir() / SNAPSHOTS
    if not (objects / "HEAD").is_file():
        _git(home_dir(), "init", "--bare", "-q", str(objects))
    return objects.resolve()


# Byproduct folders (caches, installed packages) never enter a plain folder's snapshot.
_EXCLUDED = ("__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "node_modules",
             ".tox", ".nox")


def _write_tree(tree: _Tree, *, every_file: bool) -> str:
    """The folder's files as a tree object in the desk's store: for a git work tree those
    its ``.gitignore`` files do not ignore, for a plain folder every file (bar byproduct
    folders). The ``.git`` folder is never part of it."""
    with tempfile.TemporaryDirectory(prefix="awl-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        spec: tuple[str, ...] = ("--", ".")
        if every_file:  # --force takes ignored ones too
            spec = ("--force", "--", ".",
                    *(f":(exclude,glob)**/{name}/**" for name in _EXCLUDED))
        tree.git("add", "-A", *spec, env=env)
        return tree.git("write-tree", env=env).strip()


def take_snapshot(path: str | os.PathLike[str], kind: str | None = None) -> dict[str, Any]:
    """The workspace as it is now, in the desk's object store: ``{"kind": "git", "head":
    commit, "tree": tree, "objects": store}`` for a git work tree (``head`` as the worker's
    repository names it, for the reader only), ``{"kind": "folder", "tree": tree,
    "objects": store}`` for a plain folder. ``kind`` keeps the start snapshot's kind when
    the workspace is snapshotted again (a worker's ``git init`` changes nothing)."""
    root = workspace_root(path)
    tree = _Tree(root, _snapshot_store())
    if kind is None:
        kind = "git" if _top_level(root) else "folder"
    if kind == "git":
        snapshot: dict[str, Any] = {"kind": "git",
                                    "tree": _write_tree(tree, every_file=False),
                                    "objects": str(tree.objects)}
        head = _git(root, "rev-parse", "--verify", "-q", "HEAD", check=False).strip()
        if re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", head):
            snapshot["head"] = head
        return snapshot
    return {"kind": "folder", "objects": str(tree.objects),
            "tree": _write_tree(tree, every_file=True)}


def _tree_of(root: Path, snapshot: Mapping[str, Any]) -> _Tree:
    """How to read ``root`` against ``snapshot``; BadRequest when the snapshot cannot be."""
    if "objects" not in snapshot:
        raise BadRequest("the start snapshot was kept in the workspace's own repository (by an "
                         "older desk), which the worker can rewrite")
    objects = Path(str(snapshot.get("objects", "")))
    if not (objects / "HEAD").is_file():
        raise BadRequest(f"the start snapshot's object store {objects} is gone")
    return _Tree(root, objects)


def _diff(tree: _Tree, old: str, now: str) -> list[tuple[str, str]]:
    """Each ``(status, path)`` changed from tree ``old`` to tree ``now``."""
    out = tree.git("diff-tree", "-r", "--no-renames", "--name-status", "-z", old, now)
    parts = [p for p in out.split("\0") if p]
    pairs = [(parts[i], parts[i + 1]) for i in range(0, len(parts) - 1, 2)]
    return [p for p in pairs if not _is_byproduct(p[1])]


_BYPRODUCT_FOLDERS = frozenset(_EXCLUDED)


def _is_byproduct(path: str) -> bool:
    """Files a run itself leaves behind (bytecode, caches): never the worker's edits."""
    parts = PurePosixPath(path).parts
    return path.endswith((".pyc", ".pyo")) or any(p in _BYPRODUCT_FOLDERS for p in parts)


def _blob(tree: _Tree, tree_id: str, path: str) -> str:
    return tree.git("cat-file", "-p", f"{tree_id}:{path}", check=False, limit=_MAX_BLOB)


def _materialize(snapshot: Mapping[str, Any], folder: Path) -> None:
    """Write the files of ``snapshot``'s tree into the empty ``folder``."""
    tree = _Tree(folder, Path(str(snapshot["objects"])))
    with tempfile.TemporaryDirectory(prefix="awl-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        tree.git("read-tree", str(snapshot["tree"]), env=env)
        tree.git("checkout-index", "-a", "-f", env=env)


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
# A worker's module imported by the manager's test runs inside the test process: it can end
# that process early with exit status 0 (os._exit(0) at import) or kill what runs it.
_PROCESS_ENDING = re.compile(
    r"\b_exit\s*\(|\b(?:os|posix|nt)\s*\.\s*(?:kill|killpg|abort|exec[lv]p?e?)\b"
    r"|\bsignal\s*\.\s*(?:pthread_kill|raise_signal)\b|\bctypes\b"
    r"|\bprocess\s*\.\s*(?:exit|kill|abort|reallyExit)\s*\(")
_TEST_NAME = re.compile(
    r"^(?:test_.*\.py|.*_test\.py|.*_test\.go|.*\.(?:test|spec)\.[cm]?[jt]sx?|.*Test\.java)$")
_TEST_FOLDERS = frozenset({"test", "tests", "__tests__", "spec", "specs"})
_CONFIG_NAMES = frozenset({
    "pyproject.toml", "setup.cfg", "setup.py", "tox.ini", "pytest.ini", "noxfile.py",
    "conftest.py", ".coveragerc", "mypy.ini", ".mypy.ini", "ruff.toml", ".ruff.toml",
    ".flake8", ".pylintrc", "package.json", "Makefile", "justfile", "Cargo.toml",
    ".pre-commit-config.yaml", ".gitattributes", ".gitlab-ci.yml", "Jenkinsfile",
    "azure-pipelines.yml",
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
                   check: Check, now: Mapping[str, Any] | None = None) -> list[str]:
    """What changed from ``snapshot`` to ``now`` (the workspace as it is, when not given)
    that could make ``check`` pass without the work.

    New skip/only/xfail markers in test files, new lint or type exemptions, new calls that
    end or signal a process (a worker's module can end the test run early, exit 0), deleted
    or edited test files, edits to the files the command names (or under the folders it
    names), and edits to the files that define how checks run (project, CI and git
    attribute configuration). A new test file is no signal unless it skips.
    """
    root = Path(path).resolve()
    try:
        tree = _tree_of(root, snapshot)
        if now is None:
            now = take_snapshot(root, kind=str(snapshot.get("kind", "git")))
        if Path(str(now.get("objects", ""))) != tree.objects:
            raise BadRequest("the two snapshots are in different object stores")
        changed = _diff(tree, str(snapshot["tree"]), str(now["tree"]))
    except BadRequest as exc:  # a snapshot that cannot be compared is no silent pass
        return [f"the workspace could not be compared with its start snapshot ({exc})"]
    old_tree, now_tree = str(snapshot["tree"]), str(now["tree"])
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
        new = _blob(tree, now_tree, file)
        old = _blob(tree, old_tree, file) if status.startswith(("M", "T")) else ""
        if _is_test_file(file) and _count(_SKIP_MARKERS, new) > _count(_SKIP_MARKERS, old):
            signals.append(f"new skip, only or xfail marker in {file}")
        if _count(_EXEMPTIONS, new) > _count(_EXEMPTIONS, old):
            signals.append(f"new lint or type exemption in {file}")
        if _count(_PROCESS_ENDING, new) > _count(_PROCESS_ENDING, old):
            signals.append(f"new call that ends or signals a process in {file}")
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
    judged: str | None = None
    """The tree of the reported snapshot it ran on (and was compared as)."""
    sandboxed: bool = True
    """False when it ran without a sandbox (the operator's AWL_UNSAFE_UNSANDBOXED_CHECKS)."""

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
        if self.sandboxed and self.exit_code is not None and self.exit_code > 128:
            status = (f"exit {self.exit_code} (as when killed by "
                      f"{_signal_name(self.exit_code - 128)}) after {self.duration:.1f} s")
        if self.exit_code is not None and self.exit_code < 0:
            status = f"killed by {_signal_name(-self.exit_code)} after {self.duration:.1f} s"
        if not self.sandboxed:
            status += ", without a sandbox"
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
        if self.judged is not None:
            body["judged"] = self.judged
        if not self.sandboxed:
            body["unsandboxed"] = True
        return {"criterion": self.criterion, "type": "check", "check": body}

    @classmethod
    def from_json(cls, item: Mapping[str, Any]) -> CheckRun:
        """Read back what :meth:`to_json` wrote."""
        body = item["check"]
        return cls(criterion=str(item["criterion"]), exit_code=body.get("exit_code"),
                   duration=float(body.get("duration", 0.0)),
                   tail=tuple(body.get("tail", ())), timed_out=bool(body.get("timed_out")),
                   error=body.get("error"), signals=tuple(body.get("signals", ())),
                   snapshot=body.get("snapshot"), judged=body.get("judged"),
                   sandboxed=not body.get("unsandboxed"))


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
    env.update({"HOME": "/tmp", "TMPDIR": "/tmp"})
    env.update(check.env or {})
    return env


def _tail(data: bytes) -> tuple[str, ...]:
    lines = data.decode("utf-8", "replace").splitlines()
    return tuple(line[:_LINE_LIMIT] for line in lines[-TAIL_LINES:])


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


_SUPERVISOR = Path(__file__).with_name("_supervise.py")
"""The supervisor of an unsandboxed check (only with ``AWL_UNSAFE_UNSANDBOXED_CHECKS=1``)."""

_GRACE = 5.0
"""Seconds the desk waits for the check's processes to end, and for the output to end."""


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def checks_refused() -> str | None:
    """Why the desk refuses to run checks here (no sandbox can be made and the operator did
    not opt in to unsandboxed ones), or None (SEC-15)."""
    if sandbox.unsafe_allowed():
        return None
    why = sandbox.sandbox_problem()
    return None if why is None else f"the desk runs no check here: {why}"


def run_check(path: str | os.PathLike[str], criterion: str, check: Check, *,
              mount_at: str | os.PathLike[str] | None = None,
              protected: Iterable[str] = ()) -> CheckRun:
    """Run ``check`` in the folder ``path``, in the sandbox (SEC-15): no shell, output
    bounded to the last :data:`OUTPUT_LIMIT` bytes, an environment of only :data:`ENV_KEPT`
    plus what the check names, every process it started gone when it ends or at its
    timeout. The sandbox shows the folder at ``mount_at`` (default: where it is), and
    nothing of ``protected`` (the desk's home is always protected). With
    ``AWL_UNSAFE_UNSANDBOXED_CHECKS=1`` and no sandbox to be had, it runs unsandboxed under
    a supervisor, and the run says so."""
    root = Path(path).resolve()
    target = Path(mount_at).resolve() if mount_at is not None else root
    try:
        cwd = (root / (check.cwd or ".")).resolve()
    except (OSError, RuntimeError) as exc:
        return CheckRun(criterion, None, 0.0, (),
                        error=f"cwd {check.cwd} cannot be resolved ({exc})")
    if cwd != root and root not in cwd.parents:
        return CheckRun(criterion, None, 0.0, (), error=f"cwd {check.cwd} leaves the workspace")
    if not cwd.is_dir():
        return CheckRun(criterion, None, 0.0, (), error=f"cwd {check.cwd} is not a folder")
    why = sandbox.sandbox_problem()
    if why is None:
        inner = target / cwd.relative_to(root)
        try:
            argv = sandbox.sandbox_argv(
                str(root), str(target), str(inner), check.run, _environment(check),
                network=check.network is True, seconds=check.seconds,
                protected=(str(home_dir()), *protected))
        except sandbox.Unavailable as exc:
            return CheckRun(criterion, None, 0.0, (), error=str(exc))
        return _run_sandboxed(argv, criterion, check)
    if not sandbox.unsafe_allowed():
        return CheckRun(criterion, None, 0.0, (), error=f"the desk runs no check here: {why}")
    return _run_supervised(cwd, criterion, check)


def _run_sandboxed(argv: Sequence[str], criterion: str, check: Check) -> CheckRun:
    """Run the sandbox's command; its exit status is ``bwrap``'s own, which the check cannot
    reach, and when ``bwrap`` ends (or is killed at the timeout) the kernel ends every
    process left in the check's PID namespace."""
    started = time.monotonic()
    try:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, start_new_session=True,
                                   env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    except OSError as exc:
        return CheckRun(criterion, None, 0.0, (), error=f"{argv[0]}: {exc.strerror or exc}")
    assert process.stdout is not None
    kept, timed_out = _collect(process, process.stdout.fileno(), started + check.seconds,
                               signal.SIGKILL)
    process.stdout.close()
    duration = time.monotonic() - started
    tail = _tail(kept)
    if timed_out:
        return CheckRun(criterion, None, duration, tail, timed_out=True)
    code = process.returncode
    missing = _NOT_STARTED.match(tail[-1]) if code == 127 and tail else None
    if missing is not None:
        return CheckRun(criterion, None, duration, tail[:-1],
                        error=f"{check.run[0]}: {missing.group(1)}")
    return CheckRun(criterion, code, duration, tail)


# What bwrap (or setpriv, as root) says when the check's program cannot be started.
_NOT_STARTED = re.compile(r"^(?:bwrap: execvp|setpriv: failed to execute) .*: ([^:]+)$")


def _run_supervised(cwd: Path, criterion: str, check: Check) -> CheckRun:
    """The unsandboxed run, under the supervisor (only on the operator's explicit opt-in)."""
    started = time.monotonic()
    status_read, status_write = os.pipe()
    try:
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", str(_SUPERVISOR), str(status_write), *check.run],
            cwd=cwd, env=_environment(check), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            pass_fds=(status_write,))
    except OSError as exc:
        os.close(status_read)
        return CheckRun(criterion, None, 0.0, (), sandboxed=False,
                        error=f"{check.run[0]}: {exc.strerror or exc}")
    finally:
        os.close(status_write)
    assert process.stdout is not None
    kept, timed_out = _collect(process, process.stdout.fileno(), started + check.seconds,
                               signal.SIGTERM)
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
        return CheckRun(criterion, None, duration, tuple(tail), sandboxed=False,
                        error=f"{check.run[0]}: {ended.removeprefix('error ')}")
    if timed_out or ended == "timeout":
        return CheckRun(criterion, None, duration, tuple(tail), timed_out=True,
                        sandboxed=False)
    code: int | None = process.returncode
    if ended.startswith(("exit ", "signal ")):
        number = int(ended.split()[1])
        code = -number if ended.startswith("signal ") else number
    elif code is not None and code < 0:
        return CheckRun(criterion, None, duration, tuple(tail), sandboxed=False,
                        error=f"its supervisor was killed by {_signal_name(-code)}; "
                              "the check's own exit is unknown")
    return CheckRun(criterion, code, duration, tuple(tail), sandboxed=False)


def _collect(process: subprocess.Popen[bytes], fd: int, deadline: float,
             stop: signal.Signals) -> tuple[bytes, bool]:
    """Read the output until the process ends (sent ``stop`` at ``deadline``) and the
    output closes; the last :data:`OUTPUT_LIMIT` bytes, and whether the deadline came.
    Whatever is still running afterwards in its group is killed, and output still held open
    by an escaped process is abandoned after :data:`_GRACE` seconds, never waited for."""
    kept: deque[bytes] = deque()
    size = 0
    timed_out = False
    stop_at: float | None = None  # when waiting for the process and the output ends
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
                    process.send_signal(stop)
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


# pytest's closing line ("3 passed in 0.05s", "== 1 passed, 2 warnings in 0.1s =="), or
# under -qq, where there is none, the end of its progress line ("...   [100%]").
_PYTEST_CLOSING = re.compile(
    r"^=*\s*(?:\d+ \w+(?:, \d+ \w+)*|no tests ran) in [\d.]+s\b|.*\[100%\]$")


def _runner_signals(check: Check, tail: Sequence[str]) -> list[str]:
    """Signals a passing run's own output gives: pytest that exited 0 without its closing
    line ended early (a worker's module calling ``os._exit(0)`` at import, say)."""
    names = [PurePosixPath(a).name for a in check.run]
    runs_pytest = any(n.startswith(("pytest", "py.test")) for n in names[:1]) or any(
        a == "-m" and b == "pytest" for a, b in itertools.pairwise(check.run))
    if runs_pytest and not any(_PYTEST_CLOSING.match(_ANSI.sub("", line).strip())
                               for line in tail):
        return ["pytest exited 0 without finishing its run (no closing line, no progress "
                "to 100%): something ended it early"]
    return []


def run_checks(path: str | os.PathLike[str], checks: Sequence[tuple[str, Check]],
               snapshot: Mapping[str, Any] | None) -> Iterator[CheckRun]:
    """Judge the workspace as it is reported: snapshot it, then for each ``(criterion,
    check)`` compare that snapshot with ``snapshot`` (the start's) before anything runs, and
    run the check in the sandbox on a fresh copy made from the reported snapshot (LC-18).

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


@contextlib.contextmanager
def _copy_of(reported: Mapping[str, Any]) -> Iterator[Path]:
    """A fresh folder holding the reported snapshot's files, handed to the check's user,
    removed afterwards whatever the check left in it."""
    holder = Path(tempfile.mkdtemp(prefix="awl-check-"))
    try:
        folder = holder / "workspace"
        folder.mkdir()
        _materialize(reported, folder)
        sandbox.prepare_copy(folder)
        yield folder
    finally:
        for top, dirs, _files in os.walk(holder):  # folders a check made unwritable
            for name in dirs:
                with contextlib.suppress(OSError):
                    os.chmod(os.path.join(top, name), 0o700, follow_symlinks=False)
        shutil.rmtree(holder, ignore_errors=True)


def _run_each(path: str | os.PathLike[str], real: str, moved: bool,
              checks: Sequence[tuple[str, Check]],
              snapshot: Mapping[str, Any] | None) -> Iterator[CheckRun]:
    """:func:`run_checks` under its workspace's lock."""
    if moved:
        for criterion, _check in checks:
            yield CheckRun(criterion, None, 0.0, (), snapshot=snapshot,
                           error=f"the workspace {path} is now a symbolic link to {real}; "
                                 "checks run only in the folder the order was created with")
        return
    try:
        kind = str(snapshot.get("kind", "git")) if snapshot is not None else None
        reported = take_snapshot(real, kind=kind)
    except BadRequest as exc:
        for criterion, _check in checks:
            yield CheckRun(criterion, None, 0.0, (), snapshot=snapshot,
                           error=f"the workspace could not be snapshotted ({exc})")
        return
    for criterion, check in checks:
        signals = (tuple(tamper_signals(real, snapshot, check, reported))
                   if snapshot is not None else ())
        try:
            with _copy_of(reported) as copy:
                run = run_check(copy, criterion, check, mount_at=real, protected=(real,))
        except (BadRequest, OSError) as exc:
            run = CheckRun(criterion, None, 0.0, (), error=f"the workspace's copy could not "
                                                           f"be made ({exc})")
        if run.outcome == "passed":
            signals += tuple(_runner_signals(check, run.tail))
        yield CheckRun(run.criterion, run.exit_code, run.duration, run.tail,
                       timed_out=run.timed_out, error=run.error,
                       signals=signals if run.outcome == "passed" else (),
                       snapshot=snapshot, judged=str(reported["tree"]),
                       sandboxed=run.sandboxed)
