"""Run reports: `reports/<benchmark>/<tag>/` with summary.json, per_type.csv,
answer_classes.csv, answer_transitions.csv, predictions.jsonl, protocol.json, report.md and a
self-contained report.html.

Written by the plugin at the end of a run and on demand from the store
(`python -m pytest_satbench.report`). Everything is rebuilt from the store: answers are
re-scored from their raw text, so a report always reflects the current scorer.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_satbench.core.analysis import analyse
from pytest_satbench.core.results import BenchmarkResult
from pytest_satbench.engine.store import ResultStore
from pytest_satbench.report import content, files, html, markdown
from pytest_satbench.report.build import collect
from pytest_satbench.report.gallery import MAX_GALLERY, build_gallery

__all__ = ["report_dir", "write_reports"]


def report_dir(out_root: Path, benchmark: str, tag: str) -> Path:
    # A tag is user text: keep it one path component.
    safe = re.sub(r"[^A-Za-z0-9._\-]+", "_", tag).strip("._") or "default"
    return Path(out_root) / benchmark / safe


def write_reports(
    store: ResultStore,
    run_id: str,
    out_root: Path,
    *,
    gates: list[dict[str, Any]] | None = None,
    iterations: int = 1000,
    recon_cache: Path | None = None,
    gallery_limit: int = MAX_GALLERY,
    results: Sequence[BenchmarkResult] | None = None,
) -> list[Path]:
    """Write the reports of every benchmark of `run_id`; returns the folders written.

    `recon_cache`: the plugin's disk cache of reconstructions, for gallery images of
    expensive codecs; default: `satbench-recon` next to the store's folder (pytest's cache
    layout). `results`: the run's results when the caller has them already (the plugin
    computed them for the terminal and the gates). Raises KeyError when the run is not in
    the store.
    """
    if recon_cache is None:
        recon_cache = Path(store.path).parent.parent / "satbench-recon"
    written = []
    if results is None:
        results = collect(store, run_id, iterations=iterations)
    for data in results:
        written.append(_write_one(data, Path(out_root), gates, recon_cache, gallery_limit))
    return written


def _write_one(data: BenchmarkResult, out_root: Path, gates: list[dict[str, Any]] | None,
               recon_cache: Path, gallery_limit: int) -> Path:
    folder = report_dir(out_root, data.benchmark, data.tag)
    folder.mkdir(parents=True, exist_ok=True)
    gallery, total = build_gallery(data, recon_cache, gallery_limit)
    protocol = files.protocol_dict(data)
    answers = analyse(data)  # once: summary.json, the two CSVs and the documents share it
    files.write_json(folder / "protocol.json", protocol)
    files.write_json(folder / "summary.json", files.summary_dict(data, gates, total, gallery, answers))
    files.write_per_type_csv(folder / "per_type.csv", data)
    files.write_answer_csvs(folder / "answer_classes.csv", folder / "answer_transitions.csv", answers)
    files.write_predictions(folder / "predictions.jsonl", data)
    doc = content.build(data, protocol, gates, gallery, total, answers=answers)
    _atomic_text(folder / "report.md", markdown.to_markdown(doc))
    _atomic_text(folder / "report.html", html.to_html(doc))
    return folder


def _atomic_text(path: Path, text: str) -> None:
    # unique per process: two runs on one checkout may write the same report at once
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
