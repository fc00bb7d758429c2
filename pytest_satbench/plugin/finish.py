"""The end of a run: the statistics, gates and reports from the store, the terminal summary,
and what a stopped run never reached (the finish concern; `plugin/state.py` lists the others).

On the controller (or the only process), after every item, the run's stored rows become
numbers through the one route (`report.build.collect` -> `core.results.benchmark_results`),
the gates read them, and the report files are written while the store is read once.

--lf resumes: pytest's --lf reruns the items its cache lists as failed. Items a stopped run
(Ctrl-C, SIGTERM, -x, --maxfail, a stop of this plugin's) never reached are in no such list:
at the end of a benchmark run they are added to it (`mark_not_reached`), so --lf reruns the
failed and the never-run items, which is a resume (answered questions come from the store).
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_satbench.plugin.collection import Collection
from pytest_satbench.plugin.run import RunController
from pytest_satbench.plugin.signals import STOP_LINES
from pytest_satbench.plugin.state import STORE_FAILED_EXIT, RunState

if TYPE_CHECKING:
    from pytest_satbench.core.gates import GateResult
    from pytest_satbench.core.results import BenchmarkResult


class Finish:
    def __init__(self, state: RunState, collection: Collection, run: RunController) -> None:
        self.state = state
        self.collection = collection
        self.run = run
        self.results: list[BenchmarkResult] = []
        self.gate_results: list[GateResult] = []
        self.report_dirs: list[Path] = []
        self.sent: int | None = None  # requests this run's clients sent (None: not recorded)
        self.report_error: str | None = None
        self.tracker_lines: list[str] = []
        # items whose run is over (pytest_runtest_logfinish), for what a stopped run never reached:
        # a count where items run in collection order, their node ids on an xdist controller
        self._finished = 0
        self._last_finished: str | None = None
        self._finished_ids: set[str] | None = None
        self.not_reached: list[str] = []  # node ids of the items a stopped run never reached

    # ------------------------------------------------------------------ what was reached
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if self.state.with_servers and self.state.is_controller():
            self._finished_ids = set()

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        if nodeid == self._last_finished:
            return  # the same item again (a rerun plugin runs an item's protocol more than once)
        self._last_finished = nodeid
        self._finished += 1
        if self._finished_ids is not None:
            self._finished_ids.add(nodeid)

    def _never_reached(self, session: pytest.Session) -> list[str]:
        """The selected items this run never finished, in collection order ([] unless it ran
        benchmark items and stopped early)."""
        state = self.state
        if state.is_worker or session.config.option.collectonly or state.start_failed:
            return []
        if self._finished_ids is not None:  # an xdist controller: the workers' common collection
            sched = getattr(state.config.pluginmanager.get_plugin("dsession"), "sched", None)
            collection = getattr(sched, "collection", None) or ()
            if len(self._finished_ids) >= len(collection):
                return []
            return [n for n in collection if n not in self._finished_ids]
        if not state.planned or self._finished >= len(session.items):
            return []
        return [item.nodeid for item in session.items[self._finished:]]

    def _finished_count(self) -> int:
        return len(self._finished_ids) if self._finished_ids is not None else self._finished

    def _mark_not_reached(self) -> None:
        """Adds `not_reached` to pytest's last-failed list, after pytest wrote it (unconfigure)."""
        cache = getattr(self.state.config, "cache", None)
        if not self.not_reached or cache is None or self.state.is_worker:
            return
        lastfailed = cache.get("cache/lastfailed", {})
        lastfailed.update(dict.fromkeys(self.not_reached, True))
        cache.set("cache/lastfailed", lastfailed)

    # ------------------------------------------------------------------ numbers, gates, reports
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """Controller (or the only process), after every item: from the store's rows, the
        statistics, gates and reports, all through `core.results`."""
        state = self.state
        workeroutput = getattr(state.config, "workeroutput", None)
        if workeroutput is not None and state.stopped is not None:
            workeroutput["satbench_stopped"] = list(state.stopped)  # for the controller (pytest_testnodedown)
        try:
            self.not_reached = self._never_reached(session)
            self._finish_run(session)
        finally:
            if state.stopped is not None:
                session.exitstatus = state.stopped[0]

    def _finish_run(self, session: pytest.Session) -> None:
        state = self.state
        if state.is_worker or not state.store_path.exists():
            return
        from pytest_satbench.engine.store import ResultStore, StoreError

        try:
            store = ResultStore(state.store_path)
        except StoreError as exc:
            if self.run._runtime is not None:  # else the start already said it, as a usage error
                state.stop(None, STORE_FAILED_EXIT, str(exc))
            return
        try:
            self._finish(session, store)
        except StoreError as exc:
            state.stop(None, STORE_FAILED_EXIT, str(exc))
        finally:
            store.close()

    def _finish(self, session: pytest.Session, store: Any) -> None:
        from pytest_satbench.core import gates
        from pytest_satbench.report import RunReports
        from pytest_satbench.report.build import collect

        state, settings = self.state, self.state.settings
        if not any(r["run_id"] == state.run_id for r in store.runs(settings.tag)):
            return  # no question ran in this run
        if not (state.interrupted or state.stopped):
            store.finish_run(state.run_id)  # an interrupted or stopped run stays unfinished, and says so
        # the files that list every answer are written while the store is read, once: the
        # run's rows never wait in memory for them (report/__init__.py)
        reports = RunReports(Path(state.config.rootpath) / "reports", recon_cache=store.path.parent.parent / "satbench-recon",
                             reasons_from=store if settings.asked_anew else None, distortions_from=store,
                             log_to=settings.log_to) \
            if settings.reports else None
        # Re-scoring makes a few objects per question, none in a cycle, while the session's
        # millions (items, kept reports) stay: the cyclic GC would walk them all again and
        # again (~1 s of a 222k-question report)
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            self.results = collect(store, state.run_id, iterations=settings.bootstrap,
                                   each=reports.each if reports is not None else None,
                                   figure_parts=lambda bench: gates.figure_parts(settings.gates, bench))
            traffic = store.traffic(state.run_id)  # this run's own: a report may cover earlier runs too
            self.sent = sum(t.requests for t in traffic.values()) if traffic else None
            if not self.results:
                return
            self.gate_results = gates.evaluate(list(settings.gates), {r.benchmark: r for r in self.results})
            if any(not g.passed for g in self.gate_results) and session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = gates.GATE_FAILED_EXIT
            if reports is not None:
                self.report_dirs = self._write_reports(reports)
                self.tracker_lines = list(reports.logged)  # --log-to: what each tracker got, or why not
        finally:
            if gc_was_enabled:
                gc.enable()
            if reports is not None:
                reports.discard()

    def _write_reports(self, reports: Any) -> list[Path]:
        try:
            return reports.write(self.results, [g.to_dict() for g in self.gate_results])
        except Exception as exc:  # a report bug must not hide the run's results
            self.report_error = f"{type(exc).__name__}: {exc}"
            return []

    # ------------------------------------------------------------------ the summary
    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        state = self.state
        if state.is_worker:
            return
        if self.results:
            from pytest_satbench.plugin import terminal

            terminal.render(terminalreporter, self.results, self.results[0].protocol.get("model"), self.sent)
            sequential = [r for r in self.results if r.sequential]
            if sequential:  # --precision / --margin: the confidence sequences (core/early_stop.py)
                from pytest_satbench.core.early_stop import SUMMARY_NOTE, summary_line

                terminalreporter.write_sep("-", "satbench early stopping")
                for r in sequential:
                    terminalreporter.write_line(summary_line(r.benchmark, r.sequential or {}))
                terminalreporter.write_line(SUMMARY_NOTE)
        if self.gate_results:
            from pytest_satbench.core import gates

            terminalreporter.write_sep("-", "satbench gates")
            for line in gates.render(self.gate_results):
                terminalreporter.write_line(line, red="FAIL" in line[:80] and "  FAIL  " in line, green="  PASS  " in line)
            failed = sum(not g.passed for g in self.gate_results)
            if failed:
                terminalreporter.write_line(f"satbench: {failed} gate(s) failed (exit status {gates.GATE_FAILED_EXIT} when no item failed)", red=True)
        for folder in self.report_dirs:
            terminalreporter.write_line(f"satbench: report written to {folder}")
        for line in self.tracker_lines:
            terminalreporter.write_line(line, yellow=" not logged " in line or "not installed" in line)
        if self.report_error:
            terminalreporter.write_line(f"satbench: writing reports failed: {self.report_error}", red=True)
        self.collection.summary_left_out(terminalreporter, exitstatus)
        self.run.say_server_states()
        if state.stopped:
            status, line = state.stopped
            terminalreporter.write_line(f"satbench: {line} (exit status {status})", red=True)
        if self.not_reached:
            n = len(self.not_reached)
            how = ("they are added to pytest's last-failed list, so `pytest --lf` reruns them with the items that "
                   "failed; answered questions are reported from the store, not asked again"
                   if getattr(config, "cache", None) is not None else "rerun the same command to run them")
            terminalreporter.write_line(f"satbench: this run never reached {n} of its "
                                        f"{n + self._finished_count()} items: {how}", yellow=True)
        if self.collection.not_loaded and config.option.verbose > 0:
            terminalreporter.write_line(
                f"satbench: not loaded (-k selects none of their items): {', '.join(self.collection.not_loaded)}")
        if state.settings.export_jsonl:
            from pytest_satbench.engine.store import ResultStore

            store = ResultStore(state.store_path)
            out = Path(config.rootpath) / "reports" / "results.jsonl"
            n = store.export_jsonl(out)
            store.close()
            terminalreporter.write_line(f"satbench: exported {n} stored rows to {out}")

    @pytest.hookimpl(trylast=True)
    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        """Ctrl-C: one line instead of pytest's banner and the interrupted thread's frame. (A
        run stopped by this plugin, `session.shouldstop`, arrives here too, as pytest's
        `Interrupted`: its reason is already one line.)"""
        from _pytest.main import Interrupted

        state = self.state
        if isinstance(excinfo.value, Interrupted):
            return
        reporter = state.config.pluginmanager.get_plugin("terminalreporter")
        if state.stopped is not None and (state.signals is None or state.signals.received is None):
            # an xdist controller's end after a worker's stop: said once, as pytest says its own
            if reporter is not None and getattr(reporter, "_keyboardinterrupt_memo", None) is not None:
                reporter._keyboardinterrupt_memo = _OneLine(f"Interrupted: satbench: {state.stopped[1]}")
            return
        state.interrupted = True
        if reporter is not None and getattr(reporter, "_keyboardinterrupt_memo", None) is not None:
            # pytest prints this memo's message as one "!!! ... !!!" line, then (for a message
            # naming KeyboardInterrupt) the frame of whichever thread wait the signal landed in
            line = state.signals.line() if state.signals is not None else STOP_LINES["SIGINT"]
            reporter._keyboardinterrupt_memo = _OneLine(line)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        try:
            self._mark_not_reached()
        finally:
            if self.state.signals is not None:
                self.state.signals.restore()


class _OneLine:
    """Stands in for pytest's record of a KeyboardInterrupt: just its message."""

    def __init__(self, message: str) -> None:
        self.reprcrash = self
        self.message = message

    def toterminal(self, tw: Any) -> None:
        tw.line(self.message)
