"""The one truncation rule: a reply that hit the token limit is scored on what it contains,
as the official evaluation code scores text without reading the finish reason, and is
counted as `truncated` beside its verdict."""

from __future__ import annotations

from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.core.records import AnswerRow
from pytest_satbench.core.results import benchmark_results, question_record
from pytest_satbench.core.scoring import ScoreOptions


def _q(key: str) -> Question:
    return Question(benchmark="b", key=key, image=ImageRef(id=key, path=f"/x/{key}.png"), text="Is there water?",
                    answer="yes", types=("presence",))


def _row(q: Question, text: str, finish: str) -> AnswerRow:
    return AnswerRow(nodeid=q.key, arm="orig", fingerprint="f", status="ok", benchmark="b", question_key=q.key,
                     image_id=q.image.id, text=text, finish_reason=finish, run_id="r")


def test_truncated_replies_are_scored_on_what_they_contain() -> None:
    replies = [
        ("yes", "length"),  # answered, then ran out while adding words: the answer counts
        ("<think>The image shows a river, so", "length"),  # cut off mid-reasoning: no answer
        ("<answer>yes</answer> Because the river", "length"),  # the closed answer tag counts
        ("no", "stop"),
    ]
    qs = [_q(str(i)) for i in range(len(replies))]
    stored = [(q.key, question_record(q, "p", None), {"orig": _row(q, text, finish)})
              for q, (text, finish) in zip(qs, replies, strict=True)]
    acc = benchmark_results("b", "r", "t", {}, stored, options=ScoreOptions(), iterations=0).stats.overall.accuracy["orig"]
    assert (acc.n, acc.correct, acc.truncated, acc.unparseable) == (4, 2, 3, 1)
