"""`--log-to mlflow[:URI]` and `--log-to wandb[:PROJECT]`: a report, logged to an experiment tracker.

One tracker run per (benchmark, tag), written where the report files are written
(`report.RunReports.write`: the plugin's end and `python -m pytest_satbench.report` share it):

- parameters: the report's protocol.json, flattened (`sampling.temperature`), each value cut to
  the tracker's limit (MLflow: 6,000 characters; W&B keeps whole values);
- metrics: every figure of summary.json's `aggregate_views` per arm (the headline again under
  `headline/`), exact match per question type and overall, each with its interval's low and high
  as separate metrics, and the paired delta against the original (points) with its interval;
- the budget curve (`report.budget.curves`, when two or more arms of one codec differ only in
  their budget): a table, and its accuracy and delta logged against the budget in tokens (the
  step) so the tracker draws the curve;
- the report files as artifacts: report.md, report.html, summary.json, protocol.json and every
  CSV (predictions.jsonl stays in the folder: it lists every answer, hundreds of MB at full size).

A resumed tag, and a report rebuilt from the store, update the same tracker run: its identity is
`key`, a hash of the benchmark, the tag and the tag's first run id in the store (unique per store
and tag; a merged store keeps it). MLflow finds the run by its `satbench.key` tag
(`search_runs`); W&B is given the key as its run id with resume="allow". A metric is logged at
step = the number of store runs the report covers, so a resume adds a point and the tracker shows
the newest value.

The libraries are optional extras (`pip install 'pytest-satbench[mlflow]'`, `[wandb]`) and are
imported only when a report is logged. A tracker that cannot be reached or refuses the run is one
line; the run's outcome and its report files never depend on it.

Tracker APIs followed: MLflow's `MlflowClient` (search_runs, log_batch, log_table,
log_artifact; limits from `mlflow.utils.validation`), W&B's `wandb.init(id=..., resume="allow")`
(docs.wandb.ai, "Resume a run").
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

__all__ = ["KINDS", "TrackerError", "TrackerRun", "TrackerSpec", "log_report", "parse_log_to", "tracker_run"]

KINDS = ("mlflow", "wandb")
ARTIFACTS = ("report.md", "report.html", "summary.json", "protocol.json")  # and every *.csv of the folder
DEFAULT_NAME = "satbench"  # the MLflow experiment / W&B project when none is given
# protocol keys that change from run to run of one tag: tags (MLflow) rather than parameters,
# which MLflow never lets a run change
VOLATILE = ("run_id", "date", "command", "models_returned", "planned", "servers", "servers_served")


class TrackerError(ValueError):
    """A --log-to value that names no tracker."""


@dataclass(frozen=True)
class TrackerSpec:
    kind: str  # "mlflow" | "wandb"
    target: str | None = None  # MLflow: the tracking URI; W&B: the project

    @property
    def text(self) -> str:
        return self.kind + (f":{self.target}" if self.target else "")


def parse_log_to(text: str) -> TrackerSpec:
    """`mlflow`, `mlflow:URI` (the URI may hold colons: `mlflow:file:///tmp/mlruns`), `wandb`,
    `wandb:PROJECT`."""
    kind, _, target = text.strip().partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise TrackerError(f"{text!r} names no tracker; pass mlflow[:URI] or wandb[:PROJECT]")
    target = target.strip()
    if kind == "wandb" and target and not re.fullmatch(r"[A-Za-z0-9_.\-/]+", target):
        raise TrackerError(f"{text!r}: a W&B project is letters, digits, '_', '-', '.' (ENTITY/PROJECT also)")
    return TrackerSpec(kind, target or None)


# ---------------------------------------------------------------------- what one report logs


@dataclass
class TrackerRun:
    """What one (benchmark, tag) report logs, tracker-neutral."""

    key: str  # the tracker run's identity (module docstring)
    name: str  # "<benchmark>/<tag>"
    tags: dict[str, str]
    params: dict[str, str]  # the protocol, flattened; values whole (each tracker cuts to its limit)
    volatile: dict[str, str]  # the protocol's per-run keys (VOLATILE), flattened
    metrics: dict[str, float]
    step: int
    curve: list[dict[str, Any]] = field(default_factory=list)  # the budget curve's rows
    artifacts: list[Path] = field(default_factory=list)


def run_key(benchmark: str, tag: str, first_run: str) -> str:
    """24 hex digits: a valid W&B run id and an MLflow tag value, the same for every report of
    the tag in this store."""
    return hashlib.sha256(f"satbench\0{first_run}\0{tag}\0{benchmark}".encode()).hexdigest()[:24]


_BAD = re.compile(r"[^A-Za-z0-9_.\- ]")


def metric_part(text: str) -> str:
    """One part of a name, as both trackers accept it (MLflow allows letters, digits, _ - . space
    and /, a colon only off Windows; '/' is kept for joining parts, so a part has none)."""
    part = _BAD.sub("_", str(text)).strip(" ")
    return "_" if part in ("", ".", "..") else part


def _arm_names(arms: Sequence[str], labels: Mapping[str, str]) -> dict[str, str]:
    """Each arm's part in a metric name: its label as the report's tables show it (`jpeg:q10`
    -> `jpeg_q10`), the full spec where two labels would collide."""
    names = {a: metric_part(labels.get(a, a)) for a in arms}
    seen: dict[str, int] = {}
    for n in names.values():
        seen[n] = seen.get(n, 0) + 1
    return {a: (n if seen[n] == 1 else metric_part(a)) for a, n in names.items()}


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def flatten(obj: Any, prefix: str = "") -> dict[str, str]:
    """Nested dicts joined with '.', lists and scalars as JSON text (a string as itself); each
    key part as `metric_part` writes it (an arm's spec holds ':' and '=')."""
    out: dict[str, str] = {}
    if isinstance(obj, Mapping) and (obj or not prefix):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}.{metric_part(k)}" if prefix else metric_part(k)))
    elif isinstance(obj, str):
        out[prefix] = obj
    else:
        out[prefix] = json.dumps(obj, ensure_ascii=False, sort_keys=True)
    return out


