"""Gates read the figures a benchmark declares: a bare gate its headline (the number its paper
prints), `FIGURE:` another declared figure, `exact:` exact match; per type, the figure over that
type's questions. Built through the one route (`benchmark_results`) on rows with known verdicts."""

from __future__ import annotations

import pytest

from pytest_satbench.core.gates import GateError, evaluate, figure_parts, parse_gate, render
from pytest_satbench.core.labels import Aggregate, Labels
from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.core.records import AnswerRow
from pytest_satbench.core.results import BenchmarkResult, benchmark_results, question_record
from pytest_satbench.core.scoring import ScoreOptions
from pytest_satbench.datasets.rsvqa import RSVQA_VIEWS  # the "binned" view with RSVQA's class rule

JPEG = "jpeg:quality=5"
# an RSVQA-LR-like protocol: counts decided in classes (the headline), a published view of
# presence only, exact match per type beside them
LABELS = Labels(
    overall="OA, counts in classes", average="AA, counts in classes", verdicts=(("count", "binned"),),
    aggregates=(Aggregate("published", "presence only, exact", "questions", ("presence",)),),
)


def _q(key: str, qtype: str, answer: str, image: str) -> Question:
    return Question(benchmark="b", key=key, image=ImageRef(id=image, path=f"/x/{image}.png"), text="?",
                    answer=answer, types=(qtype,))


def _row(q: Question, arm: str, text: str) -> AnswerRow:
    return AnswerRow(nodeid=f"t[{q.key}]", arm=arm, fingerprint="f", status="ok", benchmark="b",
                     question_key=q.key, image_id=q.image.id, text=text, run_id="r1", server="s")


def _result(gates: list[str], questions: list[tuple[Question, dict[str, str]]], labels: Labels = LABELS,
            views: frozenset[str] = RSVQA_VIEWS) -> BenchmarkResult:
    stored = [(f"t[{q.key}]", question_record(q, "p", None), {arm: _row(q, arm, t) for arm, t in replies.items()})
              for q, replies in questions]
    parsed = [parse_gate(g) for g in gates]
    return benchmark_results("b", "r1", "t", {}, stored, options=ScoreOptions(views=views), labels=labels,
                             iterations=200, figure_parts=figure_parts(parsed, "b"))


def _rsvqa_like() -> list[tuple[Question, dict[str, str]]]:
    out = []
    for i in range(8):  # counts: orig "7" for 5 (in class 1-10: right binned, wrong exact); jpeg "50" (wrong)
        out.append((_q(f"c{i}", "count", "5", f"img{i}"), {"orig": "7", JPEG: "50"}))
    for i in range(8):  # presence: orig right, jpeg right on half
        out.append((_q(f"p{i}", "presence", "yes", f"img{i}"), {"orig": "yes", JPEG: "yes" if i % 2 else "no"}))
    return out


def _gate(gates: list[str], result: BenchmarkResult) -> dict[str, object]:
    return {r.expr: r for r in evaluate([parse_gate(g) for g in gates], {"b": result})}


def test_a_bare_gate_reads_the_headline_not_exact_match() -> None:
    gates = ["b:orig>=0.9", "b:exact:orig>=0.9", "b:average_accuracy:orig>=0.9", "b:published:orig>=0.9",
             "*:published:recon>=0.5", "b:delta>=-30", "b:exact:delta>=-30"]
    res = _result(gates, _rsvqa_like())
    got = _gate(gates, res)
    # headline OA: every count right in classes, every presence right
    assert got["b:orig>=0.9"].value == pytest.approx(1.0) and got["b:orig>=0.9"].passed
    assert got["b:orig>=0.9"].figure == "overall_accuracy (headline)"
    assert got["b:exact:orig>=0.9"].value == pytest.approx(0.5) and not got["b:exact:orig>=0.9"].passed
    assert got["b:exact:orig>=0.9"].figure == "exact match"
    assert got["b:average_accuracy:orig>=0.9"].value == pytest.approx(1.0)
    assert got["b:published:orig>=0.9"].value == pytest.approx(1.0)
    assert got["b:published:recon>=0.5"].value == pytest.approx(0.5) and got["b:published:recon>=0.5"].figure == "published"
    # headline delta: counts 100 -> 0, presence 100 -> 50: -75 points; exact: counts 0 -> 0: -25
    assert got["b:delta>=-30"].value == pytest.approx(-75.0) and not got["b:delta>=-30"].passed
    assert got["b:exact:delta>=-30"].value == pytest.approx(-25.0) and got["b:exact:delta>=-30"].passed
    # the same numbers as the result's own figures: no second computation
    assert got["b:orig>=0.9"].value == res.figures["overall_accuracy"].accuracy["orig"].value
    table = "\n".join(render(list(got.values())))
    assert "overall_accuracy (headline)" in table and "exact match" in table and "published" in table


def test_a_per_type_gate_reads_the_figure_over_that_type() -> None:
    gates = ["b/count:orig>=0.25", "b/count:exact:orig>=0.25", "b/count:delta_ci_high<=0",
             "b/presence:published:recon>=0.5", "b/count:published:orig>=0.5"]
    res = _result(gates, _rsvqa_like())
    got = _gate(gates, res)
    assert got["b/count:orig>=0.25"].value == pytest.approx(1.0)  # in classes
    assert got["b/count:exact:orig>=0.25"].value == pytest.approx(0.0) and not got["b/count:exact:orig>=0.25"].passed
    assert got["b/count:delta_ci_high<=0"].value == pytest.approx(-100.0)
    assert got["b/presence:published:recon>=0.5"].value == pytest.approx(0.5)
    never = got["b/count:published:orig>=0.5"]
    assert not never.passed and "does not cover type 'count'" in never.reason


def test_gates_never_pass_vacuously_on_figures() -> None:
    gates = ["b:nosuch:orig>=0", "b/area:orig>=0", "other:orig>=0"]
    got = _gate(gates, _result(gates, _rsvqa_like()))
    assert not any(r.passed for r in got.values())
    assert "no figure 'nosuch'" in got["b:nosuch:orig>=0"].reason
    assert "known: exact, overall_accuracy, average_accuracy, published" in got["b:nosuch:orig>=0"].reason


@pytest.mark.parametrize(("text", "message"), [
    ("b:published:regressed<=3", "regressed is counted on exact match only"),
    ("*/count:orig>=0.5", "a type needs a benchmark"),
])
def test_figure_gates_that_cannot_mean_anything_are_usage_errors(text: str, message: str) -> None:
    with pytest.raises(GateError, match=message):
        parse_gate(text)


def test_gate_evaluation_against_known_stats() -> None:
    # without a declared protocol the headline is exact match, question-weighted
    questions = [(_q(str(i), "t", "yes", f"img{i // 2}"), {"orig": "yes", JPEG: "no" if i < 3 else "yes"})
                 for i in range(10)]
    res = _result([], questions, labels=Labels(), views=frozenset())
    results = {r.expr: r for r in evaluate([parse_gate("delta>=-20"), parse_gate("b:regressed<=3"),
                                            parse_gate("b:recon>=0.7")], {"b": res})}
    assert results["b:delta>=-20"].value == pytest.approx(-30.0) and not results["b:delta>=-20"].passed
    assert results["b:regressed<=3"].passed and results["b:regressed<=3"].value == 3
    assert results["b:recon>=0.7"].passed and results["b:recon>=0.7"].value == pytest.approx(0.7)
