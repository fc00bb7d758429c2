"""The route reads the stored rows once and keeps nothing per question but what the
statistics need (core/results.py, "Memory"): shape, not timings."""

from __future__ import annotations

from collections.abc import Iterator

from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.core.records import AnswerRow
from pytest_satbench.core.results import (
    QuestionOutcome,
    QuestionResult,
    _score_question,
    benchmark_results,
    question_record,
)
from pytest_satbench.core.scoring import ScoreOptions, score


def _q(key: str, answer: str, qtype: str = "presence", image: str = "1") -> Question:
    return Question(benchmark="b", key=key, image=ImageRef(id=image, path=f"/x/{image}.png"), text=f"q{key}?",
                    answer=answer, types=(qtype,))


def _row(q: Question, arm: str, text: str | None) -> AnswerRow:
    return AnswerRow(nodeid=f"t[{q.key}]", arm=arm, fingerprint="f", status="ok" if text is not None else "error",
                     benchmark="b", question_key=q.key, image_id=q.image.id, text=text, run_id="r1",
                     server="http://127.0.0.1:1", latency_s=0.5, error=None if text is not None else "boom")


def _questions(n: int) -> list[tuple[Question, dict[str, AnswerRow]]]:
    out = []
    for k in range(n):
        q = _q(str(k), "yes" if k % 2 else "no", image=str(k // 10))
        out.append((q, {"orig": _row(q, "orig", "yes"), "jpeg": _row(q, "jpeg", "no" if k % 3 else None)}))
    return out


def test_rows_are_read_once_as_a_stream_and_each_question_is_handed_out_in_order() -> None:
    plan = _questions(60)
    read: list[str] = []

    def stored() -> Iterator[tuple[str, dict, dict[str, AnswerRow]]]:
        for q, rows in plan:
            read.append(q.key)
            yield f"t[{q.key}]", question_record(q, "p", None), rows

    seen: list[QuestionResult] = []
    res = benchmark_results("b", "r1", "t", {}, stored(), options=ScoreOptions(), iterations=10, each=seen.append)
    assert read == [q.key for q, _ in plan]  # one pass
    assert [it.question.key for it in seen] == read and all(isinstance(it, QuestionResult) for it in seen)
    assert seen[1].rows["orig"].text == "yes" and seen[1].scores["orig"].correct
    assert len(res.items) == 60 and all(isinstance(it, QuestionOutcome) for it in res.items)
    # questions with the same answer pattern share one outcome object: a pointer per question
    assert len({id(it) for it in res.items}) <= 6
    assert res.items[1].question.key == "" and res.items[1].question.answer == "yes"  # a stand-in, no ids
    assert res.usage.total.answers == 60 + 40 and res.usage.errors == 20
    assert res.stats.overall.n == 60


def test_shared_outcomes_answer_what_the_analysis_asks() -> None:
    plan = _questions(12)
    res = benchmark_results("b", "r1", "t", {}, [(f"t[{q.key}]", question_record(q, "p", None), rows) for q, rows in plan],
                            options=ScoreOptions(), iterations=0)
    for (q, rows), it in zip(plan, res.items, strict=True):
        assert list(it.rows) == list(rows) and it.rows["orig"] == "ok"
        assert it.correct("orig") == (q.answer == "yes")
        assert it.regressed_arms == (["jpeg"] if q.answer == "yes" else [])  # jpeg says "no" or errs


def test_records_share_their_parts_and_scores_are_remembered() -> None:
    from pytest_satbench.core.results import _ScoreMemo, _Shared

    shared, memo = _Shared(), _ScoreMemo()
    records = []
    for q, rows in _questions(40):
        _, record = _score_question(f"t[{q.key}]", q, rows, ScoreOptions(), lambda t: t, memo, shared)
        records.append(record)
    assert len({id(r.arms) for r in records}) <= 4 and len({id(r.image) for r in records}) == 4
    assert len({id(r.types) for r in records}) == 1
    q = _q("x", "yes")
    assert memo(q, "yes", ScoreOptions()) == score(q, "yes", ScoreOptions())
    assert memo(q, "yes", ScoreOptions()) is memo(_q("y", "yes", image="9"), "yes", ScoreOptions())
    long = "yes " * 100  # long replies are scored each time, not remembered
    assert memo(q, long, ScoreOptions()) == score(q, long, ScoreOptions())