def metrics_of(summary: Mapping[str, Any], labels: Mapping[str, str]) -> dict[str, float]:
    """summary.json's figures as flat metrics (module docstring); accuracies as fractions,
    deltas in points (`_pp`), as summary.json has them."""
    out: dict[str, float] = {}
    st = summary.get("statistics") or {}
    arms = list(st.get("arms") or summary.get("arms") or [])
    views = summary.get("aggregate_views") or {}
    for view in views.values():
        arms += [a for a in (view.get("accuracy") or {}) if a not in arms]
    name = _arm_names(arms, labels)

    def put(prefix: str, acc: Mapping[str, Any], paired: Mapping[str, Any], value: str) -> None:
        for arm, a in acc.items():
            base = f"{prefix}/{name.get(arm, metric_part(arm))}"
            for key, got in (("accuracy", a.get(value)), ("ci_low", a.get("ci_low")),
                             ("ci_high", a.get("ci_high")), ("n", a.get("n"))):
                if (x := _num(got)) is not None:
                    out[f"{base}/{key}"] = x
        for arm, p in paired.items():
            base = f"{prefix}/{name.get(arm, metric_part(arm))}"
            for key, got in (("delta_pp", p.get("delta")), ("delta_ci_low_pp", p.get("ci_low")),
                             ("delta_ci_high_pp", p.get("ci_high"))):
                if (x := _num(got)) is not None:
                    out[f"{base}/{key}"] = x

    headline = summary.get("headline")
    for fig, view in views.items():
        acc, paired = view.get("accuracy") or {}, view.get("paired") or {}
        put(f"figure/{metric_part(fig)}", acc, paired, "value")
        if fig == headline:
            put("headline", acc, paired, "value")
        for typ, per_arm in (view.get("by_type") or {}).items():
            put(f"figure/{metric_part(fig)}/type/{metric_part(typ)}", per_arm, {}, "value")
    groups = [*(st.get("by_type") or {}).items(), ("overall", st.get("overall") or {})]
    for typ, g in groups:
        put(f"exact_match/{metric_part(typ)}", g.get("accuracy") or {}, g.get("paired") or {}, "accuracy")
    for key in ("questions", "regressed_questions"):
        if (x := _num(summary.get(key))) is not None:
            out[key] = x
    return out


