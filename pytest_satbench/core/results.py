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
protocol says, and the further figures its papers publish) is computed here with
`stats.summarize_aggregate`, and `aggregate_views` pairs each with its label, so a figure and
the sentence saying what it is travel together to the terminal, summary.json, per_type.csv
and report.md. A loader's notes on how it read some questions (`labels.NOTE`) are counted
into `BenchmarkResult.notes`.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_satbench.core import arms as A
from pytest_satbench.core.labels import AVERAGE, OVERALL, OVERALL_ONLY, Aggregate, Labels, notes
from pytest_satbench.core.prompts import DEFAULT_STYLE, default_box_grid
from pytest_satbench.core.question import ImageRef, Question, chance
from pytest_satbench.core.records import AnswerRow, ServerTraffic
from pytest_satbench.core.judge import JUDGED_VIEW, judge_verdict, official_rules
from pytest_satbench.core.scoring import Score, ScoreOptions, final_answer, score
from pytest_satbench.core.stats import (
    AggregateStats,
    ArmOutcome,
    BenchmarkStats,
    FigureInput,
    QuestionRecord,
    ViewStats,
    summarize,
    summarize_aggregate,
    summarize_view,
)

__all__ = [
    "BenchmarkResult", "NoiseFloor", "QuestionResult", "ServerUsage", "Usage",
    "aggregate_views", "benchmark_results", "question_from", "question_record", "score_options",
]


# --------------------------------------------------------------------------- records

@dataclass(slots=True)
class QuestionResult:
    """One question of the run with its stored row and fresh score per arm."""

    nodeid: str
    question: Question
    types: tuple[str, ...]  # reported types (VRSBench merges some raw types)
    rows: dict[str, AnswerRow]
    scores: dict[str, Score]  # arms with an "ok" row only
    chance: float | None

    def correct(self, arm: str) -> bool:
        sc = self.scores.get(arm)
        return bool(sc is not None and sc.correct)

    @property
    def regressed_arms(self) -> list[str]:
        """Reconstruction arms that got wrong what the original got right."""
        if not self.correct(A.ORIG):
            return []
        return [a for a in self.rows if A.is_recon(a) and not self.correct(a)]


@dataclass(slots=True)
class ServerUsage:
    """One server's share of the run: answers and their usage from the stored rows, attempts
    from what the clients counted (`traffic`)."""

    answers: int = 0  # "ok" rows
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0  # sum of what the server reported
    rows_with_cost: int = 0  # answers whose response carried a cost
    latency_mean_s: float | None = None
    latency_p50_s: float | None = None
    latency_p95_s: float | None = None
    models: dict[str, int] = field(default_factory=dict)  # model id as returned -> answers
    requests: int | None = None  # HTTP attempts; None: the run did not record its traffic
    failures: int | None = None  # attempts that failed (a retry may have answered later)
    retries: int | None = None  # attempts that were retries


@dataclass(slots=True)
class Usage:
    total: ServerUsage
    by_server: dict[str, ServerUsage]
    errors: int  # error rows (no answer after retries); they have no usage
    errors_by_arm: dict[str, int]
    image_tokens: dict[str, float | None]  # arm -> mean image tokens per answer (None: not reported)
    asked: int  # answers asked by this run
    reused: int  # answers this run took from the store (asked by an earlier run)


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


@dataclass(slots=True)
class BenchmarkResult:
    """Everything one benchmark of one run measured, as every consumer shows it."""

    benchmark: str
    run_id: str
    tag: str
    protocol: dict[str, Any]
    items: list[QuestionResult]
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

    def declared_figures(self) -> tuple[Aggregate, ...]:
        """The benchmark's figures with their labels, headline first (`Labels.figures`),
        those this run could compute."""
        return tuple(a for a in self.labels.figures(len(self.stats.by_type)) if a.name in self.figures)


# --------------------------------------------------------------------------- questions

