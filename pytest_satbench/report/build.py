"""From the store to a report's numbers: a tag's rows through `core.results`.

A report of a run covers every stored answer of its tag's questions, not only the questions
the run itself selected: a subset run (`-k`, `--lf`, `--limit`, `--deselect`) never shrinks its
tag's report. `tag_runs` picks the runs merged: the run and its tag's earlier runs, back to
the last change of what the answers measure (model, sampling, prompt style, judge, the
benchmark's dataset files); the store merges their questions (`ResultStore.tag_items`: per
question and arm, the newest run's fingerprint and its row).

The only work done here is what needs I/O: reading the runs from the store, the benchmark's
declared labels and types from the registry, and, for runs stored before question records
carried the geometry sent, the image's size from its file.

The store's rows are streamed, one benchmark at a time, straight into `benchmark_results`:
nothing holds a run's rows (see `core.results` on memory).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_satbench.core import arms as A
from pytest_satbench.core.defaults import BOOTSTRAP
from pytest_satbench.core.distortion_flips import DistortionFlips, FlipTable
from pytest_satbench.core.early_stop import replay
from pytest_satbench.core.labels import Labels
from pytest_satbench.core.records import ServerTraffic
from pytest_satbench.core.results import (
    BenchmarkResult,
    Coverage,
    QuestionResult,
    benchmark_results,
    score_options,
)
from pytest_satbench.engine.config import sampling_of
from pytest_satbench.engine.store import ResultStore

__all__ = ["DistortionResult", "Each", "collect", "distortion_flips", "flip_pair", "tag_runs", "token_curve"]

# (benchmark, tag) -> what is called with each of that benchmark's questions as it is scored
# (or None): how report files that list every answer are written without keeping them
Each = Callable[[str, str], Callable[[QuestionResult], None] | None]


def collect(store: ResultStore, run_id: str, *, iterations: int = BOOTSTRAP, seed: int = 0,
            each: Each | None = None,
            figure_parts: Callable[[str], Iterable[tuple[str | None, str]]] | None = None) -> list[BenchmarkResult]:
    """Every benchmark the run recorded questions of, re-scored and summarised over every
    stored answer of its tag's questions (`tag_runs`); [] when the run has no items. Raises
    KeyError when the run is not in the store. `figure_parts(benchmark)`: the per-type parts
    of its figures to compute too (what the gates read, `core.gates.figure_parts`)."""
    all_runs = store.runs()
    runs: dict[object, dict[str, Any]] = {r["run_id"]: r for r in all_runs}  # protocol: a dict
    if run_id not in runs:
        raise KeyError(f"run {run_id!r} is not in {store.path}")
    run = runs[run_id]
    protocol = dict(run["protocol"])
    limits = store.limits(run_id)
    tag = str(run["tag"])
    out = []
    for bench in store.run_benchmarks(run_id):
        declared = _declared(bench)
        merged = tag_runs(store, run_id, bench, all_runs)
        ids = tuple(str(r["run_id"]) for r in merged)
        if len(ids) == 1:
            stored: Iterable[tuple[Any, ...]] = (
                (nodeid, qdict, rows) for nodeid, _, qdict, rows in store.run_items(run_id, bench))
        else:
            stored = store.tag_items(ids, bench)
        plan = (protocol.get("sequential") or {}).get(bench)
        per_image: dict[str, tuple[int, dict[str, float]]] = {}
        each_one = each(bench, tag) if each is not None else None
        if plan:
            each_one = _per_image(per_image, each_one)
        result = benchmark_results(
            bench, run_id, tag, protocol, _with_sizes(stored, protocol),
            options=score_options(protocol, declared.score_views if declared else frozenset()),
            reported_type=declared.reported_type if declared else (lambda raw: raw),
            labels=_labels(declared, protocol),
            traffic=_traffic(store, ids), limits=limits, iterations=iterations, seed=seed,
            unfinished=run["finished"] is None,
            each=each_one,
            coverage=_coverage(merged, bench),
            figure_parts=figure_parts(bench) if figure_parts is not None else (),
        )
        if plan:
            result.sequential = replay(plan, per_image, protocol.get("arms") or ())
        out.append(result)
    return out


def _per_image(per_image: dict[str, tuple[int, dict[str, float]]],
               then: Callable[[QuestionResult], None] | None) -> Callable[[QuestionResult], None]:
    """Counts each image's stored questions and correct answers per arm (an arm with no answer
    counts as wrong), for `replay`; then hands the question on."""

    def each(it: QuestionResult) -> None:
        image = it.question.image.id
        n, correct = per_image.get(image, (0, {}))
        for arm in it.rows:
            correct[arm] = correct.get(arm, 0.0) + (1.0 if it.correct(arm) else 0.0)
        per_image[image] = (n + 1, correct)
        if then is not None:
            then(it)

    return each


# what an answer measures, in a run's protocol: a tag's runs are merged back to its last change
_MEASURE = ("model", "sampling", "prompt_style")


def tag_runs(store: ResultStore, run_id: str, bench: str,
             all_runs: list[dict[str, object]] | None = None) -> list[dict[str, object]]:
    """The runs whose answers a report of `run_id` covers for `bench`, `run_id` first: it and the
    earlier runs of its tag that recorded questions of `bench`, newest first, back to the first
    that measured differently (another model, sampling, prompt style or judge model, or other
    dataset files of `bench`: answers of two protocols are never merged, even where
    `--allow-protocol-change` let a run join the tag). Runs started after `run_id` are not in
    its report."""
    runs = all_runs if all_runs is not None else store.runs()
    at = next(i for i, r in enumerate(runs) if r["run_id"] == run_id)
    this = runs[at]
    tag = this["tag"]
    mine: dict[str, Any] = this["protocol"]  # type: ignore[assignment]  # runs() parses it to a dict
    out = [this]
    for prev in runs[at + 1:]:
        if prev["tag"] != tag:
            continue
        theirs: dict[str, Any] = prev["protocol"]  # type: ignore[assignment]  # likewise
        if not _same_measure(mine, theirs, bench):
            break
        if bench in store.run_benchmarks(str(prev["run_id"])):
            out.append(prev)
    return out


def _same_measure(a: Mapping[str, Any], b: Mapping[str, Any], bench: str) -> bool:
    if any(a.get(k) != b.get(k) for k in _MEASURE if k != "sampling") or sampling_of(a) != sampling_of(b):
        return False  # (a run recorded before the model settings existed set none of them)
    if (a.get("judge") or {}).get("model") != (b.get("judge") or {}).get("model"):
        return False
    files_a, files_b = (a.get("datasets") or {}).get(bench), (b.get("datasets") or {}).get(bench)
    return not (files_a and files_b and files_a != files_b)


def _coverage(merged: list[dict[str, Any]], bench: str) -> Coverage:
    planned = [int((r["protocol"].get("planned") or {}).get(bench, 0)) for r in merged]
    limits = [r["protocol"].get("limit") or None for r in merged]
    limit = None if any(x is None for x in limits) else max(limits)  # type: ignore[type-var]  # no None: checked first
    return Coverage(tuple(str(r["run_id"]) for r in merged), max(planned), limit, planned[0],
                    shards=_shard_parts(merged, bench))


def _shard_parts(merged: list[dict[str, Any]], bench: str) -> dict[str, Any] | None:
    """The `--shard I/N` parts of one split whose answers the report covers (the stores of a job
    array merged, or one store the parts shared), from their protocols' "shard" records: None
    unless two or more parts of one split are among `merged` (one part's report says which part
    it is, `text_summary.shard_line`). Counts are before -k, as the records keep them."""
    splits: dict[int, dict[int, Mapping[str, Any]]] = {}
    for r in merged:  # newest first: a part run again keeps its newest record
        shard = r["protocol"].get("shard") or {}
        counts = (shard.get("benchmarks") or {}).get(bench)
        if counts:
            splits.setdefault(int(shard["count"]), {}).setdefault(int(shard["index"]), counts)
    if not splits:
        return None
    count, parts = max(splits.items(), key=lambda kv: (len(kv[1]), kv[0]))
    if len(parts) < 2:
        return None
    questions = max(int(c["questions"]) for c in parts.values())
    return {"count": count, "parts": sorted(parts), "questions": questions,
            "missing": max(0, questions - sum(int(c["shard_questions"]) for c in parts.values()))}


def _traffic(store: ResultStore, run_ids: tuple[str, ...]) -> dict[str, ServerTraffic]:
    """What the clients of the merged runs sent, per server, summed over the runs."""
    out: dict[str, ServerTraffic] = {}
    for run_id in run_ids:
        for server, t in store.traffic(run_id).items():
            out[server] = out[server] + t if server in out else t
    return out


def _labels(declared: Any, protocol: Mapping[str, Any]) -> Labels:
    if declared is None:
        return Labels()
    if protocol.get("judge") and declared.judged_labels is not None:
        return declared.judged_labels  # the run asked a judge: the published evaluation
    return declared.labels


def _declared(bench: str) -> Any:
    from pytest_satbench.datasets import registry

    try:
        return registry.get(bench)
    except KeyError:  # a benchmark from a plugin that is not installed here: raw types
        return None


def _with_sizes(stored: Iterable[tuple[Any, ...]], protocol: Mapping[str, Any]) -> Iterator[tuple[Any, ...]]:
    """Question records of older runs lack the geometry sent, which answers on the pixel
    grid need: the original's size stands in (exact unless a codec changed the canvas).
    Entries are (node id, question dict, {arm: row}[, recorded by the run])."""
    if protocol.get("box_grid") != "pixels":
        yield from stored
        return
    for entry in stored:
        qdict: dict[str, Any] = entry[1]
        if qdict.get("kind") == "ref" and not qdict.get("sent_size") and qdict.get("image_path"):
            entry = (entry[0], {**qdict, "sent_size": _image_size(str(qdict["image_path"]))}, *entry[2:])
        yield entry


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


@dataclass(frozen=True)
class DistortionResult:
    """A benchmark's flips against distortion (`core.distortion_flips`), the distortions the
    store gave per (original sha256, reconstruction sha256), or why there is no figure."""

    flips: DistortionFlips | None
    by_pair: Mapping[Hashable, Any] = field(default_factory=dict)
    absent: str | None = None  # why flips is None (None too: no reconstruction arm, nothing to say)
    lpips_weights: tuple[str, ...] = ()  # sha256 of the LPIPS weights the stored values were computed with


def flip_pair(it: QuestionResult, arm: str) -> tuple[str, str] | None:
    """The images a reconstruction arm's question compares: (sha256 of the original's bytes sent,
    of the arm's), the key of the arm's distortion for that image; None when a row lacks one."""
    o, r = it.rows.get(A.ORIG), it.rows.get(arm)
    if o is None or r is None or not o.image_sha256 or not r.image_sha256:
        return None
    return (o.image_sha256, r.image_sha256)


def add_flips(table: FlipTable, it: QuestionResult) -> None:
    """One scored question into `table`: every reconstruction arm it has beside the original."""
    if A.ORIG not in it.rows:
        return
    orig = it.correct(A.ORIG)
    image = it.question.image.id
    for arm in it.rows:
        if A.is_recon(arm):
            table.add(arm, image, it.types, orig, it.correct(arm), flip_pair(it, arm))


# DistortionResult.absent of a run made with --distortion off (its protocol's distortion.measured)
NOT_MEASURED = "not measured (--distortion off)"


def distortion_measured(protocol: Mapping[str, Any]) -> bool:
    """Whether the run measured distortion: its protocol's `distortion.measured` (runs recorded
    before --distortion existed always did)."""
    return bool((protocol.get("distortion") or {}).get("measured", True))


def distortion_flips(store: Any, table: FlipTable, *, iterations: int, seed: int = 0,
                     measured: bool = True) -> DistortionResult:
    """Ask the store (None: not asked, no section), in one query, for the distortion of every (original, reconstruction) pair
    the benchmark's questions were sent as, and compute the flips against it. A store that keeps
    no distortion, or none for these images, gives the reason instead of a figure; a run with
    --distortion off (`measured` False) is not asked: `NOT_MEASURED`, whatever earlier runs stored."""
    if not table.arms or store is None:
        return DistortionResult(None)
    if not measured:
        return DistortionResult(None, absent=NOT_MEASURED)
    fetch = getattr(store, "distortions", None)
    if fetch is None:
        return DistortionResult(None, absent="the store these answers were read from keeps no distortion per image "
                                "(it was written before distortion was measured)")
    pairs = table.pairs()
    if not pairs:
        return DistortionResult(None, absent="no answer of a reconstruction arm records the sha256 of the images sent")
    try:
        got = dict(fetch(pairs))
    except sqlite3.Error as exc:
        return DistortionResult(None, absent=f"the store's distortion table could not be read ({exc}); "
                                "the answers' figures are unaffected")
    if not got:
        return DistortionResult(None, absent=(
            "no distortion is stored for the images these answers were sent as (it is measured when an image is "
            "prepared: answers stored before that, or reconstructions identical to the original, have none)"))
    psnr = {k: getattr(v, "psnr", None) for k, v in got.items()}
    weights: tuple[str, ...] = ()
    used = getattr(store, "lpips_weights_used", None)
    if used is not None and any(getattr(v, "lpips", None) is not None for v in got.values()):
        weights = tuple(sorted(used(list(got))))
    return DistortionResult(table.analyse(psnr, iterations=iterations, seed=seed), got, lpips_weights=weights)
