"""From the store to a report's numbers: one run's rows through `core.results`.

The only work done here is what needs I/O: reading the run from the store, the benchmark's
declared labels and types from the registry, and, for runs stored before question records
carried the geometry sent, the image's size from its file.

The store's rows are streamed, one benchmark at a time, straight into `benchmark_results`:
nothing holds a run's rows (see `core.results` on memory).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from pytest_satbench.core import arms as A
from pytest_satbench.core.records import AnswerRow
from pytest_satbench.core.results import (
    BenchmarkResult,
    Labels,
    QuestionResult,
    benchmark_results,
    score_options,
)
from pytest_satbench.engine.store import ResultStore

__all__ = ["Each", "collect", "token_curve"]

# (benchmark, tag) -> what is called with each of that benchmark's questions as it is scored
# (or None): how report files that list every answer are written without keeping them
Each = Callable[[str, str], Callable[[QuestionResult], None] | None]


def collect(store: ResultStore, run_id: str, *, iterations: int = 1000, seed: int = 0,
            each: Each | None = None) -> list[BenchmarkResult]:
    """Every benchmark of the run, re-scored and summarised; [] when the run has no items.
    Raises KeyError when the run is not in the store."""
    runs = {r["run_id"]: r for r in store.runs()}
    if run_id not in runs:
        raise KeyError(f"run {run_id!r} is not in {store.path}")
    run = runs[run_id]
    protocol = dict(run["protocol"])  # type: ignore[arg-type]
    traffic = store.traffic(run_id)
    limits = store.limits(run_id)
    tag = str(run["tag"])
    out = []
    for bench in store.run_benchmarks(run_id):
        declared = _declared(bench)
        stored = ((nodeid, qdict, rows) for nodeid, _, qdict, rows in store.run_items(run_id, bench))
        out.append(benchmark_results(
            bench, run_id, tag, protocol, _with_sizes(stored, protocol),
            options=score_options(protocol, declared.score_views if declared else frozenset()),
            reported_type=declared.reported_type if declared else (lambda raw: raw),
            labels=_labels(declared, protocol),
            traffic=traffic, limits=limits, iterations=iterations, seed=seed, unfinished=run["finished"] is None,
            each=each(bench, tag) if each is not None else None,
        ))
    return out


def _labels(declared: Any, protocol: Mapping[str, Any]) -> Labels:
    if declared is None:
        return Labels()
    if protocol.get("judge") and declared.judged_labels is not None:
        return declared.judged_labels  # the run asked a judge: the published protocol
    return declared.labels


def _declared(bench: str) -> Any:
    from pytest_satbench.datasets import registry

    try:
        return registry.get(bench)
    except KeyError:  # a benchmark from a plugin that is not installed here: raw types
        return None


def _with_sizes(
    stored: Iterable[tuple[str, dict[str, Any], dict[str, AnswerRow]]], protocol: Mapping[str, Any],
) -> Iterator[tuple[str, dict[str, Any], dict[str, AnswerRow]]]:
    """Question records of older runs lack the geometry sent, which answers on the pixel
    grid need: the original's size stands in (exact unless a codec changed the canvas)."""
    pixels = protocol.get("box_grid") == "pixels"
    for nodeid, qdict, rows in stored:
        if pixels and qdict.get("kind") == "ref" and not qdict.get("sent_size") and qdict.get("image_path"):
            qdict = {**qdict, "sent_size": _image_size(str(qdict["image_path"]))}
        yield nodeid, qdict, rows


def _image_size(path: str) -> list[int] | None:
    from PIL import Image

    try:
        with Image.open(path) as im:
            return list(im.size)
    except OSError:
        return None


def token_curve(data: BenchmarkResult) -> tuple[dict[str, list[tuple[float, float]]], dict[str, float]] | None:
    """Per group (types, then overall): (mean image tokens, accuracy) of every arm that
    reports image tokens, and the original's accuracy as the ceiling. None unless at least
    two arms report tokens (one budget is a point, not a curve)."""
    arms = [a for a, t in data.usage.image_tokens.items() if t is not None and a not in (A.ORIG, A.BLIND)]
    if len(arms) < 2:
        return None
    st = data.stats
    groups = [*st.by_type.items(), ("overall", st.overall)]
    points: dict[str, list[tuple[float, float]]] = {}
    ceilings: dict[str, float] = {}
    for label, g in groups:
        pts = []
        for arm in arms:
            a = g.accuracy.get(arm)
            if a is not None and a.n:
                pts.append((float(data.usage.image_tokens[arm] or 0.0), a.accuracy))
        points[label] = pts
        if A.ORIG in g.accuracy and g.accuracy[A.ORIG].n:
            ceilings[label] = g.accuracy[A.ORIG].accuracy
    return points, ceilings
