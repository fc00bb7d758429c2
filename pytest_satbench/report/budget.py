"""`python -m pytest_satbench.report --curve [TAG] [--margin M]`: the budget curve of a sweep.

A run with several reconstruction arms of one codec that differ only in their token budget (an
`--nlatent 16,32,64,128,256` sweep: the arms' specs equal but for `nlatent=`) is read as its
tag's report reads it (`report.build.collect`). Per budget, in order of mean image tokens per
image (the tokens the answers' rows report; the `nlatent` value where none was reported): the
accuracy with its 95% interval and the paired delta against `orig` with its interval, both
clustered by image (the report's own statistics, nothing recomputed), per question type and
overall. The smallest budget *within the margin* is the fewest tokens whose delta interval lies
above minus `--margin` points (default 1.0): "tok64 is within 1 point of the original, tok32 is
not". Written to `reports/<benchmark>/compare/<tag>-budget/` (summary.json, report.md with the
table, report.html with the chart too) and printed one line per budget.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_satbench.codecs.base import budget_of
from pytest_satbench.core import arms as A
from pytest_satbench.core import formatting as F
from pytest_satbench.core.redact import redact
from pytest_satbench.core.results import BenchmarkResult
from pytest_satbench.core.stats import GroupStats
from pytest_satbench.report import html, markdown, plots
from pytest_satbench.report.document import Cell, Code, Column, Document, Figure, Heading, Paragraph, Table, cell, rich

__all__ = ["Budget", "Curve", "budget_lines", "curves", "write_curve"]


@dataclass(frozen=True, slots=True)
class Budget:
    """One budget of a curve in one group (a type or overall)."""

    arm: str
    tokens: float  # mean image tokens per image (or the nlatent value)
    n: int
    accuracy: float
    ci_low: float
    ci_high: float
    delta: float  # points vs orig
    delta_low: float
    delta_high: float

    def within(self, margin: float) -> bool:
        """The delta's interval lies above -margin points."""
        return not math.isnan(self.delta_low) and self.delta_low >= -margin


@dataclass(frozen=True, slots=True)
class Curve:
    codec: str  # the arms' common spec, the budget left out
    groups: dict[str, list[Budget]]  # group -> budgets, fewest tokens first
    ceilings: dict[str, tuple[float, float, float]]  # group -> orig's accuracy and interval
    margin: float

    def smallest_within(self, group: str = "overall") -> Budget | None:
        return next((b for b in self.groups.get(group, []) if b.within(self.margin)), None)


def curves(res: BenchmarkResult, margin: float = 1.0) -> list[Curve]:
    """Every codec with at least two budget arms in the result (usually one)."""
    fams: dict[str, list[tuple[str, float]]] = {}
    for arm in res.stats.recon_arms:
        fam = budget_of(arm)  # the codec says which of its arms form a budget sweep
        if fam is not None:
            tokens = res.usage.image_tokens.get(arm)
            fams.setdefault(fam[0], []).append((arm, float(tokens) if tokens is not None else fam[1]))
    groups: list[tuple[str, GroupStats]] = [*res.stats.by_type.items(), ("overall", res.stats.overall)]
    out = []
    for codec, members in fams.items():
        if len(members) < 2:
            continue
        members.sort(key=lambda m: m[1])
        per: dict[str, list[Budget]] = {}
        ceilings: dict[str, tuple[float, float, float]] = {}
        for g, st in groups:
            o = st.accuracy.get(A.ORIG)
            if o is not None and o.n:
                ceilings[g] = (o.accuracy, o.ci_low, o.ci_high)
            rows = []
            for arm, tokens in members:
                a, p = st.accuracy.get(arm), st.paired.get(arm)
                if a is None or not a.n:
                    continue
                nan = math.nan
                rows.append(Budget(arm, tokens, a.n, a.accuracy, a.ci_low, a.ci_high,
                                   p.delta if p else nan, p.ci_low if p else nan, p.ci_high if p else nan))
            per[g] = rows
        out.append(Curve(codec, per, ceilings, margin))
    return out


def margin_sentence(c: Curve, group: str = "overall") -> str:
    best = c.smallest_within(group)
    budgets = c.groups.get(group, [])
    if best is None:
        return (f"{group}: no budget is within {c.margin:g} point{'s' if c.margin != 1 else ''} of the original "
                "(every delta interval reaches below the margin)")
    below = [b for b in budgets if b.tokens < best.tokens]
    tail = f", {A.short_label(below[-1].arm)} is not" if below else " (the smallest budget swept)"
    return (f"{group}: {A.short_label(best.arm)} is within {c.margin:g} point{'s' if c.margin != 1 else ''} "
            f"of the original{tail}")


