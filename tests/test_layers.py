"""The house rules of the code itself: layers import downward, no import cycles, no late
imports dodging one, the gateway uses a documented interface of ``awl``, no private API of
anyone else.

The layer order is the import-linter contract in pyproject.toml (``lint-imports``, run in CI
too). The other rules read the source with :mod:`ast`, counting every import: at module
level, under ``if TYPE_CHECKING:``, inside functions, and ``importlib.import_module``.
"""

from __future__ import annotations

import ast
import functools
import importlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import gateway

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("awl", "gateway")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

Where = Literal["module", "function", "type-checking", "importlib"]

# Every import made later than module level, with why it may not be at the top. Acceptable
# reasons: an optional extra that may not be installed, and the CLI loading what one
# command needs only when that command runs (``awl --help`` and the desk commands then
# never import the MCP SDK's servers, the gateway or the web stack).
LATE_IMPORTS: dict[tuple[str, str], str] = {
    ("awl.cli._gateway", "gateway"): "`awl gateway` only: the gateway and its upstreams",
    ("awl.cli._effects", "gateway"): "`awl effects retry` only: the commit path",
    ("awl.cli._serve", "awl.server"): "`awl serve` only: the desk's MCP server",
    ("awl.cli._serve", "awl.mcp"): "`awl serve --http` only: its taken port, to name the flag",
    ("awl.cli._main", "importlib"): "only when OTEL_PROPAGATORS is set: the installed "
                                    "propagators, to name a missing one",
    ("awl.cli._gateway", "awl.mcp"): "`awl gateway --http` only: its taken port, to name the "
                                     "flag (loaded already: it serves the HTTP)",
    ("awl.desk._supervise", "ctypes"): "an unsandboxed check's supervisor, on Linux only: "
                                       "prctl, to be the subreaper of what the check starts",
    ("awl.cli._connect", "awl.mcp"): "`awl connect` only: the bridge (the MCP SDK's HTTP "
                                     "client)",
    ("awl.cli._web", "awl.mcp"): "`awl web` only: the HTTP listener (Starlette, the MCP SDK)",
    ("awl.cli._common", "awl.mcp"): "`awl web --listen`, `awl serve --http` and `awl gateway "
                                    "--http` only: their HOST:PORT reader (the MCP SDK)",
    ("awl.cli._web", "awl.web"): "`awl web` only: the approval page (Starlette, Jinja)",
    ("awl.cli._web", "gateway"): "`awl web --config` only: the gateway config reader",
    ("awl.cli._web", "uvicorn"): "`awl web` only: the HTTP server",
    ("gateway._telemetry", "gateway._otel"): "the [otel] extra, only when OTEL_* asks for it",
    ("awl.store.urls", "awl.store.postgres"): "the [postgres] extra (psycopg), only for a "
                                              "postgresql:// store URL",
    ("gateway._otel", "opentelemetry"): "the exporter OTEL_* names (grpc is not in [otel])",
    # What a stdio gateway does not need at start loads when first needed (issue 21).
    ("awl.cli._validate", "awl.documents.conformance"): "`awl conformance` only: the suite "
                                                         "runner (the JSON Schema stack)",
    ("awl.documents.checks", "awl.documents.schemas"): "the JSON Schema stack (jsonschema, "
                                                       "referencing, RE2), with the first "
                                                       "document whose schema is checked",
    ("awl.passes.verify", "awl.passes.chain"): "PyJWT and cryptography, with the first pass "
                                               "verified (a gateway without one verifies none)",
    ("gateway._results", "jsonschema"): "the JSON Schema stack, with the first tool listed that "
                                        "has an output schema",
    ("gateway._staging", "jsonschema"): "the JSON Schema stack, with the first held call checked",
    ("gateway._staging", "referencing"): "the JSON Schema stack, with the first held call "
                                         "checked",
    ("gateway._staging", "awl.documents"): "the bounded validation (JSON Schema stack), with "
                                           "the first held call checked",
    ("gateway._serve", "awl.passes"): "the desk's keys (PyJWT, cryptography), only when passes "
                                      "are checked",
    ("awl.documents.lazy", "<computed name>"): "a package's lazy export loads its module on "
                                               "first use (PEP 562; the only importlib)",
    # The entry point catches Ctrl-C from its first line on (awl.cli.main): what it loads
    # loads inside it, and `import awl`, before it, loads nothing.
    ("awl.cli", "awl.cli._main"): "the commands, loaded inside the entry point's try",
    ("awl.cli", "signal"): "the entry point holds SIGINT while the commands load (inside "
                           "its try: a Ctrl-C while signal loads exits 130 too)",
    ("awl", "awl.documents"): "awl.documents.lazy (with the documents layer), on the first "
                              "name read from the package",
}

