"""Fixtures shared by the library's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from awl.store.protocol import Store
from tests.awl.desk_support import STORES, open_backend


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An empty store of each backend in turn (a module may define its own ``store``)."""
    opened = open_backend(request.param, tmp_path, request)
    yield opened
    opened.close()
