"""Answer flips against distortion: do the questions a reconstruction flips sit on the images it
reconstructs worst?

Input, per reconstruction arm, one entry per question both the original and the arm have a row
for: the image, the question's reported types, whether the original and the arm were right (an
API error counts as wrong, as in every paired figure: `core.stats`), and the pair of images sent
(sha256 of the original's bytes, of the reconstruction's bytes) that names the arm's distortion
for that image (`ResultStore.distortions`). `FlipTable` keeps them as columns (a few bytes per
question: the report streams 222k questions and holds no row twice); `FlipTable.analyse` is
given each pair's PSNR and computes, per arm and per type (and over all types, each question
once):

- **PSNR quintiles by image**: the arm's images with a PSNR are ranked by it and cut into
  `BINS` groups of equal image count, bin 1 the most distorted (lowest PSNR). Images with the
  same PSNR always share a bin: an image's bin is ``floor(BINS * r / n)``, r the number of
  images with a strictly lower PSNR, n the images ranked; so ties go together to the bin of
  their first rank, every identical reconstruction (PSNR = +inf) to the last bin, and bins can
  be uneven or empty. The edges are the arm's, over all its images, so
  a type's bin 1 is the same PSNR range for every type (a type present on few images may have
  few in a bin). Questions whose pair has no PSNR (no distortion stored) are counted, never
  binned.
- per bin: questions, images, the **regression rate** (the share of the questions the original
  got right that the arm got wrong) and the **improvement rate** (the share of those the
  original got wrong that the arm got right), each with a 95% percentile interval from a
  bootstrap clustered by image (`core.stats._Ratios`, the machinery of every interval in the
  reports: the images of the type are resampled, the rate is the ratio of summed events to
  summed denominators). Fixed sample, and conditional on the bins: the edges are not
  re-estimated in the resamples.
- **one association figure**: the slope of a logistic regression of "regressed" on PSNR (dB)
  among the questions the original got right, images with a finite PSNR, with a 95% Wald
  interval from the cluster-robust (by image) sandwich variance with the CR1 small-sample
  factor G/(G-1) * (N-1)/(N-K) (Liang and Zeger 1986; Cameron and Miller 2015, "A
  Practitioner's Guide to Cluster-Robust Inference", J. Human Resources 50(2)). Fitted here by
  IRLS in numpy (`logistic_fit`), checked against statsmodels' GLM (`cov_type="cluster"`) in
  tests/core/test_distortion_flips.py. A negative slope: the lower the PSNR, the likelier a
  right answer is lost. No slope (and the reason) when no question regressed, when every one
  did, with fewer than two images, or when PSNR separates the two outcomes completely (every
  regressed question's PSNR at or below every other's, or above: the maximum-likelihood slope
  is infinite; its sign is given).

Association is not causation (images that reconstruct badly are also the busy scenes whose
questions are hard), and PSNR is not what a VLM sees: docs/reports.md says so where the table
is shown.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np

from pytest_satbench.core.stats import _Ratios

__all__ = [
    "ALL_TYPES", "BINS", "DistortionFlips", "FlipBin", "FlipTable", "LogitFit", "Rate", "Slope",
    "TypeFlips", "ArmFlips", "logistic_fit", "psnr_bins",
]

BINS = 5  # quintiles
ALL_TYPES = "all types"  # the group of every question, each once


@dataclass(frozen=True, slots=True)
class Rate:
    """`events` of `n` (a regression rate: regressed of the questions the original got right)."""

    events: int
    n: int
    ci_low: float
    ci_high: float

    @property
    def value(self) -> float:
        return self.events / self.n if self.n else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {"events": self.events, "n": self.n, "rate": _none(self.value),
                "ci_low": _none(self.ci_low), "ci_high": _none(self.ci_high)}


@dataclass(frozen=True, slots=True)
class FlipBin:
    index: int  # 1 = the most distorted (lowest PSNR)
    psnr_low: float  # the lowest and highest PSNR of the bin's images (of this type)
    psnr_high: float
    images: int
    questions: int
    regressed: Rate  # orig right -> arm wrong, of the questions orig got right
    improved: Rate  # orig wrong -> arm right, of the questions orig got wrong

    def to_dict(self) -> dict[str, Any]:
        return {"bin": self.index, "psnr_low": _none(self.psnr_low), "psnr_high": _none(self.psnr_high),
                "images": self.images, "questions": self.questions,
                "regression": self.regressed.to_dict(), "improvement": self.improved.to_dict()}


@dataclass(frozen=True, slots=True)
class LogitFit:
    """A logistic regression of y on x: intercept and slope, the slope's cluster-robust
    standard error and Wald interval."""

    intercept: float
    slope: float
    se: float
    ci_low: float
    ci_high: float
    iterations: int


@dataclass(frozen=True, slots=True)
class Slope:
    """The type's association figure: log-odds of a regression per dB of PSNR."""

    questions: int  # questions the original got right, on images with a finite PSNR
    images: int
    regressed: int
    slope: float | None  # None: see `reason`
    ci_low: float | None
    ci_high: float | None
    reason: str | None = None  # why there is no slope
    sign: int = 0  # under complete separation: the sign of the (infinite) slope

    def to_dict(self) -> dict[str, Any]:
        return {"questions": self.questions, "images": self.images, "regressed": self.regressed,
                "slope_per_db": _none(self.slope), "ci_low": _none(self.ci_low), "ci_high": _none(self.ci_high),
                "reason": self.reason, "separated_sign": self.sign or None}