def question_record(q: Question, prompt: str, sent_size: tuple[int, int] | None) -> dict[str, Any]:
    """What reports need of a question, as plain JSON (kept with the run in the store).
    `sent_size` is the geometry the image was sent at: answers on the pixel grid are
    scored against it."""
    return {
        "key": q.key, "text": q.text, "answer": q.answer, "types": list(q.types), "kind": q.kind,
        "choices": list(q.choices) if q.choices else None, "extra": [list(kv) for kv in q.extra],
        "image_id": q.image.id, "image_path": q.image.path, "prompt": prompt,
        "sent_size": list(sent_size) if sent_size else None,
    }


def question_from(bench: str, q: Mapping[str, Any]) -> Question:
    """The inverse of `question_record`."""
    path = q.get("image_path")
    image = ImageRef(str(q["image_id"]), path=path) if path else ImageRef(str(q["image_id"]), data=b"")
    return Question(
        benchmark=bench,
        key=str(q["key"]),
        image=image,
        text=str(q.get("text", "")),
        answer=str(q.get("answer", "")),
        types=tuple(q.get("types") or ()),
        kind=q.get("kind") or "vqa",
        choices=tuple(q["choices"]) if q.get("choices") else None,
        extra=tuple((str(k), str(v)) for k, v in (q.get("extra") or ())),
    )


def score_options(protocol: Mapping[str, Any], views: frozenset[str] = frozenset()) -> ScoreOptions:
    """The scoring conventions a run recorded in its protocol, with the benchmark's views."""
    style = str(protocol.get("prompt_style") or DEFAULT_STYLE)
    grid = protocol.get("box_grid") or default_box_grid(style)
    return ScoreOptions(box_grid=str(grid), iou=str(protocol.get("iou") or "inclusive"), views=views)


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
    iterations: int = 1000,
    seed: int = 0,
    unfinished: bool = False,
) -> BenchmarkResult:
    """Score, count and summarise one benchmark of a run from its stored rows:
    `stored` is (node id, question record, {arm: row}) per question, as the store gives it."""
    items: list[QuestionResult] = []
    records: list[QuestionRecord] = []
    for nodeid, qdict, rows in stored:
        q = question_from(benchmark, qdict)
        o = options
        if options.box_grid == "pixels" and q.kind == "ref":
            size = qdict.get("sent_size")
            o = ScoreOptions(options.box_grid, options.iou, tuple(size) if size else None, options.views)
        item, record = _score_question(nodeid, q, rows, o, reported_type)
        items.append(item)
        records.append(record)
    stats = summarize(records, iterations=iterations, seed=seed)
    names = sorted({n for r in records for v in r.views.values() for n in v})
    views = {n: summarize_view(records, n, iterations=iterations, seed=seed) for n in names}
    shared = FigureInput(records)
    figures = {
        agg.name: summarize_aggregate(records, weighting=agg.weighting, types=agg.types, verdict=agg.verdict,
                                      iterations=iterations, seed=seed, prepared=shared)
        for agg in labels.figures(len(stats.by_type)) if _computable(agg, set(stats.by_type), set(names))
    }
    return BenchmarkResult(
        benchmark=benchmark, run_id=run_id, tag=tag, protocol=protocol, items=items, stats=stats,
        views=views, usage=usage_of(items, list(stats.arms), run_id, traffic or {}),
        score_options=options, labels=labels, noise_floor=noise_floor(items),
        figures=figures, notes=notes(it.question for it in items),
        not_run=max(0, int((protocol.get("planned") or {}).get(benchmark, 0)) - len(items)), unfinished=unfinished,
    )


def _computable(agg: Aggregate, types: set[str], views: set[str]) -> bool:
    """Whether every view deciding one of the run's covered types was computed: a figure
    whose verdict comes from a view this run did not produce (e.g. a judge that did not
    run) is left out rather than shown as 0."""
    covered = [t for t in agg.types if t in types] if agg.types else sorted(types)
    return all(v is None or v in views for v in map(agg.verdict, covered))


