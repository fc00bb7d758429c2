"""From the store to numbers: one run's rows become re-scored records, statistics and usage.

Correctness is never read from the store: every stored raw answer is scored again with
today's scorer (as the plugin does when it reuses an answer), so a scorer fix changes the
reports of old runs too. An error row counts as wrong and, for the per-question views
(IoU, binned, official), gets the value an empty answer gets (0).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pytest_satbench.core import prompts
from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.core.scoring import Score, ScoreOptions, score
from pytest_satbench.core.stats import (
    ArmOutcome,
    BenchmarkStats,
    QuestionRecord,
    ViewStats,
    summarize,
    summarize_view,
)
from pytest_satbench.datasets import registry
from pytest_satbench.engine.images import BLIND, ORIG, is_repeat
from pytest_satbench.engine.store import AnswerRow, ResultStore

__all__ = ["BenchmarkData", "Item", "ServerUsage", "Usage", "collect", "redact"]


@dataclass(slots=True)
class Item:
    """One question of the run with its stored row and fresh score per arm."""

    nodeid: str
    question: Question
    types: tuple[str, ...]  # reported types (VRSBench merges some raw types)
    rows: dict[str, AnswerRow]
    scores: dict[str, Score]  # arms with an "ok" row only
    chance: float | None

    def correct(self, arm: str) -> bool:
        sc = self.scores.get(arm)
        return bool(sc is not None and sc.correct)

    @property
    def regressed_arms(self) -> list[str]:
        """Reconstruction arms that got wrong what the original got right."""
        if not self.correct(ORIG):
            return []
        return [a for a in self.rows if a not in (ORIG, BLIND) and not is_repeat(a) and not self.correct(a)]


@dataclass(slots=True)
class ServerUsage:
    answers: int = 0  # "ok" rows
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0  # sum of what the server reported
    rows_with_cost: int = 0  # answers whose response carried a cost
    latency_mean_s: float | None = None
    latency_p50_s: float | None = None
    latency_p95_s: float | None = None
    models: dict[str, int] = field(default_factory=dict)  # model id as returned -> answers


@dataclass(slots=True)
class Usage:
    total: ServerUsage
    by_server: dict[str, ServerUsage]
    errors: int  # error rows (no answer after retries); they have no usage
    errors_by_arm: dict[str, int]
    image_tokens: dict[str, float | None]  # arm -> mean image tokens per answer (None: not reported)


@dataclass(slots=True)
class BenchmarkData:
    benchmark: str
    run_id: str
    tag: str
    protocol: dict[str, Any]
    items: list[Item]
    stats: BenchmarkStats
    views: dict[str, ViewStats]  # per-question views (iou, acc@0.5, binned, official, ...)
    usage: Usage
    score_options: ScoreOptions

    @property
    def noise_floor(self) -> dict[str, Any] | None:
        """--repeat-orig: questions whose verdict changed between asks of the original."""
        questions = flipped = asks = 0
        for it in self.items:
            repeats = [a for a in it.rows if a == ORIG or is_repeat(a)]
            if len(repeats) < 2 or any(it.rows[a].status != "ok" for a in repeats):
                continue
            asks = max(asks, len(repeats))
            questions += 1
            flipped += len({it.correct(a) for a in repeats}) > 1
        if not asks:
            return None
        return {"asks": asks, "questions": questions, "flipped": flipped,
                "flip_rate": flipped / questions if questions else None}


def collect(store: ResultStore, run_id: str, *, iterations: int = 1000, seed: int = 0) -> list[BenchmarkData]:
    """Every benchmark of the run, re-scored and summarised; [] when the run has no items."""
    runs = {r["run_id"]: r for r in store.runs()}
    if run_id not in runs:
        raise KeyError(f"run {run_id!r} is not in {store.path}")
    run = runs[run_id]
    protocol = dict(run["protocol"])  # type: ignore[arg-type]
    by_bench: dict[str, list[tuple[str, dict[str, Any], dict[str, AnswerRow]]]] = {}
    for nodeid, bench, qdict, rows in store.run_items(run_id):
        by_bench.setdefault(bench, []).append((nodeid, qdict, rows))
    out = []
    for bench in sorted(by_bench):
        out.append(_benchmark(bench, run_id, str(run["tag"]), protocol, by_bench[bench], iterations, seed))
    return out


def _reported_type(bench: str) -> Any:
    try:
        return registry.get(bench).reported_type
    except KeyError:  # a benchmark from a plugin that is not installed here: raw types
        return lambda raw: raw


def question_from(bench: str, q: dict[str, Any]) -> Question:
    path = q.get("image_path")
    image = ImageRef(str(q["image_id"]), path=path) if path else ImageRef(str(q["image_id"]), data=b"")
    return Question(
        benchmark=bench,
        key=str(q["key"]),
        image=image,
        text=str(q.get("text", "")),
        answer=str(q.get("answer", "")),
        types=tuple(q.get("types") or ()),
        kind=q.get("kind") or "vqa",
        choices=tuple(q["choices"]) if q.get("choices") else None,
        extra=tuple((str(k), str(v)) for k, v in (q.get("extra") or ())),
    )


def score_options(protocol: dict[str, Any]) -> ScoreOptions:
    style = str(protocol.get("prompt_style") or "geocot")
    grid = protocol.get("box_grid") or prompts.default_box_grid(style)
    return ScoreOptions(box_grid=str(grid), iou=str(protocol.get("iou") or "inclusive"))


def _sent_size(q: Question, arms: list[str]) -> tuple[int, int] | None:
    """The geometry the image was sent at, for answers on the pixel grid only: the original
    size, or the One-D-Piece canvas when such an arm ran (every arm is sent at that size)."""
    if not q.image.path:
        return None
    try:
        from PIL import Image

        with Image.open(q.image.path) as im:
            size = im.size
    except OSError:
        return None
    for arm in arms:
        if arm.startswith("onedpiece:"):
            from pytest_satbench.codecs.onedpiece.tiling import TileLayout

            tiles = re.search(r"max_tiles=(\d+)", arm)
            return TileLayout.for_size(size, int(tiles.group(1)) if tiles else 12).canvas_size
    return size


def _benchmark(
    bench: str, run_id: str, tag: str, protocol: dict[str, Any],
    raw: list[tuple[str, dict[str, Any], dict[str, AnswerRow]]], iterations: int, seed: int,
) -> BenchmarkData:
    from pytest_satbench.core.question import (
        chance,  # the plugin's definition of the random baseline
    )

    reported = _reported_type(bench)
    opts = score_options(protocol)
    items: list[Item] = []
    records: list[QuestionRecord] = []
    for nodeid, qdict, rows in raw:
        q = question_from(bench, qdict)
        o = opts
        if opts.box_grid == "pixels" and q.kind == "ref":
            o = ScoreOptions(opts.box_grid, opts.iou, _sent_size(q, list(rows)))
        empty_views = dict(score(q, "", o).views)
        scores: dict[str, Score] = {}
        arms: dict[str, ArmOutcome] = {}
        views: dict[str, dict[str, float]] = {}
        for arm, row in rows.items():
            if row.status == "ok":
                sc = score(q, row.text or "", o)
                scores[arm] = sc
                if is_repeat(arm):
                    continue  # --repeat-orig asks: the noise floor, not an arm of the comparison
                arms[arm] = ArmOutcome("ok", sc.correct, sc.parsed, row.finish_reason == "length")
                v = dict(sc.views)
            elif is_repeat(arm):
                continue
            else:
                arms[arm] = ArmOutcome("error", False, False)
                v = dict(empty_views)
            if v:
                views[arm] = v
        types = tuple(dict.fromkeys(reported(t) for t in q.types)) or ("all",)
        ch = chance(q)
        items.append(Item(nodeid, q, types, rows, scores, ch))
        records.append(QuestionRecord(q.key, q.image.id, types, arms, ch, views))
    stats = summarize(records, iterations=iterations, seed=seed)
    names = sorted({n for r in records for v in r.views.values() for n in v})
    views_stats = {n: summarize_view(records, n, iterations=iterations, seed=seed) for n in names}
    return BenchmarkData(
        benchmark=bench, run_id=run_id, tag=tag, protocol=protocol, items=items, stats=stats,
        views=views_stats, usage=usage_of(items, list(stats.arms)), score_options=opts,
    )


def _percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q))


def _server_usage(rows: list[AnswerRow]) -> ServerUsage:
    u = ServerUsage(answers=len(rows))
    lat = [r.latency_s for r in rows if r.latency_s is not None]
    for r in rows:
        u.prompt_tokens += r.prompt_tokens or 0
        u.completion_tokens += r.completion_tokens or 0
        if r.cost is not None:
            u.cost += r.cost
            u.rows_with_cost += 1
    if lat:
        u.latency_mean_s = float(np.mean(lat))
        u.latency_p50_s = _percentile(lat, 50)
        u.latency_p95_s = _percentile(lat, 95)
    u.models = dict(sorted(Counter(str(r.model) for r in rows).items()))
    return u


def usage_of(items: list[Item], arms: list[str]) -> Usage:
    ok = [r for it in items for r in it.rows.values() if r.status == "ok"]
    errs = [r for it in items for r in it.rows.values() if r.status != "ok"]
    by_server: dict[str, list[AnswerRow]] = {}
    for r in ok:
        by_server.setdefault(redact_url(str(r.server)) if r.server else "unknown", []).append(r)
    tokens: dict[str, float | None] = {}
    for arm in arms:
        vals = [it.rows[arm].image_tokens for it in items if arm in it.rows and it.rows[arm].image_tokens is not None]
        tokens[arm] = float(np.mean(vals)) if vals else None  # type: ignore[arg-type]
    return Usage(
        total=_server_usage(ok),
        by_server={s: _server_usage(rs) for s, rs in sorted(by_server.items())},
        errors=len(errs),
        errors_by_arm=dict(sorted(Counter(r.arm for r in errs).items())),
        image_tokens=tokens,
    )


# --------------------------------------------------------------------------- secrets

# What an API key looks like in the wild: OpenAI/OpenRouter "sk-...", bearer tokens, HF "hf_...".
_KEYLIKE = re.compile(r"\b(?:sk-[A-Za-z0-9_\-]{6,}|sk_[A-Za-z0-9_\-]{6,}|hf_[A-Za-z0-9]{10,}|Bearer\s+\S+)")
_KEY_OPTIONS = ("--api-key", "--openai-api-key", "--token")
_USERINFO = re.compile(r"^([a-z][a-z0-9+.\-]*://)[^/@\s]+@", re.IGNORECASE)
REDACTED = "<redacted>"


def redact_url(url: str) -> str:
    """A server URL without user:password@ (never written to a report)."""
    return _USERINFO.sub(r"\1", url)


def redact(value: Any) -> Any:
    """`value` with anything that looks like a credential replaced, recursively.

    The protocol is written by the plugin without a key, but a command line may carry
    `--api-key ...` and a URL may carry `user:token@`: reports are shared, keys are not."""
    if isinstance(value, dict):
        return {k: (REDACTED if _secret_name(str(k)) and v else redact(v)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        out: list[Any] = []
        hide_next = False
        for v in value:
            if hide_next:
                out.append(REDACTED)
                hide_next = False
                continue
            if isinstance(v, str):
                opt, eq, _ = v.partition("=")
                if opt in _KEY_OPTIONS:
                    if eq:
                        out.append(f"{opt}={REDACTED}")
                    else:
                        out.append(v)
                        hide_next = True
                    continue
            out.append(redact(v))
        return out
    if isinstance(value, str):
        return _KEYLIKE.sub(REDACTED, redact_url(value))
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _secret_name(name: str) -> bool:
    n = name.lower().replace("-", "_")
    return n in ("api_key", "apikey", "openai_api_key", "authorization", "password", "secret", "bearer_token")


def token_curve(data: BenchmarkData) -> tuple[dict[str, list[tuple[float, float]]], dict[str, float]] | None:
    """Per group (types, then overall): (mean image tokens, accuracy) of every arm that
    reports image tokens, and the original's accuracy as the ceiling. None unless at least
    two arms report tokens (one budget is a point, not a curve)."""
    arms = [a for a, t in data.usage.image_tokens.items() if t is not None and a not in (ORIG, BLIND)]
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
        if ORIG in g.accuracy and g.accuracy[ORIG].n:
            ceilings[label] = g.accuracy[ORIG].accuracy
    return points, ceilings
