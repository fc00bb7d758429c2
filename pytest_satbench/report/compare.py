# Why one file of ~600 lines: a comparison is read, paired, tested, printed and written from the
# same records (ComparisonReport); its terminal table and its files share the row builders.
"""`python -m pytest_satbench.report --compare A B`: one arm of a tag against another.

A and B are each `TAG` (the tag's `orig` arm), `TAG:ARM` or `:ARM` (an arm of the newest run's
tag: `--compare :tok32 :tok64` compares two budgets of one sweep). An arm is named by its
canonical spec (`jpeg:quality=10`) or by its label in the tables (`jpeg:q10`, `tok64`).

Each side is read as its tag's report reads it: `report.build.collect` on the tag's newest run
(every stored answer of the tag's questions, the newest per question and arm, re-scored), its
`each` hook turning each `QuestionResult` into a `core.compare.SideAnswer` for the side's arm.
Nothing is scored here: `core.compare` pairs the two sides by question key and computes every
figure with `core.stats`. What the two runs measured differently is listed from their
recorded protocols (`differences`); answers to other data (another dataset file hash) are
refused unless `--allow-different-data`, which pairs only the questions both have.

Written to `reports/<benchmark>/compare/<A>-vs-<B>/`: summary.json, per_type.csv,
discordant.jsonl (every discordant pair), report.md and report.html (the same tables; the
HTML adds the question browser's images and its filter by type and direction).
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_satbench.core import arms as A
from pytest_satbench.core import formatting as F
from pytest_satbench.core.compare import (
    Comparison,
    Pairing,
    SideAnswer,
    compare,
    pair,
)
from pytest_satbench.core.defaults import BOOTSTRAP
from pytest_satbench.core.redact import redact
from pytest_satbench.core.results import BenchmarkResult, QuestionResult
from pytest_satbench.core.stats import ArmOutcome
from pytest_satbench.engine.store import ResultStore
from pytest_satbench.report import html, markdown
from pytest_satbench.report.build import collect, tag_runs
from pytest_satbench.report.document import (
    Block,
    Card,
    Cell,
    Code,
    Column,
    Document,
    Facet,
    Filter,
    Gallery,
    Group,
    Heading,
    Notice,
    Paragraph,
    Table,
    Thumbnail,
    cell,
    rich,
)

__all__ = [
    "BROWSER_CAP", "CompareError", "ComparisonReport", "Side", "differences", "parse_side", "resolve_side",
    "run_comparison", "side_answer", "terminal_lines", "write_comparison",
]

# discordant questions shown per type and direction in report.html (every one is in discordant.jsonl), and
# how many of them with the image each side sent (a thumbnail is ~20 kB of the page)
BROWSER_CAP = 50
THUMBS = 6
ANSWER_CHARS = 300  # an answer as kept for the browser
# the browser's directions: (as discordant.jsonl and the headings say it, the filter's value)
DIRECTIONS = (("A right, B wrong", "a_right"), ("A wrong, B right", "b_right"))
# protocol fields that say nothing about what an answer measures (or are shown per side)
_BOOKKEEPING = ("run_id", "tag", "date", "command", "planned", "servers", "servers_file", "arms", "codec_identity",
                "datasets", "shard", "distortion")


class CompareError(Exception):
    """A comparison that cannot be made: one line for the user."""


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a comparison: an arm of a tag, read through the tag's newest run."""

    spec: str  # as the user wrote it
    tag: str
    arm: str  # canonical arm name
    run_id: str  # the tag's newest run (whose report this side is)
    protocol: Mapping[str, Any]

    @property
    def label(self) -> str:
        """`tag` for its orig arm, `tag:label` otherwise (the arm's table label)."""
        return self.tag if self.arm == A.ORIG else f"{self.tag}:{A.short_label(self.arm)}"

    @property
    def folder(self) -> str:
        return re.sub(r"[^A-Za-z0-9._\-]+", "_", self.label).strip("._") or "default"


def parse_side(text: str) -> tuple[str | None, str | None]:
    """`TAG` -> (TAG, None); `TAG:ARM` -> (TAG, ARM); `:ARM` -> (None, ARM). A tag holds no
    colon (an arm spec may: `t:jpeg:quality=10` is tag t, arm jpeg:quality=10)."""
    tag, sep, arm = text.partition(":")
    if not sep:
        return (text or None), None
    return (tag or None), (arm or None)


