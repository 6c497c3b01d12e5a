"""Names a package exports without importing their modules until one is used (PEP 562).

A package ``__init__`` that re-exports names of costly modules (the JSON Schema stack, PyJWT
and cryptography) lists where each lives and hands :func:`lazy_exports` to the module-level
``__getattr__`` and ``__dir__``; the names load with their module the first time one is
read, and are then plain attributes of the package. So ``import awl.store.sqlite`` or a stdio
gateway, which never checks a document schema or a pass, never loads those modules. The
package repeats the imports under ``if TYPE_CHECKING:`` for type checkers; a test holds the
two lists equal.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(package: str, homes: Mapping[str, str]
                 ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose names in ``homes`` load on first
    use: each name maps to the module it is imported from, or ``module:name`` when it is
    imported under another name."""

    def get(name: str) -> object:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = home.partition(":")
        value: object = getattr(importlib.import_module(module), attribute or name)
        setattr(sys.modules[package], name, value)
        return value

    def names() -> list[str]:
        return sorted({*vars(sys.modules[package]), *homes})

    return get, names
