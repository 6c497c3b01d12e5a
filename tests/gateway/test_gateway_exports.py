"""The gateway package's public surface."""

from __future__ import annotations

import gateway


def test_gateway_public_names_are_pinned() -> None:
    """gateway.__all__ is sorted, complete and changes only on purpose."""
    assert sorted(gateway.__all__) == gateway.__all__
    for name in gateway.__all__:
        assert hasattr(gateway, name), name
    assert set(gateway.__all__) >= {
        "AWL_BUDGET_EXHAUSTED", "AWL_EXPIRED", "AWL_FORBIDDEN", "AWL_NOT_ACTIVE",
        "AWL_PASS_INVALID", "Gateway", "decide", "open_gateway", "run_gateway",
        "serve_http", "serve_stdio",
    }
    assert set(gateway.REFUSAL_CODES) == {
        "AWL_BUDGET_EXHAUSTED", "AWL_EXPIRED", "AWL_FORBIDDEN", "AWL_NOT_ACTIVE",
        "AWL_PASS_INVALID", "AWL_UPSTREAM_UNAVAILABLE"}