def _arms_of_tag(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    out: dict[str, None] = {}
    for r in runs:
        for a in (r["protocol"].get("arms") or []):
            out.setdefault(str(a), None)
    return list(out)


def resolve_side(store: ResultStore, text: str, all_runs: Sequence[Mapping[str, Any]] | None = None) -> Side:
    """The side `text` names (`parse_side`), or CompareError saying what exists."""
    runs = list(all_runs if all_runs is not None else store.runs())
    if not runs:
        raise CompareError(f"no runs in {store.path}")
    tag, arm = parse_side(text)
    if tag is None:
        tag = str(runs[0]["tag"])
    mine = [r for r in runs if r["tag"] == tag]
    if not mine:
        tags = sorted({str(r["tag"]) for r in runs})
        raise CompareError(f"{text!r}: no run with tag {tag!r} in {store.path} (tags: {', '.join(tags)})")
    arms = _arms_of_tag(mine)
    if arm is None:
        arm = A.ORIG
    if arm not in arms:
        by_label = [a for a in arms if A.short_label(a) == arm or A.arm_labels(arms)[0].get(a) == arm]
        if len(by_label) != 1:
            shown = ", ".join(f"{A.short_label(a)} ({a})" if A.short_label(a) != a else a for a in arms)
            raise CompareError(f"{text!r}: tag {tag!r} has no arm {arm!r} (its arms: {shown})")
        arm = by_label[0]
    newest = mine[0]
    return Side(text, tag, arm, str(newest["run_id"]), dict(newest["protocol"]))


def side_answer(it: QuestionResult, arm: str) -> SideAnswer | None:
    """What the comparison reads of one question's verdict in `arm` (None: the arm has no row
    for it). The verdict is the item's own (`core.verdict`): an answered arm's score, an
    error counted wrong, a truncated answer scored on what it contains, as every report does."""
    row = it.rows.get(arm)
    if row is None:
        return None
    if row.status == "ok":
        sc = it.scores[arm]
        outcome = ArmOutcome("ok", bool(sc.correct), bool(sc.parsed), row.finish_reason == "length")
        answer = row.text or ""
    else:
        outcome = ArmOutcome("error", False, False, False)
        answer = f"(no answer: {row.error or 'error'})"
    q = it.question
    return SideAnswer(q.key, q.image.id, it.types, outcome, dict(it.views.get(arm, {})), it.chance,
                      q.text, q.answer, answer[:ANSWER_CHARS], q.image.path, row.image_sha256)


# --------------------------------------------------------------------------- what differs

def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, Mapping):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): d}


def differences(a: Side, b: Side, benchmark: str) -> list[tuple[str, Any, Any]]:
    """(field, A's value, B's value) for every recorded protocol field in which the two sides
    differ: model and served root, sampling (max tokens), prompt style, box grid, IoU, judge,
    the plugin's version, --limit, the arm, the arm's codec identity (a checkpoint's sha256)
    and the benchmark's dataset file hashes."""
    pa = {k: v for k, v in a.protocol.items() if k not in _BOOKKEEPING}
    pb = {k: v for k, v in b.protocol.items() if k not in _BOOKKEEPING}
    fa, fb = _flat(pa), _flat(pb)
    out = [(k, fa.get(k), fb.get(k)) for k in sorted(fa.keys() | fb.keys()) if fa.get(k) != fb.get(k)]
    if a.arm != b.arm:
        out.append(("arm", a.arm, b.arm))
    ia = (a.protocol.get("codec_identity") or {}).get(a.arm)
    ib = (b.protocol.get("codec_identity") or {}).get(b.arm)
    if ia != ib:
        out.append(("codec identity", ia, ib))
    da = _flat((a.protocol.get("datasets") or {}).get(benchmark) or {}, "datasets.")
    db = _flat((b.protocol.get("datasets") or {}).get(benchmark) or {}, "datasets.")
    out += [(f"{k} (sha256)", da.get(k), db.get(k)) for k in sorted(da.keys() | db.keys()) if da.get(k) != db.get(k)]
    return out


