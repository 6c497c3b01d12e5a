"""The main job, end to end: an agent's emails held, one approved, sent exactly once.

Run it with ``bash scripts/demo.sh`` (which installs the project into ``.venv`` first) or,
once installed, ``.venv/bin/python examples/demo.py [--home DIR]``. No network, no keys.

What happens, on the embedded default (a SQLite desk in ``./demo-desk/``, wiped at the
start and left behind for you to inspect with the ``awl`` CLI):

1. the manager issues a work order (from ``examples/order.json``, with a fresh id and
   deadline): read the notes, draft emails; ``mail/send_email`` is *staged*;
2. the worker accepts and starts it;
3. the worker connects through the real gateway (``python -m awl gateway`` as a
   subprocess, MCP over stdio, the official SDK client) and lists its tools;
4. it reads the notes: those calls pass through to the example server
   (``examples/outbox_server.py``) and come back with real results;
5. it sends two emails: the gateway holds both and answers ``pending:...`` placeholders;
6. it submits its report through the gateway, citing the calls as evidence and listing
   both held emails as effects;
7. the manager approves the report with only one of the two effects;
8. ``awl gateway --commit`` sends exactly that one: the outbox file holds one message;
9. a second ``--commit`` sends nothing: the outbox still holds one message;
10. the worker's track record and the order's handoff briefing.

Every step is checked; the demo exits 1 with a one-line reason when an expectation fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp import Client, StdioServerParameters, stdio_client

from awl import AWLError, Desk, SQLiteStore

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
OUTBOX_SERVER = EXAMPLES / "outbox_server.py"
MARKER = ".awl-demo"
"""A file the demo leaves in its folder, so a later run knows the folder is safe to wipe."""

TEAM_EMAIL = {"to": "team@example.com", "subject": "Offsite: new address",
              "body": "Hi all, the offsite moved to the lake house. Same dates."}
CATERER_EMAIL = {"to": "orders@caterer.example", "subject": "Offsite: new delivery address",
                 "body": "Please deliver to the lake house instead."}


class DemoFailed(Exception):
    """An expectation of the demo did not hold."""


def expect(condition: bool, message: str) -> None:
    """Stop the demo with ``message`` unless ``condition`` holds."""
    if not condition:
        raise DemoFailed(message)


# --------------------------------------------------------------------------- printing

class Transcript:
    """Numbered steps, who acts, what happened: short lines for a person to read."""

    def __init__(self) -> None:
        self.number = 0

    def step(self, actor: str, text: str) -> None:
        """Start the next step."""
        self.number += 1
        print(f"\n[{self.number}] {actor} {text}", flush=True)

    def line(self, text: str = "", indent: int = 4) -> None:
        """One detail line of the current step."""
        print(" " * indent + text if text else "", flush=True)

    def block(self, text: str, indent: int = 6) -> None:
        """Several lines (a command's output), indented."""
        for line in text.rstrip("\n").splitlines():
            self.line(line, indent)


def one_line(text: str, limit: int = 90) -> str:
    """``text`` on one line, cut to ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def text_of(result: types.CallToolResult) -> str:
    """The text blocks of a tool result, joined."""
    return "\n".join(b.text for b in result.content if isinstance(b, types.TextContent))


def shown(path: Path) -> str:
    """A path as the user would type it: relative to the working folder when inside it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


# --------------------------------------------------------------------------- set-up

@dataclass
class Demo:
    """The demo's folder, its desk, and the order's cast."""

    home: Path
    desk: Desk
    manager: str
    worker: str
    config: Path
    outbox: Path
    order_id: str = ""
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.home / "gateway.log"

    def outbox_messages(self) -> list[dict[str, Any]]:
        """What the example server really sent: one JSON line per message."""
        if not self.outbox.exists():
            return []
        lines = self.outbox.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def child_env(self) -> dict[str, str]:
        """The environment for ``awl`` subprocesses: this one, without ambient AWL settings."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWL_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        return env

    def awl(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run the real ``awl`` CLI on the demo's desk."""
        return subprocess.run([sys.executable, "-m", "awl", *args, "--home", str(self.home)],
                              capture_output=True, text=True, env=self.child_env(),
                              cwd=self.home, timeout=120, check=False)


def prepare_home(home: Path) -> None:
    """Empty the demo folder; refuse a folder that holds anything but an earlier demo."""
    if home.exists():
        if not home.is_dir():
            raise DemoFailed(f"{home} is a file; pass --home with a folder for the demo desk")
        if any(home.iterdir()) and not (home / MARKER).exists():
            raise DemoFailed(f"{home} is not empty and was not made by this demo, so it is not "
                             "wiped; pass --home with a new or empty folder")
        shutil.rmtree(home)
    home.mkdir(parents=True)
    (home / MARKER).write_text("made by examples/demo.py; wiped by its next run\n",
                               encoding="utf-8")


def write_upstream_config(home: Path, outbox: Path) -> Path:
    """examples/upstream.json with absolute paths: this Python, the server, the outbox.

    The example file itself says ``"command": "python"`` (the Python on PATH: an activated
    venv) and ``"cwd": "."``, which the gateway resolves against the config file's folder,
    so ``outbox_server.py`` and ``outbox.jsonl`` there mean files in ``examples/``.
    """
    document = json.loads((EXAMPLES / "upstream.json").read_text(encoding="utf-8"))
    entry = document["mcpServers"]["mail"]
    entry.update(command=sys.executable, args=[str(OUTBOX_SERVER)], cwd=str(home),
                 env={"OUTBOX_PATH": str(outbox)})
    # The demo's first tools/list must show the mail tools: on a busy machine the upstream
    # can take longer than the default 3 s to start, so the gateway may wait up to 30 s.
    document.setdefault("gateway", {})["startup_wait"] = 30
    config = home / "upstream.json"
    config.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return config


def stamp(moment: datetime) -> str:
    """RFC 3339 UTC with milliseconds, as the desk writes times."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --------------------------------------------------------------------------- the steps

def issue_order(demo: Demo, say: Transcript) -> None:
    """Step 1: the manager issues the order of examples/order.json, fresh id and deadline."""
    fields = json.loads((EXAMPLES / "order.json").read_text(encoding="utf-8"))
    for key in ("id", "created_at"):  # the desk fills them in
        fields.pop(key)
    deadline = datetime.now(UTC) + timedelta(hours=1)
    fields["deadline"] = stamp(deadline)
    view = demo.desk.create(fields, demo.manager)
    demo.order_id = view.id
    order = view.order
    say.step(f"{demo.manager} (manager)", "issues a work order")
    say.line(f"order     {order.id}  ({view.state})")
    say.line(f"goal      {order.goal}")
    say.line(f"worker    {order.to}")
    say.line(f"tools     {', '.join(order.tools)}")
    say.line(f"staged    {', '.join(order.staged or ())}  (held until the manager approves)")
    units = order.budget.units()
    say.line(f"budget    {units.get('tool_calls', 0):g} tool calls, {units.get('usd', 0):.2f} "
             f"USD; deadline {order.deadline} (in 1 hour)")


def accept_and_start(demo: Demo, say: Transcript) -> None:
    """Step 2: the worker takes the order."""
    demo.desk.accept(demo.order_id, demo.worker)
    view = demo.desk.start(demo.order_id, demo.worker)
    say.step(f"{demo.worker} (worker)", f"accepts and starts the order: it is now {view.state}")
    expect(view.state == "working", f"the order should be working, not {view.state}")


@dataclass
class WorkerLog:
    """What the scripted worker learnt through the gateway, for its report."""

    reads: list[str] = field(default_factory=list)
    """The refs of the reads, from the answers' ``_meta``."""
    held: list[str] = field(default_factory=list)
    """The refs of the held calls, from the placeholders."""


async def call(client: Client, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
    """One tool call through the gateway; a tool error stops the demo."""
    result = await client.call_tool(name, arguments)
    expect(not result.is_error,
           f"{name} failed through the gateway: {one_line(text_of(result), 300)}")
    return result


def gateway_params(demo: Demo) -> StdioServerParameters:
    """``awl gateway`` for the order, as the stdio server the worker connects to."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "awl", "gateway", "--order", demo.order_id, "--config", str(demo.config),
              "--home", str(demo.home)],
        env=demo.child_env(), cwd=str(demo.home))


async def work_through_gateway(demo: Demo, say: Transcript) -> None:
    """Steps 3 to 6: the scripted worker's whole session, through the real gateway."""
    log = WorkerLog()
    started_at = stamp(datetime.now(UTC))
    with demo.log.open("a", encoding="utf-8") as errlog:
        async with AsyncExitStack() as stack:
            client = await stack.enter_async_context(
                Client(stdio_client(gateway_params(demo), errlog=errlog)))
            say.step(f"{demo.worker} (worker)",
                     "connects through the gateway: a subprocess speaking MCP over stdio")
            say.line(f"$ python -m awl gateway --order {demo.order_id} "
                     f"--config {shown(demo.config)} --home {shown(demo.home)}")
            names = [t.name for t in (await client.list_tools()).tools]
            say.line(f"tools it sees: {', '.join(names)}")
            say.line("(mail/create_issue is not shown: the order does not allow it)")
            for needed in ("mail__search_notes", "mail__get_note", "mail__send_email",
                           "awl_submit_report"):
                expect(needed in names, f"the gateway does not offer {needed}")
            expect("mail__create_issue" not in names,
                   "the gateway offers mail__create_issue, which the order does not allow")

            await read_notes(client, log, say, demo)
            await send_emails(client, log, say, demo)
            await submit_report(client, log, say, demo, started_at)


def call_ref(result: types.CallToolResult, name: str) -> str:
    """The ``server/tool#N`` ref the gateway recorded a passed-through call under."""
    ref = (result.meta or {}).get("awl/ref")
    expect(isinstance(ref, str),
           f"the gateway's answer to {name} does not say which call ref it recorded "
           "(_meta awl/ref), so the report cannot cite it")
    return str(ref)


async def read_notes(client: Client, log: WorkerLog, say: Transcript, demo: Demo) -> None:
    """Step 4: two reads, passed through to the example server."""
    say.step(f"{demo.worker} (worker)",
             "reads the notes: read tools pass through to the server, every call recorded")
    found = await call(client, "mail__search_notes", {"query": "offsite"})
    ref = call_ref(found, "mail__search_notes")
    log.reads.append(ref)
    say.line(f'mail__search_notes {{"query": "offsite"}}  ->  "{one_line(text_of(found), 40)}"'
             f"   [{ref}]")
    notes = (found.structured_content or {}).get("notes") or []
    expect(bool(notes), "search_notes found no note about the offsite")
    note_id = str(notes[0]["id"])
    note = await call(client, "mail__get_note", {"id": note_id})
    ref = call_ref(note, "mail__get_note")
    log.reads.append(ref)
    body = str((note.structured_content or {}).get("text") or text_of(note))
    say.line(f'mail__get_note {{"id": "{note_id}"}}  ->  "{one_line(body, 50)}"   [{ref}]')
    expect("lake house" in text_of(note), "the note does not give the new address")


async def send_emails(client: Client, log: WorkerLog, say: Transcript, demo: Demo) -> None:
    """Step 5: two sends, both held by the gateway."""
    say.step(f"{demo.worker} (worker)",
             "sends two emails: the gateway holds both (send_email is staged)")
    for email in (TEAM_EMAIL, CATERER_EMAIL):
        result = await call(client, "mail__send_email", dict(email))
        placeholder = text_of(result).splitlines()[0]
        pending = (result.structured_content or {}).get("pending")
        expect(placeholder.startswith("pending:") and isinstance(pending, str),
               f"send_email to {email['to']} was not held: {one_line(text_of(result))}")
        log.held.append(str(pending))
        say.line(f"mail__send_email to {email['to']:<24}  ->  {placeholder}")
    sent = demo.outbox_messages()
    say.line(f"outbox: {len(sent)} messages (nothing has been sent)")
    expect(not sent, f"the outbox holds {len(sent)} messages before any approval")


async def submit_report(client: Client, log: WorkerLog, say: Transcript, demo: Demo,
                        started_at: str) -> None:
    """Step 6: the report, through the gateway's awl_submit_report tool."""
    held = (await call(client, "awl_list_held_calls", {})).structured_content or {}
    effects = held.get("effects") or []
    expect([e["ref"] for e in effects] == log.held,
           f"awl_list_held_calls lists {[e['ref'] for e in effects]}, expected {log.held}")
    spent = ((await call(client, "awl_get_order", {})).structured_content or {})["spent"]
    search_ref, note_ref = log.reads
    report: dict[str, Any] = {
        "status": "done",
        "result": {"summary": "Found the offsite note (moved to the lake house) and drafted "
                              "two emails: one to the team, one to the caterer."},
        "evidence": [
            {"criterion": "c1", "type": "tool_call", "ref": search_ref,
             "note": "the search found note n2, 'Team offsite'"},
            {"criterion": "c1", "type": "tool_call", "ref": note_ref,
             "note": "n2 says the offsite moved to the lake house"},
            {"criterion": "c2", "type": "tool_call", "ref": log.held[0],
             "note": "the email to the team, held for approval"},
        ],
        "cost": {"tool_calls": spent["tool_calls"], "usd": round(spent["usd"], 6)},
        "started_at": started_at,
        "tools_used": sorted({e["tool"] for e in effects}
                             | {ref.split("#")[0] for ref in (search_ref, note_ref)}),
        # Copied from awl_list_held_calls: the exact arguments the gateway recorded.
        "effects": [{"ref": e["ref"], "tool": e["tool"], "arguments": e["arguments"]}
                    for e in effects],
        "handoff": {
            "summary": "Two emails are drafted and held for approval: one to the team, one "
                       "to the caterer.",
            "decisions": [{"text": "Wrote to the caterer as well",
                           "why": "the note says to send the new address to everyone"}],
            "next_step": "Once the manager has decided, tell whoever got no email about the "
                         "new address.",
        },
    }
    answer = await client.call_tool("awl_submit_report", {"report": report})
    say.step(f"{demo.worker} (worker)", "submits its report through the gateway "
             "(awl_submit_report)")
    expect(not answer.is_error, f"the report was refused: {one_line(text_of(answer), 300)}")
    state = (answer.structured_content or {}).get("state")
    say.line(f"status done; evidence: c1 <- {search_ref}, {note_ref}; c2 <- {log.held[0]}")
    for effect in report["effects"]:
        say.line(f"effect {effect['ref']}: {json.dumps(effect['arguments'])}")
    say.line(f"cost {spent['tool_calls']} tool calls, {spent['usd']:.2f} USD (as the gateway "
             f"counted them); the desk checked every ref against the call log")
    say.line(f"-> the order is {state}")
    expect(state == "submitted", f"the order should be submitted, not {state}")


def review(demo: Demo, say: Transcript) -> tuple[str, str]:
    """Step 7: the manager approves the report with the team email only."""
    report = demo.desk.get(demo.order_id).latest_report
    expect(report is not None and len(report.effects or ()) == 2,
           "the submitted report should list two effects")
    assert report is not None and report.effects is not None
    team = next(e.ref for e in report.effects if e.arguments.get("to") == TEAM_EMAIL["to"])
    other = next(e.ref for e in report.effects if e.ref != team)
    view = demo.desk.review(demo.order_id, demo.manager, "approve", effects=[team])
    say.step(f"{demo.manager} (manager)", "reviews the report and approves ONE of the two "
             "emails")
    say.line(f'Desk.review(order, "{demo.manager}", "approve", effects=["{team}"])')
    say.line(f"(the CLI does the same: awl review {demo.order_id} --approve --effects {team} "
             f"--as {demo.manager})")
    say.line(f"-> the order is {view.state}; {team} (to the team) may run, "
             f"{other} (to the caterer) never will")
    expect(view.state == "approved", f"the order should be approved, not {view.state}")
    return team, other


def commit(demo: Demo, say: Transcript, *, again: bool, team: str) -> None:
    """Steps 8 and 9: ``awl gateway --commit``, the real CLI, then the outbox file."""
    before = len(demo.outbox_messages())
    if again:
        say.step(f"{demo.manager} (manager)",
                 "runs the commit AGAIN (as after a crash, or by mistake)")
    else:
        say.step(f"{demo.manager} (manager)", "runs the commit: approved effects run, once each")
    say.line(f"$ python -m awl gateway --order {demo.order_id} --config {shown(demo.config)} "
             f"--home {shown(demo.home)} --commit")
    done = demo.awl("gateway", "--order", demo.order_id, "--config", str(demo.config),
                    "--commit")
    say.block(done.stdout)
    expect(done.returncode == 0,
           f"awl gateway --commit exited {done.returncode}: {one_line(done.stderr, 300)}")
    messages = demo.outbox_messages()
    noun = "message" if len(messages) == 1 else "messages"
    say.line(f"outbox ({shown(demo.outbox)}): {len(messages)} {noun}")
    for m in messages:
        say.line(f"  to {m['to']}: \"{m['subject']}\"  (awl/ref {m['awl_ref']})")
    expect(len(messages) == 1, f"the outbox holds {len(messages)} messages, expected exactly 1")
    expect(messages[0]["to"] == TEAM_EMAIL["to"] and messages[0]["awl_ref"] == team,
           f"the outbox message is not the approved one ({team}): {messages[0]}")
    if again:
        expect(len(messages) == before, "the second commit sent something")
        say.line(f"The second commit sent nothing: the outbox still holds exactly "
                 f"{len(messages)} message.")


def show_effects(demo: Demo, say: Transcript, team: str, other: str) -> None:
    """The desk's own account of the two held calls after both commits (the CLI)."""
    say.line(f"$ awl effects list {demo.order_id} --json   (the desk's effect log)")
    out = demo.awl("effects", "list", demo.order_id, "--json")
    expect(out.returncode == 0, f"awl effects list failed: {one_line(out.stderr, 300)}")
    views = {e["ref"]: e for e in json.loads(out.stdout)["effects"]}
    for ref in (team, other):
        state, sends = views[ref]["state"], views[ref]["dispatches"]
        say.line(f"  {ref}  {state}, sent {'once' if sends == 1 else f'{sends} times'}", 6)
    expect((views[team]["state"], views[team]["dispatches"]) == ("committed", 1),
           f"{team} should be committed and sent once: {views[team]}")
    expect((views[other]["state"], views[other]["dispatches"]) == ("dropped", 0),
           f"{other} should be dropped and never sent: {views[other]}")


def records(demo: Demo, say: Transcript) -> None:
    """Step 10: the worker's track record and the order's handoff briefing (the CLI)."""
    say.step("the desk", f"keeps the record: {demo.worker}'s track record and the handoff")
    for args in (("track", demo.worker), ("handoff", demo.order_id)):
        say.line("$ awl " + " ".join(args))
        out = demo.awl(*args)
        expect(out.returncode == 0, f"awl {args[0]} failed: {one_line(out.stderr, 300)}")
        say.block(out.stdout)


def inspect_hint(demo: Demo) -> None:
    """How to look at the desk afterwards."""
    awl = Path(sys.executable).parent / "awl"
    command = shown(awl) if awl.exists() else "awl"
    home = shown(demo.home)
    print(f"\nThe desk is in {home}/ (SQLite: {home}/desk.sqlite3). Inspect it:")
    for args in (f"order show {demo.order_id}", f"effects list {demo.order_id}",
                 f"track {demo.worker}", f"handoff {demo.order_id}", "order list"):
        print(f"  AWL_HOME={home} {command} {args}")
    print(f"The outbox is {shown(demo.outbox)}; the gateway's log is {shown(demo.log)}.")


# --------------------------------------------------------------------------- main

def run(home: Path) -> None:
    """The whole scenario; raises DemoFailed when an expectation does not hold."""
    prepare_home(home)
    outbox = home / "outbox.jsonl"
    config = write_upstream_config(home, outbox)
    order = json.loads((EXAMPLES / "order.json").read_text(encoding="utf-8"))
    store = SQLiteStore(home / "desk.sqlite3")
    try:
        demo = Demo(home=home, desk=Desk(store), manager=order["from"],
                    worker=order["to"], config=config, outbox=outbox)
        print("awl-gateway demo: an agent's two emails held, one approved, sent exactly "
              "once")
        print(f"desk {shown(home)}/desk.sqlite3 · upstream examples/outbox_server.py "
              f"(it appends each sent email to {shown(outbox)})")
        say = Transcript()
        issue_order(demo, say)
        accept_and_start(demo, say)
        anyio.run(work_through_gateway, demo, say)
        team, other = review(demo, say)
        commit(demo, say, again=False, team=team)
        commit(demo, say, again=True, team=team)
        show_effects(demo, say, team, other)
        records(demo, say)
        inspect_hint(demo)
    finally:
        store.close()


def unwrap(exc: BaseException) -> BaseException:
    """The first error inside (nested) exception groups, which anyio task groups raise."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; 0 when every expectation held, 1 otherwise."""
    parser = argparse.ArgumentParser(
        description="The awl-gateway main job, end to end, on a local SQLite desk.")
    parser.add_argument("--home", default="demo-desk", metavar="DIR",
                        help="the demo's desk folder, wiped first (default: ./demo-desk)")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback when something unexpected fails")
    args = parser.parse_args(argv)
    home = Path(args.home).resolve()
    began = time.monotonic()
    try:
        run(home)
    except Exception as raised:
        exc = unwrap(raised)
        if isinstance(exc, DemoFailed | AWLError):
            print(f"\nDEMO FAILED: {exc}", file=sys.stderr)
            return 1
        if args.debug:
            raise
        print(f"\nDEMO FAILED unexpectedly: {type(exc).__name__}: {one_line(str(exc), 300)} "
              f"(the gateway's log: {shown(home / 'gateway.log')}; --debug shows the "
              "traceback)", file=sys.stderr)
        return 1
    print(f"\nDemo complete in {time.monotonic() - began:.1f} s: every expectation held "
          "(one email sent, once; the second commit sent nothing).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
