"""The benchmark's figures (`Labels` aggregates, `stats.summarize_aggregate`), checked by hand:
GeoChat's published RSVQA-LR average, the original RSVQA protocol's OA and AA with counts in
every class, VRSBench's rules-only mean, and the identities with the per-type statistics."""

from __future__ import annotations

import math

import pytest

from pytest_satbench.core.figures_json import aggregate_views
from pytest_satbench.core.labels import ANY_TYPE, AVERAGE, OVERALL, Aggregate, Labels, notes
from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.core.records import AnswerRow
from pytest_satbench.core.results import benchmark_results, question_record
from pytest_satbench.core.scoring import ScoreOptions
from pytest_satbench.core.stats import ArmOutcome, QuestionRecord, summarize, summarize_aggregate
from pytest_satbench.core.text_summary import render
from pytest_satbench.datasets.registry import get

JPEG = "jpeg:quality=10"


def _record(key: int, qtype: str, orig: bool, recon: bool | None = None, *, image: str | None = None,
            views: dict[str, dict[str, float]] | None = None) -> QuestionRecord:
    arms = {"orig": ArmOutcome("ok", orig, True)}
    if recon is not None:
        arms[JPEG] = ArmOutcome("ok", recon, True)
    return QuestionRecord(str(key), image or f"img{key % 97}", (qtype,), arms, None, views or {})


def _geochat_records() -> list[QuestionRecord]:
    """RSVQA-LR with GeoChat's question counts: presence 2955, comparison 4002, rural/urban
    100 (the 7057 its 'Avg' covers), plus 1000 count questions that figure leaves out."""
    recs: list[QuestionRecord] = []
    for qtype, n, right in (("presence", 2955, 2692), ("comp", 4002, 3615), ("rural_urban", 100, 94),
                            ("count", 1000, 200)):
        for i in range(n):
            recs.append(_record(len(recs), qtype, i < right, i < right and i % 10 != 0))
    return recs


PUBLISHED = Aggregate("published", "GeoChat's convention", "questions", ("presence", "comp", "rural_urban"))


def test_geochat_published_average_is_question_weighted() -> None:
    # the paper's own figures: 91.09 / 90.33 / 94.00 on 2955 / 4002 / 100 questions -> 90.70
    assert round((91.09 * 2955 + 90.33 * 4002 + 94.00 * 100) / 7057, 2) == 90.70
    assert round((91.09 + 90.33 + 94.00) / 3, 2) == 91.81  # the mean of types is not it
    recs = _geochat_records()
    fs = summarize_aggregate(recs, weighting="questions", types=PUBLISHED.types, iterations=200)
    # per type 91.10 (2692/2955; 91.09 is not a ratio of 2955), 90.33 (3615/4002), 94.00
    assert {t: round(100 * fs.by_type[t]["orig"].mean, 2) for t in fs.types} == {
        "presence": 91.10, "comp": 90.33, "rural_urban": 94.00}
    assert fs.n == 7057 and fs.accuracy["orig"].n == 7057
    assert f"{100 * fs.accuracy['orig'].value:.2f}" == "90.70"  # (2692 + 3615 + 94) / 7057
    assert fs.accuracy["orig"].value == pytest.approx(6401 / 7057)
    assert fs.accuracy["orig"].ci_low < fs.accuracy["orig"].value < fs.accuracy["orig"].ci_high
    # the paired delta: jpeg loses every tenth right answer of the covered types
    lost = sum(1 for r in recs if r.types[0] != "count" and r.arms["orig"].correct and not r.arms[JPEG].correct)
    p = fs.paired[JPEG]
    assert p.n_pairs == 7057 and p.delta == pytest.approx(-100 * lost / 7057)
    assert p.ci_low < p.delta < p.ci_high < 0
    mean = summarize_aggregate(recs, weighting="types", types=PUBLISHED.types, iterations=0)
    assert mean.accuracy["orig"].value == pytest.approx((2692 / 2955 + 3615 / 4002 + 94 / 100) / 3)
    assert math.isnan(mean.accuracy["orig"].ci_low)  # iterations=0: no interval


