"""core/distortion_flips.py: PSNR bins by image, regression and improvement rates per bin with
their clustered intervals, and the logistic slope with its cluster-robust interval (checked
against statsmodels and a case worked by hand)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_satbench.core.distortion_flips import ALL_TYPES, logistic_fit, psnr_bins, records_table


def test_bins_by_rank_keep_ties_together_and_put_infinite_psnr_last() -> None:
    assert psnr_bins(np.array([10.0, 20, 30, 40, 50, 60, 70, 80, 90, 100])).tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    # three images at 20 dB: all in the bin of the first of them (rank 1 of 10: bin 0)
    got = psnr_bins(np.array([10.0, 20, 20, 20, 50, 60, 70, 80, math.inf, math.inf]))
    assert got.tolist() == [0, 0, 0, 0, 2, 2, 3, 3, 4, 4]
    assert psnr_bins(np.array([5.0, 5, 5, 5])).tolist() == [0, 0, 0, 0]  # one PSNR: one bin
    # identical reconstructions are the least distorted, however many there are
    assert psnr_bins(np.array([math.inf, math.inf, math.inf, 30.0])).tolist() == [4, 4, 4, 0]
    assert psnr_bins(np.array([])).tolist() == []


def _records(regress_on: set[int], n_images: int = 10) -> list[tuple]:
    """Two questions per image (presence, count) and one with both types; the original right on
    all but the first question of image 9; the arm wrong on the images in `regress_on`."""
    out = []
    for i in range(n_images):
        pair = (f"o{i}", f"r{i}")
        for k, types in enumerate((("presence",), ("count",), ("presence", "count"))):
            orig = not (i == 9 and k == 0)
            arm = i not in regress_on
            out.append(("jpeg", f"img{i}", types, orig, arm, pair))
    return out


def test_rates_per_bin_count_every_question_once_per_type() -> None:
    psnr = {(f"o{i}", f"r{i}"): 20.0 + 2 * i for i in range(10)}
    del psnr[("o4", "r4")]  # no distortion stored for image 4: counted, in no bin
    table = records_table(_records(regress_on={0, 1}))
    flips = table.analyse(psnr, iterations=300, seed=1)
    arm = flips.by_arm["jpeg"]
    assert (arm.questions, arm.without_distortion, arm.images, arm.infinite) == (30, 3, 9, 0)
    every = arm.by_type[ALL_TYPES]
    assert [b.images for b in every.bins] == [2, 2, 2, 2, 1]  # 9 images ranked: floor(5 r / 9)
    assert [b.questions for b in every.bins] == [6, 6, 6, 6, 3]
    assert [(b.regressed.events, b.regressed.n) for b in every.bins] == [(6, 6), (0, 6), (0, 6), (0, 6), (0, 2)]
    assert [(b.improved.events, b.improved.n) for b in every.bins] == [(0, 0), (0, 0), (0, 0), (0, 0), (1, 1)]
    assert every.bins[0].regressed.value == 1.0 and math.isnan(every.bins[0].improved.value)
    assert (every.bins[0].psnr_low, every.bins[0].psnr_high) == (20.0, 22.0)
    # a question of two types is in each type's table
    presence = arm.by_type["presence"]
    assert [b.questions for b in presence.bins] == [4, 4, 4, 4, 2]
    assert [b.regressed.events for b in presence.bins] == [4, 0, 0, 0, 0]
    # everything regressed in bin 1 and nothing elsewhere: the intervals are the points
    assert (every.bins[0].regressed.ci_low, every.bins[0].regressed.ci_high) == (1.0, 1.0)
    assert (every.bins[1].regressed.ci_low, every.bins[1].regressed.ci_high) == (0.0, 0.0)
    # the slope: every regression below every kept answer's PSNR, so no finite slope
    assert every.slope.slope is None and every.slope.sign == -1 and "separates" in (every.slope.reason or "")
    d = flips.to_dict()["by_arm"]["jpeg"]["by_type"][ALL_TYPES]
    assert d["bins"][0]["regression"] == {"events": 6, "n": 6, "rate": 1.0, "ci_low": 1.0, "ci_high": 1.0}
    assert d["slope"]["separated_sign"] == -1


def test_a_bins_interval_is_the_clustered_bootstrap_of_its_rate() -> None:
    """Within a bin, half the images lose every right answer: the rate is 1/2 and its interval,
    resampling images, spans the values a resample can take."""
    records = []
    psnr = {}
    for i in range(40):
        psnr[(f"o{i}", f"r{i}")] = 30.0  # one bin for all (ties share a bin)
        for _ in range(3):
            records.append(("a", f"img{i}", ("t",), True, i % 2 == 0, (f"o{i}", f"r{i}")))
    flips = records_table(records).analyse(psnr, iterations=2000, seed=0)
    b = flips.by_arm["a"].by_type["t"].bins[0]
    assert (b.regressed.events, b.regressed.n, b.images) == (60, 120, 40)
    # binomial over 40 images: sd = sqrt(.25/40) = 0.079; the 95% interval is about +-0.155
    assert 0.30 < b.regressed.ci_low < 0.40 and 0.60 < b.regressed.ci_high < 0.70


def test_logistic_fit_matches_statsmodels_cluster_robust_glm() -> None:
    import statsmodels.api as sm  # the test extra's (pyproject.toml): the reference implementation
    rng = np.random.default_rng(3)
    groups = np.repeat(np.arange(60), 5)
    x = rng.uniform(20, 40, 60)[groups]
    effect = rng.normal(0, 0.7, 60)[groups]
    y = (rng.uniform(size=x.size) < 1 / (1 + np.exp(-(3 - 0.15 * x + effect)))).astype(float)
    fit = logistic_fit(x, y, groups)
    assert fit is not None
    ref = sm.GLM(y, sm.add_constant(x), family=sm.families.Binomial()).fit(
        cov_type="cluster", cov_kwds={"groups": groups})
    assert fit.intercept == pytest.approx(ref.params[0], rel=1e-8)
    assert fit.slope == pytest.approx(ref.params[1], rel=1e-8)
    assert fit.se == pytest.approx(ref.bse[1], rel=1e-8)
    assert (fit.ci_low, fit.ci_high) == pytest.approx(tuple(ref.conf_int()[1]), rel=1e-8)
    assert fit.ci_high < 0  # the true slope is negative, and so is the whole interval here


def test_logistic_fit_on_a_case_worked_by_hand() -> None:
    """Two PSNR values: the fit is saturated, so each value's fitted probability is its observed
    share and the slope is the difference of the two log-odds over the difference in x:
    3 of 4 regress at 20 dB, 1 of 4 at 30 dB -> (logit(1/4) - logit(3/4)) / 10 = -ln(9) / 10.
    One image per question, so the cluster-robust variance is White's with the CR1 factor."""
    x = np.array([20.0] * 4 + [30.0] * 4)
    y = np.array([1, 1, 1, 0, 1, 0, 0, 0], dtype=float)
    fit = logistic_fit(x, y, np.arange(8))
    assert fit is not None
    assert fit.slope == pytest.approx(-math.log(9) / 10, rel=1e-10)
    # By hand: p = 3/4 at 20 and 1/4 at 30, so p(1-p) = 3/16 for all 8 and (y-p)^2 is 1/16 for the
    # six questions on the majority side and 9/16 for the two others. In the design (1, x - 25):
    # B = [[8*3/16, 0], [0, 8*25*3/16]] = [[3/2, 0], [0, 75/2]]; the cluster scores' outer products
    # sum to M = [[6/16 + 18/16, m01], [m01, 25 * (6/16 + 18/16)]] = [[3/2, m01], [m01, 75/2]] with
    # m01 = -5*(3*1/16 + 9/16) + 5*(3*1/16 + 9/16) = 0; so the slope's variance is
    # c * (75/2) / (75/2)^2 = c / 37.5, with c = G/(G-1) * (N-1)/(N-K) = 8/7 * 7/6 = 4/3.
    assert fit.se == pytest.approx(math.sqrt((4 / 3) / 37.5), rel=1e-10)
    assert fit.ci_low == pytest.approx(fit.slope - 1.959963984540054 * fit.se, rel=1e-10)


