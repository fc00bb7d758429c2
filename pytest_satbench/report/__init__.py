"""Run reports: `reports/<benchmark>/<tag>/` with summary.json, per_type.csv,
answer_classes.csv, answer_transitions.csv, per_image.csv, predictions.jsonl, protocol.json, report.md and a
self-contained report.html.

Written by the plugin at the end of a run and on demand from the store
(`python -m pytest_satbench.report`). Everything is rebuilt from the store: answers are
re-scored from their raw text, so a report always reflects the current scorer.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_satbench.core.analysis import analyse
from pytest_satbench.core.defaults import BOOTSTRAP
from pytest_satbench.core.distortion_flips import FlipTable
from pytest_satbench.core.results import BenchmarkResult, QuestionResult
from pytest_satbench.engine.store import ResultStore
from pytest_satbench.report import content, files, html, markdown, why
from pytest_satbench.report.build import add_flips, collect, distortion_flips, distortion_measured
from pytest_satbench.report.gallery import MAX_GALLERY, RegressedPicker, build_gallery

__all__ = ["RunReports", "report_dir", "write_reports"]


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
    iterations: int = BOOTSTRAP,
    recon_cache: Path | None = None,
    gallery_limit: int = MAX_GALLERY,
    asked_anew: bool = False,
    log_to: Sequence[Any] = (),
    logged: list[str] | None = None,
) -> list[Path]:
    """Write the reports of every benchmark of `run_id`; returns the folders written.

    `recon_cache`: the plugin's disk cache of reconstructions, for gallery images of
    expensive codecs; default: `satbench-recon` next to the store's folder (pytest's cache
    layout). `asked_anew`: summary.json and report.md count the run's answers asked anew by
    reason (`RunReports.reasons_from`). Raises KeyError when the run is not in the store. (The
    plugin, which needs the results for the terminal and the gates too, uses `RunReports`
    around its own `collect`.) `log_to`: `report.trackers.TrackerSpec`s each folder is logged to
    (`logged`, a list given, gets one line per folder and tracker).
    """
    reports = RunReports(out_root, recon_cache=_default_recon_cache(store, recon_cache), gallery_limit=gallery_limit,
                         reasons_from=store if asked_anew else None, distortions_from=store, log_to=log_to)
    try:
        results = collect(store, run_id, iterations=iterations, each=reports.each)
        reports.raise_failure()
        try:
            return reports.write(results, gates)
        finally:
            if logged is not None:
                logged.extend(reports.logged)
    finally:
        reports.discard()


def _default_recon_cache(store: ResultStore, recon_cache: Path | None) -> Path:
    return recon_cache if recon_cache is not None else Path(store.path).parent.parent / "satbench-recon"


@dataclass
class _Streamed:
    """One benchmark's files that list every question, filled while the store is read."""

    folder: Path
    predictions: files.PredictionsWriter
    gallery: RegressedPicker
    flips: FlipTable = field(default_factory=FlipTable)  # per reconstruction arm, for the distortion figures

    def add(self, it: QuestionResult) -> None:
        self.predictions.add(it)
        self.gallery.add(it)
        add_flips(self.flips, it)