def different_data(a: Side, b: Side, benchmark: str) -> list[str]:
    """The dataset files of `benchmark` whose recorded hashes differ (both sides recorded them)."""
    da = (a.protocol.get("datasets") or {}).get(benchmark) or {}
    db = (b.protocol.get("datasets") or {}).get(benchmark) or {}
    if not da or not db:
        return []
    return sorted(k for k in da.keys() | db.keys() if da.get(k) != db.get(k))


def _value(v: Any) -> str:
    if v is None:
        return "(none)"
    s = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
    return s if len(s) <= 60 else s[:57] + "..."


def differences_line(diffs: Sequence[tuple[str, Any, Any]]) -> str:
    if not diffs:
        return "What differs: nothing the runs recorded (the same protocol and arm)."
    return "What differs: " + "; ".join(f"{k}: {_value(x)} -> {_value(y)}" for k, x, y in diffs) + "."


# --------------------------------------------------------------------------- collecting

@dataclass
class _Collected:
    answers: dict[tuple[str, str], list[SideAnswer]] = field(default_factory=dict)  # (bench, arm) -> answers
    results: dict[str, BenchmarkResult] = field(default_factory=dict)


def _collect(store: ResultStore, run_id: str, arms: Sequence[str], benches: set[str]) -> _Collected:
    """The run's tag-wide results (as its report builds them) and, per benchmark in `benches`
    and arm in `arms`, every question's `SideAnswer`."""
    got = _Collected()

    def each(bench: str, tag: str) -> Callable[[QuestionResult], None] | None:
        if bench not in benches:
            return None
        lists = [got.answers.setdefault((bench, arm), []) for arm in arms]

        def add(it: QuestionResult) -> None:
            for arm, out in zip(arms, lists, strict=True):
                s = side_answer(it, arm)
                if s is not None:
                    out.append(s)

        return add

    for res in collect(store, run_id, iterations=0, each=each):
        got.results[res.benchmark] = res
    return got


@dataclass
class ComparisonReport:
    """One benchmark's comparison, ready to print and write."""

    benchmark: str
    a: Side
    b: Side
    pairing: Pairing
    comparison: Comparison
    diffs: list[tuple[str, Any, Any]]
    data_note: str | None  # --allow-different-data: which files differ
    runs_a: tuple[str, ...]
    runs_b: tuple[str, ...]
    skipped: tuple[str, ...] = ()  # benchmarks both have but without a question in common (one line each)

    @property
    def left_out_line(self) -> str:
        p = self.pairing
        if not (p.only_a or p.only_b):
            return f"Every question pairs: {len(p.records)} questions both sides answered."
        return (f"Left out: {p.only_a} question{'' if p.only_a == 1 else 's'} only A has, {p.only_b} only B has "
                f"(each side's questions with no row in its arm, or not recorded by its tag); "
                f"{len(p.records)} pair.")


