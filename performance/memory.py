"""Memory and client CPU of a large run: a synthetic RSVQA-HR suite against a zero-latency server.

    .venv/bin/python performance/memory.py --questions 50000
    .venv/bin/python performance/memory.py --questions 222600            # the full HR size, ~10 min
    .venv/bin/python performance/memory.py --questions 20000 --tracemalloc 2000,18000   # where it goes
    .venv/bin/python performance/memory.py --questions 222600 --py-spy 60   # a CPU profile mid-run
    .venv/bin/python performance/memory.py --questions 50000 --images 500 --image-size 512   # RSVQA-HR's size

What runs: `pytest benchmarks -k rsvqa_hr -q --recon identity` (two arms: the original and
the identity reconstruction, two requests per question) in a fresh rootdir, against
tests/servers.py's FakeVLM answering "yes" at once in its own process (its CPU is not the
client's). The data is the RSVQA-HR on-disk format (USGS_split_test_*.json with leading
inactive stubs, `Data/<img_id>.tif`), `--questions` questions over `--images` images of
`--image-size` pixels a side: 32 (the default) measures the plugin's per-question cost, not JPEG
work; 512 is RSVQA-HR's own size (smooth random fields with a little noise, which JPEG
compresses about as it does aerial photographs: ~0.1-0.2 MB an arm), where the prepared-image
cache's bytes count (--cache-mb). RSVQA-HR's test split has about 100 questions an image
(`--images questions/100`); the default, questions/20, has more images to prepare.

While the run goes, its RSS (/proc/PID/status VmRSS, VmHWM), its CPU (/proc/PID/stat) and
its progress (the run's rows in the store's `run_items`, read through a read-only SQLite
connection) are sampled every --interval seconds. From the samples:

- RSS at the first and at the last item, and the growth per item between them (end points,
  and a least-squares slope over every sample of the run); the same slope over the samples
  after the prepared-image cache has filled (`growth_after_cache_kb_per_item`: from the item
  whose image is the cache's last by its count or its MB, estimated from one image as the
  pipeline encodes it);
- the peak during the items (VmHWM at the last sample before the last item) and the peak of
  the whole process (os.wait4's ru_maxrss), i.e. what the end-of-run reports add;
- the CPU after the last item (the reports, from /proc samples and the exit rusage);
- the report building alone: `python -m pytest_satbench.report` on the same store, with its
  CPU and peak RSS from os.wait4;
- total client CPU per question (os.wait4 rusage of the pytest process).

Then, unless --no-rerun: the same command again (every answer stored: nothing is asked) and
pytest running the same number of no-op custom items (a conftest whose pytest_collect_file
yields N trivial `pytest.Item`s), CPU side by side, in alternating order (--reps times).

Results: performance/out/memory-<questions>.json (and the logs next to it).
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _measure import write_result  # performance/ is on sys.path when run as a script
from _server import ZeroLatencyServer

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "performance" / "out"
N_STUBS = 1000  # leading inactive records, as in the real split files (which have ~1M)
TYPES = ("presence", "comp", "count", "area")
MB = 1024 * 1024

TEST_MODULE = 'from pytest_satbench import benchmark_test\n\ntest_rsvqa_hr = benchmark_test("rsvqa_hr")\n'

NOOP_CONFTEST = '''\
"""N trivial custom items: what pytest itself costs per item."""
import os

import pytest

N = int(os.environ["SATBENCH_BENCH_NOOP_ITEMS"])


class NoopItem(pytest.Item):
    def runtest(self):
        pass

    def reportinfo(self):
        return self.path, None, self.name


class NoopFile(pytest.File):
    def collect(self):
        for i in range(N):
            yield NoopItem.from_parent(self, name=f"test_noop[{i}]")


def pytest_collect_file(parent, file_path):
    if file_path.name == "noop_items.txt":
        return NoopFile.from_parent(parent, path=file_path)
'''

# Loaded with -p only in --tracemalloc runs: tracing starts after item A (so only what is
# allocated from then on is traced) and the snapshot at item B shows what is still alive.
TRACE_PLUGIN = '''\
"""--tracemalloc: what is allocated between item A and item B and still alive at B."""
import os
import tracemalloc

_A, _B, _OUT = os.environ["SATBENCH_BENCH_TRACE"].split(",", 2)
_A, _B = int(_A), int(_B)
_seen = 0


def pytest_runtest_logfinish(nodeid, location):
    global _seen
    _seen += 1
    if _seen == _A:
        tracemalloc.start(12)
    elif _seen == _B:
        snap = tracemalloc.take_snapshot()
        tracemalloc.stop()
        snap = snap.filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        n = _B - _A
        with open(_OUT, "w") as fh:
            total = sum(s.size for s in snap.statistics("filename"))
            fh.write(f"alive at item {_B}, allocated after item {_A}: {total / 1024:.0f} KiB, "
                     f"{total / n:.0f} B per item\\n\\n")
            for kind in ("lineno", "traceback"):
                fh.write(f"== top 30 by {kind}\\n")
                for s in snap.statistics(kind)[:30]:
                    fh.write(f"{s.size / n:8.1f} B/item {s.count / n:7.2f} blocks/item\\n")
                    for line in (s.traceback.format() if kind == "traceback" else [str(s.traceback[0])]):
                        fh.write(f"      {line}\\n")
                fh.write("\\n")
'''


# ---------------------------------------------------------------------- data
def synthetic_image(rng: Any, size: int) -> Any:
    """Noise at 32 px (the per-question bench); above, a smooth random field with a little
    noise, which JPEG compresses about as it does an aerial photograph."""
    import numpy as np
    from PIL import Image

    if size <= 64:
        return Image.fromarray(rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8))
    coarse = Image.fromarray(rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)).resize((size, size), Image.BICUBIC)
    px = np.asarray(coarse, dtype=np.int16) + rng.integers(-12, 13, size=(size, size, 3), dtype=np.int16)
    return Image.fromarray(np.clip(px, 0, 255).astype(np.uint8))


def prepared_mb(data_root: Path, arms: int = 2) -> float:
    """MB one prepared image holds in the cache: JPEG quality 95 and its base64, per arm."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    with Image.open(data_root / "RSVQA-HR" / "Data" / "0.tif") as im:
        im.convert("RGB").save(buf, format="JPEG", quality=95)
    return arms * len(buf.getvalue()) * (1 + 4 / 3) / MB