def _score_question(
    nodeid: str, q: Question, rows: dict[str, AnswerRow], options: ScoreOptions,
    reported_type: Callable[[str], str],
) -> tuple[QuestionResult, QuestionRecord]:
    scores: dict[str, Score] = {}
    outcomes: dict[str, ArmOutcome] = {}
    views: dict[str, dict[str, float]] = {}
    empty_views: dict[str, float] | None = None
    for arm, row in rows.items():
        if A.is_judge(arm):
            continue  # a verdict on another arm's answer, not an answer (see _judged below)
        if row.status == "ok":
            sc = score(q, row.text or "", options)
            scores[arm] = sc
            if A.is_repeat(arm):
                continue  # --repeat-orig asks: the noise floor, not an arm of the comparison
            outcomes[arm] = ArmOutcome("ok", sc.correct, sc.parsed, row.finish_reason == "length")
            v = dict(sc.views)
        elif A.is_repeat(arm):
            continue
        else:
            outcomes[arm] = ArmOutcome("error", False, False)
            if empty_views is None:
                empty_views = dict(score(q, "", options).views)
            v = dict(empty_views)
        if v:
            views[arm] = v
    _judged(q, rows, scores, views, options)
    # a raw type reported as OVERALL_ONLY counts in the overall figures only
    types = tuple(dict.fromkeys(t for t in map(reported_type, q.types) if t != OVERALL_ONLY)) if q.types else ("all",)
    ch = chance(q)
    return (QuestionResult(nodeid, q, types, rows, scores, ch),
            QuestionRecord(q.key, q.image.id, types, outcomes, ch, views))


def _judged(q: Question, rows: Mapping[str, AnswerRow], scores: Mapping[str, Score],
            views: dict[str, dict[str, float]], options: ScoreOptions) -> None:
    """VRSBench's official protocol: where its rules leave an answer undecided and the run asked
    the judge (`--judge`), the judge's verdict is the official view's value. Without a verdict
    (no judge, or the judge failed: an error row) the value stays the rules' 0."""
    if JUDGED_VIEW not in options.views or q.kind != "vqa":
        return
    for arm, value in views.items():
        verdict = rows.get(A.judge_arm(arm))
        if verdict is None or verdict.status != "ok" or arm not in scores or JUDGED_VIEW not in value:
            continue
        if official_rules(q.answer, final_answer(rows[arm].text or "")) is None:
            value[JUDGED_VIEW] = float(judge_verdict(verdict.text or ""))


def noise_floor(items: Iterable[QuestionResult]) -> NoiseFloor | None:
    questions = flipped = asks = 0
    for it in items:
        repeats = [a for a in it.rows if a == A.ORIG or A.is_repeat(a)]
        if len(repeats) < 2 or any(it.rows[a].status != "ok" for a in repeats):
            continue
        asks = max(asks, len(repeats))
        questions += 1
        flipped += len({it.correct(a) for a in repeats}) > 1
    return NoiseFloor(questions, asks, flipped) if asks else None


# --------------------------------------------------------------------------- usage

