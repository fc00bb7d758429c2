"""Nothing outside a benchmark's own module names it: no string in the package's code (outside
`datasets/`, and the bundled reference server, which answers the demo) is a benchmark's name
or a prefix of one. Docstrings and help texts with examples do not count: they are prose.

The same holds for codecs, in behaviour as well as in words: outside `codecs/` no string is a
codec's name or a spec of one (`"jpeg"`, `"onedpiece:..."`), no code reads a spec (`parse_spec`,
`ArmSpec.param`, an arm's text cut at `:`), branches on a spec's codec (`spec.codec == ...`) or
imports a codec's own module (`codecs.simple`, `codecs.onedpiece...`): what the rest of the
package needs of a codec (its label, its description, whether it is cached on disk, its
shorthand options) it asks the codec registry, `pytest_satbench.codecs`."""

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


# ---------------------------------------------------------------------- codecs

CODEC_EXEMPT = ("codecs",)
# Where a codec's name is a word of another vocabulary: (file, string, what it means there).
OTHER_MEANINGS = {
    ("engine/transport.py", "identity"): "the HTTP content coding (RFC 9110), not the codec",
    ("datasets/lhrs.py", "identity"): "an LHRS-Bench question type, not the codec",
}
PUBLIC_CODEC_MODULES = ("pytest_satbench.codecs", "pytest_satbench.codecs.base")
SPEC_READERS = ("parse_spec", "param", "runtime_param")  # what reads a spec's parameters


def _named(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _imported_modules(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement loads (`from pytest_satbench.codecs import simple`
    loads the module `pytest_satbench.codecs.simple`; `import ... arm_label` a name)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    mod = node.module or ""
    out = [mod]
    if mod == "pytest_satbench.codecs":
        real = PACKAGE / "codecs"
        out += [f"{mod}.{a.name}" for a in node.names if (real / f"{a.name}.py").exists() or (real / a.name).is_dir()]
    return out


def codec_knowledge(package: Path, codecs: set[str]) -> list[str]:
    """Every place outside `codecs/` that names a codec or acts on what only a codec knows."""
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parts[0] in CODEC_EXEMPT:
            continue
        where = rel.as_posix()
        tree = ast.parse(path.read_text(), str(path))
        for node in _code_strings(tree):
            v = node.value
            if (v in codecs or any(v.startswith(c + ":") for c in codecs)) and (where, v) not in OTHER_MEANINGS:
                found.append(f"{where}:{node.lineno}: names codec {v!r}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for mod in _imported_modules(node):
                    if mod.startswith("pytest_satbench.codecs.") and mod not in PUBLIC_CODEC_MODULES:
                        found.append(f"{where}:{node.lineno}: imports the codec module {mod}")
            elif isinstance(node, ast.Call):
                fn = _named(node.func)
                if fn in SPEC_READERS:
                    found.append(f"{where}:{node.lineno}: reads a codec spec ({fn})")
                elif fn in ("split", "partition", "rpartition") and isinstance(node.func, ast.Attribute) \
                        and any(w in _named(node.func.value).lower() for w in ("arm", "spec")) \
                        and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == ":":
                    found.append(f"{where}:{node.lineno}: reads a codec spec (cuts {_named(node.func.value)} at ':')")
            elif isinstance(node, ast.Compare):
                if any(isinstance(x, ast.Attribute) and x.attr == "codec" for x in [node.left, *node.comparators]):
                    found.append(f"{where}:{node.lineno}: branches on a spec's codec")
    return found


# Known, named and to be removed: code that still reads a spec, and the codec API that replaces it.
def test_no_code_outside_codecs_names_or_reads_a_codec() -> None:
    from pytest_satbench.codecs import base

    codecs = set(base.factories())
    assert {"identity", "jpeg", "resize", "onedpiece"} <= codecs
    assert codec_knowledge(PACKAGE, codecs) == []


def test_the_check_finds_codec_knowledge(tmp_path: Path) -> None:
    (tmp_path / "core").mkdir()
    (tmp_path / "codecs").mkdir()
    (tmp_path / "codecs" / "base.py").write_text('NAME = "jpeg"  # a codec names itself\n')
    (tmp_path / "core" / "arms.py").write_text(
        '"""jpeg:quality=10 in a docstring is prose."""\n'
        'from pytest_satbench.codecs.onedpiece.codec import OneDPieceCodec\n'
        'from pytest_satbench.codecs import base, simple\n'
        'def label(arm, spec):\n'
        '    if arm.startswith("onedpiece:"):\n'
        '        return "tok" + spec.param("nlatent")\n'
        '    if spec.codec == "identity":\n'
        '        return arm.split(":", 1)[0]\n'
        '    return parse_spec(arm)\n')
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "transport.py").write_text('if coding == "identity": pass\n')
    assert sorted(codec_knowledge(tmp_path, {"identity", "jpeg", "onedpiece"})) == sorted([
        "core/arms.py:5: names codec 'onedpiece:'",
        "core/arms.py:7: names codec 'identity'",
        "core/arms.py:2: imports the codec module pytest_satbench.codecs.onedpiece.codec",
        "core/arms.py:3: imports the codec module pytest_satbench.codecs.simple",
        "core/arms.py:6: reads a codec spec (param)",
        "core/arms.py:7: branches on a spec's codec",
        "core/arms.py:8: reads a codec spec (cuts arm at ':')",
        "core/arms.py:9: reads a codec spec (parse_spec)",
    ])
