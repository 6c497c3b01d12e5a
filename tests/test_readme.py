"""Every code block in README.md runs, in the order a reader meets them.

The blocks run against a copy of ``examples/`` in a temporary folder, with the project's
``.venv/bin`` first on ``PATH`` (as after ``source .venv/bin/activate``) and ``AWL_HOME``
naming a fresh desk. Where a block continues a story the README tells in prose (a worker's
calls were held; a commit was cut off), the test first makes that story true with the
library, then runs the block as written. Two blocks are special: the set-up block's
``bash .ci/run`` is this very test run, so it is only syntax-checked; its demo runs for real.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from awl import SQLiteStore, WorkReport
from gateway import load_config, open_gateway

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ORDER_ID = "wo_offsite_notice"

pytestmark = pytest.mark.timeout(300)


def blocks() -> list[tuple[str, str]]:
    """The README's fenced code blocks as (language, text), in order."""
    text = (ROOT / "README.md").read_text()
    return [(m.group(1), m.group(2))
            for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)]


def find(language: str, needle: str) -> str:
    """The one block of ``language`` that contains ``needle``."""
    found = [body for lang, body in blocks() if lang == language and needle in body]
    assert len(found) == 1, f"expected one {language} block with {needle!r}, got {len(found)}"
    return found[0]


def run_bash(body: str, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"block failed:\n{body}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, str]]:
    """A folder holding a copy of examples/, and the environment of an activated venv."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples",
                    ignore=shutil.ignore_patterns("outbox.jsonl", "__pycache__"))
    path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    monkeypatch.setenv("PATH", path)  # the gateway's upstream command is plain `python`
    env = {**os.environ, "PATH": path, "AWL_HOME": str(tmp_path / "home"),
           "VIRTUAL_ENV": str(BIN.parent)}
    return tmp_path, env


def outbox(folder: Path) -> list[dict[str, Any]]:
    path = folder / "examples" / "outbox.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def hold_two_emails_and_report(folder: Path, home: Path) -> None:
    """What the worker does in the README's story: two reads, two held sends, the report."""
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


@pytest.mark.slow
def test_the_set_up_block_names_the_demo_and_the_ci_script(tmp_path: Path) -> None:
    """The set-up block's demo runs as written; its CI script is valid bash."""
    body = find("bash", "scripts/demo.sh")
    assert "bash .ci/run" in body
    subprocess.run(["bash", "-n", str(ROOT / ".ci" / "run")], check=True)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh"), "--home",
                           str(tmp_path / "demo")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "exactly 1 message" in done.stdout


@pytest.mark.slow
def test_the_install_block_installs(world: tuple[Path, dict[str, str]]) -> None:
    """``pip install -e .`` works from the project folder: run in a new virtual environment
    (never the project's ``.venv``, which other tests' processes are running from at the
    same time), it installs the package there, ``awl`` command and all. The new environment
    sees the project's installed dependencies and pip (a ``.pth`` file), so nothing is
    downloaded but the build backend."""
    folder, env = world
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120, stdin=subprocess.DEVNULL)
    [site] = venv.glob("lib/python*/site-packages")
    [deps] = BIN.parent.glob("lib/python*/site-packages")
    (site / "awl-test-deps.pth").write_text(f"{deps}\n")
    pip = venv / "bin" / "pip"  # the project's pip, run by the new environment's python
    pip.write_text('#!/bin/sh\nexec "$(dirname "$0")/python" -m pip "$@"\n')
    pip.chmod(0o755)
    path = f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    run_bash(find("bash", "pip install -e ."), ROOT,
             {**env, "PATH": path, "VIRTUAL_ENV": str(venv)})
    installed = run_bash('awl --help >/dev/null && python -c "import awl, gateway; '
                         'print(awl.__file__)"', folder, {**env, "PATH": path})
    assert installed.strip() == str(ROOT / "awl" / "__init__.py")
    assert (venv / "bin" / "awl").is_file()


