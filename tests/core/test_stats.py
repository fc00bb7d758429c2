"""Tests for pytest_satbench.core.stats against values known by construction or from the literature."""

from __future__ import annotations

import json
import math
import random
from fractions import Fraction

import numpy as np
import pytest

from pytest_satbench.core.stats import (
    ArmOutcome,
    QuestionRecord,
    cluster_bootstrap_ci,
    group_by,
    mcnemar_exact,
    paired_delta_ci,
    summarize,
    summarize_view,
)

RIGHT = ArmOutcome("ok", correct=True, parsed=True)
WRONG = ArmOutcome("ok", correct=False, parsed=True)
UNPARSEABLE = ArmOutcome("ok", correct=False, parsed=False)
TRUNCATED = ArmOutcome("ok", correct=False, parsed=False, truncated=True)
ERROR = ArmOutcome("error", correct=False, parsed=False)


def rec(
    key: str, image: str, types: tuple[str, ...], chance: float | None = None, **arms: ArmOutcome
) -> QuestionRecord:
    return QuestionRecord(key=key, image=image, types=types, arms=arms, chance=chance)


def exact_mcnemar(b: int, c: int) -> float:
    """Reference: the same test with exact integer arithmetic (slow, small n only)."""
    n, m = b + c, min(b, c)
    if 2 * m >= n:
        return 1.0
    tail, term = 0, 1
    for k in range(m + 1):
        tail += term
        term = term * (n - k) // (k + 1)
    return min(1.0, float(Fraction(2 * tail, 2**n)))


# --------------------------------------------------------------------------- McNemar


def test_mcnemar_textbook_example() -> None:
    # Fagerland, Lydersen & Laake (2013), "The McNemar test for binary matched-pairs data:
    # mid-p and asymptotic are better than exact conditional", BMC Med Res Methodol 13:91,
    # Table 1 (airway hyper-responsiveness before/after stem cell transplantation, Bentur
    # et al.): discordant pairs 1 and 7; exact conditional p = 2 * P(X <= 1 | n=8, 1/2)
    # = 2 * 9/256 = 0.0703 (the paper's mid-p 0.039 must NOT be what we return).
    assert mcnemar_exact(1, 7) == pytest.approx(18 / 256, rel=1e-12)
    assert mcnemar_exact(1, 7) != pytest.approx(10 / 256, rel=1e-3)


@pytest.mark.parametrize(
    ("b", "c", "p"),
    [
        (1, 9, 22 / 1024),  # 2 * (C(10,0) + C(10,1)) / 2^10 = 0.021484375
        (0, 5, 2 / 32),  # 2 * 1/2^5 = 0.0625
        (2, 3, 1.0),  # 2 * 16/32 > 1 -> capped
        (0, 0, 1.0),
        (7, 7, 1.0),
    ],
)
def test_mcnemar_hand_computed(b: int, c: int, p: float) -> None:
    assert mcnemar_exact(b, c) == pytest.approx(p, rel=1e-12)


def test_mcnemar_symmetric_and_monotone() -> None:
    for b, c in [(1, 9), (3, 17), (120, 180), (0, 40)]:
        assert mcnemar_exact(b, c) == mcnemar_exact(c, b)
    # More lopsided with the same number of discordant pairs -> smaller p.
    ps = [mcnemar_exact(k, 100 - k) for k in range(0, 51, 5)]
    assert all(x < y for x, y in zip(ps, ps[1:]))


@pytest.mark.parametrize(("b", "c"), [(4900, 5100), (9800, 10200), (3000, 17000), (10, 19990)])
def test_mcnemar_large_n_matches_exact_integer_arithmetic(b: int, c: int) -> None:
    assert mcnemar_exact(b, c) == pytest.approx(exact_mcnemar(b, c), rel=1e-8)


def test_mcnemar_very_large_n_is_finite_and_sane() -> None:
    # n = 200,000 discordant pairs: no overflow, p in (0, 1), balanced counts give 1.
    p = mcnemar_exact(99_500, 100_500)
    assert 0.0 < p < 1.0
    # Normal approximation with continuity correction is close at this n.
    z = (abs(100_500 - 99_500) - 1) / math.sqrt(200_000)
    assert p == pytest.approx(math.erfc(z / math.sqrt(2)), rel=0.02)
    assert mcnemar_exact(100_000, 100_000) == 1.0