def test_a_question_weighted_figure_over_every_type_is_the_overall_accuracy() -> None:
    recs = _geochat_records()
    st = summarize(recs, iterations=300, seed=3)
    oa = summarize_aggregate(recs, weighting="questions", iterations=300, seed=3)
    aa = summarize_aggregate(recs, weighting="types", iterations=300, seed=3)
    o, p = st.overall.accuracy["orig"], st.overall.paired[JPEG]
    assert (oa.accuracy["orig"].value, oa.accuracy["orig"].ci_low, oa.accuracy["orig"].ci_high) == (
        o.accuracy, o.ci_low, o.ci_high)  # the same resamples: the same interval
    assert (oa.paired[JPEG].delta, oa.paired[JPEG].ci_low, oa.paired[JPEG].ci_high) == pytest.approx(
        (p.delta, p.ci_low, p.ci_high))
    assert aa.accuracy["orig"].value == pytest.approx(st.average_accuracy["orig"])
    assert aa.accuracy[JPEG].value == pytest.approx(st.average_accuracy[JPEG])


def _q(key: str, qtype: str, answer: str, image: str) -> Question:
    return Question(benchmark="b", key=key, image=ImageRef(id=image, path=f"/x/{image}.tif"), text="?",
                    answer=answer, types=(qtype,))


def _row(q: Question, arm: str, text: str | None, status: str = "ok") -> AnswerRow:
    return AnswerRow(nodeid=f"t[{q.key}]", arm=arm, fingerprint="f", status=status, benchmark="b",
                     question_key=q.key, image_id=q.image.id, text=text, run_id="r1",
                     server="http://s" if status == "ok" else None, error=None if status == "ok" else "boom")


def _run(bench: str, plan: list[tuple[str, str, str, str]], **kw):
    """plan: (type, ground truth, orig's answer, jpeg's answer or "ERROR"), one image each."""
    stored = []
    for k, (qtype, gt, orig, recon) in enumerate(plan):
        q = _q(str(k), qtype, gt, f"img{k % 4}")
        rows = {"orig": _row(q, "orig", orig),
                JPEG: _row(q, JPEG, None, "error") if recon == "ERROR" else _row(q, JPEG, recon)}
        stored.append((f"t[{q.key}]", question_record(q, "p", None), rows))
    b = get(bench)
    return benchmark_results(bench, "r1", "t", {}, stored, options=ScoreOptions(views=b.score_views),
                             reported_type=b.reported_type, labels=b.labels, iterations=kw.get("iterations", 0))


# RSVQA-LR: a count in every class, answered by orig in the right class but never exactly
LR_PLAN = [
    ("count", "0", "0", "0"),  # class 0: exact and class right (jpeg too)
    ("count", "7", "3", "12"),  # 1-10: class right; jpeg 11-100 wrong
    ("count", "42", "99", "42"),  # 11-100: class right; jpeg exact
    ("count", "420", "101", "1000"),  # 101-1000: both class right
    ("count", "4200", "1001", "ERROR"),  # >1000: class right; jpeg no answer (wrong)
    ("count", "42", "many", "4"),  # unparseable: wrong in both views
    ("presence", "yes", "yes", "no"),
    ("presence", "no", "no", "no"),
    ("comp", "yes", "no", "no"),
    ("comp", "no", "no", "yes"),
    ("rural_urban", "urban", "urban", "urban"),
    ("rural_urban", "rural", "urban", "rural"),
]