def curve_rows(data: Any, labels: Mapping[str, str]) -> list[dict[str, Any]]:
    """The budget curve (`report.budget.curves`) as rows: one per codec, group and budget, the
    original's accuracy as a row of its own (tokens empty)."""
    from pytest_satbench.report.budget import curves

    rows: list[dict[str, Any]] = []
    for c in curves(data):
        for group, budgets in c.groups.items():
            ceiling = c.ceilings.get(group)
            if ceiling:
                rows.append({"codec": c.codec, "group": group, "arm": "orig", "label": "orig", "tokens": None,
                             "accuracy": _num(ceiling[0]), "ci_low": _num(ceiling[1]), "ci_high": _num(ceiling[2]),
                             "delta_pp": None, "delta_ci_low_pp": None, "delta_ci_high_pp": None,
                             "within_margin": None})
            for b in budgets:
                rows.append({"codec": c.codec, "group": group, "arm": b.arm, "label": labels.get(b.arm, b.arm),
                             "tokens": b.tokens, "accuracy": _num(b.accuracy), "ci_low": _num(b.ci_low),
                             "ci_high": _num(b.ci_high), "delta_pp": _num(b.delta),
                             "delta_ci_low_pp": _num(b.delta_low), "delta_ci_high_pp": _num(b.delta_high),
                             "within_margin": b.within(c.margin)})
    return rows


def tracker_run(folder: Path, data: Any, first_run: str | None = None) -> TrackerRun:
    """The tracker run of a written report folder: summary.json and protocol.json as written,
    `data` (its `BenchmarkResult`) for the budget curve. `first_run`: the tag's first run id in
    the store (None: the oldest run the report covers)."""
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    protocol = json.loads((folder / "protocol.json").read_text(encoding="utf-8"))
    bench, tag = str(summary["benchmark"]), str(summary["tag"])
    runs = list((summary.get("coverage") or {}).get("runs") or [summary["run_id"]])
    first = first_run or str(runs[-1])
    labels = dict(protocol.get("arm_labels") or {})
    key = run_key(bench, tag, first)
    params = flatten({k: v for k, v in protocol.items() if k not in VOLATILE})
    volatile = flatten({k: protocol[k] for k in VOLATILE if k in protocol}, "")
    tags = {"satbench.key": key, "satbench.benchmark": bench, "satbench.tag": tag, "satbench.first_run": first,
            "satbench.run_id": str(summary["run_id"]), "satbench.runs": ",".join(map(str, runs)),
            "satbench.headline": str(summary.get("headline") or ""),
            "satbench.unfinished": str(bool(summary.get("unfinished"))).lower(),
            "satbench.report_version": str(summary.get("report_version") or "")}
    artifacts = [folder / n for n in ARTIFACTS if (folder / n).is_file()]
    artifacts += sorted(p for p in folder.glob("*.csv") if p.is_file())
    return TrackerRun(key=key, name=f"{bench}/{tag}", tags=tags, params=params, volatile=volatile,
                      metrics=metrics_of(summary, labels), step=len(runs), curve=curve_rows(data, labels),
                      artifacts=artifacts)


# ---------------------------------------------------------------------- the trackers


class Unavailable(Exception):
    """The tracker's library is not installed."""


class Tracker(Protocol):
    def log(self, run: TrackerRun) -> str:
        """Log `run`, creating or updating its tracker run; returns where it went (for one line)."""


def _cut(text: str, limit: int) -> str:
    mark = "...[truncated]"
    return text if len(text) <= limit else text[: limit - len(mark)] + mark


