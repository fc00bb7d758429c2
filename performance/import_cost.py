"""Import cost: what installing the plugin adds to a pytest run that does not use it.

    .venv/bin/python performance/import_cost.py                 # 15 runs of each variant
    .venv/bin/python performance/import_cost.py --runs 25 --json performance/out/import_cost.json

Budget: `pytest -q` on one trivial test may cost at most +30 ms wall and +3 MB peak RSS over
`pytest -q -p no:satbench` on the same file (the plugin is an entry point, so every pytest
run in the environment loads it). Exit status 1 with a one-line reason when it does not fit.

Both variants run in the same temporary rootdir (its own pytest.ini, so the project's
configuration is not read) as fresh child processes of sys.executable, alternating, the order
flipping every repetition, after warm-up runs that are not counted (bytecode, page cache).
Wall time and the child's peak RSS come from performance/_measure.py's `measured` (GNU time when
present, so the RSS is the child's and not this process's floor); the deltas are between
medians.

Then it explains the delta:
- the modules only the plugin run has, from a conftest in a second rootdir that dumps
  sys.modules at pytest_unconfigure for both variants;
- for the heavy ones (numpy, PIL, sqlite3, ssl, http.client, ...), the chain of package
  modules that imports each one first, read from `python -X importtime -m pytest` (its tree
  prints children before their parent, indented two spaces a level), with the cumulative
  import time; and every package module loaded at start-up that imports it at module level
  (an ast scan: making the first importer lazy only moves the cost to the next one).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from _measure import measured, write_result  # performance/ is on sys.path when run as a script

PACKAGE = "pytest_satbench"
BUDGET_WALL_MS = 30.0
BUDGET_RSS_MB = 3.0
VARIANTS: dict[str, list[str]] = {"plugin": [], "no plugin": ["-p", "no:satbench"]}
PROBE_ENV = "IMPORT_COST_PROBE"
# Worth making lazy when the plugin is the only reason they load: native extensions, big
# packages, or stdlib modules with long import chains of their own.
HEAVY = ("numpy", "PIL", "pyarrow", "torch", "torchvision", "timm", "requests", "urllib3", "sqlite3",
         "ssl", "http.client", "http.server", "urllib.request", "email", "socket", "asyncio",
         "concurrent.futures", "multiprocessing", "ctypes", "pickle", "csv", "uuid", "xml", "zipfile",
         "decimal", "statistics", "pkgutil", "queue", "selectors")

TRIVIAL_TEST = "def test_trivial():\n    pass\n"
PROBE_CONFTEST = f'''\
import json, os, sys

def pytest_unconfigure(config):
    mods = {{name: getattr(m, "__file__", None) for name, m in list(sys.modules.items())}}
    with open(os.environ["{PROBE_ENV}"], "w") as fh:
        json.dump(mods, fh)
'''


@dataclass
class Run:
    variant: str
    rep: int
    wall_ms: float
    cpu_ms: float  # user+sys: steadier than wall on a loaded machine, shown, not budgeted
    max_rss_mb: float


@dataclass
class Heavy:
    module: str  # the watched name: numpy, http.client, ...
    submodules: int  # how many entries of sys.modules it added
    import_ms: float | None  # cumulative, from -X importtime, of its first import
    first_chain: list[str]  # package modules from the outermost down to its importer
    module_level_importers: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------- set-up
def child_env() -> dict[str, str]:
    """This environment minus what would change either variant: pytest's own variables and
    the plugin's SATBENCH_* settings (they could make it start a server)."""
    drop = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("SATBENCH_")}


def make_rootdir(path: Path, conftest: str | None = None) -> Path:
    path.mkdir()
    (path / "pytest.ini").write_text("[pytest]\n")
    (path / "test_trivial.py").write_text(TRIVIAL_TEST)
    if conftest is not None:
        (path / "conftest.py").write_text(conftest)
    return path


def pytest_cmd(extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "test_trivial.py", *extra]


# ---------------------------------------------------------------------- timing
def one_run(variant: str, rep: int, root: Path, logs: Path, env: dict[str, str]) -> Run:
    log = logs / f"{variant.replace(' ', '_')}-{rep}.log"
    wall, cpu, rss, rc = measured(pytest_cmd(VARIANTS[variant]), root, log, env)
    text = log.read_text()
    if rc != 0 or "1 passed" not in text:
        tail = " | ".join(text.strip().splitlines()[-3:])
        raise SystemExit(f"{variant}: pytest failed (exit {rc}): {tail}")
    return Run(variant, rep, wall * 1000, cpu * 1000, rss)