def run_comparison(store: ResultStore, spec_a: str, spec_b: str, *, benchmark: str | None = None,
                   allow_different_data: bool = False, iterations: int = BOOTSTRAP, seed: int = 0) -> list[ComparisonReport]:
    """The comparison of A and B per benchmark both have (or `benchmark`). Raises CompareError
    (one line) for an unknown tag or arm, no benchmark in common, data that differs without
    `allow_different_data`, a question key twice in one side, or no question in common in any
    benchmark (a benchmark without one is left out when others have some)."""
    runs = store.runs()
    a = resolve_side(store, spec_a, runs)
    b = resolve_side(store, spec_b, runs)
    benches_a, benches_b = set(store.run_benchmarks(a.run_id)), set(store.run_benchmarks(b.run_id))
    common = benches_a & benches_b
    if benchmark is not None:
        if benchmark not in common:
            raise CompareError(f"benchmark {benchmark!r} is not in both: A ({a.label}) has "
                               f"{', '.join(sorted(benches_a)) or 'none'}, B ({b.label}) has "
                               f"{', '.join(sorted(benches_b)) or 'none'}")
        common = {benchmark}
    if not common:
        raise CompareError(f"A ({a.label}) and B ({b.label}) have no benchmark in common")
    notes: dict[str, str | None] = {}
    for bench in sorted(common):
        files = different_data(a, b, bench)
        notes[bench] = None
        if files:
            if not allow_different_data:
                raise CompareError(
                    f"{bench}: A ({a.label}) and B ({b.label}) were measured on different data ({', '.join(files)} "
                    "differ by sha256); pass --allow-different-data to pair only the questions both have")
            notes[bench] = (f"Different data: {', '.join(files)} differ by sha256 between the two runs; only the "
                            "questions both have are paired (--allow-different-data).")
    if a.run_id == b.run_id:
        both = _collect(store, a.run_id, list(dict.fromkeys([a.arm, b.arm])), common)
        got_a = got_b = both
    else:
        got_a = _collect(store, a.run_id, [a.arm], common)
        got_b = _collect(store, b.run_id, [b.arm], common)
    out = []
    empty = []
    for bench in sorted(common):
        try:
            pairing = pair(got_a.answers.get((bench, a.arm), []), got_b.answers.get((bench, b.arm), []))
        except ValueError as exc:  # one key twice in a tag (two test files under one tag): no pairing
            raise CompareError(f"{bench}: {exc}") from None
        if not pairing.records:
            empty.append(f"{bench}: no question has an answer on both sides (A {a.label}: {pairing.only_a}, "
                         f"B {b.label}: {pairing.only_b})")
            continue
        # the figures both sides could compute (a figure read from a view one side lacks, such as
        # a judge's verdict, would count that side's questions 0)
        on_b = {agg.name for agg in got_b.results[bench].declared_figures()}
        figures = [agg for agg in got_a.results[bench].declared_figures() if agg.name in on_b]
        cmp_ = compare(pairing, figures, iterations=iterations, seed=seed)
        out.append(ComparisonReport(
            bench, a, b, pairing, cmp_, differences(a, b, bench), notes[bench],
            tuple(str(r["run_id"]) for r in tag_runs(store, a.run_id, bench, runs)),
            tuple(str(r["run_id"]) for r in tag_runs(store, b.run_id, bench, runs)),
        ))
    if not out:
        raise CompareError("; ".join(empty))
    out[0].skipped = tuple(f"{line}: left out" for line in empty)
    return out


# --------------------------------------------------------------------------- output

def _pct(x: float | None) -> str:
    return F.percent(x)


def terminal_lines(rep: ComparisonReport) -> list[str]:
    """The comparison as the terminal prints it."""
    c = rep.comparison
    lines = [
        f"satbench compare {rep.benchmark}: A = {rep.a.label} ({rep.a.arm}, run {rep.a.run_id}), "
        f"B = {rep.b.label} ({rep.b.arm}, run {rep.b.run_id})",
        *F.prose(differences_line(rep.diffs)),
    ]
    if rep.data_note:
        lines += F.prose(rep.data_note)
    lines += F.prose(rep.left_out_line)
    for line in rep.skipped:
        lines += F.prose(line)
    lines += F.prose(f"delta = B - A in points, 95% CI clustered by image; b = A right & B wrong, c = A wrong & B "
                     f"right; p = exact McNemar; p(Holm) adjusted over the {c.tests} tests of this comparison")
    head = f"{'group':<22}{'n':>7}{'A':>7}{'B':>7}{'delta':>8}  {'95% CI':<16}{'b':>6}{'c':>6}  {'p':<7}{'p(Holm)':<7}"
    lines.append(head)
    for r in c.rows():
        name = r.group if r.kind != "figure" else f"[{r.group}]"
        if r.same_as:
            name += "="
        lines.append(
            f"{name[:21]:<22}{r.n:>7}{_pct(r.accuracy_a):>7}{_pct(r.accuracy_b):>7}{F.points(r.delta):>8}  "
            f"{F.points_interval(r.ci_low, r.ci_high):<16}{_count(r.b):>6}{_count(r.c):>6}  "
            f"{F.p_value(r.mcnemar_p):<7}{F.p_value(r.holm_p):<7}")
    if c.figures:
        lines += F.prose("[figure]: the benchmark's declared figures (headline first; '=' the overall row by "
                         "construction, not tested twice); a figure without b/c has no McNemar test (a mean of "
                         "types, or fractional credit)")
    return lines


def _count(x: int | None) -> str:
    return F.MISSING if x is None else str(x)