def test_mcnemar_rejects_bad_counts() -> None:
    with pytest.raises(ValueError, match="regressed"):
        mcnemar_exact(-1, 3)
    with pytest.raises(ValueError, match="improved"):
        mcnemar_exact(1, 2.5)  # type: ignore[arg-type]  # a wrong type on purpose: its refusal is tested


# --------------------------------------------------------------------------- bootstrap


def test_bootstrap_degenerate_data() -> None:
    clusters = np.repeat(np.arange(20), 5)
    assert cluster_bootstrap_ci(np.ones(100, bool), clusters, iterations=2000, seed=3) == (1.0, 1.0)
    assert cluster_bootstrap_ci(np.zeros(100, bool), clusters, iterations=2000, seed=3) == (0.0, 0.0)


def test_bootstrap_identical_cluster_means_give_zero_width() -> None:
    # Every image has exactly 5 of 10 right: any resample of images has mean 0.5, while
    # resampling single questions (each its own cluster) does vary.
    y = np.tile(np.r_[np.ones(5), np.zeros(5)], 30)
    images = np.repeat(np.arange(30), 10)
    assert cluster_bootstrap_ci(y, images, iterations=500) == pytest.approx((0.5, 0.5))
    lo, hi = cluster_bootstrap_ci(y, np.arange(y.size), iterations=500)
    assert hi - lo > 0.05


def test_bootstrap_within_cluster_correlation_widens_interval() -> None:
    # Images are all-right or all-wrong: 30 independent units, not 300.
    y = np.repeat(np.arange(30) % 2, 10)
    images = np.repeat(np.arange(30), 10)
    lo_c, hi_c = cluster_bootstrap_ci(y, images, iterations=1000)
    lo_i, hi_i = cluster_bootstrap_ci(y, np.arange(y.size), iterations=1000)
    assert lo_c < 0.5 < hi_c
    assert (hi_c - lo_c) > 2.5 * (hi_i - lo_i)


def test_bootstrap_interval_level_on_known_distribution() -> None:
    # Two single-question images, one right, one wrong: a resample's mean is 0, 1/2 or 1
    # with probabilities 1/4, 1/2, 1/4. The 95 % interval spans (0, 1); a 60 % interval
    # (20th..80th percentile) still does; a 40 % one (30th..70th) is exactly 1/2.
    y, images = np.array([1.0, 0.0]), np.array(["a", "b"])
    assert cluster_bootstrap_ci(y, images, iterations=4000) == (0.0, 1.0)
    assert cluster_bootstrap_ci(y, images, iterations=4000, level=0.6) == (0.0, 1.0)
    assert cluster_bootstrap_ci(y, images, iterations=4000, level=0.4) == (0.5, 0.5)


def test_bootstrap_covers_true_mean_at_nominal_rate() -> None:
    # Image-level success probabilities ~ Beta(1, 1), true mean 0.5; strong within-image
    # correlation. The clustered interval should cover ~95 %; the naive one clearly less.
    rng = np.random.default_rng(7)
    reps, images, per = 200, 40, 10
    cl = np.repeat(np.arange(images), per)
    hits = hits_iid = 0
    for r in range(reps):
        p = rng.beta(1.0, 1.0, images)
        y = (rng.random((images, per)) < p[:, None]).ravel()
        lo, hi = cluster_bootstrap_ci(y, cl, iterations=500, seed=r)
        hits += lo <= 0.5 <= hi
        lo, hi = cluster_bootstrap_ci(y, np.arange(y.size), iterations=500, seed=r)
        hits_iid += lo <= 0.5 <= hi
    assert 0.90 <= hits / reps <= 0.99
    assert hits_iid / reps < 0.85


def test_bootstrap_seed_order_and_edge_cases() -> None:
    rng = np.random.default_rng(0)
    y = rng.random(500) < 0.6
    images = np.array([f"img{i % 37}" for i in range(500)])
    a = cluster_bootstrap_ci(y, images, iterations=300, seed=11)
    assert a == cluster_bootstrap_ci(y, images, iterations=300, seed=11)
    assert a != cluster_bootstrap_ci(y, images, iterations=300, seed=12)
    perm = rng.permutation(500)  # record order must not matter
    assert a == cluster_bootstrap_ci(y[perm], images[perm], iterations=300, seed=11)
    assert a[0] < y.mean() < a[1]
    # Undefined rather than a falsely exact [p, p]:
    assert all(math.isnan(v) for v in cluster_bootstrap_ci(y, np.zeros(500), iterations=2000, seed=1))
    assert all(math.isnan(v) for v in cluster_bootstrap_ci(y, images, iterations=0))
    with pytest.raises(ValueError, match="500 values but 3 cluster ids"):
        cluster_bootstrap_ci(y, images[:3], iterations=2000)
    with pytest.raises(ValueError, match="level"):
        cluster_bootstrap_ci(y, images, iterations=2000, level=95)


