# Why one file of ~950 lines: about a hundred are the module docstring, the one home of the
# statistics rules (docs/statistics.md shows it), and the summaries share private machinery
# (the per-arm arrays, the resample cache, the `_Ratios` builder) that a split would turn into
# an interface between modules with no other user.
"""Statistics for one benchmark run: accuracy, paired deltas, McNemar, coverage, chance.

Input is one `QuestionRecord` per benchmark question, holding one `ArmOutcome` per arm
("orig", each reconstruction arm, maybe "blind"). Everything here is numpy only and
deterministic for a given seed; record order never changes a result (clusters are sorted).

What is computed, and why
-------------------------

Groups. Every statistic is computed for the whole benchmark ("overall") and for each
question type. A question with several types (LHRS-Bench) counts once in each of its
types' tables and once overall, so per-type counts may add up to more than the total.

Accuracy (`AccuracyStat`), per arm and group. ``accuracy = correct / n`` where ``n`` is
every question of the group that has an outcome for that arm. API/transport errors and
unparseable answers stay in the denominator and count as wrong: dropping them would reward
an arm for failing on hard questions. A truncated answer (it hit the token limit) stays in
the denominator too and is scored on what it contains, as the official evaluation code
scores text without reading the finish reason: right when the answer it holds is right,
wrong when it was cut off before one. All three are also reported separately so that
infrastructure trouble is never mistaken for model behaviour:

- ``errors``: status "error" (the request failed after retries; no answer at all);
- ``truncated``: the answer came back but hit the token limit (finish_reason "length"),
  whether or not it still parsed;
- ``unparseable``: an answer came back (status "ok") but could not be interpreted;
- ``coverage = parsed / n``: the share of questions with an interpretable answer;
- ``missing``: questions of the group that have no outcome for this arm at all (run
  interrupted or deselected); they are outside ``n`` and shown so they cannot vanish.

Accuracy interval: 95 % percentile interval of a bootstrap clustered by image. Questions
about one image are correlated (same scene, same reconstruction artefacts), so resampling
single questions would give intervals that are too narrow; we resample whole images with
replacement (``iterations`` times, fixed ``seed``) and take the ratio of summed correct to
summed questions in each resample. The interval is undefined (NaN, ``null`` in JSON) with
fewer than two images or ``iterations=0``. All arms and all paired deltas of one group use
the same resamples, and each group (overall, each type) draws from a fresh generator
seeded with ``seed``, so a group's interval does not depend on which other groups exist,
and equals what `cluster_bootstrap_ci` returns for that group's data with the same seed.
A per-type bootstrap resamples the images that have at least one question of that type.
Every other figure below (paired delta, view, benchmark figure) is likewise a ratio of
summed columns, or a mean of such ratios, with its interval from the same resamples: one
builder (`_Ratios`) makes them all. ``iterations`` has no default here: the number of
resamples is the run's setting (``--bootstrap``, whose default the options table holds), and
a second default in these signatures had drifted from it.

Paired delta (`PairedStat`), each reconstruction arm (every arm except the reference and
the "blind" arm) against the reference arm ("orig"). Computed over the questions that have
an outcome for both arms (``n_pairs``). Errors count as wrong on both sides, exactly as in the
accuracy, so ``delta`` is the difference of the two arms' accuracies on those questions,
in percentage points, recon minus reference (negative = reconstruction costs accuracy).
``n_errors`` counts pairs where either side failed; when it is not small the delta partly
measures the infrastructure, which is why ``delta_both_ok`` (over the ``n_both_ok`` pairs
where both sides answered) is given as a sensitivity check (point estimate only). The
interval is the same clustered bootstrap applied to the per-question difference.

McNemar's exact test on the discordant pairs: ``regressed`` = reference right and recon
wrong, ``improved`` = reference wrong and recon right (errors count as wrong), so
``delta = 100 * (improved - regressed) / n_pairs``. Under "no difference" each discordant pair
is equally likely to go either way, so ``regressed ~ Binomial(regressed + improved, 1/2)``;
the two-sided p-value is ``min(1, 2 * P(X <= min(regressed, improved)))`` (the
conventional exact conditional test, not the mid-p variant). It treats pairs as
independent and so ignores image clustering; read it next to the clustered interval.

Uniform-random reference (`ChanceStat`): the mean, over questions whose record gives a
``chance`` (1/number of options for multiple choice, 1/2 for yes/no), of the probability
that a uniformly random answer is right, with ``n_defined`` saying how many questions of
the group it covers (free-form and grounding questions have none).

Benchmark aggregate views (`BenchmarkStats.overall_accuracy`, ``average_accuracy``):
"overall accuracy" is question-weighted (each question once, = the overall accuracy
above); "average accuracy" is the unweighted mean of the per-type accuracies (RSVQA's AA,
VRSBench's mean over types). They are labelled by those names everywhere.

Extra views (`summarize_view`): any per-question number a report wants averaged per arm
and type (e.g. "binned" count accuracy, "acc@0.7" for grounding), with the same clustered
interval. A view's mean covers only the questions whose record carries that view for the
arm; the report code decides what value an error gets (normally 0) when it fills views.
`group_by` splits records by any key (e.g. uniqueness) so each part can be summarised.

Figures (`summarize_aggregate`): one number per arm over some question types, each
question credited by its type's verdict (the headline `correct`, or a per-question view such
as RSVQA's count classes), weighted by questions (an overall accuracy: credited / questions,
each question once) or by types (the unweighted mean of the covered types' accuracies, each
type over its own questions; types an arm has no question of are left out of its mean). The
interval is the same clustered bootstrap: the images that have a covered question are
resampled, with the fresh generator seeded with ``seed``, and the figure recomputed on each
resample (for a mean of types, a resample that happens to draw no question of some type
averages over the types it has). A question-weighted figure over every type with the
headline verdict is therefore exactly the overall accuracy and its interval. The paired delta
(percentage points, recon minus reference) is the same figure computed on the per-question
difference over the questions both arms have, with its interval from the same resamples.

Samples (`summarize_samples`, `--samples K`): each question asked K times per arm; a record
carries per arm its verdict over the K (`QuestionRecord.samples`, made by `core.verdict`).
Per arm and group: the mean-of-K accuracy (each question credited with the fraction of its K
samples that are correct, a sample without an answer making the whole question 0), the
majority-vote accuracy (each question credited 1 when its majority answer is correct; over
the questions where a majority is defined: boxes have none), the mean agreement (the share of
a question's samples that give its majority answer, over the questions where every sample
answered and a majority is defined), and the paired delta recon - reference on the
per-question mean-of-K (points). Every one is a ratio of summed per-question columns, so its
interval is the same clustered bootstrap by image from the same resamples (`_Ratios` takes
fractional credits as they are). The interval is for the benchmark's questions under the
model's sampling distribution: the K samples of a question share its image and question and
are resampled with them, never as independent observations. Under K > 1 every benchmark
figure (`summarize_aggregate`) reads each question's mean-of-K credit (`FigureInput.credit`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

import numpy as np

from pytest_satbench.core.arms import BLIND, ORIG

__all__ = [
    "ArmOutcome",
    "QuestionRecord",
    "AccuracyStat",
    "PairedStat",
    "ChanceStat",
    "ViewStat",
    "GroupStats",
    "BenchmarkStats",
    "ViewStats",
    "AggregateStat",
    "AggregatePaired",
    "AggregateStats",
    "cluster_bootstrap_ci",
    "paired_delta_ci",
    "mcnemar_exact",
    "summarize",
    "summarize_view",
    "summarize_aggregate",
    "FigureInput",
    "group_by",
    "SampleArmStat",
    "SampleGroup",
    "SampleStats",
    "summarize_samples",
]

_STATUSES = ("ok", "error")
# Resampled clusters per chunk: bounds memory (the index and weight matrices are
# chunk x clusters) while keeping numpy calls large enough to be fast.
_CHUNK_CELLS = 2_000_000


@dataclass(frozen=True, slots=True)
class ArmOutcome:
    """One question answered by one arm."""

    status: str  # "ok" | "error" (error = API/transport failure after retries)
    correct: bool  # False when status == "error"
    parsed: bool  # the answer could be interpreted
    truncated: bool = False  # finish_reason == "length"

    def __post_init__(self) -> None:
        if self.status not in _STATUSES:
            raise ValueError(f"ArmOutcome.status must be 'ok' or 'error', got {self.status!r}")
        if self.status == "error" and (self.correct or self.parsed):
            raise ValueError("ArmOutcome with status 'error' must have correct=False, parsed=False")
        if self.correct and not self.parsed:
            raise ValueError("ArmOutcome with correct=True must have parsed=True")


@dataclass(frozen=True, slots=True)
class QuestionRecord:
    """One question with its outcome per arm; the unit the statistics work on."""

    key: str
    image: str  # cluster id: questions on one image are resampled together
    types: tuple[str, ...]
    arms: Mapping[str, ArmOutcome]
    chance: float | None = None  # P(correct) of a uniformly random answer, if meaningful
    views: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # arm -> name -> value
    # --samples K > 1: arm -> its verdict over its K samples (a `core.verdict.SampleVerdict`:
    # `error`, `mean`, `majority_correct`, `agreement`, `value(view)`); empty under K = 1
    samples: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for arm, outcome in self.arms.items():
            if not isinstance(outcome, ArmOutcome):
                raise ValueError(
                    f"question {self.key!r}: arm {arm!r} is {type(outcome).__name__}, "
                    "expected ArmOutcome"
                )
        if self.chance is not None and not 0.0 <= self.chance <= 1.0:
            raise ValueError(f"question {self.key!r}: chance={self.chance} is not in [0, 1]")


@dataclass(frozen=True)
class AccuracyStat:
    """Accuracy of one arm on one group; see the module docstring for every field."""

    n: int
    correct: int
    accuracy: float  # fraction in [0, 1]; NaN when n == 0
    ci_low: float  # fraction; NaN when undefined
    ci_high: float
    errors: int
    truncated: int
    unparseable: int
    parsed: int
    coverage: float  # parsed / n
    missing: int  # group questions without an outcome for this arm (outside n)


@dataclass(frozen=True)
class PairedStat:
    """Recon arm minus reference arm on the questions both have; deltas in percentage points."""

    arm: str
    reference: str
    n_pairs: int  # questions with an outcome for both arms
    n_errors: int  # pairs where either side is an error (counted wrong, kept in n)
    delta: float  # percentage points, recon - reference, errors counted wrong
    ci_low: float  # percentage points
    ci_high: float
    regressed: int  # reference right, recon wrong
    improved: int  # reference wrong, recon right
    mcnemar_p: float
    n_both_ok: int
    delta_both_ok: float  # percentage points over pairs where neither side errored


@dataclass(frozen=True)
class ChanceStat:
    """Uniform-random reference accuracy over the questions where it is defined."""

    n_defined: int
    n: int
    accuracy: float  # fraction; NaN when n_defined == 0


@dataclass(frozen=True)
class GroupStats:
    """All statistics for one group of questions (the whole benchmark or one type)."""

    n: int  # distinct questions in the group
    n_images: int
    accuracy: dict[str, AccuracyStat]  # per arm
    paired: dict[str, PairedStat]  # per recon arm, against the reference arm
    chance: ChanceStat


@dataclass(frozen=True)
class BenchmarkStats:
    """Everything `summarize` computes; `to_dict()` gives plain JSON-ready builtins."""

    reference_arm: str
    arms: tuple[str, ...]
    recon_arms: tuple[str, ...]
    iterations: int
    seed: int
    level: float
    overall: GroupStats
    by_type: dict[str, GroupStats]
    # The benchmark's own aggregate views, per arm, fractions:
    overall_accuracy: dict[str, float]  # question-weighted (each question once)
    average_accuracy: dict[str, float]  # unweighted mean of the per-type accuracies

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = _jsonable(self)  # a dataclass becomes a dict
        return out


@dataclass(frozen=True)
class ViewStat:
    n: int  # questions carrying this view for the arm
    mean: float
    ci_low: float
    ci_high: float


@dataclass(frozen=True)
class ViewStats:
    """Mean of one named per-question view, per arm, overall and per type."""

    view: str
    overall: dict[str, ViewStat]
    by_type: dict[str, dict[str, ViewStat]]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = _jsonable(self)  # a dataclass becomes a dict
        return out


@dataclass(frozen=True)
class AggregateStat:
    """One figure for one arm: `value` is a fraction; n = questions it covers for the arm."""

    n: int
    value: float
    ci_low: float
    ci_high: float


@dataclass(frozen=True)
class AggregatePaired:
    """The figure recomputed on the per-question difference recon - reference (points)."""

    arm: str
    reference: str
    n_pairs: int
    delta: float
    ci_low: float
    ci_high: float


@dataclass(frozen=True)
class AggregateStats:
    """A figure per arm with its interval and paired delta, and its parts per type."""

    weighting: str  # "questions" | "types"
    types: tuple[str, ...]  # the covered types that have questions
    verdicts: dict[str, str | None]  # type -> view that decides it (None: the headline verdict)
    n: int  # distinct questions covered
    n_images: int
    accuracy: dict[str, AggregateStat]
    paired: dict[str, AggregatePaired]
    by_type: dict[str, dict[str, ViewStat]]  # per covered type and arm: n, mean credit (no interval)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = _jsonable(self)  # a dataclass becomes a dict
        return out


def _jsonable(obj: Any) -> Any:
    # JSON has no NaN: undefined values become null.
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        v = float(obj)
        return None if math.isnan(v) or math.isinf(v) else v
    return obj


# --------------------------------------------------------------------------- bootstrap


def _resampled_sums(sums: np.ndarray, iterations: int, seed: int) -> np.ndarray:
    """Column sums of `sums` (clusters x k) over `iterations` cluster resamples.

    Each resample draws n_clusters cluster indices with replacement; instead of gathering
    rows we count how often each cluster was drawn (bincount over a flattened chunk) and
    multiply that weight matrix with the per-cluster sums, so the cost per resample is
    O(n_clusters), independent of the number of questions.
    """
    n_clusters = sums.shape[0]
    out = np.empty((iterations, sums.shape[1]), dtype=np.float64)
    for start, weights in _resample_weights(n_clusters, iterations, seed):
        out[start : start + weights.shape[0]] = weights.astype(np.float64) @ sums
    return out


def _resample_weights(n_clusters: int, iterations: int, seed: int) -> list[tuple[int, np.ndarray]]:
    """How often each cluster is drawn in each resample, by chunk of resamples: (first
    resample, chunk x clusters counts). The draws depend only on (clusters, iterations,
    seed), and every group of a benchmark with the same number of images (the overall
    figures, each type present on every image, each view, each figure) draws the same ones:
    they are made once (the most recent few kept) instead of once per group, which was
    most of the statistics' time at RSVQA-HR size."""
    key = (n_clusters, iterations, seed)
    got = _WEIGHTS.pop(key, None)
    if got is None:
        rng = np.random.default_rng(seed)
        # counts fit the smallest unsigned type that holds n_clusters (a count is at most that)
        dtype = np.uint8 if n_clusters <= 0xFF else np.uint16 if n_clusters <= 0xFFFF else np.uint32
        chunk = max(1, min(iterations, _CHUNK_CELLS // max(n_clusters, 1)))
        got = []
        for start in range(0, iterations, chunk):
            m = min(chunk, iterations - start)
            idx = rng.integers(0, n_clusters, size=(m, n_clusters))
            idx += (np.arange(m) * n_clusters)[:, None]
            weights = np.bincount(idx.ravel(), minlength=m * n_clusters).reshape(m, n_clusters)
            got.append((start, weights.astype(dtype)))
    if sum(w.nbytes for _, w in got) <= _WEIGHTS_MAX_BYTES:
        _WEIGHTS[key] = got  # most recent last
        while len(_WEIGHTS) > _WEIGHTS_KEPT:
            del _WEIGHTS[next(iter(_WEIGHTS))]
    return got


# (clusters, iterations, seed) -> resample weights; 1000 resamples of 11k images are 22 MB.
# Larger ones (many more resamples) are drawn again per group rather than kept.
_WEIGHTS: dict[tuple[int, int, int], list[tuple[int, np.ndarray]]] = {}
_WEIGHTS_KEPT = 2
_WEIGHTS_MAX_BYTES = 48 * 2**20


def _check_level(level: float, iterations: int) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if iterations < 0:
        raise ValueError(f"iterations must be >= 0, got {iterations}")


def _cluster_codes(clusters: np.ndarray) -> tuple[np.ndarray, int]:
    # np.unique sorts, so the cluster numbering (and hence the random draws) does not
    # depend on record order.
    _, codes = np.unique(np.asarray(clusters), return_inverse=True)
    codes = codes.ravel()
    return codes, int(codes.max()) + 1 if codes.size else 0


class _Ratios:
    """How every figure here is built, so that an accuracy, a view, a paired delta and a
    benchmark figure cannot drift apart in how they are estimated: per-question columns of a
    numerator and a denominator, clustered by image; the figure is the ratio of a pair's sums
    (an accuracy: credit over the questions an arm has; a paired delta: difference over the
    pairs), or the unweighted mean of several such ratios (a mean over types), and its
    interval is that same figure recomputed on each cluster resample.

    All ratios of one group go into one builder so that one set of resamples serves them
    all: every arm and every paired delta of a group is computed on the same draws, and the
    per-cluster sums are made once for all of them (`_resampled_sums`)."""

    def __init__(self, clusters: np.ndarray) -> None:
        self.codes, self.n_clusters = _cluster_codes(clusters)
        self._cols: list[np.ndarray] = []
        self._totals = np.zeros(0)
        self._boot: np.ndarray | None = None

    def ratio(self, numerator: np.ndarray, denominator: np.ndarray) -> int:
        """Add one ratio's per-question columns (the numerator is 0 wherever the denominator
        is 0, so a question outside the ratio adds nothing to either sum); returns the handle
        that names it in `value` and `interval`."""
        self._cols += [np.asarray(numerator, dtype=np.float64), np.asarray(denominator, dtype=np.float64)]
        return len(self._cols) - 2

    def resample(self, iterations: int, seed: int) -> _Ratios:
        """Sum every column, and again in each of `iterations` cluster resamples drawn with
        `seed` (none with fewer than two clusters, with iterations=0 or with no column: the
        interval is then undefined). Call once, after the last `ratio`."""
        cols = self._cols
        # column by column: numpy sums a contiguous vector pairwise, as `mean` does
        self._totals = np.array([c.sum() for c in cols], dtype=np.float64)
        if cols and self.n_clusters >= 2 and iterations > 0:
            # per-cluster sums once; every resample then works on clusters, not questions
            sums = np.stack([np.bincount(self.codes, weights=c, minlength=self.n_clusters) for c in cols], axis=1)
            self._boot = _resampled_sums(sums, iterations, seed)
        return self

    def value(self, ratios: Sequence[int]) -> float:
        """The point estimate: the mean of the `ratios` over the whole group (NaN when none
        has a question)."""
        return float(_mean_of_ratios(self._totals, ratios))

    def interval(self, ratios: Sequence[int], level: float, scale: float = 1.0) -> tuple[float, float]:
        """Percentile interval of the same figure over the resamples, times `scale`;
        resamples where it is undefined (no question of it drawn) are left out."""
        if self._boot is None:
            return (math.nan, math.nan)
        values = _mean_of_ratios(self._boot, ratios)
        values = values[np.isfinite(values)]
        if values.size == 0:
            return (math.nan, math.nan)
        alpha = (1.0 - level) / 2.0
        lo, hi = np.quantile(values, [alpha, 1.0 - alpha])
        return (float(lo) * scale, float(hi) * scale)


def _mean_of_ratios(sums: np.ndarray, ratios: Sequence[int]) -> np.ndarray:
    """The unweighted mean of the defined ratios sum[j] / sum[j + 1], j in `ratios`, from
    column sums: one row (the totals) or one per resample."""
    parts = []
    for j in ratios:
        num, den = sums[..., j], sums[..., j + 1]
        parts.append(np.divide(num, den, out=np.full(np.shape(num), math.nan), where=den > 0))
    stacked = np.stack(parts, axis=-1)
    defined = ~np.isnan(stacked)
    count = defined.sum(axis=-1)
    total = np.where(defined, stacked, 0.0).sum(axis=-1)
    mean: np.ndarray = np.divide(total, count, out=np.full(np.shape(total), math.nan), where=count > 0)
    return mean


def cluster_bootstrap_ci(
    correct: np.ndarray,
    clusters: np.ndarray,
    *,
    iterations: int,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile interval for mean(correct), resampling whole clusters with replacement.

    `correct` may be booleans or any numbers (a view's values); `clusters` holds one cluster
    id per element. Returns (NaN, NaN) with fewer than two clusters or iterations == 0.
    """
    _check_level(level, iterations)
    values = np.asarray(correct, dtype=np.float64).ravel()
    clusters = np.asarray(clusters).ravel()
    if values.size != clusters.size:
        raise ValueError(
            f"cluster_bootstrap_ci: {values.size} values but {clusters.size} cluster ids"
        )
    if values.size == 0:
        raise ValueError("cluster_bootstrap_ci: no values")
    ratios = _Ratios(clusters)
    mean = ratios.ratio(values, np.ones_like(values))
    return ratios.resample(iterations, seed).interval([mean], level)


def paired_delta_ci(
    a: np.ndarray,
    b: np.ndarray,
    clusters: np.ndarray,
    *,
    iterations: int,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Clustered-bootstrap interval for mean(b - a), as a fraction (not percentage points)."""
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    if a.size != b.size:
        raise ValueError(f"paired_delta_ci: a has {a.size} values, b has {b.size}")
    return cluster_bootstrap_ci(b - a, clusters, iterations=iterations, seed=seed, level=level)


# --------------------------------------------------------------------------- McNemar


def _log_binom_pmf_half(k: int, n: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - n * math.log(2.0)


def mcnemar_exact(regressed: int, improved: int) -> float:
    """Two-sided exact McNemar p-value: min(1, 2 * P(X <= min(b, c))), X ~ Bin(b + c, 1/2).

    Conventional exact conditional test (no mid-p). p = 1 when both counts are 0.
    Stable for large n (hundreds of thousands of discordant pairs): the lower tail is
    P(X = m) * (1 + r_1 + r_1 r_2 + ...), with P(X = m) from log-gamma and the ratios
    r_j = P(X = m - j) / P(X = m - j + 1) < 1; terms shrink geometrically once past the
    mode, so the sum stops after a few thousand terms at most.
    """
    for name, v in (("regressed", regressed), ("improved", improved)):
        if int(v) != v or v < 0:
            raise ValueError(f"mcnemar_exact: {name} must be a non-negative integer, got {v!r}")
    b, c = int(regressed), int(improved)
    n = b + c
    m = min(b, c)
    if 2 * m >= n:  # b == c (including 0, 0): the tail holds at least half the mass
        return 1.0
    log_pm = _log_binom_pmf_half(m, n)
    total, term = 1.0, 1.0
    k = m
    while k > 0:
        term *= k / (n - k + 1)  # P(X = k-1) / P(X = k)
        total += term
        if term < 1e-17 * total:
            break
        k -= 1
    log_tail = log_pm + math.log(total)
    return min(1.0, 2.0 * math.exp(log_tail))


# --------------------------------------------------------------------------- summarize


def _order_arms(seen: Iterable[str], reference: str, blind: str) -> tuple[str, ...]:
    arms = set(seen)
    middle = sorted(a for a in arms if a not in (reference, blind))
    head = [reference] if reference in arms else []
    tail = [blind] if blind in arms else []
    return tuple(head + middle + tail)


@dataclass
class _ArmArrays:
    present: np.ndarray
    correct: np.ndarray
    error: np.ndarray
    parsed: np.ndarray
    truncated: np.ndarray


def _arm_arrays(records: Sequence[QuestionRecord], arm: str) -> _ArmArrays:
    n = len(records)
    # one pass numbering the distinct outcome objects (records made by core.results share
    # them: a handful per run), then every flag is a lookup in that small table
    number: dict[int, int] = {id(None): 0}
    kinds: list[ArmOutcome | None] = [None]

    def code(o: ArmOutcome | None) -> int:
        k = number.get(id(o))
        if k is None:
            k = number[id(o)] = len(kinds)
            kinds.append(o)
        return k

    codes = np.fromiter(map(code, [r.arms.get(arm) for r in records]), dtype=np.intp, count=n)

    def flag(fn: Callable[[ArmOutcome], bool]) -> np.ndarray:
        return np.array([o is not None and fn(o) for o in kinds], dtype=bool)[codes]

    return _ArmArrays(
        present=np.array([o is not None for o in kinds], dtype=bool)[codes],
        correct=flag(lambda o: o.correct),
        error=flag(lambda o: o.status == "error"),
        parsed=flag(lambda o: o.parsed),
        truncated=flag(lambda o: o.truncated),
    )


def _group_stats(
    idx: np.ndarray,
    codes_all: np.ndarray,
    arms: tuple[str, ...],
    recon: tuple[str, ...],
    reference: str,
    data: dict[str, _ArmArrays],
    chance: np.ndarray,
    iterations: int,
    seed: int,
    level: float,
) -> GroupStats:
    ratios = _Ratios(codes_all[idx])
    acc = {arm: ratios.ratio(data[arm].correct[idx], data[arm].present[idx]) for arm in arms}
    pairs = [a for a in recon if reference in data]
    delta: dict[str, int] = {}
    for arm in pairs:
        ref, rec = data[reference], data[arm]
        both = ref.present[idx] & rec.present[idx]
        diff = rec.correct[idx].astype(np.int8) - ref.correct[idx].astype(np.int8)
        delta[arm] = ratios.ratio(np.where(both, diff, 0), both)
    ratios.resample(iterations, seed)

    accuracy: dict[str, AccuracyStat] = {}
    for arm in arms:
        d = data[arm]
        present = d.present[idx]
        n = int(present.sum())
        correct = int(d.correct[idx].sum())
        parsed = int(d.parsed[idx].sum())
        errors = int(d.error[idx].sum())
        ok = present & ~d.error[idx]
        lo, hi = ratios.interval([acc[arm]], level) if n else (math.nan, math.nan)
        accuracy[arm] = AccuracyStat(
            n=n,
            correct=correct,
            accuracy=correct / n if n else math.nan,
            ci_low=lo,
            ci_high=hi,
            errors=errors,
            truncated=int((ok & d.truncated[idx]).sum()),
            unparseable=int((ok & ~d.parsed[idx]).sum()),
            parsed=parsed,
            coverage=parsed / n if n else math.nan,
            missing=int(idx.size - n),
        )

    paired: dict[str, PairedStat] = {}
    for arm in pairs:
        ref, rec = data[reference], data[arm]
        both = ref.present[idx] & rec.present[idx]
        n = int(both.sum())
        if n == 0:
            continue
        rc, cc = ref.correct[idx] & both, rec.correct[idx] & both
        regressed = int((rc & ~cc).sum())
        improved = int((~rc & cc).sum())
        any_err = both & (ref.error[idx] | rec.error[idx])
        both_ok = both & ~any_err
        n_ok = int(both_ok.sum())
        d_ok = int((rec.correct[idx] & both_ok).sum()) - int((ref.correct[idx] & both_ok).sum())
        lo, hi = ratios.interval([delta[arm]], level, 100.0)
        paired[arm] = PairedStat(
            arm=arm,
            reference=reference,
            n_pairs=n,
            n_errors=int(any_err.sum()),
            delta=100.0 * (improved - regressed) / n,
            ci_low=lo,
            ci_high=hi,
            regressed=regressed,
            improved=improved,
            mcnemar_p=mcnemar_exact(regressed, improved),
            n_both_ok=n_ok,
            delta_both_ok=100.0 * d_ok / n_ok if n_ok else math.nan,
        )

    ch = chance[idx]
    defined = ~np.isnan(ch)
    n_def = int(defined.sum())
    chance_stat = ChanceStat(
        n_defined=n_def,
        n=int(idx.size),
        accuracy=float(ch[defined].mean()) if n_def else math.nan,
    )
    return GroupStats(
        n=int(idx.size),
        n_images=ratios.n_clusters,
        accuracy=accuracy,
        paired=paired,
        chance=chance_stat,
    )


def _index(records: Sequence[QuestionRecord]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Image codes per record and record indices per type (each type once per record)."""
    if not records:
        raise ValueError("no question records to summarise")
    seen: set[str] = set()
    by_type: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        if r.key in seen:
            raise ValueError(f"question {r.key!r} appears twice; each question must appear once")
        seen.add(r.key)
        for t in dict.fromkeys(r.types):
            by_type.setdefault(t, []).append(i)
    # Number images in sorted order (as np.unique would) without sorting 200k strings.
    names = sorted({r.image for r in records})
    pos = {name: i for i, name in enumerate(names)}
    codes = np.fromiter((pos[r.image] for r in records), dtype=np.intp, count=len(records))
    return codes, {t: np.asarray(by_type[t], dtype=np.intp) for t in sorted(by_type)}


def summarize(
    records: Sequence[QuestionRecord],
    *,
    reference_arm: str = ORIG,
    blind_arm: str = BLIND,
    iterations: int,
    seed: int = 0,
    level: float = 0.95,
    prepared: FigureInput | None = None,
) -> BenchmarkStats:
    """Accuracy, paired deltas, coverage and chance for one benchmark, overall and per type.
    `prepared`: `FigureInput(records)` of these same records, when the caller has it (the
    image codes and type index are made once for every summary of a benchmark)."""
    _check_level(level, iterations)
    codes, type_idx = (prepared.codes, prepared.type_idx) if prepared is not None else _index(records)
    arms = _order_arms((a for r in records for a in r.arms), reference_arm, blind_arm)
    recon = tuple(a for a in arms if a not in (reference_arm, blind_arm))
    data = {arm: _arm_arrays(records, arm) for arm in arms}
    chance = np.array(
        [math.nan if r.chance is None else r.chance for r in records], dtype=np.float64
    )

    def group(idx: np.ndarray) -> GroupStats:
        return _group_stats(
            idx, codes, arms, recon, reference_arm, data, chance, iterations, seed, level
        )

    overall = group(np.arange(len(records), dtype=np.intp))
    by_type = {t: group(ix) for t, ix in type_idx.items()}
    average: dict[str, float] = {}
    for arm in arms:
        accs = [g.accuracy[arm].accuracy for g in by_type.values() if g.accuracy[arm].n]
        average[arm] = float(np.mean(accs)) if accs else math.nan
    return BenchmarkStats(
        reference_arm=reference_arm,
        arms=arms,
        recon_arms=recon,
        iterations=iterations,
        seed=seed,
        level=level,
        overall=overall,
        by_type=by_type,
        overall_accuracy={arm: overall.accuracy[arm].accuracy for arm in arms},
        average_accuracy=average,
    )


def summarize_view(
    records: Sequence[QuestionRecord],
    view: str,
    *,
    iterations: int,
    seed: int = 0,
    level: float = 0.95,
    prepared: FigureInput | None = None,
) -> ViewStats:
    """Mean of the per-question value `views[arm][view]`, per arm, overall and per type
    (`prepared` as for `summarize`)."""
    _check_level(level, iterations)
    codes, type_idx = (prepared.codes, prepared.type_idx) if prepared is not None else _index(records)
    arms = sorted({a for r in records for a, v in r.views.items() if view in v})
    values = {arm: np.full(len(records), math.nan) for arm in arms}
    for i, r in enumerate(records):
        for arm, v in r.views.items():
            if view in v:
                values[arm][i] = float(v[view])

    def group(idx: np.ndarray) -> dict[str, ViewStat]:
        ratios = _Ratios(codes[idx])
        counts: dict[str, int] = {}
        mean: dict[str, int] = {}
        for arm in arms:
            x = values[arm][idx]
            has = ~np.isnan(x)
            counts[arm] = int(has.sum())
            mean[arm] = ratios.ratio(np.where(has, x, 0.0), has)
        ratios.resample(iterations, seed)
        out: dict[str, ViewStat] = {}
        for arm in arms:
            if counts[arm]:
                lo, hi = ratios.interval([mean[arm]], level)
                out[arm] = ViewStat(n=counts[arm], mean=ratios.value([mean[arm]]), ci_low=lo, ci_high=hi)
        return out

    return ViewStats(
        view=view,
        overall=group(np.arange(len(records), dtype=np.intp)),
        by_type={t: group(ix) for t, ix in type_idx.items()},
    )


class FigureInput:
    """What every figure of one benchmark reads, computed once and shared: the records'
    image codes and type index, the arms, and per (arm, view) the per-question credit
    (`summarize_aggregate(..., prepared=FigureInput(records))`)."""

    def __init__(self, records: Sequence[QuestionRecord], reference_arm: str = ORIG, blind_arm: str = BLIND) -> None:
        self.records = records
        self.codes, self.type_idx = _index(records)
        self.arms = _order_arms((a for r in records for a in r.arms), reference_arm, blind_arm)
        self._credit: dict[tuple[str, str | None], np.ndarray] = {}

    def credit(self, arm: str, view: str | None) -> np.ndarray:
        """What each record earns for `arm` under `view` (None: the headline verdict); NaN
        where the arm has no outcome. An absent view value counts 0, as an empty answer does.
        Under --samples K (records carry `samples`) the credit is the question's mean over its
        K samples."""
        got = self._credit.get((arm, view))
        if got is None:
            records = self.records
            outs = [r.arms.get(arm) for r in records]
            if any(arm in r.samples for r in records):  # --samples K: each question's mean-of-K
                it = (math.nan if o is None else float(r.samples[arm].value(view)) if arm in r.samples
                      else 0.0 if view is not None else float(o.correct) for o, r in zip(outs, records))
            elif view is None:
                it = (math.nan if o is None else float(o.correct) for o in outs)
            else:
                it = (math.nan if o is None else float(r.views.get(arm, {}).get(view, 0.0))
                      for o, r in zip(outs, records))
            got = self._credit[arm, view] = np.fromiter(it, dtype=np.float64, count=len(records))
        return got


def summarize_aggregate(
    records: Sequence[QuestionRecord],
    *,
    weighting: str,
    types: Sequence[str] = (),
    verdict: Callable[[str], str | None] = lambda qtype: None,
    reference_arm: str = ORIG,
    blind_arm: str = BLIND,
    iterations: int,
    seed: int = 0,
    level: float = 0.95,
    prepared: FigureInput | None = None,
) -> AggregateStats:
    """One figure (see the module docstring): over `types` (empty: every type), each type
    decided by the view `verdict(type)` (None: the headline verdict), weighted by
    "questions" or by "types". `prepared`: `FigureInput(records)` of these same records,
    shared by the figures of one benchmark so the per-question work is done once."""
    _check_level(level, iterations)
    if weighting not in ("questions", "types"):
        raise ValueError(f"weighting must be 'questions' or 'types', got {weighting!r}")
    inp = prepared if prepared is not None else FigureInput(records, reference_arm, blind_arm)
    records = inp.records
    codes_all, type_idx, arms = inp.codes, inp.type_idx, inp.arms
    covered = [t for t in (dict.fromkeys(types) if types else type_idx) if t in type_idx]
    views = {t: verdict(t) for t in covered}
    pairs = [a for a in arms if a not in (reference_arm, blind_arm)] if reference_arm in arms else []
    n_all = len(records)

    in_type = {t: np.zeros(n_all, dtype=bool) for t in covered}
    for t in covered:
        in_type[t][type_idx[t]] = True
    # a question-weighted figure over every type covers every question, those without a
    # type too (they count in the overall figure and in no type's); else the questions of
    # the covered types
    everything = weighting == "questions" and not types
    covered_mask = np.ones(n_all, dtype=bool) if everything else np.zeros(n_all, dtype=bool)
    for t in covered:
        covered_mask |= in_type[t]
    rows = np.flatnonzero(covered_mask)
    member = {t: in_type[t][rows] for t in covered}

    # the parts a figure is made of: the whole ("questions", each question decided by the
    # first covered type it has; a question without a type by verdict("")) or each type
    order = {t: k for k, t in enumerate(covered)}
    deciders = [*covered, ""]
    decider = np.full(rows.size, len(covered), dtype=np.intp)
    if weighting == "questions":
        for j, i in enumerate(rows.tolist()):
            decider[j] = next((order[t] for t in records[i].types if t in order), len(covered))
    decider_views = {k: (views[t] if t else verdict("")) for k, t in enumerate(deciders)}
    needed = set(views.values()) | ({decider_views[len(covered)]} if weighting == "questions" else set())
    base = {(arm, v): inp.credit(arm, v)[rows] for arm in arms for v in needed}
    parts: dict[str, dict[str, np.ndarray]] = {}  # part -> arm -> credit (NaN: not in it)
    if weighting == "questions":
        parts[""] = {}
        for arm in arms:
            x = np.full(rows.size, math.nan)
            for k, v in decider_views.items():
                m = decider == k
                x[m] = base[arm, v][m]
            parts[""][arm] = x
    else:
        for t in covered:
            parts[t] = {arm: np.where(member[t], base[arm, views[t]], math.nan) for arm in arms}

    ratios = _Ratios(codes_all[rows])
    acc: dict[str, list[int]] = {arm: [] for arm in arms}  # arm -> its ratio per part
    delta: dict[str, list[int]] = {arm: [] for arm in pairs}
    for by_arm in parts.values():
        for arm in arms:
            x = by_arm[arm]
            has = ~np.isnan(x)
            acc[arm].append(ratios.ratio(np.where(has, x, 0.0), has))
        for arm in pairs:
            a, b = by_arm[reference_arm], by_arm[arm]
            both = ~np.isnan(a) & ~np.isnan(b)
            delta[arm].append(ratios.ratio(np.where(both, b - a, 0.0), both))
    ratios.resample(iterations, seed)

    accuracy: dict[str, AggregateStat] = {}
    by_type: dict[str, dict[str, ViewStat]] = {t: {} for t in covered}
    for arm in arms:
        present = np.zeros(rows.size, dtype=bool)
        for by_arm in parts.values():
            present |= ~np.isnan(by_arm[arm])
        if not present.any():
            continue
        lo, hi = ratios.interval(acc[arm], level)
        accuracy[arm] = AggregateStat(n=int(present.sum()), value=ratios.value(acc[arm]), ci_low=lo, ci_high=hi)
        for t in covered:
            # a type's part: its questions' credit under its own verdict
            x = base[arm, views[t]][member[t]]
            x = x[~np.isnan(x)]
            if x.size:
                by_type[t][arm] = ViewStat(n=int(x.size), mean=float(x.mean()), ci_low=math.nan, ci_high=math.nan)

    paired: dict[str, AggregatePaired] = {}
    for arm in pairs:
        both = np.zeros(rows.size, dtype=bool)
        for by_arm in parts.values():
            both |= ~np.isnan(by_arm[reference_arm]) & ~np.isnan(by_arm[arm])
        if not both.any():
            continue
        lo, hi = ratios.interval(delta[arm], level, 100.0)
        paired[arm] = AggregatePaired(arm=arm, reference=reference_arm, n_pairs=int(both.sum()),
                                      delta=100.0 * ratios.value(delta[arm]), ci_low=lo, ci_high=hi)
    return AggregateStats(
        weighting=weighting, types=tuple(covered), verdicts=views, n=int(rows.size), n_images=ratios.n_clusters,
        accuracy=accuracy, paired=paired, by_type=by_type,
    )


def group_by(
    records: Iterable[QuestionRecord], key: Callable[[QuestionRecord], str | None]
) -> dict[str, list[QuestionRecord]]:
    """Split records by `key(record)` (keys sorted); records whose key is None are left out."""
    out: dict[str, list[QuestionRecord]] = {}
    for r in records:
        k = key(r)
        if k is not None:
            out.setdefault(str(k), []).append(r)
    return {k: out[k] for k in sorted(out)}


# --------------------------------------------------------------------------- samples


@dataclass(frozen=True)
class SampleArmStat:
    """One arm's figures over its K samples per question (module docstring, "Samples");
    fractions, intervals clustered by image."""

    n: int  # questions with the arm's samples
    errors: int  # of them, questions where some sample has no answer (credited 0)
    mean: float  # mean-of-K accuracy
    ci_low: float
    ci_high: float
    majority_n: int  # questions where a majority answer is defined (not boxes), errors included
    majority: float  # majority-vote accuracy over those
    majority_ci_low: float
    majority_ci_high: float
    agreement_n: int  # questions with every sample answered and a majority defined
    agreement: float  # mean share of a question's samples giving its majority answer
    agreement_ci_low: float
    agreement_ci_high: float


@dataclass(frozen=True)
class SampleGroup:
    n: int
    n_images: int
    arms: dict[str, SampleArmStat]
    paired: dict[str, AggregatePaired]  # recon - reference on the per-question mean-of-K


@dataclass(frozen=True)
class SampleStats:
    """`summarize_samples`: K, and the sample figures overall and per type."""

    k: int
    reference_arm: str
    arms: tuple[str, ...]
    overall: SampleGroup
    by_type: dict[str, SampleGroup]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = _jsonable(self)  # a dataclass becomes a dict
        return out


def summarize_samples(
    records: Sequence[QuestionRecord],
    *,
    reference_arm: str = ORIG,
    blind_arm: str = BLIND,
    iterations: int,
    seed: int = 0,
    level: float = 0.95,
    prepared: FigureInput | None = None,
) -> SampleStats | None:
    """The --samples figures per arm, overall and per type (module docstring, "Samples");
    None when no record carries samples (K = 1)."""
    _check_level(level, iterations)
    arms = _order_arms((a for r in records for a in r.samples), reference_arm, blind_arm)
    if not arms:
        return None
    codes, type_idx = (prepared.codes, prepared.type_idx) if prepared is not None else _index(records)
    k = max(v.k for r in records for v in r.samples.values())
    n_all = len(records)
    cols: dict[str, dict[str, np.ndarray]] = {}
    for arm in arms:
        has = np.zeros(n_all, dtype=bool)
        err, mean = np.zeros(n_all, dtype=bool), np.zeros(n_all)
        maj_has, maj = np.zeros(n_all, dtype=bool), np.zeros(n_all)
        agr_has, agr = np.zeros(n_all, dtype=bool), np.zeros(n_all)
        for i, r in enumerate(records):
            v = r.samples.get(arm)
            if v is None:
                continue
            has[i], err[i], mean[i] = True, v.error, v.mean
            if v.majority_correct is not None:  # None: no majority for the kind (boxes)
                maj_has[i], maj[i] = True, float(v.majority_correct)
            if v.agreement is not None:
                agr_has[i], agr[i] = True, v.agreement
        cols[arm] = {"has": has, "err": err, "mean": mean, "maj_has": maj_has, "maj": maj,
                     "agr_has": agr_has, "agr": agr}
    pairs = [a for a in arms if a not in (reference_arm, blind_arm)] if reference_arm in arms else []

    def group(idx: np.ndarray) -> SampleGroup:
        ratios = _Ratios(codes[idx])
        h: dict[str, tuple[int, int, int]] = {}
        for arm in arms:
            c = {name: col[idx] for name, col in cols[arm].items()}
            h[arm] = (ratios.ratio(np.where(c["has"], c["mean"], 0.0), c["has"]),
                      ratios.ratio(np.where(c["maj_has"], c["maj"], 0.0), c["maj_has"]),
                      ratios.ratio(np.where(c["agr_has"], c["agr"], 0.0), c["agr_has"]))
        d: dict[str, int] = {}
        for arm in pairs:
            both = cols[arm]["has"][idx] & cols[reference_arm]["has"][idx]
            diff = cols[arm]["mean"][idx] - cols[reference_arm]["mean"][idx]
            d[arm] = ratios.ratio(np.where(both, diff, 0.0), both)
        ratios.resample(iterations, seed)
        out: dict[str, SampleArmStat] = {}
        for arm in arms:
            c = {name: col[idx] for name, col in cols[arm].items()}
            n = int(c["has"].sum())
            if not n:
                continue
            (mlo, mhi), (jlo, jhi), (alo, ahi) = (ratios.interval([j], level) for j in h[arm])
            out[arm] = SampleArmStat(
                n=n, errors=int(c["err"].sum()), mean=ratios.value([h[arm][0]]), ci_low=mlo, ci_high=mhi,
                majority_n=int(c["maj_has"].sum()), majority=ratios.value([h[arm][1]]),
                majority_ci_low=jlo, majority_ci_high=jhi,
                agreement_n=int(c["agr_has"].sum()), agreement=ratios.value([h[arm][2]]),
                agreement_ci_low=alo, agreement_ci_high=ahi)
        paired: dict[str, AggregatePaired] = {}
        for arm in pairs:
            n = int((cols[arm]["has"][idx] & cols[reference_arm]["has"][idx]).sum())
            if n:
                lo, hi = ratios.interval([d[arm]], level, 100.0)
                paired[arm] = AggregatePaired(arm, reference_arm, n, 100.0 * ratios.value([d[arm]]), lo, hi)
        return SampleGroup(n=int(idx.size), n_images=ratios.n_clusters, arms=out, paired=paired)

    return SampleStats(k=k, reference_arm=reference_arm, arms=arms,
                       overall=group(np.arange(n_all, dtype=np.intp)),
                       by_type={t: group(ix) for t, ix in type_idx.items()})