LAZY_PACKAGES = ("awl", "awl.documents", "awl.passes", "gateway")
"""Package ``__init__`` s exporting names with :func:`awl.documents.lazy_exports`: they import
those names again under ``if TYPE_CHECKING:`` for type checkers (tests/test_exports.py holds
the two views equal); no other module has TYPE_CHECKING imports."""


@dataclass(frozen=True, slots=True)
class Import:
    """One import statement (or ``from`` name) found in the source."""

    module: str
    """The importing module."""
    target: str
    """The module imported: the longest known module the statement names, else its text."""
    name: str | None
    """The name taken from it (``from x import name``); None for ``import x``."""
    line: int
    where: Where

    def __str__(self) -> str:
        what = self.target if self.name is None else f"{self.target}:{self.name}"
        return f"{self.module} (line {self.line}, {self.where}) imports {what}"


def module_names(root: Path) -> dict[str, Path]:
    """Every module of the packages under ``root``, by dotted name."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _known(name: str, modules: dict[str, Path]) -> str:
    """The longest prefix of ``name`` that is a module of ours, else ``name`` itself."""
    probe = name
    while probe:
        if probe in modules:
            return probe
        probe = probe.rpartition(".")[0]
    return name


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


@functools.cache
def scan(root: Path = ROOT) -> tuple[dict[str, Path], list[Import]]:
    """The modules under ``root`` and every import they make."""
    modules = module_names(root)
    found: list[Import] = []
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found.extend(_imports(ast.parse(path.read_bytes(), str(path)), module, package,
                              modules))
    return modules, found


def _imports(tree: ast.Module, module: str, package: str,
             modules: dict[str, Path]) -> Iterator[Import]:
    def visit(node: ast.AST, where: Where) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                inner = "function"
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield Import(module, _known(alias.name, modules), None, child.lineno, where)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parent = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*parent, *([base] if base else [])])
                for alias in child.names:
                    target = _known(f"{base}.{alias.name}", modules)
                    if target == f"{base}.{alias.name}" and target not in modules:
                        target = _known(base, modules)
                    name = None if target == f"{base}.{alias.name}" else alias.name
                    yield Import(module, target, name, child.lineno, where)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]),
                                     "type-checking")
                for stmt in child.orelse:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]), where)
                continue
            elif isinstance(child, ast.Call) and _dynamic_import(child):
                arg = child.args[0] if child.args else None
                text = arg.value if isinstance(arg, ast.Constant) else "<computed name>"
                yield Import(module, _known(str(text), modules), None, child.lineno,
                             "importlib")
            yield from visit(child, inner)

    yield from visit(tree, "module")


def _dynamic_import(call: ast.Call) -> bool:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in ("import_module", "__import__")


def _ours(target: str) -> bool:
    return target.split(".")[0] in PACKAGES


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over the packages under ``root``, with root's pyproject.toml."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=root, env=env, capture_output=True, text=True, timeout=60, check=False)


# --------------------------------------------------------------------------- layers

def test_the_layers_contract_holds() -> None:
    """The layer order of pyproject.toml holds for the tree as it is."""
    run = lint_imports(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Layers import only downward KEPT" in run.stdout


def test_a_back_import_or_a_sibling_import_breaks_the_layers_contract(tmp_path: Path) -> None:
    """A copy of the tree with a store importing the desk, and the web page importing the
    desk server (a sibling), fails the contract, naming both imports."""
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            copy = tmp_path / path.relative_to(ROOT)
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_bytes(path.read_bytes())
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with (tmp_path / "awl/store/memory.py").open("a") as f:
        f.write("\nfrom awl.desk.desk import Desk  # a back-import\n")
    with (tmp_path / "awl/web/_app.py").open("a") as f:
        f.write("\nfrom awl.server import DeskServer  # a sibling import\n")

    run = lint_imports(tmp_path)

    assert run.returncode == 1, run.stdout + run.stderr
    assert "Layers import only downward BROKEN" in run.stdout
    assert "awl.store is not allowed to import awl.desk" in run.stdout
    assert "awl.store.memory -> awl.desk.desk" in run.stdout
    assert "awl.web is not allowed to import awl.server" in run.stdout
    assert "awl.web._app -> awl.server" in run.stdout


# --------------------------------------------------------------------------- cycles

def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The components of more than one module (or a module importing itself), by Tarjan."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_strongly_connected_finds_cycles_and_only_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "d"}, "e": set()}
    assert strongly_connected(graph) == [["a", "b", "c"], ["d"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    """No two modules import each other, however indirectly and however late."""
    modules, found = scan()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for imp in found:
        if imp.target in modules:
            graph[imp.module].add(imp.target)
    cycles = strongly_connected(graph)
    shown = [
        "\n".join(str(i) for i in found if i.module in cycle and i.target in cycle)
        for cycle in cycles
    ]
    assert not cycles, "import cycles:\n\n" + "\n\n".join(shown)


def test_the_cycle_check_sees_late_and_type_checking_imports(tmp_path: Path) -> None:
    """A cycle closed by a function-level import, a TYPE_CHECKING import or importlib is a
    cycle all the same."""
    pkg = tmp_path / "awl"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from awl import b\n")
    (pkg / "b.py").write_text("def f():\n    from awl.c import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from . import d\n")
    (pkg / "d.py").write_text("import importlib\nm = importlib.import_module('awl.a')\n")
    (tmp_path / "gateway").mkdir()
    modules, found = scan(tmp_path)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for imp in found:
        if imp.target in modules:
            graph[imp.module].add(imp.target)
    assert strongly_connected(graph) == [["awl.a", "awl.b", "awl.c", "awl.d"]]
    assert {(i.module, i.where) for i in found} == {
        ("awl.a", "module"), ("awl.b", "function"), ("awl.c", "module"),
        ("awl.c", "type-checking"), ("awl.d", "module"), ("awl.d", "importlib")}


# --------------------------------------------------------------------------- late imports

def _late(found: list[Import]) -> dict[tuple[str, str], list[Import]]:
    late: dict[tuple[str, str], list[Import]] = {}
    for imp in found:
        if imp.where == "type-checking" and imp.module in LAZY_PACKAGES:
            continue  # the type checker's view of a lazy export, not an import at run time
        if imp.where != "module":
            top = imp.target if _ours(imp.target) else imp.target.split(".")[0]
            key = next((k for k in LATE_IMPORTS
                        if k[0] == imp.module and (top == k[1] or top.startswith(k[1] + "."))),
                       (imp.module, top))
            late.setdefault(key, []).append(imp)
    return late


def test_late_imports_only_where_listed_with_a_reason() -> None:
    """Imports sit at the top of the module, except the few listed in LATE_IMPORTS; no
    ``if TYPE_CHECKING:`` imports (each dodged a cycle) but a lazy package's, and importlib
    only where a lazy export loads its module."""
    _, found = scan()
    late = _late(found)
    unlisted = [str(i) for key, imps in late.items() if key not in LATE_IMPORTS for i in imps]
    assert not unlisted, "late imports with no listed reason:\n" + "\n".join(unlisted)
    odd = [str(i) for imps in late.values() for i in imps if i.where != "function"
           and (i.where, i.module) != ("importlib", "awl.documents.lazy")]
    assert not odd, "TYPE_CHECKING or importlib imports:\n" + "\n".join(odd)
    stale = sorted(set(LATE_IMPORTS) - set(late))
    assert not stale, f"LATE_IMPORTS lists imports that are no longer late: {stale}"


# --------------------------------------------------------------------------- the gateway's awl

INTERFACE = ("awl.desk", "awl.documents", "awl.mcp", "awl.passes", "awl.store")
"""The packages whose ``__init__`` states what the gateway may use of ``awl``."""


def _gateway_imports_of_awl() -> list[Import]:
    _, found = scan()
    return [i for i in found if i.module.split(".")[0] == "gateway"
            and i.target.split(".")[0] == "awl"]


def test_the_gateway_imports_nothing_private_from_awl() -> None:
    """No ``awl`` module or name with a leading underscore is imported by the gateway."""
    private = [str(i) for i in _gateway_imports_of_awl()
               if any(part.startswith("_") for part in i.target.split("."))
               or (i.name or "").startswith("_")]
    assert not private, "\n".join(private)


def test_the_gateway_uses_only_the_documented_interface_of_awl() -> None:
    """The gateway imports from the layer packages' ``__init__`` only, and only names
    their ``__all__`` lists (each ``__init__`` docstring says what they are for)."""
    wrong: list[str] = []
    for imp in _gateway_imports_of_awl():
        if imp.target not in INTERFACE or imp.name is None:
            wrong.append(f"{imp}: import from one of {', '.join(INTERFACE)} instead")
        elif imp.name not in importlib.import_module(imp.target).__all__:
            wrong.append(f"{imp}: not in {imp.target}.__all__")
    assert not wrong, "\n".join(wrong)
    for package in INTERFACE:
        module = importlib.import_module(package)
        assert all(hasattr(module, name) for name in module.__all__), package
        assert "gateway" in (module.__doc__ or ""), f"{package} says nothing of the gateway"


ABOVE_THE_GATEWAY = ("awl.cli", "awl.integrations", "awl.server", "awl.web")
"""The layers above the gateway (pyproject.toml's contract): they use its ``__all__`` only."""


def test_the_layers_above_the_gateway_use_only_its_public_names() -> None:
    """``awl.cli``, ``awl.web``, ``awl.integrations`` and ``awl.server`` import from the
    ``gateway`` package itself, and only names its ``__all__`` lists (never ``gateway._lock``
    or another private module)."""
    _, found = scan()
    above = [i for i in found if i.module.startswith(ABOVE_THE_GATEWAY)
             and i.target.split(".")[0] == "gateway"]
    assert above, "no layer above imports the gateway: the check checks nothing"
    wrong = [str(i) for i in above
             if i.target != "gateway" or i.name is None or i.name not in gateway.__all__]
    assert not wrong, "import these through gateway.__all__ instead:\n" + "\n".join(wrong)


def test_no_module_imports_a_private_name_of_another_package() -> None:
    """A name with a leading underscore stays in its package: ``awl.web`` does not reach
    into ``awl.mcp.transport`` for one, nor ``awl.passes`` into ``awl.documents.checks``."""
    _, found = scan()
    private = [str(i) for i in found
               if (i.name or "").startswith("_") and not (i.name or "").endswith("__")
               and _ours(i.target)
               and i.target.rpartition(".")[0] != i.module.rpartition(".")[0]
               and not i.target.startswith(i.module + ".")]
    assert not private, "\n".join(private)


# --------------------------------------------------------------------------- private APIs

def test_no_private_api_of_python_or_a_dependency_is_imported() -> None:
    """No ``from _x import`` (CPython's C accelerators) and no private module or name of a
    dependency (``mcp.shared._httpx_utils``), in the code, the tests, bench or examples."""
    bad: list[str] = []
    for folder in ("awl", "gateway", "tests", "bench", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                else:
                    continue
                for name in names:
                    if name.split(".")[0] in ("__future__", *PACKAGES, "tests", "bench"):
                        continue
                    if any(part.startswith("_") for part in name.split(".")):
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert not bad, "private imports:\n" + "\n".join(bad)
