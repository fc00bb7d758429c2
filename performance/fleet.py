"""Fleet: the plugin, with default options, against simulated continuous-batching servers.

    .venv/bin/python performance/fleet.py                 # every scenario (about 6 minutes)
    .venv/bin/python performance/fleet.py --only hetero,equal4
    .venv/bin/python performance/fleet.py --sides adaptive,old   # also the pre-adaptive behaviour

Each server is `tests/fleet_sim.py` in its own process (so the client's CPU is not the
servers'): an engine step takes base + per_seq x running ms, each running request gains a
token a step, a request needs 40 tokens, at most max_num_seqs run and the rest wait. Its
capacity is max_num_seqs / (40 x step at a full batch), so utilisation = achieved / capacity
is exact. The plugin runs `pytest` on a synthetic RSVQA-LR split, original arm only (one
request per question), with a fresh store, and no option but --servers.

Achieved throughput is the client's: answers / (last answer - first request), read from the
store (each answer's `created` time and latency), so pytest's start-up and reports are not
in it. Scenarios (the targets are the issue's):

- hetero: two servers, max_num_seqs 256 and 64, 30 ms + 0.16 ms per sequence, 6,000
  questions: utilisation >= 0.90, each server's share within 5 points of its capacity share;
- metrics-off: the same fleet, servers without /metrics: utilisation >= 0.85;
- equal4: 4 equal servers (max_num_seqs 256) vs one, 6,000 questions per server:
  throughput >= 3.6x;
- slowdown: two equal servers, one slows to half speed 15 s into the run: the time until
  its share of completions (2-s windows) falls below the midpoint between its share before
  (1/2) and its capacity share after (1/3), target <= 10 s.

With `--sides adaptive,old` every scenario also runs with `--concurrency total:64 --concurrency-control
fixed`, the plugin's behaviour before adaptive limits, in the same invocation.
Results go to performance/out/fleet.json.
"""

from __future__ import annotations

import argparse
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "performance")]

from _measure import write_result  # noqa: E402 (after the sys.path setup above)
from datasets_fake import write_rsvqa  # noqa: E402 (after the sys.path setup above)
from fleet_sim import EngineParams, SimProcess, fetch_stats  # noqa: E402 (after the sys.path setup above)

OUT = REPO / "performance" / "out"
TEST_MODULE = 'from pytest_satbench import benchmark_test\n\ntest_rsvqa_lr = benchmark_test("rsvqa_lr")\n'
OLD = ("--concurrency", "total:64", "--concurrency-control", "fixed")
BIG = EngineParams(max_num_seqs=256)
SMALL = EngineParams(max_num_seqs=64)


@dataclass
class Outcome:
    scenario: str
    side: str  # "adaptive (default)" | "old: total:64 fixed"
    questions: int
    servers: list[dict[str, float]]  # per server: capacity_rps, completed, share, capacity_share
    achieved_rps: float
    capacity_rps: float
    wall_s: float  # the whole pytest run
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def utilisation(self) -> float:
        return self.achieved_rps / self.capacity_rps


def make_data(root: Path, questions: int) -> None:
    # 4 question types x per_type questions per image; small images keep the client's work
    # (decode, JPEG encode, base64) far below the servers'
    per_type = 10
    n_images = max(1, questions // (4 * per_type))
    write_rsvqa(root, "lr", n_images=n_images, per_type=per_type, image_size=64)


def run_plugin(work: Path, data: Path, urls: list[str], extra: tuple[str, ...],
               during: threading.Thread | None = None) -> tuple[float, Path]:
    run_dir = Path(tempfile.mkdtemp(dir=work))
    (run_dir / "test_rsvqa.py").write_text(TEST_MODULE)
    (run_dir / "pytest.ini").write_text("[pytest]\n")
    store = run_dir / "results.sqlite"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "test_rsvqa.py",
           "--servers", ",".join(urls), "--data-root", str(data), "--store", str(store), "--no-reports", *extra]
    log = run_dir / "pytest.log"
    t0 = time.monotonic()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=run_dir, stdout=fh, stderr=subprocess.STDOUT)
        if during is not None:
            during.start()
        rc = proc.wait()
    wall = time.monotonic() - t0
    if during is not None:
        during.join()
    if rc not in (0, 1):  # 1: some verdicts are regressions/failures, which is not our concern here
        tail = "\n".join(log.read_text().splitlines()[-8:])
        raise SystemExit(f"pytest failed (exit {rc}); see {log}:\n{tail}")
    return wall, store


def achieved(store: Path) -> tuple[int, float, float]:
    """(answers, first request time, last answer time) from the store (time.time())."""
    with sqlite3.connect(store) as conn:
        n, first, last = conn.execute(
            "SELECT COUNT(*), MIN(created - latency_s), MAX(created) FROM answers WHERE status='ok'").fetchone()
    return int(n), float(first), float(last)


def fleet_outcome(scenario: str, side: str, questions: int, sims: list[SimProcess], store: Path,
                  wall: float, before: list[int]) -> Outcome:
    n, first, last = achieved(store)
    if n != questions:
        raise SystemExit(f"{scenario}/{side}: {n} answers stored, expected {questions}")
    done = [fetch_stats(s.url).completed - b for s, b in zip(sims, before, strict=True)]
    cap = sum(s.params.capacity_rps for s in sims)
    servers = [{"max_num_seqs": s.params.max_num_seqs, "capacity_rps": round(s.params.capacity_rps, 2),
                "completed": d, "share": round(d / sum(done), 4),
                "capacity_share": round(s.params.capacity_rps / cap, 4)} for s, d in zip(sims, done, strict=True)]
    return Outcome(scenario, side, questions, servers, n / (last - first), cap, wall)


