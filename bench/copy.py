"""How long ``awl store copy`` takes: a large desk from SQLite to PostgreSQL and back.

``python -m bench.copy [--quick] [--orders N] [--store sqlite,postgres] [--postgres-url URL]``

A desk of ``--orders`` orders (default 100,000; 10,000 with ``--quick``) is built as
:mod:`bench.desk` builds its large desk (the desk's own documents, bulk inserted), and one
order in twenty, at most 1,000 of them, gets two calls (one counted and finished, one
refused) through the store, so the copy carries call records and their running totals
too. It is then copied with :func:`awl.store.copy.copy_store`, the function ``awl store
copy`` runs, from the first store named to the last and back (``--store sqlite,postgres``:
SQLite to PostgreSQL, then PostgreSQL to a new SQLite file; one store: into a second desk of
the same kind). Each line is the wall time of one copy, its verification (reading both
stores back and comparing them) included, and the CPU time this process spent in it.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from contextlib import closing
from pathlib import Path

from awl import open_store
from awl.store.copy import copy_store
from awl.store.protocol import Reserved, Store
from bench.desk import build
from bench.stores import Stores, add_options
from bench.stores import columns as columns_text

T = "2030-01-01T09:30:00Z"


def add_calls(store: Store, orders: int) -> int:
    """Give one bulk order in twenty (at most 1,000 orders) a counted, finished call and a
    refused one; the number of calls made."""
    every = max(20, orders // 1000)
    made = 0
    for i in range(0, orders, every):
        oid = f"wo_bench{i:07d}"
        reserved = store.reserve_call(oid, attempt=1, tool="filings/search",
                                      arguments={"q": str(i)}, pass_jti=None, usd=0.25,
                                      started_at=T, scopes=())
        assert isinstance(reserved, Reserved), "the bulk orders have budget left"
        ref = reserved.record.ref
        store.finish_call(oid, ref, outcome="ok", result={"content": []}, error=None,
                          ended_at=T)
        store.record_call({"order_id": oid, "attempt": 1, "tool": "mail/delete",
                           "arguments": {}, "outcome": "refused",
                           "error": "AWL_FORBIDDEN: not allowed", "started_at": T,
                           "ended_at": T})
        made += 2
    return made


def timed_copy(source_url: str, target_url: str) -> str:
    """The wall time :func:`copy_store` takes from one store to the other (verification
    included), and this process's CPU time in it (a busy machine stretches the first)."""
    with closing(open_store(source_url)) as source, closing(open_store(target_url)) as target:
        began, cpu = time.perf_counter(), time.process_time()
        copy_store(source, target)
        return (f"{time.perf_counter() - began:.1f} s "
                f"(CPU {time.process_time() - cpu:.1f} s)")


def main(argv: list[str] | None = None) -> int:
    """Print how long the copies took."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10,000 orders")
    parser.add_argument("--orders", type=int, help="orders on the desk (default 100000)")
    add_options(parser)
    args = parser.parse_args(argv)
    stores = Stores.of(parser, args)
    orders = args.orders or (10_000 if args.quick else 100_000)
    first, last = stores.names[0], stores.names[-1]
    rows: list[tuple[str, list[str]]] = []
    with tempfile.TemporaryDirectory(prefix="awl-bench-copy-") as name:
        folder = Path(name)
        with stores.fresh(first, folder / "a", "copy_from") as source, \
                stores.fresh(last, folder / "b", "copy_to") as middle, \
                stores.fresh(first, folder / "c", "copy_back") as back:
            build(source, orders, first)
            with closing(open_store(source)) as store:
                calls = add_calls(store, orders)
            there = timed_copy(source, middle)
            again = timed_copy(middle, back)
    rows.append((f"{first} → {last}", [there]))
    rows.append((f"{last} → {first}", [again]))
    print(columns_text(rows, [f"copy {orders:,} orders ({calls:,} calls), verified"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