def test_bootstrap_many_clusters_chunked() -> None:
    # More clusters than one chunk of resamples holds: still correct and in range.
    n = 60_000
    y = np.arange(n) % 4 == 0
    lo, hi = cluster_bootstrap_ci(y, np.arange(n), iterations=100, seed=0)
    assert lo < 0.25 < hi and hi - lo < 0.02


def test_paired_delta_sign_convention() -> None:
    images = np.repeat(np.arange(40), 5)
    a = np.ones(200)  # reference always right
    b = (np.arange(200) % 5 != 0).astype(float)  # recon wrong on 1 in 5
    lo, hi = paired_delta_ci(a, b, images, iterations=500)
    # b - a = -0.2 on every image: zero-width, negative.
    assert (lo, hi) == pytest.approx((-0.2, -0.2))
    lo2, hi2 = paired_delta_ci(b, a, images, iterations=500)
    assert (lo2, hi2) == pytest.approx((0.2, 0.2))


# --------------------------------------------------------------------------- summarize


def _hand_example() -> list[QuestionRecord]:
    # 10 questions on 5 images, two types. orig: 6 right, plus one error, one unparseable,
    # one truncated, one plain wrong. recon: regresses on q0/q1 (q1 by an API error),
    # improves on q6.
    return [
        rec("q0", "i0", ("presence",), 0.5, orig=RIGHT, recon=WRONG, blind=WRONG),
        rec("q1", "i0", ("presence",), 0.5, orig=RIGHT, recon=ERROR, blind=RIGHT),
        rec("q2", "i1", ("presence",), 0.5, orig=RIGHT, recon=RIGHT, blind=WRONG),
        rec("q3", "i1", ("presence",), 0.5, orig=RIGHT, recon=RIGHT, blind=WRONG),
        rec("q4", "i2", ("presence",), 0.5, orig=RIGHT, recon=RIGHT, blind=RIGHT),
        rec("q5", "i2", ("presence",), 0.5, orig=RIGHT, recon=RIGHT, blind=WRONG),
        rec("q6", "i3", ("presence",), 0.5, orig=ERROR, recon=RIGHT, blind=WRONG),
        rec("q7", "i3", ("presence",), 0.5, orig=UNPARSEABLE, recon=UNPARSEABLE, blind=WRONG),
        rec("q8", "i4", ("count",), None, orig=TRUNCATED, recon=WRONG, blind=WRONG),
        rec("q9", "i4", ("count",), None, orig=WRONG, recon=WRONG, blind=WRONG),
    ]


def test_errors_truncation_and_unparseable_stay_in_denominator() -> None:
    st = summarize(_hand_example(), iterations=200)
    o = st.overall.accuracy["orig"]
    assert (o.n, o.correct, o.accuracy) == (10, 6, 0.6)
    assert (o.errors, o.unparseable, o.truncated, o.parsed, o.missing) == (1, 2, 1, 7, 0)
    assert o.coverage == pytest.approx(0.7)
    r = st.overall.accuracy["recon"]
    assert (r.n, r.correct, r.errors, r.unparseable) == (10, 5, 1, 1)


def test_paired_delta_regressed_improved_and_mcnemar() -> None:
    st = summarize(_hand_example(), iterations=200)
    assert st.arms == ("orig", "recon", "blind")
    assert st.recon_arms == ("recon",)  # blind is never compared as a reconstruction
    p = st.overall.paired["recon"]
    # q0 (wrong) and q1 (API error) regress; q6 improves (the reference errored there).
    assert (p.regressed, p.improved, p.n_pairs, p.n_errors) == (2, 1, 10, 2)
    assert p.delta == pytest.approx(-10.0)  # recon 50 % - orig 60 %, percentage points
    assert p.mcnemar_p == mcnemar_exact(2, 1) == 1.0
    # Without the two error pairs: orig 5/8 right, recon 4/8 -> -12.5 points.
    assert (p.n_both_ok, p.delta_both_ok) == (8, pytest.approx(-12.5))
    assert p.ci_low <= p.delta <= p.ci_high


