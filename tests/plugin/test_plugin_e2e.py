"""Real pytest runs (pytester) of the plugin against real loopback HTTP servers.

The fake dataset is RSVQA-LR in its exact on-disk format (stubs, answers joined through
answers_ids); the servers are `tests/servers.py`'s FakeVLM, which counts every request.
"""

from __future__ import annotations

import io
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from datasets_fake import rsvqa_suite, write_rsvqa
from PIL import Image
from servers import Fail, FakeVLM

BENCH_MODULE = """
from pytest_satbench import benchmark_test
test_rsvqa_lr = benchmark_test("rsvqa_lr")
test_rsvqa_hr = benchmark_test("rsvqa_hr")
"""

N_IMAGES, PER_TYPE = 4, 2
N_QUESTIONS = N_IMAGES * 4 * PER_TYPE  # 4 question types


def always(text: str):
    return lambda prompt, has_image, image: text


@pytest.fixture
def bench(pytester: pytest.Pytester) -> Path:
    return rsvqa_suite(pytester, BENCH_MODULE, n_images=N_IMAGES, per_type=PER_TYPE)


def run(pytester: pytest.Pytester, srv: FakeVLM | str, data: Path, *args: str) -> pytest.RunResult:
    url = srv if isinstance(srv, str) else srv.url
    return pytester.runpytest(
        "--servers", url, "--data-root", str(data), "--retries", "3",
        "-W", "ignore::pytest.PytestAssertRewriteWarning", *args,
    )


def test_every_question_is_an_item_and_a_rerun_asks_nothing(pytester: pytest.Pytester, bench: Path) -> None:
    with FakeVLM(models=["m"], answer=always("yes")) as srv:
        first = run(pytester, srv, bench, "-q")
        assert srv.chat_requests == N_QUESTIONS  # orig only: one request per question
        second = run(pytester, srv, bench, "-q")
        assert srv.chat_requests == N_QUESTIONS  # nothing re-asked
    assert first.ret == second.ret == 0
    first.stdout.fnmatch_lines([f"answers: {N_QUESTIONS} asked this run, 0 reused from the store*"])
    second.stdout.fnmatch_lines([f"answers: 0 asked this run, {N_QUESTIONS} reused from the store*"])
    # the same verdicts both times: questions whose answer is "yes" are right
    assert _final_line(first) == _final_line(second)
    listing = pytester.runpytest("--collect-only", "-q", "--data-root", str(bench))
    listing.stdout.fnmatch_lines(["test_bench.py::test_rsvqa_lr[[]*[]]"])
    assert sum("::test_rsvqa_lr[" in line for line in listing.outlines) == N_QUESTIONS


def _final_line(result: pytest.RunResult) -> str:
    return [line for line in result.outlines if " in " in line and ("passed" in line or "failed" in line)][-1].rsplit(" in ", 1)[0]


def test_k_selects_by_type_and_never_loads_unselected_benchmarks(pytester: pytest.Pytester, bench: Path) -> None:
    # a broken RSVQA-HR file: loading it would fail an item, so it must not be loaded
    hr = bench / "RSVQA-HR"
    hr.mkdir()
    (hr / "USGS_split_test_questions.json").write_text("{not json")
    (hr / "USGS_split_test_answers.json").write_text("{not json")
    with FakeVLM(models=["m"], answer=always("yes")) as srv:
        result = run(pytester, srv, bench, "-q", "-k", "rsvqa_lr and presence")
        assert srv.chat_requests == N_IMAGES * PER_TYPE
    assert result.ret == 0
    result.stdout.fnmatch_lines([f"{N_IMAGES * PER_TYPE} passed*deselected*"])
    # without -k, the broken file is loaded and fails one item naming the file, the rest runs
    with FakeVLM(models=["m"], answer=always("yes")) as srv:
        result = run(pytester, srv, bench, "-q", "-rf")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*RSVQA-HR/USGS_split_test_answers.json: not valid JSON*"])
    result.stdout.fnmatch_lines([f"*1 failed, {N_IMAGES * PER_TYPE} passed, *{N_QUESTIONS - N_IMAGES * PER_TYPE} wrong*"])


