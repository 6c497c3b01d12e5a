"""agent-work-layer: Work Orders, Work Reports and Delegation Passes for AI agents.

The public surface is re-exported here; everything else is private.
"""

from awl._errors import (
    AWLError,
    BadRequest,
    Conflict,
    DocumentError,
    Forbidden,
    InvalidTransition,
    NotFound,
    PassError,
    ValidationFailed,
)
from awl._findings import Finding
from awl._models import (
    Budget,
    CallRecord,
    Cost,
    Criterion,
    Effect,
    Event,
    Evidence,
    Grant,
    Handoff,
    PassClaims,
    Review,
    WorkOrder,
    WorkReport,
    parse_time,
)
from awl._passes import (
    KeyStore,
    VerifiedPass,
    issue_pass,
    issue_recorded_pass,
    iter_pass_findings,
    revoke_order_passes,
    revoke_pass,
    verify_pass,
)

__version__ = "0.1.0"

__all__ = [
    "AWLError",
    "BadRequest",
    "Budget",
    "CallRecord",
    "Conflict",
    "Cost",
    "Criterion",
    "DocumentError",
    "Effect",
    "Event",
    "Evidence",
    "Finding",
    "Forbidden",
    "Grant",
    "Handoff",
    "InvalidTransition",
    "KeyStore",
    "NotFound",
    "PassClaims",
    "PassError",
    "Review",
    "ValidationFailed",
    "VerifiedPass",
    "WorkOrder",
    "WorkReport",
    "__version__",
    "issue_pass",
    "issue_recorded_pass",
    "iter_pass_findings",
    "parse_time",
    "revoke_order_passes",
    "revoke_pass",
    "verify_pass",
]
