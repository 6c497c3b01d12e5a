"""The framework examples, run for real: PydanticAI and the OpenAI Agents SDK through the gateway.

Each example is a subprocess with the framework's scripted test model (no key, no network),
the real ``awl gateway`` as its MCP server and ``examples/outbox_server.py`` as the real
upstream. What reached the upstream is read from the upstream's own files (every call it
received, and every email it sent), never from the desk. The manager is the test, through
the real ``awl review`` CLI.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import pytest

from awl import Desk, SQLiteStore, list_effects

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
PYDANTIC_AI = "pydantic_ai_agent.py"
OPENAI_AGENTS = "openai_agents_agent.py"
MANAGER = "human:ana"
WAITING = "[worker] waiting for review"
LIMIT = 150.0
"""Seconds one step may take on a slow shared machine (each is a few seconds normally)."""

# Two agent processes, each starting a gateway.
pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def _env() -> dict[str, str]:
    """This environment without AWL settings or model keys: the scripted models run."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AWL_") and k not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


class Example:
    """One run of an example as a subprocess, its output read line by line as it comes."""

    def __init__(self, script: str, home: Path, *args: str, manager: str = "none") -> None:
        self.home = home
        self.lines: list[str] = []
        self._new = threading.Condition()
        self.proc = subprocess.Popen(
            [sys.executable, str(EXAMPLES / script), "--home", str(home), "--manager", manager,
             "--review-timeout", str(LIMIT), *args],
            cwd=home.parent, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)
        assert self.proc.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[str]) -> None:
        with stream:
            for line in stream:
                with self._new:
                    self.lines.append(line.rstrip("\n"))
                    self._new.notify_all()
        with self._new:
            self._new.notify_all()

    def output(self) -> str:
        with self._new:
            return "\n".join(self.lines)

    def wait_for(self, text: str, count: int = 1) -> None:
        """Until ``count`` lines contain ``text``; fails with the output if it exits first."""
        end = time.monotonic() + LIMIT
        with self._new:
            while sum(text in line for line in self.lines) < count:
                left = end - time.monotonic()
                assert left > 0 and (self.proc.poll() is None or self._reader.is_alive()), (
                    f"no {text!r} (x{count}); exit {self.proc.poll()}:\n{self.output()}")
                self._new.wait(min(left, 0.5))

    def order_id(self) -> str:
        self.wait_for("on the desk in")
        first = next(line for line in self.lines if "on the desk in" in line)
        return first.split()[1]

    def finish(self) -> int:
        code = self.proc.wait(timeout=LIMIT)
        self._reader.join(timeout=10)
        return code

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._reader.join(timeout=10)


@contextmanager
def example(script: str, home: Path, *args: str, manager: str = "none") -> Iterator[Example]:
    run = Example(script, home, *args, manager=manager)
    try:
        yield run
    finally:
        if run.proc.poll() is None:
            run.kill()