@dataclass
class RunReports:
    """A run's report folders, written in two steps so that no question waits in memory:

    1. `each` is given to `report.build.collect` (`collect(..., each=reports.each)`): as every
       question is scored, its rows go to predictions.jsonl (a temporary file) and the
       regressed gallery keeps the first few;
    2. `write(results, gates)` writes everything else from the results' aggregates and puts
       predictions.jsonl in place.

    A failure in step 1 (a full disk, a report bug) stops the report, not the run's results:
    it is kept in `failure` (`raise_failure()` raises it) and `write` writes nothing. Call
    `discard()` when done: it removes what was not put in place.

    `reasons_from`: the store the results were collected from; given, each summary.json has
    `asked_anew` and report.md a sentence: the reporting run's answers asked anew, by reason
    (`report.why.reasons`, the one computation `--reasons` prints). Opt-in: it reads every
    earlier run's records of the benchmark (docs/performance.md, "Re-ask reasons").

    `distortions_from`: the store to ask, once per benchmark, for the distortion of the images
    sent (`report.build.distortion_flips`): the flips-against-distortion section, per_image.csv's
    distortion columns and predictions.jsonl's; None: not asked (no section).

    `log_to`: the experiment trackers (`report.trackers.TrackerSpec`, --log-to) each folder is
    logged to once written; `logged` gets one line per folder and tracker, and a tracker's
    failure is only its line. The tracker run's identity reads the tag's first run from
    `distortions_from` (else the oldest run the report covers)."""

    out_root: Path
    recon_cache: Path | None = None
    gallery_limit: int = MAX_GALLERY
    reasons_from: ResultStore | None = None
    distortions_from: ResultStore | None = None
    log_to: Sequence[Any] = ()
    logged: list[str] = field(default_factory=list)
    failure: BaseException | None = None
    _streamed: dict[tuple[str, str], _Streamed] = field(default_factory=dict, init=False, repr=False)

    def each(self, benchmark: str, tag: str) -> Callable[[QuestionResult], None] | None:
        if self.failure is not None:
            return None
        try:
            folder = report_dir(Path(self.out_root), benchmark, tag)
            folder.mkdir(parents=True, exist_ok=True)
            streamed = _Streamed(folder, files.PredictionsWriter(folder / "predictions.jsonl"),
                                 RegressedPicker(self.gallery_limit))
        except Exception as exc:  # noqa: BLE001  (kept for write(): the run's results still count)
            self.failure = exc
            return None
        self._streamed[benchmark, tag] = streamed

        def add(it: QuestionResult) -> None:
            if self.failure is not None:
                return
            try:
                streamed.add(it)
            except Exception as exc:  # noqa: BLE001 (kept for write(), as above)
                self.failure = exc

        return add

    def raise_failure(self) -> None:
        if self.failure is not None:
            raise self.failure

    def write(self, results: Sequence[BenchmarkResult], gates: list[dict[str, Any]] | None = None) -> list[Path]:
        """The rest of every benchmark's files; returns the folders written."""
        self.raise_failure()
        written = []
        per_run: dict[str, dict[str, Counter[str]]] = {}
        for data in results:
            streamed = self._streamed.pop((data.benchmark, data.tag))
            anew = None
            if self.reasons_from is not None:
                if data.run_id not in per_run:  # every benchmark of the run at once
                    per_run[data.run_id] = why.reasons(self.reasons_from, data.run_id)
                anew = why.asked_anew(per_run[data.run_id].get(data.benchmark, Counter()))
            _write_one(data, streamed, gates, self.recon_cache, anew, self.distortions_from)
            written.append(streamed.folder)
            if self.log_to:
                self._log(data, streamed.folder)
        return written

    def _log(self, data: BenchmarkResult, folder: Path) -> None:
        from pytest_satbench.report.trackers import log_report

        first = None
        if self.distortions_from is not None:
            try:
                runs = self.distortions_from.runs(data.tag)
                first = str(runs[-1]["run_id"]) if runs else None  # newest first: the tag's first run is last
            except Exception:  # noqa: BLE001  (the oldest run the report covers stands in)
                first = None
        self.logged.extend(log_report(self.log_to, folder, data, first))

    def discard(self) -> None:
        for streamed in self._streamed.values():
            streamed.predictions.discard()
        self._streamed.clear()


def _write_one(data: BenchmarkResult, streamed: _Streamed, gates: list[dict[str, Any]] | None,
               recon_cache: Path | None, asked_anew: dict[str, int] | None = None,
               store: ResultStore | None = None) -> None:
    folder = streamed.folder
    gallery = build_gallery(streamed.gallery.chosen(), recon_cache)
    total = streamed.gallery.total
    protocol = files.protocol_dict(data)
    answers = analyse(data)  # once: summary.json, the two CSVs and the documents share it
    distortion = distortion_flips(store, streamed.flips, iterations=data.stats.iterations, seed=data.stats.seed,
                                  measured=distortion_measured(data.protocol))
    files.write_json(folder / "protocol.json", protocol)
    files.write_json(folder / "summary.json", files.summary_dict(data, gates, total, gallery, answers, asked_anew,
                                                                 distortion))
    files.write_per_type_csv(folder / "per_type.csv", data)
    files.write_answer_csvs(folder / "answer_classes.csv", folder / "answer_transitions.csv", answers)
    files.write_per_image_csv(folder / "per_image.csv", streamed.flips, distortion.by_pair)
    streamed.predictions.commit(distortion.by_pair)
    doc = content.build(data, protocol, gates, gallery, total, answers=answers, asked_anew=asked_anew,
                        distortion=distortion)
    _atomic_text(folder / "report.md", markdown.to_markdown(doc))
    _atomic_text(folder / "report.html", html.to_html(doc))


def _atomic_text(path: Path, text: str) -> None:
    # unique per process: two runs on one checkout may write the same report at once
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