@dataclass(frozen=True)
class TypeFlips:
    qtype: str
    questions: int  # the type's paired questions with a PSNR
    images: int
    bins: tuple[FlipBin, ...]
    slope: Slope


@dataclass(frozen=True)
class ArmFlips:
    arm: str
    questions: int  # paired questions (orig and arm both have a row)
    without_distortion: int  # of those, on images with no PSNR stored for this arm: in no bin
    images: int  # images with a PSNR
    infinite: int  # of those, identical reconstructions (PSNR +inf): binned, not in the slope
    by_type: dict[str, TypeFlips] = field(default_factory=dict)  # types, then ALL_TYPES


@dataclass(frozen=True)
class DistortionFlips:
    by_arm: dict[str, ArmFlips]
    bins: int
    iterations: int
    seed: int
    level: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "bins": self.bins, "binned_by": "psnr", "iterations": self.iterations, "seed": self.seed,
            "level": self.level,
            "by_arm": {arm: {
                "questions": a.questions, "without_distortion": a.without_distortion, "images": a.images,
                "infinite_psnr_images": a.infinite,
                "by_type": {t: {"questions": tf.questions, "images": tf.images,
                                "bins": [b.to_dict() for b in tf.bins], "slope": tf.slope.to_dict()}
                            for t, tf in a.by_type.items()},
            } for arm, a in self.by_arm.items()},
        }