def test_original_rsvqa_lr_protocol_by_hand() -> None:
    res = _run("rsvqa_lr", LR_PLAN)
    agg = aggregate_views(res)
    oa, aa, pub = agg[OVERALL], agg[AVERAGE], agg["aggregate:published"]
    assert oa["label"].startswith("RSVQA overall accuracy (OA), original evaluation")
    assert oa["verdicts"] == {"comp": "exact match", "count": "binned", "presence": "exact match",
                              "rural_urban": "exact match"}
    # orig: count 5/6 in classes (exact: 1/6), presence 2/2, comp 1/2, rural/urban 1/2
    assert oa["per_arm"]["orig"] == pytest.approx((5 + 2 + 1 + 1) / 12)
    assert aa["per_arm"]["orig"] == pytest.approx((5 / 6 + 1 + 0.5 + 0.5) / 4)
    # jpeg: count classes 0, 42, 420 right (3/6), presence 1/2, comp 0/2, rural/urban 2/2
    assert oa["per_arm"][JPEG] == pytest.approx((3 + 1 + 0 + 2) / 12)
    assert oa["paired"][JPEG]["delta"] == pytest.approx(100 * (6 - 9) / 12)
    assert aa["paired"][JPEG]["delta"] == pytest.approx(100 * ((3 - 5) / 6 + (1 - 2) / 2 + (0 - 1) / 2 + (2 - 1) / 2) / 4)
    assert oa["by_type"]["count"]["orig"] == {"n": 6, "value": pytest.approx(5 / 6)}
    # the published view: presence, comparison, rural/urban, question-weighted, exact match
    assert pub["types"] == ["presence", "comp", "rural_urban"] and pub["weighting"] == "questions"
    assert pub["per_arm"]["orig"] == pytest.approx(4 / 6) and pub["per_arm"][JPEG] == pytest.approx(3 / 6)
    assert agg["aggregate:published_mean"]["per_arm"]["orig"] == pytest.approx((1 + 0.5 + 0.5) / 3)
    # the per-type table stays exact match: count 1/6, overall 5/12
    assert res.stats.by_type["count"].accuracy["orig"].correct == 1
    assert res.stats.overall.accuracy["orig"].accuracy == pytest.approx(5 / 12)


HR_PLAN = [
    ("count", "3", "3", "4"),  # HR counts are exact in the original evaluation
    ("count", "40", "45", "40"),  # same class, wrong count: wrong
    ("area", "0m2", "0m2", "0"),  # class 0, with or without the unit
    ("area", "7m2", "9m2", "11m2"),  # 1-10 / 11-100
    ("area", "2173m2", "1500 m2", "999m2"),  # >1000 / 101-1000
    ("area", "540m2", "540m2", "5400m2"),
    ("presence", "yes", "yes", "yes"),
    ("comp", "no", "yes", "no"),
]


def test_original_rsvqa_hr_protocol_by_hand() -> None:
    for bench in ("rsvqa_hr", "rsvqa_hr_phili"):
        agg = aggregate_views(_run(bench, HR_PLAN))
        oa, aa, pub = agg[OVERALL], agg[AVERAGE], agg["aggregate:published"]
        assert oa["verdicts"]["count"] == "exact match" and oa["verdicts"]["area"] == "binned"
        # orig: count 1/2, area 4/4 in classes, presence 1/1, comp 0/1
        assert oa["per_arm"]["orig"] == pytest.approx(6 / 8)
        assert aa["per_arm"]["orig"] == pytest.approx((0.5 + 1 + 1 + 0) / 4)
        # jpeg: count 1/2, area 1/4 (0 without unit), presence 1/1, comp 1/1
        assert oa["per_arm"][JPEG] == pytest.approx(4 / 8)
        assert pub["types"] == ["presence", "comp"] and pub["per_arm"]["orig"] == pytest.approx(1 / 2)
        assert "count and area left out" in pub["label"]


