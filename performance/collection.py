"""Collection: the plugin vs plain `@pytest.mark.parametrize` on an RSVQA-HR-sized suite.

    .venv/bin/python performance/collection.py              # 3 repetitions, about 3-4 minutes
    .venv/bin/python performance/collection.py --reps 1

Generates RSVQA-HR test split files in the real format (`USGS_split_test_questions.json` and
`..._answers.json`): 222,684 active questions over 2,226 images, in per-image blocks with
runs of `{"id": N, "active": false}` stubs before each block, about 1,000,000 stubs in all
(the real files are views of one global database). No image files: the loader only looks
for them (an `is_file()` per image); collection never opens one.

Then times `pytest --collect-only -q -p no:cacheprovider` (the 9 MB node-id cache would
otherwise distort every run after the first) of:

  plugin            `test_rsvqa_hr = benchmark_test("rsvqa_hr")` with --data-root
  parametrize+json  `@pytest.mark.parametrize("qid", ids)`, the ids of the active records
                    read from the same questions file in the module (the fair comparison:
                    the ids have to come from somewhere; the answers file is not even read)
  parametrize       the same ids from a small precomputed list: pytest's own cost alone
  empty             one trivial test: interpreter and pytest start-up

and, on a suite with a small RSVQA-LR split (10,004 questions) next to the HR one, the
plugin's whole benchmarks/test_rsvqa.py with and without `-k rsvqa_lr`: the plugin decides
from the -k expression that no HR item can be selected and never reads the HR files.

CPU (user+sys) and peak RSS come from os.wait4 on each pytest process; runs rotate their
order every repetition and the table shows medians. Results go to performance/out/collection.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from _measure import measured, write_result  # performance/ is on sys.path when run as a script

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "performance" / "out"

HR_QUESTIONS = 222_684
HR_IMAGES = 2_226
HR_STUBS = 1_000_000
LR_QUESTIONS = 10_004
LR_IMAGES = 100

TYPES_HR = ("presence", "comp", "count", "area")
OBJECTS = ("buildings", "roads", "water areas", "residential buildings", "commercial buildings",
           "parkings", "grass areas", "trees")


@dataclass
class Run:
    variant: str
    rep: int
    items: int
    wall_s: float
    cpu_s: float
    max_rss_mb: float


# ---------------------------------------------------------------------- data
def _question(qid: int, img: int, rng: random.Random, types: tuple[str, ...]) -> tuple[str, str]:
    kind = types[qid % len(types)]
    a, b = rng.choice(OBJECTS), rng.choice(OBJECTS)
    if kind == "presence":
        text, ans = f"Is there a {a[:-1]} in the image?", rng.choice(("yes", "no"))
    elif kind == "comp":
        text, ans = f"Are there more {a} than {b}?", rng.choice(("yes", "no"))
    elif kind == "count":
        text, ans = f"How many {a} are there?", str(rng.randint(0, 40))
    elif kind == "area":
        text, ans = f"What is the area covered by {a}?", f"{rng.randint(0, 9000)}m2"
    else:
        text, ans = "Is it a rural or an urban area", rng.choice(("rural", "urban"))
    q = json.dumps({"id": qid, "date_added": 1557407023.4, "img_id": img, "people_id": 0, "type": kind,
                    "question": text, "answers_ids": [qid], "active": True})
    r = json.dumps({"id": qid, "date_added": 1557407023.4, "question_id": qid, "people_id": 0,
                    "answer": ans, "active": True})
    return q, r


def write_split(folder: Path, prefix: str, n_questions: int, n_images: int, n_stubs: int,
                types: tuple[str, ...], seed: int) -> list[int]:
    """RSVQA split files: per image a run of stubs, then its block of active questions.
    Returns the active question ids in file order."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    per_image = [n_questions // n_images + (i < n_questions % n_images) for i in range(n_images)]
    cuts = sorted(rng.randrange(n_stubs + 1) for _ in range(n_images - 1))
    gaps = [b - a for a, b in zip([0, *cuts], [*cuts, n_stubs])]
    image_ids = sorted(rng.sample(range(10 * n_images), n_images))
    qparts: list[str] = []
    aparts: list[str] = []
    active: list[int] = []
    qid = 0
    for img, gap, n in zip(image_ids, gaps, per_image):
        for _ in range(gap):
            stub = f'{{"id": {qid}, "active": false}}'
            qparts.append(stub)
            aparts.append(stub)
            qid += 1
        for _ in range(n):
            q, a = _question(qid, img, rng, types)
            qparts.append(q)
            aparts.append(a)
            active.append(qid)
            qid += 1
    (folder / f"{prefix}_split_test_questions.json").write_text('{"questions": [' + ", ".join(qparts) + "]}")
    (folder / f"{prefix}_split_test_answers.json").write_text('{"answers": [' + ", ".join(aparts) + "]}")
    return active


