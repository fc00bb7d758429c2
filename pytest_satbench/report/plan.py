"""`python -m pytest_satbench.report --plan TAG --width W | --detect D`: how many images a
question needs, from a pilot's stored answers (a `--limit` run is enough).

The pilot is read as its tag's report reads it (`report.build.collect`: every stored answer of
the tag's questions, re-scored). For each reconstruction arm, its paired delta against `orig`
(for a run without one, `orig`'s accuracy), overall and per question type: the per-image
variance of that figure (`core.compare.cluster_variance`: clustered by image, as every interval
here), and from it the images, and the questions at the pilot's questions per image, that

- `--width W`: a 95% interval W points wide (high minus low) needs;
- `--detect D`: 80% power to detect a true delta of D points (two-sided, 5%) needs;

and the wall time those questions take at the pilot's observed rate (answers its runs asked
per second of their wall time, on its servers, times the arms asked per question). The
prediction assumes new images like the pilot's; the pilot's own variance is an estimate, so a
pilot of a few dozen images gives the answer to within some tens of percent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_satbench.core import arms as A
from pytest_satbench.core import formatting as F
from pytest_satbench.core.compare import (
    ClusterVariance,
    cluster_variance,
    images_for_detect,
    images_for_width,
    interval_width,
)
from pytest_satbench.core.results import QuestionResult
from pytest_satbench.engine.store import ResultStore
from pytest_satbench.report.build import collect
from pytest_satbench.report.compare import CompareError, side_answer

__all__ = ["PlanRow", "plan", "plan_lines"]


@dataclass(frozen=True, slots=True)
class PlanRow:
    benchmark: str
    arm: str  # the reconstruction arm whose delta is planned ("orig": its accuracy, no recon arm ran)
    group: str  # "overall" or a question type
    cv: ClusterVariance
    images_width: int | None
    images_detect: int | None

    @property
    def figure(self) -> str:
        return "accuracy" if self.arm == A.ORIG else "delta"


@dataclass
class _Pilot:
    per_arm: dict[str, dict[str, tuple[list[str], list[float]]]] = field(default_factory=dict)  # arm -> group -> data
    asked: dict[str, int] = field(default_factory=dict)  # run id -> answers it asked


@dataclass(frozen=True, slots=True)
class Plan:
    tag: str
    run_id: str
    rows: tuple[PlanRow, ...]
    arms: int  # arms asked per question
    rate: float | None  # answers per second of the pilot's wall time
    width: float | None
    detect: float | None
    level: float


def plan(store: ResultStore, tag: str, *, width: float | None = None, detect: float | None = None,
         level: float = 0.95, power: float = 0.8) -> list[Plan]:
    """One plan per benchmark of the tag's newest run. Raises CompareError for an unknown tag."""
    runs = store.runs()
    mine = [r for r in runs if r["tag"] == tag]
    if not mine:
        raise CompareError(f"no run with tag {tag!r} in {store.path}")
    run_id = str(mine[0]["run_id"])
    pilots: dict[str, _Pilot] = {}

    def each(bench: str, _tag: str) -> Any:
        pilot = pilots.setdefault(bench, _Pilot())

        def add(it: QuestionResult) -> None:
            for row in it.rows.values():
                if row.run_id:
                    pilot.asked[row.run_id] = pilot.asked.get(row.run_id, 0) + 1
            ref = side_answer(it, A.ORIG)
            if ref is None:
                return
            recon = [a for a in it.rows if A.is_recon(a)]
            for arm in recon or [A.ORIG]:
                s = side_answer(it, arm)
                if s is None:
                    continue
                value = float(s.outcome.correct) - (float(ref.outcome.correct) if arm != A.ORIG else 0.0)
                groups = pilot.per_arm.setdefault(arm, {})
                for g in ("overall", *it.types):
                    ids, vals = groups.setdefault(g, ([], []))
                    ids.append(s.image)
                    vals.append(value)

        return add

    out = []
    by_id = {str(r["run_id"]): r for r in runs}
    for res in collect(store, run_id, iterations=0, each=each):
        pilot = pilots.get(res.benchmark, _Pilot())
        rows = []
        for arm, groups in pilot.per_arm.items():
            for g in ["overall", *sorted(k for k in groups if k != "overall")]:
                ids, vals = groups[g]
                cv = cluster_variance(ids, vals)
                rows.append(PlanRow(res.benchmark, arm, g, cv,
                                    images_for_width(cv, width, level) if width else None,
                                    images_for_detect(cv, detect, power, level) if detect else None))
        asked = sum(n for rid, n in pilot.asked.items() if rid in res.runs)
        wall = sum(_wall(by_id.get(rid)) for rid in res.runs if rid in pilot.asked)
        rate = asked / wall if asked and wall > 0 else None
        out.append(Plan(tag, run_id, tuple(rows), len(res.stats.arms), rate, width, detect, level))
    return out


def _wall(run: Mapping[str, Any] | None) -> float:
    if not run or not run.get("finished"):
        return 0.0
    return max(0.0, float(run["finished"]) - float(run["started"]))


def _duration(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds):
        return F.MISSING
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def plan_lines(plans: Sequence[Plan], power: float = 0.8) -> list[str]:
    out: list[str] = []
    for p in plans:
        if not p.rows:
            out.append(f"satbench plan: tag {p.tag} has no paired answers")
            continue
        first = p.rows[0]
        rate = f"{p.rate:.2f} answers/s over its runs' wall time" if p.rate else "no rate (the pilot asked nothing)"
        out.append(f"satbench plan {first.benchmark}: pilot tag {p.tag} (run {p.run_id}): {first.cv.images} images, "
                   f"{first.cv.questions} questions, {p.arms} arm(s) per question; {rate}")
        wants = []
        if p.width:
            wants.append(f"a {100 * p.level:.0f}% interval {p.width:g} points wide")
        if p.detect:
            wants.append(f"{100 * power:.0f}% power against a delta of {p.detect:g} points")
        out += F.prose("clustered by image; per-image SD = the standard deviation of one image's contribution "
                       f"(points); now = the interval's width with the pilot's images; needed for "
                       f"{' and '.join(wants)}: images, questions at the pilot's questions per image, wall time at "
                       "its rate")
        head = f"{'arm':<10}{'group':<14}{'figure':<9}{'value':>7}{'SD/img':>8}{'now':>7}"
        if p.width:
            head += f"{'images':>9}{'questions':>11}{'time':>10}"
        if p.detect:
            head += f"{'img(D)':>9}{'q(D)':>11}{'time(D)':>10}"
        out.append(head)
        for r in p.rows:
            sd = 100 * math.sqrt(r.cv.per_image_variance) if not math.isnan(r.cv.per_image_variance) else math.nan
            value = F.points(100 * r.cv.mean) if r.figure == "delta" else F.percent(r.cv.mean)
            line = (f"{A.short_label(r.arm)[:9]:<10}{r.group[:13]:<14}{r.figure:<9}{value:>7}"
                    f"{F.number(sd, '.1f'):>8}{F.number(interval_width(r.cv, level=p.level), '.1f'):>7}")
            for need in ((r.images_width,) if p.width else ()) + ((r.images_detect,) if p.detect else ()):
                q = None if need is None else math.ceil(need * r.cv.questions_per_image)
                t = None if q is None or not p.rate else q * p.arms / p.rate
                line += f"{F.MISSING if need is None else need:>9}{F.MISSING if q is None else q:>11}{_duration(t):>10}"
            out.append(line)
    return out