def test_vrsbench_headline_is_the_rules_only_mean_and_all() -> None:
    plan = [
        ("object color", "white", "The roof is white.", "grey"),  # rules: gt contained in the answer
        ("object color", "red", "Red", "a red car"),  # exact match: case only
        ("object quantity", "2", "12", "2"),  # 0-99 exact: "12" contains "2" -> the substring rule
        ("object quantity", "3", "three", "3"),  # "three": exact match (number word), rules wrong
        ("image", "airport", "an airport", "airport"),  # image -> scene type
        ("rural or urban", "urban", "urban", "rural"),
    ]
    res = _run("vrsbench", plan)
    agg = aggregate_views(res)
    oa, aa = agg[OVERALL], agg[AVERAGE]
    assert "rules only: a lower bound of the published evaluation" in oa["label"]
    assert aa["label"].startswith("VRSBench mean over the 3 question types")  # 3 types in this run
    assert set(oa["verdicts"].values()) == {"official"}
    assert res.stats.by_type.keys() == {"object color", "object quantity", "scene type"}
    # rules: color 2/2, quantity 1/2 ("12" holds "2"), scene type 2/2
    assert oa["per_arm"]["orig"] == pytest.approx(5 / 6)
    assert aa["per_arm"]["orig"] == pytest.approx((1 + 0.5 + 1) / 3)
    # exact match stays the per-type table: color 1/2, quantity 1/2, scene type 1/2
    assert res.stats.average_accuracy["orig"] == pytest.approx(0.5)
    # jpeg: color 1/2, quantity 2/2 ... "3" == "3", scene 1/2
    assert aa["per_arm"][JPEG] == pytest.approx((0.5 + 1 + 0.5) / 3)


def test_grounding_publishes_no_mean_of_unique_and_non_unique() -> None:
    assert get("vrsbench_ref").labels.average is None
    stored = []
    for k, (flag, text) in enumerate((("1", "{<10><10><50><50>}"), ("0", "no box"), (None, "{<10><10><50><50>}"))):
        types = ("unique",) if flag == "1" else ("non-unique",) if flag == "0" else ("uniqueness unknown",)
        q = Question(benchmark="vrsbench_ref", key=str(k), image=ImageRef(id=f"i{k}", path="/x.png"), text="car",
                     answer="{<10><10><50><50>}", types=types, kind="ref",
                     extra=(("unique", flag),) if flag else (("note", "no readable uniqueness flag"),))
        stored.append((f"t[{k}]", question_record(q, "p", None), {"orig": _row(q, "orig", text)}))
    b = get("vrsbench_ref")
    res = benchmark_results("vrsbench_ref", "r1", "t", {"box_grid": "100"}, stored,
                            options=ScoreOptions(box_grid="100"), reported_type=b.reported_type,
                            labels=b.labels, iterations=0)
    agg = aggregate_views(res)
    assert AVERAGE not in agg and agg[OVERALL]["label"].startswith("VRSBench Acc@0.5, All")
    # the record without a flag counts in All only
    assert set(res.stats.by_type) == {"unique", "non-unique"}
    assert agg[OVERALL]["per_arm"]["orig"] == pytest.approx(2 / 3) and agg[OVERALL]["n"] == 3
    assert res.stats.overall.n == 3 and res.stats.by_type["unique"].n == 1
    assert res.notes == ["no readable uniqueness flag: 1 question"]


def test_generic_benchmark_figures_are_the_tables_own() -> None:
    recs = [_record(k, t, k % 3 == 0, k % 2 == 0) for k, t in enumerate(["a", "b", "c"] * 5)]
    labels = Labels()
    assert not labels.declares_evaluation
    assert [a.name for a in labels.figures(3)] == [OVERALL, AVERAGE]
    st = summarize(recs, iterations=0)
    fs = summarize_aggregate(recs, weighting="types", iterations=0)
    assert fs.accuracy["orig"].value == pytest.approx(st.average_accuracy["orig"])


def test_declarations_are_checked() -> None:
    with pytest.raises(ValueError, match="weighting"):
        Aggregate("x", "x", "mean")
    with pytest.raises(ValueError, match="reserved"):
        Labels(aggregates=(Aggregate(OVERALL, "x"),))
    agg = Aggregate("x", "x", "types", (), (("count", "binned"), (ANY_TYPE, "official")))
    assert (agg.verdict("count"), agg.verdict("presence")) == ("binned", "official")
    assert Aggregate("y", "y").verdict("count") is None


