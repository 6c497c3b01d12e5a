"""A committer process the kill tests can stop at one exact moment.

``python -m tests.gateway.committer ORDER CONFIG HOME MARKER REF`` commits the order as
``awl gateway --commit`` does, and right after the ``dispatching`` mark of REF is durable
it writes REF to MARKER and freezes (no awaits, so no lease renewals) until it is killed.
The moment comes through the commit path's ``after_dispatching`` parameter.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence

from awl.desk.home import default_store
from awl.documents.patterns import canonical_ref
from gateway._commit import commit_sync
from gateway._config import load_config


def freeze_after(marker: str, ref: str) -> Callable[[str], None]:
    """The ``after_dispatching`` hook: announce ``ref``'s durable mark, then freeze."""
    wanted = canonical_ref(ref)

    def hook(marked: str) -> None:
        if marked != wanted:
            return
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, marked.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        while True:  # a real freeze: no awaits, no renewals; the test kills us here
            time.sleep(3600)

    return hook


def main(argv: Sequence[str]) -> int:
    order_id, config, home, marker, ref = argv
    store = default_store(home)
    try:
        summary = commit_sync(order_id, store=store, pool_or_config=load_config(config),
                              after_dispatching=freeze_after(marker, ref))
    finally:
        store.close()
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
