"""The machine-readable files: summary.json, per_type.csv, answer_classes.csv,
answer_transitions.csv, per_image.csv, predictions.jsonl, protocol.json."""

from __future__ import annotations

import csv
import json
import math
import os
import time
from array import array
from collections.abc import Hashable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pytest_satbench._version import __version__
from pytest_satbench.codecs import arm_label, describe_arm
from pytest_satbench.core import analysis as AN
from pytest_satbench.core import arms as A
from pytest_satbench.core.distortion_flips import FlipTable
from pytest_satbench.core.figures_json import aggregate_views, figure_key
from pytest_satbench.core.redact import redact
from pytest_satbench.core.results import BenchmarkResult, QuestionResult
from pytest_satbench.core.usage import visual_summary
from pytest_satbench.report.gallery import Entry

ACC_FIELDS = ("n", "correct", "accuracy", "ci_low", "ci_high", "errors", "truncated", "unparseable", "parsed", "coverage", "missing")
CSV_HEADER = (
    ["type", "arm", "n_images"] + list(ACC_FIELDS) + ["chance"]
    + ["delta_pp", "delta_ci_low_pp", "delta_ci_high_pp", "n_pairs", "regressed", "improved", "mcnemar_p", "pair_errors", "delta_both_ok_pp"]
    + ["mean_image_tokens", "label"]
)
# answer_classes.csv / answer_transitions.csv: the rows of core.analysis, in this order (a
# benchmark without answer classes, grounding only, gets the header alone)
CLASSES_HEADER = ("type", "arm", "answer", "n", "correct", "recall", "balanced_accuracy",
                  "majority_answer", "majority_accuracy")
TRANSITIONS_HEADER = ("type", "arm", "orig_answer", "recon_answer", "count")
# per_image.csv: one row per image and reconstruction arm (report/build.py's flip table)
PER_IMAGE_HEADER = ("image_id", "arm", "questions", "orig_correct", "arm_correct", "regressed", "improved",
                    "psnr", "ssim", "msssim", "lpips")
DISTORTION_FIELDS = ("psnr", "ssim", "msssim", "lpips")


def _clean(v: Any) -> Any:
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_clean(x) for x in v]
    return v


def _finite(v: float | None) -> float | None:
    return None if v is None or math.isnan(v) or math.isinf(v) else v


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_clean(obj), indent=2, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def clipped_by_arm(data: BenchmarkResult) -> dict[str, int]:
    """Answers whose text was clipped at --max-answer-chars, per arm (arms with none left out)."""
    return dict(data.clipped_by_arm)


def limited(data: BenchmarkResult) -> int | None:
    """The --limit of the runs the result covers, None when one of them ran every question
    (0 keeps all, as no limit)."""
    return data.limit or None


def summary_dict(data: BenchmarkResult, gates: list[dict[str, Any]] | None, gallery_total: int, gallery: list[Entry],
                 analysis: AN.AnswerAnalysis | None = None, asked_anew: dict[str, int] | None = None,
                 distortion: Any = None) -> dict[str, Any]:
    st = data.stats
    clipped = clipped_by_arm(data)
    return {
        "benchmark": data.benchmark,
        "tag": data.tag,
        "run_id": data.run_id,
        "model": data.protocol.get("model"),
        "questions": len(data.items),
        "limited": limited(data),
        "not_run": data.not_run,
        "unfinished": data.unfinished,
        # the runs whose answers are here: a report covers every stored answer of its tag's questions
        "coverage": {"runs": list(data.runs), "run_selected": data.run_selected,
                     "run_questions": data.run_questions, "subset": data.subset,
                     # --shard parts covered, when two or more of one split (None otherwise)
                     "shards": dict(data.shards) if data.shards else None},
        "arms": list(st.arms),
        "statistics": statistics_dict(data),
        # every figure the benchmark declares, under its own name; the headline first
        "headline": data.headline.name if data.headline is not None else None,
        "aggregate_views": aggregate_views(data),
        "notes": list(data.notes),
        "usage": {**asdict(data.usage), "clipped": sum(clipped.values()), "clipped_by_arm": clipped},
        "answer_analysis": AN.to_dict(analysis) if analysis is not None else None,
        "noise_floor": data.noise_floor.to_dict() if data.noise_floor else None,
        # --samples K > 1 only: mean-of-K, majority vote, agreement and the delta on mean-of-K
        **({"samples": data.samples.to_dict()} if data.samples is not None else {}),
        # per arm: prompt tokens as the server reported them, paired with orig's and blind's, the
        # codec's tokens, accuracy per 1,000 of each (core.usage.visual_summary)
        "visual_tokens": visual_summary(data.usage, {a: s.accuracy for a, s in st.overall.accuracy.items() if s.n}),
        # flips against distortion (core.distortion_flips); null without a reconstruction arm, and
        # {"absent": why} when the store keeps no distortion for these images
        "distortion_flips": _distortion_dict(distortion),
        # --precision / --margin: the confidence sequences in the run's order (None without)
        "sequential": data.sequential,
        "gates": gates if gates else [],
        "gates_note": None if gates else "no gates",
        # the reporting run's answers asked anew, by reason (report.why.asked_anew); None unless
        # asked for (write_reports(asked_anew=True): it reads every earlier run's records)
        "asked_anew": asked_anew,
        "regressed_questions": gallery_total,
        "gallery": [e.key for e in gallery],
        "generated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "report_version": __version__,
    }