def test_delta_matches_accuracy_difference_and_standalone_ci() -> None:
    rng = np.random.default_rng(5)
    records = []
    for i in range(400):
        img = f"img{i // 8}"
        o = RIGHT if rng.random() < 0.7 else WRONG
        r = RIGHT if rng.random() < 0.6 else (ERROR if rng.random() < 0.1 else WRONG)
        records.append(rec(f"q{i}", img, ("t",), orig=o, recon=r))
    st = summarize(records, iterations=400, seed=9)
    p, acc = st.overall.paired["recon"], st.overall.accuracy
    assert p.delta == pytest.approx(100 * (acc["recon"].accuracy - acc["orig"].accuracy))
    a = np.array([x.arms["orig"].correct for x in records], float)
    b = np.array([x.arms["recon"].correct for x in records], float)
    images = np.array([x.image for x in records])
    lo, hi = paired_delta_ci(a, b, images, iterations=400, seed=9)
    assert (p.ci_low, p.ci_high) == pytest.approx((100 * lo, 100 * hi))
    assert (acc["orig"].ci_low, acc["orig"].ci_high) == cluster_bootstrap_ci(
        a, images, iterations=400, seed=9
    )
    assert p.ci_high < 0  # a 10-point drop on 400 questions is clearly negative


def test_multilabel_counts_once_per_type_and_once_overall() -> None:
    records = [
        rec("a", "i0", ("color", "shape"), orig=RIGHT),
        rec("b", "i1", ("color",), orig=WRONG),
        rec("c", "i2", ("shape", "shape"), orig=RIGHT),  # duplicated label counts once
    ]
    st = summarize(records, iterations=0)
    assert st.overall.accuracy["orig"].n == 3 and st.overall.accuracy["orig"].correct == 2
    assert st.by_type["color"].accuracy["orig"].n == 2
    assert st.by_type["color"].accuracy["orig"].correct == 1
    assert st.by_type["shape"].accuracy["orig"].n == 2
    assert st.by_type["shape"].accuracy["orig"].correct == 2
    assert list(st.by_type) == ["color", "shape"]


def test_average_versus_overall_accuracy() -> None:
    # Type A: 8 questions, 6 right (75 %); type B: 2 questions, 0 right (0 %).
    # Overall (question-weighted) = 6/10 = 60 %; average (type mean) = 37.5 %.
    records = [rec(f"a{i}", f"i{i}", ("A",), orig=RIGHT if i < 6 else WRONG) for i in range(8)]
    records += [rec(f"b{i}", f"j{i}", ("B",), orig=WRONG) for i in range(2)]
    st = summarize(records, iterations=0)
    assert st.overall_accuracy["orig"] == pytest.approx(0.6)
    assert st.average_accuracy["orig"] == pytest.approx(0.375)


def test_uniform_random_reference() -> None:
    records = [
        rec("yn", "i0", ("presence",), 0.5, orig=RIGHT),
        rec("mc4", "i1", ("mc",), 0.25, orig=RIGHT),
        rec("mc5", "i2", ("mc",), 0.2, orig=RIGHT),
        rec("free", "i3", ("count",), None, orig=RIGHT),
    ]
    st = summarize(records, iterations=0)
    ch = st.overall.chance
    assert (ch.n_defined, ch.n) == (3, 4)
    assert ch.accuracy == pytest.approx((0.5 + 0.25 + 0.2) / 3)
    assert st.by_type["mc"].chance.accuracy == pytest.approx(0.225)
    assert math.isnan(st.by_type["count"].chance.accuracy)
    assert st.to_dict()["by_type"]["count"]["chance"]["accuracy"] is None


def test_missing_arm_outcomes_are_counted_not_dropped() -> None:
    records = [
        rec("q0", "i0", ("t",), orig=RIGHT, recon=WRONG),
        rec("q1", "i1", ("t",), orig=RIGHT, recon=RIGHT),
        rec("q2", "i2", ("t",), orig=WRONG),  # recon never ran (interrupted run)
    ]
    st = summarize(records, iterations=100)
    assert st.overall.accuracy["recon"].n == 2 and st.overall.accuracy["recon"].missing == 1
    assert st.overall.paired["recon"].n_pairs == 2
    assert st.overall.paired["recon"].delta == pytest.approx(-50.0)


