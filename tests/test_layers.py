"""Import rules between the package's layers, checked with a small ast walk (no import-linter).

Every .py file under pytest_satbench/ is parsed and each import resolved to a module name:
`import a.b`, `from a.b import c` (c counts as the module a.b.c when that file exists, else
as a name in a.b), relative imports (`from ..core import x`), and `importlib.import_module`
or `__import__` called with a literal string. Imports are found wherever they are: module
level, class bodies, `if TYPE_CHECKING:` blocks, try/except, functions.

Layer rules (each import statement is checked, module-level or function-local alike: a lazy
import is still a dependency, it only moves its cost):

  core                      imports nothing from pytest_satbench outside core; never pytest
  engine                    never pytest/_pytest, never pytest_satbench.plugin
  report                    never pytest/_pytest, never pytest_satbench.plugin
  datasets, codecs, server  never pytest/_pytest, never pytest_satbench.plugin

`plugin` has no layer rule (it is the top layer). The package face, `pytest_satbench/__init__.py`,
has its own: it is imported whenever pytest loads the plugin, so at module level it imports
nothing but leaf modules (modules importing nothing from the package: `_version`), and its
public names load on first use; and no module imports the face (the version comes from the
leaf `_version`): an import of the face from a layer is an arrow back up the layers.

Cycles. Which imports count:

- test_no_module_level_cycles: imports executed when the module is imported: module level,
  class bodies, try/except and `if` blocks, including `if TYPE_CHECKING:`. A cycle among
  these is a runtime hazard (a partially initialised module, an ImportError that depends on
  which module is imported first); TYPE_CHECKING edges count too, since the dependency is
  real for type checkers and `typing.get_type_hints`, and the guard is a common way to hide a
  design cycle that later turns into a runtime one.
- test_no_cycles_through_function_imports: a function-local import cannot trip a partially
  initialised module (it runs after both modules finished importing), so it is reported by
  a separate test: a function-local import that closes a cycle is still two modules
  depending on each other, and moving an import into a function must not be a way to make
  the first test pass. Each such import is named once, with the path back.

Only explicit imports are edges: importing `a.b.c` also runs `a/__init__.py` and
`a/b/__init__.py`, but those implicit parent imports would put every module in a cycle with
any package `__init__` that imports its own children, which is normal and harmless (the
parent is already in sys.modules). `from pytest_satbench import __version__` is an explicit
edge to `pytest_satbench/__init__.py` and counts.

Dynamic imports with a computed name (`import_module(f"...{name}")`) are not seen.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "pytest_satbench"
PACKAGE_DIR = Path(__file__).resolve().parents[1] / PACKAGE
PYTEST_NAMES = frozenset({"pytest", "_pytest"})


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name of the file
    file: Path
    line: int
    target: str  # resolved dotted module name
    local: bool  # inside a function or lambda: runs only when called
    type_checking: bool  # under `if TYPE_CHECKING:`

    def where(self, root: Path) -> str:
        return f"{self.file.relative_to(root.parent)}:{self.line}"


@dataclass(frozen=True)
class Rule:
    layer: str  # the second component of the importer's name: core, engine, ...
    forbid_pytest: bool
    forbidden_prefixes: tuple[str, ...]  # dotted names under `package.`
    allowed_prefixes: tuple[str, ...] = ()  # when set, every other package import is forbidden

    def broken_by(self, imp: Import, package: str) -> str | None:
        """The rule's wording when imp breaks it, else None."""
        top = imp.target.split(".")[0]
        if self.forbid_pytest and top in PYTEST_NAMES:
            return f"{self.layer} must not import pytest"
        if top != package:
            return None
        inner = imp.target[len(package) + 1:] if imp.target != package else ""
        if self.allowed_prefixes and not any(_under(inner, p) for p in self.allowed_prefixes):
            allowed = ", ".join(f"{package}.{p}" for p in self.allowed_prefixes)
            return f"{self.layer} must import nothing from {package} outside {allowed}"
        for prefix in self.forbidden_prefixes:
            if _under(inner, prefix):
                return f"{self.layer} must not import {package}.{prefix}"
        return None


RULES = (
    Rule("core", True, (), allowed_prefixes=("core",)),
    Rule("engine", True, ("plugin",)),
    Rule("report", True, ("plugin",)),
    Rule("datasets", True, ("plugin",)),
    Rule("codecs", True, ("plugin",)),
    Rule("server", True, ("plugin",)),
)


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