def make_data(data_root: Path, n_questions: int, n_images: int, size: int = 32) -> None:
    """An RSVQA-HR test split in the release's format: questions round-robin over the four
    types, `n_images` tifs, questions of one image consecutive (as the real file)."""
    import numpy as np

    base = data_root / "RSVQA-HR"
    (base / "Data").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for img in range(n_images):
        synthetic_image(rng, size).save(base / "Data" / f"{img}.tif")
    samples = {
        "presence": ("Is there a residential building in the image {k}?", "yes"),
        "comp": ("Are there more roads than water areas {k}?", "no"),
        "count": ("What is the number of roads {k}?", "403"),
        "area": ("What is the area covered by residential buildings {k}?", "2173m2"),
    }
    q_parts: list[str] = []
    a_parts: list[str] = []
    for i in range(N_STUBS):
        stub = json.dumps({"id": i, "active": False})
        q_parts.append(stub)
        a_parts.append(stub)
    for n in range(n_questions):
        qid, img = N_STUBS + n, n * n_images // n_questions
        qtype = TYPES[n % 4]
        text, ans = samples[qtype]
        q_parts.append(json.dumps({"id": qid, "date_added": 1569489630.7, "img_id": img, "people_id": 0,
                                   "type": qtype, "question": text.format(k=n // 4), "answers_ids": [qid],
                                   "active": True}))
        a_parts.append(json.dumps({"id": qid, "date_added": 1569489630.7, "question_id": qid, "people_id": 0,
                                   "answer": ans, "active": True}))
    (base / "USGS_split_test_questions.json").write_text('{"questions": [' + ", ".join(q_parts) + "]}")
    (base / "USGS_split_test_answers.json").write_text('{"answers": [' + ", ".join(a_parts) + "]}")


def rootdir(tmp: Path, name: str, trace: str | None = None) -> Path:
    root = tmp / name
    (root / "benchmarks").mkdir(parents=True)
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "benchmarks" / "test_rsvqa.py").write_text(TEST_MODULE)
    if trace:
        (root / "satbench_bench_trace.py").write_text(TRACE_PLUGIN)
    return root


# ---------------------------------------------------------------------- the server


# ---------------------------------------------------------------------- sampling
@dataclass
class Sample:
    t: float  # seconds since start
    rss_mb: float
    hwm_mb: float
    cpu_s: float  # user+sys so far
    done: int  # items of this run recorded in the store


@dataclass
class Measured:
    wall_s: float
    cpu_s: float
    max_rss_mb: float
    rc: int
    samples: list[Sample] = field(default_factory=list)


_TICK = os.sysconf("SC_CLK_TCK")