def _import(module: str, kind: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise Unavailable(f"{kind} is not installed: pip install 'pytest-satbench[{kind}]'") from None


def _curve_metrics(rows: list[dict[str, Any]]) -> list[tuple[str, float, int]]:
    """(metric, value, step = tokens) of the curve's budgets: the trackers' own charts draw
    accuracy and delta against the budget."""
    out = []
    names: dict[str, str] = {}  # codec spec -> its short name: the codec, numbered when it has two sweeps
    for r in rows:
        if r["codec"] not in names:
            kind = metric_part(str(r["codec"]).split(":", 1)[0])
            taken = sum(n.split("_", 1)[0] == kind for n in names.values())
            names[r["codec"]] = kind if not taken else f"{kind}_{taken + 1}"
        if r["tokens"] is None:
            continue
        base = f"budget/{names[r['codec']]}/{metric_part(r['group'])}"
        for k in ("accuracy", "delta_pp"):
            if r[k] is not None:
                out.append((f"{base}/{k}", float(r[k]), int(round(float(r["tokens"])))))
    return out


class MLflowTracker:
    """MLflow (`MlflowClient`): the experiment MLFLOW_EXPERIMENT_NAME, else "satbench"; the run
    found by its `satbench.key` tag. An http(s) server that does not answer is given up on after
    MLFLOW_HTTP_REQUEST_MAX_RETRIES (set here to 2 unless set) retries of
    MLFLOW_HTTP_REQUEST_TIMEOUT (20 s unless set), not MLflow's own minutes."""

    kind = "mlflow"

    def __init__(self, uri: str | None) -> None:
        self.uri = uri

    def log(self, run: TrackerRun) -> str:
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
        _import("mlflow", self.kind)
        from mlflow.tracking import MlflowClient
        from mlflow.utils import validation as V

        client = MlflowClient(tracking_uri=self.uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_NAME
        exp = client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(name)
        plen, tlen = getattr(V, "MAX_PARAM_VAL_LENGTH", 6000), getattr(V, "MAX_TAG_VAL_LENGTH", 8000)
        klen = getattr(V, "MAX_ENTITY_KEY_LENGTH", 250)
        per = getattr(V, "MAX_PARAMS_TAGS_PER_BATCH", 100)
        found = client.search_runs([exp_id], filter_string=f"tags.`satbench.key` = '{run.key}'", max_results=1)
        if found:
            run_id, old = found[0].info.run_id, dict(found[0].data.params)
            client.update_run(run_id, status="RUNNING")
        else:  # created with its key: a run whose logging fails half-way is still the one found next time
            tags0 = {"mlflow.runName": run.name, **{k: _cut(v, tlen) for k, v in run.tags.items()}}
            run_id, old = client.create_run(exp_id, tags=tags0, run_name=run.name).info.run_id, {}
        try:
            self._fill(client, run_id, run, old, (plen, tlen, klen, per), resumed=bool(found))
        except Exception:
            client.set_terminated(run_id, status="FAILED")
            raise
        client.set_terminated(run_id, status="FINISHED")
        where = self.uri or client.tracking_uri
        return f"{'updated' if found else 'created'} MLflow run {run_id} (experiment {name!r}, {where})"

    @staticmethod
    def _fill(client: Any, run_id: str, run: TrackerRun, old: Mapping[str, str], limits: tuple[int, ...],
              resumed: bool) -> None:
        import time

        from mlflow.entities import Metric, Param, RunTag
        from mlflow.utils import validation as V

        plen, tlen, klen, per = limits
        params, tags = [], [RunTag(k, _cut(v, tlen)) for k, v in run.tags.items()]
        tags += [RunTag(_cut(f"protocol.{k}", klen), _cut(v, tlen)) for k, v in run.volatile.items()]
        changed = []
        for k, v in run.params.items():
            k, v = _cut(k, klen), _cut(v, plen)
            if k not in old:
                params.append(Param(k, v))
            elif old[k] != v:  # MLflow never changes a logged parameter: the new value is a tag
                changed.append(k)
                tags.append(RunTag(_cut(f"protocol.{k}", klen), _cut(v, tlen)))
        if changed:
            tags.append(RunTag("satbench.params_changed", _cut(",".join(changed), tlen)))
        for i in range(0, len(tags), per):
            client.log_batch(run_id, tags=tags[i:i + per])
        for i in range(0, len(params), per):
            client.log_batch(run_id, params=params[i:i + per])
        now = int(time.time() * 1000)
        metrics = [Metric(_cut(k, klen), v, now, run.step) for k, v in run.metrics.items()]
        metrics += [Metric(k, v, now, step) for k, v, step in _curve_metrics(run.curve)]
        mper = getattr(V, "MAX_METRICS_PER_BATCH", 1000)
        for i in range(0, len(metrics), mper):
            client.log_batch(run_id, metrics=metrics[i:i + mper])
        if run.curve and not resumed:
            import warnings

            with warnings.catch_warnings():  # pandas' deprecations inside MLflow's table code, not ours
                warnings.simplefilter("ignore")
                client.log_table(run_id, data={k: [r[k] for r in run.curve] for k in run.curve[0]},
                                 artifact_file="budget_curve.json")
        elif run.curve:  # log_table appends to a logged table: a resume writes the file whole instead
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "budget_curve.json"
                path.write_text(json.dumps({"columns": list(run.curve[0]),
                                            "data": [list(r.values()) for r in run.curve]}), encoding="utf-8")
                client.log_artifact(run_id, str(path))
        for path in run.artifacts:
            client.log_artifact(run_id, str(path), artifact_path="report")


class WandbTracker:
    """Weights & Biases: the project PROJECT, else WANDB_PROJECT, else "satbench" (entity from
    WANDB_ENTITY or ENTITY/PROJECT); the run id is `TrackerRun.key`, resumed with resume="allow".
    WANDB_MODE=offline writes the run under WANDB_DIR for `wandb sync` (a resumed run's offline
    folders sync into the one run)."""

    kind = "wandb"

    def __init__(self, project: str | None) -> None:
        self.project = project

    def log(self, run: TrackerRun) -> str:
        wandb = _import("wandb", self.kind)
        project = self.project or os.environ.get("WANDB_PROJECT") or DEFAULT_NAME
        entity = None
        if "/" in project:
            entity, project = project.split("/", 1)
        config = {**run.params, **{f"protocol.{k}": v for k, v in run.volatile.items()}}
        w = wandb.init(project=project, entity=entity, id=run.key, name=run.name, resume="allow",
                       config=config, tags=[run.tags["satbench.benchmark"], run.tags["satbench.tag"]][:64],
                       settings=wandb.Settings(init_timeout=60, silent=True, console="off", x_disable_stats=True),
                       )
        try:
            w.config.update(config, allow_val_change=True)
            w.config.update({k: v for k, v in run.tags.items()}, allow_val_change=True)
            w.summary.update(dict(run.metrics))
            w.summary.update({"satbench.step": run.step})
            payload: dict[str, Any] = dict(run.metrics)
            if run.curve:
                cols = list(run.curve[0])
                table = wandb.Table(columns=cols, data=[[r[c] for c in cols] for r in run.curve])
                payload["budget_curve"] = table
                overall = [[r["tokens"], r["accuracy"]] for r in run.curve
                           if r["group"] == "overall" and r["tokens"] is not None]
                if overall:
                    payload["budget_curve_overall"] = wandb.plot.line(
                        wandb.Table(columns=["tokens", "accuracy"], data=overall), "tokens", "accuracy",
                        title=f"{run.name}: accuracy versus image tokens")
            w.log(payload)
            art = wandb.Artifact(f"report-{run.key}", type="satbench-report",
                                 metadata={"benchmark": run.tags["satbench.benchmark"], "tag": run.tags["satbench.tag"]})
            for path in run.artifacts:
                art.add_file(str(path), name=path.name)
            w.log_artifact(art)
            where = w.dir if w.offline else (w.url or project)
        finally:
            w.finish()
        return f"logged W&B run {run.key} (project {project!r}, {where})"


TRACKERS: dict[str, Callable[[str | None], Tracker]] = {"mlflow": MLflowTracker, "wandb": WandbTracker}


def log_report(specs: Sequence[TrackerSpec], folder: Path, data: Any, first_run: str | None = None) -> list[str]:
    """Log one written report folder to every tracker of `specs`; one line each, what was
    logged or why not. Never raises: a tracker's failure is its line."""
    if not specs:
        return []
    try:
        run = tracker_run(folder, data, first_run)
    except Exception as exc:  # noqa: BLE001  (a report's files are written; its logging is optional)
        return [f"satbench: --log-to: {folder} could not be read for the trackers ({type(exc).__name__}: {exc})"]
    lines = []
    for spec in specs:
        try:
            lines.append(f"satbench: {run.name}: {TRACKERS[spec.kind](spec.target).log(run)}")
        except Unavailable as exc:
            lines.append(f"satbench: --log-to {spec.text}: {exc}")
        except Exception as exc:  # noqa: BLE001  (a tracker that cannot be reached never fails the run)
            why = " ".join(str(exc).split())[:1000]
            lines.append(f"satbench: --log-to {spec.text}: {run.name} not logged ({type(exc).__name__}: {why}); "
                         "the report files are written, log them again with python -m pytest_satbench.report "
                         f"--tag {run.tags['satbench.tag']} --log-to {spec.text}")
    return lines