def test_lf_reruns_exactly_the_errored_items(pytester: pytest.Pytester, bench: Path) -> None:
    bad_prompt = "Are there more roads than water areas?"  # the comp question of every image
    failing = {bad_prompt: [Fail.http(500)] * 100}
    with FakeVLM(models=["m"], answer=always("yes"), fail_prompt=failing) as srv:
        first = run(pytester, srv, bench, "-q", "--retries", "1")
    n_comp = N_IMAGES  # per_type=2: the second comp question has another text
    assert first.ret == 1
    outcomes = first.parseoutcomes()
    assert outcomes["failed"] == n_comp
    assert outcomes.get("passed", 0) + outcomes.get("wrong", 0) == N_QUESTIONS - n_comp
    first.stdout.fnmatch_lines(["*orig: *HTTP 500*"])
    assert "Traceback" not in first.stdout.str()
    with FakeVLM(models=["m"], answer=always("yes")) as srv:  # the server recovered
        again = run(pytester, srv, bench, "-q", "--lf")
        assert srv.chat_requests == n_comp  # only the errored items were asked again
    assert again.ret == 0
    assert again.parseoutcomes() == {"wrong": n_comp}  # --lf: the others are not even collected


def test_transient_failures_are_retried_and_wrong_answers_are_not(pytester: pytest.Pytester, bench: Path) -> None:
    script = {1: Fail.http(500), 2: Fail.rate_limited(retry_after=0), 3: Fail.reset(), 4: Fail.http(503)}
    with FakeVLM(models=["m"], answer=always("certainly not"), fail_at=script) as srv:
        result = run(pytester, srv, bench, "-q", "--concurrency", "4")
        # every answer is wrong; only the 4 injected failures were asked again
        assert srv.chat_requests == N_QUESTIONS + 4
    assert result.ret == 0
    result.stdout.fnmatch_lines([f"{N_QUESTIONS} wrong*"])


def test_servers_listing_different_models_are_refused(pytester: pytest.Pytester, bench: Path) -> None:
    with FakeVLM(models=["model-a"]) as a, FakeVLM(models=["model-b"]) as b:
        result = run(pytester, f"{a.url},{b.url}", bench, "-q")
        assert a.chat_requests == b.chat_requests == 0
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
    assert any("model-a" in line and "model-b" in line for line in result.errlines)


def test_corrupt_or_missing_image_fails_only_its_items(pytester: pytest.Pytester, bench: Path) -> None:
    images = bench / "RSVQA-LR" / "Images_LR"
    (images / "10.tif").write_bytes(b"garbage, not a TIFF")
    (images / "11.tif").unlink()
    with FakeVLM(models=["m"], answer=always("yes")) as srv:
        result = run(pytester, srv, bench, "-q", "-rf")
    per_image = 4 * PER_TYPE
    outcomes = result.parseoutcomes()
    assert outcomes["failed"] == 2 * per_image
    assert outcomes["passed"] + outcomes["wrong"] == N_QUESTIONS - 2 * per_image
    result.stdout.fnmatch_lines(["*cannot decode image*10.tif*", "*11.tif*"])
    assert "Traceback" not in result.stdout.str()


def test_changed_recon_asks_again_and_reuses_the_original(pytester: pytest.Pytester, bench: Path) -> None:
    with FakeVLM(models=["m"], answer=always("yes")) as srv:
        run(pytester, srv, bench, "-q", "--recon", "jpeg:quality=10")
        assert srv.chat_requests == 2 * N_QUESTIONS
        run(pytester, srv, bench, "-q", "--recon", "jpeg:quality=20")
        # the original is sent at the same geometry and bytes: reused; the new arm is asked
        assert srv.chat_requests == 3 * N_QUESTIONS
        run(pytester, srv, bench, "-q", "--recon", "jpeg:quality=20", "--max-new", "16")
        assert srv.chat_requests == 5 * N_QUESTIONS  # another max_tokens: everything again
        assert {r.max_tokens for r in srv.recorded[-2 * N_QUESTIONS:]} == {16}


