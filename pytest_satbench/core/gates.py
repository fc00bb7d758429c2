"""Accuracy gates for CI: `--gate 'rsvqa_lr:recon>=0.80'`, `--gate 'delta>=-2.0'`.

Grammar: `[BENCHMARK[/TYPE]:]METRIC OP NUMBER`, OP one of >= <= > < ==.

Metrics (accuracies are fractions, 0.80; `80%` is accepted too; deltas are percentage
points, recon minus orig, negative = the reconstruction costs accuracy):

  orig, recon, blind          accuracy of that arm (recon: every reconstruction arm)
  delta, delta_ci_low,        paired delta and its clustered-bootstrap 95% interval,
  delta_ci_high               for every reconstruction arm
  regressed, improved         discordant pair counts, every reconstruction arm
  mcnemar_p                   McNemar's exact p, every reconstruction arm
  errors, truncated,          counts summed over all arms
  unparseable
  coverage                    parsed / n, every arm

Without a scope a gate applies to every benchmark that ran. A gate never passes
vacuously: one naming a benchmark or type that did not run, or a reconstruction metric
when no reconstruction arm ran, fails with that reason.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass

from pytest_satbench.core.stats import BenchmarkStats, GroupStats

GATE_FAILED_EXIT = 6  # distinct from pytest's 1 (items failed)

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq,
}
_GATE = re.compile(
    r"^\s*(?:(?P<bench>[A-Za-z0-9_]+)(?:/(?P<type>[^:]+))?\s*:)?\s*(?P<metric>[a-z_]+)\s*"
    r"(?P<op>>=|<=|==|>|<)\s*(?P<value>[-+]?\d+(?:\.\d+)?)\s*(?P<pct>%)?\s*$"
)
ARM_METRICS = {"orig", "recon", "blind", "coverage"}
PAIR_METRICS = {"delta", "delta_ci_low", "delta_ci_high", "regressed", "improved", "mcnemar_p"}
COUNT_METRICS = {"errors", "truncated", "unparseable"}
METRICS = ARM_METRICS | PAIR_METRICS | COUNT_METRICS


class GateError(ValueError):
    """A malformed gate: one line saying what to write instead."""


@dataclass(frozen=True)
class Gate:
    text: str
    benchmark: str | None
    qtype: str | None
    metric: str
    op: str
    threshold: float


@dataclass(frozen=True)
class GateResult:
    expr: str
    passed: bool
    value: float | None
    reason: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def parse_gate(text: str) -> Gate:
    m = _GATE.match(text)
    if not m:
        raise GateError(
            f"--gate {text!r}: expected [BENCHMARK[/TYPE]:]METRIC OP NUMBER, e.g. 'rsvqa_lr:recon>=0.80' or 'delta>=-2.0'"
        )
    metric = m["metric"]
    if metric not in METRICS:
        raise GateError(f"--gate {text!r}: unknown metric {metric!r}; known: {', '.join(sorted(METRICS))}")
    threshold = float(m["value"])
    if m["pct"]:
        if metric not in ARM_METRICS:
            raise GateError(f"--gate {text!r}: '%' only applies to accuracies; deltas are already in points")
        threshold /= 100
    return Gate(text.strip(), m["bench"], m["type"], metric, m["op"], threshold)


def evaluate(gates: list[Gate], stats: dict[str, BenchmarkStats]) -> list[GateResult]:
    results: list[GateResult] = []
    for gate in gates:
        if gate.benchmark is not None and gate.benchmark not in stats:
            results.append(GateResult(gate.text, False, None, f"benchmark {gate.benchmark!r} did not run"))
            continue
        for bench in [gate.benchmark] if gate.benchmark else sorted(stats):
            results += _evaluate_one(gate, bench, stats[bench])
    return results


def _evaluate_one(gate: Gate, bench: str, st: BenchmarkStats) -> list[GateResult]:
    label = gate.text if gate.benchmark else f"{bench}:{gate.text}"
    if gate.qtype is not None:
        group: GroupStats | None = st.by_type.get(gate.qtype)
        if group is None:
            return [GateResult(label, False, None, f"type {gate.qtype!r} did not run in {bench}")]
        where = f"{bench}/{gate.qtype}"
    else:
        group, where = st.overall, bench

    values: list[tuple[str, float]] = []
    m = gate.metric
    if m in COUNT_METRICS:
        attr = {"errors": "errors", "truncated": "truncated", "unparseable": "unparseable"}[m]
        values.append(("", float(sum(getattr(a, attr) for a in group.accuracy.values()))))
    elif m in ("orig", "blind"):
        if m not in group.accuracy:
            return [GateResult(label, False, None, f"arm {m!r} did not run in {where}")]
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
    if not values:
        return [GateResult(label, False, None, f"no reconstruction arm ran in {where}")]
    out = []
    for arm, value in values:
        name = f"{label} [{arm}]" if arm and len(values) > 1 else label
        if value is None or (isinstance(value, float) and math.isnan(value)):
            out.append(GateResult(name, False, None, f"{m} is undefined in {where} (too few images?)"))
            continue
        ok = _OPS[gate.op](value, gate.threshold)
        shown = f"{value:.4g}"
        out.append(GateResult(name, ok, value, f"{m} = {shown} in {where}" + ("" if ok else f", needs {gate.op} {gate.threshold:g}")))
    return out


def render(results: list[GateResult]) -> list[str]:
    if not results:
        return []
    width = min(48, max(len(r.expr) for r in results))
    lines = [f"{'gate':<{width}}  result  detail"]
    for r in results:
        lines.append(f"{r.expr[:width]:<{width}}  {'PASS' if r.passed else 'FAIL':<6}  {r.reason}")
    return lines
