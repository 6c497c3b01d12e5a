"""Every code block in README.md, in the order a reader meets them: each one run as written by
the test :data:`PLAN` names, or listed there with the reason it cannot run in a test; a block
in neither fails :func:`test_every_block_is_run_or_listed`. The README's links lead to files
and headings that exist.

The blocks run against a copy of ``examples/`` in a temporary folder, with the project's
``.venv/bin`` first on ``PATH`` (as after ``source .venv/bin/activate``) and ``AWL_HOME``
naming a fresh desk. Each person's path runs in one such folder, block after block, as its
reader would. The set-up block's ``bash .ci/run`` is this very test run, so it is only
syntax-checked; its demo runs for real.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx
import pytest

from gateway import load_config
from tests.docs_support import (
    BIN,
    ORDER_ID,
    ROOT,
    Block,
    block_of,
    check_plan,
    make_world,
    not_run,
    outbox,
    run,
    run_bash,
)

README = ROOT / "README.md"

pytestmark = pytest.mark.timeout(300)

PLAN: list[Block] = [
    run("set-up", "bash", "bash scripts/demo.sh   # the main job end to end, on the embedded "
        "SQLite desk", "test_the_set_up_block_runs_the_demo_and_names_the_ci_script"),
    # Managers
    run("walk", "bash", "python examples/scripted_worker.py $O --config examples/upstream.json",
        "test_the_manager_path_runs_as_written"),
    run("web", "bash", "awl web --as human:ana --config examples/upstream.json",
        "test_the_manager_path_runs_as_written"),
    # Framework developers
    run("install", "bash", "pip install -e .        # from this folder; the package is "
        "awl-gateway", "test_the_install_block_installs"),
    run("library", "python", "from awl import Desk, MemoryStore, ValidationFailed",
        "test_the_library_example_prints_what_its_comments_say"),
    not_run("frameworks", "bash", "python examples/pydantic_ai_agent.py --home pai-desk       "
            "# scripted model: no key needed",
            "its install would change the shared .venv under the other tests' feet, and "
            "tests/test_framework_examples.py runs both examples for real; "
            "test_the_framework_block_names_examples_and_extras_that_exist checks its names"),
    # Operators
    run("upstream", "json", '"mcpServers": {', "test_the_operator_path_runs_as_written"),
    run("operator", "bash", "awl work start wo_offsite_notice --as agent:clerk",
        "test_the_operator_path_runs_as_written"),
    not_run("service", "bash", "useradd --system --create-home --home-dir /srv/awl --shell "
            "/usr/sbin/nologin awl",
            "it needs root (useradd, install -o), another OS user and Claude Code; "
            "tests/awl/test_connect_other_user.py runs the same set-up with a worker under "
            "another uid"),
    run("connect-config", "json", '"command": "/opt/awl/bin/awl",',
        "test_the_operator_path_runs_as_written"),
]
"""README.md's code blocks, in order: which test runs each, or why none can."""


def block(key: str) -> str:
    """The README's block ``key``, found at its place in :data:`PLAN`."""
    return block_of(README, PLAN, key)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, str]]:
    folder, env = make_world(tmp_path)
    monkeypatch.setenv("PATH", env["PATH"])  # the gateway's upstream command is plain `python`
    return folder, env


def test_every_block_is_run_or_listed() -> None:
    """The README's blocks are PLAN's, in order, each run by the test it names (one that
    fetches it) or listed with the reason it cannot run."""
    check_plan(README, PLAN, globals())


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.M)}


def check_links(page: Path) -> None:
    """Every relative link of ``page`` leads to a file that exists, and every ``#anchor``
    to a heading of its page."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name} links {target}, which does not exist"
        if anchor and linked.suffix == ".md":
            assert anchor in anchors(linked), f"{page.name} links {target}: no such heading"


def test_the_contents_and_links_lead_somewhere() -> None:
    """The table of contents names the README's own sections, and every link resolves."""
    contents = README.read_text().split("## Contents", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"\]\(#([^)]+)\)", contents)
    sections = [slug(h) for h in re.findall(r"^## (.*)$", README.read_text(), re.M)]
    assert listed == [s for s in sections if s != "contents"]
    check_links(README)


@pytest.mark.slow
def test_the_set_up_block_runs_the_demo_and_names_the_ci_script(tmp_path: Path) -> None:
    """The set-up block's demo runs as written; its CI script is valid bash."""
    body = block("set-up")
    assert [line.split("#")[0].strip() for line in body.splitlines()] == [
        "bash scripts/demo.sh", "bash .ci/run"]
    subprocess.run(["bash", "-n", str(ROOT / ".ci" / "run")], check=True)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh"), "--home",
                           str(tmp_path / "demo")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "exactly 1 message" in done.stdout


