"""Answer-level analysis from the one route's records: confusion, per-class recall, balanced
accuracy, the majority baseline, and the orig -> recon answer transitions."""

from __future__ import annotations

import math

import pytest

from pytest_satbench.core.analysis import OTHER, UNREADABLE, analyse, recall_rows, to_dict, transition_rows
from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.core.records import AnswerRow
from pytest_satbench.core.results import BenchmarkResult, benchmark_results, question_record
from pytest_satbench.core.scoring import ScoreOptions

RECON = "jpeg:quality=10"


def _result(cases: list[tuple[str, str, str, str | None]]) -> BenchmarkResult:
    """cases: (type, ground truth, orig reply, recon reply or None)."""
    stored = []
    for i, (qtype, truth, orig, recon) in enumerate(cases):
        q = Question(benchmark="b", key=str(i), image=ImageRef(id=str(i % 5), path=f"/x/{i % 5}.png"), text="?",
                     answer=truth, types=(qtype,))
        rows = {"orig": _row(q, "orig", orig)}
        if recon is not None:
            rows[RECON] = _row(q, RECON, recon)
        stored.append((q.key, question_record(q, "p", None), rows))
    return benchmark_results("b", "r", "t", {}, stored, options=ScoreOptions(), iterations=0)


def _row(q: Question, arm: str, text: str) -> AnswerRow:
    return AnswerRow(nodeid=q.key, arm=arm, fingerprint="f", status="ok", benchmark="b", question_key=q.key,
                     image_id=q.image.id, text=text, run_id="r")


def test_always_no_is_exposed_by_balanced_accuracy_and_the_majority_baseline() -> None:
    # 8 "no" and 2 "yes" presence questions; the model says "no" to everything
    cases = [("presence", "no", "No.", None)] * 8 + [("presence", "yes", "no", None)] * 2
    res = _result([(t, g, o, r) for t, g, o, r in cases])
    assert res.stats.overall.accuracy["orig"].accuracy == pytest.approx(0.8)  # looks good
    ta = analyse(res).by_type["presence"]  # type: ignore[union-attr]  # not None: these cases have answer classes
    arm = ta.by_arm["orig"]
    assert {r.answer: (r.n, r.correct) for r in arm.recall} == {"no": (8, 8), "yes": (2, 0)}
    assert arm.balanced_accuracy == pytest.approx(0.5)  # it is not
    assert (ta.majority_answer, ta.majority_accuracy) == ("no", pytest.approx(0.8))
    assert arm.confusion.rows == ("no", "yes") and arm.confusion.columns == ("no", "yes", OTHER, UNREADABLE)
    assert arm.confusion.counts == ((8, 0, 0, 0), (2, 0, 0, 0))


def test_transitions_show_how_a_codec_changes_answers() -> None:
    cases = (
        [("presence", "yes", "yes", "no")] * 5  # the codec erased the object
        + [("presence", "no", "no", "yes")] * 1
        + [("presence", "yes", "yes", "yes")] * 3
        + [("count", "3", "3", "1")] * 2
        + [("count", "3", "3", "<think>counting")] * 1  # unreadable after the codec
    )
    analysis = analyse(_result(cases))
    assert analysis is not None
    pres = analysis.by_type["presence"].transitions[RECON]
    assert [(t.before, t.after, t.count) for t in pres] == [("yes", "no", 5), ("no", "yes", 1)]
    count = analysis.by_type["count"].transitions[RECON]
    # "1" is not a ground-truth class of the type: pooled
    assert [(t.before, t.after, t.count) for t in count] == [("3", OTHER, 2), ("3", UNREADABLE, 1)]
    assert "orig" not in analysis.by_type["presence"].transitions
    rows = list(transition_rows(analysis))
    assert {"type": "presence", "arm": RECON, "orig_answer": "yes", "recon_answer": "no", "count": 5} in rows
    assert len(list(recall_rows(analysis))) == 2 * 2 + 2 * 1  # (type, arm, class) rows
    d = to_dict(analysis)
    assert d["by_type"]["count"]["by_arm"][RECON]["balanced_accuracy"] == 0.0  # type: ignore[index]  # to_dict gives nested dicts


def test_top_classes_pool_the_rest() -> None:
    cases = [("count", str(k), str(k), None) for k in range(12) for _ in range(12 - k)]
    ta = analyse(_result(cases), top=3).by_type["count"]  # type: ignore[union-attr]  # not None: these cases have answer classes
    conf = ta.by_arm["orig"].confusion
    assert conf.rows == ("0", "1", "2", OTHER)
    assert sum(map(sum, conf.counts)) == len(cases)
    assert conf.counts[-1][conf.columns.index(OTHER)] == sum(12 - k for k in range(3, 12))
    assert math.isclose(ta.by_arm["orig"].balanced_accuracy, 1.0)


def test_grounding_has_no_answer_classes() -> None:
    q = Question(benchmark="b", key="1", image=ImageRef(id="1", path="/x/1.png"), text="the ship",
                 answer="{<1><2><30><40>}", types=("unique",), kind="ref")
    res = benchmark_results("b", "r", "t", {}, [("1", question_record(q, "p", None), {"orig": _row(q, "orig", "[1,2,3,4]")})],
                            options=ScoreOptions(), iterations=0)
    assert analyse(res) is None
