"""Accuracy gates for CI: `--gate 'rsvqa_lr:orig>=0.86'`, `--gate 'delta>=-2.0'`.

Grammar: `[BENCHMARK[/TYPE]:][FIGURE:]METRIC OP NUMBER`, OP one of >= <= > < ==; BENCHMARK
`*` is every benchmark that ran (to name a figure without naming a benchmark).

A gate reads one of the benchmark's declared figures (`core.labels`, `BenchmarkResult.figure`):
without FIGURE, its **headline**, the number its paper prints and the terminal shows first
(RSVQA: the original evaluation's OA, count/area answers in classes; VRSBench: All under the
official rules; others: their overall accuracy). `published`, `average_accuracy` and the
benchmark's other figures are named so (`rsvqa_lr:published:orig>=0.92`); `exact` is exact
match, the per-type table's verdict (`rsvqa_lr/count:exact:orig>=0.25`). With TYPE, the
figure over that type's questions, each decided by the figure's verdict for the type.

Metrics (accuracies are fractions, 0.80; `80%` is accepted too; deltas are percentage
points, recon minus orig, negative = the reconstruction costs accuracy):

  orig, recon, blind          the figure for that arm (recon: every reconstruction arm)
  delta, delta_ci_low,        the figure's paired delta and its clustered-bootstrap 95%
  delta_ci_high               interval, for every reconstruction arm
  regressed, improved         discordant pair counts, every reconstruction arm    } exact
  mcnemar_p                   McNemar's exact p, every reconstruction arm         } match
  errors, truncated,          counts summed over all arms                         } only:
  unparseable                                                                     } no other
  coverage                    parsed / n, every arm                               } figure

The gate table names the figure each value is read from. A gate never passes vacuously: one
naming a benchmark, type or figure that did not run, or a reconstruction metric when no
reconstruction arm ran, fails with that reason.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_satbench.core.results import BenchmarkResult
    from pytest_satbench.core.stats import GroupStats

GATE_FAILED_EXIT = 6  # distinct from pytest's 1 (items failed)
EXACT = "exact"  # the figure name of exact match (the per-type table's verdict)
ALL = "*"  # every benchmark that ran

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq,
}
_GATE = re.compile(
    r"^\s*(?:(?P<bench>[A-Za-z0-9_]+|\*)(?:/(?P<type>[^:]+))?\s*:)?(?:\s*(?P<figure>[A-Za-z0-9_@.]+)\s*:)?"
    r"\s*(?P<metric>[a-z_]+)\s*"
    r"(?P<op>>=|<=|==|>|<)\s*(?P<value>[-+]?\d+(?:\.\d+)?)\s*(?P<pct>%)?\s*$"
)
_ALL_PREFIX = re.compile(r"^\s*[*]\s*:\s*")
ARM_METRICS = {"orig", "recon", "blind", "coverage"}
PAIR_METRICS = {"delta", "delta_ci_low", "delta_ci_high", "regressed", "improved", "mcnemar_p"}
COUNT_METRICS = {"errors", "truncated", "unparseable"}
METRICS = ARM_METRICS | PAIR_METRICS | COUNT_METRICS
# what only exact match's statistics carry (a figure is a value per arm and a paired delta)
EXACT_METRICS = COUNT_METRICS | {"coverage", "regressed", "improved", "mcnemar_p"}


class GateError(ValueError):
    """A malformed gate: one line saying what to write instead."""


@dataclass(frozen=True)
class Gate:
    text: str
    benchmark: str | None  # None or ALL: every benchmark that ran
    qtype: str | None
    metric: str
    op: str
    threshold: float
    figure: str | None = None  # None: the headline (EXACT metrics: exact match)


@dataclass(frozen=True)
class GateResult:
    expr: str
    passed: bool
    value: float | None
    reason: str
    figure: str = ""  # the figure the value was read from ("" when none was)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def parse_gate(text: str) -> Gate:
    m = _GATE.match(text)
    if not m:
        raise GateError(
            f"--gate {text!r}: expected [BENCHMARK[/TYPE]:][FIGURE:]METRIC OP NUMBER, "
            "e.g. 'rsvqa_lr:recon>=0.80' or 'delta>=-2.0'"
        )
    metric = m["metric"]
    if metric not in METRICS:
        raise GateError(f"--gate {text!r}: unknown metric {metric!r}; known: {', '.join(sorted(METRICS))}")
    figure = m["figure"]
    if figure is not None and figure != EXACT and metric in EXACT_METRICS:
        raise GateError(f"--gate {text!r}: {metric} is counted on exact match only: write {EXACT}:{metric} "
                        f"or leave the figure out")
    if m["bench"] == ALL and m["type"] is not None:
        raise GateError(f"--gate {text!r}: a type needs a benchmark, e.g. 'rsvqa_lr/{m['type']}:...'")
    threshold = float(m["value"])
    if m["pct"]:
        if metric not in ARM_METRICS:
            raise GateError(f"--gate {text!r}: '%' only applies to accuracies; deltas are already in points")
        threshold /= 100
    bench = None if m["bench"] == ALL else m["bench"]
    return Gate(text.strip(), bench, m["type"], metric, m["op"], threshold, figure)


def figure_parts(gates: Iterable[Gate], benchmark: str) -> list[tuple[str | None, str]]:
    """The per-type parts of figures (figure name or None for the headline, type) the gates
    read in `benchmark`: computed with its results (`core.results.benchmark_results`)."""
    return [
        (g.figure, g.qtype) for g in gates
        if g.qtype is not None and g.benchmark in (None, benchmark)
        and g.figure != EXACT and g.metric not in EXACT_METRICS
    ]


def evaluate(gates: list[Gate], results: dict[str, BenchmarkResult]) -> list[GateResult]:
    out: list[GateResult] = []
    for gate in gates:
        if gate.benchmark is not None and gate.benchmark not in results:
            out.append(GateResult(gate.text, False, None, f"benchmark {gate.benchmark!r} did not run"))
            continue
        for bench in [gate.benchmark] if gate.benchmark else sorted(results):
            out += _evaluate_one(gate, bench, results[bench])
    return out


def _evaluate_one(gate: Gate, bench: str, result: BenchmarkResult) -> list[GateResult]:
    label = gate.text if gate.benchmark else f"{bench}:{_ALL_PREFIX.sub('', gate.text)}"
    st = result.stats
    if gate.qtype is not None and gate.qtype not in st.by_type:
        return [GateResult(label, False, None, f"type {gate.qtype!r} did not run in {bench}")]
    where = f"{bench}/{gate.qtype}" if gate.qtype is not None else bench
    m = gate.metric
    values: list[tuple[str, float]] = []
    if gate.figure == EXACT or m in EXACT_METRICS:
        figure = "exact match"
        group: GroupStats = st.by_type[gate.qtype] if gate.qtype is not None else st.overall
        if m in COUNT_METRICS:
            values.append(("", float(sum(getattr(a, m) for a in group.accuracy.values()))))
        elif m in ("orig", "blind"):
            if m not in group.accuracy:
                return [GateResult(label, False, None, f"arm {m!r} did not run in {where}", figure)]
            values.append(("", group.accuracy[m].accuracy))
        elif m == "coverage":
            values += [(arm, a.coverage) for arm, a in group.accuracy.items()]
        elif m == "recon":
            values += [(arm, group.accuracy[arm].accuracy) for arm in st.recon_arms if arm in group.accuracy]
        else:  # paired metrics
            for arm in st.recon_arms:
                pair = group.paired.get(arm)
                if pair is not None:
                    attr = {"delta_ci_low": "ci_low", "delta_ci_high": "ci_high"}.get(m, m)
                    values.append((arm, float(getattr(pair, attr))))
    else:
        found = result.figure(gate.figure, gate.qtype)
        if found is None:
            known = ", ".join([EXACT] + [a.name for a in result.declared_figures()])
            what = f"figure {gate.figure!r}" if gate.figure else "a headline figure"
            return [GateResult(label, False, None, f"{bench} has no {what} (known: {known})")]
        agg, fs = found
        figure = agg.name if gate.figure else f"{agg.name} (headline)"
        if fs is None:
            return [GateResult(label, False, None, f"figure {agg.name!r} does not cover type {gate.qtype!r}", figure)]
        if m in ("orig", "blind"):
            if m not in fs.accuracy:
                return [GateResult(label, False, None, f"arm {m!r} did not run in {where}", figure)]
            values.append(("", fs.accuracy[m].value))
        elif m == "recon":
            values += [(arm, fs.accuracy[arm].value) for arm in st.recon_arms if arm in fs.accuracy]
        else:  # delta, delta_ci_low, delta_ci_high
            attr = {"delta_ci_low": "ci_low", "delta_ci_high": "ci_high"}.get(m, m)
            values += [(arm, float(getattr(fs.paired[arm], attr))) for arm in st.recon_arms if arm in fs.paired]
    if not values:
        return [GateResult(label, False, None, f"no reconstruction arm ran in {where}", figure)]
    out = []
    for arm, value in values:
        name = f"{label} [{arm}]" if arm and len(values) > 1 else label
        if value is None or (isinstance(value, float) and math.isnan(value)):
            out.append(GateResult(name, False, None, f"{m} is undefined in {where} (too few images?)", figure))
            continue
        ok = _OPS[gate.op](value, gate.threshold)
        shown = f"{value:.4g}"
        out.append(GateResult(name, ok, value, f"{m} = {shown} in {where}" + ("" if ok else f", needs {gate.op} {gate.threshold:g}"),
                              figure))
    return out


def render(results: list[GateResult]) -> list[str]:
    """The gate table: each gate, its result, the figure its value is read from and why."""
    if not results:
        return []
    width = min(40, max(len(r.expr) for r in results))
    fwidth = min(28, max(len("figure"), *(len(r.figure) for r in results)))
    lines = [f"{'gate':<{width}}  result  {'figure':<{fwidth}}  detail"]
    for r in results:
        lines.append(f"{r.expr[:width]:<{width}}  {'PASS' if r.passed else 'FAIL':<6}  {r.figure[:fwidth]:<{fwidth}}  {r.reason}")
    return lines