def test_regressions_are_letters_and_fail_only_when_asked(pytester: pytest.Pytester, bench: Path) -> None:
    orig = (bench / "RSVQA-LR" / "Images_LR" / "10.tif")
    with Image.open(orig) as im:
        buf = io.BytesIO()
        im.convert("RGB").save(buf, format="JPEG", quality=95)
    threshold = len(buf.getvalue()) // 2  # noise images: the q1 reconstruction compresses far better

    def by_detail(prompt: str, has_image: bool, image: bytes | None) -> str:
        return "yes" if image and len(image) > threshold else "no"

    with FakeVLM(models=["m"], answer=by_detail) as srv:
        result = run(pytester, srv, bench, "-q", "--recon", "jpeg:quality=1")
        assert result.ret == 0
        n_regressed = result.parseoutcomes()["regressed"]
        assert n_regressed == N_IMAGES * PER_TYPE  # the presence questions ("yes")
        assert result.parseoutcomes()["improved"] == N_IMAGES * PER_TYPE  # comp ("no")
        strict = run(pytester, srv, bench, "-q", "--recon", "jpeg:quality=1", "--fail-on", "regression", "-rf")
        assert srv.chat_requests == 2 * N_QUESTIONS  # the second run re-asked nothing
    assert strict.ret == 1
    strict.stdout.fnmatch_lines([f"{n_regressed} failed*"])
    strict.stdout.fnmatch_lines(["*REGRESSED: expected 'yes', orig answered 'yes', jpeg:quality=1 answered 'no'*"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "many"], "--concurrency: expected auto, N (per server) or total:N, got 'many'"),
        (["--recon", "jpeg:quality=500"], "--recon jpeg: quality=500 is out of range 1..100"),
        (["--recon", "webp"], "--recon 'webp': unknown codec 'webp'*"),
        (["--servers", "gpu1:8000"], "--servers: 'gpu1:8000' is not a URL*"),
        (["--box-grid", "7"], "--box-grid: expected one of 1000, 100, pixels, got '7'"),
        (["--data-root", "/nonexistent/data"], "--data-root: /nonexistent/data is not a folder*"),
        (["--repeat-orig", "1"], "--repeat-orig: K is the number of asks in all*"),
        (["--tag", "../x"], "--tag: use letters, digits*"),
    ],
)
def test_bad_options_are_one_line_usage_errors(pytester: pytest.Pytester, bench: Path, args: list[str], message: str) -> None:
    result = pytester.runpytest("--data-root", str(bench), *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert "Traceback" not in result.stderr.str()


def test_missing_servers_and_missing_benchmarks_are_one_line(pytester: pytest.Pytester, bench: Path) -> None:
    result = pytester.runpytest("--data-root", str(bench), "-k", "rsvqa_lr")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: satbench: benchmark items need servers: pass --servers*"])
    with FakeVLM(models=["m"], answer=always("yes")) as srv:
        result = run(pytester, srv, bench, "-q")
    result.stdout.fnmatch_lines(["satbench: rsvqa_hr left out, not found: *RSVQA-HR/USGS_split_test_questions.json*"])


def test_xdist_keeps_each_image_on_one_worker(pytester: pytest.Pytester, bench: Path) -> None:
    with FakeVLM(models=["m"], answer=always("yes")) as srv:
        result = run(pytester, srv, bench, "-n", "2", "-v", "--recon", "jpeg:quality=10")
        assert srv.chat_requests == 2 * N_QUESTIONS
    assert result.ret == 0
    worker_of: dict[str, str] = {}
    for line in result.outlines:
        if line.startswith("[gw") and "test_rsvqa_lr[" in line:
            worker_of[line.split("test_rsvqa_lr[")[1].split("]")[0]] = line[1:4]
    assert len(worker_of) == N_QUESTIONS
    assert len(set(worker_of.values())) == 2  # both workers ran questions
    # question ids are contiguous per image in the fake data: group them by image
    per_image = 4 * PER_TYPE
    keys = sorted(worker_of, key=int)
    for i in range(0, len(keys), per_image):
        assert len({worker_of[k] for k in keys[i:i + per_image]}) == 1
    result.stdout.fnmatch_lines(["*satbench: rsvqa_lr*", f"*answers: {2 * N_QUESTIONS} asked this run*"])


def test_sigkill_then_rerun_gives_the_uninterrupted_results(pytester: pytest.Pytester, tmp_path: Path) -> None:
    def slow_answer(prompt: str, has_image: bool, image: bytes | None) -> str:
        time.sleep(0.03)
        return "yes" if len(prompt) % 2 else "no"

    def make_dir(name: str) -> tuple[Path, Path]:
        d = tmp_path / name
        d.mkdir()
        (d / "test_bench.py").write_text(BENCH_MODULE)
        (d / "pytest.ini").write_text("[pytest]\n")
        data = d / "data"
        write_rsvqa(data, "lr", n_images=6, per_type=2)
        return d, data

    def cmd(data: Path, url: str) -> list[str]:
        return [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "--servers", url,
                "--data-root", str(data), "--recon", "jpeg:quality=30", "--concurrency", "2"]

    n = 6 * 4 * 2
    with FakeVLM(models=["m"], answer=slow_answer) as srv:
        ref_dir, ref_data = make_dir("ref")
        ref = subprocess.run(cmd(ref_data, srv.url), cwd=ref_dir, capture_output=True, text=True, timeout=300)
        assert ref.returncode == 0, ref.stdout + ref.stderr
        asked_before = srv.chat_requests
        assert asked_before == 2 * n

        kill_dir, kill_data = make_dir("kill")
        db = kill_dir / ".pytest_cache" / "d" / "satbench" / "results.sqlite"
        proc = subprocess.Popen(cmd(kill_data, srv.url), cwd=kill_dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        stored = 0
        while time.monotonic() < deadline and stored < 20:
            time.sleep(0.05)
            if db.exists():
                try:
                    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
                        stored = conn.execute("SELECT COUNT(*) FROM answers WHERE status='ok'").fetchone()[0]
                except sqlite3.Error:
                    pass
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        assert 20 <= stored < 2 * n, "the run was not killed mid-way"
        asked_killed = srv.chat_requests - asked_before
        resumed = subprocess.run(cmd(kill_data, srv.url), cwd=kill_dir, capture_output=True, text=True, timeout=300)
        asked_resumed = srv.chat_requests - asked_before - asked_killed
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    # at most the requests in flight at the kill (concurrency 2) were asked twice
    assert asked_killed + asked_resumed <= 2 * n + 2
    assert asked_resumed < 2 * n

    def table(out: str) -> list[str]:
        lines = out.splitlines()
        start = next(i for i, line in enumerate(lines) if "satbench: rsvqa_lr" in line)
        return [
            line for line in lines[start:]
            if not line.startswith(("answers:", "satbench: report", "satbench: rsvqa_hr left out")) and " in " not in line
        ]

    assert table(resumed.stdout) == table(ref.stdout)
    assert _final_line_text(resumed.stdout) == _final_line_text(ref.stdout)


def _final_line_text(out: str) -> str:
    return out.strip().splitlines()[-1].rsplit(" in ", 1)[0]


def test_public_fixtures_answer_a_users_own_question(pytester: pytest.Pytester, tmp_path: Path) -> None:
    img = tmp_path / "scene.png"
    Image.new("RGB", (64, 64), (0, 0, 255)).save(img)
    pytester.makepyfile(test_mine=f"""
        from pytest_satbench import ImageRef, Question

        def test_water(satbench_ask, satbench_model, satbench_images):
            q = Question(benchmark="mine", key="w1", image=ImageRef(id="scene", path={str(img)!r}),
                         text="Is there a water area?", answer="yes", types=("presence",))
            result = satbench_ask(q)
            assert satbench_model == "m"
            assert set(result.arms) == {{"orig", "jpeg:quality=50"}}
            assert result.arms["orig"].correct and result.arms["orig"].text == "yes"
    """)
    with FakeVLM(models=["m"], answer=always("yes")) as srv:
        result = pytester.runpytest("--servers", srv.url, "--recon", "jpeg:quality=50", "-q",
                                    "-W", "ignore::pytest.PytestAssertRewriteWarning")
        assert srv.chat_requests == 2
    assert result.ret == 0
    result.assert_outcomes(passed=1)


def test_x_stops_at_the_first_failure_without_waiting_for_slow_requests(pytester: pytest.Pytester, bench: Path) -> None:
    def answer(prompt: str, has_image: bool, image: bytes | None) -> str:
        time.sleep(8)  # every request hangs far longer than the run should take
        return "yes"

    (bench / "RSVQA-LR" / "Images_LR" / "10.tif").unlink()  # the first image's items fail at once
    with FakeVLM(models=["m"], answer=answer) as srv:
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:randomly", "--servers", srv.url,
             "--data-root", str(bench)],
            cwd=pytester.path, capture_output=True, text=True, timeout=120,
        )
        elapsed = time.monotonic() - started
    assert proc.returncode == 1, proc.stdout
    assert "1 failed" in proc.stdout and "stopping after 1 failures" in proc.stdout
    assert elapsed < 6, f"exit waited for in-flight requests ({elapsed:.1f}s)"


