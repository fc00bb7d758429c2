"""Reasoning beside the answer: what the reply gate keeps of a model's thinking, the thinking
left inline, and the per-arm figures (core/reasoning.py)."""

from __future__ import annotations

import http.client
import json

import pytest

from pytest_satbench.core.reasoning import ReasoningTally, estimated_tokens, thinking_cut_off
from pytest_satbench.core.records import AnswerRow
from pytest_satbench.core.scoring import final_answer, inline_reasoning
from pytest_satbench.engine.transport import Response
from pytest_satbench.engine.wire import read_completion


def _reply(message: dict[str, object], finish: str = "stop", usage: object = None) -> Response:
    doc: dict[str, object] = {"model": "m", "choices": [{"index": 0, "message": message, "finish_reason": finish}]}
    if usage is not None:
        doc["usage"] = usage
    return Response(200, http.client.HTTPMessage(), json.dumps(doc).encode())


@pytest.mark.parametrize(("text", "thinking", "answer"), [
    ("yes", None, "yes"),
    ("<think>roofs</think> yes", "roofs", "yes"),
    ("<think></think>\n\nno", "", "no"),  # asked not to think: the tags, empty
    ("the template opened it </think> yes", "the template opened it", "yes"),
    ("<think>still going", "still going", ""),
    ("<think>a</think><think>b</think>A", "a\n\nb", "A"),
    ("<reasoning>r</reasoning><answer>B</answer>", "r", "B"),
])
def test_inline_thinking_is_found_and_the_answer_is_unchanged(text: str, thinking: str | None, answer: str) -> None:
    assert inline_reasoning(text) == thinking
    assert final_answer(text) == answer


def test_the_gate_keeps_reasoning_content_inline_thinking_and_reasoning_tokens() -> None:
    got = read_completion(_reply({"role": "assistant", "content": "yes", "reasoning_content": "roofs"},
                                 usage={"completion_tokens": 9, "completion_tokens_details": {"reasoning_tokens": 4}}),
                          "m")
    assert (got.text, got.reasoning, got.reasoning_chars, got.reasoning_tokens) == ("yes", "roofs", 5, 4)
    got = read_completion(_reply({"role": "assistant", "content": None, "reasoning": "count 1, 2"}, "length"), "m")
    assert (got.text, got.reasoning, got.finish_reason) == ("", "count 1, 2", "length")
    got = read_completion(_reply({"role": "assistant", "content": "<think>hmm</think>no"}), "m")
    assert (got.text, got.reasoning, got.reasoning_chars) == ("<think>hmm</think>no", "hmm", 3)
    # a reasoning token count that is not one is dropped and counted, the answer kept
    got = read_completion(_reply({"role": "assistant", "content": "no"},
                                 usage={"completion_tokens_details": {"reasoning_tokens": -1}}), "m")
    assert (got.text, got.reasoning_tokens, got.usage_dropped, got.reasoning) == ("no", None, 1, None)


def _row(text: str, finish: str = "stop", chars: int | None = None, tokens: int | None = None,
         completion: int | None = None, arm: str = "orig") -> AnswerRow:
    return AnswerRow("n", arm, "f", "ok", "b", "k", "i", text=text, finish_reason=finish, reasoning_chars=chars,
                     reasoning_tokens=tokens, completion_tokens=completion)


def test_the_tally_reports_tokens_estimates_and_cut_offs() -> None:
    rows = [_row("yes", chars=10, tokens=5, completion=8),
            _row("", "length", chars=30, completion=64),  # estimate: all of it thinking
            _row("<think>abcd</think>ok", chars=4, completion=20),  # 4 of 4 + 17 characters
            _row("fine", chars=None, completion=3),  # no reasoning: counted as an answer only
            _row("a long answer cut", "length", chars=None, completion=64)]  # truncated, not thinking
    tally = ReasoningTally()
    for r in rows:
        tally.add({r.arm: r})
    s = tally.stats()["orig"]
    assert (s.answers, s.with_reasoning, s.reported, s.estimated, s.truncated, s.truncated_thinking) == (5, 3, 1, 2, 2, 1)
    values = sorted([5.0, 64.0, 20 * 4 / 21])
    assert s.tokens_mean == pytest.approx(sum(values) / 3) and s.tokens_median == pytest.approx(values[1])
    assert estimated_tokens(rows[2]) == pytest.approx(20 * 4 / 21)
    assert thinking_cut_off(rows[1]) and not thinking_cut_off(rows[4])
    pooled = ReasoningTally()  # an arm's repeats and samples are its answers; the judge's are not
    pooled.add({"orig": _row("yes", chars=4, tokens=2), "orig~2": _row("no", chars=6, tokens=4),
                "orig@2": _row("no", chars=2, tokens=6), "judge:orig": _row("yes", chars=99, tokens=99)})
    got = pooled.stats()
    assert list(got) == ["orig"] and (got["orig"].answers, got["orig"].tokens_mean) == (3, 4.0)
    never = ReasoningTally()
    never.add({"orig": _row("yes", completion=2)})
    assert never.stats() == {}  # a model that never reasons: no figures