def time_variants(root: Path, logs: Path, runs: int, warmup: int) -> list[Run]:
    env = child_env()
    names = list(VARIANTS)
    for i in range(warmup):
        for name in names:
            one_run(name, -1 - i, root, logs, env)
    out: list[Run] = []
    for rep in range(runs):
        for name in names if rep % 2 == 0 else names[::-1]:
            out.append(one_run(name, rep, root, logs, env))
    return out


def medians(runs: list[Run]) -> dict[str, dict[str, float]]:
    return {name: {key: statistics.median(getattr(r, key) for r in runs if r.variant == name)
                   for key in ("wall_ms", "cpu_ms", "max_rss_mb")}
            for name in VARIANTS}


# ---------------------------------------------------------------------- which modules
def loaded_modules(root: Path, variant: str) -> dict[str, str | None]:
    dump = root / f"modules-{variant.replace(' ', '_')}.json"
    env = {**child_env(), PROBE_ENV: str(dump)}
    proc = subprocess.run(pytest_cmd(VARIANTS[variant]), cwd=root, env=env, capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
        raise SystemExit(f"{variant}: probe run failed (exit {proc.returncode}): {tail}")
    return json.loads(dump.read_text())


def importtime_tree(root: Path) -> list[tuple[str, float, list[str]]]:
    """(module, cumulative ms, ancestors outermost first) for each line of -X importtime."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *pytest_cmd([])[1:]], cwd=root,
                          env=child_env(), capture_output=True, text=True, check=False)
    rows: list[tuple[str, float, int]] = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "imported package" in line:
            continue
        _self, cumulative, name = line.split("|")
        depth = (len(name) - len(name.lstrip()) - 1) // 2
        rows.append((name.strip(), int(cumulative) / 1000, depth))
    # children come before their parent: read backwards, so each line follows its ancestors
    out: list[tuple[str, float, list[str]]] = []
    stack: list[str] = []
    for name, ms, depth in reversed(rows):
        del stack[depth:]
        out.append((name, ms, list(stack)))
        stack.append(name)
    return out[::-1]


def _matches(module: str, watched: str) -> bool:
    return module == watched or module.startswith(watched + ".")


def module_level_imports(path: Path) -> set[str]:
    """Absolute names imported when the module is imported: not in functions, not under
    TYPE_CHECKING (neither runs at start-up)."""
    names: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_FunctionDef(self, node: ast.AST) -> None:
            pass  # the body runs only when called

        visit_AsyncFunctionDef = visit_Lambda = visit_FunctionDef

        def visit_If(self, node: ast.If) -> None:
            guarded = getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
            for stmt in (node.orelse if guarded else [*node.body, *node.orelse]):
                self.visit(stmt)

        def visit_Import(self, node: ast.Import) -> None:
            names.update(a.name for a in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.level == 0 and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)

    Visitor().visit(ast.parse(path.read_text(encoding="utf-8")))
    return names


def explain(extra: set[str], loaded: dict[str, str | None], tree: list[tuple[str, float, list[str]]]) -> list[Heavy]:
    ours = {name: Path(f) for name, f in loaded.items() if _matches(name, PACKAGE) and f}
    scanned = {name: module_level_imports(path) for name, path in sorted(ours.items())}
    out: list[Heavy] = []
    for watched in HEAVY:
        added = [m for m in extra if _matches(m, watched) or _matches(m.lstrip("_"), watched)]
        if not added:
            continue
        # the tops of its subtrees: added lines with no added ancestor of the same watch
        # (PIL and PIL.Image are siblings under their importer; email may be loaded already
        # and only email.parser added)
        tops = [(ms, anc) for name, ms, anc in tree
                if name in added and not any(_matches(a, watched) for a in anc)]
        chain = [a for a in tops[0][1] if _matches(a, PACKAGE)] if tops else []
        importers = [name for name, imported in scanned.items() if any(_matches(i, watched) for i in imported)]
        out.append(Heavy(watched, len(added), sum(ms for ms, _ in tops) if tops else None, chain, importers))
    return out


# ---------------------------------------------------------------------- report
def print_report(med: dict[str, dict[str, float]], runs: int, extra: set[str], heavy: list[Heavy],
                 plugin_ms: float) -> None:
    print(f"\n{'median of ' + str(runs):26}{'wall ms':>10}{'CPU ms':>10}{'peak RSS MB':>14}")
    for name, m in med.items():
        label = "pytest -q " + " ".join(VARIANTS[name])
        print(f"{label:26}{m['wall_ms']:10.1f}{m['cpu_ms']:10.1f}{m['max_rss_mb']:14.1f}")
    d_wall, d_rss = deltas(med)
    d_cpu = med["plugin"]["cpu_ms"] - med["no plugin"]["cpu_ms"]
    print(f"{'plugin adds':26}{d_wall:+10.1f}{d_cpu:+10.1f}{d_rss:+14.1f}"
          f"   (budget +{BUDGET_WALL_MS:.0f} ms wall, +{BUDGET_RSS_MB:.0f} MB)")
    roots = {h.module.split(".")[0] for h in heavy}
    # _sqlite3, _ssl: the extension behind a watched module, already counted with it
    others = sorted({m.split(".")[0] for m in extra if m.split(".")[0].lstrip("_") not in roots} - {PACKAGE})
    print(f"\n{len(extra)} modules load only with the plugin; importing {PACKAGE} at start-up: "
          f"{plugin_ms:.0f} ms cumulative (-X importtime, one run)")
    ours = sorted(m.removeprefix(PACKAGE + ".") for m in extra if _matches(m, PACKAGE))
    print(f"package modules loaded at start-up ({len(ours)}): {', '.join(ours)}")
    print("heavy ones (first import chain, outermost first; cumulative import ms):" if heavy else "heavy ones: none")
    for h in heavy:
        ms = f"{h.import_ms:6.1f} ms" if h.import_ms is not None else "     ? ms"
        chain = " -> ".join(m.removeprefix(PACKAGE + ".") for m in h.first_chain) or "(pytest hook, function-local)"
        print(f"  {h.module:20}{ms}  {h.submodules:4} modules  via {chain}")
        print(f"  {'':20}imported at module level by: {', '.join(h.module_level_importers) or '-'}")
    print(f"other top-level packages it adds: {', '.join(others) or '-'}")


def deltas(med: dict[str, dict[str, float]]) -> tuple[float, float]:
    return (med["plugin"]["wall_ms"] - med["no plugin"]["wall_ms"],
            med["plugin"]["max_rss_mb"] - med["no plugin"]["max_rss_mb"])


def over_budget(d_wall: float, d_rss: float) -> str | None:
    broken = []
    if d_wall > BUDGET_WALL_MS:
        broken.append(f"+{d_wall:.1f} ms wall (budget +{BUDGET_WALL_MS:.0f} ms)")
    if d_rss > BUDGET_RSS_MB:
        broken.append(f"+{d_rss:.1f} MB peak RSS (budget +{BUDGET_RSS_MB:.0f} MB)")
    return "import-cost budget exceeded: " + ", ".join(broken) if broken else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=15, help="measured runs of each variant (default 15)")
    ap.add_argument("--warmup", type=int, default=2, help="uncounted runs of each variant first (default 2)")
    ap.add_argument("--json", type=Path, metavar="PATH", help="also write the results here")
    a = ap.parse_args()
    if a.runs < 1 or a.warmup < 0:
        ap.error("--runs must be positive and --warmup not negative")
    with tempfile.TemporaryDirectory(prefix="satbench-import-cost-") as t:
        tmp = Path(t)
        root, probe, logs = make_rootdir(tmp / "run"), make_rootdir(tmp / "probe", PROBE_CONFTEST), tmp / "logs"
        logs.mkdir()
        with_plugin, without = loaded_modules(probe, "plugin"), loaded_modules(probe, "no plugin")
        if PACKAGE not in with_plugin or any(_matches(m, PACKAGE) for m in without):
            raise SystemExit(f"the variants are not what they claim: is {PACKAGE} the `satbench` entry point?")
        runs = time_variants(root, logs, a.runs, a.warmup)
        tree = importtime_tree(root)
    extra = set(with_plugin) - set(without)
    heavy = explain(extra, with_plugin, tree)
    # depth-0 lines are the imports done straight from the entry point load and hooks
    plugin_ms = sum(ms for name, ms, anc in tree if not anc and _matches(name, PACKAGE))
    med = medians(runs)
    print_report(med, a.runs, extra, heavy, plugin_ms)
    d_wall, d_rss = deltas(med)
    verdict = over_budget(d_wall, d_rss)
    if a.json:
        write_result(
            a.json,
            budget={"wall_ms": BUDGET_WALL_MS, "max_rss_mb": BUDGET_RSS_MB},
            medians=med, delta={"wall_ms": d_wall, "max_rss_mb": d_rss}, verdict=verdict or "ok",
            plugin_import_ms=plugin_ms, extra_modules=sorted(extra),
            heavy=[asdict(h) for h in heavy], runs=[asdict(r) for r in runs],
        )
    if verdict:
        raise SystemExit(verdict)
    print(f"within budget: {d_wall:+.1f} ms wall, {d_rss:+.1f} MB peak RSS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
