"""The one route from stored answers to numbers.

The terminal summary, the gates, the report files and the report CLI all call
`benchmark_results` on the rows the store holds for a run, so a figure and its label are
the same everywhere, and nothing per item has to wait in memory for the end of the run.

Correctness is never read from a stored row: every raw answer is scored again with today's
scorer, so a scorer fix changes the numbers of old runs too. An error row counts as wrong
and, for the per-question views (IoU, binned, official), gets the value an empty answer
gets (0): it stays in every denominator.

Besides the per-type statistics and the per-question views, every figure the benchmark
declares (`Labels.figures`: the headline overall and average accuracy, computed as its
evaluation says, and the further figures its papers publish) is computed here with
`stats.summarize_aggregate`, and `figures_json.aggregate_views` pairs each with its label, so
a figure and the sentence saying what it is travel together to the terminal, summary.json,
per_type.csv and report.md. A loader's notes on how it read some questions (`labels.NOTE`)
are counted into `BenchmarkResult.notes`.

Under `--samples K` (protocol `samples`) each question's verdict carries each arm's verdict over
its K samples (`core.verdict.SampleVerdict`): the per-type table, the paired tables and the
answer analysis read each arm's own answer (its sample 1, the arm as a run without --samples
asks it); every benchmark figure, the headline included, is computed on each question's
mean-of-K credit and its label says so (`sampled_labels`); `BenchmarkResult.samples` holds the
mean-of-K, majority-vote and agreement figures with the paired delta on mean-of-K
(`stats.summarize_samples`).

Memory: the stored rows are read once, question by question (`stored` is a stream), and
nothing per question is kept but what the statistics need: one `QuestionRecord` (its parts
shared between questions that agree: image ids, types, outcomes, views) and one shared
`QuestionOutcome` per distinct answer pattern for the answer analysis. The usage
(`core.usage`), the noise floor, the notes and the clipping counts are tallied as the rows go
by; what needs every row (predictions.jsonl, the regressed gallery) gets each full
`QuestionResult` through `each` as it is made. A 222,600-question run was ~2 GB of Python
objects here when every row and score was kept for the reports.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pytest_satbench.core import arms as A
from pytest_satbench.core.defaults import BOOTSTRAP
from pytest_satbench.core.labels import NOTE, Aggregate, Labels, notes
from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.core.records import AnswerRow, LimitTrace, ServerTraffic
from pytest_satbench.core.scoring import Score, ScoreOptions, score
from pytest_satbench.core.stats import (
    AggregateStats,
    ArmOutcome,
    BenchmarkStats,
    FigureInput,
    QuestionRecord,
    SampleStats,
    ViewStats,
    summarize,
    summarize_aggregate,
    summarize_samples,
    summarize_view,
)
from pytest_satbench.core.usage import Usage, UsageTally
from pytest_satbench.core.verdict import (
    QuestionOutcome,
    QuestionResult,
    question_from,
    question_options,
    question_record,
    reported_types,
    score_options,
    score_question,
)

__all__ = [
    "BenchmarkResult", "Coverage", "NoiseFloor", "QuestionOutcome", "QuestionResult",
    "benchmark_results", "question_from", "question_record", "samples_of", "sampled_labels", "score_options",
]

T = TypeVar("T")


def samples_of(protocol: Mapping[str, Any]) -> int:
    """The run's --samples K from its protocol (1: recorded without, or before the option)."""
    got = protocol.get("samples")
    return int(got.get("k", 1)) if isinstance(got, Mapping) else 1


def sampled_labels(labels: Labels, k: int) -> Labels:
    """The benchmark's figures' labels under --samples K > 1: each figure is computed on each
    question's mean over its K samples, and says so."""
    if k <= 1:
        return labels
    from dataclasses import replace

    tail = f", mean of {k} samples per question (--samples {k})"
    return replace(labels, overall=labels.overall + tail,
                   average=None if labels.average is None else labels.average + tail,
                   aggregates=tuple(replace(a, label=a.label + tail) for a in labels.aggregates))


# --------------------------------------------------------------------------- records

@dataclass(frozen=True, slots=True)
class NoiseFloor:
    """--repeat-orig: how often asking the same original again changes the verdict."""

    questions: int  # sampled questions with every repeat answered
    asks: int  # K
    flipped: int  # questions whose correctness differed between asks

    @property
    def rate(self) -> float:
        return self.flipped / self.questions if self.questions else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {"asks": self.asks, "questions": self.questions, "flipped": self.flipped,
                "flip_rate": self.rate if self.questions else None}


