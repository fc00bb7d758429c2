"""Paired comparisons of two sides (a tag's arm against another tag's arm, or two arms of one
tag): the pairing, the tests and their multiplicity correction. Pure: no I/O.

What is paired
--------------

A side is one arm of one tag, read as that tag's report reads it (`report.compare` collects
each side's `QuestionResult`s through `core.results.benchmark_results`, the one route from
stored rows to numbers, and turns each question into a `SideAnswer`). Questions are paired by
their identity, (benchmark, question key), not by pytest node id: two runs with another prompt
style or another test file still pair. A question only one side has (or whose arm one side
never asked) is left out of every figure and counted (`Pairing.only_a`, `only_b`).

Each pair becomes one `stats.QuestionRecord` with two arms, `A` (the reference) and `B`,
so every number of the comparison comes from the project's own statistics: per question type
and overall `stats.summarize` (accuracy of each side with its interval, the paired delta
B - A in points with its interval from a bootstrap clustered by image, the discordant counts
and the exact McNemar p), per figure the benchmark declares `stats.summarize_aggregate`
(the figure's value on each side and its paired delta). Over the same questions the numbers
of a side are its own report's, intervals included (the same resamples: the draws depend
only on the images, the resamples and the seed).

Discordant counts: ``b`` = A right and B wrong, ``c`` = A wrong and B right (errors count as
wrong, as everywhere). McNemar's exact test (McNemar 1947, *Psychometrika* 12:153-157; the
exact conditional form: under H0 ``b ~ Bin(b + c, 1/2)``) is `stats.mcnemar_exact`. It
treats pairs as independent and so ignores the clustering by image: read it next to the
clustered interval of the delta. A figure gets a test when it is one paired proportion (a
question-weighted figure whose per-question credits are all 0 or 1): its ``b`` and ``c`` are
counted on the figure's own verdicts (`figure_credits`). A mean of types or a figure of
fractional credits (IoU) has no McNemar test; its interval is the evidence. A figure that
is, by construction, the overall row (question-weighted over every type with the headline
verdict) is not tested twice (`ComparisonRow.same_as`).

Many tests, one comparison
--------------------------

A table of one comparison holds a test per type, overall and per figure: at 5% each, some
come out "significant" by chance alone. Every p here is also given Holm-adjusted over all the
tests of that comparison (Holm 1979, "A simple sequentially rejective multiple test
procedure", *Scand. J. Statist.* 6:65-70): it controls the family-wise error rate under any
dependence between the tests (these are dependent: overall contains every type), needs no
assumption Bonferroni does not, and rejects at least what Bonferroni rejects.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_satbench.core.labels import Aggregate
from pytest_satbench.core.stats import (
    AggregateStats,
    ArmOutcome,
    GroupStats,
    QuestionRecord,
    mcnemar_exact,
    summarize,
    summarize_aggregate,
)

__all__ = [
    "ARM_A", "ARM_B", "ClusterVariance", "Comparison", "ComparisonRow", "Pairing", "SideAnswer", "cluster_variance",
    "compare", "figure_credits", "holm", "images_for_detect", "images_for_width", "interval_width", "pair",
]

ARM_A, ARM_B = "A", "B"  # the two sides as arms of the paired records (A is the reference)
_NO_BLIND = "\x00"  # no third arm: nothing is named so


@dataclass(frozen=True, slots=True)
class SideAnswer:
    """One question as one side answered it: what the statistics read (outcome, views) and
    what a reader is shown (question, ground truth, the answer)."""

    key: str
    image: str  # the cluster: questions about one image are resampled together
    types: tuple[str, ...]  # reported types
    outcome: ArmOutcome
    views: Mapping[str, float] = field(default_factory=dict)
    chance: float | None = None
    question: str = ""
    truth: str = ""
    answer: str = ""  # the raw reply, or the error for an error row
    image_path: str | None = None  # the source image (None: embedded in the dataset)
    sent_sha256: str | None = None  # of the bytes this side sent (a reconstruction is found by it)


@dataclass(frozen=True, slots=True)
class Pairing:
    """The questions both sides have, as two-arm records, and what was left out."""

    records: tuple[QuestionRecord, ...]
    a: tuple[SideAnswer, ...]  # in the order of `records`
    b: tuple[SideAnswer, ...]
    only_a: int
    only_b: int


def pair(a: Iterable[SideAnswer], b: Iterable[SideAnswer]) -> Pairing:
    """Pair two sides' answers by question key (the benchmark is the caller's: one pairing per
    benchmark). The image and types are A's (the same question has the same ones). Records
    come in A's order, so the result never depends on B's order."""
    by_key = {s.key: s for s in b}
    records: list[QuestionRecord] = []
    left: list[SideAnswer] = []
    right: list[SideAnswer] = []
    only_a = 0
    seen: set[str] = set()
    for x in a:
        if x.key in seen:
            raise ValueError(f"question {x.key!r} appears twice on one side")
        seen.add(x.key)
        y = by_key.get(x.key)
        if y is None:
            only_a += 1
            continue
        records.append(QuestionRecord(
            x.key, x.image, x.types, {ARM_A: x.outcome, ARM_B: y.outcome}, x.chance,
            {ARM_A: dict(x.views), ARM_B: dict(y.views)}))
        left.append(x)
        right.append(y)
    return Pairing(tuple(records), tuple(left), tuple(right), only_a, len(by_key.keys() - seen))


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (Holm 1979), in the input's order; None stays None
    and is not counted among the tests. With m tests sorted p_(1) <= ... <= p_(m):
    adj_(i) = max over j <= i of min(1, (m - j + 1) p_(j)). Rejecting where adj <= alpha
    controls the family-wise error rate at alpha."""
    tested = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    m = len(tested)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for j, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - j) * p))
        out[i] = running
    return out


