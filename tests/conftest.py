import pytest

from tests.postgres_support import desk_url, fresh_pg_url, pg_url, store_url

__all__ = ["desk_url", "fresh_pg_url", "pg_url", "store_url"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