def _distortion_dict(distortion: Any) -> dict[str, Any] | None:
    if distortion is None or (distortion.flips is None and distortion.absent is None):
        return None
    if distortion.flips is None:
        return {"absent": distortion.absent}
    return {**distortion.flips.to_dict(), "lpips_weights": list(distortion.lpips_weights)}


def statistics_dict(data: BenchmarkResult) -> dict[str, Any]:
    """Exact match's statistics (the per-type table), each figure once: the question-weighted
    exact match is `overall.accuracy`, the mean of its types `exact_match_average_accuracy`;
    the benchmark's own overall and average accuracy are in `aggregate_views` under their names
    (one key never holds two numbers)."""
    d = data.stats.to_dict()
    del d["overall_accuracy"]
    d["exact_match_average_accuracy"] = d.pop("average_accuracy")
    return d


def write_per_type_csv(path: Path, data: BenchmarkResult) -> None:
    st = data.stats
    groups = [(t, g) for t, g in st.by_type.items()] + [("overall", st.overall)]
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_HEADER)
        for label, g in groups:
            for arm in st.arms:
                a = g.accuracy.get(arm)
                if a is None:
                    continue
                p = g.paired.get(arm)
                pair = [p.delta, p.ci_low, p.ci_high, p.n_pairs, p.regressed, p.improved, p.mcnemar_p, p.n_errors, p.delta_both_ok] if p else [""] * 9
                chance = g.chance.accuracy if g.chance.n_defined else None
                row = [label, arm, g.n_images] + [getattr(a, f) for f in ACC_FIELDS] + [chance] + pair + [data.usage.image_tokens.get(arm), ""]
                w.writerow(["" if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in row])
        # the benchmark's figures when it declares a protocol (else its headline is the
        # overall row above and the mean of types): type = the figure's key, with its label
        if data.labels.declares_evaluation:
            for agg in data.declared_figures():
                fs = data.figures[agg.name]
                for arm in st.arms:
                    fa = fs.accuracy.get(arm)
                    if fa is None:
                        continue
                    fp = fs.paired.get(arm)
                    acc = {"n": fa.n, "accuracy": fa.value, "ci_low": fa.ci_low, "ci_high": fa.ci_high}
                    fpair = [fp.delta, fp.ci_low, fp.ci_high, fp.n_pairs] + [""] * 5 if fp else [""] * 9
                    row = [figure_key(agg), arm, fs.n_images] + [acc.get(f, "") for f in ACC_FIELDS] + [""] + fpair + ["", agg.label]
                    w.writerow(["" if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in row])


