"""The gateway with a journal for its call records: what a leased call path would cost.

``python -m bench.journal_gateway --home DIR --order ID --config FILE``

It serves ``awl gateway`` over stdio for an order of the SQLite desk in ``DIR``, but its
store writes a call's reservation and its outcome as two lines appended to a journal file
beside the desk (one ``write`` each, not synced: what the SQLite store's call records
promise, GW-7) instead of two SQLite transactions, and counts the order's budget in the
process, as a gateway holding the order's calls on a lease alone would. Everything else is
the real gateway: the order, the decisions, the checks, the evidence, the forwarding.

It is a measurement, not a store: no lease is taken, nothing is ever folded into the desk,
no other process can see the calls or share the budget, and a crash leaves the journal
unread. So it is the least such a design could cost on the call path (docs/call-cost.md),
and the difference to the SQLite gateway's row is the most it could gain. Not for
production.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from awl.store.protocol import OverBudget, Reservation, Reserved, Scope
from awl.store.rules import (
    check_ending,
    ended_doc,
    exceeded_scope,
    json_text,
    new_call,
    record_from,
)
from awl.store.sqlite import SQLiteStore
from gateway import CHECKPOINT_SECONDS, open_gateway, serve_stdio


class JournalStore(SQLiteStore):
    """The SQLite store, its reservations and outcomes appended to a journal instead."""

    def __init__(self, path: str, journal: str, **options: Any) -> None:
        super().__init__(path, **options)
        self._journal = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._spent: dict[str, tuple[int, int, float]] = {}
        """Per order: the last N, and the counted calls and usd, as the journal has them."""
        self._pending: dict[tuple[str, str], tuple[str, str]] = {}
        """Each reserved call's record text and start, until its outcome is written."""

    def close(self) -> None:
        os.close(self._journal)
        super().close()

    def reserve_call(self, order_id: str, *, attempt: int, tool: str,
                     arguments: dict[str, Any], pass_jti: str | None, usd: float,
                     started_at: str, scopes: Sequence[Scope],
                     seq: int | None = None) -> Reservation:
        spent = self._spent.get(order_id)
        if spent is None:
            used = self.usage(order_id)
            spent = (len(self.calls(order_id)), used.tool_calls, used.usd)
        last_n, calls, total_usd = spent
        over = exceeded_scope(scopes, lambda _jtis: (calls, total_usd), usd)
        if over is not None:
            return OverBudget(over)
        n = last_n + 1
        data = new_call(order_id, n, attempt=attempt, tool=tool, arguments=arguments,
                        pass_jti=pass_jti, started_at=started_at)
        text = json_text(data, "a call record")
        os.write(self._journal, f'{{"reserved":{text}}}\n'.encode())
        self._spent[order_id] = (n, calls + 1, total_usd + usd)
        self._pending[order_id, data["ref"]] = (text, started_at)
        return Reserved(data["ref"], attempt, partial(record_from, data))

    def finish_call(self, order_id: str, ref: str, *, outcome: str,
                    result: dict[str, Any] | None, error: str | None, ended_at: str) -> None:
        check_ending(outcome, result, error, ended_at)
        text, started_at = self._pending.pop((order_id, ref))
        ended = ended_doc(text, started_at, outcome=outcome, result=result, error=error,
                          ended_at=ended_at)
        os.write(self._journal, f'{{"ended":{ended}}}\n'.encode())


async def serve(home: Path, order_id: str, config: str) -> None:
    """Serve the gateway for ``order_id`` of the desk in ``home`` with a journal store."""
    store = JournalStore(str(home / "desk.sqlite3"), str(home / "calls.journal"),
                         checkpoint_every=CHECKPOINT_SECONDS)
    try:
        async with open_gateway(order_id, config, store=store) as gateway:
            await serve_stdio(gateway)
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.journal_gateway --home DIR --order ID --config FILE``."""
    parser = argparse.ArgumentParser(prog="python -m bench.journal_gateway",
                                     description="The gateway with a journal store.")
    parser.add_argument("--home", required=True, type=Path, help="the desk's folder")
    parser.add_argument("--order", required=True, help="a working order of that desk")
    parser.add_argument("--config", required=True, help="upstream servers, mcpServers JSON")
    args = parser.parse_args(argv)
    anyio.run(serve, args.home, args.order, args.config)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
