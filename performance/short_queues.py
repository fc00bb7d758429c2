"""Short queues without metrics: the plugin's adaptive limit against servers whose capacity does
not grow with concurrency, side by side with a baseline tree.

    .venv/bin/python performance/short_queues.py --baseline-tree /tmp/old [--tree /tmp/new]
    .venv/bin/python performance/short_queues.py --only fixed-rate --questions 3000

Two servers, neither serving /metrics, each in its own process:

- fixed-rate: tests/fleet_sim.py with max_num_seqs 8, 25 ms a step whatever the batch
  (per_seq_ms 0), 4 tokens a request: 8 requests run at once for 100 ms each (plus up to a
  step waiting to be admitted), the rest wait; capacity 80 requests/s at any concurrency from
  8 on, known exactly (slow enough that the client's own turnaround, a few ms a request at
  512x512 on 2 cores, does not move the knee).
- cpu-bound: tests/servers.py's FakeVLM answering at once (performance/_server.py), on the same
  2-core machine as the client, reading every 512x512 image's JSON and base64: its capacity is
  its CPU's, and more in flight only queues.

What runs: `pytest benchmarks -k rsvqa_hr --recon identity` (two requests a question) on a
synthetic RSVQA-HR split of `--questions` questions over questions/100 images of 512x512
(performance/memory.py's data), fresh store each run. The plugin runs with default options
(adaptive limits, no cap but 512 a server) from each tree (PYTHONPATH), and, as references,
with fixed limits (`--concurrency N --concurrency-control fixed`) at 1 (the unloaded latency, on a
tenth of the questions) and the counts in `--fixed` (the most of them is the server's maximum throughput as this
client reaches it). From the store: throughput (answers / (last answer - first request)),
median and p95 latency of the answers; from /proc while it runs: the client's peak threads;
from os.wait4: its peak RSS. The acceptance: median latency within 1.5x the unloaded one at
>= 0.9 of the maximum throughput.

Results: performance/out/short_queues.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "performance")]

from _measure import write_result  # noqa: E402 (after the sys.path setup above)
from _server import ZeroLatencyServer  # noqa: E402 (after the sys.path setup above)
from fleet_sim import EngineParams, SimProcess  # noqa: E402 (after the sys.path setup above)
from memory import make_data, rootdir  # noqa: E402 (after the sys.path setup above)

OUT = REPO / "performance" / "out"
FIXED_RATE = EngineParams(max_num_seqs=8, base_ms=25.0, per_seq_ms=0.0, output_tokens=4, model="bench-vlm",
                          metrics=False)


@dataclass
class Run:
    scenario: str
    side: str
    answers: int
    throughput_rps: float
    median_ms: float
    p95_ms: float
    peak_threads: int
    peak_rss_mb: float
    wall_s: float
    limits: str  # the adaptive limit's changes, "limit@seconds", from the store's run_limits


def run_plugin(tmp: Path, data: Path, url: str, side: str, tree: Path | None,
               extra: list[str]) -> tuple[Path, int, float, float]:
    """One pytest run -> (store, peak threads, peak RSS MB, wall s)."""
    root = rootdir(tmp, f"run-{time.monotonic_ns()}")
    store = root / "results.sqlite"
    cmd = [sys.executable, "-m", "pytest", "benchmarks", "-k", "rsvqa_hr", "-q", "-p", "no:randomly",
           "-p", "no:cacheprovider", "--data-root", str(data), "--servers", url, "--recon", "identity",
           "--store", str(store), "--no-reports", *extra]
    env = {**os.environ}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    log = OUT / f"short_queues-{side.split()[0]}.log"
    peak_threads = 0
    with open(log, "w") as fh:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=root, stdout=fh, stderr=subprocess.STDOUT, env=env)
        while True:
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            try:
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                    if line.startswith("Threads:"):
                        peak_threads = max(peak_threads, int(line.split()[1]))
            except (FileNotFoundError, ProcessLookupError):
                pass
            time.sleep(0.1)
        wall = time.perf_counter() - t0
    rc = os.waitstatus_to_exitcode(status)
    if rc not in (0, 1):
        raise SystemExit(f"{side}: pytest failed (exit {rc}); see {log}")
    return store, peak_threads, ru.ru_maxrss / 1024, wall


def measure(scenario: str, side: str, tmp: Path, data: Path, url: str, tree: Path | None, extra: list[str]) -> Run:
    store, threads, rss, wall = run_plugin(tmp, data, url, side, tree, extra)
    with sqlite3.connect(store) as conn:
        rows = conn.execute("SELECT created - latency_s, created, latency_s FROM answers WHERE status='ok'").fetchall()
        traces = conn.execute("SELECT points FROM run_limits").fetchall()
    first, last = min(r[0] for r in rows), max(r[1] for r in rows)
    lat = sorted(r[2] for r in rows)
    run = Run(scenario, side, len(rows), len(rows) / (last - first), 1000 * statistics.median(lat),
              1000 * lat[int(0.95 * (len(lat) - 1))], threads, rss, wall,
              " ".join(f"{n}@{t:g}" for trace in traces for t, n in json.loads(trace[0])))
    print(f"  {scenario:10} {side:28} {run.throughput_rps:7.1f}/s  median {run.median_ms:7.1f} ms  "
          f"p95 {run.p95_ms:7.1f} ms  threads {threads:4d}  RSS {rss:5.0f} MB  ({wall:.0f} s)", flush=True)
    if "adaptive" in side:
        print(f"    limits: {run.limits[:400]}", flush=True)
    return run


class _server:
    def __init__(self, scenario: str) -> None:
        self.scenario = scenario

    def __enter__(self) -> str:
        self.srv = SimProcess(FIXED_RATE) if self.scenario == "fixed-rate" else ZeroLatencyServer()
        self.srv.__enter__()
        return self.srv.url

    def __exit__(self, *exc: object) -> None:
        self.srv.__exit__(None, None, None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="fixed-rate,cpu-bound")
    ap.add_argument("--questions", type=int, default=1500)
    ap.add_argument("--tree", type=Path, default=None,
                    help="the tree measured as 'this tree' (default: the installed one)")
    ap.add_argument("--baseline-tree", type=Path, default=None,
                    help="a tree measured side by side (e.g. git archive of the commit before)")
    ap.add_argument("--fixed", default="8,32", help="fixed limits measured for the maximum throughput (1 is always)")
    a = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    summary: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="satbench-queues-") as t:
        tmp = Path(t)
        data = tmp / "data"
        make_data(data, a.questions, max(1, a.questions // 100), 512)
        few = tmp / "data-few"  # for the unloaded latency at 1 in flight
        make_data(few, max(20, a.questions // 10), max(1, a.questions // 1000), 512)
        for scenario in a.only.split(","):
            print(scenario, flush=True)
            sides: list[tuple[str, Path | None, list[str]]] = [("this tree: adaptive (default)", a.tree, [])]
            if a.baseline_tree is not None:
                sides.append(("baseline tree: adaptive", a.baseline_tree, []))
            for n in ["1", *a.fixed.split(",")]:
                sides.append((f"fixed {n}", a.tree, ["--concurrency", n, "--concurrency-control", "fixed"]))
            mine: list[Run] = []
            for side, tree, extra in sides:
                with _server(scenario) as url:
                    mine.append(measure(scenario, side, tmp, few if side == "fixed 1" else data, url, tree, extra))
            runs += mine
            unloaded = next(r.median_ms for r in mine if r.side == "fixed 1")
            best = max(r.throughput_rps for r in mine)
            for r in mine:
                if r.side.endswith("adaptive (default)") or r.side.endswith("adaptive"):
                    summary[f"{scenario} / {r.side}"] = {
                        "throughput_share": r.throughput_rps / best, "median_over_unloaded": r.median_ms / unloaded,
                        "p95_over_median": r.p95_ms / r.median_ms, "peak_threads": r.peak_threads}
                    print(f"  -> {r.side}: {r.throughput_rps / best:.2f} of the best throughput, median "
                          f"{r.median_ms / unloaded:.2f}x unloaded, {r.peak_threads} threads", flush=True)
    write_result(OUT / "short_queues.json", runs=[asdict(r) for r in runs], summary=summary)


if __name__ == "__main__":
    main()