def summary_dict(rep: ComparisonReport) -> dict[str, Any]:
    c = rep.comparison

    def side(s: Side, runs: tuple[str, ...]) -> dict[str, Any]:
        return {"spec": s.spec, "label": s.label, "tag": s.tag, "arm": s.arm, "run_id": s.run_id, "runs": list(runs),
                "model": s.protocol.get("model")}

    return redact({
        "benchmark": rep.benchmark,
        "a": side(rep.a, rep.runs_a),
        "b": side(rep.b, rep.runs_b),
        "delta": "B - A, percentage points",
        "pairs": len(rep.pairing.records),
        "only_a": rep.pairing.only_a,
        "only_b": rep.pairing.only_b,
        "left_out": rep.left_out_line,
        "differences": [{"field": k, "a": x, "b": y} for k, x, y in rep.diffs],
        "different_data": rep.data_note,
        "test": "exact McNemar (two-sided) on the discordant pairs b (A right, B wrong) and c (A wrong, B right)",
        "correction": f"Holm (1979) over the {c.tests} tests of this comparison (holm_p)",
        "tests": c.tests,
        "interval": "95% percentile interval of a bootstrap clustered by image",
        "iterations": c.iterations,
        "seed": c.seed,
        "level": c.level,
        "overall": c.overall.to_dict(),
        "by_type": {t: r.to_dict() for t, r in c.by_type.items()},
        "figures": {n: r.to_dict() for n, r in c.figures.items()},
    })


_CSV_FIELDS = ("group", "kind", "label", "n", "n_images", "accuracy_a", "a_ci_low", "a_ci_high", "accuracy_b",
               "b_ci_low", "b_ci_high", "delta_pp", "delta_ci_low_pp", "delta_ci_high_pp", "b", "c", "mcnemar_p",
               "holm_p", "same_as")


def per_type_csv(rep: ComparisonReport) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=_CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for r in rep.comparison.rows():
        w.writerow({k: ("" if v is None else v) for k, v in r.to_dict().items()})
    return buf.getvalue()


def discordant(rep: ComparisonReport) -> Iterable[dict[str, Any]]:
    """Every discordant pair: key, types, image, question, truth, both answers, direction."""
    for x, y in zip(rep.pairing.a, rep.pairing.b, strict=True):
        if x.outcome.correct == y.outcome.correct:
            continue
        yield {"key": x.key, "types": list(x.types), "image_id": x.image, "question": x.question, "truth": x.truth,
               "answer_a": x.answer, "answer_b": y.answer,
               "direction": "A right, B wrong" if x.outcome.correct else "A wrong, B right"}


def _num(h: str) -> Column:
    return Column(rich(h), "numeric")


def _txt(h: str) -> Column:
    return Column(rich(h))


def document(rep: ComparisonReport, *, browser_cap: int = BROWSER_CAP, images: _Images | None = None) -> Document:
    c = rep.comparison
    doc = Document(f"{rep.benchmark}: {rep.b.label} vs {rep.a.label}")
    doc.add(
        Heading(1, rich(rep.benchmark, ": ", Code(rep.b.label), " versus ", Code(rep.a.label), " (paired)")),
        Paragraph(rich("A = ", Code(rep.a.label), " (arm ", Code(rep.a.arm), f", tag {rep.a.tag}, run {rep.a.run_id}); "
                       "B = ", Code(rep.b.label), " (arm ", Code(rep.b.arm), f", tag {rep.b.tag}, run {rep.b.run_id}). "
                       "Each side is its tag's report: every stored answer of the tag's questions, the newest per "
                       "question, re-scored. Questions are paired by their key.")),
        Paragraph(rich(differences_line(rep.diffs))),
    )
    if rep.data_note:
        doc.add(Notice(rich(rep.data_note)))
    doc.add(Paragraph(rich(rep.left_out_line)))
    doc.add(
        Heading(2, rich("B minus A per question type, overall and per figure")),
        Paragraph(rich(
            "Accuracy of each side (%) with its 95% interval; delta = B - A in percentage points with its 95% "
            "interval from a bootstrap clustered by image; b = A right and B wrong, c = A wrong and B right (an "
            "error counts wrong); p = exact McNemar on b and c; ", f"p (Holm) = Holm-adjusted over the {c.tests} "
            "tests of this comparison. Figures are the benchmark's declared figures (headline first); a figure "
            "without b/c is a mean of types or of fractional credits and has no McNemar test; one marked ",
            Code("= overall"), " is the overall row by construction and is not tested twice.")),
    )
    rows: list[tuple[Cell, ...]] = []
    for r in c.rows():
        name = r.group if r.kind != "figure" else r.label
        rows.append(tuple(cell(x) for x in (
            name if not r.same_as else f"{name} (= overall)", str(r.n), str(r.n_images),
            f"{_pct(r.accuracy_a)} ({F.percent_interval(r.a_ci_low, r.a_ci_high)})",
            f"{_pct(r.accuracy_b)} ({F.percent_interval(r.b_ci_low, r.b_ci_high)})",
            F.points(r.delta), F.points_interval(r.ci_low, r.ci_high), _count(r.b), _count(r.c),
            F.p_value(r.mcnemar_p), F.p_value(r.holm_p))))
    doc.add(Table((_txt("group"), _num("pairs"), _num("images"), _num("A"), _num("B"), _num("delta"),
                   _txt("95% CI"), _num("b"), _num("c"), _num("McNemar p"), _num("p (Holm)")), tuple(rows)))
    doc.add(*_browser(rep, browser_cap, images))
    return doc


