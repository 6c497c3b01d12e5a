"""Fuzz: the ``awl`` command's arguments, files and stdin (SEC-4, DOC-13, DOC-17).

Each input runs ``awl.cli.main`` in process on a real SQLite desk with orders in several
states: it returns an exit code (or argparse exits with its usage line), and nothing on stderr
is a traceback. Commands that serve or wait (``serve``, ``gateway`` without ``--commit``,
``effects retry``) are left out; ``order follow`` always gets a short ``--timeout``.
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from awl.cli import main
from awl.desk import Desk
from awl.store.sqlite import SQLiteStore
from tests.awl.desk_support import report_fields
from tests.awl.server_support import MANAGER, WORKER, order_fields
from tests.fuzz.generators import damage, dumps, mutate, rng, scale

pytestmark = pytest.mark.slow

# Each command and its options: None for a flag, else the kind of value it takes.
COMMANDS: dict[tuple[str, ...], dict[str, str | None]] = {
    ("validate",): {"": "files", "--type": "word", "--order": "file", "--parent": "file",
                    "--calls": "file", "--json": None},
    ("conformance",): {"": "file", "--json": None, "-v": None},
    ("order", "create"): {"": "file", "--copy-handoff": None, "--json": None, "--as": "who"},
    ("order", "list"): {"--state": "word", "--worker": "who", "--manager": "who",
                        "--parent": "id", "--limit": "number", "--json": None, "--as": "who"},
    ("order", "show"): {"": "id", "--json": None},
    ("order", "follow"): {"": "id", "--after": "number", "--json": None},
    ("order", "questions"): {"--all": None, "--json": None, "--as": "who"},
    ("review",): {"": "id", "--approve": None, "--rework": "word", "--effects": "word",
                  "--reason": "word", "--json": None, "--as": "who"},
    ("answer",): {"": "id word", "--json": None, "--as": "who"},
    ("cancel",): {"": "id word", "--json": None, "--as": "who"},
    ("track",): {"": "who", "--json": None},
    ("handoff",): {"": "id", "--json": None, "--as": "who"},
    ("work", "accept"): {"": "id", "--json": None, "--as": "who"},
    ("work", "start"): {"": "id", "--json": None, "--as": "who"},
    ("work", "decline"): {"": "id word", "--json": None, "--as": "who"},
    ("work", "progress"): {"": "id word", "--percent": "number", "--json": None, "--as": "who"},
    ("work", "report"): {"": "id file", "--json": None, "--as": "who"},
    ("pass", "issue"): {"--order": "id", "--to": "who", "--tools": "word", "--budget": "budget",
                        "--expires": "word", "--parent": "token", "--audience": "who",
                        "--json": None},
    ("pass", "show"): {"": "token", "--audience": "who", "--json": None},
    ("pass", "revoke"): {"": "word", "--reason": "word", "--json": None},
    ("pass", "jwks"): {"--json": None},
    ("effects", "list"): {"": "id", "--json": None},
    ("effects", "settle"): {"": "id word", "--happened": None, "--did-not-happen": None,
                            "--evidence": "word", "--as": "who", "--json": None},
    ("gateway",): {"--order": "id", "--config": "file", "--commit": None, "--json": None,
                   "--timeout": "number", "--lock-wait": "number"},
    ("token", "issue"): {"": "who", "--json": None},
    ("token", "list"): {"--json": None},
    ("token", "revoke"): {"": "word", "--token": "word", "--principal": "who", "--json": None},
}

HOSTILE_WORDS = ["", "-", "--", "-x", "\udcff", "a\udcfe", "é", "\x00x", "x" * 3000, "9" * 30,
                 "18446744073709551616", "-1", "1e400", "nan", "inf", "0", "1.5", "usd=1e400",
                 "usd=nan", "tool_calls=1e30", "usd=1,usd=2", "a/*", "*", "mail/send#1",
                 "9999-12-31T23:59:59-01:00", "human:ana", "agent:writer", "awl:desk",
                 "(a+)+$", "--help"]


class _Stdin(io.StringIO):
    """An empty stdin with a ``buffer``, for commands that read ``-``."""

    buffer = io.BytesIO(b"")


@pytest.mark.spec("SEC-4", "DOC-12", "DOC-13", "DOC-17", "BIND-1")
def test_random_command_lines_end_in_an_exit_code_never_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AWL_HOME", str(home))
    monkeypatch.delenv("AWL_ACTOR", raising=False)
    monkeypatch.setattr(sys, "stdin", _Stdin(""))
    ids = _seed_desk(home)
    assert main(["pass", "issue", "--order", ids[1], "--to", WORKER]) == 0
    token = capsys.readouterr().out.strip()
    files = _files(tmp_path, ids)
    r = rng("cli")

    def pick(kind: str) -> str:
        if r.random() < 0.3:
            return r.choice(HOSTILE_WORDS)
        if kind == "id":
            return r.choice([*ids, "wo_nope"])
        if kind == "who":
            return r.choice([MANAGER, WORKER, "agent:nosy"])
        if kind in ("file", "files"):
            return str(r.choice(files))
        if kind == "number":
            return r.choice(["1", "5", "0.01", "2.0", "100"])
        if kind == "token":
            return r.choice([token, token[:-3] + "abc", token.replace(".", "", 1)])
        if kind == "budget":
            return r.choice(["usd=1", "tool_calls=2", "usd=0.5,tokens=10"])
        return r.choice(["approve", "because", "done", "order", "report", "x"])

    for _ in range(scale(500)):
        words, options = r.choice(sorted(COMMANDS.items()))
        argv = list(words)
        for option, kind in options.items():
            if r.random() < 0.4:
                continue
            if option == "":
                assert kind is not None
                argv += [pick(k) for k in kind.split()]
            elif kind is None:
                argv.append(option)
            else:
                argv += [option, pick(kind)]
        if r.random() < 0.1:
            argv.insert(r.randrange(len(argv) + 1), r.choice(HOSTILE_WORDS))
        if words == ("order", "follow"):
            argv += ["--timeout", "0.01"]
        if words == ("gateway",) and "--commit" not in argv:
            argv.append("--commit")
        _run(argv, capsys)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse: --help, or a usage error
        code = exc.code if isinstance(exc.code, int) else 2
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out, (argv, err[-2000:])
    if code not in (0, None):
        # A failure says why: on stderr, or in the --json answer on stdout.
        assert err.strip() or out.strip(), (argv, code)


def _seed_desk(home: Path) -> list[str]:
    """Orders in several states on the desk; returns their ids."""
    store = SQLiteStore(home / "desk.sqlite3")
    try:
        desk = Desk(store)
        ids = []
        for state in ("offered", "accepted", "working", "submitted", "blocked"):
            view = desk.create(order_fields(tools=["filings/*", "mail/*"]), MANAGER)
            ids.append(view.id)
            if state == "offered":
                continue
            desk.accept(view.id, WORKER)
            if state == "accepted":
                continue
            desk.start(view.id, WORKER)
            if state == "submitted":
                desk.report(view.id, WORKER, report_fields())
            elif state == "blocked":
                desk.report(view.id, WORKER, report_fields("blocked"))
        return ids
    finally:
        store.close()


def _files(tmp_path: Path, ids: list[str]) -> list[Path]:
    """Files a command may be given: valid, mutated, damaged, a FIFO, a folder, missing."""
    r = rng("cli-files")
    folder = tmp_path / "files"
    folder.mkdir()
    docs: list[Any] = [order_fields(), report_fields(), {"mcpServers": {}}, [], {"spec": 5}]
    out: list[Path] = []
    for i in range(30):
        path = folder / f"doc{i}.json"
        data = dumps(mutate(r.choice(docs), r) if i % 3 else r.choice(docs))
        path.write_bytes(damage(data, r) if i % 5 == 0 else data)
        out.append(path)
    fifo = folder / "fifo.json"
    os.mkfifo(fifo)
    (folder / "calls.json").write_text(json.dumps([]))
    return [*out, fifo, folder, folder / "missing.json", folder / "calls.json"]
