"""Benchmarks left out for missing data are said where a user sees them: after collection and
in the summary, never during collection (pytest captures its output and throws it away), and a
run that selects nothing because of them says so and what to do. Run as a user runs pytest, in
a subprocess: an in-process run does not capture the way a real one does."""

from __future__ import annotations

import pytest
from datasets_fake import write_rsvqa
from servers import FakeVLM

MODULE = """
from pytest_satbench import benchmark_test
test_rsvqa_lr = benchmark_test("rsvqa_lr")
test_rsvqa_hr = benchmark_test("rsvqa_hr")
"""
SETS = "point --data-root DIR (ini satbench_data_root) or $SATBENCH_DATA_ROOT at the folder holding"


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.delenv("SATBENCH_DATA_ROOT", raising=False)
    monkeypatch.delenv("TOKLIP_ROOT", raising=False)
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_bench=MODULE)
    return pytester


def _run(pytester: pytest.Pytester, url: str, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("--servers", url, "-p", "no:randomly", *args)


@pytest.mark.parametrize("how", ["option", "ini", "environment"])
def test_a_wrong_data_root_says_what_it_looked_for_and_why_nothing_ran(
        suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    empty = suite.path / "empty"
    empty.mkdir()
    args: tuple[str, ...] = ()
    source = {"option": "--data-root", "ini": "ini satbench_data_root", "environment": "$SATBENCH_DATA_ROOT"}[how]
    if how == "option":
        args = ("--data-root", str(empty))
    elif how == "ini":
        suite.makeini(f"[pytest]\nsatbench_data_root = {empty}\n")
    else:
        monkeypatch.setenv("SATBENCH_DATA_ROOT", str(empty))
    with FakeVLM(["m"]) as srv:
        result = _run(suite, srv.url, "-k", "rsvqa_lr", *args)
        assert srv.chat_requests == 0
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines([
        "collected 0 items",
        (f"satbench: rsvqa_lr left out, not found: {empty}/RSVQA-LR/LR_split_test_questions.json, "
         f"{empty}/RSVQA-LR/LR_split_test_answers.json (data root {empty}, from {source}; {SETS} RSVQA-LR/; "
         f"or fetch them: python -m pytest_satbench.data fetch rsvqa_lr --root {empty})"),
        (f"satbench: no items ran: rsvqa_lr was left out, as its files are not under the data root {empty} "
         f"(from {source}); point --data-root DIR (ini satbench_data_root) or $SATBENCH_DATA_ROOT at the folder "
         f"that holds the benchmarks; or fetch them: python -m pytest_satbench.data fetch rsvqa_lr --root {empty}"),
        "*no tests ran*",
    ])
    assert "rsvqa_hr" not in result.stdout.str()  # -k cannot select it: not loaded, not said


def test_no_data_root_says_which_files_it_needs_and_what_sets_it(suite: pytest.Pytester) -> None:
    with FakeVLM(["m"]) as srv:
        result = _run(suite, srv.url, "-k", "rsvqa_lr", "-q")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines([
        ("satbench: rsvqa_lr left out: no data root is set, so RSVQA-LR/LR_split_test_questions.json, "
         f"RSVQA-LR/LR_split_test_answers.json could not be looked for; {SETS} RSVQA-LR/; "
         "or fetch them: python -m pytest_satbench.data fetch rsvqa_lr"),
        "satbench: no items ran: rsvqa_lr was left out, as no data root is set; *",
    ])


@pytest.mark.parametrize("xdist", [False, True])
def test_a_benchmark_left_out_beside_one_that_runs_is_said_after_collection_and_in_the_summary(
        suite: pytest.Pytester, xdist: bool) -> None:
    data = suite.path / "data"
    write_rsvqa(data, "lr", n_images=2, per_type=1)  # RSVQA-LR only: RSVQA-HR is missing
    line = f"satbench: rsvqa_hr left out, not found: {data}/RSVQA-HR/USGS_split_test_questions.json, *"
    with FakeVLM(["m"], answer=lambda p, h, i: "yes") as srv:
        result = _run(suite, srv.url, "--data-root", str(data), *(["-n", "2"] if xdist else []))
    assert result.ret == 0, result.stdout.str()
    out = result.outlines
    said = [i for i, text in enumerate(out) if text.startswith("satbench: rsvqa_hr left out, not found: ")]
    summary = next(i for i, text in enumerate(out) if text.startswith("answers: "))
    if xdist:  # the controller collects nothing: it says its workers' lines in the summary
        assert len(said) == 1 and said[0] > summary
    else:  # under "collected 8 items", before the first item, and again at the end
        collected = next(i for i, text in enumerate(out) if text.startswith("collected 8 items"))
        first_item = next(i for i, text in enumerate(out) if text.startswith("test_bench.py "))
        assert len(said) == 2 and collected < said[0] < first_item and said[1] > summary
    result.stdout.fnmatch_lines([line])
    assert "no items ran" not in result.stdout.str()