def write_answer_csvs(classes: Path, transitions: Path, analysis: AN.AnswerAnalysis | None) -> None:
    """answer_classes.csv (per type, arm and ground-truth class: recall, with the type's
    balanced accuracy and majority baseline) and answer_transitions.csv (per type,
    reconstruction arm and changed answer: how many moved from the original's class)."""
    for path, header, rows in (
        (classes, CLASSES_HEADER, AN.recall_rows(analysis) if analysis else ()),
        (transitions, TRANSITIONS_HEADER, AN.transition_rows(analysis) if analysis else ()),
    ):
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=header, extrasaction="raise")
            w.writeheader()
            for row in rows:
                w.writerow({k: "" if v is None or (isinstance(v, float) and math.isnan(v)) else v for k, v in row.items()})


def write_per_image_csv(path: Path, table: FlipTable, by_pair: Mapping[Hashable, Any]) -> None:
    """per_image.csv: per image and reconstruction arm, its questions (those the original and the
    arm both have), how many each got right, regressed and improved, and the arm's distortion
    for the image (empty where none is stored)."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(PER_IMAGE_HEADER)
        for image, arm, counts, pair in table.per_image():
            d = by_pair.get(pair) if pair is not None else None
            values = [getattr(d, f, None) if d is not None else None for f in DISTORTION_FIELDS]
            w.writerow([image, arm, *counts, *("" if v is None or (isinstance(v, float) and math.isnan(v))
                                               else ("inf" if v == math.inf else v) for v in values)])


# json.dumps(..., ensure_ascii=False) makes a new encoder on every call; one is reused here
_ENCODE = json.JSONEncoder(ensure_ascii=False).encode
_STRING = json.encoder.encode_basestring  # what that encoder writes for a str (C, as ensure_ascii=False)
_CONSTANTS = {None: "null", True: "true", False: "false"}


def _J(v: Any) -> str:
    """One scalar of a predictions line, exactly as `_ENCODE` writes it (finite floats only)."""
    if v is None or v is True or v is False:
        return _CONSTANTS[v]
    if isinstance(v, str):
        return _STRING(v)
    if isinstance(v, int):
        return int.__repr__(v)
    if isinstance(v, float):
        return float.__repr__(v)
    return _ENCODE(v)


class PredictionsWriter:
    """predictions.jsonl, one line per stored row, written as the questions are scored
    (`collect(..., each=...)`): a 222k-question run's rows never wait in memory for it. Lines
    go to a temporary file next to the target, put in place by `commit()`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # two runs may write one folder
        self.rows = 0
        self._fh: Any = open(self.tmp, "w", encoding="utf-8")
        self._servers: dict[str | None, Any] = {None: None}  # a run has a few servers: redact each once
        # per line, the (orig sha256, arm sha256) pair of a reconstruction arm's row (-1: none), so
        # commit() can add its distortion, known only once every question is read
        self._pairs: dict[tuple[str, str], int] = {}
        self._line_pairs = array("i")

    def add(self, it: QuestionResult) -> None:
        q = it.question
        # what every arm's line of a question starts with, encoded once: `{"nodeid": ..., "ground_truth": ...`
        head = _ENCODE({
            "nodeid": it.nodeid, "key": q.key, "types": list(it.types), "image_id": q.image.id,
            "question": q.text, "ground_truth": q.answer,
        })[:-1]
        orig = it.rows.get(A.ORIG)
        orig_sha = orig.image_sha256 if orig is not None else None
        for arm, row in it.rows.items():
            if orig_sha and row.image_sha256 and A.is_recon(A.image_arm(arm)):  # a sample sends its arm's image
                self._line_pairs.append(self._pairs.setdefault((orig_sha, row.image_sha256), len(self._pairs)))
            else:
                self._line_pairs.append(-1)
            sc = it.scores.get(arm)
            latency, cost = row.latency_s, row.cost
            views = _ENCODE({k: _finite(v) for k, v in sc.views}) if sc and sc.views else "{}"
            # The line as json.dumps would write it, field by field: building a dict per row
            # and walking it in the encoder was a quarter of the report's CPU at 445k rows.
            # The floats that can be NaN are cleaned here; the two fields that could carry a
            # credential (a URL, a server's error text) are redacted (every field took seconds).
            self._fh.write(
                f'{head}, "arm": {_J(arm)}, "status": {_J(row.status)}, "answer": {_J(row.text)}, '
                f'"extracted": {_J(sc.extracted if sc else None)}, "correct": {_J(bool(sc and sc.correct))}, '
                f'"parsed": {_J(bool(sc and sc.parsed))}, "views": {views}, '
                f'"finish_reason": {_J(row.finish_reason)}, '
                f'"latency_s": {_J(None if latency is None or not math.isfinite(latency) else latency)}, '
                f'"prompt_tokens": {_J(row.prompt_tokens)}, "completion_tokens": {_J(row.completion_tokens)}, '
                f'"cost": {_J(None if cost is None or not math.isfinite(cost) else cost)}, "model": {_J(row.model)}, '
                f'"server": {_J(self._server(row.server))}, "attempts": {_J(row.attempts)}, '
                f'"image_sha256": {_J(row.image_sha256)}, "image_tokens": {_J(row.image_tokens)}, '
                f'"error": {_J(None if row.error is None else redact(row.error))}}}\n')
            self.rows += 1

    def _server(self, server: str | None) -> Any:
        got = self._servers.get(server, self)
        if got is self:
            got = self._servers[server] = redact(server)
        return got

    def commit(self, distortions: Mapping[Hashable, Any] | None = None) -> int:
        """Close the file and put it in place; returns the rows written. With `distortions` (by
        (orig sha256, arm sha256), `ResultStore.distortions`), every reconstruction arm's line gets
        its psnr, ssim, msssim and lpips (null where unknown): the lines are copied once more."""
        self._fh.close()
        if distortions:
            self._add_distortions(distortions)
        os.replace(self.tmp, self.path)
        return self.rows

    def _add_distortions(self, distortions: Mapping[Hashable, Any]) -> None:
        fields: list[str] = [""] * len(self._pairs)
        for pair, code in self._pairs.items():
            d = distortions.get(pair)
            values = [getattr(d, f, None) if d is not None else None for f in DISTORTION_FIELDS]
            # +inf (an identical reconstruction) is not JSON: written as the string "inf"
            fields[code] = "".join(f', "{f}": ' + ('"inf"' if v == math.inf else _J(_finite(v) if isinstance(v, float) else v))
                                   for f, v in zip(DISTORTION_FIELDS, values, strict=True))
        out = self.tmp.with_name(self.tmp.name + ".d")
        with open(self.tmp, encoding="utf-8", newline="") as src, open(out, "w", encoding="utf-8", newline="") as dst:
            for line, code in zip(src, self._line_pairs, strict=True):
                dst.write(line if code < 0 else line[:-2] + fields[code] + "}\n")
        os.replace(out, self.tmp)

    def discard(self) -> None:
        self._fh.close()
        self.tmp.unlink(missing_ok=True)