@dataclass(frozen=True, slots=True)
class Coverage:
    """Which runs a result covers. A tag's report is built from every stored answer of the tag's
    questions (`report.build.collect` merges the tag's runs): the run that builds it, and its
    earlier runs since the tag's protocol last changed."""

    runs: tuple[str, ...]  # run ids, the reporting run first
    planned: int  # the most questions of the benchmark any of them selected (protocol `planned`)
    limit: int | None  # their --limit; None when one of them ran without
    run_selected: int = 0  # questions the reporting run selected (its `planned`; 0: not recorded)
    # `--shard` parts among them, when two or more of one split (a merged job array's stores):
    # {"count": N, "parts": [I, ...], "questions": the benchmark's, "missing": the questions of
    # the parts not here}; counts before -k (protocol "shard"); None otherwise
    shards: Mapping[str, Any] | None = None


@dataclass(slots=True)
class BenchmarkResult:
    """Everything one benchmark of one run measured, as every consumer shows it."""

    benchmark: str
    run_id: str
    tag: str
    protocol: dict[str, Any]
    items: list[QuestionOutcome]  # one per question, in the run's order (shared objects)
    stats: BenchmarkStats
    views: dict[str, ViewStats]  # per-question views (iou, acc@0.5, binned, official, ...)
    usage: Usage
    score_options: ScoreOptions
    labels: Labels
    noise_floor: NoiseFloor | None
    figures: dict[str, AggregateStats] = field(default_factory=dict)  # by figure name, headline first
    notes: list[str] = field(default_factory=list)  # the loader's notes, counted
    # questions the run set out to answer (its protocol's `planned`) that never ran: not in
    # any figure; and whether the run ended unfinished (Ctrl-C, a stop, still running)
    not_run: int = 0
    unfinished: bool = False
    # answers whose text was clipped at --max-answer-chars, per arm, in the order first seen
    # (arms with none left out)
    clipped_by_arm: dict[str, int] = field(default_factory=dict)
    # the runs whose answers are here (the reporting run first); how many of the questions here
    # the reporting run recorded and how many it selected; the --limit of those runs
    runs: tuple[str, ...] = ()
    run_questions: int = 0
    run_selected: int = 0
    limit: int | None = None
    # the `--shard` parts those runs are, when two or more of one split (`Coverage.shards`)
    shards: Mapping[str, Any] | None = None
    # (figure, type) -> that figure over one type's questions, each decided by the figure's
    # verdict for it: the parts gates asked for (`benchmark_results(figure_parts=...)`)
    figure_parts: dict[tuple[str, str], AggregateStats] = field(default_factory=dict)
    # --precision / --margin: the confidence sequences rebuilt from the stored answers in the
    # run's order, summary.json's "sequential" block (`core.early_stop.replay`); None without
    sequential: dict[str, Any] | None = None
    # --samples K > 1: mean-of-K, majority vote and agreement per arm, paired delta on mean-of-K
    samples: SampleStats | None = None

    @property
    def questions(self) -> int:
        """The questions this result is about: those here, and those selected that never ran."""
        return len(self.items) + self.not_run

    @property
    def subset(self) -> bool:
        """The reporting run selected fewer questions than its tag holds (-k, --lf, --limit,
        --deselect): the figures cover the tag's other questions too, from its earlier runs. Not
        when the runs are parts of one `--shard` split (`shards`: a job array's stores merged) and
        the reporting run selected its whole part, or every part is here: the other questions are
        the other parts', which the shard line names (`text_summary.shard_line`)."""
        selected = self.run_selected or self.run_questions
        if len(self.runs) <= 1 or selected >= self.questions:
            return False
        if self.shards:
            if not self.shards.get("missing"):
                return False
            counts = ((self.protocol.get("shard") or {}).get("benchmarks") or {}).get(self.benchmark) or {}
            return selected < int(counts.get("shard_questions", self.questions))
        return True

    def declared_figures(self) -> tuple[Aggregate, ...]:
        """The benchmark's figures with their labels, headline first (`Labels.figures`),
        those this run could compute."""
        return tuple(a for a in self.labels.figures(len(self.stats.by_type)) if a.name in self.figures)

    @property
    def headline(self) -> Aggregate | None:
        """The figure a paper prints for this benchmark (its first declared figure: RSVQA's OA
        under the original evaluation, VRSBench's All under its rules, LHRS's accuracy)."""
        declared = self.declared_figures()
        return declared[0] if declared else None

    def figure(self, name: str | None, qtype: str | None = None) -> tuple[Aggregate, AggregateStats | None] | None:
        """A declared figure by name (None: the headline) and its statistics, over every
        covered type or over `qtype` alone (a part asked for through `figure_parts`; None
        when the figure does not cover that type). None: no such figure."""
        agg = self.headline if name is None else next((a for a in self.declared_figures() if a.name == name), None)
        if agg is None:
            return None
        return agg, (self.figures[agg.name] if qtype is None else self.figure_parts.get((agg.name, qtype)))


