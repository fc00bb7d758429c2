"""report.md: the same numbers as summary.json, for reading in a terminal or on GitHub."""

from __future__ import annotations

import math
from typing import Any

from pytest_satbench.core.text_summary import render_stats
from pytest_satbench.core.results import BenchmarkResult
from pytest_satbench.report.build import token_curve
from pytest_satbench.core.results import aggregate_views
from pytest_satbench.report.gallery import Entry

__all__ = ["render", "short_names"]


def pct(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.1f}%"


def ci(lo: float | None, hi: float | None, scale: float = 100.0) -> str:
    """[lo, hi]: percentages (fractions scaled by 100) or, with scale=1, signed points."""
    if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
        return "-"
    return f"[{lo * scale:+.1f},{hi * scale:+.1f}]" if scale == 1.0 else f"[{lo * scale:.1f}-{hi * scale:.1f}]"


def short_names(arms: list[str]) -> dict[str, str]:
    """Table labels: One-D-Piece arms by token budget (the checkpoint path is long and the
    same for every arm); the full spec is listed under the table. Falls back to the full
    spec when two arms would share a label."""
    out = {}
    for arm in arms:
        label = arm
        if arm.startswith("onedpiece:"):
            params = dict(p.partition("=")[::2] for p in arm.partition(":")[2].split(","))
            label = f"onedpiece n={params.get('nlatent', '?')}"
        out[arm] = label
    if len(set(out.values())) < len(out):
        return {a: a for a in arms}
    return out


def pval(p: float) -> str:
    if math.isnan(p):
        return "-"
    return "<1e-4" if p < 1e-4 else (f"{p:.3f}" if p < 0.1 else f"{p:.2f}")


def num(v: float | None, fmt: str = ".2f") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def md_escape(s: str) -> str:
    return " ".join(str(s).split()).replace("|", "\\|")


def gates_lines(gates: list[dict[str, Any]] | None) -> list[str]:
    if not gates:
        return ["no gates"]
    lines = ["| gate | result | value | reason |", "|---|---|---:|---|"]
    for g in gates:
        v = g.get("value")
        lines.append(
            f"| `{md_escape(str(g.get('expr', '')))}` | {'PASS' if g.get('passed') else 'FAIL'} | "
            f"{num(v, '.4g') if isinstance(v, int | float) else '-'} | {md_escape(str(g.get('reason', '')))} |"
        )
    return lines


