"""One question's verdict: how its answers are scored and what they say, in one place.

The item's letter while a run goes on (`engine/answering.py` completes every item with a
`QuestionResult`), its properties (junit, json-report, html, sugar), `--fail-on regression`,
the terminal summary, the gates and every report file read a question's verdict from the same
record, built by the same function (`score_question`) with options built the same way
(`question_options`) from what the run recorded in its protocol. Two paths that each built
their own options once scored a Qwen2.5-VL box against two image sizes (the item against the
504x504 image the model saw, the report against the 512x512 one sent): a correct small box had
IoU 1.0 on the item and 0.455 in the report. Nothing outside this module decides a question's
outcome.

Outcomes (`Verdicts.outcome`), the one copy of the rule:
  error      some arm (a judge's verdict, a --repeat-orig ask or a --samples sample included)
             has no answer
  correct    no reconstruction arm ran and the original is right
  wrong      no reconstruction arm ran and the original is wrong
  regressed  the original is right and some reconstruction wrong
  improved   the original is wrong and some reconstruction right (none regressed)
  same       every reconstruction agrees with the original on correctness

The outcome reads each arm's own answer, which under `--samples K` is its sample 1.

Samples (`--samples K`, `SampleVerdict`, the one copy of the rule): each arm's question was
asked K times (`arms.sample_arm`: sample 1 is the arm itself), and its verdict over them is
  mean       the fraction of its K samples that are correct (mean-of-K: inspect's `Epochs(K)`
             with its default `mean_score` reducer, inspect_ai `scorer/_reducer`)
  majority   the most frequent answer among the K, as the scorer extracted and normalised it
             (`Score.extracted`), and whether it is correct; a tie goes to the answer given by
             the earliest sample among the tied (the order `collections.Counter.most_common`
             keeps, which lm-evaluation-harness's `majority_vote` filter uses,
             `lm_eval/filters/selection.py`). Undefined (None) for boxes (grounding: two boxes are rarely equal
             strings; only mean-of-K is reported there)
  agreement  the share of the K samples whose answer equals the majority answer
  credit     per per-question view (RSVQA's classes, VRSBench's official view with the
             judge's verdict on each sample), the mean of the K samples' values: what the
             benchmark's figures read under K > 1
A sample with no answer (an error row, or a sample the runs never asked: it gets an error
row here, "not asked") makes the question an error for that arm: it counts 0 in its
figures, the outcome is `error`, and K never silently shrinks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from pytest_satbench.core import arms as A
from pytest_satbench.core.prompts import DEFAULT_STYLE, default_box_grid, model_image_size
from pytest_satbench.core.question import ImageRef, Question, chance

# The outcome names are read at every pytest start-up (plugin/outcomes.py); the scorer's
# compiled rules (~17 ms) load with the first question scored.
if TYPE_CHECKING:
    from pytest_satbench.core.records import AnswerRow
    from pytest_satbench.core.scoring import Score, ScoreOptions

__all__ = [
    "CORRECT", "ERROR", "IMPROVED", "OUTCOMES", "QuestionOutcome", "QuestionResult", "REGRESSED", "SAME",
    "SampleVerdict", "Verdicts", "WRONG", "question_from", "question_options", "question_record", "score_options",
    "score_question",
]

SAME, REGRESSED, IMPROVED, WRONG, CORRECT, ERROR = "same", "regressed", "improved", "wrong", "correct", "error"
OUTCOMES = (SAME, CORRECT, WRONG, REGRESSED, IMPROVED, ERROR)


# --------------------------------------------------------------------------- options

def score_options(protocol: Mapping[str, Any], views: frozenset[str] = frozenset()) -> ScoreOptions:
    """The scoring conventions a run recorded in its protocol (prompt style, box grid, IoU),
    with the benchmark's views: the live run and every report build them from the same record."""
    from pytest_satbench.core.scoring import ScoreOptions

    style = str(protocol.get("prompt_style") or DEFAULT_STYLE)
    grid = protocol.get("box_grid") or default_box_grid(style)
    return ScoreOptions(box_grid=str(grid), iou=str(protocol.get("iou") or "inclusive"), views=views,
                        prompt_style=style)