def port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def sign_in_link(web: subprocess.Popen[str]) -> str:
    """The sign-in link ``awl web`` prints on stderr."""
    assert web.stderr is not None
    deadline = time.monotonic() + 60
    seen = []
    while time.monotonic() < deadline:
        line = web.stderr.readline()
        if not line:
            break
        seen.append(line)
        found = re.search(r"sign in as human:ana \(once\) at (\S+)", line)
        if found:
            return found.group(1)
    raise AssertionError("awl web printed no sign-in link:\n" + "".join(seen))


@pytest.mark.slow
def test_the_manager_path_runs_as_written(world: tuple[Path, dict[str, str]]) -> None:
    """The five-command walk: order, the shipped scripted worker, approval of two of three
    effects, commit, and the settlement of the one left ``unknown``, as written on a fresh
    desk; the example mail server's outbox (what really went out) agrees with the desk. Then
    ``awl web`` as written serves that order's page to the printed sign-in link."""
    folder, env = world
    body = block("walk")
    lines = [line for line in body.splitlines() if line.strip()]
    assert len(lines) == 5
    # Run as a reader pastes it into a terminal: line after line in one shell (so ``$O``
    # carries over), each line's exit status kept. The commit exits 1 as the README says
    # ("an approved effect did not commit"): one of its two effects ends unknown.
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

    # The page, as written: on its default port 127.0.0.1:8766 (another listener there, say
    # a reader's own `awl web`, moves this run to a free port rather than fail on it).
    [command] = block("web").splitlines()
    words = command.split()
    if not port_free(8766):
        words += ["--listen", "127.0.0.1:0"]
    web = subprocess.Popen(words, cwd=folder, env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        link = sign_in_link(web)
        with httpx.Client(follow_redirects=True, timeout=30) as browser:
            inbox = browser.get(link)
            assert inbox.status_code == 200 and ORDER_ID in inbox.text, inbox.text[:2000]
            page = browser.get(link.split("/signin")[0] + "/order", params={"id": ORDER_ID})
            assert page.status_code == 200, page.text[:2000]
            assert "mail/send_email#5" in page.text and "happened" in page.text
    finally:
        web.terminate()
        web.communicate(timeout=30)  # and closes its stderr


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
    run_bash(block("install"), ROOT, {**env, "PATH": path, "VIRTUAL_ENV": str(venv)})
    installed = run_bash('awl --help >/dev/null && python -c "import awl, gateway; '
                         'print(awl.__file__)"', folder, {**env, "PATH": path})
    assert installed.strip() == str(ROOT / "awl" / "__init__.py")
    assert (venv / "bin" / "awl").is_file()


@pytest.mark.slow
def test_the_library_example_prints_what_its_comments_say(
        world: tuple[Path, dict[str, str]]) -> None:
    """The library example runs and prints the findings and state its comments promise."""
    folder, env = world
    done = subprocess.run([sys.executable, "-c", block("library")], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[('R4', '/evidence')]", "approved"]


def test_the_framework_block_names_examples_and_extras_that_exist() -> None:
    """The framework block, which PLAN says is not run here, names real examples and the
    extras pyproject defines (tests/test_framework_examples.py runs those examples)."""
    import tomllib

    body = block("frameworks")
    scripts = re.findall(r"python (examples/\S+\.py)", body)
    assert scripts == ["examples/pydantic_ai_agent.py", "examples/openai_agents_agent.py"]
    assert all((ROOT / script).is_file() for script in scripts)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    [named] = re.findall(r'pip install -e "\.\[([^\]]+)\]"', body)
    assert set(named.split(",")) <= set(extras)
    assert "dev,pydantic-ai,openai-agents" in (ROOT / "scripts" / "dev-install.sh").read_text()
    tested = (ROOT / "tests" / "test_framework_examples.py").read_text()
    assert all(Path(script).name in tested for script in scripts)


@pytest.mark.slow
def test_the_operator_path_runs_as_written(world: tuple[Path, dict[str, str]]) -> None:
    """The config is examples/upstream.json and the gateway loads it; the four commands issue
    the order, take it and run its gateway (stdin closed: it starts and stops cleanly); the
    client registration through ``awl connect`` is a config of the same shape."""
    folder, env = world
    config = json.loads(block("upstream"))
    assert config == json.loads((ROOT / "examples" / "upstream.json").read_text())
    assert load_config(config).servers
    out = run_bash(block("operator"), folder, env)
    assert "created wo_offsite_notice" in out
    shown = json.loads(run_bash("awl order show wo_offsite_notice --json", folder, env))
    assert shown["state"] == "working", shown
    assert outbox(folder) == []
    registration = json.loads(block("connect-config"))
    assert load_config(registration).servers
    [work] = registration["mcpServers"].values()
    assert work["args"][0] == "connect"
