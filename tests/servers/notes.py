"""Test fixture: runs the bundled example server, examples/outbox_server.py.

``python tests/servers/notes.py [--http PORT]``; see that file for its tools.
"""

from __future__ import annotations

import runpy
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "outbox_server.py"

if __name__ == "__main__":
    runpy.run_path(str(EXAMPLE), run_name="__main__")