# --------------------------------------------------------------------------- the route

def benchmark_results(
    benchmark: str,
    run_id: str,
    tag: str,
    protocol: dict[str, Any],
    stored: Iterable[tuple[str, Mapping[str, Any], dict[str, AnswerRow]]],
    *,
    options: ScoreOptions,
    reported_type: Callable[[str], str] = lambda raw: raw,
    labels: Labels = Labels(),
    traffic: Mapping[str, ServerTraffic] | None = None,
    limits: Sequence[LimitTrace] = (),
    iterations: int = BOOTSTRAP,
    seed: int = 0,
    unfinished: bool = False,
    each: Callable[[QuestionResult], None] | None = None,
    coverage: Coverage | None = None,
    figure_parts: Iterable[tuple[str | None, str]] = (),
) -> BenchmarkResult:
    """Score, count and summarise one benchmark of a run from its stored rows:
    `stored` is (node id, question record, {arm: row}) per question, as the store gives it,
    read once; with a fourth element, the arms of those rows that `run_id` recorded (a tag's
    report also covers questions and arms only its earlier runs recorded: `coverage` names those
    runs; without it the result is `run_id`'s alone). `each` is called with every question's full result as
    it is scored (the report files that list every answer write it there; it is not kept).
    `figure_parts`: (figure name or None for the headline, type) pairs to compute the figure
    over that type alone as well (per-type gates; `BenchmarkResult.figure`)."""
    k = samples_of(protocol)
    labels = sampled_labels(labels, k)
    shared = _Shared()
    scorer = _ScoreMemo()
    tally = _Tally(run_id)
    items: list[QuestionOutcome] = []
    records: list[QuestionRecord] = []
    own = 0
    for entry in stored:
        nodeid, qdict, rows = entry[0], entry[1], entry[2]
        mine: Container[str] | None = entry[3] if len(entry) > 3 else None
        own += mine is None or bool(mine)
        q = question_from(benchmark, qdict)
        o = question_options(options, q, qdict.get("sent_size"))
        item, record = _score_question(nodeid, q, rows, o, reported_type, scorer, shared, k)
        items.append(shared.outcome(item))
        records.append(record)
        tally.add(item, mine)
        if each is not None:
            each(item)
    del shared, scorer
    prepared = FigureInput(records)  # the image codes and type index, once for every summary
    stats = summarize(records, iterations=iterations, seed=seed, prepared=prepared)
    names = sorted({n for v in {id(r.views): r.views for r in records}.values() for vs in v.values() for n in vs})
    views = {n: summarize_view(records, n, iterations=iterations, seed=seed, prepared=prepared) for n in names}
    figures = {
        agg.name: summarize_aggregate(records, weighting=agg.weighting, types=agg.types, verdict=agg.verdict,
                                      iterations=iterations, seed=seed, prepared=prepared)
        for agg in labels.figures(len(stats.by_type)) if _computable(agg, set(stats.by_type), set(names))
    }
    parts: dict[tuple[str, str], AggregateStats] = {}
    declared = [a for a in labels.figures(len(stats.by_type)) if a.name in figures]
    for name, qtype in figure_parts:
        agg = declared[0] if name is None and declared else next((a for a in declared if a.name == name), None)
        if agg is None or qtype not in stats.by_type or (agg.types and qtype not in agg.types):
            continue
        if (agg.name, qtype) not in parts:
            parts[agg.name, qtype] = summarize_aggregate(
                records, weighting="questions", types=(qtype,), verdict=agg.verdict,
                iterations=iterations, seed=seed, prepared=prepared)
    selected = int((protocol.get("planned") or {}).get(benchmark, 0))
    if coverage is None:
        coverage = Coverage((run_id,), selected, protocol.get("limit") or None, selected)
    return BenchmarkResult(
        benchmark=benchmark, run_id=run_id, tag=tag, protocol=protocol, items=items, stats=stats,
        views=views, usage=tally.usage(list(stats.arms), traffic or {}, limits),
        score_options=options, labels=labels, noise_floor=tally.noise_floor(),
        figures=figures, notes=tally.notes(),
        not_run=max(0, coverage.planned - len(items)), unfinished=unfinished,
        clipped_by_arm=dict(tally.clipped),
        runs=coverage.runs, run_questions=own, run_selected=coverage.run_selected, limit=coverage.limit,
        shards=coverage.shards,
        figure_parts=parts,
        samples=summarize_samples(records, iterations=iterations, seed=seed, prepared=prepared) if k > 1 else None,
    )


