"""Make docs/approval-page.png again: the README's manager walk, photographed.

Runs the first two commands of the README's walk (the order, the scripted worker) on a fresh
desk in a temporary folder, starts a real ``awl web --as human:ana --config
examples/upstream.json`` on a free port of 127.0.0.1, signs in with the link it prints, and
photographs the order's page, the two effects the walk approves ticked, with Playwright
driving the system's Chromium (never a downloaded browser; ``apt-get install chromium``).
No network, no keys.

    .venv/bin/python scripts/approval-page-screenshot.py [--out docs/approval-page.png]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ORDER_ID = "wo_offsite_notice"
WIDTH, HEIGHT = 1100, 1000
TICKED = ("mail/send_email#3", "mail/send_email#5")


def say(line: str) -> None:
    print(f"approval-page-screenshot: {line}", file=sys.stderr)


def run(words: list[str], cwd: Path, env: dict[str, str]) -> None:
    done = subprocess.run(words, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=240, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise SystemExit(f"approval-page-screenshot: {' '.join(words)} failed "
                         f"(exit {done.returncode}): {done.stderr.strip() or done.stdout.strip()}")


def sign_in_link(web: subprocess.Popen[str]) -> str:
    assert web.stderr is not None
    deadline = time.monotonic() + 60
    seen: list[str] = []
    while time.monotonic() < deadline:
        line = web.stderr.readline()
        if not line:
            break
        seen.append(line.strip())
        found = re.search(r"sign in as human:ana \(once\) at (\S+)", line)
        if found:
            return found.group(1)
    raise SystemExit("approval-page-screenshot: awl web printed no sign-in link: "
                     + " | ".join(seen))


def photograph(link: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("approval-page-screenshot: no chromium on PATH; "
                         "apt-get install chromium")
    base = link.split("/signin")[0]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
            page.goto(link)
            page.goto(f"{base}/order?id={ORDER_ID}")
            page.wait_for_load_state("networkidle")
            for ref in TICKED:  # as the walk's review approves them
                page.check(f'input[type=checkbox][name=effect][value="{ref}"]')
            page.screenshot(path=str(out))
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "approval-page.png",
                        help="where to write the picture (default docs/approval-page.png)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="awl-screenshot-") as tmp:
        folder = Path(tmp)
        shutil.copytree(ROOT / "examples", folder / "examples",
                        ignore=shutil.ignore_patterns("outbox.jsonl", "__pycache__"))
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
               "AWL_HOME": str(folder / "desk")}
        awl = str(BIN / "awl")
        run([awl, "order", "create", "./examples/order.json", "--as", "human:ana"], folder, env)
        run([str(BIN / "python"), "examples/scripted_worker.py", ORDER_ID, "--config",
             "examples/upstream.json"], folder, env)
        web = subprocess.Popen([awl, "web", "--as", "human:ana", "--config",
                                "examples/upstream.json", "--listen", "127.0.0.1:0",
                                "--no-notify"],
                               cwd=folder, env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            photograph(sign_in_link(web), args.out)
        finally:
            web.terminate()
            web.communicate(timeout=30)
    say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