def _percentile(xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    xs = sorted(xs)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _server_usage(rows: list[AnswerRow], traffic: ServerTraffic | None) -> ServerUsage:
    u = ServerUsage(answers=len(rows))
    lat = [r.latency_s for r in rows if r.latency_s is not None]
    for r in rows:
        u.prompt_tokens += r.prompt_tokens or 0
        u.completion_tokens += r.completion_tokens or 0
        if r.cost is not None:
            u.cost += r.cost
            u.rows_with_cost += 1
    if lat:
        u.latency_mean_s = statistics.fmean(lat)
        u.latency_p50_s = _percentile(lat, 50)
        u.latency_p95_s = _percentile(lat, 95)
    u.models = dict(sorted(Counter(str(r.model) for r in rows).items()))
    if traffic is not None:
        u.requests, u.failures, u.retries = traffic.requests, traffic.failures, traffic.retries
    return u


def usage_of(items: list[QuestionResult], arms: list[str], run_id: str,
             traffic: Mapping[str, ServerTraffic]) -> Usage:
    from pytest_satbench.core.redact import redact_url

    ok = [r for it in items for r in it.rows.values() if r.status == "ok"]
    errs = [r for it in items for r in it.rows.values() if r.status != "ok"]
    by_server: dict[str, list[AnswerRow]] = {}
    for r in ok:
        by_server.setdefault(redact_url(str(r.server)) if r.server else "unknown", []).append(r)
    shown_traffic = {redact_url(name): t for name, t in traffic.items()}
    for name in shown_traffic:
        by_server.setdefault(name, [])  # a server that only failed still shows
    tokens: dict[str, float | None] = {}
    for arm in arms:
        vals = [it.rows[arm].image_tokens for it in items if arm in it.rows and it.rows[arm].image_tokens is not None]
        tokens[arm] = statistics.fmean(vals) if vals else None  # type: ignore[arg-type]
    total_traffic = None
    if shown_traffic:
        parts = list(shown_traffic.values())
        total_traffic = sum(parts[1:], parts[0])
    asked = sum(1 for r in ok if r.run_id == run_id)
    return Usage(
        total=_server_usage(ok, total_traffic),
        by_server={s: _server_usage(rs, shown_traffic.get(s)) for s, rs in sorted(by_server.items())},
        errors=len(errs),
        errors_by_arm=dict(sorted(Counter(r.arm for r in errs).items())),
        image_tokens=tokens,
        asked=asked,
        reused=len(ok) - asked,
    )


# --------------------------------------------------------------------------- headline views

def aggregate_views(result: BenchmarkResult) -> dict[str, Any]:
    """The benchmark's own numbers, labelled with what they are: the headline figures
    (`overall_accuracy`, `average_accuracy`, computed as the benchmark's protocol says), each
    per-question view (`view:<name>`), and each further figure (`aggregate:<name>`). A figure
    has its label, its weighting, covered types and per-type verdicts, `per_arm` (the value,
    a fraction), `accuracy` per arm {n, value, ci_low, ci_high}, `paired` per reconstruction
    arm {n_pairs, delta, ci_low, ci_high} (points) and its parts `by_type`."""
    out: dict[str, Any] = {}
    for agg in result.declared_figures():
        if agg.name in (OVERALL, AVERAGE):
            out[agg.name] = figure_entry(agg, result.figures[agg.name])
    for name, vs in sorted(result.views.items()):
        out[f"view:{name}"] = {"label": result.labels.view(name).label, **vs.to_dict()}
    for agg in result.declared_figures():
        if agg.name not in (OVERALL, AVERAGE):
            out[f"aggregate:{agg.name}"] = figure_entry(agg, result.figures[agg.name])
    return out


def figure_key(agg: Aggregate) -> str:
    """A figure's key in `aggregate_views` and per_type.csv's `type` column."""
    return agg.name if agg.name in (OVERALL, AVERAGE) else f"aggregate:{agg.name}"


def figure_entry(agg: Aggregate, fs: AggregateStats) -> dict[str, Any]:
    d = fs.to_dict()
    return {
        "label": agg.label,
        "weighting": agg.weighting,
        "types": d["types"],
        "verdicts": agg.describe_verdicts(fs.types),
        "per_arm": {arm: a["value"] for arm, a in d["accuracy"].items()},
        "n": d["n"],
        "n_images": d["n_images"],
        "accuracy": d["accuracy"],
        "paired": d["paired"],
        "by_type": {t: {arm: {"n": v["n"], "value": v["mean"]} for arm, v in per.items()}
                    for t, per in d["by_type"].items()},
    }