def budget_lines(res: BenchmarkResult, margin: float = 1.0) -> list[str]:
    """One line per budget (overall), then the margin sentence: what the terminal prints."""
    out: list[str] = []
    for c in curves(res, margin):
        out.append(f"satbench budget curve {res.benchmark} (tag {res.tag}): {c.codec}; delta vs orig in points, "
                   f"95% CI clustered by image; margin {c.margin:g}")
        ceiling = c.ceilings.get("overall")
        if ceiling:
            out.append(f"  orig        accuracy {F.percent(ceiling[0]):>5} [{F.percent_interval(ceiling[1], ceiling[2])}]")
        for b in c.groups.get("overall", []):
            mark = "within" if b.within(margin) else "not within"
            out.append(f"  {A.short_label(b.arm)[:10]:<10}{b.tokens:>6g} tok  accuracy {F.percent(b.accuracy):>5} "
                       f"[{F.percent_interval(b.ci_low, b.ci_high)}]  delta {F.points(b.delta):>6} "
                       f"{F.points_interval(b.delta_low, b.delta_high)}  {mark}")
        out.append("  " + margin_sentence(c))
    return out


def _summary(res: BenchmarkResult, cs: Sequence[Curve]) -> dict[str, Any]:
    def nn(x: float) -> float | None:
        return None if isinstance(x, float) and math.isnan(x) else x

    return redact({
        "benchmark": res.benchmark, "tag": res.tag, "run_id": res.run_id,
        "curves": [{
            "codec": c.codec, "margin_pp": c.margin,
            "smallest_within_margin": {g: (b.arm if (b := c.smallest_within(g)) else None) for g in c.groups},
            "orig": {g: {"accuracy": nn(v[0]), "ci_low": nn(v[1]), "ci_high": nn(v[2])} for g, v in c.ceilings.items()},
            "budgets": {g: [{"arm": b.arm, "label": A.short_label(b.arm), "tokens": b.tokens, "n": b.n,
                             "accuracy": nn(b.accuracy), "ci_low": nn(b.ci_low), "ci_high": nn(b.ci_high),
                             "delta_pp": nn(b.delta), "delta_ci_low_pp": nn(b.delta_low),
                             "delta_ci_high_pp": nn(b.delta_high), "within_margin": b.within(c.margin)}
                            for b in bs] for g, bs in c.groups.items()},
        } for c in cs],
    })


def _document(res: BenchmarkResult, cs: Sequence[Curve]) -> Document:
    doc = Document(f"{res.benchmark}: budget curve of tag {res.tag}")
    doc.add(Heading(1, rich(res.benchmark, ": the budget curve of tag ", Code(res.tag))),
            Paragraph(rich("Accuracy (%) per token budget with its 95% interval, and the paired delta against ",
                           Code(A.ORIG), " in points with its 95% interval, both clustered by image, from the tag's "
                           "report. A budget is within the margin when its whole delta interval lies above minus the "
                           "margin.")))
    for c in cs:
        doc.add(Heading(2, rich(Code(c.codec), f" (margin {c.margin:g} point{'s' if c.margin != 1 else ''})")))
        doc.add(Paragraph(rich("; ".join(margin_sentence(c, g) for g in c.groups) + ".")))
        points = {g: [(b.tokens, b.accuracy) for b in bs] for g, bs in c.groups.items()}
        doc.add(Figure(plots.tokens_curve(points, {g: v[0] for g, v in c.ceilings.items()},
                                          f"{res.benchmark}: accuracy versus image tokens")))
        rows: list[tuple[Cell, ...]] = []
        for g, bs in c.groups.items():
            ceiling = c.ceilings.get(g)
            if ceiling:
                rows.append(tuple(cell(x) for x in (g, A.ORIG, "-", F.MISSING,
                                                     f"{F.percent(ceiling[0])} ({F.percent_interval(ceiling[1], ceiling[2])})",
                                                     F.MISSING, F.MISSING, F.MISSING)))
            for b in bs:
                rows.append(tuple(cell(x) for x in (
                    g, A.short_label(b.arm), f"{b.tokens:g}", str(b.n),
                    f"{F.percent(b.accuracy)} ({F.percent_interval(b.ci_low, b.ci_high)})",
                    F.points(b.delta), F.points_interval(b.delta_low, b.delta_high),
                    "yes" if b.within(c.margin) else "no")))
        doc.add(Table((Column(rich("group")), Column(rich("arm")), Column(rich("tokens"), "numeric"),
                       Column(rich("n"), "numeric"), Column(rich("accuracy"), "numeric"),
                       Column(rich("delta"), "numeric"), Column(rich("95% CI")), Column(rich("within margin"))),
                      tuple(rows)))
    return doc


def write_curve(res: BenchmarkResult, out_root: Path, margin: float = 1.0) -> Path | None:
    """reports/<benchmark>/compare/<tag>-budget/: summary.json, report.md, report.html; None
    when the result has no budget sweep."""
    cs = curves(res, margin)
    if not cs:
        return None
    safe = re.sub(r"[^A-Za-z0-9._\-]+", "_", res.tag).strip("._") or "default"
    folder = Path(out_root) / res.benchmark / "compare" / f"{safe}-budget"
    folder.mkdir(parents=True, exist_ok=True)
    doc = _document(res, cs)
    for name, text in (("summary.json", json.dumps(_summary(res, cs), indent=2) + "\n"),
                       ("report.md", markdown.to_markdown(doc)), ("report.html", html.to_html(doc))):
        tmp = folder / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(folder / name)
    return folder