def test_x_says_what_was_sent_for_items_it_never_reached(pytester: pytest.Pytester, bench: Path) -> None:
    (bench / "RSVQA-LR" / "Images_LR" / "11.tif").unlink()  # the second image's items fail
    with FakeVLM(models=["m"], answer=always("yes"), delay=0.05) as srv:
        result = run(pytester, srv, bench, "-x", "-q")
        sent = srv.chat_requests
    assert result.ret == 1
    text = " ".join(result.stdout.str().split())
    line = re.search(r"answers: (\d+) asked this run, 0 reused from the store; model m; (\d+) requests sent", text)
    # the look-ahead asked for items after the failure: the line says so, not just "N asked"
    assert line is not None, text[-1500:]
    asked, requests = int(line.group(1)), int(line.group(2))
    assert asked < requests <= sent + 4, (asked, requests, sent)


def test_junitxml_names_each_question(pytester: pytest.Pytester, bench: Path) -> None:
    import xml.etree.ElementTree as ET

    with FakeVLM(models=["m"], answer=always("yes")) as srv:
        run(pytester, srv, bench, "-q", "--junitxml", "out.xml", "--deselect", "test_bench.py::test_rsvqa_lr[3]")
    cases = ET.parse(pytester.path / "out.xml").getroot().iter("testcase")
    names = sorted(c.get("name") for c in cases)
    assert len(names) == N_QUESTIONS - 1
    assert "test_rsvqa_lr[3]" not in names and "test_rsvqa_lr[4]" in names


