"""A benchmark's results as fixed-width text: the terminal summary (and report.md's copy).

It stays within 80 columns: one table of accuracy per arm (titled with what its verdict
is), then one paired table per reconstruction arm with the delta, its clustered-bootstrap
interval, regressed/improved counts and McNemar's p, then the benchmark's figures (its
headline as its evaluation computes it, and the figures its papers publish, each under its
label, per arm with interval and paired delta), its per-question views, the loader's notes
and the noise floor.
"""

from __future__ import annotations

from pytest_satbench.core import arms as A
from pytest_satbench.core import formatting as F
from pytest_satbench.core.results import BenchmarkResult
from pytest_satbench.core.stats import AggregateStats, BenchmarkStats
from pytest_satbench.core.usage import resized_line

_NO_INTERVAL = "[   -    ]"  # as wide as a typical interval, so the columns stay aligned


def render(result: BenchmarkResult, width: int = 80) -> list[str]:
    """Every line the terminal shows for one benchmark."""
    shard = shard_line(result)
    lines = F.prose(shard, width) if shard else []
    lines += F.prose(result.labels.table, width) + render_stats(result.stats, width)
    lines += render_figures(result, width)
    lines += render_views(result, width)
    if result.notes:
        lines.append("")
        for note in result.notes:
            lines += F.prose(f"loading: {note}", width)
    if result.not_run or result.unfinished:
        lines.append("")
        lines += F.prose(not_run_line(result), width)
    if result.subset:
        lines.append("")
        lines += F.prose(subset_line(result), width)
    floor = result.noise_floor
    if floor is not None:
        lines += F.prose(
            f"noise floor: the original asked {floor.asks}x on {floor.questions} questions changed its verdict "
            f"on {floor.flipped} ({100 * floor.rate:.1f}%); a per-question delta rate below that is server noise",
            width,
        )
    resized = resized_line(result.usage, A.arm_labels(list(result.stats.arms))[0])
    if resized:  # the server tokenised some arm's images differently from the original's
        lines.append("")
        lines += F.prose(resized, width)
    lines += render_samples(result, width)
    return lines


def render_samples(result: BenchmarkResult, width: int = 80) -> list[str]:
    """--samples K: per arm its mean-of-K accuracy with its interval, majority-vote accuracy,
    mean agreement and the paired delta on mean-of-K (`stats.summarize_samples`)."""
    ss = result.samples
    if ss is None:
        return []
    arms = [a for a in ss.arms if a in ss.overall.arms]
    labels, _ = A.arm_labels(arms)
    aw = max(6, min(max(len(labels[a]) for a in arms), 16)) + 1
    k = ss.k
    lines = [""]
    lines += F.prose(f"samples (--samples {k}), % over all questions: mean = mean-of-{k} accuracy (each question "
                     f"the share of its {k} answers that are right), maj = majority-vote accuracy, agree = mean share "
                     f"of a question's answers that give its majority answer, delta = mean-of-{k} vs orig in points; "
                     "95% CI clustered by image", width)
    lines.append(f"  {'arm':<{aw}}{'n':>5}{'mean':>7}  {'95% CI':<12}{'maj':>6}{'agree':>7}{'delta':>7} 95% CI")
    for arm in arms:
        a = ss.overall.arms[arm]
        row = (f"  {labels[arm][:aw - 1]:<{aw}}{a.n:>5}{_cell(a.mean):>7}  {F.percent_interval(a.ci_low, a.ci_high):<12}"
               f"{_cell(a.majority if a.majority_n else None):>6}{_cell(a.agreement if a.agreement_n else None):>7}")
        p = ss.overall.paired.get(arm)
        if p is not None:
            row += f"{F.points(p.delta):>7} {F.points_interval(p.ci_low, p.ci_high)}"
        lines.append(row.rstrip())
    errors = {labels[a]: ss.overall.arms[a].errors for a in arms if ss.overall.arms[a].errors}
    if errors:
        lines += F.prose("questions with a sample unanswered (counted 0): "
                         + ", ".join(f"{arm} {n}" for arm, n in errors.items()), width)
    if any(ss.overall.arms[a].majority_n < ss.overall.arms[a].n for a in arms):
        lines += F.prose("majority vote and agreement leave out box answers (grounding): no two boxes are the "
                         "same answer; their questions count in mean-of-K only", width)
    return lines


def _cell(x: float | None) -> str:
    return F.percent(x)


