"""What pytest's standard per-item runtest costs question items, against the lean one.

    .venv/bin/python performance/runtest.py                     # 10,000 questions, 5 reps
    .venv/bin/python performance/runtest.py --questions 20000 --reps 3
    .venv/bin/python performance/runtest.py --baseline-tree /tmp/old   # also an older checkout's lean runtest

A plugin that needs pytest's standard runtest (pytest-json-report, pytest-rerunfailures with
--reruns, a conftest.py implementing pytest_runtest_setup/call/teardown) makes a run fall
back to it (plugin/compat.py). This measures the price per question item: the same resumed
run (every answer stored: nothing is asked, so what is left is pytest's per-item work, the
look-ahead's store reads and the plugin's bookkeeping), side by side:

- `lean`: the default;
- `standard`: the same, with a conftest.py implementing a no-op `pytest_runtest_setup`, which
  is what sends a run to the standard runtest (the run says so in one line);
- `baseline tree lean` with `--baseline-tree DIR`: another checkout's lean runtest (e.g. the
  commit before this protocol made its setup and teardown reports through
  pytest_runtest_makereport: `git worktree add /tmp/old <commit>`).

The data is RSVQA-LR's on-disk format (performance/throughput.py's generator), `--questions` over
`--images` images, asked once (the original only) from tests/servers.py's FakeVLM in its own
process; then each side runs `--reps` times in alternating order, each run's client CPU
(user+sys) from GNU time or os.wait4. The table shows medians and the difference per item.
Results go to performance/out/protocol.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from _measure import (  # performance/ is on sys.path when run as a script
    measured,
    write_result,
)
from _server import ZeroLatencyServer
from throughput import TEST_MODULE, make_data

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "performance" / "out"
STANDARD_CONFTEST = '''\
def pytest_runtest_setup(item):
    """A hook the lean runtest does not call: question items run the standard runtest."""
'''
LINE = "question items run pytest's standard per-item runtest"


def project(tmp: Path, name: str, *, standard: bool) -> Path:
    root = tmp / name
    root.mkdir()
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "test_rsvqa.py").write_text(TEST_MODULE)
    if standard:
        (root / "conftest.py").write_text(STANDARD_CONFTEST)
    return root


def one_run(root: Path, data: Path, store: Path, url: str, log: Path, tree: Path | None) -> tuple[float, float, str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "test_rsvqa.py",
           "--data-root", str(data), "--servers", url, "--store", str(store), "--no-reports",
           "--progress-every", "0"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    wall, cpu, _, rc = measured(cmd, root, log, env)
    text = log.read_text()
    if rc != 0:
        raise SystemExit(f"run failed (exit {rc}); see {log}:\n" + "\n".join(text.splitlines()[-5:]))
    return wall, cpu, text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=int, default=10_000)
    ap.add_argument("--images", type=int, default=100)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--baseline-tree", type=Path, default=None,
                    help="also run this checkout's (another commit's) lean runtest side by side")
    a = ap.parse_args()
    if a.baseline_tree is not None and not (a.baseline_tree / "pytest_satbench").is_dir():
        ap.error(f"--baseline-tree {a.baseline_tree}: no pytest_satbench/ there")
    OUT.mkdir(parents=True, exist_ok=True)
    sides: dict[str, tuple[bool, Path | None]] = {"lean": (False, None), "standard": (True, None)}
    if a.baseline_tree is not None:
        sides["baseline tree lean"] = (False, a.baseline_tree.resolve())
    cpu: dict[str, list[float]] = {s: [] for s in sides}
    wall: dict[str, list[float]] = {s: [] for s in sides}
    with tempfile.TemporaryDirectory(prefix="satbench-protocol-") as t, ZeroLatencyServer() as srv:
        tmp = Path(t)
        data = tmp / "data"
        make_data(data, a.images, a.questions)
        store = tmp / "results.sqlite"
        roots = {s: project(tmp, s.replace(" ", "-"), standard=std) for s, (std, _) in sides.items()}
        _, fill_cpu, _ = one_run(roots["lean"], data, store, srv.url, OUT / "protocol-fill.log", None)
        print(f"  filled the store: {a.questions} questions asked ({fill_cpu:.1f} s CPU)", flush=True)
        for rep in range(a.reps):
            order = list(sides) if rep % 2 == 0 else list(sides)[::-1]
            for side in order:
                std, tree = sides[side]
                log = OUT / f"protocol-{side.replace(' ', '-')}-{rep}.log"
                w, c, text = one_run(roots[side], data, store, srv.url, log, tree)
                flat = " ".join(text.split())
                if (tree is None and std != (LINE in flat)) or f"answers: 0 asked this run, {a.questions} reused" not in flat:
                    raise SystemExit(f"{side}: not the run expected (the protocol line; {a.questions} items, nothing "
                                     f"asked); see {log}")
                cpu[side].append(c)
                wall[side].append(w)
                print(f"  rep {rep} {side:20} {w:6.2f} s wall  {c:6.2f} s CPU ({1000 * c / a.questions:.3f} ms/item)",
                      flush=True)
    med = {s: statistics.median(v) for s, v in cpu.items()}
    per_item_us = {s: 1e6 * m / a.questions for s, m in med.items()}
    extra_us = 1e6 * (med["standard"] - med["lean"]) / a.questions
    # paired per repetition: the two runs of one repetition ran back to back
    paired = [1e6 * (s - lean) / a.questions for s, lean in zip(cpu["standard"], cpu["lean"])]
    print()
    print(f"{'median of ' + str(a.reps) + ' reps':24}{'CPU s':>10}{'us/item':>10}{'wall s':>10}")
    for s in sides:
        print(f"{s:24}{med[s]:10.2f}{per_item_us[s]:10.1f}{statistics.median(wall[s]):10.2f}")
    print(f"standard - lean: {extra_us:+.0f} us of client CPU per question item "
          f"(paired per repetition: median {statistics.median(paired):+.0f} us, range {min(paired):+.0f}..{max(paired):+.0f})")
    result = {"cpu_s": cpu, "wall_s": wall, "median_cpu_s": med, "cpu_us_per_item": per_item_us,
              "standard_minus_lean_us_per_item": extra_us, "paired_standard_minus_lean_us": paired}
    if a.baseline_tree is not None:
        result["lean_minus_baseline_lean_us_per_item"] = 1e6 * (med["lean"] - med["baseline tree lean"]) / a.questions
        print(f"lean - baseline tree lean: {result['lean_minus_baseline_lean_us_per_item']:+.0f} us per question item")
    write_result(OUT / "protocol.json", settings={"questions": a.questions, "images": a.images, "reps": a.reps},
                 **result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
