"""core/usage.py's visual tokens: prompt tokens per arm, paired with the original's and the blind
arm's on the same question; rows without a count, errors, judge and repeat arms stay out."""

from __future__ import annotations

from pytest_satbench.core.records import AnswerRow
from pytest_satbench.core.usage import UsageTally, per_thousand, resized_line, visual_summary


def _row(arm: str, prompt: int | None, status: str = "ok") -> AnswerRow:
    return AnswerRow(nodeid="n", arm=arm, fingerprint="f", status=status, benchmark="b", question_key="k",
                     image_id="i", prompt_tokens=prompt, image_tokens=64 if arm == "tok" else None, run_id="r")


def test_prompt_tokens_are_paired_per_question() -> None:
    tally = UsageTally("r")
    tally.add({"orig": _row("orig", 300), "tok": _row("tok", 300), "blind": _row("blind", 40),
               "judge:tok": _row("judge:tok", 900), "orig~2": _row("orig~2", 310)})
    tally.add({"orig": _row("orig", 300), "tok": _row("tok", 200), "blind": _row("blind", 40)})
    # orig failed: tok's count has no pair with orig, but one with blind
    tally.add({"orig": _row("orig", None, "error"), "tok": _row("tok", 250), "blind": _row("blind", 50)})
    # the server reported no usage for tok: no pair at all
    tally.add({"orig": _row("orig", 300), "tok": _row("tok", None), "blind": _row("blind", 40)})
    usage = tally.usage(["orig", "tok", "blind"], {})
    v = usage.visual_tokens
    assert set(v) == {"orig", "tok", "blind"}  # no judge, no repeat
    assert (v["tok"].answers, v["tok"].prompt_tokens_mean) == (3, 250)
    assert (v["tok"].paired_orig, v["tok"].delta_orig_mean, v["tok"].differ_orig) == (2, -50, 1)
    assert (v["tok"].paired_blind, v["tok"].image_tokens_mean) == (3, (260 + 160 + 200) / 3)
    assert (v["orig"].paired_blind, v["orig"].image_tokens_mean, v["orig"].differ_orig) == (3, 260, 0)
    assert v["blind"].image_tokens_mean is None
    line = resized_line(usage, {"tok": "tok64"})
    assert line is not None and "tok64 on 1 of 2 questions" in line
    s = visual_summary(usage, {"orig": 0.9, "tok": 0.6, "blind": 0.3})
    assert s["tok"]["codec_tokens_per_image"] == 64
    assert s["tok"]["accuracy_per_1k_codec_tokens"] == 1000 * 0.6 / 64
    assert s["orig"]["accuracy_per_1k_server_visual_tokens"] == 1000 * 0.9 / 260
    assert s["blind"]["accuracy_per_1k_server_visual_tokens"] is None


def test_no_difference_no_line() -> None:
    tally = UsageTally("r")
    tally.add({"orig": _row("orig", 300), "tok": _row("tok", 300)})
    assert resized_line(tally.usage(["orig", "tok"], {})) is None
    assert per_thousand(0.5, 0) is None and per_thousand(None, 10) is None and per_thousand(0.5, 250) == 2.0
