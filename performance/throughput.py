"""Throughput: the seed script and the plugin against the same zero-latency loopback server.

    .venv/bin/python performance/throughput.py                    # 100 images x 100 questions, 3 reps
    .venv/bin/python performance/throughput.py --questions 2000 --reps 1
    .venv/bin/python performance/throughput.py --baseline-tree /tmp/old   # also an older checkout

With `--baseline-tree DIR` (a checkout of another commit, e.g. `git worktree add /tmp/old
<commit>`), a third side runs that tree's plugin (`PYTHONPATH=DIR`, same venv) in the same
repetitions: a change is measured against what it replaced, side by side.

Both clients answer the same RSVQA-LR-format data (generated here: --images images, the
questions spread evenly over them) with the same stand-in reconstruction (a JPEG quality-50
round trip on the CPU: performance/_seed_standins/mllm/recon.py for the seed, the `cheap` codec
registered by a conftest.py for the plugin), at the same concurrency, two requests per
question (original and reconstruction), scored by the same functions.

Every run gets a fresh server process (tests/servers.py's FakeVLM, answering "yes" at once)
and the plugin a fresh rootdir, so its results store is empty and it really asks. The
server runs in its own process so its CPU is not the client's; each client's CPU (user+sys)
and peak RSS come from os.wait4 on the client process. Runs alternate seed/plugin and the
order flips every repetition; the table shows medians. Absolute numbers depend on the
machine and its load; the ratio is the result.

The seed is copied, not modified: its literal `ROOT = "${TOKLIP_ROOT}"` is replaced with the
generated root in the temporary copy, and `--recon-gpu` only sets CUDA_VISIBLE_DEVICES.
Results go to performance/out/throughput.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from _measure import measured, write_result  # performance/ is on sys.path when run as a script
from _server import ZeroLatencyServer
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
SEED = Path("/work/shared/seeds/eval_e2e.py")
STANDINS = REPO / "performance" / "_seed_standins"
OUT = REPO / "performance" / "out"
N_STUBS = 50  # leading inactive records, as in the real split files
# The plugin sides and their extra options. "plugin" is the default user experience; the
# lean side shows what the end-of-run reports cost (they are proportional to the questions).
SIDES: dict[str, list[str]] = {"plugin": [], "plugin --no-reports": ["--no-reports"]}
BASELINE = "plugin, baseline tree"
_baseline_tree: Path | None = None

CONFTEST = '''\
"""Registers the `cheap` codec: the seed stand-in's JPEG quality-50 round trip."""
import sys
from collections.abc import Sequence

sys.path.insert(0, {standins!r})
from mllm.recon import QUALITY, jpeg_roundtrip  # noqa: E402

from pytest_satbench.codecs.base import ArmSpec, Codec, CodecFactory, register_codec, reject_unknown


class Cheap(Codec):
    def __init__(self, spec: ArmSpec) -> None:
        self.arms = (spec,)

    def reconstruct(self, image):
        return [jpeg_roundtrip(image)]


def _normalise(params: dict) -> ArmSpec:
    reject_unknown("cheap", params, set())
    return ArmSpec("cheap")


def _build(specs: Sequence[ArmSpec]) -> list:
    return [Cheap(s) for s in specs]


