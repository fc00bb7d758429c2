"""The one route from stored rows to numbers (`core.results.benchmark_results`): multi-label
types, the benchmark's aggregate views, errors in the denominators, labels, usage."""

from __future__ import annotations

import math

import pytest

from pytest_satbench.core.figures_json import aggregate_views
from pytest_satbench.core.labels import Labels, ViewLabel
from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.core.records import AnswerRow, ServerTraffic
from pytest_satbench.core.results import benchmark_results, question_record
from pytest_satbench.core.scoring import ScoreOptions

CHOICES = ("Factory", "Park", "Farm", "Forest")  # answer C = Farm


def _q(key: str, types: tuple[str, ...], *, kind: str = "mc", answer: str = "C", image: str = "1",
       extra: tuple[tuple[str, str], ...] = ()) -> Question:
    return Question(benchmark="b", key=key, image=ImageRef(id=image, path=f"/x/{image}.png"), text="?",
                    answer=answer, types=types, kind=kind, choices=CHOICES if kind == "mc" else None,  # type: ignore[arg-type]  # kind: one of Question's kinds
                    extra=extra)


def _row(q: Question, arm: str, text: str | None, *, status: str = "ok", run_id: str = "r1",
         server: str = "http://127.0.0.1:1") -> AnswerRow:
    return AnswerRow(nodeid=f"t[{q.key}]", arm=arm, fingerprint="f", status=status, benchmark="b",
                     question_key=q.key, image_id=q.image.id, text=text, run_id=run_id,
                     server=server if status == "ok" else None, latency_s=1.0 if status == "ok" else None,
                     error=None if status == "ok" else "boom")


def _stored(rows_by_question: list[tuple[Question, dict[str, AnswerRow]]]):
    return [(f"t[{q.key}]", question_record(q, "prompt", None), rows) for q, rows in rows_by_question]


def test_multi_label_questions_count_under_each_type_and_aa_is_the_mean_of_types() -> None:
    a, b, c = _q("1", ("1", "5")), _q("2", ("1",), image="2"), _q("3", ("5", "11", "5"), image="3")
    res = benchmark_results("b", "r1", "t", {}, _stored([
        (a, {"orig": _row(a, "orig", "C")}),  # right
        (b, {"orig": _row(b, "orig", "A")}),  # wrong
        (c, {"orig": _row(c, "orig", "no idea")}),  # unparseable; "5" listed twice
    ]), options=ScoreOptions(), iterations=0)
    st = res.stats
    o = st.overall.accuracy["orig"]
    assert (o.n, o.correct, o.unparseable) == (3, 1, 1)
    assert (st.by_type["1"].accuracy["orig"].n, st.by_type["1"].accuracy["orig"].correct) == (2, 1)
    assert (st.by_type["5"].accuracy["orig"].n, st.by_type["5"].accuracy["orig"].unparseable) == (2, 1)
    assert st.by_type["11"].accuracy["orig"].accuracy == 0.0
    # AA is the unweighted mean over types; OA the question-weighted overall accuracy
    assert st.average_accuracy["orig"] == pytest.approx((0.5 + 0.5 + 0.0) / 3)
    assert st.overall_accuracy["orig"] == pytest.approx(1 / 3)


def test_errors_stay_in_denominators_and_views_and_usage_counts_runs() -> None:
    u, n = (_q(k, ("vehicle",), kind="ref", answer="{<25><40><33><60>}", image=k, extra=(("unique", v),))
            for k, v in (("1", "1"), ("2", "0")))
    res = benchmark_results("b", "r2", "t", {"box_grid": "100"}, _stored([
        (u, {"orig": _row(u, "orig", "{<25><40><33><60>}", run_id="r1"),
             "jpeg:quality=10": _row(u, "jpeg:quality=10", "{<27><42><35><62>}", run_id="r2")}),
        (n, {"orig": _row(n, "orig", "no box", run_id="r2"),
             "jpeg:quality=10": _row(n, "jpeg:quality=10", None, status="error")}),
    ]), options=ScoreOptions(box_grid="100"), iterations=0,
        labels=Labels(views=(ViewLabel("acc@0.7", "acc@0.7: IoU >= 0.7", "Acc@0.7 by uniqueness"),)),
        traffic={"http://127.0.0.1:1": ServerTraffic("http://127.0.0.1:1", 5, 3, 2, 2)})
    recon = res.stats.overall.accuracy["jpeg:quality=10"]
    assert (recon.n, recon.errors, recon.correct) == (2, 1, 1)  # the error counts, as wrong
    assert res.views["acc@0.5"].overall["jpeg:quality=10"].mean == pytest.approx(0.5)  # error = miss
    assert res.views["acc@0.7"].overall["orig"].mean == pytest.approx(0.5)
    views = aggregate_views(res)
    assert views["view:acc@0.7"]["label"] == "Acc@0.7 by uniqueness"
    assert views["view:iou"]["label"] == "iou"  # undeclared: its own name
    assert [it.regressed_arms for it in res.items] == [[], []]  # iou .543 is still a hit at 0.5
    usage = res.usage
    assert (usage.asked, usage.reused, usage.errors) == (2, 1, 1)  # r1's answer was reused by r2
    srv = usage.by_server["http://127.0.0.1:1"]
    assert (srv.answers, srv.requests, srv.failures, srv.retries) == (3, 5, 2, 2)
    assert res.noise_floor is None and not math.isnan(srv.latency_p50_s or math.nan)
