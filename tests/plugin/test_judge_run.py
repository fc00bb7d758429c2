"""VRSBench's official evaluation end to end: with --judge, a real run's figures take the judge's
verdicts where the rules leave an answer undecided, under the published evaluation's label; the
judge is asked once per undecided answer over runs; without it, the rules-only lower bound."""

from __future__ import annotations

from pathlib import Path

import pytest
from datasets_fake import write_vrsbench
from servers import FakeVLM

BENCH = """
from pytest_satbench import benchmark_test
test_vrsbench = benchmark_test("vrsbench")
"""
# what the model says instead of the ground truth (every other question it answers exactly)
REPLIES = {"ship": "a vessel", "Yellow": "golden", "2": "3"}


def _model(prompt: str, has_image: bool, image: bytes | None) -> str:
    from datasets_fake import VRSBENCH_VQA_SAMPLES

    for _, text, gt in VRSBENCH_VQA_SAMPLES:
        if text in prompt:
            return REPLIES.get(gt, gt)
    return "?"


def _judge(prompt: str, has_image: bool, image: bytes | None) -> str:
    return "1" if "Predicted Answer: a vessel" in prompt else "0"  # a vessel is a ship; golden is not yellow


def _run(pytester: pytest.Pytester, data: Path, url: str, *args: str) -> pytest.RunResult:
    return pytester.runpytest("--servers", url, "--data-root", str(data), "-q", "-p", "no:randomly", *args)


def test_the_judge_decides_what_the_rules_leave_and_is_asked_once(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_bench=BENCH)
    data = pytester.path / "data"
    write_vrsbench(data, n_images=2, ref=False)
    with FakeVLM(["m"], answer=_model) as srv, FakeVLM(["judge-m"], answer=_judge) as judge:
        judged = _run(pytester, data, srv.url, "--judge", judge.url)
        asked = judge.chat_requests
        again = _run(pytester, data, srv.url, "--judge", judge.url)
        assert judge.chat_requests == asked == 4  # 2 undecided answers on each of 2 images, once
        rules_only = _run(pytester, data, srv.url, "--tag", "nojudge")
    out = judged.stdout.str()
    assert "VRSBench All (question-weighted), the published evaluation: rules, then an LLM" in out
    # 24 questions: quantity wrong by the rules, colour wrong by the judge, category right by it
    judged.stdout.fnmatch_lines(["*the published evaluation*", "*orig *24 *83.3*"])
    assert again.stdout.str().count("83.3") == out.count("83.3")
    rules_only.stdout.fnmatch_lines(["*rules only: a lower bound of the*", "*orig *24 *75.0*"])
