"""The docs pages the README links: every code block in them run as written by the test its
page's plan names, or listed with the reason it cannot run; every link leads to a file and a
heading that exist. The blocks run as the README's do (see tests/test_readme.py), in a copy
of ``examples/`` with a fresh desk; a page that continues the README's story (a worker's
calls were held; a commit was cut off) first makes that story true with the library.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from awl import SQLiteStore, WorkReport
from gateway import load_config
from tests.docs_support import (
    ORDER_ID,
    ROOT,
    Block,
    block_of,
    blocks,
    check_plan,
    hold_two_emails_and_report,
    make_world,
    not_run,
    outbox,
    run,
    run_bash,
)
from tests.service_support import unavailable
from tests.test_readme import block as readme_block
from tests.test_readme import check_links

DOCS = ROOT / "docs"

pytestmark = pytest.mark.timeout(300)

PLANS: dict[str, list[Block]] = {
    "manager.md": [
        run("day-to-day", "bash", "awl order list --state submitted            # what waits "
            "for you", "test_the_day_to_day_block_reviews_a_subset_and_commits_it"),
        run("settle", "bash", "awl effects list wo_offsite_notice",
            "test_the_settlement_block_settles_and_retries_once"),
    ],
    "webhooks.md": [
        run("notify", "bash", "awl notify list",
            "test_the_webhook_block_subscribes_and_lists_without_the_secret"),
    ],
    "gateway.md": [
        run("stdio-config", "json", '"command": "/abs/path/.venv/bin/awl",',
            "test_the_stdio_registration_is_a_gateway_config"),
    ],
    "conformance.md": [
        run("conformance", "bash", "awl conformance conformance/",
            "test_the_conformance_block_passes_every_case"),
    ],
    "approval-page.md": [
        not_run("screenshot", "bash", ".venv/bin/python scripts/approval-page-screenshot.py",
                "as written it rewrites docs/approval-page.png; "
                "test_the_screenshot_script_photographs_the_walk_s_order runs it with --out "
                "into a temporary folder"),
    ],
    "development.md": [
        not_run("fast-loop", "bash", '.venv/bin/python -m pytest -m "not slow" -n 2   # then '
                "bash .ci/run, which runs them all",
                "it is the test suite this test belongs to (bash .ci/run runs it all)"),
    ],
}
"""Each page's code blocks, in order: which test runs each, or why none can."""

# Pages this file's plans do not cover, each with why (they are other work's to keep).
OTHERS = {
    "benchmarks.md": "the benchmark history: figures as measured, no code blocks",
    "call-cost.md": "the cost of a call: figures as measured, no code blocks",
    "upgrading.md": "the upgrade notes: tests/awl/test_upgrading.py runs their blocks",
}


def block(key: str) -> str:
    """The block ``key`` of whichever page plans it."""
    [page] = [name for name, plan in PLANS.items() if any(b.key == key for b in plan)]
    return block_of(DOCS / page, PLANS[page], key)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, str]]:
    folder, env = make_world(tmp_path)
    monkeypatch.setenv("PATH", env["PATH"])  # the gateway's upstream command is plain `python`
    return folder, env


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_every_block_is_run_or_listed_and_every_link_resolves(page: str) -> None:
    """Each page's blocks are its plan's, in order, each run by the test it names or listed
    with the reason it cannot run; its links lead somewhere."""
    if page in OTHERS:
        return
    check_plan(DOCS / page, PLANS.get(page, []), globals())
    check_links(DOCS / page)


def test_the_plans_name_pages_that_exist() -> None:
    assert all((DOCS / page).is_file() for page in PLANS)


def issued_and_reported(folder: Path, env: dict[str, str]) -> None:
    """The README's operator path (issue, accept, start), then the worker's two reads, two
    held emails and its report."""
    run_bash(readme_block("operator"), folder, env)
    anyio.run(hold_two_emails_and_report, folder, Path(env["AWL_HOME"]))
    assert outbox(folder) == []


@pytest.mark.slow
def test_the_day_to_day_block_reviews_a_subset_and_commits_it(
        world: tuple[Path, dict[str, str]]) -> None:
    """Issue, gateway, review of a subset and commit: one email goes out."""
    folder, env = world
    issued_and_reported(folder, env)
    out = run_bash(block("day-to-day"), folder, env)
    assert "committed" in out
    assert [m["to"] for m in outbox(folder)] == ["team@example.com"]


@pytest.mark.slow
def test_the_settlement_block_settles_and_retries_once(
        world: tuple[Path, dict[str, str]]) -> None:
    """An effect cut off after its dispatching mark is settled and retried as written."""
    folder, env = world
    home = Path(env["AWL_HOME"])
    issued_and_reported(folder, env)
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
    out = run_bash(block("settle"), folder, env)
    assert "unknown" in out
    assert [m["to"] for m in outbox(folder)] == ["team@example.com"]


def test_the_webhook_block_subscribes_and_lists_without_the_secret(
        world: tuple[Path, dict[str, str]]) -> None:
    """The secret is printed by `add` only; `list` shows the subscription without it."""
    folder, env = world
    out = run_bash(block("notify"), folder, env)
    added, secret, listed = out.splitlines()
    assert secret.startswith("secret: whsec_")
    webhook_id = added.split()[0]
    assert listed.startswith(f"{webhook_id}  ") and "whsec_" not in listed
    assert listed.endswith("https://chat.example/hooks/awl  "
                           "submitted,blocked,unknown,failed,expired  every order")


def test_the_stdio_registration_is_a_gateway_config() -> None:
    """The one-account registration is a stdio entry the gateway's config reader accepts,
    running ``awl gateway`` for the README's order."""
    registration = json.loads(block("stdio-config"))
    assert load_config(registration).servers
    [work] = registration["mcpServers"].values()
    assert work["args"][:3] == ["gateway", "--order", ORDER_ID]


def test_the_conformance_block_passes_every_case(
        world: tuple[Path, dict[str, str]]) -> None:
    """From the project folder: every conformance case passes, and the example report is
    valid against its order."""
    _, env = world
    out = run_bash(block("conformance"), ROOT, env)
    assert " 0 failed" in out and "examples/report.json: valid" in out


@pytest.mark.slow
def test_the_screenshot_script_photographs_the_walk_s_order(tmp_path: Path) -> None:
    """scripts/approval-page-screenshot.py, which made docs/approval-page.png, still makes a
    picture: a real `awl web`, the system's Chromium."""
    import shutil
    import subprocess
    import sys

    if shutil.which("chromium") is None:
        unavailable("the screenshot script needs chromium (apt-get install chromium)")
    out = tmp_path / "page.png"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "approval-page-screenshot.py"),
                           "--out", str(out)], capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_page_repeats_a_readme_block() -> None:
    """Each command sequence has one home: no docs page repeats one of the README's blocks."""
    readme = {text for _, text in blocks(ROOT / "README.md")}
    for page in DOCS.glob("*.md"):
        assert not readme & {text for _, text in blocks(page)}, page.name