def _none(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


# --------------------------------------------------------------------------- collecting

class _Columns:
    __slots__ = ("image", "types", "orig", "arm", "pair")

    def __init__(self) -> None:
        self.image = array("i")
        self.types = array("i")
        self.orig = array("b")
        self.arm = array("b")
        self.pair = array("i")  # -1: no pair (an image not sent, an older row without its sha256)


class FlipTable:
    """The questions' outcomes per reconstruction arm, as columns, filled as they are scored."""

    def __init__(self) -> None:
        self._arms: dict[str, _Columns] = {}
        self._images: dict[str, int] = {}
        self._types: dict[tuple[str, ...], int] = {}
        self._pairs: dict[Hashable, int] = {}

    def add(self, arm: str, image: str, types: tuple[str, ...], orig_correct: bool, arm_correct: bool,
            pair: Hashable | None) -> None:
        """One question of `arm` (both it and the original have a row); `pair` names the arm's
        distortion for the image ((orig sha256, arm sha256); None: unknown)."""
        c = self._arms.get(arm)
        if c is None:
            c = self._arms[arm] = _Columns()
        c.image.append(self._images.setdefault(image, len(self._images)))
        c.types.append(self._types.setdefault(types, len(self._types)))
        c.orig.append(bool(orig_correct))
        c.arm.append(bool(arm_correct))
        c.pair.append(-1 if pair is None else self._pairs.setdefault(pair, len(self._pairs)))

    @property
    def arms(self) -> list[str]:
        return list(self._arms)

    def pairs(self) -> list[Hashable]:
        """Every distinct pair seen: what to ask the store for, in one query."""
        return list(self._pairs)

    def per_image(self) -> Iterator[tuple[str, str, tuple[int, int, int, int, int], Hashable | None]]:
        """Per arm (in the order first seen) and image (sorted by id, so the rows do not depend on
        the order the questions were read in: a merged store's report equals one run's): (image,
        arm, (questions, orig right, arm right, regressed, improved), the image's pair: the
        first its questions name)."""
        images = list(self._images)
        pairs = list(self._pairs)
        for arm, c in self._arms.items():
            image = np.frombuffer(c.image, dtype=np.int32)
            if not image.size:
                continue
            orig = np.frombuffer(c.orig, dtype=np.int8).astype(np.int64)
            recon = np.frombuffer(c.arm, dtype=np.int8).astype(np.int64)
            pair = np.frombuffer(c.pair, dtype=np.int32)
            n = len(images)
            counts = [np.bincount(image, weights=w, minlength=n).astype(np.int64) for w in (
                np.ones_like(orig), orig, recon, orig * (1 - recon), (1 - orig) * recon)]
            first_pair: dict[int, int] = {}
            for i, p in zip(image.tolist(), pair.tolist(), strict=True):
                if p >= 0 and i not in first_pair:
                    first_pair[i] = p
            for i in sorted(set(image.tolist()), key=images.__getitem__):
                p = first_pair.get(i)
                yield (images[i], arm, tuple(int(col[i]) for col in counts),  # type: ignore[misc]  # five count columns
                       pairs[p] if p is not None else None)

    def analyse(self, psnr: Mapping[Hashable, float | None], *, iterations: int, seed: int = 0,
                level: float = 0.95, bins: int = BINS) -> DistortionFlips:
        """The figures, given each pair's PSNR (a pair absent or None: no distortion known)."""
        by_pair = np.full(len(self._pairs) + 1, np.nan)  # the last slot: pair -1
        for pair, i in self._pairs.items():
            v = psnr.get(pair)
            if v is not None and not math.isnan(v):
                by_pair[i] = float(v)
        type_names = {code: t for t, code in self._types.items()}
        # images numbered by their ids' sorted order, not by first appearance: the bootstrap's
        # draws then do not depend on the order the questions were read in (a merged store's
        # shards, a resumed run), so their report's intervals equal one run's
        names = list(self._images)
        rank = np.empty(len(names), dtype=np.int64)
        rank[sorted(range(len(names)), key=names.__getitem__)] = np.arange(len(names))
        out = {arm: _arm_flips(arm, c, by_pair, type_names, iterations, seed, level, bins, rank)
               for arm, c in self._arms.items()}
        return DistortionFlips(out, bins, iterations, seed, level)


# --------------------------------------------------------------------------- the figures

def psnr_bins(values: np.ndarray, bins: int = BINS) -> np.ndarray:
    """Each value's bin, 0 the lowest: floor(bins * r / n), r = values strictly lower, so equal
    values share a bin; +inf (an identical reconstruction) is always in the last bin, even when
    most values are. `values` holds no NaN."""
    values = np.asarray(values, dtype=np.float64)
    n = values.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    lower = np.searchsorted(np.sort(values), values, side="left")
    out = np.minimum(bins - 1, (bins * lower) // n).astype(np.int64)
    out[np.isposinf(values)] = bins - 1  # identical reconstructions: the least distorted bin, however many
    return out


def _arm_flips(arm: str, c: _Columns, by_pair: np.ndarray, type_names: Mapping[int, tuple[str, ...]],
               iterations: int, seed: int, level: float, bins: int, rank: np.ndarray) -> ArmFlips:
    image = rank[np.frombuffer(c.image, dtype=np.int32)]
    types = np.frombuffer(c.types, dtype=np.int32)
    orig = np.frombuffer(c.orig, dtype=np.int8).astype(bool)
    recon = np.frombuffer(c.arm, dtype=np.int8).astype(bool)
    pair = np.frombuffer(c.pair, dtype=np.int32)
    q_psnr = by_pair[pair]  # pair -1 reads the last slot, NaN
    # an image's PSNR: that of its first question with one (a tag's runs sent one image's
    # questions as the same bytes unless its file or the codec changed between them)
    n_img = int(image.max()) + 1 if image.size else 0
    img_psnr = np.full(n_img, np.nan)
    known = ~np.isnan(q_psnr)
    if known.any():
        idx = np.flatnonzero(known)
        first = {}
        for i in idx[::-1]:  # the first one wins: walk backwards, overwrite
            first[int(image[i])] = q_psnr[i]
        img_psnr[list(first)] = list(first.values())
    psnr_q = img_psnr[image] if image.size else np.zeros(0)
    has = ~np.isnan(psnr_q)
    ranked = np.flatnonzero(~np.isnan(img_psnr))
    img_bin = np.full(n_img, -1, dtype=np.int64)
    img_bin[ranked] = psnr_bins(img_psnr[ranked], bins)
    groups: dict[str, np.ndarray] = {}
    for code, names in sorted(type_names.items(), key=lambda kv: kv[1]):
        for t in names:
            mask = types == code
            groups[t] = groups[t] | mask if t in groups else mask
    by_type: dict[str, TypeFlips] = {}
    for t in sorted(groups):
        by_type[t] = _type_flips(t, groups[t] & has, image, orig, recon, psnr_q, img_bin, iterations, seed, level, bins)
    by_type[ALL_TYPES] = _type_flips(ALL_TYPES, has, image, orig, recon, psnr_q, img_bin, iterations, seed, level, bins)
    return ArmFlips(arm, int(image.size), int((~has).sum()), int(ranked.size),
                    int(np.isposinf(img_psnr[ranked]).sum()), by_type)


def _type_flips(qtype: str, mask: np.ndarray, image: np.ndarray, orig: np.ndarray, recon: np.ndarray,
                psnr_q: np.ndarray, img_bin: np.ndarray, iterations: int, seed: int, level: float,
                bins: int) -> TypeFlips:
    im, o, r, x = image[mask], orig[mask], recon[mask], psnr_q[mask]
    b = img_bin[im]
    regressed = (o & ~r).astype(np.float64)
    improved = (~o & r).astype(np.float64)
    right, wrong = o.astype(np.float64), (~o).astype(np.float64)
    ratios = _Ratios(im)  # the type's images, resampled as every interval of the reports resamples them
    handles = []
    for k in range(bins):
        inb = (b == k).astype(np.float64)
        handles.append((ratios.ratio(regressed * inb, right * inb), ratios.ratio(improved * inb, wrong * inb)))
    ratios.resample(iterations, seed)
    cluster_bin = np.zeros(ratios.n_clusters, dtype=np.int64)
    cluster_bin[ratios.codes] = b
    per_bin_img = np.bincount(cluster_bin, minlength=bins) if ratios.n_clusters else np.zeros(bins, dtype=np.int64)
    per_bin = [np.bincount(b, weights=w, minlength=bins) for w in (np.ones_like(right), regressed, right, improved, wrong)]
    out = []
    for k, (h_reg, h_imp) in enumerate(handles):
        questions, n_reg, n_right, n_imp, n_wrong = (int(c[k]) for c in per_bin)
        if not questions:
            out.append(FlipBin(k + 1, math.nan, math.nan, 0, 0, Rate(0, 0, math.nan, math.nan),
                               Rate(0, 0, math.nan, math.nan)))
            continue
        xs = x[b == k]
        reg = Rate(n_reg, n_right, *_ci(ratios, h_reg, level, n_right))
        imp = Rate(n_imp, n_wrong, *_ci(ratios, h_imp, level, n_wrong))
        out.append(FlipBin(k + 1, float(xs.min()), float(xs.max()), int(per_bin_img[k]), questions, reg, imp))
    return TypeFlips(qtype, int(mask.sum()), ratios.n_clusters, tuple(out),
                     _slope(x, o, r, ratios.codes, ratios.n_clusters, level))


def _ci(ratios: _Ratios, handle: int, level: float, n: int) -> tuple[float, float]:
    return ratios.interval([handle], level) if n else (math.nan, math.nan)


def _slope(x: np.ndarray, orig: np.ndarray, recon: np.ndarray, codes: np.ndarray, n_clusters: int,
           level: float) -> Slope:
    keep = orig & np.isfinite(x)
    xs, ys, gs = x[keep], (~recon[keep]).astype(np.float64), codes[keep]
    # in a fixed order (image, PSNR, outcome), so the fit's floating-point sums, and so its last
    # digits, do not depend on the order the questions were read in
    order = np.lexsort((ys, xs, gs))
    xs, ys, gs = xs[order], ys[order], gs[order]
    n, events = int(keep.sum()), int(ys.sum())
    groups = int(np.count_nonzero(np.bincount(gs, minlength=n_clusters))) if n else 0

    def none(reason: str, sign: int = 0) -> Slope:
        return Slope(n, groups, events, None, None, None, reason, sign)

    if n == 0:
        return none("no question the original got right on an image with a finite PSNR")
    if events == 0:
        return none("no question regressed")
    if events == n:
        return none("every question regressed")
    if groups < 2:
        return none("one image")
    sep = _separation(xs, ys)
    if sep:
        return none("PSNR separates regressed from kept answers completely: the fitted slope is infinite", sep)
    if np.ptp(xs) == 0:
        return none("every image has the same PSNR")
    fit = logistic_fit(xs, ys, gs, level=level)
    if fit is None:
        return none("the fit did not converge")
    return Slope(n, groups, events, fit.slope, fit.ci_low, fit.ci_high)


def _separation(x: np.ndarray, y: np.ndarray) -> int:
    """With one regressor and an intercept the maximum-likelihood estimate exists iff the two
    outcomes' x ranges overlap in more than a point (Albert and Anderson 1984): otherwise the
    sign of the infinite slope (-1: the events sit at the low x), 0 when it exists."""
    ones, zeros = x[y > 0.5], x[y <= 0.5]
    if ones.max() <= zeros.min():
        return -1
    if ones.min() >= zeros.max():
        return 1
    return 0


def logistic_fit(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray,
                 clusters: Sequence[Hashable] | np.ndarray, *, level: float = 0.95,
                 max_iter: int = 100, tol: float = 1e-10) -> LogitFit | None:
    """Maximum-likelihood logistic regression of binary `y` on one regressor `x` with an
    intercept, by iteratively reweighted least squares (Newton's method on the log-likelihood:
    McCullagh and Nelder 1989, sec. 4.4), with the slope's cluster-robust variance:
    ``V = c * B^-1 (sum_g s_g s_g') B^-1``, B = X'WX the information at the estimate, s_g the
    summed score X_i (y_i - p_i) of cluster g, c = G/(G-1) * (N-1)/(N-K) (CR1, as Stata and
    statsmodels' default), and a normal Wald interval. x is centred for the iterations (the
    slope is unchanged). None when it does not converge within `max_iter` (separated data:
    check `_separation` first)."""
    xs = np.asarray(x, dtype=np.float64)
    ys = np.asarray(y, dtype=np.float64)
    _, codes = np.unique(np.asarray(clusters), return_inverse=True)
    codes = codes.ravel()
    centre = float(xs.mean())
    X = np.column_stack([np.ones_like(xs), xs - centre])
    beta = np.zeros(2)
    converged = False
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007 (the fit returns the iteration count it stopped at)
        eta = X @ beta
        p = 1.0 / (1.0 + np.exp(-eta))
        w = p * (1.0 - p)
        info = X.T @ (X * w[:, None])
        step = np.linalg.solve(info, X.T @ (ys - p))
        beta = beta + step
        if not np.all(np.isfinite(beta)):
            return None
        if float(np.max(np.abs(step))) < tol * (1.0 + float(np.max(np.abs(beta)))):
            converged = True
            break
    if not converged:
        return None
    p = 1.0 / (1.0 + np.exp(-(X @ beta)))
    w = p * (1.0 - p)
    bread = np.linalg.inv(X.T @ (X * w[:, None]))
    scores = X * (ys - p)[:, None]
    g = int(codes.max()) + 1
    summed = np.stack([np.bincount(codes, weights=scores[:, j], minlength=g) for j in range(2)], axis=1)
    meat = summed.T @ summed
    n, k = xs.size, 2
    factor = (g / (g - 1)) * ((n - 1) / (n - k)) if g > 1 and n > k else math.nan
    cov = factor * bread @ meat @ bread
    se = math.sqrt(cov[1, 1]) if cov[1, 1] >= 0 else math.nan
    z = NormalDist().inv_cdf(0.5 + level / 2)
    slope = float(beta[1])
    return LogitFit(float(beta[0] - beta[1] * centre), slope, se, slope - z * se, slope + z * se, it)


def records_table(records: Iterable[tuple[str, str, tuple[str, ...], bool, bool, Hashable | None]]) -> FlipTable:
    """A table from (arm, image, types, orig correct, arm correct, pair) tuples (tests, scripts)."""
    table = FlipTable()
    for rec in records:
        table.add(*rec)
    return table
