"""Agent frameworks working through the gateway.

The framework-neutral part is here: :func:`gateway_command`, :func:`draft_report`,
:func:`wait_for_review`, :func:`commit_approved` and the loop :func:`work_order`. Each
framework has a small module that imports it only when used, so ``import awl`` never needs
one:

- :mod:`awl.integrations.pydantic_ai` (``pip install -e ".[pydantic-ai]"`` in the checkout);
- :mod:`awl.integrations.openai_agents` (``pip install -e ".[openai-agents]"`` in the checkout).
"""

from awl.integrations._work import (
    Attempt,
    GatewayCommand,
    Outcome,
    ReportDraft,
    ReviewTimeout,
    Verdict,
    check_gateway,
    commit_approved,
    draft_report,
    gateway_command,
    wait_for_review,
    work_order,
)

__all__ = [
    "Attempt",
    "GatewayCommand",
    "Outcome",
    "ReportDraft",
    "ReviewTimeout",
    "Verdict",
    "check_gateway",
    "commit_approved",
    "draft_report",
    "gateway_command",
    "wait_for_review",
    "work_order",
]
