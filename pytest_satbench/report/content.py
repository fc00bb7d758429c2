# Why one file of ~590 lines: it is report.md's and report.html's one content, section by section
# in the order a reader meets them (each section a short function); split by section, every
# module would import the same formatting helpers and the document model for one function.
"""What report.md and report.html say: one `Document` built from a `BenchmarkResult`.

Every arm is named by `core.arms.arm_labels` (the terminal's labels, e.g. `tok48`,
`jpeg:q10`), with the full spec in a legend under the first tables, and every number is
written by `core.formatting`, so a figure reads the same in the terminal, report.md and
report.html. The answer-level section is `core.analysis`'s (confusion, per-class recall,
balanced accuracy, majority baseline, orig -> recon transitions); an incomplete run is said
with `core.text_summary.not_run_line`, the terminal's sentence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_satbench.core import analysis as AN
from pytest_satbench.core import arms as A
from pytest_satbench.core import distortion_flips as DF
from pytest_satbench.core import formatting as F
from pytest_satbench.core.figures_json import aggregate_views, figure_key
from pytest_satbench.core.results import BenchmarkResult
from pytest_satbench.core.stats import GroupStats
from pytest_satbench.core.text_summary import not_run_line, render_stats, shard_line, subset_line
from pytest_satbench.core.usage import ServerUsage, resized_line, visual_summary
from pytest_satbench.engine.config import sampling_of
from pytest_satbench.report import plots
from pytest_satbench.report.build import NOT_MEASURED, DistortionResult, token_curve
from pytest_satbench.report.document import (
    Block,
    Card,
    Cell,
    Code,
    Column,
    Document,
    Figure,
    Gallery,
    Heading,
    Inline,
    Notice,
    Paragraph,
    Preformatted,
    Rich,
    Table,
    Thumbnail,
    cell,
    rich,
)
from pytest_satbench.report.files import clipped_by_arm, limited
from pytest_satbench.report.gallery import Entry
from pytest_satbench.report.why import reasons_text

__all__ = ["build"]

# Truncation of user text in the tables and the gallery cards: enough to recognise the
# question, short enough that one long question does not widen the whole table.
QUESTION_CHARS = 160
CARD_QUESTION_CHARS = 300
CARD_ANSWER_CHARS = 120
# The answer section at RSVQA-HR scale (4 types, counts and areas with many classes): a
# confusion table per type for orig (core.analysis keeps its top classes, pools the rest);
# for every arm where the type has this few rows (yes/no, rural/urban); the largest moves
# per type and reconstruction arm.
CONFUSION_ALL_ARMS_ROWS = 3
TRANSITIONS_SHOWN = 10
CLASS_CHARS = 24  # an answer class as a column header (open answers can be sentences)
_COMPUTE: Any = object()  # build's `answers` default: analyse the result here


def _percent(x: float | None) -> str:
    # formatting.percent is the bare number (terminal columns say "%" once, in the title);
    # report cells stand alone, so they carry the unit
    s = F.percent(x)
    return s if s == F.MISSING else s + "%"


def _accuracy_with_interval(x: float | None, lo: float | None, hi: float | None) -> str:
    interval = F.percent_interval(lo, hi)
    return f"{_percent(x)} [{interval}]" if interval != F.MISSING else _percent(x)


def _seconds(x: float | None) -> str:
    s = F.number(x)
    return s if s == F.MISSING else s + " s"


def _count(x: int | None) -> str:
    # traffic counters are None when the run did not record them (older stores)
    return F.MISSING if x is None else str(x)


def _list(parts: Sequence[Rich], sep: str = ", ") -> Rich:
    out: list[Inline] = []
    for i, p in enumerate(parts):
        if i:
            out.append(sep)
        out.extend(p)
    return tuple(out)


def _models(models: Mapping[str, int]) -> Rich:
    return _list([(Code(m), f" x{n}") for m, n in models.items()])


def _num(header: Inline | Rich) -> Column:
    return Column(rich(header), "numeric")


def _text(header: Inline | Rich) -> Column:
    return Column(rich(header), "text")


def build(data: BenchmarkResult, protocol: Mapping[str, Any], gates: Sequence[Mapping[str, Any]] | None,
          gallery: Sequence[Entry], gallery_total: int, *, answers: AN.AnswerAnalysis | None = _COMPUTE,
          asked_anew: Mapping[str, int] | None = None, distortion: DistortionResult | None = None) -> Document:
    """The report of one benchmark of a run. `protocol` is protocol.json's content;
    `gallery` the first regressed questions with their thumbnails, of `gallery_total`;
    `answers` the result's `core.analysis.analyse` when the caller has it (None: no answer
    classes, grounding only); `asked_anew` the run's answers asked anew by reason
    (`report.why.asked_anew`; None: not computed, no sentence); `distortion` the flips against
    distortion (`report.build.distortion_flips`; None: not computed, no section)."""
    st = data.stats
    arms = list(st.arms)
    labels, _ = A.arm_labels(arms)
    if answers is _COMPUTE:
        answers = AN.analyse(data)
    doc = Document(f"satbench report: {data.benchmark} / {data.tag}")
    doc.add(Heading(1, rich(f"{data.benchmark} — {data.tag}")))
    if (shard := shard_line(data)) is not None:  # --shard I/N: which part of the benchmark this run is
        doc.add(Paragraph(rich(shard[:1].upper() + shard[1:] + " (docs/running.md, Sharding).")))
    if data.not_run or data.unfinished:
        line = not_run_line(data)
        doc.add(Notice(rich(line[:1].upper() + line[1:] + ".")))
    if data.subset:
        line = subset_line(data)
        doc.add(Notice(rich(line[:1].upper() + line[1:] + ".")))
    doc.add(*_intro(data, protocol, labels))
    if asked_anew is not None:
        total, parts = sum(asked_anew.values()), reasons_text(asked_anew)
        doc.add(Paragraph(rich(f"Run {data.run_id} asked {total} answer{'' if total == 1 else 's'} anew",
                               f" ({parts})" if parts else "", "; every other answer here came from the store (",
                               Code("python -m pytest_satbench.report --why KEY"), " shows why one was asked).")))
    doc.add(Heading(2, rich("Gates")), _gates(gates))
    doc.add(*_sequential(data, labels))
    doc.add(*_accuracy(data, labels))
    for arm in st.recon_arms:
        doc.add(*_paired(data, arm, labels))
    doc.add(*_figures(data, labels))
    doc.add(*_views(data, labels))
    doc.add(*_tokens(data))
    doc.add(*_visual_tokens(data, labels))
    doc.add(*_answers(data, answers, labels))
    doc.add(*_distortion(data, distortion, labels))
    doc.add(*_noise_floor(data))
    doc.add(*_samples(data))
    doc.add(*_usage(data, labels))
    doc.add(*_reasoning(data, labels))
    doc.add(*_regressed(gallery, gallery_total, labels))
    doc.add(Heading(2, rich("Terminal summary")), Preformatted(tuple(render_stats(st))))
    doc.add(Paragraph(rich(
        "Files: ", Code("summary.json"), " (all numbers), ", Code("per_type.csv"), ", ",
        Code("answer_classes.csv"), ", ", Code("answer_transitions.csv"), ", ", Code("per_image.csv"), ", ", Code("predictions.jsonl"), " (every answer), ", Code("protocol.json"), " (what was measured), ",
        Code("report.html"), " (plots and the gallery).",
    )))
    return doc


def _groups(data: BenchmarkResult) -> list[tuple[str, GroupStats]]:
    return [*data.stats.by_type.items(), ("overall", data.stats.overall)]


def _intro(data: BenchmarkResult, protocol: Mapping[str, Any], labels: Mapping[str, str]) -> list[Paragraph]:
    st = data.stats
    limit = limited(data)
    return [
        Paragraph(rich(
            "Model ", Code(str(protocol.get("model"))), " (as returned by the servers: ",
            _models(data.usage.total.models), "), run ", Code(data.run_id), f", {protocol.get('date', '')}. "
            f"{len(data.items)} questions on {st.overall.n_images} images; arms: ",
            _list([(Code(labels[a]),) for a in st.arms]), ".",
        )),
        *([Paragraph(rich(
            f"Limited run (--limit {limit}): a sample of {len(data.items)} questions with each question type in "
            "proportion to its size (at least one per type, fixed seed), so overall accuracy estimates the full "
            "run's; per-type figures rest on fewer questions."))] if limit else []),
        Paragraph(rich(
            "Prompt style ", Code(str(protocol.get("prompt_style"))), f", sampling: {_sampling(protocol)}, "
            "box grid ", Code(str(data.score_options.box_grid)), ", IoU ", Code(str(data.score_options.iou)),
            f". {_order(protocol)}Answers re-scored from the stored raw text. API errors and unparseable answers stay in the "
            "denominator and count as wrong; a truncated answer stays too, scored on what it contains. "
            "Intervals: 95% percentile bootstrap clustered by "
            f"image ({st.iterations} resamples, seed {st.seed}).",
        )),
    ]


def _sampling(protocol: Mapping[str, Any]) -> str:
    """The model settings the requests carried (protocol.json's `sampling`), those not sent left out."""
    import json

    got = sampling_of(protocol)
    first = ("temperature", "max_tokens", "top_p", "seed", "system_prompt", "extra_body")
    shown = []
    for key in [*(k for k in first if k in got), *(k for k in got if k not in first)]:
        value = got[key]
        if value is None:
            continue
        text = json.dumps(value, sort_keys=True) if isinstance(value, dict | list | str) else str(value)
        shown.append(f"{key} {text if len(text) <= 80 else text[:77] + '...'}")
    return ", ".join(shown)


def _order(protocol: Mapping[str, Any]) -> str:
    """Which order the images were asked in (protocols before --order recorded none)."""
    order = protocol.get("order") or {}
    if order.get("kind") == "random":
        return f"Images asked in random order (seed {order.get('seed')}), each image's questions together. "
    return "Images asked in dataset order. " if order.get("kind") == "dataset" else ""


def _gates(gates: Sequence[Mapping[str, Any]] | None) -> Paragraph | Table:
    if not gates:
        return Paragraph(rich("no gates"))
    rows = []
    for g in gates:
        v = g.get("value")
        passed = bool(g.get("passed"))
        rows.append((
            cell(Code(str(g.get("expr", "")))),
            cell("PASS" if passed else "FAIL", "pass" if passed else "fail"),
            cell(str(g.get("figure") or F.MISSING)),
            cell(F.number(v, ".4g") if isinstance(v, int | float) else F.MISSING),
            cell(str(g.get("reason", ""))),
        ))
    return Table((_text("gate"), _text("result"), _text("figure"), _num("value"), _text("reason")), tuple(rows))


def _accuracy(data: BenchmarkResult, labels: Mapping[str, str]) -> list[Block]:
    st = data.stats
    arms = list(st.arms)
    heading = "Accuracy per question type and arm"
    out: list[Block] = [
        Heading(2, rich(heading)),
        Figure(plots.accuracy_bars(st, f"{data.benchmark}: accuracy per type and arm (whiskers: 95% CI)", dict(labels))),
        Paragraph(rich(f"{data.labels.table}: accuracy, 95% interval in brackets{_caveat(data)}; 'random' is the "
                       "uniform-random reference where it is defined.")),
    ]
    rows = []
    for label, g in _groups(data):
        cells = [cell(label), cell(str(g.n))]
        for arm in arms:
            a = g.accuracy.get(arm)
            cells.append(cell(F.MISSING if a is None or not a.n else _accuracy_with_interval(a.accuracy, a.ci_low, a.ci_high)))
        cells.append(cell(_percent(g.chance.accuracy) if g.chance.n_defined else F.MISSING))
        rows.append(tuple(cells))
    out.append(Table((_text("type"), _num("n"), *(_num(Code(labels[a])) for a in arms), _num("random")), tuple(rows)))

    out.append(Paragraph(rich(
        "Answer quality, all questions (per type in per_type.csv): errors = no answer after retries, "
        "truncated = hit the token limit (scored on what it contains), unparseable = answered but not "
        "interpretable (wrong); errors count as wrong.")))
    quality = []
    for arm in arms:
        a = st.overall.accuracy[arm]
        quality.append(tuple(cell(x) for x in (
            Code(labels[arm]), str(a.n), _percent(a.coverage), str(a.errors), str(a.truncated), str(a.unparseable), str(a.missing),
        )))
    out.append(Table((_text("arm"), *(_num(h) for h in ("n", "coverage", "errors", "truncated", "unparseable", "missing"))),
                     tuple(quality)))
    legend = _legend(arms, labels)
    if legend is not None:
        out.append(legend)
    return out


def _legend(arms: Sequence[str], labels: Mapping[str, str]) -> Paragraph | None:
    """`tok16` = `onedpiece:ckpt=...,nlatent=16,...`: the full spec behind each short label."""
    renamed = [a for a in arms if labels[a] != a]
    if not renamed:
        return None
    return Paragraph(rich("Arms: ", _list([(Code(labels[a]), " = ", Code(a)) for a in renamed], "; "), "."))


def _paired(data: BenchmarkResult, arm: str, labels: Mapping[str, str]) -> list[Block]:
    rows = []
    for label, g in _groups(data):
        p = g.paired.get(arm)
        if p is None:
            continue
        o = g.accuracy[A.ORIG].accuracy if A.ORIG in g.accuracy else None
        r = g.accuracy[arm].accuracy if arm in g.accuracy else None
        rows.append(tuple(cell(x) for x in (
            label, str(p.n_pairs), _percent(o), _percent(r), F.points(p.delta), F.points_interval(p.ci_low, p.ci_high),
            str(p.regressed), str(p.improved), F.p_value(p.mcnemar_p), str(p.n_errors), F.points(p.delta_both_ok),
        )))
    columns = (
        _text("type"), _num("pairs"), _num("orig"), _num("recon"), _num("delta"), _text("95% CI" + _caveat(data)),
        _num("regressed"), _num("improved"), _num("McNemar p"), _num("pairs with an error"), _num("delta, both answered"),
    )
    out: list[Block] = [Heading(2, rich(Code(labels[arm]), " minus ", Code(A.ORIG), " (paired, percentage points)"))]
    seq = data.sequential or {}
    got = (seq.get("arms") or {}).get(arm)
    if got is not None and got.get("delta") is not None:
        out.append(Paragraph(rich(
            f"Overall delta {F.points(got['delta'])}, 95% confidence sequence {F.points_interval(*got['cs'])} "
            f"(valid at every look, over the {seq['images_answered']} images asked in the run's order; "
            "see Early stopping).")))
    out.append(Table(columns, tuple(rows)))
    return out


def _caveat(data: BenchmarkResult) -> str:
    """What a fixed-sample interval is labelled with after an early stop."""
    return ", not valid after an early stop" if (data.sequential or {}).get("stopped") else ""


def _sequential(data: BenchmarkResult, labels: Mapping[str, str]) -> list[Block]:
    """--precision / --margin: the rule, whether it stopped the run, and each figure's
    confidence sequence (summary.json's "sequential", rebuilt from the stored answers)."""
    seq = data.sequential
    if not seq:
        return []
    order = seq.get("order") or {}
    out: list[Block] = [Heading(2, rich("Early stopping"))]
    if seq.get("stopped"):
        out.append(Notice(rich(
            f"Stopped early: {seq['reason']}. The fixed-sample 95% intervals in this report (bootstrap, clustered "
            "by image) are not valid after an early stop, which was chosen by looking at the data: read the "
            "confidence sequences below.")))
    out.append(Paragraph(rich(
        "Rule ", Code(str(seq.get("rule"))), f"; images asked in {order.get('kind', 'dataset')} order"
        + (f" (seed {order.get('seed')})" if order.get("kind") == "random" else "")
        + f"; {seq['images_answered']} of {seq['images_total']} images and {seq['questions_answered']} of "
        f"{seq['questions_total']} questions in the sequences. A 95% confidence sequence covers the complete run's "
        "number at every look at once, so it stays valid whenever the run stopped (docs/statistics.md, "
        "\"Confidence sequences and early stopping\").")))
    rows = []
    for arm, got in (seq.get("arms") or {}).items():
        what = "delta" if "delta" in got else "accuracy"
        value = got.get(what)
        lo, hi = got.get("cs") or (None, None)
        if what == "delta":
            shown, interval = F.points(value), F.points_interval(lo, hi)
        else:
            shown, interval = _percent(None if value is None else value / 100), F.percent_interval(
                None if lo is None else lo / 100, None if hi is None else hi / 100)
        rows.append(tuple(cell(x) for x in (
            Code(labels.get(arm, arm)), f"overall {what}", shown, interval, str(got.get("margin") or F.MISSING))))
    out.append(Table((_text("arm"), _text("figure"), _num("value"), _text("95% confidence sequence"),
                      _text("against the margin")), tuple(rows)))
    return out


def _figures(data: BenchmarkResult, labels: Mapping[str, str]) -> list[Block]:
    """Every figure of the benchmark (headline first): per arm its value with the interval
    and, per reconstruction arm, its paired delta; then what each is made of, per type."""
    arms = list(data.stats.arms)
    recon = list(data.stats.recon_arms)
    rows: list[tuple[Cell, ...]] = []
    parts: list[tuple[Cell, ...]] = []
    for agg in data.declared_figures():
        fs = data.figures[agg.name]
        key = figure_key(agg)
        values = [cell(_accuracy_with_interval(fs.accuracy[a].value, fs.accuracy[a].ci_low, fs.accuracy[a].ci_high)
                       if a in fs.accuracy else F.MISSING) for a in arms]
        deltas = [cell(f"{F.points(fs.paired[a].delta)} {F.points_interval(fs.paired[a].ci_low, fs.paired[a].ci_high)}"
                       if a in fs.paired else F.MISSING) for a in recon]
        rows.append((cell(agg.label), cell(Code(key)), cell(str(fs.n)), *values, *deltas))
        verdicts = agg.describe_verdicts(fs.types)
        for t in fs.types:
            per = fs.by_type.get(t, {})
            parts.append((cell(Code(key)), cell(t), cell(verdicts[t]), *(
                cell(f"{_percent(per[a].mean)} of {per[a].n}" if a in per else F.MISSING) for a in arms)))
    columns = (_text("figure"), _text("key"), _num("n"), *(_num(Code(labels[a])) for a in arms),
               *(_text(rich("delta ", Code(labels[a]))) for a in recon))
    out: list[Block] = [
        Heading(2, rich("The benchmark's figures")),
        Paragraph(rich(
            "The headline first, as the benchmark's evaluation computes it, then the views its papers publish; "
            "each label says whose convention it is and what it counts. Value with its 95% interval (clustered "
            "by image) in brackets; delta = the same figure on the per-question difference from ", Code(A.ORIG),
            ", in points, with its interval; n = the questions the figure covers. ", Code("key"),
            " is the figure's name in summary.json (", Code("aggregate_views"), ") and per_type.csv.")),
        Table(columns, tuple(rows)),
    ]
    if data.labels.declares_evaluation:
        out += [
            Paragraph(rich("What each figure is made of: per covered type, the verdict that decides it "
                           "(exact match, or a per-question view) and each arm's share right.")),
            Table((_text("key"), _text("type"), _text("verdict"), *(_num(Code(labels[a])) for a in arms)),
                  tuple(parts)),
        ]
    if data.notes:
        out.append(Paragraph(rich("Loading: ", "; ".join(data.notes), ".")))
    return out


def _views(data: BenchmarkResult, labels: Mapping[str, str]) -> list[Block]:
    arms = list(data.stats.arms)
    agg = aggregate_views(data)
    rows: list[tuple[Cell, ...]] = []
    for name, vs in data.views.items():
        label = agg[f"view:{name}"]["label"]
        rows.append((cell(f"{label}, overall"), *(
            cell(_accuracy_with_interval(vs.overall[a].mean, vs.overall[a].ci_low, vs.overall[a].ci_high)
                 if a in vs.overall else F.MISSING) for a in arms)))
        for t, per in vs.by_type.items():
            if not per:  # no question of this type carries the view
                continue
            rows.append((cell(f"{label}, {t}"), *(cell(_percent(per[a].mean) if a in per else F.MISSING) for a in arms)))
    if not rows:
        return []
    return [Heading(2, rich("The benchmark's per-question views")),
            Table((_text("view"), *(_num(Code(labels[a])) for a in arms)), tuple(rows))]


def _tokens(data: BenchmarkResult) -> list[Block]:
    curve = token_curve(data)
    if curve is None:
        return []
    points, ceilings = curve
    xs = [x for x, _ in sorted(points["overall"])]
    rows = [(cell(label), *(cell(_percent(v)) for _, v in sorted(pts)), cell(_percent(ceilings.get(label))))
            for label, pts in points.items()]
    return [
        Heading(2, rich("Accuracy versus image tokens")),
        Figure(plots.tokens_curve(points, ceilings, f"{data.benchmark}: accuracy versus image tokens")),
        Table((_text("type"), *(_num(f"{F.number(x, 'g')} tokens") for x in xs), _num("orig (ceiling)")), tuple(rows)),
    ]


def _noise_floor(data: BenchmarkResult) -> list[Block]:
    floor = data.noise_floor
    if floor is None:
        return []
    return [Heading(2, rich("Noise floor")), Paragraph(rich(
        f"The original was asked {floor.asks} times on {floor.questions} questions (", Code("--repeat-orig"),
        f"); the verdict changed on {floor.flipped} ({_percent(floor.rate)}). Servers under load "
        "are not deterministic at temperature 0: a per-question change rate below this is not a codec effect.",
    ))]


def _samples(data: BenchmarkResult) -> list[Block]:
    """--samples K: per arm and type, mean-of-K accuracy, majority-vote accuracy and agreement,
    each with its interval, and the paired delta on mean-of-K (`stats.summarize_samples`)."""
    ss = data.samples
    if ss is None:
        return []
    k = ss.k
    arms = list(ss.arms)
    labels, _ = A.arm_labels(arms)
    groups = [(t, g) for t, g in ss.by_type.items()] + [("overall", ss.overall)]
    rows: list[tuple[Cell, ...]] = []
    for t, g in groups:
        for arm in arms:
            a = g.arms.get(arm)
            if a is None:
                continue
            p = g.paired.get(arm)
            rows.append((cell(t), cell(Code(labels[arm])), cell(str(a.n)),
                         cell(_accuracy_with_interval(a.mean, a.ci_low, a.ci_high)),
                         cell(_accuracy_with_interval(a.majority, a.majority_ci_low, a.majority_ci_high)
                              if a.majority_n else F.MISSING), cell(str(a.majority_n)),
                         cell(_accuracy_with_interval(a.agreement, a.agreement_ci_low, a.agreement_ci_high)
                              if a.agreement_n else F.MISSING),
                         cell(f"{F.points(p.delta)} {F.points_interval(p.ci_low, p.ci_high)}" if p else F.MISSING),
                         cell(str(a.errors))))
    seeds = (data.protocol.get("samples") or {}).get("seeds")
    return [
        Heading(2, rich("Samples")),
        Paragraph(rich(
            f"Every question was asked {k} times per arm (", Code(f"--samples {k}"), "; request seeds ",
            Code(", ".join("none" if s is None else str(s) for s in seeds) if seeds else "-"),
            "; sample 1 is the arm itself, which the per-type, paired and view tables read). Mean-of-", str(k),
            ": each question credited with the share of its answers that are right. Majority: its most frequent "
            "answer as the scorer normalises it (a tie goes to the earliest sample), credited when right; boxes "
            "have none (grounding questions count in mean-of-", str(k), " only, n maj says how many have one). "
            "Agreement: the share of a question's answers that give its majority answer. Delta: mean-of-", str(k),
            " minus ", Code(A.ORIG), "'s on the same questions, in points. A question with a sample unanswered "
            "counts 0 (errors). The benchmark's figures above are computed on mean-of-", str(k),
            ". Intervals: 95% bootstrap clustered by image, for these questions under the model's sampling.")),
        Table((_text("type"), _text("arm"), _num("n"), _num(f"mean-of-{k}"), _num("majority"), _num("n maj"),
               _num("agreement"), _text("delta"), _num("errors")), tuple(rows)),
    ]


def _usage_row(name: str, s: ServerUsage) -> tuple[Cell, ...]:
    return tuple(cell(x) for x in (
        name, _count(s.requests), str(s.answers), _count(s.failures), _count(s.retries),
        F.number(s.prompt_tokens, ","), F.number(s.completion_tokens, ","),
        "$" + F.number(s.cost, ".6f") if s.rows_with_cost else F.MISSING, f"{s.rows_with_cost}/{s.answers}",
        _seconds(s.latency_mean_s), _seconds(s.latency_p50_s), _seconds(s.latency_p95_s),
        _count(s.limit), _count(s.peak_in_flight), s.steered_by or F.MISSING, _models(s.models),
    ))


def _usage(data: BenchmarkResult, labels: Mapping[str, str]) -> list[Block]:
    u = data.usage
    columns = (
        _text("server"), _num("attempts"), _num("answers"), _num("failures"), _num("retries"),
        _num("prompt tokens"), _num("completion tokens"), _num("cost (reported)"), _num("answers with cost"),
        _num("latency mean"), _num("p50"), _num("p95"), _num("limit at end"), _num("peak in flight"),
        _text("limit steered by"), _text("models returned"),
    )
    rows = tuple(_usage_row(name, s) for name, s in [*u.by_server.items(), ("all", u.total)])
    out: list[Block] = [
        Heading(2, rich("Usage")),
        Table(columns, rows),
        Paragraph(rich(
            "Attempts are the HTTP requests sent, failures the attempts that got no answer (a retry may "
            "have answered later), retries the attempts that repeated a failed one; ", Code(F.MISSING),
            " where the run did not record its traffic. The limit is how many requests the client allowed "
            "the server in flight (adaptive per server under ", Code("--concurrency"), "'s cap, steered by the "
            "server's vLLM metrics or by the latency and rate the client saw; summed over xdist workers).")),
        Paragraph(rich(f"Answers: {u.asked} asked by this run, {u.reused} reused from the store.")),
    ]
    if any(len(t.points) > 1 for t in u.limits):
        out.append(Figure(plots.limits_over_time(
            [(t.server if t.process == "main" else f"{t.server} ({t.process})", t.points) for t in u.limits],
            f"{data.benchmark}: in-flight limit per server over the run")))
    errors: Rich = rich(f"API errors (no answer after retries, no usage): {u.errors}")
    if u.errors:
        errors = rich(errors, " (", _list([(Code(labels.get(a, a)), f": {n}") for a, n in u.errors_by_arm.items()]), ")")
    out.append(Paragraph(rich(errors, ".")))
    clipped = clipped_by_arm(data)
    clip: Rich = rich(f"Answers clipped at --max-answer-chars (scored on the text kept): {sum(clipped.values())}")
    if clipped:
        clip = rich(clip, " (", _list([(Code(labels.get(a, a)), f": {n}") for a, n in clipped.items()]), ")")
    out.append(Paragraph(rich(clip, ".")))
    toks = {a: t for a, t in u.image_tokens.items() if t is not None}
    if toks:
        out.append(Paragraph(rich(
            "Mean image tokens per image: ",
            _list([(Code(labels.get(a, a)), f": {F.number(t, 'g')}") for a, t in toks.items()]), ".")))
    return out


def _reasoning(data: BenchmarkResult, labels: Mapping[str, str]) -> list[Block]:
    """Per arm whose answers carried reasoning: its length in tokens and the replies cut off
    while thinking (core/reasoning.py); nothing for a model that never reasons."""
    got = data.usage.reasoning
    if not got:
        return []
    estimated = any(s.estimated for s in got.values())
    rows = tuple(tuple(cell(x) for x in (
        labels.get(arm, arm), str(s.answers), str(s.with_reasoning),
        F.number(s.tokens_mean, ",.0f") if s.tokens_mean is not None else F.MISSING,
        F.number(s.tokens_median, ",.0f") if s.tokens_median is not None else F.MISSING,
        f"{s.reported}/{s.with_reasoning}", F.number(s.chars_mean, ",.0f") if s.chars_mean is not None else F.MISSING,
        str(s.truncated), str(s.truncated_thinking),
    )) for arm, s in got.items())
    columns = (_text("arm"), _num("answers"), _num("with reasoning"),
               _num("mean reasoning tokens" + (" (some estimated)" if estimated else "")), _num("median"),
               _num("tokens reported by the server"), _num("mean reasoning characters"), _num("truncated"),
               _num("cut off while thinking"))
    return [
        Heading(2, rich("Reasoning")),
        Table(columns, rows),
        Paragraph(rich(
            "The model's thinking (", Code("reasoning_content"), ", or ", Code("<think>"),
            " left inline) is stored beside each answer and never scored. Reasoning tokens are the server's ",
            Code("usage.completion_tokens_details.reasoning_tokens"), " where it reported them; otherwise an "
            "estimate: the reply's completion tokens times the reasoning's share of its characters"
            + (" (the column says so when any answer's count is estimated)" if estimated else "") + ". Mean and "
            "median are over the answers with reasoning. Truncated: answers that stopped for length (--max-new); cut "
            "off while thinking: of those, the ones with no final answer. They are answers, scored on what they "
            "contain (usually wrong), never asked again.")),
    ]


def _class(c: str) -> str:
    return c if len(c) <= CLASS_CHARS else c[: CLASS_CHARS - 1] + "…"


def _answers(data: BenchmarkResult, answers: AN.AnswerAnalysis | None, labels: Mapping[str, str]) -> list[Block]:
    """Answers: what the model says. Per type the majority baseline beside the random one and
    each arm's balanced accuracy; a confusion table per type (a heat map in HTML); then how
    each reconstruction moves answers from one class to another."""
    if answers is None:
        return []
    st = data.stats
    arms = [a for a in st.arms if any(a in ta.by_arm for ta in answers.by_type.values())]
    out: list[Block] = [
        Heading(2, rich("Answers: what the model says")),
        Paragraph(rich(
            "Accuracy says how often the model is right, not whether it tells the answers apart. Per type: the "
            "majority baseline (every question answered with the type's most frequent ground truth) beside the "
            "uniform-random reference, and each arm's balanced accuracy, the mean of the per-class recalls (the "
            "share of each ground-truth answer answered right): answering \"no\" to every yes/no question scores "
            "50% whatever the split. Answer classes are the scorer's normalised answers (letters for multiple "
            f"choice); a type shows its {AN.TOP} most frequent ground-truth answers, the rest pooled as ",
            Code(AN.OTHER), "; ", Code(AN.UNREADABLE), " is no interpretable answer (API errors included). Every "
            "class per arm in ", Code("answer_classes.csv"), ".")),
    ]
    rows = []
    for t, ta in answers.by_type.items():
        chance = st.by_type[t].chance if t in st.by_type else None
        n_classes = max((len(a.recall) for a in ta.by_arm.values()), default=0)
        rows.append((cell(t), cell(str(ta.n)), cell(str(n_classes)), cell(_class(ta.majority_answer)),
                     cell(_percent(ta.majority_accuracy)),
                     cell(_percent(chance.accuracy) if chance is not None and chance.n_defined else F.MISSING),
                     *(cell(_percent(ta.by_arm[a].balanced_accuracy) if a in ta.by_arm else F.MISSING) for a in arms)))
    chance = st.overall.chance
    rows.append((cell("overall"), cell(str(len([it for it in data.items if it.question.kind != "ref"]))), cell(F.MISSING),
                 cell(F.MISSING), cell(_percent(answers.majority_accuracy)),
                 cell(_percent(chance.accuracy) if chance.n_defined else F.MISSING), *(cell(F.MISSING) for _ in arms)))
    out.append(Table((_text("type"), _num("n"), _num("classes"), _text("majority answer"), _num("majority baseline"),
                      _num("random"), *(_num(rich("balanced ", Code(labels[a]))) for a in arms)), tuple(rows)))
    for t, ta in answers.by_type.items():
        out += _confusion(t, ta, arms, labels)
    out += _transitions(answers, labels)
    return out


def _confusion(qtype: str, ta: AN.TypeAnswers, arms: Sequence[str], labels: Mapping[str, str]) -> list[Block]:
    """One type's ground truth x answer counts, shaded by the share of their row: orig's,
    and every arm's when the type has few classes."""
    first = A.ORIG if A.ORIG in ta.by_arm else next(iter(ta.by_arm), None)
    if first is None:
        return []
    conf = ta.by_arm[first].confusion
    small = len(conf.rows) <= CONFUSION_ALL_ARMS_ROWS
    shown = [a for a in arms if a in ta.by_arm] if small else [first]
    body: list[tuple[Cell, ...]] = []
    for arm in shown:
        a = ta.by_arm[arm]
        recall = {r.answer: r for r in a.recall}
        for truth, counts in zip(a.confusion.rows, a.confusion.counts, strict=True):
            total = sum(counts)
            if truth == AN.OTHER:  # pooled: the classes not shown
                pooled = [r for r in a.recall if r.answer not in a.confusion.rows]
                n, k = sum(r.n for r in pooled), sum(r.correct for r in pooled)
            else:
                n, k = (recall[truth].n, recall[truth].correct) if truth in recall else (0, 0)
            body.append((
                *((cell(Code(labels[arm])),) if small else ()), cell(_class(truth)), cell(str(total)),
                *(cell(str(c), shade=c / total if total else None) for c in counts),
                cell(_percent(k / n) if n else F.MISSING),
            ))
    columns = (*((_text("arm"),) if small else ()), _text("ground truth"), _num("n"),
               *(_num(_class(c)) for c in conf.columns), _num("recall"))
    which = rich("every arm") if small else rich(Code(labels[first]))
    return [
        Heading(3, rich(f"{qtype}: ground truth x answer, ", which)),
        Table(columns, tuple(body)),
    ]


def _transitions(answers: AN.AnswerAnalysis, labels: Mapping[str, str]) -> list[Block]:
    moves = [(t, arm, xs) for t, ta in answers.by_type.items() for arm, xs in ta.transitions.items()]
    if not moves:
        return []  # no reconstruction arm
    out: list[Block] = [
        Heading(3, rich("How each reconstruction changes answers")),
        Paragraph(rich(
            f"Per type and reconstruction arm, the {TRANSITIONS_SHOWN} largest moves of an answer from its class on ",
            Code(A.ORIG), " to another on the reconstruction (questions both arms have; a move between two pooled "
            "classes stays inside ", Code(AN.OTHER), " and is not counted); a type and arm not listed changed no "
            "answer. Every move in ", Code("answer_transitions.csv"), ".")),
    ]
    rows: list[tuple[Cell, ...]] = []
    for t, arm, xs in moves:
        for x in xs[:TRANSITIONS_SHOWN]:
            rows.append((cell(t), cell(Code(labels.get(arm, arm))), cell(_class(x.before)), cell(_class(x.after)),
                         cell(str(x.count))))
        rest = xs[TRANSITIONS_SHOWN:]
        if rest:
            others = f"{len(rest)} other move" + ("s" if len(rest) != 1 else "")
            rows.append((cell(t), cell(Code(labels.get(arm, arm))), cell(others), cell(""),
                         cell(str(sum(x.count for x in rest)))))
    if not rows:
        out.append(Paragraph(rich("No answer changed class on any reconstruction.")))
        return out
    out.append(Table((_text("type"), _text("arm"), _text(rich(Code(A.ORIG), " answer")), _text("reconstruction answer"),
                      _num("count")), tuple(rows)))
    return out


def _regressed(gallery: Sequence[Entry], total: int, labels: Mapping[str, str]) -> list[Block]:
    out: list[Block] = [Heading(2, rich("Regressed questions"))]
    if not total:
        out.append(Paragraph(rich("No question was answered right on the original and wrong on a reconstruction.")))
        return out
    out.append(Paragraph(rich(f"{total} questions regressed; the first {len(gallery)} by question key "
                              "(images in report.html):")))
    out.append(Gallery(tuple(
        Card(e.key, ", ".join(e.types), e.text[:CARD_QUESTION_CHARS], e.answer, tuple(
            Thumbnail(labels.get(p.arm, p.arm), p.answer[:CARD_ANSWER_CHARS], p.correct, p.thumb_b64, p.note)
            for p in e.panels))
        for e in gallery)))
    rows = []
    for e in gallery:
        answers = _list([(Code(labels.get(p.arm, p.arm)), f": {p.answer} ({'right' if p.correct else 'wrong'})")
                         for p in e.panels], "; ")
        rows.append((cell(e.key), cell(", ".join(e.types)), cell(e.text[:QUESTION_CHARS]), cell(e.answer), cell(answers)))
    out.append(Table(tuple(_text(h) for h in ("key", "type", "question", "ground truth", "answers")), tuple(rows)))
    return out


# --------------------------------------------------------------------------- why: tokens, distortion

def _visual_tokens(data: BenchmarkResult, labels: Mapping[str, str]) -> list[Block]:
    """Per arm: the prompt tokens the server reported, paired with the original's and the blind
    arm's (the image's own visual tokens, as the server counts them), the codec's tokens, and
    the accuracy per 1,000 of each kind (`core.usage.visual_summary`)."""
    st = data.stats
    acc = {a: s.accuracy for a, s in st.overall.accuracy.items() if s.n}
    summary = visual_summary(data.usage, acc)
    if not summary:
        return [Heading(2, rich("Visual tokens")),
                Paragraph(rich("The servers reported no prompt tokens and no codec reports tokens per image."))]
    rows = []
    for arm, v in summary.items():
        rows.append((
            cell(Code(labels.get(arm, arm))), cell(str(v["answers_with_prompt_tokens"])),
            cell(F.number(v["prompt_tokens_mean"], ",.1f")),
            cell(F.MISSING if arm == A.ORIG or not v["paired_orig"]
                 else f"{F.number(v['delta_orig_mean'], '+.1f')} ({v['differ_orig']} of {v['paired_orig']} differ)"),
            cell(F.number(v["server_visual_tokens_mean"], ",.1f")),
            cell(F.number(v["codec_tokens_per_image"], "g")),
            cell(_percent(v["accuracy"])),
            cell(F.number(v["accuracy_per_1k_server_visual_tokens"], ".3f")),
            cell(F.number(v["accuracy_per_1k_codec_tokens"], ".3f")),
        ))
    out: list[Block] = [
        Heading(2, rich("Visual tokens")),
        Paragraph(rich(
            "Prompt tokens are what the server reported (", Code("usage.prompt_tokens"), "), the mean over the arm's "
            "answers that reported them; delta vs ", Code(A.ORIG), " is the mean paired difference on the same "
            "question (every arm is sent at the same geometry with the same text, so a difference means the server "
            "resized or tokenised the two images differently); server visual tokens are the mean paired difference "
            "from the ", Code(A.BLIND), " arm's prompt (no image), the image's own tokens as the server counts them ("
            , Code("--blind"), " to measure them); codec tokens per image are the codec's own (One-D-Piece: latent "
            "tokens x tiles), the mean over the arm's answers. Accuracy (exact match, every question) per 1,000 "
            "tokens = 1000 x accuracy / mean tokens, for each kind.")),
        Table((_text("arm"), _num("answers with prompt tokens"), _num("mean prompt tokens"),
               _num(rich("delta vs ", Code(A.ORIG))), _num("server visual tokens"), _num("codec tokens per image"),
               _num("accuracy"), _num("accuracy / 1k server visual tokens"), _num("accuracy / 1k codec tokens")),
              tuple(rows)),
    ]
    line = resized_line(data.usage, labels)
    if line:
        out.append(Notice(rich(line[:1].upper() + line[1:] + ".")))
    return out


def _psnr(lo: float, hi: float) -> str:
    def one(x: float) -> str:
        return "inf" if x == float("inf") else F.number(x, ".1f")

    if lo != lo:  # NaN: an empty bin
        return F.MISSING
    return one(lo) if lo == hi else f"{one(lo)}-{one(hi)}"


def _rate(r: DF.Rate) -> str:
    if not r.n:
        return F.MISSING
    return f"{_accuracy_with_interval(r.value, r.ci_low, r.ci_high)} ({r.events}/{r.n})"


def _slope(s: DF.Slope) -> str:
    if s.slope is None:
        sign = {-1: " (negative)", 1: " (positive)"}.get(s.sign, "")
        return f"none: {s.reason}{sign}"
    return f"{F.number(s.slope, '+.3f')} [{F.number(s.ci_low, '+.3f')}, {F.number(s.ci_high, '+.3f')}]"


def _distortion(data: BenchmarkResult, got: DistortionResult | None, labels: Mapping[str, str]) -> list[Block]:
    """Per reconstruction arm and type: regression and improvement rates by PSNR quintile of the
    images (a chart per arm in HTML), and the slope of a logistic fit of "regressed" on PSNR."""
    if got is None or (got.flips is None and got.absent is None):
        return []  # not computed here, or no reconstruction arm
    out: list[Block] = [Heading(2, rich("Flips against distortion"))]
    if got.flips is None:
        out.append(Paragraph(rich(
            f"Distortion: {NOT_MEASURED}: this run measured no PSNR, SSIM, MS-SSIM or LPIPS (a run with ",
            Code("--distortion on"), " measures them and asks nothing again).") if got.absent == NOT_MEASURED
            else rich(f"No figure: {got.absent}.")))
        return out
    fl = got.flips
    out.append(Paragraph(rich(
        f"Per reconstruction arm, the images are ranked by the arm's PSNR against the original (as sent) and cut into "
        f"{fl.bins} bins of equal image count, Q1 the most distorted; images with equal PSNR share a bin (identical "
        "reconstructions, PSNR inf, are in the last). Regression = the share of the questions ", Code(A.ORIG),
        " got right that the arm got wrong; improvement = the share of those it got wrong that the arm got right; "
        "each with its 95% interval (bootstrap clustered by image, fixed sample, given the bins). The slope is a "
        "logistic fit of regressed on PSNR (log-odds per dB) over the questions the original got right, with a 95% "
        "cluster-robust (by image) interval: negative means right answers are lost more often on worse images. "
        "Association only: badly reconstructed images are also busy scenes; PSNR is not what a VLM sees. "
        "Every image in ", Code("per_image.csv"), " with its PSNR, SSIM, MS-SSIM and LPIPS (",
        *((f"from the weights with sha256 {', '.join(w[:12] for w in got.lpips_weights)}",) if got.lpips_weights
          else ("not measured: ", Code("--lpips-weights"), " was not given")), ").")))
    slopes: list[tuple[Cell, ...]] = []
    for arm, af in fl.by_arm.items():
        label = labels.get(arm, arm)
        overall = af.by_type.get(DF.ALL_TYPES)
        ticks = [f"Q{b.index} {_psnr(b.psnr_low, b.psnr_high)}" for b in overall.bins] if overall else []
        series = {t: [(b.regressed.value, b.regressed.ci_low, b.regressed.ci_high) if b.regressed.n else None
                      for b in tf.bins] for t, tf in af.by_type.items()}
        out.append(Heading(3, rich(Code(label), f": flips by PSNR bin ({af.images} images)")))
        if af.images:
            out.append(Figure(plots.rates_by_bin(series, ticks, f"{data.benchmark} / {label}: regression rate by PSNR bin",
                                                 "PSNR bin (dB), most distorted first")))
        rows = []
        for t, tf in af.by_type.items():
            for b in tf.bins:
                rows.append((cell(t), cell(f"Q{b.index}"), cell(_psnr(b.psnr_low, b.psnr_high)), cell(str(b.images)),
                             cell(str(b.questions)), cell(_rate(b.regressed)), cell(_rate(b.improved))))
            s = tf.slope
            slopes.append((cell(Code(label)), cell(t), cell(str(s.questions)), cell(str(s.images)),
                           cell(str(s.regressed)), cell(_slope(s))))
        out.append(Table((_text("type"), _text("bin"), _num("PSNR (dB)"), _num("images"), _num("questions"),
                          _num("regression"), _num("improvement")), tuple(rows)))
        notes = []
        if af.without_distortion:
            notes.append(f"{af.without_distortion} of its {af.questions} questions are on images with no distortion "
                         "stored and are in no bin")
        if af.infinite:
            notes.append(f"{af.infinite} images were reconstructed identically (PSNR inf): binned, not in the slope")
        if notes:
            out.append(Paragraph(rich("; ".join(notes)[:1].upper() + "; ".join(notes)[1:] + ".")))
    out += [
        Heading(3, rich("Association: regressed against PSNR")),
        Table((_text("arm"), _text("type"), _num(rich("questions ", Code(A.ORIG), " right")), _num("images"),
               _num("regressed"), _text("slope per dB [95% CI]")), tuple(slopes)),
    ]
    return out