def not_run_line(result: BenchmarkResult) -> str:
    """What an incomplete run says of itself (terminal and reports)."""
    seq = result.sequential
    if seq and seq.get("stopped") and result.not_run and not result.unfinished:
        return (f"stopped early ({seq['reason']}): {result.not_run} of the {result.questions} questions selected "
                f"were not needed and are in no figure here; the same command without --precision/--margin asks them")
    head = "run unfinished (interrupted or stopped)" if result.unfinished else "run incomplete"
    if len(result.runs) <= 1:
        return (f"{head}: {result.not_run} of the {result.questions} questions selected never ran "
                "and are in no figure here; rerun the same command to ask them")
    # a tag's report: the tag's earlier runs may have answered what this one never reached
    reached = (f"this run reached {result.run_questions} of the {result.run_selected} questions it selected; "
               if result.unfinished and result.run_selected else "")
    if not result.not_run:
        return (f"{head}: {reached}the tag's earlier runs answered the others, so every one of its "
                f"{result.questions} questions is in the figures")
    return (f"{head}: {reached}{result.not_run} of the {result.questions} questions of tag {result.tag} never ran "
            "and are in no figure here; rerun the same command (or pytest --lf) to ask them")


def shard_line(result: BenchmarkResult) -> str | None:
    """What a `--shard I/N` run says of its part (terminal and reports); None: not a shard.
    Counts before -k: with -k (or --lf, --deselect) it adds how many the run selected. A report
    that covers two or more parts of one split (`BenchmarkResult.shards`) names them instead."""
    merged = result.shards
    if merged:  # the report covers several parts of the split (a job array's stores merged)
        parts, count, total = merged["parts"], merged["count"], merged["questions"]
        head = f"merged from {len(parts)} shard runs (shards {', '.join(str(i) for i in parts)} of {count}): "
        if not merged["missing"]:
            return head + f"all {total:,} of {total:,} questions"
        absent = [str(i) for i in range(1, count + 1) if i not in parts]
        return (head + f"{total - merged['missing']:,} of {total:,} questions; not here: "
                f"shard{'s' if len(absent) != 1 else ''} {', '.join(absent)} ({merged['missing']:,} questions)")
    shard = result.protocol.get("shard") or {}
    counts = (shard.get("benchmarks") or {}).get(result.benchmark)
    if not counts:
        return None
    line = (f"shard {shard['index']}/{shard['count']}: {counts['shard_questions']:,} of {counts['questions']:,} "
            "questions")
    if counts.get("planned", counts["shard_questions"]) != counts["shard_questions"]:
        line += f" (this run selected {counts['planned']:,} of them)"
    return line


def subset_line(result: BenchmarkResult) -> str:
    """What a run that selected part of its tag's questions says (terminal and reports)."""
    stored = (f"all {len(result.items)}" if not result.not_run
              else f"the {len(result.items)} with stored answers")
    return (f"subset run: this run selected {result.run_selected or result.run_questions} of the "
            f"{result.questions} questions of tag {result.tag}; the figures and the report cover {stored} "
            f"(answers of {len(result.runs)} runs of the tag, the newest for each question)")