@pytest.mark.slow
def test_the_library_example_prints_what_its_comments_say(
        world: tuple[Path, dict[str, str]]) -> None:
    """The ten-line library example runs and prints the findings and state it promises."""
    folder, env = world
    code = find("python", "from awl import Desk")
    done = subprocess.run([sys.executable, "-c", code], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[('R4', '/evidence')]", "approved"]


def test_the_json_blocks_are_configs_the_gateway_accepts() -> None:
    """Every mcpServers snippet loads as a gateway config (the clients' registrations too:
    they are stdio entries of the same shape)."""
    snippets = [body for lang, body in blocks() if lang == "json"]
    assert len(snippets) == 3
    for body in snippets:
        assert load_config(json.loads(body)).servers
    assert json.loads(snippets[0]) == json.loads((ROOT / "examples" / "upstream.json").read_text())


@pytest.mark.slow
def test_the_operator_and_manager_blocks_run_the_story(
        world: tuple[Path, dict[str, str]]) -> None:
    """Issue, gateway, review of a subset and commit: one email goes out."""
    folder, env = world
    run_bash(find("bash", "awl order create examples/order.json"), folder, env)
    anyio.run(hold_two_emails_and_report, folder, Path(env["AWL_HOME"]))
    assert outbox(folder) == []
    out = run_bash(find("bash", "awl order list --state submitted"), folder, env)
    assert "committed" in out
    sent = outbox(folder)
    assert [m["to"] for m in sent] == ["team@example.com"]


@pytest.mark.slow
def test_the_settlement_block_settles_and_retries_once(
        world: tuple[Path, dict[str, str]]) -> None:
    """An effect cut off after its dispatching mark is settled and retried as written."""
    folder, env = world
    home = Path(env["AWL_HOME"])
    run_bash(find("bash", "awl order create examples/order.json"), folder, env)
    anyio.run(hold_two_emails_and_report, folder, home)
    run_bash("awl review wo_offsite_notice --approve --effects mail/send_email#3 "
             "--as human:ana", folder, env)
    # The story: a committer marked #3 dispatching and died before sending (the real kill
    # is tests/gateway/test_commit_kill.py); the next commit finds it unknown.
    with SQLiteStore(home / "desk.sqlite3") as store:
        stamp = WorkReport.model_validate(
            json.loads((folder / "examples" / "report.json").read_text())).finished_at
        store.set_effect(ORDER_ID, "mail/send_email#3", expect=["held"], state="dispatching",
                         count_dispatch=True, at=stamp)
    run_bash("awl gateway --order wo_offsite_notice --config examples/upstream.json --commit "
             "|| true", folder, env)
    assert outbox(folder) == []
    out = run_bash(find("bash", "awl effects retry"), folder, env)
    assert "unknown" in out
    assert [m["to"] for m in outbox(folder)] == ["team@example.com"]


def test_the_framework_block_runs_examples_that_exist_with_extras_that_exist() -> None:
    """The framework section's commands name real examples and the extras pyproject defines
    (tests/test_framework_examples.py runs those examples for real)."""
    import tomllib

    body = find("bash", "examples/pydantic_ai_agent.py")
    scripts = re.findall(r"python (examples/\S+\.py)", body)
    assert scripts == ["examples/pydantic_ai_agent.py", "examples/openai_agents_agent.py"]
    assert all((ROOT / script).is_file() for script in scripts)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    [named] = re.findall(r'pip install -e "\.\[([^\]]+)\]"', body)
    assert set(named.split(",")) <= set(extras)
    assert "dev,pydantic-ai,openai-agents" in (ROOT / "scripts" / "dev-install.sh").read_text()


def test_the_webhook_block_subscribes_and_lists_without_the_secret(
        world: tuple[Path, dict[str, str]]) -> None:
    """The secret is printed by `add` only; `list` shows the subscription without it."""
    folder, env = world
    out = run_bash(find("bash", "awl notify add"), folder, env)
    added, secret, listed = out.splitlines()
    assert secret.startswith("secret: whsec_")
    webhook_id = added.split()[0]
    assert listed.startswith(f"{webhook_id}  ") and "whsec_" not in listed
    assert listed.endswith("https://chat.example/hooks/awl  "
                           "submitted,blocked,unknown,failed,expired  every order")


@pytest.mark.slow
def test_the_five_command_manager_walk_runs_as_written(
        world: tuple[Path, dict[str, str]]) -> None:
    """Order, the shipped scripted worker, approval of two of three effects, commit, and the
    settlement of the one left ``unknown``: the block runs as written on a fresh desk, and
    the example mail server's outbox (what really went out) agrees with the desk."""
    folder, env = world
    body = find("bash", "examples/scripted_worker.py $O")
    assert len([line for line in body.splitlines() if line.strip()]) == 5
    # Run as a reader pastes it into a terminal: line after line in one shell (so ``$O``
    # carries over), each line's exit status kept. The commit exits 1 as the README says
    # ("1 means an approved effect did not commit"): one of its two effects ends unknown.
    lines = [line for line in body.splitlines() if line.strip()]
    script = "".join(f"{line}\necho \"exit=$?\"\n" for line in lines)
    done = subprocess.run(["bash", "-c", script], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=240, stdin=subprocess.DEVNULL)
    out = done.stdout + done.stderr
    assert re.findall(r"^exit=(\d+)$", done.stdout, re.M) == ["0", "0", "0", "1", "0"], out
    assert "1 committed, 1 unknown" in out and "dropped: mail/send_email#4" in out
    # What reached the mail server: the team's email and the venue's (written to the outbox
    # before the server died unanswered); never the caterer's, which was not approved.
    assert [m["to"] for m in outbox(folder)] == ["team@example.com", "venue@lost.example"]
    shown = run_bash("awl effects list wo_offsite_notice --json", folder, env)
    effects = {e["ref"]: e for e in json.loads(shown)["effects"]}
    assert effects["mail/send_email#3"]["state"] == "committed"
    assert effects["mail/send_email#4"]["state"] not in {"committed", "dispatching", "unknown"}
    settled = effects["mail/send_email#5"]
    assert settled["state"] == "unknown" and settled["dispatches"] == 1, settled
    assert settled["settlement"]["verdict"] == "happened", settled
    assert settled["settlement"]["by"] == "human:ana"
    assert "Traceback" not in out
    # Nothing is sent twice: a second commit finds nothing left to run.
    run_bash("awl gateway --order wo_offsite_notice --config examples/upstream.json --commit "
             "|| true", folder, env)
    assert len(outbox(folder)) == 2
