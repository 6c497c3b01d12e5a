"""awl-gateway: Work Orders, Work Reports and Delegation Passes for AI agents.

The public surface is re-exported here; everything else is private. Each name loads with its
module the first time it is used (:mod:`awl.documents.lazy`), so importing one part of the
library (``awl.store.sqlite``, or the gateway) does not load all of it.

``import awl`` itself loads nothing, not even ``typing``: the ``awl`` command imports it
before its entry point (:func:`awl.cli.main`) can catch a Ctrl-C, so it must take no time.
"""

TYPE_CHECKING = False  # typing.TYPE_CHECKING, to type checkers too (they take it by its name)

if TYPE_CHECKING:
    from awl.desk import AsyncDesk, Desk, OrderView, Question, QuestionPage, Subscription
    from awl.desk.effects import EffectView, list_effects
    from awl.desk.home import default_store, home_dir
    from awl.desk.settlement import settle
    from awl.desk.track import TrackRecord, UnitSpend
    from awl.documents.checks import (
        check,
        is_valid_call,
        is_valid_event,
        is_valid_order,
        is_valid_report,
        is_valid_review,
        is_valid_suborder,
        iter_call_findings,
        iter_event_findings,
        iter_order_findings,
        iter_report_findings,
        iter_review_findings,
        iter_suborder_findings,
        load_document,
        validate_call,
        validate_event,
        validate_order,
        validate_report,
        validate_review,
        validate_suborder,
    )
    from awl.documents.conformance import ConformanceResult, ConformanceRun, run_conformance
    from awl.documents.errors import (
        AWLError,
        BadRequest,
        Conflict,
        DocumentError,
        Forbidden,
        InvalidTransition,
        NotFound,
        PassError,
        StoreUnavailable,
        ValidationFailed,
    )
    from awl.documents.findings import Finding
    from awl.documents.models import (
        Budget,
        CallRecord,
        Check,
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
    from awl.documents.schemas import load_schema
    from awl.passes import (
        KeySet,
        KeyStore,
        VerifiedPass,
        is_valid_pass,
        issue_pass,
        issue_recorded_pass,
        iter_pass_findings,
        pass_scopes,
        revoke_order_passes,
        revoke_pass,
        validate_pass,
        verify_pass,
    )
    from awl.store.memory import MemoryStore
    from awl.store.sqlite import SQLiteStore
    from awl.store.urls import open_store

_HOMES = {name: home for home, names in {
    "awl.desk": ("AsyncDesk", "Desk", "OrderView", "Question", "QuestionPage", "Subscription"),
    "awl.desk.effects": ("EffectView", "list_effects"),
    "awl.desk.home": ("default_store", "home_dir"),
    "awl.desk.settlement": ("settle",),
    "awl.desk.track": ("TrackRecord", "UnitSpend"),
    "awl.documents.checks": (
        "check", "is_valid_call", "is_valid_event", "is_valid_order", "is_valid_report",
        "is_valid_review", "is_valid_suborder", "iter_call_findings", "iter_event_findings",
        "iter_order_findings", "iter_report_findings", "iter_review_findings",
        "iter_suborder_findings", "load_document", "validate_call", "validate_event",
        "validate_order", "validate_report", "validate_review", "validate_suborder",
    ),
    "awl.documents.conformance": ("ConformanceResult", "ConformanceRun", "run_conformance"),
    "awl.documents.errors": (
        "AWLError", "BadRequest", "Conflict", "DocumentError", "Forbidden", "InvalidTransition",
        "NotFound", "PassError", "StoreUnavailable", "ValidationFailed",
    ),
    "awl.documents.findings": ("Finding",),
    "awl.documents.models": (
        "Budget", "CallRecord", "Check", "Cost", "Criterion", "Effect", "Event", "Evidence",
        "Grant", "Handoff", "PassClaims", "Review", "WorkOrder", "WorkReport", "parse_time",
    ),
    "awl.documents.schemas": ("load_schema",),
    "awl.passes": (
        "KeySet", "KeyStore", "VerifiedPass", "is_valid_pass", "issue_pass",
        "issue_recorded_pass", "iter_pass_findings", "pass_scopes", "revoke_order_passes",
        "revoke_pass", "validate_pass", "verify_pass",
    ),
    "awl.store.memory": ("MemoryStore",),
    "awl.store.sqlite": ("SQLiteStore",),
    "awl.store.urls": ("open_store",),
}.items() for name in names}
del TYPE_CHECKING


def __getattr__(name: str) -> object:
    from awl.documents.lazy import lazy_exports  # loads the documents layer: on first use

    return lazy_exports(__name__, _HOMES)[0](name)


def __dir__() -> list[str]:
    from awl.documents.lazy import lazy_exports

    return lazy_exports(__name__, _HOMES)[1]()


from awl._version import __version__  # noqa: E402  (light: no layer is loaded)

__all__ = [
    "AWLError",
    "AsyncDesk",
    "BadRequest",
    "Budget",
    "CallRecord",
    "Check",
    "Conflict",
    "ConformanceResult",
    "ConformanceRun",
    "Cost",
    "Criterion",
    "Desk",
    "DocumentError",
    "Effect",
    "EffectView",
    "Event",
    "Evidence",
    "Finding",
    "Forbidden",
    "Grant",
    "Handoff",
    "InvalidTransition",
    "KeySet",
    "KeyStore",
    "MemoryStore",
    "NotFound",
    "OrderView",
    "PassClaims",
    "PassError",
    "Question",
    "QuestionPage",
    "Review",
    "SQLiteStore",
    "StoreUnavailable",
    "Subscription",
    "TrackRecord",
    "UnitSpend",
    "ValidationFailed",
    "VerifiedPass",
    "WorkOrder",
    "WorkReport",
    "__version__",
    "check",
    "default_store",
    "home_dir",
    "is_valid_call",
    "is_valid_event",
    "is_valid_order",
    "is_valid_pass",
    "is_valid_report",
    "is_valid_review",
    "is_valid_suborder",
    "issue_pass",
    "issue_recorded_pass",
    "iter_call_findings",
    "iter_event_findings",
    "iter_order_findings",
    "iter_pass_findings",
    "iter_report_findings",
    "iter_review_findings",
    "iter_suborder_findings",
    "list_effects",
    "load_document",
    "load_schema",
    "open_store",
    "parse_time",
    "pass_scopes",
    "revoke_order_passes",
    "revoke_pass",
    "run_conformance",
    "settle",
    "validate_call",
    "validate_event",
    "validate_order",
    "validate_pass",
    "validate_report",
    "validate_review",
    "validate_suborder",
    "verify_pass",
]