def awl(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI on the example's desk."""
    return subprocess.run([sys.executable, "-m", "awl", *args, "--home", str(home)],
                          env=_env(), cwd=home, capture_output=True, text=True, timeout=LIMIT,
                          check=False)


def review(home: Path, order_id: str, *decision: str) -> None:
    done = awl(home, "review", order_id, *decision, "--as", MANAGER)
    assert done.returncode == 0, done.stdout + done.stderr


def upstream_calls(home: Path) -> list[dict[str, Any]]:
    """Every call the upstream received, from its own log."""
    path = home / "upstream-calls.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line]


def sent(home: Path) -> list[dict[str, Any]]:
    """Every email the upstream sent, from its outbox."""
    path = home / "outbox.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line]


def tools_called(home: Path) -> list[str]:
    return [c["tool"] for c in upstream_calls(home)]


def desk_of(home: Path) -> tuple[Desk, SQLiteStore]:
    store = SQLiteStore(home / "desk.sqlite3")
    return Desk(store), store


@pytest.mark.spec("GW-9", "CM-1")
@pytest.mark.parametrize("script", [PYDANTIC_AI, OPENAI_AGENTS])
def test_the_framework_runs_a_whole_order_and_the_write_runs_once(
        tmp_path: Path, script: str) -> None:
    """Reads pass, the staged email is held until approval, the commit sends it once."""
    home = tmp_path / "desk"
    with example(script, home) as run:
        order_id = run.order_id()
        run.wait_for(WAITING)
        # Before any approval: the upstream saw the reads, and no send.
        assert tools_called(home) == ["search_notes", "get_note"]
        assert sent(home) == []
        desk, store = desk_of(home)
        try:
            view = desk.get(order_id)
            report = view.latest_report
            assert view.state == "submitted" and report is not None
            held = [c for c in store.calls(order_id) if c.outcome == "held"]
            assert [c.tool for c in held] == ["mail/send_email"]
            assert [e.ref for e in report.effects or ()] == [held[0].ref]
            assert {(e.criterion, e.ref) for e in report.evidence} == {
                ("c1", "mail/get_note#2"), ("c2", held[0].ref)}
            assert sorted(report.tools_used) == ["mail/get_note", "mail/search_notes",
                                                 "mail/send_email"]
        finally:
            store.close()
        review(home, order_id, "--approve")
        assert run.finish() == 0, run.output()
    [email] = sent(home)
    assert (email["to"], email["awl_ref"]) == ("team@example.com", held[0].ref)
    assert "lake house" in email["body"]
    assert tools_called(home).count("send_email") == 1
    # A second commit sends nothing.
    again = awl(home, "gateway", "--order", order_id, "--config", str(home / "upstream.json"),
                "--commit")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already committed" in again.stdout
    assert len(sent(home)) == 1 and tools_called(home).count("send_email") == 1


@pytest.mark.spec("LC-9", "CM-4")
@pytest.mark.parametrize("script", [PYDANTIC_AI, OPENAI_AGENTS])
def test_rework_runs_the_framework_again_as_attempt_2(tmp_path: Path, script: str) -> None:
    """Attempt 1 sent back: its held email is dropped, attempt 2 is approved and sent once."""
    home = tmp_path / "desk"
    reason = "say that the dates stay the same"
    with example(script, home) as run:
        order_id = run.order_id()
        run.wait_for(WAITING)
        review(home, order_id, "--rework", reason)
        run.wait_for(WAITING, count=2)
        assert f"attempt 2 (sent back: {reason})" in run.output()
        assert sent(home) == []
        desk, store = desk_of(home)
        try:
            view = desk.get(order_id)
            assert (view.state, view.attempt) == ("submitted", 2)
            first, second = (c.ref for c in store.calls(order_id) if c.tool == "mail/send_email")
            states = {e.ref: e.state for e in list_effects(order_id, store=store)}
            assert states[first] == "dropped"
            report = view.latest_report
            assert report is not None and [e.ref for e in report.effects or ()] == [second]
        finally:
            store.close()
        review(home, order_id, "--approve")
        assert run.finish() == 0, run.output()
    [email] = sent(home)
    assert email["awl_ref"] == second and reason in email["body"]
    assert tools_called(home).count("send_email") == 1


def test_the_approval_reaches_an_agent_process_started_again(tmp_path: Path) -> None:
    """The agent process is killed while its report waits; a new one gets the approval."""
    home = tmp_path / "desk"
    with example(OPENAI_AGENTS, home) as first:
        order_id = first.order_id()
        first.wait_for(WAITING)
        first.kill()
    assert sent(home) == []
    with example(OPENAI_AGENTS, home, "--order", order_id) as second:
        second.wait_for("attempt 1 is already submitted")
        review(home, order_id, "--approve")
        assert second.finish() == 0, second.output()
        assert "[worker] attempt" not in second.output().replace("[worker] attempt 1 approved",
                                                                 "")
    [email] = sent(home)
    assert email["awl_ref"] == "mail/send_email#3"
    # The second process did not run the agent again: the upstream saw each read once.
    assert tools_called(home) == ["search_notes", "get_note", "send_email"]


def test_run_as_the_readme_shows_the_example_manager_approves_and_the_email_goes_once(
        tmp_path: Path) -> None:
    """The default run (the example's own manager approves): exit 0, one email, after it."""
    home = tmp_path / "desk"
    with example(OPENAI_AGENTS, home, manager="auto") as run:
        order_id = run.order_id()
        assert run.finish() == 0, run.output()
    assert "[manager] human:ana approves attempt 1" in run.output()
    [email] = sent(home)
    desk, store = desk_of(home)
    try:
        [approval] = [e for e in desk.events(order_id) if e.action == "approve"]
    finally:
        store.close()
    assert email["awl_ref"] == "mail/send_email#3"
    assert datetime.fromisoformat(email["at"]) > datetime.fromisoformat(approval.at)
    assert tools_called(home) == ["search_notes", "get_note", "send_email"]
