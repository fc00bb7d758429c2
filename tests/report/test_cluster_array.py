"""The cluster recipe (docs/cluster.md), played locally: the job-array script itself,
docs/examples/satbench-array.sbatch, runs as N parallel tasks (each with the SLURM variables a
job array sets, its own store and its own server on loopback: the bundled reference server in
place of `vllm serve`, through the script's SERVE setting), one task killed with SIGKILL
mid-run and run again, then docs/examples/satbench-merge.sh merges the stores and writes the
tag's report. That report must equal, figure for figure, the report of one plain run (no
--shard) over the same questions; the rerun task must ask its server only what the killed one
had not stored.

The servers are tests/report/array_server.py: the reference server, counting the chat requests
it receives in a file (the count survives a SIGKILL) and, for the task that is killed, slowed
down so that the kill lands mid-run."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

from pytest_satbench.server import start_server

ROOT = Path(__file__).resolve().parents[2]
ARRAY = ROOT / "docs" / "examples" / "satbench-array.sbatch"
MERGE = ROOT / "docs" / "examples" / "satbench-merge.sh"
SERVER = Path(__file__).resolve().parent / "array_server.py"
N = 3
TAG = "array"
# a small run: 24 demo questions, two arms; two requests in flight so a slowed task is killable
OPTIONS = "--limit 24 --concurrency 2 -p no:randomly -q -W ignore::pytest.PytestAssertRewriteWarning"
BOUND_S = 120


_GIVEN: set[int] = set()


def _free_port() -> int:
    """A loopback port free now and not given to another task of this test (the script's server
    binds it moments later)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    shutil.copytree(ROOT / "benchmarks", project / "benchmarks")
    (project / "data").mkdir()
    return project


def _env(project: Path, **more: str) -> dict[str, str]:
    return {**os.environ, "TAG": TAG, "SELECT": "demo", "RECON": "jpeg:quality=10", "PROJECT": str(project),
            "STORES": str(project / "stores"), "PYTHON": sys.executable, "HEALTH_POLL": "0.1",
            "HEALTH_TIMEOUT": "60", "EXTRA": OPTIONS, "OUT": str(project / "reports-merged"), **more}


def _task(project: Path, index: int, count_file: Path, *, delay: float = 0.0, scratch: Path | None = None,
          ) -> subprocess.Popen[str]:
    """One array task: the script, as SLURM runs it for SLURM_ARRAY_TASK_ID=index."""
    env = _env(project, SLURM_ARRAY_TASK_ID=str(index), SLURM_ARRAY_TASK_COUNT=str(N), PORT=str(_free_port()),
               SERVE=f"{sys.executable} {SERVER} --count-file {count_file} --delay {delay}",
               SCRATCH=str(scratch) if scratch else "")
    log = open(project / f"task-{index}-{time.monotonic_ns()}.log", "w")  # noqa: SIM115 - closed by the child's end
    return subprocess.Popen(["bash", str(ARRAY)], env=env, cwd=project, stdout=log, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def _wait(proc: subprocess.Popen[str]) -> int:
    try:
        return proc.wait(BOUND_S)
    finally:
        _kill(proc)


def _kill(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the task's session: script, server, pytest
    except ProcessLookupError:
        pass
    proc.wait(10)


def _ok(store: Path) -> int:
    if not store.exists():
        return 0
    try:
        with closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=1)) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM answers WHERE status='ok'").fetchone()[0])
    except sqlite3.Error:
        return 0


def _requests(count_file: Path) -> int:
    return len(count_file.read_text().splitlines()) if count_file.exists() else 0


def _logs(project: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(project.glob("task-*.log")))


# a distortion is measured where the image is prepared, in float32: two processes agree on it to
# about 1e-7 (the merged store holds the shards' values, the plain run its own)
DISTORTION = ("psnr", "ssim", "msssim", "lpips")


