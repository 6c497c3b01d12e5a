"""The public surface is a decision: pinned here, and compared with what the packages hold.

As httpx does it: every public name of ``awl`` and of ``gateway`` is in ``__all__``, every
name of ``__all__`` exists, and the list changes only with this file. Subpackages (the
layers ``awl.desk``, ``awl.passes`` ...) are namespaces, not names of the surface.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path
from types import ModuleType

import pytest

import awl
import gateway
from awl import AWLError

AWL_NAMES = [
    "AWLError", "AsyncDesk", "BadRequest", "Budget", "CallRecord", "Check", "Conflict",
    "ConformanceResult", "ConformanceRun", "Cost", "Criterion", "Desk", "DocumentError",
    "Effect", "EffectView", "Event", "Evidence", "Finding", "Forbidden", "Grant", "Handoff",
    "InvalidTransition", "KeySet", "KeyStore", "MemoryStore", "NotFound", "OrderView",
    "PassClaims", "PassError", "Question", "QuestionPage", "Review", "SQLiteStore",
    "StoreUnavailable", "Subscription",
    "TrackRecord", "UnitSpend", "ValidationFailed", "VerifiedPass", "WorkOrder", "WorkReport",
    "__version__", "check", "default_store", "home_dir", "is_valid_call", "is_valid_event",
    "is_valid_order", "is_valid_pass", "is_valid_report", "is_valid_review",
    "is_valid_suborder", "issue_pass", "issue_recorded_pass", "iter_call_findings",
    "iter_event_findings", "iter_order_findings", "iter_pass_findings", "iter_report_findings",
    "iter_review_findings", "iter_suborder_findings", "list_effects", "load_document",
    "load_schema", "open_store", "parse_time", "pass_scopes", "revoke_order_passes", "revoke_pass",
    "run_conformance", "settle", "validate_call", "validate_event", "validate_order",
    "validate_pass", "validate_report", "validate_review", "validate_suborder", "verify_pass",
]

GATEWAY_NAMES = [
    "AWL_BUDGET_EXHAUSTED", "AWL_EXPIRED", "AWL_FORBIDDEN", "AWL_INVALID_ARGUMENTS",
    "AWL_NOT_ACTIVE", "AWL_PASS_INVALID", "AWL_UPSTREAM_ERROR", "AWL_UPSTREAM_UNAVAILABLE",
    "Authority", "CHECKPOINT_SECONDS", "CommitSummary", "ConfigError", "Decision",
    "EXIT_LOCKED", "EffectOutcome", "Gateway", "GatewayConfig", "LockBusy", "Mismatch",
    "NameTable", "PASS_ENV", "REFUSAL_CODES", "ServerConfig", "UNRESOLVED_TOOL",
    "UpstreamError", "UpstreamPool", "UpstreamRejected", "UpstreamTimeout",
    "UpstreamUnavailable", "WORKER_TOOL_NAMES", "commit", "commit_sync", "decide",
    "drop_attempt", "enable_telemetry", "exposed_name", "is_staged", "listable_effects",
    "load_config", "open_gateway", "parse_address", "retry", "retry_sync", "run_gateway",
    "serve_http", "serve_stdio", "tools_used",
]


def _public(module: ModuleType) -> list[str]:
    """The names a reader of ``module`` finds: not private, not a subpackage."""
    return sorted(name for name, value in vars(module).items()
                  if not name.startswith("_") and not isinstance(value, ModuleType))


def _modules() -> list[ModuleType]:
    """Every module of both packages, imported (``__main__`` runs the CLI, so not it)."""
    found = [awl, gateway]
    for package in (awl, gateway):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not info.name.endswith(".__main__"):
                found.append(importlib.import_module(info.name))
    return found


@pytest.mark.parametrize(("module", "pinned"), [(awl, AWL_NAMES), (gateway, GATEWAY_NAMES)],
                         ids=["awl", "gateway"])
def test_public_names_are_pinned(module: ModuleType, pinned: list[str]) -> None:
    """The public surface changes only on purpose, and ``__all__`` is the whole of it."""
    assert sorted(module.__all__) == module.__all__
    assert module.__all__ == pinned
    for name in module.__all__:
        assert hasattr(module, name), name
    _modules()  # importing every submodule adds no public name to the package
    assert _public(module) == sorted(set(module.__all__) - {"__version__"})


def test_every_exception_is_an_awl_error() -> None:
    """One ``except AWLError`` catches every error the library and the gateway raise."""
    exceptions = {f"{module.__name__}.{name}": value for module in _modules()
                  for name, value in vars(module).items()
                  if inspect.isclass(value) and issubclass(value, BaseException)
                  and value.__module__ == module.__name__}
    assert len(exceptions) > 10
    assert [name for name, value in exceptions.items() if not issubclass(value, AWLError)] == []


LAZY = ("awl", "awl.documents", "awl.passes", "gateway")
"""The packages whose names load on first use (:func:`awl.documents.lazy_exports`)."""


def _views(package: str) -> tuple[set[str], dict[str, tuple[str, str]]]:
    """What ``package``'s ``__init__`` binds at run time, and what it imports for type
    checkers only (name: its module and its name there)."""
    path = Path(importlib.import_module(package).__file__ or "")
    eager: set[str] = set()
    typing_only: dict[str, tuple[str, str]] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("typing.TYPE_CHECKING",
                                                                    "TYPE_CHECKING"):
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom) and stmt.module, ast.dump(stmt)
                for alias in stmt.names:
                    typing_only[alias.asname or alias.name] = (stmt.module, alias.name)
        elif isinstance(node, ast.ImportFrom):
            eager |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Assign):
            eager |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return {name for name in eager if not name.startswith("_")}, typing_only


@pytest.mark.parametrize("package", LAZY)
def test_what_type_checkers_see_is_what_loads(package: str) -> None:
    """Every public name of a lazy package is bound at import or imported for type checkers,
    never both, and each lazy one loads as exactly the object the type checker was shown."""
    module = importlib.import_module(package)
    eager, typing_only = _views(package)
    assert typing_only, f"{package} exports nothing lazily"
    assert not eager & set(typing_only)
    assert set(module.__all__) - {"__version__"} <= eager | set(typing_only)
    for name, (home, attribute) in typing_only.items():
        assert name in module.__all__, f"{package}.{name} is lazy but not public"
        assert getattr(module, name) is getattr(importlib.import_module(home), attribute), name
    assert set(module.__all__) <= set(dir(module))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        module.nothing  # noqa: B018
