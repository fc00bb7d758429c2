"""Answer-level analysis: which answers a model gives, and how a codec changes them.

Accuracy says how often a model is right; it does not say whether it is right for the right
reason. A model that answers "no" to every presence question gets the share of "no" questions
right, which on an unbalanced split looks respectable. So, per question type and arm:

- **confusion**: ground-truth answer class x extracted answer class, for the most frequent
  ground-truth classes (`top`); every other class is pooled as `(other)`, and replies that
  could not be read (or got no answer at all) are their own column, `(unreadable)`;
- **per-class recall** (the share of questions of a ground-truth class answered right) and
  **balanced accuracy**, their unweighted mean over the classes present: "always no" scores
  50% on a yes/no type whatever the split;
- the **majority-class baseline** (answer every question of the type with its most frequent
  ground truth) beside the uniform-random one the statistics already give;
- for every reconstruction arm, the **answer transitions** orig -> recon per type: how many
  answers moved from one class to another (presence yes -> no 412, no -> yes 37), which shows
  how a codec hurts, not only how much.

Answer classes are the scorer's normalised forms (`Score.extracted`; the ground truth through
the same normalisation), so `"Yes."` and `"yes"` are one class. Multiple-choice classes are the
option letters (so a letter bias shows); grounding answers are boxes and have no classes, so
`ref` questions are left out. A question with several types counts once in each, as in the
statistics. Pure: computed from a `BenchmarkResult`, the same records every number comes from.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pytest_satbench.core import arms as A
from pytest_satbench.core.question import Question
from pytest_satbench.core.results import BenchmarkResult, QuestionOutcome, QuestionResult
from pytest_satbench.core.scoring import _gt_letter, normalize_vqa

OTHER = "(other)"
UNREADABLE = "(unreadable)"
# what the analysis reads of a question: its rows' status, scores, types and answer classes
Item = QuestionResult | QuestionOutcome
TOP = 8  # classes shown per type: enough for yes/no, comparisons and the common counts


@dataclass(frozen=True, slots=True)
class ClassRecall:
    answer: str  # ground-truth class
    n: int
    correct: int

    @property
    def recall(self) -> float:
        return self.correct / self.n if self.n else float("nan")


@dataclass(frozen=True, slots=True)
class Confusion:
    """Counts of (ground truth, extracted answer); rows and columns name the classes."""

    rows: tuple[str, ...]  # ground-truth classes, most frequent first (ties by value), then (other)
    columns: tuple[str, ...]  # the same classes, then (unreadable)
    counts: tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True)
class ArmAnswers:
    recall: tuple[ClassRecall, ...]  # every ground-truth class, most frequent first
    balanced_accuracy: float  # mean of the per-class recalls
    confusion: Confusion


@dataclass(frozen=True, slots=True)
class Transition:
    before: str  # the original's answer class
    after: str  # the reconstruction's
    count: int


@dataclass(frozen=True)
class TypeAnswers:
    qtype: str
    n: int
    majority_answer: str
    majority_accuracy: float  # answering every question of the type with its majority class
    by_arm: dict[str, ArmAnswers]
    # per reconstruction arm: answers that changed class, most frequent first
    transitions: dict[str, tuple[Transition, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class AnswerAnalysis:
    by_type: dict[str, TypeAnswers]
    majority_accuracy: float  # over all questions, each answered with its type's majority class


def answer_class(q: Question, extracted: str | None) -> str:
    """The class of an extracted answer: its normalised text (or letter), `(unreadable)`."""
    return extracted if extracted else UNREADABLE


_TRUTHS: dict[tuple[object, ...], str] = {}


def truth_class(q: Question) -> str:
    # remembered: a benchmark has a few hundred distinct ground truths over 222k questions,
    # and normalising each again was a tenth of the report's CPU at RSVQA-HR size
    key = (q.kind, q.answer, q.choices)
    got = _TRUTHS.get(key)
    if got is None:
        if len(_TRUTHS) > 65536:
            _TRUTHS.clear()
        got = _TRUTHS[key] = _gt_letter(q) if q.kind == "mc" else normalize_vqa(q.answer)
    return got


def _extracted(item: Item, arm: str) -> str | None:
    sc = item.scores.get(arm)
    return sc.extracted if sc is not None and sc.parsed else None


def analyse(result: BenchmarkResult, top: int = TOP) -> AnswerAnalysis | None:
    """None when the benchmark has no question with answer classes (grounding only)."""
    items = [it for it in result.items if it.question.kind != "ref"]
    if not items:
        return None
    arms = [a for a in result.stats.arms if a != A.BLIND or any(a in it.rows for it in items)]
    by_type: dict[str, list[Item]] = defaultdict(list)
    for it in items:
        for t in dict.fromkeys(it.types):
            by_type[t].append(it)
    out = {t: _type_answers(t, group, arms, top) for t, group in sorted(by_type.items())}
    majority_right = sum(_majority(items_of_primary) for items_of_primary in _by_primary(items).values())
    return AnswerAnalysis(out, majority_right / len(items))


def _by_primary(items: Iterable[Item]) -> dict[str, list[Item]]:
    out: dict[str, list[Item]] = defaultdict(list)
    for it in items:
        out[it.types[0]].append(it)
    return out


def _majority(items: list[Item]) -> int:
    return Counter(truth_class(it.question) for it in items).most_common(1)[0][1]


def _natural(label: str) -> tuple[int, float, str]:
    """A class's place among classes as frequent: numbers in numeric order, then text."""
    try:
        return (0, float(label), label)
    except ValueError:
        return (1, 0.0, label)


