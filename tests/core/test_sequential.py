"""Confidence sequences (core/sequential.py): coverage at every look by simulation, why a
fixed-n interval is not enough under peeking, bookkeeping and input errors.

The synthetic benchmarks are finite populations of images with per-image heterogeneity:
each image has its own original accuracy (Beta(8, 2), mean 0.8), its own reconstruction
effect (the benchmark's delta plus normal noise of 3 points per image) and 5% of the images
lose 15 more points (badly reconstructed scenes); answers on one image are correlated
(recon keeps the original's answer draw for 80% of the questions). The estimand is the
delta (or accuracy) of the complete run on that population; the randomness is only the
order in which images are asked, as in a run with ``--order random``.

Coverage is checked over 1,000 random orders per benchmark, vectorised (all looks of all
orders at once). The nominal rate of orders whose sequence ever excludes the complete-run
value is 5%; the tests allow 5% plus 1.4 points, two standard errors of a 5% rate over
1,000 orders (simulation noise). Measured (these seeds, the defaults: min_images 50,
n_opt 500): the delta's sequence excludes it in 2.4% of orders (200 images of 50
questions) and 5.4% (2,226 of 100), the accuracy's in 2.3% and 4.6%; the ordinary clustered
interval looked at every 10 images excludes the delta in 18.5% and 38.5% (at one fixed look,
a quarter of the way, in 3.4% and 2.2%). With unequal question counts (10 to 90 per image,
200 images): 2.4% for the delta, 1.8% for the accuracy.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from pytest_satbench.core.sequential import (
    ACCURACY,
    DEFAULT_MIN_IMAGES,
    DELTA,
    Interval,
    SequentialEstimate,
    StoppingRule,
    boundary_factor,
    confidence_sequence,
    fixed_sample_interval,
)

ORDERS = 1000
SLACK = 2 * math.sqrt(0.05 * 0.95 / ORDERS)  # ~0.014: two standard errors at 5%


def benchmark(n_images: int, questions: int, delta: float = -0.05, seed: int = 1):
    """(orig correct, recon correct, questions) per image of a heterogeneous benchmark."""
    rng = np.random.default_rng(seed)
    p_orig = rng.beta(8, 2, n_images)
    damaged = rng.random(n_images) < 0.05
    shift = delta + 0.05 * 0.15 - np.where(damaged, 0.15, 0.0) + rng.normal(0, 0.03, n_images)
    p_recon = np.clip(p_orig + shift, 0, 1)
    u = rng.random((n_images, questions))
    orig = u < p_orig[:, None]
    u_recon = np.where(rng.random((n_images, questions)) < 0.8, u, rng.random((n_images, questions)))
    recon = u_recon < p_recon[:, None]
    return orig.sum(1), recon.sum(1), np.full(n_images, questions)


def random_orders(n_images: int, orders: int = ORDERS, seed: int = 2) -> np.ndarray:
    return np.argsort(np.random.default_rng(seed).random((orders, n_images)), axis=1)


def excluded(lo: np.ndarray, hi: np.ndarray, value: float) -> np.ndarray:
    eps = 1e-9 * max(1.0, abs(value))  # the last look is the value itself, up to rounding
    return (lo > value + eps) | (hi < value - eps)


def ordinary_interval(y: np.ndarray, m: np.ndarray):
    """The fixed-n clustered interval at every look, in points (`fixed_sample_interval`)."""
    return fixed_sample_interval(y, m)


@pytest.mark.parametrize("n_images, questions", [(200, 50), (2226, 100)])
def test_coverage_at_every_look_and_peeking_at_the_fixed_interval(n_images, questions):
    orig, recon, q = benchmark(n_images, questions)
    delta = 100 * (recon - orig).sum() / q.sum()
    accuracy = 100 * orig.sum() / q.sum()
    perms = random_orders(n_images)
    d, m = (recon - orig)[perms].astype(float), q[perms].astype(float)

    est, lo, hi = confidence_sequence(d, m, n_images)
    cs_miss = excluded(lo, hi, delta).any(1).mean()
    assert cs_miss <= 0.05 + SLACK, cs_miss
    assert est[:, -1] == pytest.approx(delta) and np.allclose(lo[:, -1], delta) and np.allclose(hi[:, -1], delta)

    _, alo, ahi = confidence_sequence(orig[perms], m, n_images, kind=ACCURACY)
    acc_miss = excluded(alo, ahi, accuracy).any(1).mean()
    assert acc_miss <= 0.05 + SLACK, acc_miss

    # the ordinary interval, looked at every 10 images: far more orders exclude the value
    olo, ohi = ordinary_interval(d, m)
    looks = np.arange(9, n_images - 1, 10)  # not the last image, where the value is known
    peek_miss = excluded(olo[:, looks], ohi[:, looks], delta).any(1).mean()
    assert peek_miss >= 0.15 and peek_miss >= 3 * cs_miss, (peek_miss, cs_miss)
    # ... while at one fixed look it is a fine 95% interval
    one_look = excluded(olo[:, n_images // 4], ohi[:, n_images // 4], delta).mean()
    assert one_look <= 0.05 + SLACK


def test_coverage_with_unequal_question_counts():
    # RSVQA's images have different numbers of questions: the ratio of sums, 10 to 90 each
    rng = np.random.default_rng(11)
    n = 200
    m = rng.integers(10, 91, n)
    p_orig = rng.beta(8, 2, n)
    damaged = rng.random(n) < 0.05
    p_recon = np.clip(p_orig - 0.05 + 0.0075 - np.where(damaged, 0.15, 0) + rng.normal(0, 0.03, n), 0, 1)
    live = np.arange(90)[None, :] < m[:, None]  # question j of image i exists
    u = rng.random((n, 90))
    u_recon = np.where(rng.random((n, 90)) < 0.8, u, rng.random((n, 90)))
    orig = ((u < p_orig[:, None]) & live).sum(1)
    recon = ((u_recon < p_recon[:, None]) & live).sum(1)
    perms = random_orders(n, seed=12)
    for kind, y in ((DELTA, recon - orig), (ACCURACY, orig)):
        value = 100 * y.sum() / m.sum()
        _, lo, hi = confidence_sequence(y[perms], m[perms], n, kind=kind)
        miss = excluded(lo, hi, value).any(1).mean()
        assert miss <= 0.05 + SLACK, (kind, miss)
        assert np.allclose(lo[:, -1], value) and np.allclose(hi[:, -1], value)


def test_the_sequence_narrows_and_is_the_complete_run_value_at_the_end():
    orig, recon, q = benchmark(200, 50)
    delta = 100 * (recon - orig).sum() / q.sum()
    perm = random_orders(200, orders=1)[0]
    seq = SequentialEstimate(200)
    widths = []
    for i in perm:
        iv = seq.add(int(recon[i] - orig[i]), int(q[i]))
        widths.append(iv.width)
    assert seq.complete
    assert iv.estimate == pytest.approx(delta) and iv.lo == iv.estimate == iv.hi
    assert widths[: DEFAULT_MIN_IMAGES - 1] == [200.0] * (DEFAULT_MIN_IMAGES - 1)
    assert widths[DEFAULT_MIN_IMAGES - 1] < 20
    assert widths[-2] < widths[DEFAULT_MIN_IMAGES - 1] / 3  # the finite-population factor


def test_incremental_and_vectorised_agree():
    orig, recon, q = benchmark(200, 50, seed=3)
    perm = random_orders(200, orders=1, seed=4)[0]
    for kind, y in ((DELTA, recon - orig), (ACCURACY, recon)):
        seq = SequentialEstimate(200, kind=kind, min_images=10)
        got = np.array([tuple(seq.add(int(y[i]), int(q[i]), image=f"img{i}")) for i in perm])
        est, lo, hi = confidence_sequence(y[perm], q[perm], 200, kind=kind, min_images=10)
        np.testing.assert_allclose(got, np.stack([est, lo, hi], 1), rtol=0, atol=1e-9)


def test_the_with_replacement_clock_is_wider_and_both_agree_with_the_incremental_form():
    orig, recon, q = benchmark(200, 50, seed=3)
    perm = random_orders(200, orders=1, seed=4)[0]
    y = recon - orig
    _, lo, hi = confidence_sequence(y[perm], q[perm], 200)
    _, wlo, whi = confidence_sequence(y[perm], q[perm], 200, finite_population=False)
    assert np.all(whi - wlo >= hi - lo - 1e-12) and whi[-1] == wlo[-1]  # exact at the end too
    assert (whi - wlo)[150] > 1.5 * (hi - lo)[150]
    seq = SequentialEstimate(200, finite_population=False)
    got = np.array([tuple(seq.add(int(y[i]), int(q[i])))[1:] for i in perm])
    np.testing.assert_allclose(got, np.stack([wlo, whi], 1), rtol=0, atol=1e-9)


def test_unequal_question_counts_use_the_ratio_of_sums():
    seq = SequentialEstimate(4, kind=ACCURACY, min_images=2)
    seq.add(1, 1)
    iv = seq.add(9, 10)
    assert iv.estimate == pytest.approx(100 * 10 / 11)
    assert (iv.images, iv.questions) == (2, 11)
    seq.add(0, 3)
    iv = seq.add(4, 4)
    assert iv.estimate == pytest.approx(100 * 14 / 18) and iv.lo == iv.hi == iv.estimate


def test_boundary_factor():
    # monotone in the effective sample size, about sqrt(2 log(1/alpha) ...)/sqrt(n) scale
    g = [boundary_factor(n) for n in (10, 100, 1000, 1e4, 1e6)]
    assert all(a > b for a, b in zip(g, g[1:]))
    assert 1.96 / math.sqrt(500) < boundary_factor(500) < 3.5 / math.sqrt(500)
    assert boundary_factor(0) == math.inf and boundary_factor(math.inf) == 0.0


def test_bookkeeping_is_monotone_and_without_replacement():
    seq = SequentialEstimate(3, kind=DELTA, min_images=2)
    empty = seq.interval()
    assert isinstance(empty, Interval) and math.isnan(empty.estimate)
    assert (empty.lo, empty.hi, empty.images, empty.questions) == (-100.0, 100.0, 0, 0)
    seen = []
    for i, (y, m) in enumerate([(-1, 5), (0, 5), (2, 4)]):
        iv = seq.add(y, m, image=f"a{i}")
        seen.append((iv.images, iv.questions))
        assert -100 <= iv.lo <= iv.estimate <= iv.hi <= 100
    assert seen == [(1, 5), (2, 10), (3, 14)]
    with pytest.raises(ValueError, match="already added"):
        seq.add(0, 1)
    seq2 = SequentialEstimate(5)
    seq2.add(0, 2, image="x")
    with pytest.raises(ValueError, match="'x' was already added"):
        seq2.add(0, 2, image="x")
    assert seq2.images == 1  # a refused image leaves no trace


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"n_images_total": 0}, "n_images_total"),
        ({"n_images_total": 2.5}, "n_images_total"),
        ({"n_images_total": 10, "alpha": 0}, "alpha"),
        ({"n_images_total": 10, "alpha": 1.5}, "alpha"),
        ({"n_images_total": 10, "kind": "mean"}, "kind"),
        ({"n_images_total": 10, "min_images": 1}, "min_images"),
        ({"n_images_total": 10, "n_opt": 0}, "n_opt"),
    ],
)
def test_invalid_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SequentialEstimate(**kwargs)


@pytest.mark.parametrize(
    "kind, total, questions, match",
    [
        (ACCURACY, -1, 5, "outside"),
        (ACCURACY, 6, 5, "outside"),
        (DELTA, -6, 5, "outside"),
        (DELTA, 1, 0, "questions"),
        (DELTA, 1, 2.0, "questions"),
        (DELTA, True, 2, "number"),
        (DELTA, math.nan, 2, "number"),
    ],
)
def test_invalid_images(kind, total, questions, match):
    seq = SequentialEstimate(10, kind=kind)
    with pytest.raises(ValueError, match=match):
        seq.add(total, questions)
    assert seq.images == 0


def test_invalid_arrays():
    with pytest.raises(ValueError, match="same shape"):
        confidence_sequence([1, 2], [3], 5)
    with pytest.raises(ValueError, match="benchmark has 1"):
        confidence_sequence([1, 2], [3, 3], 1)
    with pytest.raises(ValueError, match="outside"):
        confidence_sequence([4, 2], [3, 3], 5)
    with pytest.raises(ValueError, match="whole number"):
        confidence_sequence([1, 2], [0, 3], 5)


def feed(rule: StoppingRule, orig, recon, q, perm, arm: str = "jpeg"):
    for i in perm:
        correct = {"orig": int(orig[i])}
        if arm:
            correct[arm] = int(recon[i])
        rule.add(int(q[i]), correct, image=str(i))
        if rule.check():
            return


def test_precision_rule_stops_early_with_a_reason_and_covers():
    orig, recon, q = benchmark(200, 50)
    delta = 100 * (recon - orig).sum() / q.sum()
    rule = StoppingRule(200, ["jpeg"], precision=4.0, questions_total=int(q.sum()))
    perm = random_orders(200, orders=1)[0]
    feed(rule, orig, recon, q, perm[:5])
    assert "(sequence from 50 images)" in rule.progress()
    need = rule.images_needed()
    assert need is not None and 5 <= need <= 200
    feed(rule, orig, recon, q, perm[5:])
    assert rule.stopped and DEFAULT_MIN_IMAGES <= rule.images < 200
    assert rule.reason == f"precision 4.0 reached after {rule.images} of 200 images"
    out = rule.to_dict()
    lo, hi = out["arms"]["jpeg"]["cs"]
    assert hi - lo <= 4.0 and lo <= delta <= hi
    assert out["stopped"] and out["rule"] == "precision 4.0"
    assert (out["images_answered"], out["images_total"]) == (rule.images, 200)
    assert (out["questions_answered"], out["questions_total"]) == (50 * rule.images, 10_000)
    assert rule.images_needed() == rule.images
    assert rule.reason in rule.progress()
    # an image still in flight may arrive after the stop: counted, the reason stays
    i = perm[rule.images]
    rule.add(50, {"orig": int(orig[i]), "jpeg": int(recon[i])})
    assert rule.images == rule.stopped_at + 1 and rule.reason.endswith(f"{rule.stopped_at} of 200 images")


def test_margin_rule_decides_within():
    orig, recon, q = benchmark(2226, 100, delta=-0.01, seed=5)
    rule = StoppingRule(2226, ["jpeg"], margin=2.0, precision=0.1)
    feed(rule, orig, recon, q, random_orders(2226, orders=1)[0])
    assert rule.stopped and rule.reason.startswith("margin 2.0 decided after ")
    assert rule.decisions() == {"jpeg": "within"}
    assert rule.to_dict()["arms"]["jpeg"]["margin"] == "within"
    assert rule.to_dict()["arms"]["jpeg"]["cs"][0] > -2.0
    assert rule.describe() == "precision 0.1 or margin 2.0"


def test_no_reconstruction_arm_watches_the_original_accuracy():
    orig, recon, q = benchmark(200, 50)
    rule = StoppingRule(200, precision=10.0)
    feed(rule, orig, recon, q, random_orders(200, orders=1)[0], arm="")
    assert rule.stopped and rule.delta == {}
    out = rule.to_dict()
    assert set(out["arms"]) == {"orig"} and "accuracy" in out["arms"]["orig"]
    lo, hi = out["arms"]["orig"]["cs"]
    assert hi - lo <= 10.0


def test_complete_run_is_not_a_stop():
    rule = StoppingRule(3, ["r"], precision=1e-9, min_images=2)
    for i in range(3):
        rule.add(2, {"orig": 1, "r": i % 2}, image=str(i))
        assert not rule.check()
    assert not rule.stopped and rule.reason is None
    assert rule.to_dict()["arms"]["r"]["cs"][0] == rule.to_dict()["arms"]["r"]["cs"][1]


def test_invalid_rules():
    with pytest.raises(ValueError, match="precision or margin"):
        StoppingRule(10, ["r"])
    with pytest.raises(ValueError, match="margin needs"):
        StoppingRule(10, margin=2.0)
    with pytest.raises(ValueError, match="precision must be"):
        StoppingRule(10, ["r"], precision=-1)
    with pytest.raises(ValueError, match="distinct"):
        StoppingRule(10, ["orig"], precision=1)
    rule = StoppingRule(10, ["r"], precision=1.0)
    with pytest.raises(ValueError, match="no correct count for arm"):
        rule.add(5, {"orig": 3})
    with pytest.raises(ValueError, match="not in"):
        rule.add(5, {"orig": 3, "r": 6})
    assert rule.images == 0


def test_import_is_light():
    code = "import sys, pytest_satbench.core.sequential; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_images_enter_in_the_random_order_not_the_order_they_complete():
    orig, recon, q = benchmark(200, 50, seed=6)
    perm = random_orders(200, orders=1, seed=7)[0]
    in_order = StoppingRule(200, ["jpeg"], precision=0.5)
    for i in perm:
        in_order.add(50, {"orig": int(orig[i]), "jpeg": int(recon[i])}, image=str(i))
    # the same images completing out of order (here: in blocks of 8, reversed in each block)
    rule = StoppingRule(200, ["jpeg"], precision=0.5)
    completion = np.concatenate([np.arange(k, min(k + 8, 200))[::-1] for k in range(0, 200, 8)])
    entered = 0
    for pos in completion:
        i = perm[pos]
        entered += rule.add(50, {"orig": int(orig[i]), "jpeg": int(recon[i])}, image=str(i), position=int(pos))
        # a block enters when its first position (completing last) arrives
        assert rule.images == entered == (pos // 8 + (pos % 8 == 0)) * 8
    assert rule.images == 200 and rule.pending == 0
    assert rule.to_dict()["arms"] == in_order.to_dict()["arms"]
    with pytest.raises(ValueError, match="position 3 was already added"):
        rule.add(1, {"orig": 0, "jpeg": 0}, position=3)


def test_positions_are_checked():
    rule = StoppingRule(5, ["r"], precision=1.0)
    assert rule.add(2, {"orig": 1, "r": 1}, image="b", position=1) == 0
    assert rule.images == 0 and rule.pending == 1
    with pytest.raises(ValueError, match="position 1 was already added"):
        rule.add(2, {"orig": 1, "r": 1}, position=1)
    with pytest.raises(ValueError, match="'b' was already added"):
        rule.add(2, {"orig": 1, "r": 1}, image="b", position=2)
    with pytest.raises(ValueError, match=r"position must be an int in \[0, 5\)"):
        rule.add(2, {"orig": 1, "r": 1}, position=5)
    with pytest.raises(ValueError, match="with a position, or none"):
        rule.add(2, {"orig": 1, "r": 1})
    assert rule.add(2, {"orig": 2, "r": 0}, image="a", position=0) == 2
    assert (rule.images, rule.questions, rule.pending) == (2, 4, 0)