def test_no_slope_says_why() -> None:
    psnr = {(f"o{i}", f"r{i}"): 20.0 + i for i in range(10)}
    nothing = records_table(_records(regress_on=set())).analyse(psnr, iterations=0)
    assert nothing.by_arm["jpeg"].by_type[ALL_TYPES].slope.reason == "no question regressed"
    everything = records_table(_records(regress_on=set(range(10)))).analyse(psnr, iterations=0)
    assert everything.by_arm["jpeg"].by_type[ALL_TYPES].slope.reason == "every question regressed"
    # identical reconstructions: binned last, left out of the slope
    psnr_inf = {**psnr, ("o9", "r9"): math.inf, ("o8", "r8"): math.inf}
    mixed = records_table(_records(regress_on={0, 5})).analyse(psnr_inf, iterations=0)
    arm = mixed.by_arm["jpeg"]
    assert arm.infinite == 2 and arm.by_type[ALL_TYPES].bins[4].psnr_high == math.inf
    slope = arm.by_type[ALL_TYPES].slope
    assert slope.images == 8 and slope.regressed == 6 and slope.slope is not None
    assert slope.ci_low is not None and slope.ci_high is not None and slope.ci_low < slope.slope < slope.ci_high


def test_per_image_counts() -> None:
    table = records_table(_records(regress_on={2}))
    rows = {(img, arm): (counts, pair) for img, arm, counts, pair in table.per_image()}
    assert rows["img2", "jpeg"] == ((3, 3, 0, 3, 0), ("o2", "r2"))
    assert rows["img9", "jpeg"] == ((3, 2, 3, 0, 1), ("o9", "r9"))
    assert len(rows) == 10


def test_figures_do_not_depend_on_the_order_questions_are_read_in() -> None:
    # a merged store's shards and a resumed run read the same questions in another order: the
    # rates, their bootstrap intervals and the slope must be the same figures
    rng = np.random.default_rng(5)
    records = []
    for i in range(40):
        pair = (f"o{i}", f"r{i}")
        for k in range(3):
            records.append(("jpeg", f"img{i:02d}", (("presence", "count")[k % 2],),
                            bool(rng.random() < 0.8), bool(rng.random() < 0.3 + i / 60), pair))
    psnr = {(f"o{i}", f"r{i}"): 18.0 + 0.5 * i for i in range(40)}
    shuffled = [records[j] for j in rng.permutation(len(records))]
    a = records_table(records).analyse(psnr, iterations=200, seed=3).to_dict()
    b = records_table(shuffled).analyse(psnr, iterations=200, seed=3).to_dict()
    assert a == b
    # the intervals are not all degenerate: the test would see a draw that depended on order
    every = records_table(records).analyse(psnr, iterations=200, seed=3).by_arm["jpeg"].by_type[ALL_TYPES]
    assert any(0 < b.regressed.ci_low < b.regressed.ci_high < 1 for b in every.bins)