def test_group_intervals_follow_the_standalone_function_and_ignore_order() -> None:
    rng = np.random.default_rng(3)
    records = [
        rec(f"q{i}", f"img{i % 23}", ("x",) if i % 3 else ("y",), orig=RIGHT if flip else WRONG)
        for i, flip in enumerate(rng.random(300) < 0.5)
    ]
    st = summarize(records, iterations=300, seed=4)
    ys = [r for r in records if "y" in r.types]
    y = np.array([r.arms["orig"].correct for r in ys])
    expected = cluster_bootstrap_ci(y, np.array([r.image for r in ys]), iterations=300, seed=4)
    got = st.by_type["y"].accuracy["orig"]
    assert (got.ci_low, got.ci_high) == expected
    shuffled = records[:]
    random.Random(1).shuffle(shuffled)
    assert summarize(shuffled, iterations=300, seed=4).to_dict() == st.to_dict()


def test_to_dict_is_strict_json() -> None:
    st = summarize(_hand_example(), iterations=50)
    text = json.dumps(st.to_dict(), allow_nan=False)
    back = json.loads(text)
    assert back["overall"]["accuracy"]["orig"]["correct"] == 6
    assert back["overall_accuracy"]["orig"] == pytest.approx(0.6)
    # A single-image group has no interval: null, not NaN and not a fake [p, p].
    single = summarize([rec("q", "i", ("t",), orig=RIGHT)], iterations=50)
    assert single.to_dict()["overall"]["accuracy"]["orig"]["ci_low"] is None


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="'q1' appears twice"):
        summarize([rec("q1", "i", ("t",), orig=RIGHT), rec("q1", "j", ("t",), orig=RIGHT)], iterations=2000)
    with pytest.raises(ValueError, match="no question records"):
        summarize([], iterations=2000)
    with pytest.raises(ValueError, match="status 'error' must have correct=False"):
        ArmOutcome("error", correct=True, parsed=True)
    with pytest.raises(ValueError, match="must be 'ok' or 'error'"):
        ArmOutcome("timeout", correct=False, parsed=False)
    with pytest.raises(ValueError, match="question 'k': arm 'orig'"):
        bad: dict = {"orig": True}  # a bare bool where an ArmOutcome belongs
        QuestionRecord(key="k", image="i", types=("t",), arms=bad)
    with pytest.raises(ValueError, match="question 'k': chance=2"):
        QuestionRecord(key="k", image="i", types=("t",), arms={}, chance=2)


# --------------------------------------------------------------------------- views, group_by


def test_summarize_view_means_per_arm_and_type() -> None:
    def q(key: str, img: str, t: str, o: float, r: float | None) -> QuestionRecord:
        views = {"orig": {"acc@0.7": o}}
        if r is not None:
            views["recon"] = {"acc@0.7": r}
        return QuestionRecord(key=key, image=img, types=(t,), arms={"orig": RIGHT}, views=views)

    records = [
        q("a", "i0", "ref", 1.0, 0.0),
        q("b", "i1", "ref", 1.0, 1.0),
        q("c", "i2", "ref", 0.0, None),
        q("d", "i3", "other", 1.0, 1.0),
    ]
    vs = summarize_view(records, "acc@0.7", iterations=200)
    assert vs.overall["orig"].n == 4 and vs.overall["orig"].mean == pytest.approx(0.75)
    assert vs.overall["recon"].n == 3 and vs.overall["recon"].mean == pytest.approx(2 / 3)
    assert vs.by_type["ref"]["orig"].mean == pytest.approx(2 / 3)
    assert vs.overall["orig"].ci_low <= 0.75 <= vs.overall["orig"].ci_high
    json.dumps(vs.to_dict(), allow_nan=False)
    assert summarize_view(records, "binned", iterations=0).overall == {}


def test_group_by_splits_and_drops_none() -> None:
    records = [rec(f"q{i}", f"i{i}", ("ref",), orig=RIGHT) for i in range(5)]
    unique = {"q0": "unique", "q1": "non-unique", "q2": "unique", "q3": None, "q4": "non-unique"}
    parts = group_by(records, lambda r: unique[r.key])
    assert list(parts) == ["non-unique", "unique"]
    assert [r.key for r in parts["unique"]] == ["q0", "q2"]
    assert sum(len(v) for v in parts.values()) == 4
