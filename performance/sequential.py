"""Early stopping: how much of an RSVQA-HR-sized benchmark a run asks before the rule is met.

    .venv/bin/python performance/sequential.py                       # 200 seeds, about 20 s
    .venv/bin/python performance/sequential.py --seeds 500 --json performance/out/sequential.json

A synthetic benchmark of 2,226 images x 100 questions (RSVQA-HR's size), with per-image
heterogeneity: each image has its own original accuracy (Beta(8, 2)), its own
reconstruction effect (normal, 3 points per image) and 5% of the images lose 15 points
more; answers on one image are correlated (the reconstruction keeps the original's answer
draw for 80% of the questions). Recon answers are then flipped at random until the
complete run's paired delta is exactly the target (-5 points; -1 for the margin case).
Each seed is a new benchmark and a new random order of its images.

For each seed, the sequence of `core.sequential` is computed at every image (vectorised
`confidence_sequence`, the same numbers as the plugin's `SequentialEstimate`) and the run
"stops" at the first look where the rule is met:

- ``--precision`` (2 points): the delta's sequence is at most 2 points wide;
- ``--margin`` (2 points) on a benchmark whose delta is ``--margin-delta`` (-1): the
  sequence lies entirely above -2 or entirely below -2.

Table: the fraction of the questions asked at the stop (median and 90th percentile over
seeds), the fraction of seeds whose sequence ever excludes the complete-run delta (at any
look), and, for the margin, how often the decision was "within". Beside the default, for
the choice of method: the same Gaussian-mixture sequence on the with-replacement clock
(``n = t``, no finite-population correction), the predictable plug-in empirical-Bernstein
sequence (Waudby-Smith and Ramdas, JRSS-B 2023; exact, the image's delta bounded by its
question count), and the ordinary clustered fixed-n interval looked at every 10 images
(what watching the numbers does; not valid). Last, the cost of one `SequentialEstimate.add`.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _measure import write_result  # noqa: E402  (performance/ is on sys.path when run as a script)

from pytest_satbench.core.sequential import (  # noqa: E402 (after the sys.path setup above)
    DEFAULT_MIN_IMAGES,
    DEFAULT_N_OPT,
    SequentialEstimate,
    confidence_sequence,
    fixed_sample_interval,
)


def benchmark(rng: np.random.Generator, n_images: int, questions: int, delta_points: float):
    """(orig correct, recon correct) per image; the complete-run delta is exactly the target
    (to the nearest question)."""
    p_orig = rng.beta(8, 2, n_images)
    damaged = rng.random(n_images) < 0.05
    shift = delta_points / 100 + 0.05 * 0.15 - np.where(damaged, 0.15, 0.0) + rng.normal(0, 0.03, n_images)
    p_recon = np.clip(p_orig + shift, 0, 1)
    u = rng.random((n_images, questions))
    orig = u < p_orig[:, None]
    u_recon = np.where(rng.random((n_images, questions)) < 0.8, u, rng.random((n_images, questions)))
    recon = (u_recon < p_recon[:, None]).ravel()
    target = round(delta_points / 100 * n_images * questions)
    excess = int(recon.sum() - orig.sum()) - target
    # flip recon answers at random (right -> wrong when the delta is too high, else the reverse)
    pool = np.flatnonzero(recon if excess > 0 else ~recon)
    recon[rng.choice(pool, size=abs(excess), replace=False)] = excess < 0
    recon = recon.reshape(n_images, questions)
    return orig.sum(1), recon.sum(1)


def empirical_bernstein(d: np.ndarray, m: np.ndarray, alpha: float):
    """Predictable plug-in empirical-Bernstein confidence sequence for the mean of
    x = (d/m + 1)/2 in [0, 1] (the image's delta per question, bounded by +-1): exact,
    nonasymptotic. With equal question counts the mean is the ratio of sums."""
    x = (d / m + 1) / 2
    n = x.shape[-1]
    t = np.arange(1, n + 1)
    mu = (0.5 + np.concatenate([np.zeros(x.shape[:-1] + (1,)), x.cumsum(-1)[..., :-1]], -1)) / t
    sq = (x - mu) ** 2  # predictable centring
    var = (0.25 + np.concatenate([np.zeros(x.shape[:-1] + (1,)), sq.cumsum(-1)[..., :-1]], -1)) / t
    lam = np.minimum(np.sqrt(2 * math.log(2 / alpha) / (var * t * np.log1p(t))), 0.5)
    psi = (-np.log1p(-lam) - lam) / 4
    lam_sum = lam.cumsum(-1)
    centre = (lam * x).cumsum(-1) / lam_sum
    half = (math.log(2 / alpha) + (4 * sq * psi).cumsum(-1)) / lam_sum
    lo, hi = np.maximum(centre - half, 0), np.minimum(centre + half, 1)
    return 100 * (2 * lo - 1), 100 * (2 * hi - 1)


def ordinary_interval(d: np.ndarray, m: np.ndarray):
    """The fixed-n clustered interval (`fixed_sample_interval`), looked at every 10 images."""
    lo, hi = fixed_sample_interval(d, m)
    looked = np.zeros(d.shape[-1], bool)
    looked[9::10] = True  # looked at every 10 images
    return np.where(looked, lo, -100), np.where(looked, hi, 100)


def first(mask: np.ndarray) -> np.ndarray:
    """Index of the first True per row (the last look when none: the run completes)."""
    return np.where(mask.any(-1), mask.argmax(-1), mask.shape[-1] - 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--images", type=int, default=2226)
    ap.add_argument("--questions", type=int, default=100, help="questions per image")
    ap.add_argument("--delta", type=float, default=-5.0, help="complete-run delta, points (precision case)")
    ap.add_argument("--precision", type=float, default=2.0, help="width to reach, points")
    ap.add_argument("--margin", type=float, default=2.0, help="margin, points")
    ap.add_argument("--margin-delta", type=float, default=-1.0, help="complete-run delta, points (margin case)")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--n-opt", type=float, default=DEFAULT_N_OPT,
                    help="effective images where the sequence is tightest (default: the plugin's)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    args = ap.parse_args()
    n, q, alpha = args.images, args.questions, args.alpha
    started = time.perf_counter()

    cases = {"precision": args.delta, "margin": args.margin_delta}
    data = {}
    for case, delta in cases.items():
        d = np.empty((args.seeds, n))
        for s in range(args.seeds):
            rng = np.random.default_rng([s, 0 if case == "precision" else 1])
            orig, recon = benchmark(rng, n, q, delta)
            d[s] = (recon - orig)[rng.permutation(n)]
        data[case] = (d, np.full_like(d, q), 100 * d.sum(1) / (n * q))

    methods = {
        "asymptotic CS, finite-population clock (default)":
            lambda d, m: confidence_sequence(d, m, n, alpha=alpha, n_opt=args.n_opt)[1:],
        "asymptotic CS, with-replacement clock":
            lambda d, m: confidence_sequence(d, m, n, alpha=alpha, n_opt=args.n_opt, finite_population=False)[1:],
        "empirical Bernstein (exact, bounded)":
            lambda d, m: empirical_bernstein(d, m, alpha),
        "ordinary interval every 10 images (not valid)":
            lambda d, m: ordinary_interval(d, m),
    }
    rows = []
    for name, method in methods.items():
        row: dict = {"method": name}
        for case, (d, m, truth) in data.items():
            t0 = time.perf_counter()
            lo, hi = method(d, m)
            elapsed = time.perf_counter() - t0
            miss = ((lo > truth[:, None] + 1e-9) | (hi < truth[:, None] - 1e-9)).any(1)
            if case == "precision":
                met = (hi - lo) <= args.precision
            else:
                met = (lo > -args.margin) | (hi < -args.margin)
            stop = first(met)
            frac = m.cumsum(1)[np.arange(len(stop)), stop] / m.sum(1)
            stopped = met.any(1)
            row[case] = {
                "median_fraction": float(np.median(frac)),
                "p90_fraction": float(np.quantile(frac, 0.9)),
                "stopped_early": float((stopped & (stop < n - 1)).mean()),
                "ever_excludes": float(miss.mean()),
                "seconds": elapsed,
            }
            if case == "margin":
                early = stopped & (stop < n - 1)
                within = lo[np.arange(len(stop)), stop] > -args.margin
                row[case]["within"] = float(within[early].mean()) if early.any() else math.nan
        rows.append(row)

    # the plugin's path: one image at a time
    d, m, _ = data["precision"]
    seq = SequentialEstimate(n)
    t0 = time.perf_counter()
    for y in d[0]:
        seq.add(int(y), q)
    per_image_us = (time.perf_counter() - t0) / n * 1e6

    print(f"{n} images x {q} questions, {args.seeds} seeds (a new benchmark and order each), "
          f"alpha {alpha}, min_images {DEFAULT_MIN_IMAGES}, n_opt {args.n_opt:g}")
    print(f"complete-run delta {args.delta:+g} (precision {args.precision:g}) and "
          f"{args.margin_delta:+g} (margin {args.margin:g}); fraction of questions asked at the stop\n")
    head = (f"{'method':50} {'prec median':>11} {'p90':>6} {'excl.':>6}   "
            f"{'margin median':>13} {'p90':>6} {'excl.':>6} {'within':>6}")
    print(head)
    print("-" * len(head))
    for r in rows:
        p, g = r["precision"], r["margin"]
        print(f"{r['method']:50} {p['median_fraction']:>11.3f} {p['p90_fraction']:>6.3f} "
              f"{p['ever_excludes']:>6.3f}   {g['median_fraction']:>13.3f} {g['p90_fraction']:>6.3f} "
              f"{g['ever_excludes']:>6.3f} {g['within']:>6.3f}")
    print("\nexcl.: fraction of seeds whose interval excludes the complete-run delta at some look")
    print(f"SequentialEstimate.add + interval: {per_image_us:.1f} us per image; "
          f"total {time.perf_counter() - started:.1f} s")
    if args.json:
        write_result(args.json, args=vars(args) | {"json": str(args.json)}, rows=rows,
                     add_us_per_image=per_image_us)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
