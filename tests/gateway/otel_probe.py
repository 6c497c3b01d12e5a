"""Runs ``awl ...`` and, when it exits, writes which telemetry modules it had imported.

``python tests/gateway/otel_probe.py OUT [--block-sdk] -- awl arguments...``

OUT gets ``{"modules": [...]}``: every imported module named ``opentelemetry.sdk...``,
``opentelemetry.exporter...`` or ``gateway._otel``. ``--block-sdk`` makes the OpenTelemetry
SDK and exporters unimportable first, as on a machine without the ``otel`` extra (the
OpenTelemetry API stays: the MCP SDK itself depends on it).
"""

from __future__ import annotations

import atexit
import json
import sys

WATCHED = ("opentelemetry.sdk", "opentelemetry.exporter", "gateway._otel")


def _write(out: str) -> None:
    found = sorted(m for m, module in sys.modules.items()
                   if module is not None and m.startswith(WATCHED))
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"modules": found}, f)


if __name__ == "__main__":
    out, *rest = sys.argv[1:]
    split = rest.index("--")
    options, argv = rest[:split], rest[split + 1:]
    if "--block-sdk" in options:
        for name in ("opentelemetry.sdk", "opentelemetry.exporter"):
            sys.modules[name] = None  # type: ignore[assignment]  # import raises ImportError
    atexit.register(_write, out)
    from awl.cli import main

    sys.exit(main(argv))