def _browser(rep: ComparisonReport, cap: int, images: _Images | None = None) -> list[Block]:
    """The discordant questions per type and direction (at most `cap` each, in key order).
    With `images` (report.html), the first `THUMBS` of each as cards with the image each side
    sent, each type and direction a `Group` and a `Filter` over them; without (report.md),
    the same headings and tables in sequence."""
    groups: dict[tuple[str, str], list[tuple[SideAnswer, SideAnswer]]] = {}
    for x, y in zip(rep.pairing.a, rep.pairing.b, strict=True):
        if x.outcome.correct == y.outcome.correct:
            continue
        direction = "A right, B wrong" if x.outcome.correct else "A wrong, B right"
        for t in x.types:
            groups.setdefault((t, direction), []).append((x, y))
    out: list[Block] = [Heading(2, rich("Discordant questions"))]
    if not groups:
        out.append(Paragraph(rich("No question is right on one side and wrong on the other.")))
        return out
    index = "; ".join(f"{t}, {d}: {len(p)}" for (t, d), p in sorted(groups.items()))
    out.append(Paragraph(rich(
        f"Per question type and direction ({index}), the first {cap} in question-key order",
        f", the first {THUMBS} with the image each side sent (in report.html)" if images is not None else "",
        "; every one is in ", Code("discordant.jsonl"), ".")))
    if images is not None:
        out.append(Filter(_facets(groups)))
    token = dict(DIRECTIONS)
    for (t, direction), pairs in sorted(groups.items()):
        pairs.sort(key=lambda p: _key_order(p[0].key))
        shown = pairs[:cap]
        blocks: list[Block] = [Heading(3, rich(f"{t}: {direction} ({len(pairs)})"))]
        if images is not None:
            blocks.append(Gallery(tuple(
                Card(x.key, ", ".join(x.types), x.question[:300], x.truth,
                     (images.thumbnail("A", rep.a, x), images.thumbnail("B", rep.b, y)))
                for x, y in shown[:THUMBS])))
        blocks.append(Table((_txt("key"), _txt("question"), _txt("truth"), _txt("A's answer"), _txt("B's answer")),
                            tuple((cell(Code(x.key)), cell(x.question[:160]), cell(x.truth[:80]),
                                   cell(x.answer[:160]), cell(y.answer[:160])) for x, y in shown)))
        if len(pairs) > cap:
            blocks.append(Paragraph(rich(f"... and {len(pairs) - cap} more (in discordant.jsonl).")))
        if images is not None:
            out.append(Group((("type", t), ("direction", token[direction])), tuple(blocks)))
        else:
            out += blocks
    return out


