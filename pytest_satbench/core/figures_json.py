"""A result's figures as JSON, each with the sentence that says what it is.

summary.json (`aggregate_views`), per_type.csv and report.md name a figure by the same key
(`figure_key`) and print it with its label, so a number never travels without saying which
evaluation made it: the headline figures under their own names, each per-question view as
`view:<name>`, each further figure the benchmark declares as `aggregate:<name>`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_satbench.core.labels import AVERAGE, OVERALL, Aggregate
from pytest_satbench.core.stats import AggregateStats

if TYPE_CHECKING:
    from pytest_satbench.core.results import BenchmarkResult

__all__ = ["aggregate_views", "figure_entry", "figure_key"]


def aggregate_views(result: BenchmarkResult) -> dict[str, Any]:
    """The benchmark's own numbers, labelled with what they are: the headline figures
    (`overall_accuracy`, `average_accuracy`, computed as the benchmark's evaluation says), each
    per-question view (`view:<name>`), and each further figure (`aggregate:<name>`). A figure
    has its label, its weighting, covered types and per-type verdicts, `per_arm` (the value,
    a fraction), `accuracy` per arm {n, value, ci_low, ci_high}, `paired` per reconstruction
    arm {n_pairs, delta, ci_low, ci_high} (points) and its parts `by_type`."""
    out: dict[str, Any] = {}
    for agg in result.declared_figures():
        if agg.name in (OVERALL, AVERAGE):
            out[figure_key(agg)] = figure_entry(agg, result.figures[agg.name])
    for name, vs in sorted(result.views.items()):
        out[f"view:{name}"] = {"label": result.labels.view(name).label, **vs.to_dict()}
    for agg in result.declared_figures():
        if agg.name not in (OVERALL, AVERAGE):
            out[figure_key(agg)] = figure_entry(agg, result.figures[agg.name])
    return out


def figure_key(agg: Aggregate) -> str:
    """A figure's key in `aggregate_views` and per_type.csv's `type` column."""
    return agg.name if agg.name in (OVERALL, AVERAGE) else f"aggregate:{agg.name}"


def figure_entry(agg: Aggregate, fs: AggregateStats) -> dict[str, Any]:
    """One figure's entry in `aggregate_views`: its statistics with its label and verdicts."""
    d = fs.to_dict()
    return {
        "label": agg.label,
        "weighting": agg.weighting,
        "types": d["types"],
        "verdicts": agg.describe_verdicts(fs.types),
        "per_arm": {arm: a["value"] for arm, a in d["accuracy"].items()},
        "n": d["n"],
        "n_images": d["n_images"],
        "accuracy": d["accuracy"],
        "paired": d["paired"],
        "by_type": {t: {arm: {"n": v["n"], "value": v["mean"]} for arm, v in per.items()}
                    for t, per in d["by_type"].items()},
    }
