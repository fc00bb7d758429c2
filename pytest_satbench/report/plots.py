"""Plots as inline SVG, drawn by hand: no plotting dependency, and the HTML stays one file.

Colours are fixed per arm position (orig first, blind last) so the same arm has the same
colour in every chart of a report; tests look for these colours in a screenshot.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from html import escape

from pytest_satbench.core import formatting as F
from pytest_satbench.core.stats import BenchmarkStats

# orig, then reconstructions, then blind; chosen to stay distinguishable when printed grey.
PALETTE = ("#1f5fbf", "#e07b00", "#2a9d4a", "#c2185b", "#7b4fc9", "#00838f", "#8d6e00", "#5d4037")
BLIND_COLOUR = "#8a8a8a"
ORIG_COLOUR = PALETTE[0]


def arm_colours(arms: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    i = 0
    for arm in arms:
        if arm == "blind":
            out[arm] = BLIND_COLOUR
        else:
            out[arm] = PALETTE[i % len(PALETTE)]
            i += 1
    return out


def _f(x: float) -> str:
    return f"{x:.1f}"


def _finite(*xs: float | None) -> bool:
    return all(x is not None and not math.isnan(x) for x in xs)


def legend(arms: list[str], colours: dict[str, str], x: float, y: float, labels: dict[str, str] | None = None) -> list[str]:
    parts = []
    for i, arm in enumerate(arms):
        yy = y + i * 18
        parts.append(f'<rect x="{_f(x)}" y="{_f(yy - 10)}" width="12" height="12" fill="{colours[arm]}"/>')
        parts.append(f'<text x="{_f(x + 18)}" y="{_f(yy)}" font-size="12">{escape((labels or {}).get(arm, arm))}</text>')
    return parts


def accuracy_bars(st: BenchmarkStats, title: str, labels: dict[str, str] | None = None) -> str:
    """Per type (and overall): one bar per arm with its 95 % clustered-bootstrap interval,
    and the uniform-random reference as a dashed tick where it is defined."""
    arms = list(st.arms)
    colours = arm_colours(arms)
    groups = [(t, g) for t, g in st.by_type.items()] + [("overall", st.overall)]
    # Wide enough to read, narrow enough that ~10 types x 5 arms fit a page.
    bar_w = max(6.0, min(22.0, 520.0 / max(1, len(arms) * (len(st.by_type) + 1))))
    gap = 22.0
    group_w = bar_w * len(arms) + gap
    left, top, plot_h = 48.0, 34.0, 220.0
    labels = labels or {a: a for a in arms}
    legend_w = 30 + 7 * max((len(labels.get(a, a)) for a in arms), default=4)
    width = left + group_w * len(groups) + legend_w + 20
    height = top + plot_h + 90
    y0 = top + plot_h

    def y(v: float) -> float:
        return y0 - plot_h * v

    parts = _frame(title, width, height, left, left + group_w * len(groups), y)
    for gi, (label, g) in enumerate(groups):
        gx = left + gi * group_w + gap / 2
        for ai, arm in enumerate(arms):
            a = g.accuracy.get(arm)
            if a is None or not a.n or math.isnan(a.accuracy):
                continue
            x = gx + ai * bar_w
            parts.append(
                f'<rect x="{_f(x)}" y="{_f(y(a.accuracy))}" width="{_f(bar_w - 2)}" height="{_f(plot_h * a.accuracy)}" '
                f'fill="{colours[arm]}"><title>{escape(label)} / {escape(labels.get(arm, arm))}: {F.percent(a.accuracy)}% '
                f'(n={a.n}, 95% CI {F.percent_interval(a.ci_low, a.ci_high)})</title></rect>'
            )
            if _finite(a.ci_low, a.ci_high):
                cx = x + (bar_w - 2) / 2
                parts.append(f'<line x1="{_f(cx)}" x2="{_f(cx)}" y1="{_f(y(a.ci_low))}" y2="{_f(y(a.ci_high))}" stroke="#222222" stroke-width="1.2"/>')
                for v in (a.ci_low, a.ci_high):
                    parts.append(f'<line x1="{_f(cx - 3)}" x2="{_f(cx + 3)}" y1="{_f(y(v))}" y2="{_f(y(v))}" stroke="#222222" stroke-width="1.2"/>')
        if g.chance.n_defined and not math.isnan(g.chance.accuracy):
            cy = y(g.chance.accuracy)
            parts.append(
                f'<line x1="{_f(gx - 3)}" x2="{_f(gx + bar_w * len(arms) + 1)}" y1="{_f(cy)}" y2="{_f(cy)}" '
                f'stroke="#000000" stroke-dasharray="3,2"><title>uniform-random reference {F.percent(g.chance.accuracy)}%</title></line>'
            )
        lx = gx + bar_w * len(arms) / 2
        parts.append(
            f'<text x="{_f(lx)}" y="{_f(y0 + 14)}" font-size="11" text-anchor="end" '
            f'transform="rotate(-35 {_f(lx)} {_f(y0 + 14)})">{escape(label[:18])}</text>'
        )
    parts.append(f'<line x1="{_f(left)}" x2="{_f(left)}" y1="{_f(top)}" y2="{_f(y0)}" stroke="#444444"/>')
    parts.append(f'<line x1="{_f(left)}" x2="{_f(left + group_w * len(groups))}" y1="{_f(y0)}" y2="{_f(y0)}" stroke="#444444"/>')
    parts += legend(arms, colours, left + group_w * len(groups) + 16, top + 10, labels)
    parts.append(
        f'<text x="{_f(left + group_w * len(groups) + 16)}" y="{_f(top + 18 * len(arms) + 16)}" font-size="11">'
        "- - - random</text>"
    )
    parts.append("</svg>")
    return "\n".join(parts)


def tokens_curve(points: dict[str, list[tuple[float, float]]], ceilings: dict[str, float], title: str) -> str:
    """Accuracy (y) against mean image tokens per image (x), one line per group (type or
    overall); the original's accuracy of the same group is the dashed ceiling."""
    groups = [g for g in points if points[g]]
    colours = {g: PALETTE[(i + 1) % len(PALETTE)] for i, g in enumerate(groups)}
    xs = [x for g in groups for x, _ in points[g]]
    lo, hi = min(xs), max(xs)
    if hi == lo:
        lo, hi = lo - 1, hi + 1
    left, top, pw, ph = 52.0, 34.0, 520.0, 240.0
    legend_w = 30 + 7 * max((len(g) for g in groups), default=4)
    width, height = left + pw + legend_w + 30, top + ph + 50

    def px(v: float) -> float:
        return left + pw * (v - lo) / (hi - lo)

    def py(v: float) -> float:
        return top + ph * (1 - v)

    parts = _frame(title, width, height, left, left + pw, py)
    for x in sorted(set(xs)):
        parts.append(f'<text x="{_f(px(x))}" y="{_f(top + ph + 16)}" font-size="11" text-anchor="middle">{F.number(x, "g")}</text>')
    parts.append(f'<text x="{_f(left + pw / 2)}" y="{_f(top + ph + 36)}" font-size="12" text-anchor="middle">mean image tokens per image</text>')
    for g in groups:
        c = colours[g]
        pts = sorted(points[g])
        if g in ceilings and not math.isnan(ceilings[g]):
            cy = py(ceilings[g])
            parts.append(f'<line x1="{_f(left)}" x2="{_f(left + pw)}" y1="{_f(cy)}" y2="{_f(cy)}" stroke="{c}" stroke-dasharray="6,4" stroke-width="1.2"><title>{escape(g)}: orig {F.percent(ceilings[g])}%</title></line>')
        parts.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{" ".join(f"{_f(px(x))},{_f(py(v))}" for x, v in pts)}"/>')
        for x, v in pts:
            parts.append(f'<circle cx="{_f(px(x))}" cy="{_f(py(v))}" r="3.5" fill="{c}"><title>{escape(g)}: {F.number(x, "g")} tokens, {F.percent(v)}%</title></circle>')
    parts += legend(groups, colours, left + pw + 16, top + 10)
    parts.append(f'<text x="{_f(left + pw + 16)}" y="{_f(top + 18 * len(groups) + 16)}" font-size="11">- - - orig (ceiling)</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def limits_over_time(traces: list[tuple[str, tuple[tuple[float, int], ...]]], title: str) -> str:
    """Each server's in-flight limit (y) against seconds since the client started (x), as
    steps: a limit holds until its next change."""
    names = [n for n, _ in traces]
    colours = {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}
    t_end = max((p[-1][0] for _, p in traces if p), default=1.0) or 1.0
    top_limit = max((lim for _, p in traces for _, lim in p), default=1) or 1
    left, top, pw, ph = 52.0, 34.0, 520.0, 200.0
    legend_w = 30 + 7 * max((len(n) for n in names), default=4)
    width, height = left + pw + legend_w + 30, top + ph + 50

    def px(t: float) -> float:
        return left + pw * t / t_end

    def py(v: float) -> float:
        return top + ph * (1 - v / top_limit)

    parts = [
        (f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" width="{_f(width)}" height="{_f(height)}" '
         f'viewBox="0 0 {_f(width)} {_f(height)}" role="img" aria-label="{escape(title)}">'),
        f'<text x="{_f(left)}" y="18" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    for frac in (0.0, 0.5, 1.0):
        v = top_limit * frac
        parts.append(f'<line x1="{_f(left)}" x2="{_f(left + pw)}" y1="{_f(py(v))}" y2="{_f(py(v))}" stroke="#dddddd"/>')
        parts.append(f'<text x="{_f(left - 6)}" y="{_f(py(v) + 4)}" font-size="11" text-anchor="end">{v:.0f}</text>')
    for frac in (0.0, 0.5, 1.0):
        parts.append(f'<text x="{_f(px(t_end * frac))}" y="{_f(top + ph + 16)}" font-size="11" text-anchor="middle">{t_end * frac:.0f}</text>')
    parts.append(f'<text x="{_f(left + pw / 2)}" y="{_f(top + ph + 36)}" font-size="12" text-anchor="middle">seconds since the client started</text>')
    for name, points in traces:
        if not points:
            continue
        steps: list[str] = []
        for i, (t, lim) in enumerate(points):
            if i:
                steps.append(f"{_f(px(t))},{_f(py(points[i - 1][1]))}")
            steps.append(f"{_f(px(t))},{_f(py(lim))}")
        steps.append(f"{_f(px(t_end))},{_f(py(points[-1][1]))}")
        parts.append(f'<polyline fill="none" stroke="{colours[name]}" stroke-width="2" points="{" ".join(steps)}">'
                     f'<title>{escape(name)}: {len(points)} limits, last {points[-1][1]}</title></polyline>')
    parts += legend(names, colours, left + pw + 16, top + 10)
    parts.append("</svg>")
    return "\n".join(parts)


def _frame(title: str, width: float, height: float, left: float, right: float, y: Callable[[float], float]) -> list[str]:
    """The opening of a plot: the svg element, its title, and the 0-100% grid lines."""
    parts = [
        (f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" width="{_f(width)}" height="{_f(height)}" '
         f'viewBox="0 0 {_f(width)} {_f(height)}" role="img" aria-label="{escape(title)}">'),
        f'<text x="{_f(left)}" y="18" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<line x1="{_f(left)}" x2="{_f(right)}" y1="{_f(y(tick))}" y2="{_f(y(tick))}" stroke="#dddddd"/>')
        parts.append(f'<text x="{_f(left - 6)}" y="{_f(y(tick) + 4)}" font-size="11" text-anchor="end">{int(tick * 100)}%</text>')
    return parts


def rates_by_bin(series: dict[str, list[tuple[float, float, float] | None]], ticks: list[str], title: str,
                 x_label: str) -> str:
    """A rate (y, 0-100%) per bin (x, `ticks` left to right), one line per series (a question
    type) with its interval as whiskers; a bin with no value (None, or a NaN rate) breaks the
    line. `series`: name -> per bin (rate, interval low, interval high)."""
    names = list(series)
    colours = {n: (BLIND_COLOUR if i == len(names) - 1 and len(names) > 1 else PALETTE[(i + 1) % len(PALETTE)])
               for i, n in enumerate(names)}
    left, top, pw, ph = 52.0, 34.0, 460.0, 220.0
    legend_w = 30 + 7 * max((len(n) for n in names), default=4)
    width, height = left + pw + legend_w + 30, top + ph + 56
    k = max(1, len(ticks))
    step = pw / k

    def px(i: int, j: int) -> float:  # the j-th series is nudged so whiskers do not overlap
        return left + step * (i + 0.5) + (j - (len(names) - 1) / 2) * min(6.0, step / (2 * max(1, len(names))))

    def py(v: float) -> float:
        return top + ph * (1 - v)

    parts = _frame(title, width, height, left, left + pw, py)
    for i, t in enumerate(ticks):
        parts.append(f'<text x="{_f(left + step * (i + 0.5))}" y="{_f(top + ph + 16)}" font-size="11" '
                     f'text-anchor="middle">{escape(t)}</text>')
    parts.append(f'<text x="{_f(left + pw / 2)}" y="{_f(top + ph + 40)}" font-size="12" text-anchor="middle">'
                 f'{escape(x_label)}</text>')
    for j, name in enumerate(names):
        c = colours[name]
        runs: list[list[str]] = [[]]
        for i, got in enumerate(series[name]):
            if got is None or not _finite(got[0]):
                runs.append([])
                continue
            v, lo, hi = got
            x, y = px(i, j), py(v)
            runs[-1].append(f"{_f(x)},{_f(y)}")
            if _finite(lo, hi):
                parts.append(f'<line x1="{_f(x)}" x2="{_f(x)}" y1="{_f(py(lo))}" y2="{_f(py(hi))}" stroke="{c}" '
                             'stroke-width="1.2"/>')
            parts.append(f'<circle cx="{_f(x)}" cy="{_f(y)}" r="3.5" fill="{c}"><title>{escape(name)}, '
                         f'{escape(ticks[i])}: {F.percent(v)}% (95% CI {F.percent_interval(lo, hi)})</title></circle>')
        for run in runs:
            if len(run) > 1:
                parts.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{" ".join(run)}"/>')
    parts += legend(names, colours, left + pw + 16, top + 10)
    parts.append("</svg>")
    return "\n".join(parts)
