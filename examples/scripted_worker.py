"""A scripted worker for an order on your desk: the worker step of the README's manager walk.

    python examples/scripted_worker.py wo_offsite_notice --config examples/upstream.json

It works the order the way an agent would, with no model and no key: as the order's worker
(its ``to``) it accepts and starts the order on the desk (``--home``, else ``$AWL_HOME``, else
``./.awl``), starts the real gateway (``awl gateway --order ID --config FILE`` over stdio),
searches the notes and reads the one about the offsite (both pass through), asks to send three
emails (each held for the manager): to the team, to the caterer, and to the venue at
``venue@lost.example`` (the example mail server writes that one to its outbox and dies before
answering, so its commit ends ``unknown``), and submits a report citing the recorded calls
with the three held calls as its effects. It prints the refs, and the commands a manager runs
next. Exit 0 when the report is in; 1, with one line on stderr, when anything was refused.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime
from typing import Any

import anyio
from mcp import Client, StdioServerParameters, stdio_client

from awl import AWLError, Desk
from awl.desk.home import default_store

EMAILS = (
    {"to": "team@example.com", "subject": "The offsite moved",
     "body": "Hi all, the offsite moved to the lake house."},
    {"to": "caterer@example.com", "subject": "New venue for the offsite",
     "body": "Please deliver to the lake house instead."},
    {"to": "venue@lost.example", "subject": "Booking for the offsite",
     "body": "Please confirm the lake house for our team."},
)


class Refused(Exception):
    """A step the desk or the gateway refused; its message is the one line to print."""


async def _call(client: Client, name: str, arguments: dict[str, Any]) -> Any:
    result = await client.call_tool(name, arguments)
    said = " ".join(getattr(b, "text", "") for b in result.content)
    if result.is_error:
        raise Refused(f"{name} was refused: {said[:300]}")
    return result


async def work(order_id: str, config: str, home: str | None) -> list[str]:
    """Work the order through the gateway; the held refs, in the report's order."""
    args = ["-m", "awl", "gateway", "--order", order_id, "--config", config]
    if home:
        args += ["--home", home]
    server = StdioServerParameters(command=sys.executable, args=args, env=dict(os.environ))
    started = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    async with Client(stdio_client(server, errlog=sys.stderr)) as client:
        found = await _call(client, "mail__search_notes", {"query": "offsite"})
        note_id = (found.structured_content or {}).get("notes", [{}])[0].get("id", "n2")
        note = await _call(client, "mail__get_note", {"id": note_id})
        reads = [(found.meta or {}).get("awl/ref"), (note.meta or {}).get("awl/ref")]
        for email in EMAILS:
            await _call(client, "mail__send_email", dict(email))
        held = (await _call(client, "awl_list_held_calls", {})).structured_content["effects"]
        spent = (await _call(client, "awl_get_order", {})).structured_content["spent"]
        report = {
            "status": "done", "started_at": started,
            "result": {"summary": "Found the offsite note (the lake house) and drafted three "
                                  "emails: to the team, the caterer and the venue."},
            "evidence": [
                {"criterion": "c1", "type": "tool_call", "ref": reads[0]},
                {"criterion": "c1", "type": "tool_call", "ref": reads[1],
                 "note": "the note gives the new address"},
                {"criterion": "c2", "type": "tool_call", "ref": held[0]["ref"],
                 "note": "the email to the team, held"}],
            "cost": {"tool_calls": spent["tool_calls"], "usd": round(spent["usd"], 6)},
            "tools_used": ["mail/get_note", "mail/search_notes", "mail/send_email"],
            # Exactly as the gateway recorded them.
            "effects": [{k: e[k] for k in ("ref", "tool", "arguments")} for e in held],
        }
        await _call(client, "awl_submit_report", {"report": report})
    return [e["ref"] for e in held]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("order", metavar="ORDER", help="the order to work (it is offered)")
    parser.add_argument("--config", required=True, metavar="FILE",
                        help="the upstream config the gateway runs (examples/upstream.json)")
    parser.add_argument("--home", metavar="DIR", help="the desk's home (default: $AWL_HOME)")
    args = parser.parse_args(argv)
    store = default_store(args.home)
    try:
        desk = Desk(store)
        view = desk.get(args.order)
        worker = view.order.to
        if view.state == "offered":
            desk.accept(args.order, worker)
        if desk.get(args.order).state == "accepted":
            desk.start(args.order, worker)
    except AWLError as exc:
        print(f"scripted_worker: {exc.message}", file=sys.stderr)
        return 1
    finally:
        store.close()
    try:
        refs = anyio.run(work, args.order, args.config, args.home)
    except (Refused, AWLError) as exc:
        print(f"scripted_worker: {exc}", file=sys.stderr)
        return 1
    print(f"{worker} worked {args.order}: the report is in, asking to send "
          f"{', '.join(refs)} (held, nothing sent)")
    print(f"next: awl order show {args.order}   (or open it in `awl web`)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