# ---------------------------------------------------------------------- the walk
def module_name(path: Path, root: Path) -> str:
    """pkg/a/b.py -> pkg.a.b; pkg/a/__init__.py -> pkg.a (root is the package directory)."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules(root: Path) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _literal_dynamic_import(node: ast.Call) -> str | None:
    """`importlib.import_module("x.y")` / `import_module("x.y")` / `__import__("x")`."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name not in ("import_module", "__import__") or not node.args:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and not arg.value.startswith("."):
        return arg.value
    return None


class _Finder(ast.NodeVisitor):
    """Collects (line, names, local, type_checking) for every import in one file; the names
    are resolved afterwards, when the set of modules is known."""

    def __init__(self, module: str, is_package: bool) -> None:
        self.module = module
        self.is_package = is_package
        self.found: list[tuple[int, list[str], bool, bool]] = []
        self._functions = 0
        self._type_checking = 0

    def _add(self, line: int, names: list[str]) -> None:
        self.found.append((line, names, self._functions > 0, self._type_checking > 0))

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        # decorators and defaults run at definition time, the body only when called
        for decorator in getattr(node, "decorator_list", []):
            self.visit(decorator)
        self.visit(node.args)
        self._functions += 1
        for stmt in node.body if isinstance(node.body, list) else [node.body]:
            self.visit(stmt)
        self._functions -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            self.generic_visit(node)
            return
        self._type_checking += 1
        for stmt in node.body:
            self.visit(stmt)
        self._type_checking -= 1
        for stmt in node.orelse:
            self.visit(stmt)

    def visit_Import(self, node: ast.Import) -> None:
        self._add(node.lineno, [a.name for a in node.names])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = self._base(node)
        # "mod:name" candidates: resolved to mod.name if that is a module, else to mod
        self._add(node.lineno, [f"{base}:{a.name}" for a in node.names if a.name != "*"] or [base])

    def visit_Call(self, node: ast.Call) -> None:
        target = _literal_dynamic_import(node)
        if target is not None:
            self._add(node.lineno, [target])
        self.generic_visit(node)

    def _base(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        # the package a relative import starts from: the module itself for an __init__.py
        parts = self.module.split(".")
        if not self.is_package:
            parts.pop()
        if node.level > 1:
            parts = parts[: len(parts) - (node.level - 1)]
        return ".".join([*parts, node.module] if node.module else parts)


def _resolve(name: str, modules: dict[str, Path]) -> str:
    if ":" not in name:
        return name
    base, attr = name.split(":", 1)
    return f"{base}.{attr}" if f"{base}.{attr}" in modules else base


def find_imports(root: Path) -> list[Import]:
    """Every import in every .py file under root (a package directory)."""
    modules = package_modules(root)
    imports: list[Import] = []
    for name, path in modules.items():
        finder = _Finder(name, path.name == "__init__.py")
        finder.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        for line, names, local, type_checking in finder.found:
            for target in dict.fromkeys(_resolve(n, modules) for n in names):
                imports.append(Import(name, path, line, target, local, type_checking))
    return imports


# ---------------------------------------------------------------------- the rules
def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def layer_violations(root: Path) -> list[str]:
    package = root.name
    rules = {r.layer: r for r in RULES}
    out = []
    for imp in find_imports(root):
        rule = rules.get(layer_of(imp.importer) or "")
        broken = rule.broken_by(imp, package) if rule else None
        if broken:
            how = " (function-local)" if imp.local else " (under TYPE_CHECKING)" if imp.type_checking else ""
            out.append(f"{imp.where(root)}: {broken}: imports {imp.target}{how}")
    return out


def face_violations(root: Path) -> list[str]:
    """The package face's rule (module docstring)."""
    package = root.name
    imports = find_imports(root)
    internal = {i.importer for i in imports if i.target.split(".")[0] == package and i.target != i.importer}
    out = []
    for imp in imports:
        if imp.target != package and imp.target.split(".")[0] == package and imp.importer == package \
                and not (imp.local or imp.type_checking) and imp.target in internal:
            out.append(f"{imp.where(root)}: the package face imports only leaf modules at module level: "
                       f"imports {imp.target}, which imports more of {package}")
        if imp.target == package and imp.importer != package:
            out.append(f"{imp.where(root)}: {imp.importer} imports the package face {package} "
                       f"(an arrow back up the layers): import its leaf module instead")
    return out


def _graph(imports: list[Import], modules: dict[str, Path]) -> dict[str, dict[str, Import]]:
    """importer -> target -> the first import of it (package-internal edges only)."""
    graph: dict[str, dict[str, Import]] = {m: {} for m in modules}
    for imp in imports:
        if imp.target in modules and imp.target != imp.importer:
            graph[imp.importer].setdefault(imp.target, imp)
    return graph


def _strongly_connected(graph: dict[str, dict[str, Import]]) -> Iterator[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit on deep graphs)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    for start, targets in graph.items():
        if start in index:
            continue
        work = [(start, iter(sorted(targets)))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    yield sorted(component)


def _path(graph: dict[str, dict[str, Import]], src: str, dst: str) -> list[Import] | None:
    """Shortest chain of imports from src to dst (breadth first)."""
    came: dict[str, Import | None] = {src: None}
    queue = deque([src])
    while queue:
        node = queue.popleft()
        if node == dst:
            chain: list[Import] = []
            while (edge := came[node]) is not None:
                chain.append(edge)
                node = edge.importer
            return chain[::-1]
        for child, edge in sorted(graph[node].items()):
            if child not in came:
                came[child] = edge
                queue.append(child)
    return None


def _chain(chain: list[Import], root: Path) -> str:
    return " -> ".join([chain[0].importer, *(f"{e.target} [{e.where(root)}]" for e in chain)])


def module_level_cycles(root: Path) -> list[str]:
    """One entry per strongly connected component: one cycle through it and every import
    inside it (each of them lies on some cycle; all must go for the component to vanish)."""
    modules = package_modules(root)
    graph = _graph([i for i in find_imports(root) if not i.local], modules)
    out = []
    for component in _strongly_connected(graph):
        members = set(component)
        first = component[0]
        nxt = min(t for t in graph[first] if t in members)
        cycle = [graph[first][nxt], *(_path(graph, nxt, first) or [])]
        edges = [e for m in component for t, e in sorted(graph[m].items()) if t in members]
        listing = "".join(f"\n    {e.where(root)}: {e.importer} imports {e.target}"
                          f"{' (under TYPE_CHECKING)' if e.type_checking else ''}" for e in edges)
        out.append(f"import cycle among {', '.join(component)}:\n  e.g. {_chain(cycle, root)}"
                   f"\n  module-level imports inside the cycle:{listing}")
    return out


def function_import_cycles(root: Path) -> list[str]:
    """Function-local imports that close a cycle no module-level import closes on its own."""
    modules = package_modules(root)
    imports = find_imports(root)
    graph = _graph(imports, modules)
    module_level = _graph([i for i in imports if not i.local], modules)
    out = []
    seen: set[tuple[str, str]] = set()
    for imp in imports:
        edge = (imp.importer, imp.target)
        if not imp.local or imp.target not in modules or edge in seen or imp.target in module_level[imp.importer]:
            continue
        seen.add(edge)
        back = _path(graph, imp.target, imp.importer)
        if back is not None:
            out.append(f"{imp.where(root)}: function-local import closes an import cycle: "
                       f"{_chain([imp, *back], root)}")
    return out


# ---------------------------------------------------------------------- the tree
def test_every_file_is_parsed() -> None:
    # guards against a vacuous pass: the visitor must reach every import statement that a
    # plain ast.walk sees, in every file of the package
    files = sorted(PACKAGE_DIR.rglob("*.py"))
    assert len(package_modules(PACKAGE_DIR)) == len(files) > 10
    seen = {(i.file, i.line) for i in find_imports(PACKAGE_DIR)}
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        lines = {n.lineno for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                 and not (isinstance(n, ast.ImportFrom) and n.module == "__future__")}
        assert lines <= {line for f, line in seen if f == path}, path
    assert {layer_of(m) for m, _ in [(i.importer, 0) for i in find_imports(PACKAGE_DIR)]} >= {r.layer for r in RULES}


def test_layer_rules() -> None:
    violations = layer_violations(PACKAGE_DIR)
    assert not violations, "layer rules broken:\n" + "\n".join(violations)


def test_the_package_face_rule() -> None:
    violations = face_violations(PACKAGE_DIR)
    assert not violations, "package face rule broken:\n" + "\n".join(violations)


def test_no_module_level_cycles() -> None:
    cycles = module_level_cycles(PACKAGE_DIR)
    assert not cycles, "module-level import cycles:\n" + "\n".join(cycles)


def test_no_cycles_through_function_imports() -> None:
    cycles = function_import_cycles(PACKAGE_DIR)
    assert not cycles, "cycles through function-local imports:\n" + "\n".join(cycles)


# ---------------------------------------------------------------------- the checker itself
FAKE = {
    "__init__.py": "from fakepkg.core.a import A\n",
    "core/__init__.py": "",
    "core/a.py": (
        "from typing import TYPE_CHECKING\n"
        "A = 1\n"
        "if TYPE_CHECKING:\n"
        "    from ..plugin import hooks\n"  # line 4: relative, type-checking only
        "def f():\n"
        "    import pytest\n"  # line 6: function-local
        "    from fakepkg.core import b\n"  # line 7: closes a cycle with b's module-level import
    ),
    "core/b.py": "from . import a\n",
    "engine/__init__.py": "",
    "engine/run.py": "import importlib\nX = importlib.import_module('fakepkg.plugin.hooks')\n",
    "engine/x.py": "from fakepkg.engine import y\n",
    "engine/y.py": "if True:\n    from fakepkg.engine.x import *\n",
    "report/__init__.py": "",
    "report/md.py": "class C:\n    from _pytest.config import Config\n",
    "plugin/__init__.py": "import pytest\n",
    "plugin/hooks.py": "import pytest\nfrom fakepkg.engine.run import X\n",
}


@pytest.fixture
def fake_package(tmp_path: Path) -> Path:
    root = tmp_path / "fakepkg"
    for rel, text in FAKE.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_checker_catches_layer_violations(fake_package: Path) -> None:
    assert sorted(layer_violations(fake_package)) == [
        ("fakepkg/core/a.py:4: core must import nothing from fakepkg outside fakepkg.core: "
         "imports fakepkg.plugin.hooks (under TYPE_CHECKING)"),
        "fakepkg/core/a.py:6: core must not import pytest: imports pytest (function-local)",
        "fakepkg/engine/run.py:2: engine must not import fakepkg.plugin: imports fakepkg.plugin.hooks",
        "fakepkg/report/md.py:2: report must not import pytest: imports _pytest.config",
    ]


def test_checker_catches_face_violations(fake_package: Path) -> None:
    (fake_package / "engine" / "ver.py").write_text("from fakepkg import VERSION\n")
    (fake_package / "_leaf.py").write_text("VERSION = 1\n")
    (fake_package / "__init__.py").write_text("from fakepkg._leaf import VERSION\nfrom fakepkg.core.a import A\n")
    assert sorted(face_violations(fake_package)) == [
        ("fakepkg/__init__.py:2: the package face imports only leaf modules at module level: "
         "imports fakepkg.core.a, which imports more of fakepkg"),
        ("fakepkg/engine/ver.py:1: fakepkg.engine.ver imports the package face fakepkg "
         "(an arrow back up the layers): import its leaf module instead"),
    ]


def test_checker_catches_cycles(fake_package: Path) -> None:
    cycles = module_level_cycles(fake_package)
    assert len(cycles) == 2
    engine_cycle = next(c for c in cycles if "fakepkg.engine.x" in c)
    assert "fakepkg/engine/x.py:1: fakepkg.engine.x imports fakepkg.engine.y" in engine_cycle
    assert "fakepkg/engine/y.py:2: fakepkg.engine.y imports fakepkg.engine.x" in engine_cycle
    # a (TYPE_CHECKING) -> plugin.hooks -> engine.run -> (literal import_module) plugin.hooks
    plugin_cycle = next(c for c in cycles if "fakepkg.plugin.hooks" in c)
    assert "import cycle among fakepkg.engine.run, fakepkg.plugin.hooks" in plugin_cycle
    assert function_import_cycles(fake_package) == [
        ("fakepkg/core/a.py:7: function-local import closes an import cycle: "
         "fakepkg.core.a -> fakepkg.core.b [fakepkg/core/a.py:7] -> fakepkg.core.a [fakepkg/core/b.py:1]"),
    ]


def test_clean_package_passes(tmp_path: Path) -> None:
    root = tmp_path / "cleanpkg"
    (root / "core").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "core" / "__init__.py").write_text("from .q import Q\n")
    (root / "core" / "q.py").write_text("import json\nQ = json\n")
    assert layer_violations(root) == module_level_cycles(root) == function_import_cycles(root) == []