def _figures(folder: Path) -> tuple[dict[str, object], list[object]]:
    """What a report says about the answers, without what says which runs and servers gave them
    (run ids, dates, latencies, per-server traffic); and the distortions apart."""
    summary = json.loads((folder / "summary.json").read_text())
    keep = ("benchmark", "tag", "model", "questions", "limited", "not_run", "arms", "statistics", "headline",
            "aggregate_views", "notes", "answer_analysis", "noise_floor", "regressed_questions", "gallery",
            "distortion_flips", "visual_tokens")
    out: dict[str, object] = {k: summary.get(k) for k in keep}
    measured: list[object] = []
    for path in sorted(folder.glob("*.csv")):
        rows = list(csv.reader(io.StringIO(path.read_text())))
        cut = [i for i, name in enumerate(rows[0]) if name in DISTORTION]
        for row in rows[1:]:
            measured += [float(row[i]) if row[i] else None for i in cut]
            for i in cut:
                row[i] = ""
        # per_image.csv lists the images in the order the store gives them (a merged store: shard
        # by shard); its rows, not their order, are figures
        out[path.name] = [rows[0], *sorted(rows[1:])] if path.name == "per_image.csv" else rows
    answers = []
    for line in (folder / "predictions.jsonl").read_text().splitlines():
        row = json.loads(line)
        for k in ("latency_s", "server"):
            row.pop(k, None)
        answers.append(row)
    answers.sort(key=lambda r: (r["nodeid"], r["arm"]))
    for row in answers:
        measured += [row.pop(k, None) for k in DISTORTION]
    out["predictions.jsonl"] = answers
    return out, measured


@pytest.mark.slow  # a dozen Python processes (tasks, servers, merges, reports): ~40 s, more on a busy machine
def test_a_job_array_played_locally_reports_as_one_run(tmp_path: Path) -> None:
    project = _project(tmp_path)
    stores = project / "stores"
    counts = [tmp_path / f"requests-{i}.txt" for i in range(N)]
    killed = 1  # task 1 (shard 2/3) is killed mid-run and run again
    # the array: tasks 0 and 2 keep their live store on node-local scratch (copied across by the
    # merge), task 1 writes its shard's store in place
    for i in (0, 2):
        (tmp_path / f"scratch-{i}").mkdir()
    tasks = {i: _task(project, i, counts[i], delay=0.4 if i == killed else 0.0,
                      scratch=None if i == killed else tmp_path / f"scratch-{i}") for i in range(N)}
    shard = stores / f"shard-{killed + 1}-of-{N}.sqlite"
    deadline = time.monotonic() + BOUND_S
    while _ok(shard) < 4 and time.monotonic() < deadline and tasks[killed].poll() is None:
        time.sleep(0.05)
    _kill(tasks[killed])  # SIGKILL: no handler runs, as when a node is lost
    kept = _ok(shard)
    assert kept >= 4, _logs(project)
    for i in (0, 2):
        assert _wait(tasks[i]) == 0, _logs(project)
    # the task again (a requeue): it asks its server only what the killed run had not stored
    rerun_count = tmp_path / "requests-rerun.txt"
    assert _wait(_task(project, killed, rerun_count)) == 0, _logs(project)
    with closing(sqlite3.connect(f"file:{shard}?mode=ro", uri=True)) as conn:
        run_id, = conn.execute("SELECT run_id FROM runs ORDER BY started DESC LIMIT 1").fetchone()
        questions = conn.execute("SELECT COUNT(*) FROM run_items WHERE run_id=?", (run_id,)).fetchone()[0]
    assert _ok(shard) == 2 * questions  # every question of the shard answered in both arms
    assert kept < 2 * questions, "the kill landed after the task's last answer; nothing was left to ask"
    assert _requests(rerun_count) == 2 * questions - kept, (_requests(rerun_count), questions, kept)
    # the merge step, then the same questions as one plain run (no --shard) on one server
    merged = subprocess.run(["bash", str(MERGE)], env=_env(project), cwd=project, capture_output=True, text=True,
                            timeout=BOUND_S)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert merged.stdout.count("satbench: merged ") == N and "report written to" in merged.stdout, merged.stdout
    with start_server() as server:
        single = subprocess.run(
            [sys.executable, "-m", "pytest", "benchmarks", "-k", "demo", "--servers", server.url, "--recon",
             "jpeg:quality=10", "--tag", TAG, "--store", str(tmp_path / "single.sqlite"), *OPTIONS.split()],
            cwd=project, capture_output=True, text=True, timeout=BOUND_S)
    assert single.returncode == 0, single.stdout[-3000:] + single.stderr[-3000:]
    sizes = {i: 2 * _shard_questions(stores / f"shard-{i + 1}-of-{N}.sqlite") for i in range(N)}
    total = sum(sizes.values())
    assert total == 2 * 24 and all(sizes.values()), sizes  # the shards cover the run, each a part
    # each other task asked each of its answers once
    assert [_requests(counts[i]) for i in (0, 2)] == [sizes[0], sizes[2]]
    report = subprocess.run([sys.executable, "-m", "pytest_satbench.report", "--store", str(tmp_path / "single.sqlite"),
                             "--tag", TAG, "--out", str(project / "reports-single")],
                            capture_output=True, text=True, timeout=BOUND_S)
    assert report.returncode == 0, report.stderr
    one, whole = project / "reports-single" / "demo" / TAG, project / "reports-merged" / "demo" / TAG
    figures, measured = _figures(whole)
    figures_one, measured_one = _figures(one)
    assert figures == figures_one
    assert [m is None for m in measured] == [m is None for m in measured_one]
    assert [m for m in measured if m is not None] == pytest.approx([m for m in measured_one if m is not None],
                                                                   rel=1e-5)
    summary = json.loads((whole / "summary.json").read_text())
    assert summary["questions"] == 24 and summary["not_run"] == 0
    assert summary["coverage"]["shards"] == {"count": N, "parts": [1, 2, 3], "questions": 24, "missing": 0}
    # the report says it covers every part (not the part of its newest run)
    report_md = (whole / "report.md").read_text()
    assert "Merged from 3 shard runs (shards 1, 2, 3 of 3): all 24 of 24 questions" in report_md
    assert "subset" not in report_md.lower() and summary["coverage"]["subset"] is False
    # the merge is all or nothing and adds nothing the second time
    again = subprocess.run(["bash", str(MERGE)], env=_env(project), cwd=project, capture_output=True, text=True,
                           timeout=BOUND_S)
    assert again.returncode == 0 and again.stdout.count("nothing new") == N, again.stdout