def test_every_declared_verdict_is_a_view_the_benchmark_computes() -> None:
    from pytest_satbench.datasets.registry import all_benchmarks

    for name, b in all_benchmarks().items():
        for agg in b.labels.figures(len(b.types)):
            for _, view in agg.verdicts:
                assert view in b.score_views, (name, agg.name, view)
            assert set(agg.types) <= {b.reported_type(t) for t in b.types}, (name, agg.name)


def test_terminal_shows_the_figures_under_their_labels() -> None:
    res = _run("rsvqa_lr", LR_PLAN, iterations=50)
    text = "\n".join(render(res))
    assert "RSVQA overall accuracy (OA), original evaluation" in text
    assert "published view, GeoChat's convention" in text
    assert "unweighted mean of the 3 type accuracies" not in text  # reports only
    assert "exact match per question type (%)" in text
    row = next(line for line in render(res) if line.startswith("  jpeg:q10"))
    assert row.split()[1:3] == ["12", "50.0"]  # n, the OA: (3 + 1 + 0 + 2) / 12
    assert all(len(line) <= 80 for line in render(res))


def test_notes_count_per_text() -> None:
    qs = [Question(benchmark="b", key=str(k), image=ImageRef(id="i", path="/x"), text="?", answer="a",
                   types=("t",), extra=(("note", n),) if n else ()) for k, n in enumerate(["x", "", "x", "y"])]
    assert notes(qs) == ["x: 2 questions", "y: 1 question"]


def test_multi_label_questions_count_once_by_questions_and_in_each_type_by_types() -> None:
    arms = lambda c: {"orig": ArmOutcome("ok", c, True)}  # noqa: E731 (a one-line table builder)
    recs = [QuestionRecord("1", "i1", ("a", "b"), arms(True), None, {"orig": {"v": 0.0}}),
            QuestionRecord("2", "i2", ("b",), arms(False), None, {"orig": {"v": 1.0}}),
            QuestionRecord("3", "i3", ("c",), arms(True), None, {})]
    by_q = summarize_aggregate(recs, weighting="questions", types=("b", "a"), iterations=0,
                               verdict=lambda t: "v" if t == "b" else None)
    # question 1 is covered once, decided by "a": the first of its own types the figure covers
    assert by_q.n == 2 and by_q.accuracy["orig"].value == pytest.approx((1 + 1) / 2)
    by_t = summarize_aggregate(recs, weighting="types", types=("a", "b"), iterations=0,
                               verdict=lambda t: "v" if t == "b" else None)
    # a: question 1 by exact match (1/1); b: questions 1 and 2 by the view (1/2)
    assert by_t.accuracy["orig"].value == pytest.approx((1 + 0.5) / 2)
    assert by_t.by_type["b"]["orig"].n == 2 and by_t.types == ("a", "b")


def test_a_figure_whose_view_was_not_computed_is_left_out() -> None:
    labels = Labels(aggregates=(Aggregate("judged", "with a judge", "types", (), ((ANY_TYPE, "judged"),)),
                                Aggregate("counted", "counts by class", "types", (), (("count", "binned"),))))
    stored = []
    for k, qtype in enumerate(("presence", "presence")):
        q = _q(str(k), qtype, "yes", f"img{k}")
        stored.append((f"t[{k}]", question_record(q, "p", None), {"orig": _row(q, "orig", "yes")}))
    res = benchmark_results("b", "r1", "t", {}, stored, options=ScoreOptions(), labels=labels, iterations=0)
    # no judge ran: no "judged" view, no figure; no count question: "binned" is not needed
    assert set(res.figures) == {OVERALL, AVERAGE, "counted"}
    assert "aggregate:judged" not in aggregate_views(res) and "aggregate:counted" in aggregate_views(res)
