"""The one rule for a test whose service or tool is missing (PostgreSQL, Node, a browser,
host names): skipped on a developer's machine, failed under ``CI=true``, where ``.ci/run``
has installed and started everything, so a missing service never hides a test in CI."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def unavailable(message: str, *, module: bool = False) -> NoReturn:
    """Fail the test under ``CI=true``, else skip it (``module``: the whole module, from
    its top level), saying ``message``."""
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message, allow_module_level=module)
