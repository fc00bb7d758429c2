"""The names a benchmark gives its numbers, and how its evaluation computes its figures,
declared in the benchmark's own module.

Kept apart from `results` (which needs numpy for the statistics) because every benchmark
module imports it when the registry loads.

A benchmark's *figures* are single numbers over many questions: the headline pair (overall
accuracy, average accuracy) and any further `Aggregate` its papers publish. Each says which
question types it covers, which per-question verdict decides each type (the headline exact
match, or a per-question view of `core/scoring.py` such as RSVQA's count classes) and how
the types are weighted. `core.results` computes every figure per arm with the same clustered
bootstrap interval and paired delta as the per-type tables, so the label printed next to a
figure is exactly what was computed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AVERAGE", "Aggregate", "ANY_TYPE", "EXACT", "Labels", "NOTE", "OVERALL", "OVERALL_ONLY",
    "ViewLabel", "WEIGHTINGS", "notes",
]

OVERALL = "overall_accuracy"  # the headline figures' names (keys of `aggregate_views`)
AVERAGE = "average_accuracy"
WEIGHTINGS = ("questions", "types")
ANY_TYPE = "*"  # in `verdicts`: every type not named otherwise
EXACT = "exact match"  # how `verdicts` reads when a type keeps the headline verdict
# A raw type a benchmark groups into OVERALL_ONLY (`Benchmark.type_groups`) counts in the
# overall figures and in no per-type row: e.g. a grounding record whose uniqueness flag is
# missing counts in "All" but in neither "Unique" nor "Non-unique".
OVERALL_ONLY = ""
# `Question.extra` key: a loader's note on how it read that question (a ground truth outside
# the grid, a missing flag). The notes are counted into warning lines (`notes`), so a
# benchmark that read some records in an unusual way says so, and how many.
NOTE = "note"


@dataclass(frozen=True, slots=True)
class ViewLabel:
    """How a benchmark names one of its per-question views (declared in its module)."""

    name: str  # the key in `Score.views`: "binned", "official", "acc@0.5", ...
    title: str  # the line above the view's table in the terminal
    label: str  # the row label of the view in the reports' aggregate views


@dataclass(frozen=True, slots=True)
class Aggregate:
    """One figure a benchmark's evaluation or papers define over its per-question verdicts.

    `weighting` "questions": correct / questions over the covered types, each question once
    (an overall accuracy, RSVQA's OA); "types": the unweighted mean of the covered types'
    accuracies (RSVQA's AA, VRSBench's mean over its types). `types` are reported types
    (after `Benchmark.type_groups`), empty for every type. `verdicts` maps a type (or
    `ANY_TYPE`) to the per-question view that decides it (its value 0..1 is the question's
    credit); a type not named keeps the headline verdict (`Score.correct`). A question with
    several types is decided, under "questions", by the first of its types the figure covers.
    `terminal`: shown in the terminal summary (the report files show every figure).
    """

    name: str
    label: str  # says whose convention it is and exactly what it counts
    weighting: str = "questions"
    types: tuple[str, ...] = ()
    verdicts: tuple[tuple[str, str], ...] = ()
    terminal: bool = True

    def __post_init__(self) -> None:
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"Aggregate {self.name!r}: weighting {self.weighting!r} is not one of {WEIGHTINGS}")

    def verdict(self, qtype: str) -> str | None:
        """The view that decides a question of `qtype`; None: the headline verdict."""
        default = None
        for t, view in self.verdicts:
            if t == qtype:
                return view
            if t == ANY_TYPE:
                default = view
        return default

    def describe_verdicts(self, types: Iterable[str]) -> dict[str, str]:
        """Per covered type, what decides it: a view's name or `EXACT`."""
        return {t: self.verdict(t) or EXACT for t in types}


@dataclass(frozen=True)
class Labels:
    """The names a benchmark's paper gives its headline numbers, and how they are computed.

    `overall` and `average` label the headline figures: question-weighted and mean of types,
    over every type, each type decided as `verdicts` says (default: the headline exact match,
    which is what the per-type table shows). `{types}` in `average` is replaced by the number
    of question types; `average=None` when the benchmark publishes no such figure. `table`
    is the title of the per-type table (say what its verdict is). `aggregates`: the further
    figures the benchmark's papers publish, each labelled with whose convention it is.
    """

    overall: str = "overall accuracy (question-weighted)"
    average: str | None = "average accuracy (unweighted mean of the per-type accuracies)"
    views: tuple[ViewLabel, ...] = ()
    verdicts: tuple[tuple[str, str], ...] = ()
    aggregates: tuple[Aggregate, ...] = ()
    table: str = "accuracy per question type (%)"

    def __post_init__(self) -> None:
        names = [a.name for a in self.aggregates]
        clash = {OVERALL, AVERAGE} & set(names) or {n for n in names if names.count(n) > 1}
        if clash:
            raise ValueError(f"Labels: aggregate name(s) {sorted(clash)} used twice or reserved")

    def view(self, name: str) -> ViewLabel:
        for v in self.views:
            if v.name == name:
                return v
        return ViewLabel(name, name, name)

    def headline(self, n_types: int) -> tuple[Aggregate, ...]:
        """The headline figures as aggregates over every type (the average only if labelled)."""
        out = [Aggregate(OVERALL, self.overall, "questions", (), self.verdicts)]
        if self.average is not None:
            out.append(Aggregate(AVERAGE, self.average.format(types=n_types), "types", (), self.verdicts))
        return tuple(out)

    def figures(self, n_types: int) -> tuple[Aggregate, ...]:
        """Every figure, headline first."""
        return self.headline(n_types) + self.aggregates

    @property
    def declares_evaluation(self) -> bool:
        """Whether some figure differs from what the per-type table already shows."""
        return bool(self.verdicts or self.aggregates)


def notes(questions: Iterable[Any]) -> list[str]:
    """One line per distinct loader note on `questions` (`Question.extra` entries keyed
    `NOTE`; a question may carry several), with how many questions carry it, in the order
    first seen."""
    counts: Counter[str] = Counter()
    for q in questions:
        for text in dict.fromkeys(v for k, v in q.extra if k == NOTE and v):
            counts[text] += 1
    return [f"{text}: {n} question{'' if n == 1 else 's'}" for text, n in counts.items()]
