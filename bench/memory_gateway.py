"""The gateway on the in-memory store: the floor of the gateway's own work, for bench.gateway.

``python -m bench.memory_gateway --config FILE``

It serves ``awl gateway`` over stdio for a fresh working order in a
:class:`~awl.store.memory.MemoryStore`, so every call is still decided, reserved, recorded
and forwarded, but the recording costs only Python dictionaries: no file, no transaction, no
commit. Measured beside the bare proxy and the gateway on SQLite, it splits the gateway's
overhead into what its checks and bookkeeping cost (this row) and what the persistent store's
two writes per call add (the difference to the SQLite row). Not for production: the record
is lost when the process ends.
"""

from __future__ import annotations

import argparse

import anyio

from awl.store.memory import MemoryStore
from bench.gateway import new_working_order
from gateway import open_gateway, serve_stdio


async def serve(config: str, calls: int) -> None:
    """Serve a gateway for a new working order with budget for ``calls`` calls."""
    store = MemoryStore()
    order_id = new_working_order(store, calls)
    async with open_gateway(order_id, config, store=store) as gateway:
        await serve_stdio(gateway)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.memory_gateway --config FILE [--calls N]``."""
    parser = argparse.ArgumentParser(prog="python -m bench.memory_gateway",
                                     description="The gateway on the in-memory store.")
    parser.add_argument("--config", required=True, help="upstream servers, mcpServers JSON")
    parser.add_argument("--calls", type=int, default=1_000_000, help="the order's tool_calls")
    args = parser.parse_args(argv)
    anyio.run(serve, args.config, args.calls)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
