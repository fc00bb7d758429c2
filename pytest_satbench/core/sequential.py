# Why one file of ~730 lines: the module docstring is the method's derivation and the one home
# of its rules (docs/statistics.md shows it); the estimate, the stopping rule and the vectorised
# simulation share the boundary's arithmetic.
"""Confidence sequences for a run that may stop early: valid at every look, image by image.

What is estimated
-----------------

A benchmark has ``N`` images; image ``i`` has ``m_i`` questions (known before it is asked)
and a total ``y_i`` over them: its number of correct answers for an arm's accuracy
(``0 <= y_i <= m_i``), or recon-correct minus orig-correct for a reconstruction arm's
paired delta (``-m_i <= y_i <= m_i``). The estimand is the number the complete run gives,

    theta = (y_1 + ... + y_N) / (m_1 + ... + m_N)       (reported in points: 100 * theta)

the overall accuracy or the overall paired delta of `core.stats`, ratio of sums over every
question. Images are asked in a random order, without replacement; after ``t`` of them the
estimate is the same ratio over the images asked so far, ``theta_t = Y_t / M_t``.

A confidence sequence is a sequence of intervals ``C_1, C_2, ...`` with
``P(theta in C_t for every t at once) >= 1 - alpha``: it may be looked at after every image
and the run stopped whenever it is narrow enough (at any stopping time, chosen by looking
at the data), and the interval at the stop still covers. A fixed-n interval looked at
repeatedly does not: each look is another chance to exclude ``theta``.

The construction
----------------

1. Ratio to a mean, exactly. With ``u_i = y_i - theta * m_i`` (the ratio estimator's
   linearised influence value, times ``mean(m)``), ``sum_{all N} u_i = 0`` and

       theta_t - theta = (u_1 + ... + u_t) / M_t       exactly, for every t.

   So a bound ``|S_t| <= B_t`` on the partial sums ``S_t = u_1 + ... + u_t`` of a finite
   population with mean 0, drawn without replacement, gives ``theta in theta_t +- B_t / M_t``.

2. Without replacement: a martingale, and a Brownian motion in a new clock. Under a random
   order, the next image is a uniform draw from the ``N - t`` not yet asked, whose ``u``
   sum to ``-S_t``; so ``E[u_{t+1} | past] = -S_t / (N - t)``, and

       Z_t = S_t / (N - t)    is a martingale (t < N),

   the fact Waudby-Smith and Ramdas (NeurIPS 2020) build their without-replacement
   confidence sequences on (there, "the mean of what is left"). Its variance is exact:
   ``Var(S_t) = t (N - t) s^2 / N`` with ``s^2 = sum u_i^2 / (N - 1)`` (the textbook
   finite-population variance), so ``Var(Z_t) = (s^2 / N) * tau_t`` with the clock

       tau_t = t / (N - t).

   By the invariance principle for sampling without replacement (Rosen, "Limit theorems
   for sampling from finite populations", Arkiv for Matematik 1965), ``S_{uN} / (s sqrt N)``
   tends to a
   Brownian bridge ``b(u)``, and ``b(u) = (1 - u) W(u / (1 - u))`` for a Brownian motion
   ``W``: ``Z_t sqrt(N) / s`` is asymptotically ``W(tau_t)``, a Brownian motion read at
   the clock ``tau_t``, which runs from 0 to infinity as ``t`` goes from 0 to ``N``.

3. Time-uniform boundary: Robbins' normal mixture. For a Brownian motion, the mixture
   ``integral exp(l W(tau) - l^2 tau / 2) dN(0, rho^2)(l)`` is a nonnegative martingale, and
   Ville's inequality gives ``P(exists tau: |W(tau)| >= b(tau)) <= alpha`` with
   ``b(tau) = sqrt(2 (tau rho^2 + 1) / rho^2 * log(sqrt(tau rho^2 + 1) / alpha))`` (Howard,
   Ramdas, McAuliffe and Sekhon, Annals of Statistics 2021). Writing ``n = N tau_t`` and
   undoing steps 1 and 2, with probability about ``1 - alpha`` for every ``t`` at once,

       |Y_t - theta M_t| <= t * s * g(n_t),     n_t = t N / (N - t),
       g(n) = sqrt( 2 (n r^2 + 1) / (n^2 r^2) * log( sqrt(n r^2 + 1) / alpha ) ),

   which is the Gaussian-mixture asymptotic confidence sequence of Waudby-Smith, Arbour,
   Sinha, Kennedy and Ramdas ("Time-uniform central limit theory and asymptotic confidence
   sequences", Annals of Statistics 2024) evaluated at the effective sample size
   ``n_t = t / (1 - t/N)`` instead of ``t``. That is the finite-population correction: at a
   fixed ``t``, ``s^2 / n_t = (1 - t/N) s^2 / t`` is the textbook without-replacement
   variance of a sample mean; here the whole boundary, not one point of it, moves to the
   new clock. While ``t << N`` it is the with-replacement sequence; as ``t -> N``,
   ``n_t -> infinity`` and the width goes to 0: with every image asked the sequence is the
   complete run's number.

   The spread ``s`` is estimated at the hypothesised value, ``s_t(theta)^2 = N / (N - 1) *
   sum_{i <= t} (y_i - theta m_i)^2 / t``: when ``theta`` is the true value the ``u_i`` have
   population mean 0, known, so nothing is centred, and this is unbiased for ``s^2``. The
   sequence at look ``t`` is the set of ``theta`` that pass this test; the inequality is
   quadratic in ``theta`` (as Fieller's interval for a ratio) and is solved in closed form
   from five running sums, O(1) per image. It always contains the running estimate
   ``theta_t`` (where the left side is 0), and is a bounded interval once
   ``g(n_t)^2 N / (N - 1) < mean(m)^2 / mean(m^2)`` (about ``g < 1``), else the figure's whole
   range. Plugging in the running estimate instead (``theta_t +- s_t g(n_t) / mean(m)``,
   with the sample standard deviation of ``y_i - theta_t m_i``: the Wald form) gives a
   symmetric interval; the test form widens it on the side where the variance grows, which
   is where a skewed sample (a few badly reconstructed images not yet seen) leaves the
   truth. Measured, it cut the orders whose sequence ever excludes the value by 0.4 to 0.9
   points (5.05% to 4.50% at 2,226 images, 2.65% to 2.20% at 200), for a width within 2%
   of the Wald form's from a quarter of the run on (5% to 10% wider at 50 to 100 images).
   As in Waudby-Smith et al., estimating the variance from the data keeps the coverage
   asymptotically (as the number of images grows); it is not an exact, finite-sample
   guarantee.

4. ``r`` sets where the sequence is tightest: ``r^2 = (-2 log alpha + log(1 - 2 log alpha))
   / n_opt`` (about) minimises the width at ``n_t = n_opt`` (the choice Howard et al. and
   Waudby-Smith et al. give). It is fixed before the data (``n_opt`` defaults to
   `DEFAULT_N_OPT` effective images); the width depends on it only through a logarithm.

5. At least `min_images` images on each side (default `DEFAULT_MIN_IMAGES` = 50, or all
   of them when the benchmark is smaller). The guarantee is asymptotic in the number of
   images, and with a handful of images the running variance misses the rare images that
   move a delta most (a few badly reconstructed scenes), so the interval is too narrow:
   before `min_images` images `interval()` gives the whole range of the figure (0..100 for
   an accuracy, -100..100 for a delta), which is trivially valid, and so no rule can stop
   a run there. The same holds at the other end, where ``S_t`` is minus the sum over the
   ``N - t`` images not yet asked, a small sample once few are left: the clock uses
   ``max(N - t, min_images)`` in place of ``N - t``, so the width stops shrinking when
   fewer than `min_images` images remain, until the last image makes it exact. The
   interval is always clipped to the figure's range.

Why this method (measured with performance/sequential.py and tests/core/test_sequential.py; the
numbers and commands are in docs/performance.md and docs/statistics.md). Exact methods
with the image as the unit (betting, empirical Bernstein) must allow an image's delta
anywhere in ``[-m_i, m_i]`` while its spread is a few questions: on a 2,226-image,
100-question benchmark a predictable plug-in empirical-Bernstein sequence needs 70% of
the questions for a 2-point width, and on 200 images of 50 questions it never reaches 4
points. This sequence pays only for the observed spread: 11.3% of the questions (90th
percentile 12.9%) and 36.5% (41.5%). Coverage at every look, over 1,000 random orders or
benchmarks with heterogeneous images, is 94.6% to 98.3%, within simulation noise of 95% or
above (the Gaussian-mixture boundary crosses with probability exactly ``alpha`` in the
limit, and this clock runs to infinity, so there is little slack to spare); peeking at the
ordinary clustered interval every 10 images excludes the complete-run value in 18% to 39%
of the orders. Defaults: ``min_images`` 50 and ``n_opt`` 500, chosen on those simulations.
A smaller ``min_images`` lets early looks undercover. ``n_opt`` from 250 to 1,000 leaves
the coverage where it is on those benchmarks, and a 2-point width at RSVQA-HR's size comes
after 11.1% of the questions with 250, 11.3% with 500 and 12.2% with 1,000 (a 4-point width
at 200 images: 34%, 36.5%, 41%); a larger ``n_opt`` makes early looks wider, which helps
when a few images carry much of the delta: with 10% of the images losing 30 points, the
orders excluded at 200 images are 6.0% with ``n_opt`` 300, 5.4% with 500 and 4.2% with
1,000. 500 is the compromise. Such a heavy tail is where the asymptotics are weakest: 5.4%
and 6.3% (200 and 2,226 images) instead of 5%, where ``finite_population=False`` (below)
gives 0.1% and 2.9%; so is little noise within an image (answers flipping one way only,
so that the damaged images dominate the spread): 5.8% on average over six 2,226-image
benchmarks. Unequal question counts change nothing: 3.0% and 4.5% on average over six
benchmarks of 200 images of 10 to 90 questions and of 2,226 images of 20 to 180.

``finite_population=False`` reads the same boundary on the with-replacement clock
``n_t = t`` (exact again at the last image). Without replacement ``S_t`` is a Brownian
bridge, whose covariance is the Brownian motion's minus a positive semi-definite part, so
by Anderson's inequality it stays inside any symmetric convex band at least as often:
valid and conservative (measured 98.3% to 100%), at the cost of more questions (12.8%
instead of 11.3% at RSVQA-HR's size, 58% instead of 36.5% at 200 images). It is there for
a user who wants margin over the nominal coverage rather than the earliest stop. Each call
costs O(1) (a few microseconds per image), pure Python; the module imports nothing but
`math` (numpy only inside the vectorised `confidence_sequence`, for simulations).

Several arms: each arm's sequence is a 95% sequence of its own (``alpha`` each); the
stopping rule asks every reconstruction arm's sequence to meet it. For a joint guarantee
over ``k`` arms, pass ``alpha / k``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_satbench.core.arms import ORIG

__all__ = [
    "ACCURACY",
    "DELTA",
    "DEFAULT_MIN_IMAGES",
    "DEFAULT_N_OPT",
    "Interval",
    "SequentialEstimate",
    "StoppingRule",
    "confidence_sequence",
    "boundary_factor",
]

ACCURACY = "accuracy"  # an image's total is its correct count, 0..m
DELTA = "delta"  # an image's total is recon-correct minus orig-correct, -m..m
_RANGES = {ACCURACY: (0.0, 100.0), DELTA: (-100.0, 100.0)}

DEFAULT_MIN_IMAGES = 50
DEFAULT_N_OPT = 500.0


@dataclass(frozen=True)
class Interval:
    """A figure in points with its confidence-sequence interval at the current look."""

    estimate: float  # points; NaN before any image
    lo: float  # points
    hi: float  # points
    images: int  # images asked so far
    questions: int  # questions over those images

    @property
    def width(self) -> float:
        return self.hi - self.lo

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2.0

    def __iter__(self) -> Iterator[float]:  # estimate, lo, hi = interval
        return iter((self.estimate, self.lo, self.hi))


def _rho2(alpha: float, n_opt: float) -> float:
    a = -2.0 * math.log(alpha)
    return (a + math.log(a + 1.0)) / n_opt


def boundary_factor(n_eff: float, alpha: float = 0.05, n_opt: float = DEFAULT_N_OPT) -> float:
    """``g(n)`` of the module docstring: the half-width of the sequence for a mean of unit
    standard deviation at effective sample size ``n`` (``inf`` for ``n <= 0``, 0 for
    ``n = inf``)."""
    if n_eff <= 0:
        return math.inf
    if math.isinf(n_eff):
        return 0.0
    r2 = _rho2(alpha, n_opt)
    v = n_eff * r2 + 1.0
    return math.sqrt(2.0 * v / (n_eff * n_eff * r2) * math.log(math.sqrt(v) / alpha))


def _effective_images(t: int, n_total: int, k: int, finite_population: bool = True) -> float:
    """``n_t = t N / (N - t)``, with ``N - t`` held at ``k`` or more until the last image
    (the remaining images are also a sample: see the module docstring, point 5); ``t`` on
    the with-replacement clock. Infinite at the last image: the complete run is exact."""
    if t >= n_total:
        return math.inf
    if not finite_population:
        return float(t)
    return t * n_total / max(n_total - t, k)


def _check_common(n_images_total: int, alpha: float, min_images: int | None, n_opt: float) -> int:
    if isinstance(n_images_total, bool) or not isinstance(n_images_total, int) or n_images_total < 1:
        raise ValueError(f"n_images_total must be a positive int, got {n_images_total!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    if isinstance(n_opt, bool) or not isinstance(n_opt, (int, float)) or not 0 < n_opt < math.inf:
        raise ValueError(f"n_opt must be a positive number, got {n_opt!r}")
    if min_images is None:
        min_images = DEFAULT_MIN_IMAGES
    if isinstance(min_images, bool) or not isinstance(min_images, int) or min_images < 2:
        raise ValueError(f"min_images must be an int >= 2, got {min_images!r}")
    return min(min_images, n_images_total)


def _check_kind(kind: str) -> tuple[float, float]:
    if kind not in _RANGES:
        raise ValueError(f"kind must be {ACCURACY!r} or {DELTA!r}, got {kind!r}")
    return _RANGES[kind]


class SequentialEstimate:
    """One figure's confidence sequence, fed one image at a time (in the random order).

    ``kind="accuracy"``: `add` an image's correct count; ``kind="delta"``: its recon-correct
    minus orig-correct. `interval()` is the estimate and the sequence in points, valid at
    every look (see the module docstring); before `min_images` images it is the figure's
    whole range. O(1) per image, pure Python.
    """

    def __init__(
        self,
        n_images_total: int,
        *,
        kind: str = DELTA,
        alpha: float = 0.05,
        min_images: int | None = None,
        n_opt: float = DEFAULT_N_OPT,
        finite_population: bool = True,
    ) -> None:
        self.min_images = _check_common(n_images_total, alpha, min_images, n_opt)
        self.finite_population = bool(finite_population)
        self.range = _check_kind(kind)
        self.kind = kind
        self.n_images_total = n_images_total
        self.alpha = float(alpha)
        self.n_opt = float(n_opt)
        self._r2 = _rho2(self.alpha, self.n_opt)
        self.images = 0
        self.questions = 0
        # running sums of y, m, y*y, y*m, m*m (exact for integer totals)
        self._sy: float = 0
        self._syy: float = 0
        self._sym: float = 0
        self._smm: float = 0
        self._seen: set[str] = set()

    @property
    def complete(self) -> bool:
        return self.images == self.n_images_total

    def add(self, total: float, questions: int, image: str | None = None) -> Interval:
        """One more image: its total (see the class docstring) over its ``questions``
        questions. ``image`` (optional) names it, so that asking an image twice is an
        error rather than a silently wrong sequence. Returns the new `interval()`."""
        if isinstance(questions, bool) or not isinstance(questions, int) or questions < 1:
            raise ValueError(f"an image needs an int number of questions >= 1, got {questions!r}")
        if isinstance(total, bool) or not isinstance(total, (int, float)) or math.isnan(total):
            raise ValueError(f"an image's total must be a number, got {total!r}")
        low = 0 if self.kind == ACCURACY else -questions
        if not low <= total <= questions:
            raise ValueError(
                f"image total {total!r} is outside [{low}, {questions}] for a {self.kind} "
                f"over {questions} questions"
            )
        if self.images >= self.n_images_total:
            raise ValueError(
                f"all {self.n_images_total} images were already added: images are sampled "
                "without replacement"
            )
        if image is not None:
            if image in self._seen:
                raise ValueError(f"image {image!r} was already added: images are sampled without replacement")
            self._seen.add(image)
        self.images += 1
        self.questions += questions
        self._sy += total
        self._syy += total * total
        self._sym += total * questions
        self._smm += questions * questions
        return self.interval()

    def _h(self, images: int) -> float:
        """``g(n_t)^2 N / (N - 1)`` for the look after ``images`` images (0 at the last)."""
        n_eff = _effective_images(images, self.n_images_total, self.min_images, self.finite_population)
        if math.isinf(n_eff):
            return 0.0
        v = n_eff * self._r2 + 1.0
        g2 = 2.0 * v / (n_eff * n_eff * self._r2) * math.log(math.sqrt(v) / self.alpha)
        return g2 * self.n_images_total / (self.n_images_total - 1)

    def _offsets(self, images: int) -> tuple[float, float] | None:
        """``(theta_t - lo, hi - theta_t)`` as fractions for the look after ``images``
        images, with the per-image means observed so far (the actual interval when
        ``images`` is the current count); None when the set is unbounded."""
        t = self.images
        theta = self._sy / self.questions
        a = self.questions / t  # mean questions per image
        q0 = max(self._syy - 2.0 * theta * self._sym + theta * theta * self._smm, 0.0) / t
        p = (self._sym - theta * self._smm) / t
        mm = self._smm / t
        h = self._h(images)
        lead = a * a - h * mm
        if lead <= 0.0:
            return None
        root = math.sqrt(h * h * p * p + lead * h * q0)
        return (h * p + root) / lead, (root - h * p) / lead

    def interval(self) -> Interval:
        """(estimate, lo, hi) in points at this look, with the counts; NaN estimate before
        the first image."""
        lo_r, hi_r = self.range
        if self.images == 0:
            return Interval(math.nan, lo_r, hi_r, 0, 0)
        theta = self._sy / self.questions
        est = 100.0 * theta
        off = self._offsets(self.images) if self.images >= self.min_images else None
        if off is None:
            return Interval(est, lo_r, hi_r, self.images, self.questions)
        lo = min(max(100.0 * (theta - off[0]), lo_r), hi_r)
        hi = min(max(100.0 * (theta + off[1]), lo_r), hi_r)
        return Interval(est, lo, hi, self.images, self.questions)

    def projected_half_width(self, images: int) -> float:
        """The half-width (points) the sequence would have after ``images`` images if the
        spread and questions per image stayed as observed so far (NaN before 2 images)."""
        if self.images < 2:
            return math.nan
        off = self._offsets(images) if images >= self.min_images else None
        if off is None:
            return (self.range[1] - self.range[0]) / 2.0
        return 100.0 * (off[0] + off[1]) / 2.0

    def images_needed(self, half_width: float) -> int | None:
        """Estimated number of images (in all, counting those asked) after which the
        half-width is at most ``half_width`` points, if the spread stays as observed: at
        least the current count, at most every image. None before 2 images."""
        if self.images < 2:
            return None
        if not half_width > 0:
            return self.n_images_total
        lo, hi = max(self.images, self.min_images), self.n_images_total
        if self.projected_half_width(lo) <= half_width:
            return lo
        while hi - lo > 1:  # the half-width falls with the images: bisect
            mid = (lo + hi) // 2
            if self.projected_half_width(mid) <= half_width:
                hi = mid
            else:
                lo = mid
        return hi


def _points(x: float) -> str:
    return f"{x:g}"


class StoppingRule:
    """``--precision P`` / ``--margin M`` for one benchmark: the sequences of every arm, and
    whether the run may stop.

    Feed it every image as it completes (all arms of that image): ``add(questions,
    {arm: correct_count, ...}, image=name, position=k)``, with the reference arm (``orig``)
    and every arm in ``recon_arms`` and ``other_arms``; ``position`` is the image's place in
    the random order, and images enter the sequences in that order (see `add`). It keeps a `SequentialEstimate` of each arm's accuracy (`accuracy`) and of
    each reconstruction arm's paired delta, recon minus reference (`delta`).

    - precision P: met once every reconstruction arm's delta sequence is at most P points
      wide (with no reconstruction arm: the reference accuracy's);
    - margin M: met once every reconstruction arm's delta sequence lies entirely above -M
      ("within M points of the original") or entirely below -M ("worse by more than M");
    - both: whichever is met first.

    `check()` says whether the rule is met at this look; the first time it is, the rule
    latches (`stopped`, `reason`: "precision 4.0 reached after 61 of 200 images"). Images
    still in flight may be added after that; the sequences stay valid.
    """

    def __init__(
        self,
        n_images_total: int,
        recon_arms: Sequence[str] = (),
        *,
        precision: float | None = None,
        margin: float | None = None,
        alpha: float = 0.05,
        min_images: int | None = None,
        n_opt: float = DEFAULT_N_OPT,
        finite_population: bool = True,
        reference: str = ORIG,
        other_arms: Sequence[str] = (),
        questions_total: int | None = None,
    ) -> None:
        if precision is None and margin is None:
            raise ValueError("a stopping rule needs precision or margin (or both)")
        for name, v in (("precision", precision), ("margin", margin)):
            if v is not None and (
                isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf
            ):
                raise ValueError(f"{name} must be a positive number of points, got {v!r}")
        recon = tuple(recon_arms)
        if reference in recon or len(set(recon)) != len(recon):
            raise ValueError(f"reconstruction arms must be distinct and not {reference!r}: {recon!r}")
        if margin is not None and not recon:
            raise ValueError("margin needs at least one reconstruction arm (it decides a delta)")
        if questions_total is not None and (
            isinstance(questions_total, bool) or not isinstance(questions_total, int) or questions_total < 1
        ):
            raise ValueError(f"questions_total must be a positive int, got {questions_total!r}")
        self.n_images_total = n_images_total
        self.precision = None if precision is None else float(precision)
        self.margin = None if margin is None else float(margin)
        self.reference = reference
        self.recon_arms = recon
        self.questions_total = questions_total
        kw: dict[str, Any] = {
            "alpha": alpha, "min_images": min_images, "n_opt": n_opt, "finite_population": finite_population,
        }
        arms = (reference, *recon, *(a for a in other_arms if a != reference and a not in recon))
        self.accuracy: dict[str, SequentialEstimate] = {
            a: SequentialEstimate(n_images_total, kind=ACCURACY, **kw) for a in arms
        }
        self.delta: dict[str, SequentialEstimate] = {
            a: SequentialEstimate(n_images_total, kind=DELTA, **kw) for a in recon
        }
        self.stopped = False
        self.reason: str | None = None
        self.stopped_at: int | None = None  # images asked when the rule was met
        self._names: set[str] = set()
        self._positioned: bool | None = None
        self._pending: dict[int, tuple[int, dict[str, float], str | None]] = {}
        self._next = 0  # the next position to enter the sequences

    # -- feeding

    @property
    def images(self) -> int:
        return self.accuracy[self.reference].images

    @property
    def questions(self) -> int:
        return self.accuracy[self.reference].questions

    @property
    def pending(self) -> int:
        """Images received out of order, waiting for an earlier position (see `add`)."""
        return len(self._pending)

    def add(
        self,
        questions: int,
        correct: Mapping[str, float],
        image: str | None = None,
        position: int | None = None,
    ) -> int:
        """One completed image: its question count and each arm's number of correct
        answers on it (errors count as wrong, as everywhere). Returns how many images this
        call put into the sequences.

        ``position``: the image's place (0-based) in the run's random order. Images must
        enter the sequences in that order, not in the order they complete: with concurrent
        requests, which images finish first can depend on their answers (long answers,
        retries, slow servers for hard scenes), and an order that depends on the data voids
        the guarantee. With positions, an image that completes before an earlier one waits
        (`pending`) until every earlier position has arrived. Without, the caller feeds
        them in order. One rule uses one way or the other."""
        # validate everything before changing anything
        if isinstance(questions, bool) or not isinstance(questions, int) or questions < 1:
            raise ValueError(f"an image needs an int number of questions >= 1, got {questions!r}")
        missing = [a for a in self.accuracy if a not in correct]
        if missing:
            raise ValueError(f"no correct count for arm(s) {', '.join(missing)}")
        for a in self.accuracy:
            c = correct[a]
            if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c <= questions:
                raise ValueError(f"arm {a!r}: {c!r} correct is not in [0, {questions}]")
        if image is not None and image in self._names:
            raise ValueError(f"image {image!r} was already added: images are sampled without replacement")
        positioned = position is not None
        if self._positioned is not None and positioned != self._positioned:
            raise ValueError("add every image of a rule with a position, or none")
        if positioned:
            if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < self.n_images_total:
                raise ValueError(f"position must be an int in [0, {self.n_images_total}), got {position!r}")
            if position < self._next or position in self._pending:
                raise ValueError(f"position {position} was already added")
        elif self.images >= self.n_images_total:
            raise ValueError(f"all {self.n_images_total} images were already added")
        self._positioned = positioned
        if image is not None:
            self._names.add(image)
        item = (questions, {a: correct[a] for a in self.accuracy}, image)
        if position is None:  # not positioned
            self._enter(*item)
            return 1
        self._pending[position] = item
        entered = 0
        while self._next in self._pending:
            self._enter(*self._pending.pop(self._next))
            self._next += 1
            entered += 1
        return entered

    def _enter(self, questions: int, correct: Mapping[str, float], image: str | None) -> None:
        ref = correct[self.reference]
        for a, est in self.accuracy.items():
            est.add(correct[a], questions, image)
        for a, est in self.delta.items():
            est.add(correct[a] - ref, questions, image)

    # -- the rule

    def describe(self) -> str:
        """"precision 4.0", "margin 2.0" or "precision 4.0 or margin 2.0"."""
        parts = []
        if self.precision is not None:
            parts.append(f"precision {self.precision:.1f}")
        if self.margin is not None:
            parts.append(f"margin {self.margin:.1f}")
        return " or ".join(parts)

    def _watched(self) -> dict[str, SequentialEstimate]:
        return dict(self.delta) if self.delta else {self.reference: self.accuracy[self.reference]}

    def decisions(self) -> dict[str, str | None]:
        """Per reconstruction arm, against the margin: "within" (sequence above -M),
        "worse" (below -M) or None (undecided; also when no margin is set)."""
        out: dict[str, str | None] = {}
        for a, est in self.delta.items():
            iv = est.interval()
            if self.margin is None or iv.images < est.min_images:
                out[a] = None
            elif iv.lo > -self.margin:
                out[a] = "within"
            elif iv.hi < -self.margin:
                out[a] = "worse"
            else:
                out[a] = None
        return out

    def _precision_met(self) -> bool:
        if self.precision is None:
            return False
        return all(
            e.images >= e.min_images and e.interval().width <= self.precision
            for e in self._watched().values()
        )

    def _margin_met(self) -> bool:
        return self.margin is not None and all(d is not None for d in self.decisions().values())

    def check(self) -> bool:
        """Is the rule met at this look? Latches `stopped` and `reason` the first time (not
        when the last image completes the benchmark: that is a complete run)."""
        if self.stopped:
            return True
        if self.images >= self.n_images_total or self.images == 0:
            return False
        which = (
            f"precision {self.precision:.1f} reached" if self._precision_met()
            else f"margin {self.margin:.1f} decided" if self._margin_met()
            else None
        )
        if which is None:
            return False
        self.stopped = True
        self.stopped_at = self.images
        self.reason = f"{which} after {self.images} of {self.n_images_total} images"
        return True

    def images_needed(self) -> int | None:
        """Estimated images (in all) at which the rule will be met if the spreads and the
        estimates stay as observed; None before two images."""
        watched = self._watched()
        if self.images < 2:
            return None
        if self.stopped:
            return self.stopped_at
        needs = []
        if self.precision is not None:
            per = [e.images_needed(self.precision / 2.0) for e in watched.values()]
            needs.append(max(n for n in per if n is not None))
        if self.margin is not None:
            per = []
            for e in self.delta.values():
                distance = abs(e.interval().estimate + self.margin)
                per.append(e.images_needed(distance) if distance > 0 else self.n_images_total)
            needs.append(max(n for n in per if n is not None))
        return min(needs)

    def progress(self) -> str:
        """For a progress line: the first reconstruction arm's running delta with its
        half-width (or the reference accuracy), and the images until the rule is met."""
        name, est = next(iter(self._watched().items()))
        iv = est.interval()
        what = "delta" if self.delta else "accuracy"
        if iv.images == 0:
            return f"{name} {what}: no image yet"
        value = f"{iv.estimate:+.1f}" if self.delta else f"{iv.estimate:.1f}"
        if iv.images < est.min_images:
            text = f"{name} {what} {value} (sequence from {est.min_images} images)"
        else:
            text = f"{name} {what} {value} ±{iv.half_width:.1f}"
        if self.stopped:
            return f"{text}; {self.reason}"
        need = self.images_needed()
        if need is not None:
            text += f"; ~{max(need - self.images, 0)} more of {self.n_images_total} images for {self.describe()}"
        return text

    def to_dict(self) -> dict[str, Any]:
        """The ``"sequential"`` block of summary.json (points; `questions_total` is None
        unless it was given)."""
        arms: dict[str, Any] = {}
        if self.delta:
            dec = self.decisions()
            for a, est in self.delta.items():
                iv = est.interval()
                arms[a] = {"delta": _num(iv.estimate), "cs": [_num(iv.lo), _num(iv.hi)]}
                if self.margin is not None:
                    arms[a]["margin"] = dec[a]
        else:
            iv = self.accuracy[self.reference].interval()
            arms[self.reference] = {"accuracy": _num(iv.estimate), "cs": [_num(iv.lo), _num(iv.hi)]}
        return {
            "rule": self.describe(),
            "stopped": self.stopped,
            "reason": self.reason,
            "questions_answered": self.questions,
            "questions_total": self.questions_total,
            "images_answered": self.images,
            "images_total": self.n_images_total,
            "arms": arms,
        }


def _num(x: float) -> float | None:
    return None if math.isnan(x) else x


def confidence_sequence(
    values: Any,
    questions: Any,
    n_images_total: int,
    *,
    alpha: float = 0.05,
    kind: str = DELTA,
    min_images: int | None = None,
    n_opt: float = DEFAULT_N_OPT,
    finite_population: bool = True,
) -> tuple[Any, Any, Any]:
    """The sequence at every look, vectorised: ``values`` and ``questions`` are arrays of
    shape ``(..., t)`` (image totals and question counts in asking order along the last
    axis, e.g. one row per random order); returns ``(estimate, lo, hi)`` in points, each of
    that shape, entry ``[..., k]`` being the look after ``k + 1`` images. The same numbers
    as `SequentialEstimate` (which is what the plugin uses); this form is for simulations."""
    import numpy as np  # lazily: the plugin imports this module at start-up

    k = _check_common(n_images_total, alpha, min_images, n_opt)
    lo_r, hi_r = _check_kind(kind)
    y = np.asarray(values, dtype=np.float64)
    m = np.asarray(questions, dtype=np.float64)
    if y.shape != m.shape or y.ndim < 1:
        raise ValueError(f"values and questions must have the same shape, got {y.shape} and {m.shape}")
    if y.shape[-1] > n_images_total:
        raise ValueError(f"{y.shape[-1]} images given, but the benchmark has {n_images_total}")
    if np.any(m < 1) or np.any(m != np.round(m)):
        raise ValueError("every image needs a whole number of questions >= 1")
    low = 0.0 if kind == ACCURACY else -1.0
    if np.any(np.isnan(y)) or np.any(y < low * m) or np.any(y > m):
        raise ValueError(f"an image total is outside its range for a {kind}")
    t = np.arange(1, y.shape[-1] + 1, dtype=np.float64)
    sy, sm = np.cumsum(y, axis=-1), np.cumsum(m, axis=-1)
    syy, sym, smm = np.cumsum(y * y, axis=-1), np.cumsum(y * m, axis=-1), np.cumsum(m * m, axis=-1)
    theta = sy / sm
    r2 = _rho2(alpha, n_opt)
    with np.errstate(divide="ignore", invalid="ignore"):
        last = t >= n_images_total
        n_eff = t * n_images_total / np.maximum(n_images_total - t, k) if finite_population else t
        n_eff = np.where(last, 1.0, n_eff)
        v = n_eff * r2 + 1.0
        g2 = 2.0 * v / (n_eff * n_eff * r2) * np.log(np.sqrt(v) / alpha)
        h = np.where(last, 0.0, g2 * n_images_total / max(n_images_total - 1, 1))
        a = sm / t
        q0 = np.maximum(syy - 2.0 * theta * sym + theta * theta * smm, 0.0) / t
        p = (sym - theta * smm) / t
        lead = a * a - h * smm / t
        root = np.sqrt(h * h * p * p + lead * h * q0)
        down, up = (h * p + root) / lead, (root - h * p) / lead
    est = 100.0 * theta
    open_ = (t < k) | ~(lead > 0.0)
    lo = np.where(open_, lo_r, np.clip(100.0 * (theta - down), lo_r, hi_r))
    hi = np.where(open_, hi_r, np.clip(100.0 * (theta + up), lo_r, hi_r))
    return est, lo, hi


def fixed_sample_interval(values: Any, questions: Any) -> tuple[Any, Any]:
    """The ordinary fixed-n clustered interval of the same ratio at every look, in points (the
    normal approximation of `core.stats`'s clustered bootstrap: the ratio's linearised
    per-image variance, no finite-population factor): what peeking at the usual interval
    gives, for the simulations that show why a confidence sequence is needed. `values` and
    `questions` are arrays whose last axis is the images in the order asked."""
    import numpy as np

    y, m = np.asarray(values, dtype=float), np.asarray(questions, dtype=float)
    t = np.arange(1, y.shape[-1] + 1)
    sy, sm = y.cumsum(-1), m.cumsum(-1)
    theta = sy / sm
    ss = (y * y).cumsum(-1) - 2 * theta * (y * m).cumsum(-1) + theta**2 * (m * m).cumsum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        se = np.sqrt(np.maximum(ss, 0) / np.maximum(t - 1, 1) / t) / (sm / t)
    return 100 * (theta - 1.96 * se), 100 * (theta + 1.96 * se)
