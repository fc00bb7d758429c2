"""What a run keeps per question item until the end of the session (plugin/runtest.py).

Shape, not timings: the terminal's reports of passed question items are `LeanReport`s (no
instance dict, no keywords, sections or user properties), failed ones keep their failure
section, nothing is left in an item's stash, and the session holds no outcome per item.
performance/memory.py measures what this saves.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from datasets_fake import rsvqa_suite
from servers import Fail, FakeVLM

BENCH_MODULE = """
from pytest_satbench import benchmark_test
test_rsvqa_lr = benchmark_test("rsvqa_lr")
"""

# A plugin in the pytester directory: at the end of the session, what the terminal and the
# items still hold, as JSON
SHAPE_CONFTEST = '''
import json

import pytest

from pytest_satbench.plugin.items import SESSION_KEY, QuestionItem


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    out = {}
    for category, reports in terminalreporter.stats.items():
        out[category] = [
            {"type": type(r).__name__, "when": getattr(r, "when", None), "instance_dict": sorted(vars(r)),
             "keywords": len(r.keywords), "sections": list(r.sections), "user_properties": list(r.user_properties),
             "longrepr": r.longrepr is not None, "nodeid": r.nodeid, "outcome": getattr(r, "satbench_outcome", None),
             "duration": r.duration}
            for r in reports if hasattr(r, "when")
        ]
    session = terminalreporter._session
    out["stash"] = [len(i.stash) for i in session.items if isinstance(i, QuestionItem)]
    out["outcomes_held"] = len(config.stash[SESSION_KEY]._outcomes)
    with open("shape.json", "w") as fh:
        json.dump(out, fh)
'''

N_IMAGES, PER_TYPE = 2, 2
N_QUESTIONS = N_IMAGES * 4 * PER_TYPE


@pytest.fixture
def bench(pytester: pytest.Pytester) -> Path:
    pytester.makeconftest(SHAPE_CONFTEST)
    return rsvqa_suite(pytester, BENCH_MODULE, n_images=N_IMAGES, per_type=PER_TYPE)


def _run(pytester: pytest.Pytester, srv: FakeVLM, data: Path, *args: str) -> tuple[pytest.RunResult, dict]:
    result = pytester.runpytest("--servers", srv.url, "--data-root", str(data), "--recon", "identity",
                                "-W", "ignore::pytest.PytestAssertRewriteWarning", "--no-reports", *args)
    return result, json.loads((pytester.path / "shape.json").read_text())


def test_passed_question_reports_are_kept_lean(pytester: pytest.Pytester, bench: Path) -> None:
    with FakeVLM(models=["m"], answer=lambda prompt, has_image, image: "yes") as srv:
        result, shape = _run(pytester, srv, bench, "-q")
    assert result.ret == 0
    result.stdout.fnmatch_lines([f"{N_QUESTIONS} passed in *"])  # the counts come from the lean reports
    phases = shape[""]  # setup and teardown, filed by the terminal under ""
    calls = shape["passed"]
    assert len(phases) == 2 * N_QUESTIONS and len(calls) == N_QUESTIONS
    for rep in phases + calls:
        assert rep["type"] == "LeanReport"
        assert rep["instance_dict"] == []  # every attribute in a slot or shared on the class
        assert rep["keywords"] == 0 and rep["sections"] == [] and rep["user_properties"] == []
        assert rep["longrepr"] is False
        assert "::test_rsvqa_lr[" in rep["nodeid"]
    assert sorted({r["when"] for r in phases}) == ["setup", "teardown"]
    assert {r["outcome"] for r in calls} == {"same"}  # the outcome letter is kept, for -r and the counts
    assert all(r["duration"] == 0.0 for r in phases if r["when"] == "setup")  # nothing runs in setup
    assert shape["stash"] == [0] * N_QUESTIONS  # pytest's tmp_path record is not left behind
    assert shape["outcomes_held"] == 0


def test_a_failed_question_keeps_its_failure_section(pytester: pytest.Pytester, bench: Path) -> None:
    failing = {"Are there more roads than water areas?": [Fail.http(500)] * 100}
    with FakeVLM(models=["m"], answer=lambda prompt, has_image, image: "yes", fail_prompt=failing) as srv:
        result, shape = _run(pytester, srv, bench, "-q", "--retries", "0")
    assert result.ret == 1
    failed = shape["failed"]
    assert len(failed) == N_IMAGES  # the first comp question of each image
    for rep in failed:
        assert rep["type"] == "TestReport" and rep["longrepr"] is True and rep["when"] == "call"
    result.stdout.fnmatch_lines(["*orig: *HTTP 500*"])
    assert all(r["type"] == "LeanReport" for r in shape["passed"])
    assert shape["outcomes_held"] == 0


def test_your_own_tests_keep_pytests_reports(pytester: pytest.Pytester, bench: Path) -> None:
    pytester.makepyfile(test_mine="def test_mine():\n    assert True\n")
    with FakeVLM(models=["m"], answer=lambda prompt, has_image, image: "yes") as srv:
        result, shape = _run(pytester, srv, bench, "-q")
    assert result.ret == 0
    mine = [r for r in shape["passed"] + shape[""] if r["nodeid"].startswith("test_mine.py")]
    assert len(mine) == 3
    assert all(r["type"] == "TestReport" and r["keywords"] > 0 for r in mine)
