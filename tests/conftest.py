import pytest

from tests.postgres_support import fresh_pg_url, pg_url, store_url

__all__ = ["fresh_pg_url", "pg_url", "store_url"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