def codec_info(arms: list[str], identities: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """What each reconstruction arm's codec says of it (`codecs.describe_arm`): the spec, the
    codec's name and, for checkpoint-based codecs, the checkpoint and its sha256 as the run
    recorded it (the codec's identity, hashed once when the run started; None when the run
    recorded none: the report hashes nothing)."""
    return [describe_arm(arm, (identities or {}).get(arm, "")) for arm in arms if arm not in (A.ORIG, A.BLIND)]


def protocol_dict(data: BenchmarkResult) -> dict[str, Any]:
    p = dict(data.protocol)
    p["run_id"] = data.run_id
    p["benchmark"] = data.benchmark
    p["dataset_sha256"] = (p.get("datasets") or {}).get(data.benchmark, {})
    arms = list(p.get("arms") or data.stats.arms)
    p["codecs"] = codec_info(arms, p.get("codec_identity"))
    p["arm_labels"] = {a: arm_label(a) for a in arms if A.is_recon(a)}  # as every table labels them
    p["models_returned"] = data.usage.total.models
    if p.get("servers_file"):  # --servers @FILE: the fleet changed as the file did; who served
        p["servers_served"] = sorted(data.usage.by_server)
    p["box_grid_effective"] = data.score_options.box_grid
    p["iou_effective"] = data.score_options.iou
    return redact(p)