_BLANK_IMAGE = ImageRef("", data=b"")


class _Shared:
    """One object for equal parts of many questions' records, so a run's records cost little
    more than their keys: SQLite and the JSON decoder hand every row its own strings, and a
    question's outcomes and views repeat across thousands of questions."""

    def __init__(self) -> None:
        self._values: dict[object, Any] = {}

    def _one(self, key: object, make: Callable[[], T]) -> T:
        got: T | None = self._values.get(key)
        if got is None:
            got = self._values[key] = make()
        return got

    def record(self, key: str, image: str, types: tuple[str, ...], outcomes: dict[str, ArmOutcome],
               chance: float | None, views: dict[str, dict[str, float]], okey: tuple[Any, ...],
               samples: dict[str, Any] | None = None) -> QuestionRecord:
        """`okey` decides `outcomes`; the views and the samples' verdicts are keyed by their values."""
        vkey = tuple((arm, tuple(v.items())) for arm, v in views.items())
        if samples:
            return QuestionRecord(
                key, self._one(("image", image), lambda: image), types, self._one(("arms", okey), lambda: outcomes),
                chance if chance is None else self._one(("chance", chance), lambda: chance),
                self._one(("views", vkey), lambda: views),
                self._one(("samples", tuple(samples.items())), lambda: samples),
            )
        return QuestionRecord(
            key,
            self._one(("image", image), lambda: image),
            types,
            self._one(("arms", okey), lambda: outcomes),
            chance if chance is None else self._one(("chance", chance), lambda: chance),
            self._one(("views", vkey), lambda: views),
        )

    def types(self, raw: tuple[str, ...], reported_type: Callable[[str], str]) -> tuple[str, ...]:
        return self._one(("types", raw), lambda: reported_types(raw, reported_type))

    def outcome(self, it: QuestionResult) -> QuestionOutcome:
        q = it.question
        rows = tuple((arm, row.status) for arm, row in it.rows.items())
        scores = tuple(it.scores.items())
        key = ("outcome", q.kind, q.answer, q.choices, q.types, it.types, rows, scores)

        def make() -> QuestionOutcome:
            stand_in = Question(benchmark=q.benchmark, key="", image=_BLANK_IMAGE, text="", answer=q.answer,
                                types=q.types, kind=q.kind, choices=q.choices)
            return QuestionOutcome(stand_in, it.types, dict(rows), dict(scores))

        return self._one(key, make)


class _Tally:
    """What the run's rows add up to, counted question by question: their usage
    (`usage.UsageTally`), the --repeat-orig noise floor, the loader's notes and the clipped
    answers."""

    def __init__(self, run_id: str) -> None:
        self._usage = UsageTally(run_id)
        self.clipped: dict[str, int] = {}
        self.floor_questions = self.floor_asks = self.floor_flipped = 0
        self._notes: list[Any] = []
        self._note_sets: dict[tuple[str, ...], Any] = {}

    def add(self, it: QuestionResult, own: Container[str] | None = None) -> None:
        """`own`: the arms the run recorded for this question (None: all of them)."""
        self._usage.add(it.rows, own)
        for arm, r in it.rows.items():
            if r.clipped and r.status == "ok":
                self.clipped[arm] = self.clipped.get(arm, 0) + 1
        self._floor(it)
        texts = tuple(dict.fromkeys(v for k, v in it.question.extra if k == NOTE and v))
        if texts:
            noted = self._note_sets.get(texts)
            if noted is None:
                noted = self._note_sets[texts] = _Noted(tuple((NOTE, t) for t in texts))
            self._notes.append(noted)

    def _floor(self, it: QuestionResult) -> None:
        repeats = [a for a in it.rows if a == A.ORIG or A.is_repeat(a)]
        if len(repeats) < 2 or any(it.rows[a].status != "ok" for a in repeats):
            return
        self.floor_asks = max(self.floor_asks, len(repeats))
        self.floor_questions += 1
        self.floor_flipped += len({it.correct(a) for a in repeats}) > 1

    def noise_floor(self) -> NoiseFloor | None:
        return NoiseFloor(self.floor_questions, self.floor_asks, self.floor_flipped) if self.floor_asks else None

    def notes(self) -> list[str]:
        return notes(self._notes)

    def usage(self, arms: list[str], traffic: Mapping[str, ServerTraffic],
              limits: Sequence[LimitTrace] = ()) -> Usage:
        return self._usage.usage(arms, traffic, limits)