def figure_credits(records: Sequence[QuestionRecord], agg: Aggregate, arm: str) -> list[tuple[int, float]]:
    """(record index, credit) of every question a question-weighted figure covers, for `arm`:
    the figure's rule (`labels.Aggregate`): the covered types (every type when it names
    none), a question decided by the first of its types the figure covers, whose verdict is
    the headline `correct` or a per-question view (an absent view value counts 0, as an empty
    answer does); over every type, a question without a type is covered too, decided by
    `verdict("")`. A question the arm has no outcome for is left out. The figure's value is
    the mean of these credits (`summarize_aggregate` computes it; this is for the discordant
    counts of its test)."""
    present = {t for r in records for t in r.types}
    covered = [t for t in dict.fromkeys(agg.types) if t in present] if agg.types else sorted(present)
    cov = set(covered)
    out: list[tuple[int, float]] = []
    for i, r in enumerate(records):
        decider = next((t for t in r.types if t in cov), None)
        if decider is None and agg.types:
            continue
        o = r.arms.get(arm)
        if o is None:
            continue
        view = agg.verdict(decider if decider is not None else "")
        credit = float(o.correct) if view is None else float(r.views.get(arm, {}).get(view, 0.0))
        out.append((i, credit))
    return out


@dataclass(frozen=True, slots=True)
class ComparisonRow:
    """One line of a comparison: a question type, overall, or a declared figure."""

    group: str  # the type, "overall", or the figure's name
    kind: str  # "type" | "overall" | "figure"
    label: str  # what it is (a figure's label)
    n: int  # pairs
    n_images: int
    accuracy_a: float  # fractions
    a_ci_low: float
    a_ci_high: float
    accuracy_b: float
    b_ci_low: float
    b_ci_high: float
    delta: float  # points, B - A
    ci_low: float
    ci_high: float
    b: int | None  # A right, B wrong (None: no test for this row)
    c: int | None  # A wrong, B right
    mcnemar_p: float | None
    holm_p: float | None = None
    same_as: str | None = None  # a figure that is this other row by construction (not tested twice)

    def to_dict(self) -> dict[str, Any]:
        def clean(v: Any) -> Any:
            return None if isinstance(v, float) and (math.isnan(v) or math.isinf(v)) else v

        return {
            "group": self.group, "kind": self.kind, "label": self.label, "n": self.n, "n_images": self.n_images,
            "accuracy_a": clean(self.accuracy_a), "a_ci_low": clean(self.a_ci_low), "a_ci_high": clean(self.a_ci_high),
            "accuracy_b": clean(self.accuracy_b), "b_ci_low": clean(self.b_ci_low), "b_ci_high": clean(self.b_ci_high),
            "delta_pp": clean(self.delta), "delta_ci_low_pp": clean(self.ci_low), "delta_ci_high_pp": clean(self.ci_high),
            "b": self.b, "c": self.c, "mcnemar_p": clean(self.mcnemar_p), "holm_p": clean(self.holm_p),
            "same_as": self.same_as,
        }


@dataclass(frozen=True, slots=True)
class Comparison:
    """Every row of one comparison, with the Holm correction applied over its tests."""

    by_type: dict[str, ComparisonRow]
    overall: ComparisonRow
    figures: dict[str, ComparisonRow]  # by figure name, headline first
    tests: int  # how many tests the Holm correction is over
    iterations: int
    seed: int
    level: float

    def rows(self) -> list[ComparisonRow]:
        """Types, then overall, then the figures: the order every output shows."""
        return [*self.by_type.values(), self.overall, *self.figures.values()]


