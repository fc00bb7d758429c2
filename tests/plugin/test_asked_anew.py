"""--asked-anew: a run's own report counts its answers asked anew by reason (report/why.py's
count, as `python -m pytest_satbench.report --reasons` prints it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from datasets_fake import rsvqa_suite
from servers import FakeVLM

MODULE = "from pytest_satbench import benchmark_test\ntest_rsvqa_lr = benchmark_test('rsvqa_lr')\n"


def _summary(pytester: pytest.Pytester) -> dict:
    return json.loads((pytester.path / "reports" / "rsvqa_lr" / "default" / "summary.json").read_text())


def test_a_run_counts_what_it_asked_anew_and_why(pytester: pytest.Pytester) -> None:
    data: Path = rsvqa_suite(pytester, MODULE, n_images=2, per_type=1)  # 8 questions
    with FakeVLM(["m"], answer=lambda p, h, i: "yes") as srv:
        first = pytester.runpytest("--servers", srv.url, "--data-root", str(data), "--asked-anew", "-q")
        one = _summary(pytester)
        off = pytester.runpytest("--servers", srv.url, "--data-root", str(data), "-q")
        none = _summary(pytester)
        again = pytester.runpytest("--servers", srv.url, "--data-root", str(data), "--asked-anew",
                                   "--prompt-style", "geochat", "--allow-protocol-change", "-q")
        two = _summary(pytester)
    assert first.ret == off.ret == again.ret == 0
    assert {k: v for k, v in one["asked_anew"].items() if v} == {"new question": 8}
    assert none["asked_anew"] is None  # off by default: it reads every earlier run's records
    assert {k: v for k, v in two["asked_anew"].items() if v} == {"prompt changed": 8}
    assert "asked 8 answers anew (8 prompt changed)" in (
        pytester.path / "reports" / "rsvqa_lr" / "default" / "report.md").read_text().replace("\n", " ")