def _shard_questions(store: Path) -> int:
    with closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as conn:
        return int(conn.execute("SELECT COUNT(DISTINCT nodeid) FROM run_items").fetchone()[0])


def test_the_scripts_are_valid_bash_and_name_the_shard_options() -> None:
    for script in (ARRAY, MERGE):
        got = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert got.returncode == 0, got.stderr
    text = ARRAY.read_text()
    assert '--shard "$SHARD"' in text and "SHARD=$((SLURM_ARRAY_TASK_ID + 1))/$SLURM_ARRAY_TASK_COUNT" in text
    assert "/health" in text and "vllm serve" in text
    assert "--merge" in MERGE.read_text() and "--into" in MERGE.read_text()


def _run(run_id: str, index: int, count: int, shard_questions: int, questions: int = 24) -> dict[str, object]:
    counts = {"questions": questions, "images": 20, "shard_questions": shard_questions, "shard_images": 5,
              "planned": shard_questions}
    return {"run_id": run_id, "protocol": {"planned": {"demo": shard_questions}, "shard": {
        "index": index, "count": count, "scheme": "s", "benchmarks": {"demo": counts}}}}


def test_a_merged_report_names_its_shards_and_the_missing_ones() -> None:
    """`report.build` finds the parts of one split among the tag's runs (newest first); the line
    a report shows names them, and the parts whose answers are not there."""
    from types import SimpleNamespace

    from pytest_satbench.core.text_summary import shard_line
    from pytest_satbench.report.build import _coverage

    def line(*runs: dict[str, object]) -> str | None:
        cov = _coverage(list(runs), "demo")
        newest = runs[0]["protocol"]
        result = SimpleNamespace(shards=cov.shards, protocol=newest, benchmark="demo")
        return shard_line(result)  # type: ignore[arg-type]  # a stand-in with the attributes shard_line reads

    # one part alone says which part it is; the part run again is one part
    assert line(_run("b", 2, 3, 8)) == "shard 2/3: 8 of 24 questions"
    assert line(_run("c", 2, 3, 8), _run("b", 2, 3, 8)) == "shard 2/3: 8 of 24 questions"
    assert line(_run("c", 3, 3, 8), _run("b", 2, 3, 8), _run("a", 1, 3, 8)) == (
        "merged from 3 shard runs (shards 1, 2, 3 of 3): all 24 of 24 questions")
    assert line(_run("c", 3, 3, 7), _run("a", 1, 3, 9)) == (
        "merged from 2 shard runs (shards 1, 3 of 3): 16 of 24 questions; not here: shard 2 (8 questions)")
    assert line(_run("d", 4, 4, 6), _run("a", 1, 4, 6)) == (
        "merged from 2 shard runs (shards 1, 4 of 4): 12 of 24 questions; not here: shards 2, 3 (12 questions)")


# --- the report of merged shard stores (fast: stores written directly, merged and reported in-process)