def scenario_fleet(name: str, work: Path, params: list[EngineParams], questions: int, extra: tuple[str, ...],
                   side: str) -> Outcome:
    data = work / f"data-{questions}"
    if not data.exists():
        make_data(data, questions)
    with _sims(params) as sims:
        before = [fetch_stats(s.url).completed for s in sims]
        wall, store = run_plugin(work, data, [s.url for s in sims], extra)
        return fleet_outcome(name, side, _count(data), sims, store, wall, before)


def scenario_slowdown(work: Path, extra: tuple[str, ...], side: str, at_s: float = 15.0) -> Outcome:
    questions = 12000
    data = work / f"data-{questions}"
    if not data.exists():
        make_data(data, questions)
    with _sims([BIG, BIG]) as sims:
        before = [fetch_stats(s.url).completed for s in sims]
        marks: dict[str, float] = {}

        def slow_down() -> None:
            # the run starts asking once collected: wait for the first completions, then at_s
            while sum(fetch_stats(s.url).completed for s in sims) == sum(before):
                time.sleep(0.1)
            time.sleep(at_s)
            sims[1].set_speed(0.5)
            marks["slowed_at"] = time.time()

        wall, store = run_plugin(work, data, [s.url for s in sims], extra, threading.Thread(target=slow_down))
        out = fleet_outcome("slowdown", side, _count(data), sims, store, wall, before)
        out.extra = _share_fall(store, sims[1].url, marks["slowed_at"])
        return out


def _share_fall(store: Path, slowed: str, slowed_at: float) -> dict[str, float]:
    """Seconds from the slowdown until the slowed server's share of answers (2-s windows)
    is below the midpoint of 1/2 and 1/3; and its share before and after."""
    with sqlite3.connect(store) as conn:
        rows = conn.execute("SELECT created, server = ? FROM answers WHERE status='ok' ORDER BY created",
                            (slowed,)).fetchall()
    mid = (1 / 2 + 1 / 3) / 2

    def share(t0: float, t1: float) -> float | None:
        sel = [s for t, s in rows if t0 <= t < t1]
        return sum(sel) / len(sel) if len(sel) >= 20 else None

    fell = None
    t = slowed_at
    while t < rows[-1][0] - 2:
        s = share(t, t + 2)
        if s is not None and s < mid:
            fell = t + 2 - slowed_at  # the window's end: the share is known then
            break
        t += 0.5
    return {"share_before": share(slowed_at - 10, slowed_at) or float("nan"),
            "share_after": share(slowed_at + 15, slowed_at + 30) or float("nan"),
            "share_fell_after_s": fell if fell is not None else float("nan")}


def _count(data: Path) -> int:
    import json

    qs = json.loads((data / "RSVQA-LR" / "LR_split_test_questions.json").read_text())["questions"]
    return sum(1 for q in qs if q.get("active"))


class _sims:
    def __init__(self, params: list[EngineParams]) -> None:
        self.params = params
        self.procs: list[SimProcess] = []

    def __enter__(self) -> list[SimProcess]:
        for p in self.params:
            self.procs.append(SimProcess(p).__enter__())
        return self.procs

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.__exit__(None, None, None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="hetero,metrics-off,equal4,slowdown")
    ap.add_argument("--sides", default="adaptive", help="adaptive, old (total:64 fixed), or both: adaptive,old")
    ap.add_argument("--questions", type=int, default=6000)
    a = ap.parse_args()
    wanted = set(a.only.split(","))
    known = {"adaptive": ("adaptive (default)", ()), "old": ("old: total:64 fixed", OLD)}
    sides = [known[k] for k in a.sides.split(",")]
    results: list[Outcome] = []
    ratios: dict[str, float] = {}
    no_metrics = [EngineParams(max_num_seqs=256, metrics=False), EngineParams(max_num_seqs=64, metrics=False)]
    with tempfile.TemporaryDirectory(prefix="satbench-fleet-") as tmp:
        work = Path(tmp)
        for side, extra in sides:
            if "hetero" in wanted:
                results.append(scenario_fleet("hetero", work, [BIG, SMALL], a.questions, extra, side))
            if "metrics-off" in wanted:
                results.append(scenario_fleet("metrics-off", work, no_metrics, a.questions, extra, side))
            if "equal4" in wanted:
                one = scenario_fleet("equal1", work, [BIG], a.questions, extra, side)
                four = scenario_fleet("equal4", work, [BIG] * 4, 4 * a.questions, extra, side)
                results += [one, four]
                ratios[side] = four.achieved_rps / one.achieved_rps
            if "slowdown" in wanted:
                results.append(scenario_slowdown(work, extra, side))
            _print(results, ratios)
    write_result(OUT / "fleet.json", results=[{**asdict(r), "utilisation": r.utilisation} for r in results],
                 equal4_over_equal1=ratios)


def _print(results: list[Outcome], ratios: dict[str, float]) -> None:
    print(f"\n{'scenario':12} {'side':22} {'questions':>9} {'achieved':>9} {'capacity':>9} {'util':>6}  shares (capacity share)")
    for r in results:
        shares = ", ".join(f"{s['share']:.3f} ({s['capacity_share']:.3f})" for s in r.servers)
        print(f"{r.scenario:12} {r.side:22} {r.questions:9d} {r.achieved_rps:9.1f} {r.capacity_rps:9.1f} "
              f"{r.utilisation:6.3f}  {shares}")
        if r.extra:
            print(" " * 13 + ", ".join(f"{k} {v:.2f}" for k, v in r.extra.items()))
    for side, ratio in ratios.items():
        print(f"4 equal servers / 1, {side}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