PARAM_JSON = '''import json
import pytest

with open({path!r}, "rb") as fh:
    ids = [q["id"] for q in json.load(fh)["questions"] if q.get("active")]


@pytest.mark.parametrize("qid", ids)
def test_rsvqa_hr(qid):
    pass
'''

PARAM_IDS = '''import json
import pytest

with open({path!r}, "rb") as fh:
    ids = json.load(fh)


@pytest.mark.parametrize("qid", ids)
def test_rsvqa_hr(qid):
    pass
'''

PLUGIN_HR = 'from pytest_satbench import benchmark_test\n\ntest_rsvqa_hr = benchmark_test("rsvqa_hr")\n'
PLUGIN_SUITE = (REPO / "benchmarks" / "test_rsvqa.py").read_text()
EMPTY = "def test_nothing():\n    pass\n"


def make_suites(tmp: Path) -> dict[str, tuple[Path, list[str]]]:
    """variant -> (rootdir, extra pytest args)."""
    hr_only = tmp / "data-hr"
    both = tmp / "data-both"
    active = write_split(hr_only / "RSVQA-HR", "USGS", HR_QUESTIONS, HR_IMAGES, HR_STUBS, TYPES_HR, seed=1)
    both.mkdir()
    (both / "RSVQA-HR").symlink_to(hr_only / "RSVQA-HR")
    write_split(both / "RSVQA-LR", "LR", LR_QUESTIONS, LR_IMAGES, 50,
                ("presence", "comp", "count", "rural_urban"), seed=2)
    ids_file = tmp / "ids.json"
    ids_file.write_text(json.dumps(active))
    qfile = hr_only / "RSVQA-HR" / "USGS_split_test_questions.json"

    def suite(name: str, module: str) -> Path:
        root = tmp / name
        root.mkdir()
        (root / "pytest.ini").write_text("[pytest]\n")
        (root / "test_rsvqa.py").write_text(module)
        return root

    plugin = suite("plugin", PLUGIN_HR)
    return {
        # the first collection parses the JSON (its question cache is deleted before each
        # run); later ones (a resume, --lf, -k, every xdist worker) load the cached questions
        "plugin": (plugin, ["--data-root", str(hr_only)]),
        "plugin, cached questions": (plugin, ["--data-root", str(hr_only)]),
        "parametrize+json": (suite("param-json", PARAM_JSON.format(path=str(qfile))), []),
        "parametrize": (suite("param-ids", PARAM_IDS.format(path=str(ids_file))), []),
        "empty": (suite("empty", EMPTY), []),
        "plugin LR+HR suite": (suite("suite", PLUGIN_SUITE), ["--data-root", str(both)]),
        "plugin LR+HR suite -k rsvqa_lr": (tmp / "suite", ["--data-root", str(both), "-k", "rsvqa_lr"]),
    }


# ---------------------------------------------------------------------- runs