_BASE = {"model": "m", "prompt_style": "geocot", "sampling": {"temperature": 0.0, "max_tokens": 64},
         "arms": ["orig"], "datasets": {"demo": {"q.json": "aaa"}}, "limit": None, "command": ["pytest"],
         "servers": ["http://a"]}
_SPLIT = {1: range(0, 4), 2: range(4, 8), 3: range(8, 12)}  # shard -> question keys, 12 questions in all


def _shard_store(path: Path, index: int, started: float, keys: range | None = None) -> Path:
    """A finished `--shard I/3` run's store: it recorded and answered its part's questions (or,
    as with -k, only `keys` of them), with the "shard" record its protocol.json keeps."""
    from pytest_satbench.engine.store import AnswerRow, ResultStore

    keys = _SPLIT[index] if keys is None else keys
    counts = {"questions": 12, "images": 6, "shard_questions": len(_SPLIT[index]), "shard_images": 2,
              "planned": len(keys)}
    store = ResultStore(path)
    try:
        run_id = f"shard{index}-{started}"
        store.start_run(run_id, TAG, {**_BASE, "planned": {"demo": len(keys)}, "shard": {
            "index": index, "count": 3, "scheme": "s", "benchmarks": {"demo": counts}}})
        store._write("UPDATE runs SET started=? WHERE run_id=?", (started, run_id), wait=True)
        for k in keys:
            nodeid = f"b/test_demo.py::test_demo[{k}]"
            store.record_item(run_id, nodeid, "demo", {"key": str(k), "text": "Is there a road?", "answer": "yes",
                                                       "types": ["presence"], "kind": "vqa", "choices": None,
                                                       "extra": [], "image_id": f"img{k // 2}", "image_path": None,
                                                       "prompt": "?"}, {"orig": f"o-{k}"})
            store.put(AnswerRow(nodeid=nodeid, arm="orig", fingerprint=f"o-{k}", status="ok", benchmark="demo",
                                question_key=str(k), image_id=f"img{k // 2}", text="yes" if k % 3 else "no",
                                error=None, run_id=run_id))
        store.finish_run(run_id)
    finally:
        store.close()
    return path


def _merged_report(tmp_path: Path, parts: tuple[int, ...]) -> tuple[str, dict[str, object]]:
    from pytest_satbench.report.__main__ import main as report_main

    stores = [str(_shard_store(tmp_path / f"shard-{i}-of-3.sqlite", i, float(i))) for i in parts]
    merged = tmp_path / "merged.sqlite"
    assert report_main(["--merge", *stores, "--into", str(merged)]) == 0
    assert report_main(["--store", str(merged), "--tag", TAG, "--out", str(tmp_path / "out")]) == 0
    folder = tmp_path / "out" / "demo" / TAG
    return (folder / "report.md").read_text(), json.loads((folder / "summary.json").read_text())


def test_a_store_merged_from_every_shard_reports_as_the_whole_benchmark(tmp_path: Path) -> None:
    """Every part of the split is in the store: the report is not a subset run's, it says the
    shard runs it was merged from and that every question is in it."""
    text, summary = _merged_report(tmp_path, (1, 2, 3))
    assert "subset" not in text.lower(), text
    assert "Merged from 3 shard runs (shards 1, 2, 3 of 3): all 12 of 12 questions" in text, text
    assert summary["questions"] == 12 and summary["coverage"]["subset"] is False
    assert summary["coverage"]["shards"] == {"count": 3, "parts": [1, 2, 3], "questions": 12, "missing": 0}


def test_a_store_merged_from_some_shards_names_them_and_what_is_missing(tmp_path: Path) -> None:
    text, summary = _merged_report(tmp_path, (1, 3))
    assert "subset" not in text.lower(), text
    assert ("Merged from 2 shard runs (shards 1, 3 of 3): 8 of 12 questions; not here: shard 2 (4 questions)"
            in text), text
    assert summary["questions"] == 8 and summary["coverage"]["subset"] is False
    # a part run again with -k (2 of its 4 questions) into the merged store is a subset run
    from pytest_satbench.report.__main__ import main as report_main

    _shard_store(tmp_path / "merged.sqlite", 3, 4.0, keys=range(8, 10))
    assert report_main(["--store", str(tmp_path / "merged.sqlite"), "--tag", TAG, "--out", str(tmp_path / "k")]) == 0
    text = (tmp_path / "k" / "demo" / TAG / "report.md").read_text()
    assert "Merged from 2 shard runs (shards 1, 3 of 3): 8 of 12 questions" in text, text
    assert "Subset run: this run selected 2 of the 8 questions of tag array" in text, text