@dataclass(frozen=True, slots=True)
class _Noted:
    """What `labels.notes` reads of a question: its notes (one object per distinct set)."""

    extra: tuple[tuple[str, str], ...]


def _computable(agg: Aggregate, types: set[str], views: set[str]) -> bool:
    """Whether every view deciding one of the run's covered types was computed: a figure
    whose verdict comes from a view this run did not produce (e.g. a judge that did not
    run) is left out rather than shown as 0."""
    covered = [t for t in agg.types if t in types] if agg.types else sorted(types)
    return all(v is None or v in views for v in map(agg.verdict, covered))


class _ScoreMemo:
    """`score` for answers seen before: re-scoring a run is mostly the same short replies
    ("yes", "no", a count) to questions with the same ground truth, and `score` reads only
    the question's kind, ground truth, choices, types and extras (its key and text only name
    a malformed question in the error, which is never remembered). Long replies are scored
    each time (they rarely repeat; remembering them would cost memory)."""

    MAX_TEXT = 256
    MAX_ENTRIES = 50_000

    def __init__(self) -> None:
        self._seen: dict[tuple[Any, ...], Score] = {}

    def __call__(self, q: Question, text: str, options: ScoreOptions) -> Score:
        if len(text) > self.MAX_TEXT:
            return score(q, text, options)
        key = (q.kind, q.answer, q.choices, q.types, q.extra, text, options)
        got = self._seen.get(key)
        if got is None:
            got = score(q, text, options)
            if len(self._seen) >= self.MAX_ENTRIES:
                self._seen.clear()  # free-form answers: start again rather than grow
            self._seen[key] = got
        return got


def _score_question(
    nodeid: str, q: Question, rows: dict[str, AnswerRow], options: ScoreOptions,
    reported_type: Callable[[str], str], score: Callable[[Question, str, ScoreOptions], Score] = score,
    shared: _Shared | None = None, samples: int = 1,
) -> tuple[QuestionResult, QuestionRecord]:
    """The question's verdict (`core.verdict.score_question`, as its item got it) and what the
    statistics read of it."""
    types = shared.types(q.types, reported_type) if shared is not None else reported_types(q.types, reported_type)
    item = score_question(nodeid, q, rows, options, types=types, score=score, samples=samples)
    outcomes: dict[str, ArmOutcome] = {}
    okey: list[tuple[Any, ...]] = []  # what decides the outcomes, as plain tuples (hashed to share them)
    for arm, row in rows.items():
        if A.is_judge(arm) or A.is_repeat(arm) or A.is_sample(arm):
            continue  # verdicts on answers, the noise floor's asks, samples: not arms of the comparison
        if row.status == "ok":
            sc = item.scores[arm]
            truncated = row.finish_reason == "length"
            outcomes[arm] = _arm_outcome("ok", sc.correct, sc.parsed, truncated)
            okey.append((arm, sc.correct, sc.parsed, truncated))
        else:
            outcomes[arm] = _arm_outcome("error", False, False, False)
            okey.append((arm,))
    if shared is not None:
        return item, shared.record(q.key, q.image.id, types, outcomes, item.chance, item.views, tuple(okey),
                                   item.samples)
    return item, QuestionRecord(q.key, q.image.id, types, outcomes, item.chance, item.views, samples=item.samples)


_OUTCOMES: dict[tuple[str, bool, bool, bool], ArmOutcome] = {}


def _arm_outcome(status: str, correct: bool, parsed: bool, truncated: bool) -> ArmOutcome:
    """One ArmOutcome per combination (there are eight that are valid): they are immutable."""
    key = (status, bool(correct), bool(parsed), bool(truncated))
    got = _OUTCOMES.get(key)
    if got is None:
        got = _OUTCOMES[key] = ArmOutcome(*key)
    return got