register_codec(CodecFactory("cheap", _normalise, _build, f"JPEG q{{QUALITY}} round trip (bench)"))
'''

TEST_MODULE = 'from pytest_satbench import benchmark_test\n\ntest_rsvqa_lr = benchmark_test("rsvqa_lr")\n'


@dataclass
class Run:
    side: str  # "seed" | "plugin"
    rep: int
    questions: int
    wall_s: float
    cpu_s: float  # client user+sys
    max_rss_mb: float
    server_cpu_s: float
    server_requests: int
    server_connections: int
    reconstructions: int  # stand-in codec runs (100 images: 100 with a single-flight cache)

    @property
    def qps(self) -> float:
        return self.questions / self.wall_s

    @property
    def cpu_ms_per_q(self) -> float:
        return 1000 * self.cpu_s / self.questions


# ---------------------------------------------------------------------- data
def make_data(data_root: Path, n_images: int, n_questions: int, seed: int = 0) -> None:
    """RSVQA-LR test split files and 256x256 RGB tifs, as the real release lays them out."""
    base = data_root / "RSVQA-LR"
    (base / "Images_LR").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for img in range(n_images):
        # smooth fields plus sensor noise: compresses like aerial imagery, not like white noise
        coarse = Image.fromarray(rng.integers(40, 220, size=(8, 8, 3), dtype=np.uint8))
        px = np.asarray(coarse.resize((256, 256), Image.Resampling.BICUBIC), dtype=np.float32)
        px += rng.normal(0, 6, size=px.shape)
        Image.fromarray(np.clip(px, 0, 255).astype(np.uint8)).save(base / "Images_LR" / f"{img}.tif")
    questions: list[dict] = [{"id": i, "active": False} for i in range(N_STUBS)]
    answers: list[dict] = [{"id": i, "active": False} for i in range(N_STUBS)]
    objects = ("buildings", "roads", "water areas", "farmlands", "residential buildings")
    for n in range(n_questions):
        qid, img = N_STUBS + n, n * n_images // n_questions
        kind = ("presence", "comp", "count", "presence", "comp")[n % 5]
        a, b = objects[n % len(objects)], objects[(n // 5) % len(objects)]
        if n % 100 == 0:
            kind, text, ans = "rural_urban", "Is it a rural or an urban area", "rural"
        elif kind == "presence":
            text, ans = f"Is there a {a[:-1]}?", ("yes", "no")[n % 2]
        elif kind == "comp":
            text, ans = f"Are there more {a} than {b}?", ("no", "yes")[n % 2]
        else:
            text, ans = f"How many {a} are there?", str(n % 7)
        questions.append({"id": qid, "date_added": 1569489630.7, "img_id": img, "people_id": 0,
                          "type": kind, "question": text, "answers_ids": [qid], "active": True})
        answers.append({"id": qid, "date_added": 1569489630.7, "question_id": qid, "people_id": 0,
                        "answer": ans, "active": True})
    (base / "LR_split_test_questions.json").write_text(json.dumps({"questions": questions}))
    (base / "LR_split_test_answers.json").write_text(json.dumps({"answers": answers}))


def seed_copy(tmp: Path, toklip_root: Path) -> Path:
    """The seed under <tmp>/seed/src/mllm/ (it puts <tmp>/seed and <tmp>/seed/src on sys.path)
    next to the stand-in modules, with ROOT pointing at the generated data."""
    src = tmp / "seed" / "src"
    shutil.copytree(STANDINS, src, ignore=shutil.ignore_patterns("__pycache__"))
    text = SEED.read_text()
    if 'ROOT = "${TOKLIP_ROOT}"' not in text:
        raise SystemExit(f"{SEED}: no `ROOT = \"${{TOKLIP_ROOT}}\"` line to point at the data; "
                         "update performance/throughput.py for the new seed")
    text = text.replace('ROOT = "${TOKLIP_ROOT}"', f"ROOT = {str(toklip_root)!r}")
    target = src / "mllm" / "eval_e2e.py"
    target.write_text(text)
    return target


def plugin_rootdir(tmp: Path, name: str) -> Path:
    root = tmp / f"plugin-{name}"
    root.mkdir()
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "conftest.py").write_text(CONFTEST.format(standins=str(STANDINS)))
    (root / "test_rsvqa.py").write_text(TEST_MODULE)
    return root


# ---------------------------------------------------------------------- processes




def run_seed(tmp: Path, seed_py: Path, toklip_root: Path, rep: int, n: int, concurrency: int) -> Run:
    with ZeroLatencyServer() as srv:
        log = OUT / f"throughput-seed-{rep}.log"
        cmd = [sys.executable, str(seed_py), "--bench", "rsvqa_lr", "--servers", srv.url,
               "--tag", f"bench{rep}", "--concurrency", str(concurrency), "--recon-gpu", "0"]
        wall, cpu, rss, rc = measured(cmd, tmp, log, _count_env(log))
        stats = srv.stop()
        server_cpu, reqs, conns = stats.cpu_s, stats.requests, stats.connections
    rows = toklip_root / "logs_geocot_pipeline" / "bench_e2e" / f"rsvqa_lr.bench{rep}.jsonl"
    lines = [json.loads(x) for x in rows.read_text().splitlines()] if rows.exists() else []
    errors = [r for r in lines if "error" in r]
    if rc != 0 or len(lines) != n or errors:
        raise SystemExit(f"seed run {rep} failed (exit {rc}, {len(lines)} rows, {len(errors)} errors"
                         f"{': ' + errors[0]['error'] if errors else ''}); see {log}")
    return _run("seed", rep, n, wall, cpu, rss, server_cpu, reqs, conns, log)


def run_plugin(tmp: Path, data_root: Path, rep: int, n: int, concurrency: int, side: str) -> Run:
    root = plugin_rootdir(tmp, f"{side}-{rep}")  # fresh rootdir: empty store, every answer is asked
    with ZeroLatencyServer() as srv:
        log = OUT / f"throughput-{side.replace(' --', '-')}-{rep}.log"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "--rootdir", str(root),
               "test_rsvqa.py", "--data-root", str(data_root), "--servers", srv.url, "--recon", "cheap",
               "--concurrency", str(concurrency), *SIDES[side]]
        env = _count_env(log)
        if side == BASELINE:
            env["PYTHONPATH"] = str(_baseline_tree)
        wall, cpu, rss, rc = measured(cmd, root, log, env)
        stats = srv.stop()
        server_cpu, reqs, conns = stats.cpu_s, stats.requests, stats.connections
    text = log.read_text()
    if rc != 0 or f"{n} passed" not in text:
        tail = "\n".join(text.splitlines()[-5:])
        raise SystemExit(f"plugin run {rep} failed (exit {rc}); see {log}:\n{tail}")
    return _run(side, rep, n, wall, cpu, rss, server_cpu, reqs, conns, log)


def _count_env(log: Path) -> dict[str, str]:
    log.with_suffix(".recons").unlink(missing_ok=True)
    return {**os.environ, "SATBENCH_BENCH_RECON_COUNT": str(log.with_suffix(".recons"))}


def _run(side: str, rep: int, n: int, wall: float, cpu: float, rss: float, server_cpu: float, reqs: int,
         conns: int, log: Path) -> Run:
    if reqs != 2 * n:
        raise SystemExit(f"{side} run {rep}: the server answered {reqs} chat requests, expected {2 * n}")
    counted = log.with_suffix(".recons")
    recons = int(counted.read_text()) if counted.exists() else -1
    return Run(side, rep, n, wall, cpu, rss, server_cpu, reqs, conns, recons)


# ---------------------------------------------------------------------- report
def summarise(runs: list[Run]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for side in ("seed", *SIDES):
        rs = [r for r in runs if r.side == side]
        out[side] = {
            "questions_per_s": statistics.median(r.qps for r in rs),
            "client_cpu_ms_per_question": statistics.median(r.cpu_ms_per_q for r in rs),
            "client_cpu_s": statistics.median(r.cpu_s for r in rs),
            "wall_s": statistics.median(r.wall_s for r in rs),
            "client_max_rss_mb": statistics.median(r.max_rss_mb for r in rs),
            "server_cpu_ms_per_question": statistics.median(1000 * r.server_cpu_s / r.questions for r in rs),
            "server_connections": statistics.median(r.server_connections for r in rs),
            "reconstructions": statistics.median(r.reconstructions for r in rs),
        }
    # Ratios per repetition (the two runs of one repetition ran back to back), then the median.
    reps = sorted({r.rep for r in runs})
    for side in SIDES:
        pairs = [(next(r for r in runs if r.rep == k and r.side == "seed"),
                  next(r for r in runs if r.rep == k and r.side == side)) for k in reps]
        out[f"{side} / seed"] = {
            "questions_per_s": statistics.median(p.qps / s.qps for s, p in pairs),
            "client_cpu_per_question": statistics.median(p.cpu_s / s.cpu_s for s, p in pairs),
        }
    return out


def table(summary: dict[str, dict[str, float]], runs: list[Run], reps: int) -> str:
    sides = ["seed", *SIDES]
    rows = [
        ("questions/s (end to end)", "questions_per_s", "questions_per_s"),
        ("client CPU ms / question", "client_cpu_ms_per_question", "client_cpu_per_question"),
        ("client peak RSS MB", "client_max_rss_mb", None),
        ("server CPU ms / question", "server_cpu_ms_per_question", None),
        ("TCP connections to the server", "server_connections", None),
        ("stand-in reconstructions", "reconstructions", None),
    ]
    head = f"{'median of ' + str(reps) + ' rep(s)':32}" + "".join(f"{x:>22}" for x in sides)
    lines = [head]
    for name, key, ratio_key in rows:
        cells = [f"{summary[s][key]:22.1f}" if s == "seed" or ratio_key is None else
                 f"{summary[s][key]:12.1f} ({summary[s + ' / seed'][ratio_key]:5.2f}x)" for s in sides]
        lines.append(f"{name:32}" + "".join(cells))
    lines.append("(ratios: median over repetitions of side / seed in the same repetition)")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=int, default=10_000, help="questions (two requests each); default 10000")
    ap.add_argument("--images", type=int, default=100, help="images the questions are spread over; default 100")
    ap.add_argument("--reps", type=int, default=3, help="repetitions, each one seed run and one plugin run")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--baseline-tree", type=Path, default=None,
                    help="also run the plugin of this checkout (another commit) side by side")
    a = ap.parse_args()
    if a.baseline_tree is not None:
        global _baseline_tree
        if not (a.baseline_tree / "pytest_satbench").is_dir():
            ap.error(f"--baseline-tree {a.baseline_tree}: no pytest_satbench/ there; pass a checkout of this repository")
        _baseline_tree = a.baseline_tree.resolve()
        SIDES[BASELINE] = []
    if a.questions < 1 or a.images < 1 or a.reps < 1 or a.concurrency < 1:
        ap.error("--questions, --images, --reps and --concurrency must be positive")
    OUT.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="satbench-throughput-") as t:
        tmp = Path(t)
        toklip_root = tmp / "toklip"
        make_data(toklip_root / "data", a.images, a.questions)
        seed_py = seed_copy(tmp, toklip_root)
        sides = ["seed", *SIDES]
        for rep in range(a.reps):
            order = sides if rep % 2 == 0 else sides[::-1]
            for side in order:
                if side == "seed":
                    run = run_seed(tmp, seed_py, toklip_root, rep, a.questions, a.concurrency)
                else:
                    run = run_plugin(tmp, toklip_root / "data", rep, a.questions, a.concurrency, side)
                runs.append(run)
                print(f"  rep {rep} {side:20} {run.wall_s:6.1f} s  {run.qps:6.0f} q/s  "
                      f"client CPU {run.cpu_s:6.1f} s ({run.cpu_ms_per_q:.2f} ms/q)", flush=True)
    summary = summarise(runs)
    print()
    print(table(summary, runs, a.reps))
    write_result(
        OUT / "throughput.json",
        settings={"questions": a.questions, "images": a.images, "reps": a.reps,
                  "concurrency": a.concurrency, "requests_per_question": 2},
        summary=summary,
        runs=[asdict(r) | {"questions_per_s": r.qps, "cpu_ms_per_question": r.cpu_ms_per_q} for r in runs],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
