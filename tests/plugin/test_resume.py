"""`--lf` after a run that stopped early is a resume, and a subset run never shrinks its tag's
report.

- A run stopped before its end (Ctrl-C, -x, --maxfail, a stop of the plugin's) adds the items
  it never reached to pytest's last-failed list: `--lf` then reruns the failed and the
  never-reached items, and answers nothing twice.
- Reports are built from every stored answer of the tag's questions: a `-k`, `--lf` or
  `--limit` run says it was a subset, and its report still covers all of them.
- `python -m pytest_satbench.report --list` counts, per run, its questions, answered, errors
  and missing.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from datasets_fake import rsvqa_suite, write_rsvqa
from servers import Fail, FakeVLM, interruptible

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
NEVER_REACHED = re.compile(r"satbench: this run never reached (\d+) of its (\d+) items: they are added to "
                           r"pytest's last-failed list, so `pytest --lf` reruns them with the items that failed")


def _lastfailed(root: Path) -> dict[str, bool]:
    return json.loads((root / ".pytest_cache" / "v" / "cache" / "lastfailed").read_text())


def _summary(root: Path, bench: str = "rsvqa_lr", tag: str = "default") -> dict:
    return json.loads((root / "reports" / bench / tag / "summary.json").read_text())


def _report_list(root: Path, store: Path) -> list[str]:
    got = subprocess.run([sys.executable, "-m", "pytest_satbench.report", "--store", str(store), "--list"],
                         cwd=root, capture_output=True, text=True, timeout=60, check=True)
    return got.stdout.splitlines()


def test_lf_after_ctrl_c_reruns_the_failed_and_the_never_reached_items(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_b.py").write_text("from pytest_satbench import benchmark_test\ntest_rsvqa_lr = benchmark_test('rsvqa_lr')\n")
    data = tmp_path / "data"
    written = write_rsvqa(data, "lr", n_images=10, per_type=5)  # 200 questions, 40 per image
    # the first two requests of the first image's first question text fail at once (HTTP 400)
    failing = {written.expected[0].text: [Fail.http(400)] * 2}
    store = tmp_path / "results.sqlite"
    # answers after the 60th wait until Ctrl-C is sent: the run cannot end before it, however
    # slowly this process gets to send it on a loaded machine
    gate, answered = threading.Event(), itertools.count(1)

    def answer(prompt: str, has_image: bool, image: bytes | None) -> str:
        if next(answered) > 60:
            gate.wait(60)
        return "yes"

    with FakeVLM(["m"], answer=answer, delay=0.05, fail_prompt=failing) as srv:
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "--servers", srv.url, "--data-root",
               str(data), "--store", str(store), "--concurrency", "4"]
        run = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               preexec_fn=interruptible)  # noqa: PLW1509 (only resets SIGINT)
        deadline = time.monotonic() + 120
        while srv.chat_requests < 61 and time.monotonic() < deadline and run.poll() is None:
            time.sleep(0.05)
        run.send_signal(signal.SIGINT)
        gate.set()
        out, _ = run.communicate(timeout=60)
        asked = srv.chat_requests
        listed = _report_list(tmp_path, store)
        lastfailed = _lastfailed(tmp_path)
        resumed = subprocess.run([*cmd, "--lf"], check=False, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        total = srv.chat_requests
    assert run.returncode == 2, out
    got = NEVER_REACHED.search(out)
    assert got is not None, out
    never, of = int(got.group(1)), int(got.group(2))
    assert of == 200 and 0 < never < 200
    failed = [line.split()[1] for line in out.splitlines() if line.startswith("FAILED ")]
    assert len(failed) == 2
    # what --lf selects: the two failures and every item the interrupted run never reached
    assert len(lastfailed) == never + 2 and all(f in lastfailed for f in failed)
    [unfinished] = listed
    ran = 200 - never  # items that ran, the two failures among them
    # the stop keeps what was in flight (at most --concurrency 4 answers of items never reached)
    counts = re.search(r"unfinished  model=m  arms=orig  questions=200 answered=(\d+) errors=2 missing=(\d+)", unfinished)
    assert counts is not None, unfinished
    answered, missing = int(counts.group(1)), int(counts.group(2))
    assert ran - 2 <= answered <= ran - 2 + 4 and answered + 2 + missing == 200, unfinished

    assert resumed.returncode == 0, resumed.stdout
    outcomes = resumed.stdout.splitlines()[-1]
    assert sum(int(n) for n in re.findall(r"(\d+) (?:passed|wrong)", outcomes)) == never + 2, outcomes
    # nothing asked twice but the failures and what was in flight at Ctrl-C (4)
    assert total <= 200 + 2 + 4 and total >= asked
    conn = sqlite3.connect(store)
    assert conn.execute("SELECT COUNT(*) FROM answers WHERE status='ok'").fetchone()[0] == 200
    conn.close()
    joined = resumed.stdout.replace("\n  ", " ")
    assert (f"subset run: this run selected {never + 2} of the 200 questions of tag default; the figures and the "
            "report cover all 200") in joined
    summary = _summary(tmp_path)
    assert summary["questions"] == 200 and summary["not_run"] == 0 and not summary["unfinished"]
    assert summary["coverage"]["subset"] and summary["coverage"]["run_selected"] == never + 2
    assert summary["statistics"]["overall"]["accuracy"]["orig"]["errors"] == 0  # the failures were answered
    newest, first = _report_list(tmp_path, store)
    assert f"finished  model=m  arms=orig  questions={never + 2} answered={never + 2} errors=0 missing=0" in newest
    # counts are the store's now: the resumed run's answers replaced the first run's two errors
    assert first == unfinished.replace(f"answered={ran - 2} errors=2", f"answered={ran} errors=0")
    assert not _lastfailed(tmp_path)


def test_lf_after_x_under_xdist_reruns_the_failed_and_the_never_reached_items(pytester: pytest.Pytester) -> None:
    data = rsvqa_suite(pytester, "from pytest_satbench import benchmark_test\ntest_rsvqa_lr = benchmark_test('rsvqa_lr')\n",
                       n_images=8, per_type=2)  # 64 questions
    pytester.makeini("[pytest]\n")
    args = ("--data-root", str(data), "-n", "2", "-p", "no:randomly", "--concurrency", "2",
            "-W", "ignore::pytest.PytestAssertRewriteWarning")
    with FakeVLM(["m"], answer=lambda p, h, i: "yes", delay=0.02, fail_at={1: Fail.http(400)}) as srv:
        first = pytester.runpytest("--servers", srv.url, *args, "-x")
        got = NEVER_REACHED.search(first.stdout.str())
        assert got is not None, first.stdout.str()
        never = int(got.group(1))
        assert 0 < never < 64 and int(got.group(2)) == 64
        assert len(_lastfailed(pytester.path)) == never + 1
        again = pytester.runpytest("--servers", srv.url, *args, "--lf")
        assert srv.chat_requests <= 64 + 1 + 4  # the failure again, and what -x left in flight
    assert again.ret == 0, again.stdout.str()
    assert sum(v for k, v in again.parseoutcomes().items() if k in ("passed", "wrong")) == never + 1
    assert _summary(pytester.path)["questions"] == 64
    assert not _lastfailed(pytester.path)  # everything has run now: nothing left for --lf


@pytest.fixture
def demo(pytester: pytest.Pytester) -> tuple[str, ...]:
    pytester.makeini("[pytest]\n")
    shutil.copytree(BENCHMARKS, pytester.path / "benchmarks")
    return ("benchmarks", "-k", "demo", "--servers", "builtin", "--recon", "jpeg:quality=10", "-p", "no:randomly",
            "--bootstrap", "50", "-W", "ignore::pytest.PytestAssertRewriteWarning")


def test_subset_runs_never_shrink_the_tags_report(pytester: pytest.Pytester, demo: tuple[str, ...]) -> None:
    full = pytester.runpytest(*demo, "--fail-on", "regression", "-q")
    assert full.ret == 1
    whole = _summary(pytester.path, "demo")
    regressed = whole["statistics"]["overall"]["paired"]["jpeg:quality=10"]["regressed"]
    assert whole["questions"] == 400 and 0 < regressed < 400
    predictions = (pytester.path / "reports" / "demo" / "default" / "predictions.jsonl").read_text()

    # --lf reruns the regressed items only: the report still covers all 400 questions
    lf = pytester.runpytest(*demo, "--fail-on", "regression", "-q", "--lf")
    assert lf.parseoutcomes() == {"failed": regressed}
    lf.stdout.fnmatch_lines([
        f"subset run: this run selected {regressed} of the 400 questions of tag default; the",
        "  figures and the report cover all 400 *",
        f"answers: 0 asked this run, {2 * regressed} reused from the store, {2 * (400 - regressed)} more from*",
    ])
    after = _summary(pytester.path, "demo")
    assert after["questions"] == 400 and after["statistics"] == whole["statistics"]
    assert after["coverage"] == {"runs": after["coverage"]["runs"], "run_selected": regressed,
                                 "run_questions": regressed, "subset": True, "shards": None}
    assert len(after["coverage"]["runs"]) == 2
    assert (pytester.path / "reports" / "demo" / "default" / "predictions.jsonl").read_text() == predictions
    report = (pytester.path / "reports" / "demo" / "default" / "report.md").read_text()
    assert f"Subset run: this run selected {regressed} of the 400 questions of tag default" in report

    # -k and --limit subsets alike; the run's own terminal table shows the tag's figures
    for subset, n in ((("-k", "demo and count"), 120), (("--limit", "20"), 20)):
        part = pytester.runpytest(*demo, "-q", *subset)
        assert part.ret == 0
        part.stdout.fnmatch_lines(["overall*400*", f"subset run: this run selected {n} of the 400 questions*"])
        got = _summary(pytester.path, "demo")
        assert got["questions"] == 400 and got["statistics"] == whole["statistics"]
        assert got["limited"] is None and got["not_run"] == 0  # the full run had no --limit


def test_another_model_under_the_tag_starts_its_report_afresh(pytester: pytest.Pytester) -> None:
    data = rsvqa_suite(pytester, "from pytest_satbench import benchmark_test\ntest_rsvqa_lr = benchmark_test('rsvqa_lr')\n",
                       n_images=2, per_type=2)  # 16 questions
    pytester.makeini("[pytest]\n")
    args = ("--data-root", str(data), "-q", "-p", "no:randomly", "-W", "ignore::pytest.PytestAssertRewriteWarning")
    with FakeVLM(["m"], answer=lambda p, h, i: "yes") as srv:
        assert pytester.runpytest("--servers", srv.url, *args).ret == 0
    assert _summary(pytester.path)["questions"] == 16
    with FakeVLM(["m2"], answer=lambda p, h, i: "yes") as srv:
        refused = pytester.runpytest("--servers", srv.url, *args, "-k", "presence")
        assert refused.ret == pytest.ExitCode.USAGE_ERROR and srv.chat_requests == 0
        mixed = pytester.runpytest("--servers", srv.url, *args, "-k", "presence", "--allow-protocol-change")
        assert srv.chat_requests == 4
    assert mixed.ret == 0
    got = _summary(pytester.path)  # answers of two models are never merged into one report
    assert got["model"] == "m2" and got["questions"] == 4 and not got["coverage"]["subset"]
    assert len(got["coverage"]["runs"]) == 1