def _facets(groups: Mapping[tuple[str, str], Sequence[tuple[SideAnswer, SideAnswer]]]) -> tuple[Facet, ...]:
    """The browser's filter: every type and both directions, each with its discordant
    questions (a question of two types counts once per direction)."""
    by_type: dict[str, int] = {}
    by_direction: dict[str, set[str]] = {}
    for (t, d), pairs in sorted(groups.items()):
        by_type[t] = by_type.get(t, 0) + len(pairs)
        by_direction.setdefault(d, set()).update(x.key for x, _ in pairs)
    return (Facet("type", "question type", tuple((t, f"{t} ({n})") for t, n in by_type.items())),
            Facet("direction", "direction",
                  tuple((v, f"{d} ({len(by_direction.get(d, ()))})") for d, v in DIRECTIONS)))


class _Images:
    """The image each side sent, as a thumbnail: the source file for `orig`; a cheap codec's
    reconstruction made again; an expensive one's looked up in the reconstruction cache by the
    sha256 of the bytes sent (as the report's gallery does). What cannot be had is said."""

    def __init__(self, recon_cache: Path | None) -> None:
        from pytest_satbench.engine.diskcache import PayloadLookup

        self._disk = PayloadLookup(recon_cache)
        self._pipes: dict[str, Any] = {}

    def thumbnail(self, which: str, side: Side, s: SideAnswer) -> Thumbnail:
        label = f"{which}: {side.label}"
        b64, note = None, ""
        try:
            b64, note = self._image(side.arm, s)
        except Exception as exc:  # noqa: BLE001  (a missing image must not cost the report)
            note = f"image unavailable: {type(exc).__name__}: {exc}"[:200]
        return Thumbnail(label, s.answer[:120], s.outcome.correct, b64, note)

    def _image(self, arm: str, s: SideAnswer) -> tuple[str | None, str]:
        from pytest_satbench.codecs import build_codecs, disk_cacheable, normalise_spec
        from pytest_satbench.core.question import ImageRef
        from pytest_satbench.engine.images import ImagePipeline
        from pytest_satbench.report.gallery import thumbnail

        if arm == A.BLIND:
            return None, "no image (blind arm)"
        if arm != A.ORIG and disk_cacheable(arm):
            data = self._disk.get(s.sent_sha256) if s.sent_sha256 else None
            if data is None:
                return None, "reconstruction not kept (not in the reconstruction cache)"
            return thumbnail(data), ""
        if not s.image_path:
            return None, "image embedded in the dataset; not kept by the run"
        if arm == A.ORIG:
            from PIL import Image

            with Image.open(s.image_path) as im:
                return thumbnail(im), ""
        if arm not in self._pipes:
            self._pipes[arm] = ImagePipeline(build_codecs([normalise_spec(arm)]), workers=1)
        made = self._pipes[arm].prepare(ImageRef(s.image, path=s.image_path)).arms[arm]
        note = "regenerated; not byte-identical to what was sent" if s.sent_sha256 and made.sha256 != s.sent_sha256 else ""
        return thumbnail(made.jpeg), note

    def close(self) -> None:
        for pipe in self._pipes.values():
            pipe.close()
        self._pipes.clear()


def _key_order(key: str) -> tuple[int, int, str]:
    """Numeric keys in numeric order, then the others in text order."""
    return (0, int(key), "") if key.isdigit() else (1, 0, key)


def write_comparison(rep: ComparisonReport, out_root: Path, *, browser_cap: int = BROWSER_CAP,
                     recon_cache: Path | None = None) -> Path:
    """reports/<benchmark>/compare/<A>-vs-<B>/: summary.json, per_type.csv, discordant.jsonl,
    report.md, report.html (with the images each side sent for the first discordant questions;
    `recon_cache`: the plugin's reconstruction cache, for expensive codecs). Returns the folder."""
    folder = Path(out_root) / rep.benchmark / "compare" / f"{rep.a.folder}-vs-{rep.b.folder}"
    folder.mkdir(parents=True, exist_ok=True)
    images = _Images(recon_cache)
    try:
        with_images = document(rep, browser_cap=browser_cap, images=images)
    finally:
        images.close()
    files = {
        "summary.json": json.dumps(summary_dict(rep), indent=2, sort_keys=False) + "\n",
        "per_type.csv": per_type_csv(rep),
        "discordant.jsonl": "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in discordant(rep)),
        "report.md": markdown.to_markdown(document(rep, browser_cap=browser_cap)),
        "report.html": html.to_html(with_images),
    }
    for name, text in files.items():
        tmp = folder / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(folder / name)
    return folder