def _group_row(group: str, kind: str, label: str, g: GroupStats) -> ComparisonRow:
    a, b = g.accuracy.get(ARM_A), g.accuracy.get(ARM_B)
    p = g.paired.get(ARM_B)
    nan = math.nan
    return ComparisonRow(
        group=group, kind=kind, label=label, n=p.n_pairs if p else 0, n_images=g.n_images,
        accuracy_a=a.accuracy if a else nan, a_ci_low=a.ci_low if a else nan, a_ci_high=a.ci_high if a else nan,
        accuracy_b=b.accuracy if b else nan, b_ci_low=b.ci_low if b else nan, b_ci_high=b.ci_high if b else nan,
        delta=p.delta if p else nan, ci_low=p.ci_low if p else nan, ci_high=p.ci_high if p else nan,
        b=p.regressed if p else None, c=p.improved if p else None, mcnemar_p=p.mcnemar_p if p else None,
    )


def _is_overall(agg: Aggregate, types: Iterable[str]) -> bool:
    """A question-weighted figure over every type, each decided by the headline verdict, is
    the overall row (`stats.summarize_aggregate`'s docstring)."""
    return agg.weighting == "questions" and not agg.types and all(agg.verdict(t) is None for t in [*types, ""])


def _figure_row(agg: Aggregate, fs: AggregateStats, records: Sequence[QuestionRecord],
                overall: ComparisonRow) -> ComparisonRow:
    a, b = fs.accuracy.get(ARM_A), fs.accuracy.get(ARM_B)
    p = fs.paired.get(ARM_B)
    nan = math.nan
    disc_b: int | None = None
    disc_c: int | None = None
    pv: float | None = None
    same = "overall" if _is_overall(agg, fs.types) else None
    if same:
        disc_b, disc_c, pv = overall.b, overall.c, overall.mcnemar_p
    elif agg.weighting == "questions" and p is not None:
        ca = dict(figure_credits(records, agg, ARM_A))
        cb = dict(figure_credits(records, agg, ARM_B))
        both = ca.keys() & cb.keys()
        if all(ca[i] in (0.0, 1.0) and cb[i] in (0.0, 1.0) for i in both):
            disc_b = sum(1 for i in both if ca[i] == 1.0 and cb[i] == 0.0)
            disc_c = sum(1 for i in both if ca[i] == 0.0 and cb[i] == 1.0)
            pv = mcnemar_exact(disc_b, disc_c)
    return ComparisonRow(
        group=agg.name, kind="figure", label=agg.label, n=p.n_pairs if p else 0, n_images=fs.n_images,
        accuracy_a=a.value if a else nan, a_ci_low=a.ci_low if a else nan, a_ci_high=a.ci_high if a else nan,
        accuracy_b=b.value if b else nan, b_ci_low=b.ci_low if b else nan, b_ci_high=b.ci_high if b else nan,
        delta=p.delta if p else nan, ci_low=p.ci_low if p else nan, ci_high=p.ci_high if p else nan,
        b=disc_b, c=disc_c, mcnemar_p=pv, same_as=same,
    )


def compare(pairing: Pairing, figures: Sequence[Aggregate] = (), *, iterations: int = 1000, seed: int = 0,
            level: float = 0.95, computable: Callable[[Aggregate], bool] = lambda agg: True) -> Comparison:
    """The comparison of the paired records: per type and overall (`stats.summarize`), per
    declared figure (`stats.summarize_aggregate`; `computable(agg)` says whether the sides
    carry what it needs), Holm over every test (module docstring). Raises ValueError when
    nothing pairs."""
    records = pairing.records
    st = summarize(records, reference_arm=ARM_A, blind_arm=_NO_BLIND, iterations=iterations, seed=seed, level=level)
    by_type = {t: _group_row(t, "type", t, g) for t, g in st.by_type.items()}
    overall = _group_row("overall", "overall", "overall (question-weighted, exact match)", st.overall)
    figs: dict[str, ComparisonRow] = {}
    for agg in figures:
        if not computable(agg):
            continue
        fs = summarize_aggregate(records, weighting=agg.weighting, types=agg.types, verdict=agg.verdict,
                                 reference_arm=ARM_A, blind_arm=_NO_BLIND, iterations=iterations, seed=seed,
                                 level=level)
        if fs.n:
            figs[agg.name] = _figure_row(agg, fs, records, overall)
    rows = [*by_type.values(), overall, *(r for r in figs.values() if r.same_as is None)]
    adjusted = holm([r.mcnemar_p for r in rows])
    holm_of = {(r.kind, r.group): p for r, p in zip(rows, adjusted, strict=True)}

    def with_holm(r: ComparisonRow) -> ComparisonRow:
        key = ("overall", "overall") if r.same_as == "overall" else (r.kind, r.group)
        return _replace_holm(r, holm_of.get(key))

    return Comparison(
        by_type={t: with_holm(r) for t, r in by_type.items()}, overall=with_holm(overall),
        figures={n: with_holm(r) for n, r in figs.items()},
        tests=sum(p is not None for p in adjusted), iterations=iterations, seed=seed, level=level,
    )