def _type_answers(qtype: str, items: list[Item], arms: list[str], top: int) -> TypeAnswers:
    truths = [truth_class(it.question) for it in items]
    freq = Counter(truths)
    # most frequent first, ties by value (numbers in numeric order): not by which came first, so the table does not depend on
    # the order the store gives the questions in (a merged store's shards, a resumed run)
    ranked = sorted(freq.items(), key=lambda kv: (-kv[1], _natural(kv[0])))
    shown = [c for c, _ in ranked[:top]]
    rows = tuple(shown + ([OTHER] if len(freq) > len(shown) else []))
    columns = tuple(shown + [OTHER, UNREADABLE])
    by_arm: dict[str, ArmAnswers] = {}
    for arm in arms:
        answered = [(it, truth) for it, truth in zip(items, truths, strict=True) if arm in it.rows]
        if not answered:
            continue
        by_arm[arm] = _arm_answers(answered, arm, rows, columns, shown)
    majority, count = ranked[0]
    transitions = {
        arm: _transitions(items, arm, shown) for arm in arms if A.is_recon(arm)
    }
    return TypeAnswers(qtype, len(items), majority, count / len(items), by_arm, transitions)


def _bucket(cls: str, shown: list[str]) -> str:
    return cls if cls in shown or cls == UNREADABLE else OTHER


def _arm_answers(
    answered: list[tuple[Item, str]], arm: str, rows: tuple[str, ...], columns: tuple[str, ...],
    shown: list[str],
) -> ArmAnswers:
    per_class: dict[str, list[int]] = {}
    cells: Counter[tuple[str, str]] = Counter()
    for it, truth in answered:
        got = per_class.setdefault(truth, [0, 0])
        got[0] += 1
        got[1] += it.correct(arm)
        cells[(_bucket(truth, shown), _bucket(answer_class(it.question, _extracted(it, arm)), shown))] += 1
    recall = tuple(ClassRecall(c, n, k) for c, (n, k) in sorted(per_class.items(), key=lambda kv: (-kv[1][0], kv[0])))
    balanced = sum(r.recall for r in recall) / len(recall)
    counts = tuple(tuple(cells[(r, c)] for c in columns) for r in rows)
    return ArmAnswers(recall, balanced, Confusion(rows, columns, counts))


def _transitions(items: list[Item], arm: str, shown: list[str]) -> tuple[Transition, ...]:
    moved: Counter[tuple[str, str]] = Counter()
    for it in items:
        if A.ORIG not in it.rows or arm not in it.rows:
            continue
        before = _bucket(answer_class(it.question, _extracted(it, A.ORIG)), shown)
        after = _bucket(answer_class(it.question, _extracted(it, arm)), shown)
        if before != after:
            moved[(before, after)] += 1
    return tuple(Transition(b, a, n) for (b, a), n in sorted(moved.items(), key=lambda kv: (-kv[1], kv[0])))


def to_dict(analysis: AnswerAnalysis) -> dict[str, object]:
    """Plain JSON for summary.json."""
    def arm_dict(a: ArmAnswers) -> dict[str, object]:
        return {
            "balanced_accuracy": a.balanced_accuracy,
            "recall": [{"answer": r.answer, "n": r.n, "correct": r.correct, "recall": r.recall} for r in a.recall],
            "confusion": {"rows": list(a.confusion.rows), "columns": list(a.confusion.columns),
                          "counts": [list(r) for r in a.confusion.counts]},
        }

    return {
        "majority_accuracy": analysis.majority_accuracy,
        "by_type": {
            t: {
                "n": ta.n, "majority_answer": ta.majority_answer, "majority_accuracy": ta.majority_accuracy,
                "by_arm": {arm: arm_dict(a) for arm, a in ta.by_arm.items()},
                "transitions": {arm: [{"before": x.before, "after": x.after, "count": x.count} for x in xs]
                                for arm, xs in ta.transitions.items()},
            }
            for t, ta in analysis.by_type.items()
        },
    }


def recall_rows(analysis: AnswerAnalysis) -> Iterable[Mapping[str, object]]:
    """One row per type, arm and ground-truth class (answer_classes.csv)."""
    for t, ta in analysis.by_type.items():
        for arm, a in ta.by_arm.items():
            for r in a.recall:
                yield {"type": t, "arm": arm, "answer": r.answer, "n": r.n, "correct": r.correct,
                       "recall": r.recall, "balanced_accuracy": a.balanced_accuracy,
                       "majority_answer": ta.majority_answer, "majority_accuracy": ta.majority_accuracy}


def transition_rows(analysis: AnswerAnalysis) -> Iterable[Mapping[str, object]]:
    """One row per type, reconstruction arm and changed answer (answer_transitions.csv)."""
    for t, ta in analysis.by_type.items():
        for arm, xs in ta.transitions.items():
            for x in xs:
                yield {"type": t, "arm": arm, "orig_answer": x.before, "recon_answer": x.after, "count": x.count}
