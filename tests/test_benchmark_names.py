"""Nothing outside a benchmark's own module names it: no string in the package's code (outside
`datasets/`, and the bundled reference server, which answers the demo) is a benchmark's name
or a prefix of one. Docstrings and help texts with examples do not count: they are prose."""

from __future__ import annotations

import ast
from pathlib import Path

from pytest_satbench.datasets import registry

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_satbench"
EXEMPT = ("datasets", "server")


def _code_strings(tree: ast.AST) -> list[ast.Constant]:
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docstrings]


def names_of(package: Path, benchmarks: set[str]) -> list[str]:
    prefixes = {name[:i] for name in benchmarks for i in range(4, len(name) + 1)}
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parts[0] in EXEMPT:
            continue
        for node in _code_strings(ast.parse(path.read_text(), str(path))):
            if node.value.lower() in prefixes:
                found.append(f"{rel}:{node.lineno}: names benchmark {node.value!r}")
    return found


def test_no_code_outside_datasets_names_a_benchmark() -> None:
    assert names_of(PACKAGE, set(registry.all_benchmarks())) == []


def test_the_check_finds_a_benchmark_name(tmp_path: Path) -> None:
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "scoring.py").write_text('"""rsvqa in a docstring is prose."""\nif b.startswith("vrsbench"): pass\n')
    assert names_of(tmp_path, {"vrsbench", "rsvqa_lr"}) == ["core/scoring.py:2: names benchmark 'vrsbench'"]
