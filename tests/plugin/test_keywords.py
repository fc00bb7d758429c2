"""-k evaluated per benchmark before its questions load."""

from __future__ import annotations

import pytest

from pytest_satbench.plugin.items import keyword_could_match


@pytest.mark.parametrize(
    ("expr", "own", "expected"),
    [
        ("rsvqa_lr", "test_rsvqa_lr", True),
        ("rsvqa_lr", "test_rsvqa_hr", False),
        ("rsvqa", "test_rsvqa_hr", True),
        ("not rsvqa_hr", "test_rsvqa_hr", False),
        ("not rsvqa_hr", "test_rsvqa_hr_phili", False),  # substring, as pytest itself
        ("not rsvqa_hr", "test_rsvqa_lr", True),
        ("rsvqa_lr and presence", "test_rsvqa_hr", False),
        ("rsvqa_hr and presence", "test_rsvqa_hr", True),
        ("presence", "test_rsvqa_hr", True),  # a type: decided per item, so load
        ("rsvqa_lr or 123", "test_rsvqa_hr", True),  # a key fragment could match
        ("demo or vrsbench", "test_rsvqa_lr", False),
    ],
)
def test_keyword_could_match(expr: str, own: str, expected: bool) -> None:
    others = [n for n in ("test_rsvqa_lr", "test_rsvqa_hr", "test_rsvqa_hr_phili", "test_demo", "test_vrsbench") if n != own]
    assert keyword_could_match(expr, [own, "test_rsvqa.py", "benchmarks"], others) is expected