def question_options(options: ScoreOptions, q: Question, sent_size: Any) -> ScoreOptions:
    """The options one question is scored with: boxes on the pixel grid are in the image the
    model saw, which is the size the image was sent at (`sent_size`, recorded with the
    question) unless the prompt style's model resizes it (Qwen2.5-VL: 512x512 is seen at
    504x504, `prompts.model_image_size`)."""
    if options.box_grid != "pixels" or q.kind != "ref" or not sent_size:
        return options
    return _sized(options, (int(sent_size[0]), int(sent_size[1])))


@lru_cache(maxsize=256)
def _sized(options: ScoreOptions, sent_size: tuple[int, int]) -> ScoreOptions:
    return replace(options, image_size=model_image_size(options.prompt_style, sent_size))


# --------------------------------------------------------------------------- records

def _status(row: Any) -> str:
    return row if isinstance(row, str) else row.status


class Verdicts:
    """The verdicts read off a question's `rows` (arm -> row, or its status) and `scores`
    (answered arms)."""

    __slots__ = ()
    rows: Mapping[str, Any]
    scores: Mapping[str, Score]

    def correct(self, arm: str) -> bool:
        sc = self.scores.get(arm)
        return bool(sc is not None and sc.correct)

    @property
    def regressed_arms(self) -> list[str]:
        """Reconstruction arms that got wrong what the original got right."""
        if not self.correct(A.ORIG):
            return []
        return [a for a in self.rows if A.is_recon(a) and not self.correct(a)]

    @property
    def failed_arms(self) -> list[str]:
        """Arms with no answer (an error row), in the run's arm order."""
        return [a for a, r in self.rows.items() if _status(r) != "ok"]

    @property
    def outcome(self) -> str:
        """The question's outcome (module docstring)."""
        if self.failed_arms:
            return ERROR
        orig = self.correct(A.ORIG)
        recon = [a for a in self.rows if A.is_recon(a)]
        if not recon:
            return CORRECT if orig else WRONG
        if orig and any(not self.correct(a) for a in recon):
            return REGRESSED
        if not orig and any(self.correct(a) for a in recon):
            return IMPROVED
        return SAME

    def arm_verdicts(self) -> tuple[tuple[str, str], ...]:
        """(arm, "correct" | "wrong" | "error") per arm, in the run's arm order."""
        return tuple(
            (a, "error" if _status(r) != "ok" else "correct" if self.correct(a) else "wrong")
            for a, r in self.rows.items()
        )


@dataclass(slots=True)
class QuestionResult(Verdicts):
    """One question with its rows and fresh score per arm: what an item completes with and
    what the reports read, the same record."""

    nodeid: str
    question: Question
    types: tuple[str, ...]  # reported types (VRSBench merges some raw types)
    rows: dict[str, AnswerRow]
    scores: dict[str, Score]  # arms with an "ok" row only
    chance: float | None
    # per arm (no judge or repeat arms), its per-question views: the scorer's, an error's the
    # value an empty answer gets, VRSBench's official view with the judge's verdict applied
    views: dict[str, dict[str, float]] = field(default_factory=dict)
    options: ScoreOptions | None = None  # what it was scored with
    # --samples K > 1: per arm (orig, each reconstruction, blind), its verdict over its K samples
    samples: dict[str, SampleVerdict] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SampleVerdict:
    """One arm's verdict over its K samples of one question (module docstring, "Samples")."""

    k: int
    error: bool  # some sample has no answer: the arm's figures count the question 0
    mean: float  # fraction of the K samples correct (0.0 when error)
    majority: str | None  # the majority answer; None when error or undefined (boxes)
    majority_correct: bool | None  # None: no majority for the kind (boxes); False when error
    agreement: float | None  # None when error or no majority  # share of the K samples equal to the majority answer
    credit: tuple[tuple[str, float], ...] = ()  # per view, the mean of its K values (error: 0)

    def value(self, view: str | None) -> float:
        """The mean-of-K credit under `view` (None: the headline verdict, `mean`)."""
        if view is None:
            return self.mean
        return next((v for k, v in self.credit if k == view), 0.0)


