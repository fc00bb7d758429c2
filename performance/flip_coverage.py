"""Coverage of the flips-against-distortion intervals (core/distortion_flips.py), by simulation.

    .venv/bin/python performance/flip_coverage.py [--reps 400] [--iterations 1000]

Images get a PSNR uniform in [20, 40] dB and 1-8 questions the original got right; a question
regresses with probability p = expit(a + b * PSNR), b = -0.10 per dB, and the questions of one
image are correlated: with probability RHO they share one draw, otherwise each draws its own, so
each question's marginal probability is exactly p (the population-averaged logistic model holds
with slope b) while the image is a cluster. Per replicate:

- the bin rate: every image given one PSNR in the table (so one bin holds them all), the
  regression rate's 95% clustered-bootstrap interval is checked against the true rate E[p]
  (the number of questions is drawn independently of the PSNR);
- the slope: the 95% cluster-robust Wald interval of the logistic fit against b.

Prints the share of replicates whose interval covers the truth (nominal 0.95), per number of
images, with the share where a naive interval (every question its own cluster) covers, for
contrast. Fixed seeds: the numbers in docs/statistics.md are this script's.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from pytest_satbench.core.distortion_flips import logistic_fit, records_table

A, B, RHO = 2.0, -0.10, 0.5


def _true_rate() -> float:
    x = np.linspace(20, 40, 200_001)
    return float(np.mean(1 / (1 + np.exp(-(A + B * x)))))


def _replicate(rng: np.random.Generator, images: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    psnr = rng.uniform(20, 40, images)
    m = rng.integers(1, 9, images)
    p = 1 / (1 + np.exp(-(A + B * psnr)))
    xs, ys, gs = [], [], []
    for g in range(images):
        shared = rng.uniform() < RHO
        draws = np.full(m[g], rng.uniform() < p[g]) if shared else rng.uniform(size=m[g]) < p[g]
        xs += [psnr[g]] * m[g]
        ys += draws.tolist()
        gs += [g] * m[g]
    return np.array(xs), np.array(ys, dtype=float), np.array(gs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--iterations", type=int, default=1000)
    args = ap.parse_args()
    truth = _true_rate()
    print(f"true regression rate E[p] = {truth:.4f}; true slope b = {B}; within-image sharing {RHO}; "
          f"{args.reps} replicates, {args.iterations} resamples")
    print(f"{'images':>7} {'bin rate covered':>17} {'naive':>7} {'slope covered':>14} {'naive':>7} {'s':>6}")
    for images in (30, 100, 300):
        rng = np.random.default_rng(images)
        t0 = time.perf_counter()
        rate_hit = rate_naive = slope_hit = slope_naive = fits = 0
        for rep in range(args.reps):
            x, y, g = _replicate(rng, images)
            rows = [("a", f"i{gi}", ("t",), True, not yi, ("o", f"r{gi}")) for xi, yi, gi in zip(x, y, g, strict=True)]
            flips = records_table(rows).analyse({("o", f"r{gi}"): 30.0 for gi in range(images)},
                                                iterations=args.iterations, seed=rep)
            r = flips.by_arm["a"].by_type["t"].bins[0].regressed
            rate_hit += r.ci_low <= truth <= r.ci_high
            naive_rows = [("a", f"q{k}", ("t",), True, not yi, ("o", f"r{k}")) for k, yi in enumerate(y)]
            rn = records_table(naive_rows).analyse({("o", f"r{k}"): 30.0 for k in range(y.size)},
                                                   iterations=args.iterations, seed=rep)
            rn_rate = rn.by_arm["a"].by_type["t"].bins[0].regressed
            rate_naive += rn_rate.ci_low <= truth <= rn_rate.ci_high
            fit = logistic_fit(x, y, g)
            naive = logistic_fit(x, y, np.arange(y.size))
            if fit is None or naive is None or not math.isfinite(fit.se):
                continue
            fits += 1
            slope_hit += fit.ci_low <= B <= fit.ci_high
            slope_naive += naive.ci_low <= B <= naive.ci_high
        n = args.reps
        print(f"{images:>7} {rate_hit / n:>17.3f} {rate_naive / n:>7.3f} {slope_hit / max(fits, 1):>14.3f} "
              f"{slope_naive / max(fits, 1):>7.3f} {time.perf_counter() - t0:>6.1f}")


if __name__ == "__main__":
    main()
