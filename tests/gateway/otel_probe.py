"""Runs ``awl ...`` and keeps writing which telemetry modules it has imported.

``python tests/gateway/otel_probe.py OUT [--block-sdk] -- awl arguments...``

OUT gets ``{"modules": [...]}``: every imported module named ``opentelemetry.sdk...``,
``opentelemetry.exporter...`` or ``gateway._otel``, rewritten every 50 ms while the command
runs (a stdio client may end its server with a signal, before any exit handler could write
it). ``--block-sdk`` makes the OpenTelemetry SDK and exporters unimportable first, as on a
machine without the ``otel`` extra (the OpenTelemetry API stays: the MCP SDK itself depends
on it).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

WATCHED = ("opentelemetry.sdk", "opentelemetry.exporter", "gateway._otel")


def _write(out: str) -> None:
    found = sorted(m for m, module in list(sys.modules.items())
                   if module is not None and m.startswith(WATCHED))
    with open(out + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"modules": found}, f)
    os.replace(out + ".tmp", out)


def _keep_writing(out: str) -> None:
    while True:
        _write(out)
        time.sleep(0.05)


if __name__ == "__main__":
    out, *rest = sys.argv[1:]
    split = rest.index("--")
    options, argv = rest[:split], rest[split + 1:]
    if "--block-sdk" in options:
        for name in ("opentelemetry.sdk", "opentelemetry.exporter"):
            sys.modules[name] = None  # type: ignore[assignment]  # import raises ImportError
    threading.Thread(target=_keep_writing, args=(out,), daemon=True).start()
    from awl.cli import main

    sys.exit(main(argv))