@dataclass(frozen=True, slots=True, eq=False)
class QuestionOutcome(Verdicts):
    """What the answer-level analysis (`core.analysis`) and the counts read of one question,
    without its ids, texts or rows: a stand-in question with only the fields that decide its
    answer classes (kind, ground truth, choices; key, text and image are blank), the reported
    types, the status of each arm's row and each answered arm's score.

    Questions that agree on all of that are one shared object (`BenchmarkResult.items` costs
    a pointer per question); never mutate one."""

    question: Question
    types: tuple[str, ...]
    rows: Mapping[str, str]  # arm -> its row's status ("ok" | "error"), the run's arm order
    scores: Mapping[str, Score]  # arms with an "ok" row only


# --------------------------------------------------------------------------- questions

def question_record(q: Question, prompt: str, sent_size: tuple[int, int] | None) -> dict[str, Any]:
    """What reports need of a question, as plain JSON (kept with the run in the store).
    `sent_size` is the geometry the image was sent at: answers on the pixel grid are
    scored against the image the model saw at that size (`question_options`)."""
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


def reported_types(raw: tuple[str, ...], reported_type: Callable[[str], str]) -> tuple[str, ...]:
    """A question's reported types; a raw type reported as OVERALL_ONLY counts in the overall
    figures only."""
    from pytest_satbench.core.labels import OVERALL_ONLY
    return tuple(dict.fromkeys(t for t in map(reported_type, raw) if t != OVERALL_ONLY)) if raw else ("all",)


def score_question(
    nodeid: str, q: Question, rows: dict[str, AnswerRow], options: ScoreOptions, *,
    types: tuple[str, ...] | None = None,
    score: Callable[[Question, str, ScoreOptions], Score] | None = None,
    scores: Mapping[str, Score] | None = None,
    samples: int = 1,
) -> QuestionResult:
    """Score every answered arm of one question (`options`: `question_options` of the run's
    options); `scores`: arms already scored with these same options (the runner scored each
    answer as it arrived, for the row it stored); `types`: its reported types (default: raw);
    `score`: the scorer (default `core.scoring.score`; the reports pass a memoised one);
    `samples`: the run's --samples K (rows of samples beyond K, from a tag's earlier run, are
    left out; a sample within K that has no row gets an error row, "not asked")."""
    if score is None:
        score = _modules().scoring.score
    rows = _sampled_rows(nodeid, q, rows, samples)
    got: dict[str, Score] = {}
    views: dict[str, dict[str, float]] = {}
    sample_views: dict[str, dict[str, float]] = {}  # samples 2..K: read by their arm's SampleVerdict
    empty: Score | None = None
    for arm, row in rows.items():
        if A.is_judge(arm):
            continue  # a verdict on another arm's answer, not an answer (see _judged below)
        if row.status == "ok":
            sc = scores.get(arm) if scores is not None else None
            got[arm] = sc = sc if sc is not None else score(q, row.text or "", options)
            if A.is_repeat(arm):
                continue  # --repeat-orig asks: the noise floor, not an arm of the comparison
            arm_views = sc.views
        elif A.is_repeat(arm):
            continue
        else:
            if empty is None:
                empty = score(q, "", options)
            arm_views = empty.views
        if arm_views:
            (sample_views if A.is_sample(arm) else views)[arm] = dict(arm_views)
    if q.kind == "vqa" and _modules().judge.JUDGED_VIEW in options.views:
        _judged(q, rows, got, views)
        _judged(q, rows, got, sample_views)
    verdicts = _sample_verdicts(q, rows, got, views, sample_views, samples) if samples > 1 else {}
    return QuestionResult(nodeid, q, types if types is not None else reported_types(q.types, lambda t: t),
                          rows, got, chance(q), views, options, verdicts)


def _sampled_rows(nodeid: str, q: Question, rows: dict[str, AnswerRow], samples: int) -> dict[str, AnswerRow]:
    """`rows` with exactly samples 2..K of each arm: those beyond K (and their judges' verdicts)
    left out, a missing one an error row (never a smaller K, nothing leaves a denominator)."""
    if samples <= 1 and A.SAMPLE not in "".join(rows):
        return rows  # no sample arm (the usual case): 0.6 us a question here, not 3.7
    def beyond(arm: str) -> bool:
        return A.is_sample(arm) and A.sample_of(arm)[1] > samples
    kept = rows if not any(beyond(A.judged(a) if A.is_judge(a) else a) for a in rows) else {
        a: r for a, r in rows.items() if not beyond(A.judged(a) if A.is_judge(a) else a)}
    if samples <= 1:
        return kept
    from pytest_satbench.core.records import AnswerRow

    out = dict(kept)
    for arm in [a for a in kept if _sampled(a)]:
        for k in range(2, samples + 1):
            name = A.sample_arm(arm, k)
            if name not in out:
                out[name] = AnswerRow(
                    nodeid=nodeid, arm=name, fingerprint="", status="error", benchmark=q.benchmark,
                    question_key=q.key, image_id=q.image.id,
                    error=f"sample {k} of --samples {samples} not asked: rerun the same command to ask it")
    return out