def _proc(pid: int) -> tuple[float, float, float] | None:
    """(VmRSS MB, VmHWM MB, CPU s) of a live process, None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    kb = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in status.splitlines())
          if k in ("VmRSS", "VmHWM")}
    fields_ = stat.rsplit(")", 1)[1].split()
    cpu = (int(fields_[11]) + int(fields_[12])) / _TICK  # utime, stime
    return kb.get("VmRSS", 0) / 1024, kb.get("VmHWM", 0) / 1024, cpu


class Progress:
    """Items of the newest run in the store, read without disturbing the writer."""

    def __init__(self, store: Path) -> None:
        self.store = store
        self.conn: sqlite3.Connection | None = None
        self.run_id: str | None = None
        self.before: set[str] = set()

    def baseline(self) -> None:
        """Runs already in the store (a rerun's progress counts only its own run)."""
        if self.store.exists():
            conn = sqlite3.connect(self.store)
            self.before = {r[0] for r in conn.execute("SELECT run_id FROM runs")}
            conn.close()

    def count(self) -> int:
        try:
            if self.conn is None:
                if not self.store.exists():
                    return 0
                self.conn = sqlite3.connect(f"file:{self.store}?mode=ro", uri=True, timeout=1)
            if self.run_id is None:
                for (run_id,) in self.conn.execute("SELECT run_id FROM runs ORDER BY started DESC"):
                    if run_id not in self.before:
                        self.run_id = run_id
                        break
                if self.run_id is None:
                    return 0
            return int(self.conn.execute("SELECT COUNT(*) FROM run_items WHERE run_id=?", (self.run_id,)).fetchone()[0])
        except sqlite3.Error:
            return -1  # busy or not created yet: this sample has no progress

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def run_sampled(cmd: list[str], cwd: Path, log: Path, env: dict[str, str], store: Path | None,
                interval: float, on_sample: Any = None) -> Measured:
    progress = Progress(store) if store is not None else None
    if progress is not None:
        progress.baseline()
    with open(log, "w") as fh:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, env=env)
        samples: list[Sample] = []
        while True:
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            got = _proc(proc.pid)
            if got is not None:
                done = progress.count() if progress is not None else 0
                samples.append(Sample(time.perf_counter() - t0, *got, done))
                if on_sample is not None:
                    on_sample(proc.pid, samples[-1])
            time.sleep(interval)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if progress is not None:
        progress.close()
    return Measured(wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024, proc.returncode, samples)


def phases(m: Measured, n: int, cache_full_at: int | None = None) -> dict[str, Any]:
    """The run's figures from its samples (see the module docstring); `cache_full_at`: the
    item from which the prepared-image cache is full."""
    running = [s for s in m.samples if 0 < s.done < n]
    after = [s for s in m.samples if s.done >= n]
    out: dict[str, Any] = {"samples": len(m.samples), "samples_running": len(running)}
    if len(running) >= 2:
        a, b = running[0], running[-1]
        out.update({
            "first_item": {"done": a.done, "t_s": a.t, "rss_mb": a.rss_mb, "cpu_s": a.cpu_s},
            "last_item": {"done": b.done, "t_s": b.t, "rss_mb": b.rss_mb, "cpu_s": b.cpu_s},
            "growth_kb_per_item": (b.rss_mb - a.rss_mb) * 1024 / max(1, b.done - a.done),
            "run_cpu_ms_per_item": 1000 * (b.cpu_s - a.cpu_s) / max(1, b.done - a.done),
            "peak_during_items_mb": b.hwm_mb,
        })
        xs = [s.done for s in running]
        ys = [s.rss_mb for s in running]
        if len(set(xs)) >= 2:
            out["growth_kb_per_item_lsq"] = statistics.linear_regression(xs, ys).slope * 1024
        full = [s for s in running if cache_full_at is not None and s.done >= cache_full_at]
        if len({s.done for s in full}) >= 2:
            out["cache_full_at_item"] = cache_full_at
            out["growth_after_cache_kb_per_item"] = statistics.linear_regression(
                [s.done for s in full], [s.rss_mb for s in full]).slope * 1024
        # what a cumulative-growth reading would show: RSS at ~4% and ~85% of the items
        for pct in (4, 25, 50, 85):
            s = min(running, key=lambda s: abs(s.done - n * pct / 100))
            out[f"rss_mb_at_{pct}pct"] = s.rss_mb
    if running and after:
        out["cpu_after_last_item_s"] = m.cpu_s - running[-1].cpu_s
        out["wall_after_last_item_s"] = m.wall_s - running[-1].t
        out["peak_above_items_mb"] = m.max_rss_mb - running[-1].hwm_mb
    return out