def test_toklip_root_is_accepted_as_the_seed_does(pytester: pytest.Pytester, bench: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toklip = pytester.path / "toklip"
    toklip.mkdir()
    (bench).rename(toklip / "data")
    monkeypatch.delenv("SATBENCH_DATA_ROOT", raising=False)
    monkeypatch.setenv("TOKLIP_ROOT", str(toklip))
    with FakeVLM(models=["m"], answer=always("yes")) as srv:
        result = pytester.runpytest("--servers", srv.url, "-q", "-W", "ignore::pytest.PytestAssertRewriteWarning")
    assert result.ret == 0
    assert sum(result.parseoutcomes().values()) == N_QUESTIONS


def test_cache_clear_forgets_answers_and_export_writes_every_row(pytester: pytest.Pytester, bench: Path) -> None:
    with FakeVLM(models=["m"], answer=always("yes")) as srv:
        run(pytester, srv, bench, "-q", "--export-jsonl")
        assert srv.chat_requests == N_QUESTIONS
        rows = (pytester.path / "reports" / "results.jsonl").read_text().splitlines()
        assert len(rows) == N_QUESTIONS and all('"status": "ok"' in r for r in rows)
        run(pytester, srv, bench, "-q", "--cache-clear")  # the store lives in pytest's cache
        assert srv.chat_requests == 2 * N_QUESTIONS
