"""The terminal summary: per benchmark and question type, the seed's report as tables.

Built on the controller from the payloads on the test reports (so it is one merged
summary under xdist), with the statistics of `stats.py`. It stays within 80 columns:
one table of accuracy per arm, then one paired table per reconstruction arm with the
delta, its clustered-bootstrap interval, regressed/improved counts and McNemar's p.
"""

from __future__ import annotations

import math
import textwrap
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from pytest_satbench.core.stats import (
    ArmOutcome,
    BenchmarkStats,
    QuestionRecord,
    summarize,
    summarize_view,
)
from pytest_satbench.engine.images import BLIND, ORIG, is_repeat
from pytest_satbench.plugin.options import Settings

_OK = ArmOutcome("ok", True, True)


@dataclass(frozen=True)
class NoiseFloor:
    """--repeat-orig: how often asking the same original again changes the verdict."""

    questions: int  # sampled questions with every repeat answered
    asks: int  # K
    flipped: int  # questions whose correctness differed between asks

    @property
    def rate(self) -> float:
        return self.flipped / self.questions if self.questions else float("nan")


def noise_floor(payloads: list[dict[str, Any]]) -> NoiseFloor | None:
    questions = flipped = asks = 0
    for data in payloads:
        verdicts = [(row[2], row[1]) for row in data["arms"] if row[0] == ORIG or is_repeat(row[0])]
        if len(verdicts) < 2:
            continue
        if any(status != "ok" for _, status in verdicts):
            continue
        asks = max(asks, len(verdicts))
        questions += 1
        flipped += len({correct for correct, _ in verdicts}) > 1
    return NoiseFloor(questions, asks, flipped) if asks else None


def records_from_payloads(payloads: list[dict[str, Any]]) -> list[QuestionRecord]:
    records = []
    for data in payloads:
        arms = {}
        views = {}
        names: set[str] = set()
        for arm, status, correct, parsed, truncated, _from_store, arm_views in data["arms"]:
            if is_repeat(arm):
                continue  # the noise floor is reported on its own, not as an arm
            ok = status == "ok"
            arms[arm] = ArmOutcome(status, bool(correct and ok), bool(parsed and ok), bool(truncated and ok))
            if arm_views:
                views[arm] = arm_views
                names |= set(arm_views)
        for arm, outcome in arms.items():  # an error scores 0 in every view: it stays counted
            if outcome.status != "ok" and names:
                views[arm] = {name: 0.0 for name in names}
        records.append(
            QuestionRecord(
                key=data["k"], image=str(data["img"]), types=tuple(data["t"]) or ("all",),
                arms=arms, chance=data.get("chance"), views=views,
            )
        )
    return records


class SummaryCollector:
    def __init__(self, settings: Settings, iterations: int = 1000) -> None:
        self.settings = settings
        self.iterations = iterations
        self.by_benchmark: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.model: str | None = None
        self.from_store = 0
        self.answered = 0
        self._stats: dict[str, BenchmarkStats] | None = None

    def add(self, data: dict[str, Any]) -> None:
        self.by_benchmark[data["b"]].append(data)
        for arm in data["arms"]:
            if arm[1] == "ok":
                if arm[5]:
                    self.from_store += 1
                else:
                    self.answered += 1

    def stats(self) -> dict[str, BenchmarkStats]:
        """Computed once, after the last item (gates and the terminal both use them)."""
        if self._stats is None:
            self._stats = {
                name: summarize(records_from_payloads(rows), iterations=self.iterations, seed=0)
                for name, rows in sorted(self.by_benchmark.items())
            }
        return self._stats

    def render(self, tr: Any) -> None:
        if not self.by_benchmark:
            return
        for name, st in self.stats().items():
            tr.write_sep("=", f"satbench: {name}")
            for line in render_benchmark(st):
                tr.write_line(line)
            for line in render_views(records_from_payloads(self.by_benchmark[name]), list(st.arms), self.iterations):
                tr.write_line(line)
            floor = noise_floor(self.by_benchmark[name])
            if floor is not None:
                for line in prose(
                    f"noise floor: the original asked {floor.asks}x on {floor.questions} questions changed its verdict "
                    f"on {floor.flipped} ({100 * floor.rate:.1f}%); a per-question delta rate below that is server noise"
                ):
                    tr.write_line(line)
        for line in prose(
            f"answers: {self.answered} asked this run, {self.from_store} reused from the store"
            + (f"; model {self.model}" if self.model else "")
        ):
            tr.write_line(line)


def _pct(x: float | None) -> str:
    return "   -" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:5.1f}"


def _p(p: float) -> str:
    if math.isnan(p):
        return "-"
    if p < 1e-4:
        return "<1e-4"
    return f"{p:.3f}" if p < 0.1 else f"{p:.2f}"


def _ci(lo: float, hi: float) -> str:
    if math.isnan(lo) or math.isnan(hi):
        return "[   -    ]"
    return f"[{lo:+.1f},{hi:+.1f}]"