# ---------------------------------------------------------------------- the bench
def pytest_cmd(data_root: Path, url: str, concurrency: int, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "benchmarks", "-k", "rsvqa_hr", "-q", "-p", "no:randomly",
            "--data-root", str(data_root), "--servers", url, "--recon", "identity",
            "--concurrency", str(concurrency), *extra]


def py_spy_hook(seconds: int, n: int, out: Path) -> Any:
    """Start `py-spy record` once a third of the items are done (steady state)."""
    started: list[subprocess.Popen[bytes]] = []

    def hook(pid: int, s: Sample) -> None:
        if not started and s.done >= n // 3:
            exe = Path(sys.executable).parent / "py-spy"
            cmd = [str(exe), "record", "--pid", str(pid), "--duration", str(seconds), "--rate", "200",
                   "--format", "raw", "--output", str(out), "--nonblocking"]
            print(f"  py-spy: recording {seconds} s from item {s.done}", flush=True)
            started.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))

    hook.procs = started  # type: ignore[attr-defined]  # kept on the function for the caller to stop
    return hook


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=int, default=50_000)
    ap.add_argument("--images", type=int, default=0, help="images (default: questions / 20)")
    ap.add_argument("--image-size", type=int, default=32, help="pixels a side (RSVQA-HR: 512)")
    ap.add_argument("--cache-images", type=int, default=256, help="the run's --cache-images (for the fill point)")
    ap.add_argument("--cache-mb", type=int, default=64, help="the run's --cache-mb (for the fill point)")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    ap.add_argument("--reps", type=int, default=1, help="repetitions of the rerun vs no-op comparison")
    ap.add_argument("--no-rerun", action="store_true", help="skip the rerun and the no-op comparison")
    ap.add_argument("--tracemalloc", metavar="A,B", help="trace allocations from item A, snapshot at item B")
    ap.add_argument("--py-spy", type=int, default=0, metavar="S", help="py-spy record S seconds mid-run")
    ap.add_argument("--extra", default="", help="more pytest options for the plugin runs (one string)")
    ap.add_argument("--tree", type=Path, default=None,
                    help="measure the plugin of this checkout (PYTHONPATH=DIR; e.g. `git archive HEAD | tar -x -C DIR`): "
                         "other people's half-done edits in the working tree stay out of the figures")
    ap.add_argument("--label", default="", help="added to the output file names (e.g. before, after)")
    a = ap.parse_args()
    n = a.questions
    n_images = a.images or max(1, n // 20)
    OUT.mkdir(parents=True, exist_ok=True)
    stem = (f"memory-{n}" + (f"-{a.image_size}px" if a.image_size != 32 else "") + (f"-{a.label}" if a.label else "")
            + ("-trace" if a.tracemalloc else ""))
    result: dict[str, Any] = {"settings": {"questions": n, "images": n_images, "image_size": a.image_size,
                                           "concurrency": a.concurrency, "arms": ["orig", "identity"],
                                           "interval_s": a.interval, "extra": a.extra}}
    with tempfile.TemporaryDirectory(prefix="satbench-memory-") as t:
        tmp = Path(t)
        data = tmp / "data"
        t0 = time.perf_counter()
        make_data(data, n, n_images, a.image_size)
        per_image = prepared_mb(data)
        fill_images = min(a.cache_images, max(1, int(a.cache_mb / per_image)))
        cache_full_at = min(n, -(-fill_images * n // n_images))
        result["settings"].update(prepared_mb_per_image=per_image, cache_full_at_item=cache_full_at,
                                  cache_images=a.cache_images, cache_mb=a.cache_mb)
        print(f"data: {n} questions on {n_images} images of {a.image_size} px ({time.perf_counter() - t0:.1f} s); "
              f"{per_image:.3f} MB an image prepared, the cache full from item {cache_full_at}", flush=True)
        if a.cache_images != 256 or a.cache_mb != 64:
            a.extra = f"{a.extra} --cache-images {a.cache_images} --cache-mb {a.cache_mb}".strip()
        root = rootdir(tmp, "run", a.tracemalloc)
        store = root / ".pytest_cache" / "d" / "satbench" / "results.sqlite"
        env = {**os.environ}
        if a.tree is not None:
            if not (a.tree / "pytest_satbench").is_dir():
                ap.error(f"--tree {a.tree}: no pytest_satbench/ there")
            env["PYTHONPATH"] = str(a.tree.resolve())
            result["settings"]["tree"] = str(a.tree.resolve())
        extra = a.extra.split()
        if a.tracemalloc:
            env["SATBENCH_BENCH_TRACE"] = f"{a.tracemalloc},{OUT / (stem + '.txt')}"
            env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(root)) if p)
            extra += ["-p", "satbench_bench_trace"]
        with ZeroLatencyServer() as srv:
            cmd = pytest_cmd(data, srv.url, a.concurrency, extra)
            hook = py_spy_hook(a.py_spy, n, OUT / f"{stem}-profile.txt") if a.py_spy else None
            first = run_sampled(cmd, root, OUT / f"{stem}-first.log", env, store, a.interval, hook)
            stats = srv.stop()
            server_cpu, requests = stats.cpu_s, stats.requests
        if hook is not None:
            for p in hook.procs:
                p.wait()
        tail = "\n".join((OUT / f"{stem}-first.log").read_text().splitlines()[-3:])
        if first.rc != 0 or requests != 2 * n:
            raise SystemExit(f"the run failed (exit {first.rc}, {requests} requests for {n} questions):\n{tail}")
        result["first_run"] = {"wall_s": first.wall_s, "cpu_s": first.cpu_s, "max_rss_mb": first.max_rss_mb,
                               "cpu_ms_per_question": 1000 * first.cpu_s / n, "server_cpu_s": server_cpu,
                               "requests": requests, "last_line": tail.splitlines()[-1],
                               **phases(first, n, cache_full_at)}
        print(json.dumps(result["first_run"], indent=1), flush=True)

        # the report building alone, from the same store
        rep = run_sampled([sys.executable, "-m", "pytest_satbench.report", "--store", str(store),
                           "--out", str(tmp / "reports-cli")], root, OUT / f"{stem}-report.log",
                          env, None, a.interval)
        if rep.rc != 0:
            raise SystemExit(f"the report CLI failed (exit {rep.rc}); see {OUT / f'{stem}-report.log'}")
        result["report_cli"] = {"wall_s": rep.wall_s, "cpu_s": rep.cpu_s, "max_rss_mb": rep.max_rss_mb, "rc": rep.rc}
        print("report CLI:", result["report_cli"], flush=True)

        if not a.no_rerun and not a.tracemalloc:
            noop = tmp / "noop"
            noop.mkdir()
            (noop / "pytest.ini").write_text("[pytest]\n")
            (noop / "conftest.py").write_text(NOOP_CONFTEST)
            (noop / "noop_items.txt").write_text("")
            noop_env = {**env, "SATBENCH_BENCH_NOOP_ITEMS": str(n)}
            reruns: list[dict[str, Any]] = []
            noops: list[dict[str, Any]] = []
            for k in range(a.reps):
                order = ("rerun", "noop") if k % 2 == 0 else ("noop", "rerun")
                for side in order:
                    if side == "rerun":
                        with ZeroLatencyServer() as srv:
                            m = run_sampled(pytest_cmd(data, srv.url, a.concurrency, extra), root,
                                            OUT / f"{stem}-rerun-{k}.log", env, store, a.interval)
                            asked = srv.stop().requests
                        if m.rc != 0 or asked != 0:
                            raise SystemExit(f"the rerun failed (exit {m.rc}, {asked} requests); see "
                                             f"{OUT / f'{stem}-rerun-{k}.log'}")
                        reruns.append({"wall_s": m.wall_s, "cpu_s": m.cpu_s, "max_rss_mb": m.max_rss_mb,
                                       "rc": m.rc, "requests": asked, **phases(m, n)})
                    else:
                        m = run_sampled([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "noop_items.txt"],
                                        noop, OUT / f"{stem}-noop-{k}.log", noop_env, None, a.interval)
                        if m.rc != 0:
                            raise SystemExit(f"the no-op run failed (exit {m.rc})")
                        noops.append({"wall_s": m.wall_s, "cpu_s": m.cpu_s, "max_rss_mb": m.max_rss_mb, "rc": m.rc})
                    print(f"  {side}: {m.cpu_s:.1f} s CPU, {m.wall_s:.1f} s wall, {m.max_rss_mb:.0f} MB", flush=True)
            result["rerun"] = reruns
            result["noop"] = noops
            result["rerun_over_noop_cpu"] = statistics.median(r["cpu_s"] for r in reruns) / statistics.median(
                x["cpu_s"] for x in noops)
            print(f"rerun / no-op CPU: {result['rerun_over_noop_cpu']:.2f}x", flush=True)
    write_result(OUT / f"{stem}.json", **result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