def render(data: BenchmarkResult, protocol: dict[str, Any], gates: list[dict[str, Any]] | None,
           gallery: list[Entry], gallery_total: int) -> str:
    st = data.stats
    ov = st.overall
    L: list[str] = [f"# {data.benchmark} — {data.tag}", ""]
    L += [
        f"Model `{protocol.get('model')}` (as returned by the servers: "
        + ", ".join(f"`{m}` x{n}" for m, n in data.usage.total.models.items()) + "), "
        f"run `{data.run_id}`, {protocol.get('date', '')}. "
        f"{len(data.items)} questions on {ov.n_images} images; arms: "
        + ", ".join(f"`{a}`" for a in st.arms) + ".",
        "",
        (f"Prompt style `{protocol.get('prompt_style')}`, sampling {protocol.get('sampling')}, "
        f"box grid `{data.score_options.box_grid}`, IoU `{data.score_options.iou}`. Answers re-scored from the stored raw text. "
        "API errors, truncated and unparseable answers stay in the denominator and count as wrong. "
        f"Intervals: 95% percentile bootstrap clustered by image ({st.iterations} resamples, seed {st.seed})."),
        "",
        "## Gates",
        "",
        *gates_lines(gates),
        "",
        "## Accuracy per question type and arm",
        "",
    ]
    groups = [*st.by_type.items(), ("overall", ov)]
    short = short_names(list(st.arms))
    L.append("Accuracy, 95% interval in brackets; 'random' is the uniform-random reference where it is defined.")
    L.append("")
    L.append("| type | n | " + " | ".join(f"`{short[a]}`" for a in st.arms) + " | random |")
    L.append("|---|---:|" + "---:|" * len(st.arms) + "---:|")
    for label, g in groups:
        cells = []
        for arm in st.arms:
            a = g.accuracy.get(arm)
            cells.append("-" if a is None or not a.n else f"{pct(a.accuracy)} {ci(a.ci_low, a.ci_high)}")
        L.append(f"| {md_escape(label)} | {g.n} | " + " | ".join(cells) + f" | {pct(g.chance.accuracy) if g.chance.n_defined else '-'} |")
    L += ["", ("Answer quality, all questions (per type in per_type.csv): errors = no answer after retries, "
          "truncated = hit the token limit, unparseable = answered but not interpretable; all count as wrong."), ""]
    L.append("| arm | n | coverage | errors | truncated | unparseable | missing |")
    L.append("|---|---:|---:|---:|---:|---:|---:|")
    for arm in st.arms:
        a = ov.accuracy[arm]
        L.append(f"| `{short[arm]}` | {a.n} | {pct(a.coverage)} | {a.errors} | {a.truncated} | {a.unparseable} | {a.missing} |")
    if any(short[a] != a for a in st.arms):
        L += ["", "Arms: " + "; ".join(f"`{short[a]}` = `{a}`" for a in st.arms if short[a] != a) + "."]
    for arm in st.recon_arms:
        L += ["", f"## `{short[arm]}` minus `orig` (paired, percentage points)", ""]
        L.append("| type | pairs | orig | recon | delta | 95% CI | regressed | improved | McNemar p | pairs with an error | delta, both answered |")
        L.append("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|")
        for label, g in groups:
            p = g.paired.get(arm)
            if p is None:
                continue
            o = g.accuracy["orig"].accuracy if "orig" in g.accuracy else float("nan")
            r = g.accuracy[arm].accuracy if arm in g.accuracy else float("nan")
            L.append(
                f"| {md_escape(label)} | {p.n_pairs} | {pct(o)} | {pct(r)} | {p.delta:+.1f} | "
                f"{ci(p.ci_low, p.ci_high, 1.0)} | {p.regressed} | {p.improved} | {pval(p.mcnemar_p)} | "
                f"{p.n_errors} | {num(p.delta_both_ok, '+.1f')} |"
            )
    L += ["", "## The benchmark's own aggregate views", ""]
    L.append("| view | " + " | ".join(f"`{short[a]}`" for a in st.arms) + " |")
    L.append("|---|" + "---:|" * len(st.arms))
    agg = aggregate_views(data)
    for name in ("overall_accuracy", "average_accuracy"):
        L.append(f"| {agg[name]['label']} | " + " | ".join(pct(agg[name]["per_arm"].get(a)) for a in st.arms) + " |")
    for name, vs in data.views.items():
        label = agg[f"view:{name}"]["label"]
        L.append(f"| {label}, overall | " + " | ".join(
            f"{pct(vs.overall[a].mean)} {ci(vs.overall[a].ci_low, vs.overall[a].ci_high)}" if a in vs.overall else "-"
            for a in st.arms) + " |")
        for t, per in vs.by_type.items():
            if not per:  # no question of this type carries the view
                continue
            L.append(f"| {label}, {md_escape(t)} | " + " | ".join(pct(per[a].mean) if a in per else "-" for a in st.arms) + " |")
    curve = token_curve(data)
    if curve is not None:
        points, ceilings = curve
        L += ["", "## Accuracy versus image tokens", "",
              "| type | " + " | ".join(f"{x:g} tokens" for x, _ in sorted(points["overall"])) + " | orig (ceiling) |",
              "|---|" + "---:|" * (len(points["overall"]) + 1)]
        for label, pts in points.items():
            L.append(f"| {md_escape(label)} | " + " | ".join(pct(v) for _, v in sorted(pts)) + f" | {pct(ceilings.get(label))} |")
    u = data.usage
    floor = data.noise_floor
    if floor is not None:
        L += ["", "## Noise floor", "",
              f"The original was asked {floor.asks} times on {floor.questions} questions (`--repeat-orig`); "
              f"the verdict changed on {floor.flipped} ({100 * floor.rate:.1f}%). Servers under load "
              "are not deterministic at temperature 0: a per-question change rate below this is not a codec effect."]
    L += ["", "## Usage", ""]
    L.append("| server | answers | prompt tokens | completion tokens | cost (reported) | answers with cost | latency mean | p50 | p95 | models returned |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, s in [*u.by_server.items(), ("all", u.total)]:
        L.append(
            f"| {md_escape(name)} | {s.answers} | {s.prompt_tokens:,} | {s.completion_tokens:,} | "
            f"{f'${s.cost:.6f}' if s.rows_with_cost else '-'} | {s.rows_with_cost}/{s.answers} | "
            f"{num(s.latency_mean_s)} s | {num(s.latency_p50_s)} s | {num(s.latency_p95_s)} s | "
            + ", ".join(f"`{m}` x{n}" for m, n in s.models.items()) + " |"
        )
    L.append("")
    L.append(f"API errors (no answer after retries, no usage): {u.errors}" + (
        " (" + ", ".join(f"`{short[a]}`: {n}" for a, n in u.errors_by_arm.items()) + ")" if u.errors else "") + ".")
    toks = {a: t for a, t in u.image_tokens.items() if t is not None}
    if toks:
        L.append("Mean image tokens per image: " + ", ".join(f"`{short[a]}`: {t:g}" for a, t in toks.items()) + ".")
    L += ["", "## Regressed questions", ""]
    if not gallery_total:
        L.append("No question was answered right on the original and wrong on a reconstruction.")
    else:
        L.append(f"{gallery_total} questions regressed; the first {len(gallery)} by question key "
                 "(images in report.html):")
        L.append("")
        L.append("| key | type | question | ground truth | answers |")
        L.append("|---|---|---|---|---|")
        for e in gallery:
            answers = "; ".join(f"`{short[p.arm]}`: {md_escape(p.answer)} ({'right' if p.correct else 'wrong'})" for p in e.panels)
            L.append(f"| {md_escape(e.key)} | {md_escape(', '.join(e.types))} | {md_escape(e.text)[:160]} | {md_escape(e.answer)} | {answers} |")
    L += ["", "## Terminal summary", "", "```", *render_stats(st), "```", ""]
    L += [("Files: `summary.json` (all numbers), `per_type.csv`, `predictions.jsonl` (every answer), "
          "`protocol.json` (what was measured), `report.html` (plots and the gallery)."), ""]
    return "\n".join(L)