def _replace_holm(r: ComparisonRow, p: float | None) -> ComparisonRow:
    from dataclasses import replace

    return replace(r, holm_p=p)


# --------------------------------------------------------------------------- planning

@dataclass(frozen=True, slots=True)
class ClusterVariance:
    """A paired delta (or an accuracy) over questions clustered by image, and how precise it is.

    The figure is a ratio estimator, sum of per-question values over the questions (each image
    contributing its sum D_j over m_j questions). Its linearised, cluster-robust variance is
    ``J / (J - 1) * sum_j (D_j - mean * m_j)^2 / (sum_j m_j)^2`` (the sandwich variance of a
    ratio over clusters; Cameron & Miller 2015, "A practitioner's guide to cluster-robust
    inference", J. Human Resources 50:317-372), which the clustered bootstrap estimates by
    resampling. Written as ``per_image_variance / J`` with ``per_image_variance =
    s^2 / mbar^2`` (s^2 the sample variance of D_j - mean * m_j, mbar the mean questions per
    image), it says how many images a wanted precision needs when the new images are like the
    pilot's (the same questions per image): ``SE(J) = sqrt(per_image_variance / J)``."""

    mean: float  # fraction (a delta: -1..1)
    images: int
    questions: int
    per_image_variance: float  # fraction^2; NaN with fewer than two images

    @property
    def questions_per_image(self) -> float:
        return self.questions / self.images if self.images else math.nan

    def se(self, images: float | None = None) -> float:
        """Standard error (fraction) with `images` images like these (default: as many as now)."""
        j = self.images if images is None else images
        return math.sqrt(self.per_image_variance / j) if j and not math.isnan(self.per_image_variance) else math.nan


def cluster_variance(clusters: Sequence[str], values: Sequence[float]) -> ClusterVariance:
    """The mean of `values` (one per question) and its per-image variance (`ClusterVariance`)."""
    if len(clusters) != len(values):
        raise ValueError(f"{len(clusters)} cluster ids but {len(values)} values")
    sums: dict[str, list[float]] = {}
    for c, v in zip(clusters, values, strict=True):
        s = sums.setdefault(c, [0.0, 0.0])
        s[0] += float(v)
        s[1] += 1.0
    j, n = len(sums), len(values)
    if n == 0:
        return ClusterVariance(math.nan, 0, 0, math.nan)
    mean = math.fsum(float(v) for v in values) / n
    if j < 2:
        return ClusterVariance(mean, j, n, math.nan)
    mbar = n / j
    resid = [d - mean * m for d, m in sums.values()]
    s2 = math.fsum(e * e for e in resid) / (j - 1)
    return ClusterVariance(mean, j, n, s2 / (mbar * mbar))


def _z(p: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(p)


def images_for_width(cv: ClusterVariance, width_pp: float, level: float = 0.95) -> int | None:
    """Images (like the pilot's) for a `level` interval `width_pp` points wide (its full width,
    high minus low): J = (2 z sigma / W)^2. None when the variance is undefined."""
    if width_pp <= 0:
        raise ValueError(f"width must be positive, got {width_pp}")
    if math.isnan(cv.per_image_variance):
        return None
    sigma = 100.0 * math.sqrt(cv.per_image_variance)
    return max(2, math.ceil((2 * _z(0.5 + level / 2) * sigma / width_pp) ** 2))


def images_for_detect(cv: ClusterVariance, delta_pp: float, power: float = 0.8, level: float = 0.95) -> int | None:
    """Images (like the pilot's) to detect a true delta of `delta_pp` points with `power` in a
    two-sided test at 1 - `level`: J = ((z_(1-alpha/2) + z_power) sigma / D)^2 (the normal
    approximation with the clustered variance). None when the variance is undefined."""
    if delta_pp == 0:
        raise ValueError("the delta to detect must not be 0")
    if math.isnan(cv.per_image_variance):
        return None
    sigma = 100.0 * math.sqrt(cv.per_image_variance)
    return max(2, math.ceil(((_z(0.5 + level / 2) + _z(power)) * sigma / abs(delta_pp)) ** 2))


def interval_width(cv: ClusterVariance, images: float | None = None, level: float = 0.95) -> float:
    """The full width (points) of a `level` interval with `images` images like these."""
    return 2 * _z(0.5 + level / 2) * 100.0 * cv.se(images)