def render_stats(st: BenchmarkStats, width: int = 80) -> list[str]:
    arms = list(st.arms)
    groups = [(t, st.by_type[t]) for t in st.by_type] + [("overall", st.overall)]
    lines: list[str] = []
    labels, legend = A.arm_labels(arms)

    # 1. accuracy per arm (%), with errors/truncated/unparseable summed over arms; a few arm
    # columns a block, so a budget sweep stays within the width
    tw = max(8, min(max(len(t) for t, _ in groups) + 1, 24))
    per_block = max(1, (width - tw - 7 - 23) // 9)
    for start in range(0, len(arms), per_block):
        block = arms[start:start + per_block]
        if start:
            lines.append("")
        lines.append(f"{'type':<{tw}}{'n':>7}" + "".join(f"{labels[a]:>9}" for a in block)
                     + f"{'chance':>8}{'err':>5}{'trn':>5}{'unp':>5}")
        for label, g in groups:
            accs = "".join(f"{_cell(g.accuracy[a].accuracy if a in g.accuracy else None):>9}" for a in block)
            err = sum(g.accuracy[a].errors for a in arms if a in g.accuracy)
            trn = sum(g.accuracy[a].truncated for a in arms if a in g.accuracy)
            unp = sum(g.accuracy[a].unparseable for a in arms if a in g.accuracy)
            chance = _cell(g.chance.accuracy) if g.chance.n_defined else F.MISSING
            lines.append(f"{label[:tw - 1]:<{tw}}{g.n:>7}{accs}{chance:>8}{err:>5}{trn:>5}{unp:>5}")
    lines += legend
    if A.ORIG in st.overall.accuracy:
        o = st.overall.accuracy[A.ORIG]
        lines += F.prose(
            f"orig (the table's verdict): overall {100 * o.accuracy:.1f}% "
            f"(95% CI {_cell(o.ci_low)}-{_cell(o.ci_high)}, clustered by image, "
            f"{st.overall.n_images} images); mean of the {len(st.by_type)} types "
            f"{100 * st.average_accuracy.get(A.ORIG, float('nan')):.1f}%", width
        )

    # 2. paired tables, one per reconstruction arm
    tw = max(8, min(max(len(t) for t, _ in groups) + 1, width - 67, 24))
    for arm in st.recon_arms:
        lines.append("")
        lines += F.prose(f"{arm} vs orig: delta in points, 95% CI clustered by image; R regressed, I improved", width)
        lines.append(f"{'type':<{tw}}{'n':>6}{'orig':>6}{'recon':>6}{'delta':>7} {'95% CI':<14}{'R':>5}{'I':>5}  {'p':<6}{'err':>5}")
        for label, g in groups:
            pair = g.paired.get(arm)
            if pair is None:
                continue
            acc_o = g.accuracy[A.ORIG].accuracy if A.ORIG in g.accuracy else None
            acc_r = g.accuracy[arm].accuracy if arm in g.accuracy else None
            ci = F.points_interval(pair.ci_low, pair.ci_high)
            lines.append(
                f"{label[:tw - 1]:<{tw}}{pair.n_pairs:>6}{_cell(acc_o):>6}{_cell(acc_r):>6}{pair.delta:>+7.1f} "
                f"{ci if ci != F.MISSING else _NO_INTERVAL:<14}{pair.regressed:>5}{pair.improved:>5}  "
                f"{F.p_value(pair.mcnemar_p):<6}{pair.n_errors:>5}"
            )
    return lines


def render_figures(result: BenchmarkResult, width: int = 80) -> list[str]:
    """The benchmark's figures that the terminal shows (`Aggregate.terminal`), when the
    benchmark declares its own evaluation (otherwise the headline is the table's own overall row and
    mean of types, already shown): per figure its label, then per arm n, the value, its
    interval and, for reconstruction arms, the paired delta and its interval."""
    if not result.labels.declares_evaluation and result.samples is None:
        return []  # the table's overall row and mean of types are the headline (not under --samples)
    shown = [a for a in result.declared_figures() if a.terminal and a.name in result.figures]
    if not shown:
        return []
    arms = list(result.stats.arms)
    labels, _ = A.arm_labels(arms)
    aw = max(6, min(max(len(labels[a]) for a in arms), 16)) + 1
    lines = [""]
    lines += F.prose("benchmark figures (%): the headline as the benchmark's evaluation computes it, "
                     "then any view its papers publish; 95% CI clustered by image, delta vs orig in points", width)
    for agg in shown:
        fs: AggregateStats = result.figures[agg.name]
        lines += F.prose(agg.label, width)
        lines.append(f"  {'arm':<{aw}}{'n':>7}{'value':>7}  {'95% CI':<12}{'delta':>7} 95% CI")
        for arm in arms:
            a = fs.accuracy.get(arm)
            if a is None:
                continue
            ci = F.percent_interval(a.ci_low, a.ci_high)
            row = f"  {labels[arm][:aw - 1]:<{aw}}{a.n:>7}{_cell(a.value):>7}  {ci:<12}"
            p = fs.paired.get(arm)
            if p is not None:
                row += f"{F.points(p.delta):>7} {F.points_interval(p.ci_low, p.ci_high):<14}"
            lines.append(row.rstrip())
    return lines


def render_views(result: BenchmarkResult, width: int = 80) -> list[str]:
    """Second views of the same answers (binned counts, VRSBench official rules, Acc@0.7)."""
    arms = list(result.stats.arms)
    lines: list[str] = []
    labels, _ = A.arm_labels(arms)
    for name, vs in sorted(result.views.items()):
        shown = [a for a in arms if a in vs.overall]
        if not shown:
            continue
        lines.append("")
        lines += F.prose(f"view {result.labels.view(name).title} (%)", width)
        rows = [(t, g) for t, g in vs.by_type.items() if g] + [("overall", vs.overall)]
        per_block = max(1, (width - 23) // 9)
        for start in range(0, len(shown), per_block):
            block = shown[start:start + per_block]
            lines.append(f"{'type':<16}{'n':>7}" + "".join(f"{labels[a]:>9}" for a in block))
            for label, g in rows:
                n = max((g[a].n for a in block if a in g), default=0)
                lines.append(f"{label[:15]:<16}{n:>7}" + "".join(f"{_cell(g[a].mean if a in g else None):>9}" for a in block))
    return lines