def render_benchmark(st: BenchmarkStats, width: int = 80) -> list[str]:
    arms = list(st.arms)
    types = list(st.by_type)
    groups = [(t, st.by_type[t]) for t in types] + [("overall", st.overall)]
    lines: list[str] = []
    labels, legend = arm_labels(arms)

    # 1. accuracy per arm (%), with errors/truncated/unparseable summed over arms; at most
    # four arm columns a block, so a budget sweep stays within the width
    tw = max(8, min(max(len(t) for t, _ in groups) + 1, 24))
    per_block = max(1, (width - tw - 7 - 23) // 9)
    for start in range(0, len(arms), per_block):
        block = arms[start:start + per_block]
        if start:
            lines.append("")
        lines.append(f"{'type':<{tw}}{'n':>7}" + "".join(f"{labels[a]:>9}" for a in block)
                     + f"{'chance':>8}{'err':>5}{'trn':>5}{'unp':>5}")
        for label, g in groups:
            accs = "".join(f"{_pct(g.accuracy[a].accuracy if a in g.accuracy else None):>9}" for a in block)
            err = sum(g.accuracy[a].errors for a in arms if a in g.accuracy)
            trn = sum(g.accuracy[a].truncated for a in arms if a in g.accuracy)
            unp = sum(g.accuracy[a].unparseable for a in arms if a in g.accuracy)
            chance = _pct(g.chance.accuracy) if g.chance.n_defined else "   -"
            lines.append(f"{label[:tw - 1]:<{tw}}{g.n:>7}{accs}{chance:>8}{err:>5}{trn:>5}{unp:>5}")
    lines += legend
    if ORIG in st.overall.accuracy:
        o = st.overall.accuracy[ORIG]
        lines += prose(
            f"orig: overall accuracy {100 * o.accuracy:.1f}% "
            f"(95% CI {_pct(o.ci_low).strip()}-{_pct(o.ci_high).strip()}, clustered by image, "
            f"{st.overall.n_images} images); average accuracy (mean of types) "
            f"{100 * st.average_accuracy.get(ORIG, float('nan')):.1f}%", width
        )

    # 2. paired tables, one per reconstruction arm
    tw = max(8, min(max(len(t) for t, _ in groups) + 1, width - 67, 24))
    for arm in st.recon_arms:
        lines.append("")
        lines += prose(f"{arm} vs orig: delta in points, 95% CI clustered by image; R regressed, I improved", width)
        lines.append(f"{'type':<{tw}}{'n':>6}{'orig':>6}{'recon':>6}{'delta':>7} {'95% CI':<14}{'R':>5}{'I':>5}  {'p':<6}{'err':>5}")
        for label, g in groups:
            pair = g.paired.get(arm)
            if pair is None:
                continue
            o = g.accuracy[ORIG].accuracy if ORIG in g.accuracy else float("nan")
            r = g.accuracy[arm].accuracy if arm in g.accuracy else float("nan")
            lines.append(
                f"{label[:tw - 1]:<{tw}}{pair.n_pairs:>6}{_pct(o):>6}{_pct(r):>6}{pair.delta:>+7.1f} "
                f"{_ci(pair.ci_low, pair.ci_high):<14}{pair.regressed:>5}{pair.improved:>5}  "
                f"{_p(pair.mcnemar_p):<6}{pair.n_errors:>5}"
            )
    return lines


VIEW_TITLES = {
    "binned": "binned: the original RSVQA classes (0 / 1-10 / 11-100 / 101-1000 / >1000)",
    "official": "official: VRSBench's deterministic rules (gt contained in answer; yes/no and 0-99 exact)",
    "acc@0.5": "acc@0.5: IoU >= 0.5 (VRSBench grounding headline)",
    "acc@0.7": "acc@0.7: IoU >= 0.7",
    "iou": "iou: mean IoU",
}


def prose(text: str, width: int = 80) -> list[str]:
    """A sentence of the summary, wrapped to the terminal width the tables keep to."""
    return textwrap.wrap(text, width, subsequent_indent="  ", break_on_hyphens=False) or [""]


def render_views(records: list[QuestionRecord], arms: list[str], iterations: int, width: int = 80) -> list[str]:
    """Second views of the same answers (binned counts, VRSBench official rules, Acc@0.7)."""
    names = sorted({v for r in records for arm_views in r.views.values() for v in arm_views})
    lines: list[str] = []
    labels, _ = arm_labels(arms)
    for name in names:
        vs = summarize_view(records, name, iterations=min(iterations, 200), seed=0)
        shown = [a for a in arms if a in vs.overall]
        if not shown:
            continue
        lines.append("")
        lines += prose(f"view {VIEW_TITLES.get(name, name)} (%)", width)
        rows = [(t, g) for t, g in vs.by_type.items() if g] + [("overall", vs.overall)]
        per_block = max(1, (width - 23) // 9)
        for start in range(0, len(shown), per_block):
            block = shown[start:start + per_block]
            lines.append(f"{'type':<16}{'n':>7}" + "".join(f"{labels[a]:>9}" for a in block))
            for label, g in rows:
                n = max((g[a].n for a in block if a in g), default=0)
                lines.append(f"{label[:15]:<16}{n:>7}" + "".join(f"{_pct(g[a].mean if a in g else None):>9}" for a in block))
    return lines


def arm_labels(arms: list[str]) -> tuple[dict[str, str], list[str]]:
    """Column labels of at most 8 characters, with a legend line when they had to be numbered."""
    short = {a: _arm_label(a) for a in arms}
    if all(len(v) <= 8 for v in short.values()) and len(set(short.values())) == len(short):
        return short, []
    numbered, legend = {}, []
    for i, a in enumerate(arms):
        if a in (ORIG, BLIND):
            numbered[a] = a
        else:
            numbered[a] = f"arm{i}"
            legend += prose(f"  arm{i} = {a}")
    return numbered, legend


def _arm_label(arm: str) -> str:
    if arm in (ORIG, BLIND):
        return arm
    if arm.startswith("onedpiece") and "nlatent=" in arm:
        return "tok" + arm.split("nlatent=")[1].split(",")[0]  # One-D-Piece budgets
    return arm.replace("quality=", "q").replace("resize:factor=", "rsz:").replace("factor=", "f")