def collect(variant: str, root: Path, extra: list[str], rep: int) -> Run:
    log = OUT / f"collection-{variant.replace(' ', '_').replace('+', '_')}.log"
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
           "-p", "no:randomly", "--rootdir", str(root), "test_rsvqa.py", *extra]
    env = {k: v for k, v in os.environ.items() if k not in ("SATBENCH_DATA_ROOT", "TOKLIP_ROOT")}
    wall, cpu, rss, rc = measured(cmd, root, log, env)
    last = [x for x in log.read_text().splitlines() if x.strip()][-1:] or [""]
    words = last[0].split()
    if rc != 0 or not words or not words[0].isdigit():
        raise SystemExit(f"{variant}: pytest --collect-only failed (exit {rc}): {last[0]!r}; see {log}")
    items = int(words[0].split("/")[0])
    return Run(variant, rep, items, wall, cpu, rss)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="repetitions of every variant (default 3)")
    a = ap.parse_args()
    if a.reps < 1:
        ap.error("--reps must be positive")
    OUT.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="satbench-collection-") as t:
        tmp = Path(t)
        t0 = time.perf_counter()
        suites = make_suites(tmp)
        qsize = (tmp / "data-hr" / "RSVQA-HR" / "USGS_split_test_questions.json").stat().st_size
        asize = (tmp / "data-hr" / "RSVQA-HR" / "USGS_split_test_answers.json").stat().st_size
        print(f"generated RSVQA-HR test files ({qsize / 2**20:.0f} MB questions, {asize / 2**20:.0f} MB answers, "
              f"{HR_QUESTIONS:,} active + {HR_STUBS:,} stubs) in {time.perf_counter() - t0:.0f} s", flush=True)
        names = list(suites)
        for rep in range(a.reps):
            order = names[rep % len(names):] + names[: rep % len(names)]
            for name in order:
                root, extra = suites[name]
                if name.startswith("plugin") and "cached" not in name:
                    shutil.rmtree(root / ".satbench", ignore_errors=True)  # -p no:cacheprovider keeps it here
                elif "cached" in name and not (root / ".satbench").exists():
                    collect(name, root, extra, rep)  # fill the cache first
                run = collect(name, root, extra, rep)
                runs.append(run)
                print(f"  rep {rep} {name:32} {run.items:>7} items  CPU {run.cpu_s:5.1f} s  "
                      f"wall {run.wall_s:5.1f} s  peak RSS {run.max_rss_mb:5.0f} MB", flush=True)

    med: dict[str, dict[str, float]] = {}
    for name in names:
        rs = [r for r in runs if r.variant == name]
        med[name] = {"items": rs[0].items, "cpu_s": statistics.median(r.cpu_s for r in rs),
                     "wall_s": statistics.median(r.wall_s for r in rs),
                     "max_rss_mb": statistics.median(r.max_rss_mb for r in rs)}
    ratios = {
        base: {
            "cpu": med["plugin"]["cpu_s"] / med[base]["cpu_s"],
            "wall": med["plugin"]["wall_s"] / med[base]["wall_s"],
            "max_rss": med["plugin"]["max_rss_mb"] / med[base]["max_rss_mb"],
        }
        for base in ("parametrize+json", "parametrize")
    }
    cached = {
        base: {
            "cpu": med["plugin, cached questions"]["cpu_s"] / med[base]["cpu_s"],
            "wall": med["plugin, cached questions"]["wall_s"] / med[base]["wall_s"],
            "max_rss": med["plugin, cached questions"]["max_rss_mb"] / med[base]["max_rss_mb"],
        }
        for base in ("parametrize+json", "parametrize")
    }
    print()
    print(f"{'collect-only, median of ' + str(a.reps):34}{'items':>8}{'CPU s':>8}{'wall s':>8}{'peak RSS MB':>13}")
    for name in names:
        m = med[name]
        print(f"{name:34}{m['items']:8.0f}{m['cpu_s']:8.1f}{m['wall_s']:8.1f}{m['max_rss_mb']:13.0f}")
    print()
    for label, table in (("plugin", ratios), ("plugin, cached", cached)):
        for base, r in table.items():
            print(f"{label + ' / ' + base:42} CPU {r['cpu']:.2f}  wall {r['wall']:.2f}  peak RSS {r['max_rss']:.2f}"
                  f"   (target <= 0.60)")
    write_result(
        OUT / "collection.json",
        data={"hr_questions": HR_QUESTIONS, "hr_images": HR_IMAGES, "hr_stubs": HR_STUBS,
              "hr_questions_file_mb": qsize / 2**20, "hr_answers_file_mb": asize / 2**20,
              "lr_questions": LR_QUESTIONS},
        medians=med, plugin_over=ratios, plugin_cached_over=cached, runs=[asdict(r) for r in runs],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
