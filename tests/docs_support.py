"""What the README's and the docs pages' tests share: a page's code blocks, each one's entry in
its page's plan (the test that runs it, or why none can), and the reader's world the blocks
run in.

A plan lists a page's fenced code blocks in the order a reader meets them, each by a key,
its language and a line it contains, and either the test that runs it or the reason it
cannot run in a test. :func:`check_plan` fails when the page and its plan disagree: a block
added, removed, moved or changed so that its line is gone, or a test named that does not
fetch that block.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp import Client

from awl import SQLiteStore
from gateway import open_gateway

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ORDER_ID = "wo_offsite_notice"


@dataclass(frozen=True)
class Block:
    """One code block of a page, as its plan expects it."""

    key: str
    language: str
    line: str
    """A line the block contains (stripped), so a block is found again after edits."""
    test: str | None = None
    """The test that runs the block (it fetches it with ``block(key)``) ..."""
    not_run: str | None = None
    """... or why no test can run it."""


def run(key: str, language: str, line: str, test: str) -> Block:
    return Block(key, language, line, test=test)


def not_run(key: str, language: str, line: str, why: str) -> Block:
    return Block(key, language, line, not_run=why)


def blocks(page: Path) -> list[tuple[str, str]]:
    """The page's fenced code blocks as (language, text), in order."""
    return [(m.group(1), m.group(2))
            for m in re.finditer(r"^```(\w*)\n(.*?)^```", page.read_text(), re.S | re.M)]


def block_of(page: Path, plan: list[Block], key: str) -> str:
    """The text of the block ``key`` of ``page``: the block at its plan's place."""
    [index] = [i for i, b in enumerate(plan) if b.key == key]
    found = blocks(page)
    assert index < len(found), f"{page.name} has no block {index + 1} ({key})"
    return found[index][1]


def check_plan(page: Path, plan: list[Block], tests: Mapping[str, Callable[..., Any]]) -> None:
    """``page``'s blocks are ``plan``'s, one for one and in order; each is run by a test of
    ``tests`` that fetches it by its key, or says why it is not run."""
    found = blocks(page)
    assert len({b.key for b in plan}) == len(plan), "two blocks of the plan share a key"
    for index, (entry, (language, text)) in enumerate(zip(plan, found, strict=False)):
        where = f"{page.name} block {index + 1} ({entry.key})"
        assert language == entry.language, (
            f"{where}: a {language!r} block, planned {entry.language!r}")
        assert entry.line in [line.strip() for line in text.splitlines()], (
            f"{where} no longer has the line {entry.line!r}: update the plan to what the block "
            "now is, and its test")
        assert (entry.test is None) != (entry.not_run is None), f"{where}: run or not, not both"
        if entry.test is not None:
            test = tests.get(entry.test)
            assert test is not None, f"{where}: no test {entry.test}"
            assert f'block("{entry.key}")' in inspect.getsource(test), (
                f"{where}: {entry.test} does not run it (no block({entry.key!r}))")
        else:
            assert entry.not_run and len(entry.not_run) > 20, f"{where}: say why it is not run"
    if len(found) > len(plan):
        language, text = found[len(plan)]
        first = text.strip().splitlines()[0] if text.strip() else ""
        raise AssertionError(
            f"{page.name} block {len(plan) + 1} ({language}: {first!r}) is in no plan: add a "
            "test that runs it, or list it with the reason it cannot run")
    assert len(found) == len(plan), (
        f"{page.name} has {len(found)} blocks, its plan {len(plan)}: a block was removed")


def run_bash(body: str, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"block failed:\n{body}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def make_world(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A folder holding a copy of examples/, and the environment of an activated venv whose
    ``AWL_HOME`` names a fresh desk. (Callers put ``BIN`` first on their own ``PATH`` too:
    the gateway's upstream command is plain ``python``.)"""
    shutil.copytree(ROOT / "examples", tmp_path / "examples",
                    ignore=shutil.ignore_patterns("outbox.jsonl", "__pycache__"))
    path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PATH": path, "AWL_HOME": str(tmp_path / "home"),
           "VIRTUAL_ENV": str(BIN.parent)}
    return tmp_path, env


def outbox(folder: Path) -> list[dict[str, Any]]:
    """What the example mail server really sent."""
    path = folder / "examples" / "outbox.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def hold_two_emails_and_report(folder: Path, home: Path) -> None:
    """What the worker does in the pages' story: two reads, two held sends, the report."""
    store = SQLiteStore(home / "desk.sqlite3")
    try:
        with open(os.devnull, "w") as quiet:
            async with open_gateway(ORDER_ID, folder / "examples" / "upstream.json",
                                    store=store, home=home, errlog=quiet) as gw, \
                    Client(gw.server) as client:
                await client.call_tool("mail__search_notes", {"query": "offsite"})
                await client.call_tool("mail__get_note", {"id": "n2"})
                report = json.loads((folder / "examples" / "report.json").read_text())
                for effect in report["effects"]:
                    held = await client.call_tool("mail__send_email", effect["arguments"])
                    assert held.structured_content is not None
                    assert held.structured_content["pending"] == effect["ref"]
                done = await client.call_tool("awl_submit_report", {"report": report})
                assert not done.is_error, done.content
    finally:
        store.close()