def _sampled(arm: str) -> bool:
    """An arm that has samples: orig, each reconstruction, blind."""
    return not (A.is_judge(arm) or A.is_repeat(arm) or A.is_sample(arm))


def _sample_verdicts(q: Question, rows: Mapping[str, AnswerRow], scores: Mapping[str, Score],
                     views: Mapping[str, Mapping[str, float]], sample_views: Mapping[str, Mapping[str, float]],
                     samples: int) -> dict[str, SampleVerdict]:
    """Each arm's `SampleVerdict` over its samples 1..K (module docstring, "Samples")."""
    out: dict[str, SampleVerdict] = {}
    for arm in [a for a in rows if _sampled(a)]:
        names = [A.sample_arm(arm, k) for k in range(1, samples + 1)]
        got = [scores.get(n) for n in names]
        own_views = [views.get(arm, {})] + [sample_views.get(n, {}) for n in names[1:]]
        view_names = sorted({v for vs in own_views for v in vs})
        if any(rows[n].status != "ok" or sc is None for n, sc in zip(names, got)):
            # an error: 0 in every figure, wrong in the majority vote where the kind has one
            out[arm] = SampleVerdict(samples, True, 0.0, None, None if q.kind == "ref" else False, None,
                                     tuple((v, 0.0) for v in view_names))
            continue
        ok = [sc for sc in got if sc is not None]
        mean = sum(sc.correct for sc in ok) / samples
        credit = tuple((v, sum(float(vs.get(v, 0.0)) for vs in own_views) / samples) for v in view_names)
        if q.kind == "ref":  # boxes: no majority answer (module docstring)
            out[arm] = SampleVerdict(samples, False, mean, None, None, None, credit)
            continue
        counts: dict[str, int] = {}
        for sc in ok:  # insertion order: the earliest sample first, so a tie goes to it
            counts[sc.extracted] = counts.get(sc.extracted, 0) + 1
        majority = max(counts, key=counts.__getitem__)  # the first of the largest counts
        first = next(sc for sc in ok if sc.extracted == majority)
        out[arm] = SampleVerdict(samples, False, mean, majority, bool(first.correct), counts[majority] / samples,
                                 credit)
    return out


def _judged(q: Question, rows: Mapping[str, AnswerRow], scores: Mapping[str, Score],
            views: dict[str, dict[str, float]]) -> None:
    """VRSBench's official evaluation: where its rules leave an answer undecided and the run asked
    the judge (`--judge`), the judge's verdict is the official view's value. Without a verdict
    (no judge, or the judge failed: an error row) the value stays the rules' 0."""
    judge, final_answer = _modules().judge, _modules().scoring.final_answer
    JUDGED_VIEW, judge_verdict, official_rules = judge.JUDGED_VIEW, judge.judge_verdict, judge.official_rules
    for arm, value in views.items():
        verdict = rows.get(A.judge_arm(arm))
        if verdict is None or verdict.status != "ok" or arm not in scores or JUDGED_VIEW not in value:
            continue
        if official_rules(q.answer, final_answer(rows[arm].text or "")) is None:
            value[JUDGED_VIEW] = float(judge_verdict(verdict.text or ""))


class _Lazy:
    """The scorer and the judge's rules, imported with the first question scored (a few
    attribute reads per question after that, not an import statement each)."""

    def __init__(self) -> None:
        from pytest_satbench.core import judge, scoring

        self.judge, self.scoring = judge, scoring


_LAZY: list[_Lazy] = []


def _modules() -> _Lazy:
    if not _LAZY:
        _LAZY.append(_Lazy())
    return _LAZY[0]
