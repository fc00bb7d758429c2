"""The plugin's state for one pytest run: settings, servers, images, store, look-ahead.

Registered as a plugin object by `plugin.py` (the pytest-xdist / pytest-benchmark
pattern), so its hooks are methods and nothing lives in module globals. On an xdist
controller it only collects reports and renders the summary; items run on the workers.
"""

from __future__ import annotations

import gc
import uuid
from pathlib import Path
from typing import Any

import pytest

from pytest_satbench.core import gates
from pytest_satbench.core.question import chance
from pytest_satbench.datasets import registry
from pytest_satbench.datasets.cache import load_questions
from pytest_satbench.datasets.registry import DatasetError, LoadRequest, repeat_sample
from pytest_satbench.engine.answering import ItemResult
from pytest_satbench.engine.provenance import dataset_hashes, question_record
from pytest_satbench.engine.runtime import Runtime
from pytest_satbench.engine.store import ResultStore
from pytest_satbench.plugin.items import (
    QuestionFailed,
    QuestionItem,
    benchmark_of,
    keyword_could_match,
    make_items,
)
from pytest_satbench.plugin.options import Settings
from pytest_satbench.plugin.outcomes import (
    ERROR,
    REGRESSED,
    classify,
    failure_message,
    payload,
    regression_message,
    teststatus,
)
from pytest_satbench.plugin.protocol import run_question_item
from pytest_satbench.plugin.terminal import SummaryCollector


class DatasetErrorItem(pytest.Item):
    """Stands in for a benchmark whose files are malformed: one failed item with the
    one-line reason, so the other benchmarks still run."""

    def __init__(self, *, message: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.message = message

    def runtest(self) -> None:
        raise QuestionFailed(self.message)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:  # type: ignore[override]
        return str(excinfo.value)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, self.name


class SatbenchSession:
    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self.is_worker = hasattr(config, "workerinput")
        self.summary = SummaryCollector(settings, iterations=settings.bootstrap)
        self.left_out: list[str] = []
        self.not_loaded: list[str] = []
        self._runtime: Runtime | None = None
        self._builtin = None
        self._results: dict[str, ItemResult] = {}
        workerinput = getattr(config, "workerinput", {})
        self.run_id: str = workerinput.get("satbench_run_id") or uuid.uuid4().hex[:16]
        self.dataset_hashes: dict[str, dict[str, str]] = {}
        self.repeat_keys: set[tuple[str, str]] = set()
        self.gate_results: list[gates.GateResult] = []
        self.report_dirs: list[Path] = []
        self.report_error: str | None = None

    # ------------------------------------------------------------------ collection
    @pytest.hookimpl(tryfirst=True)
    def pytest_pycollect_makeitem(self, collector: pytest.Collector, name: str, obj: object) -> Any:
        bench_name = benchmark_of(obj)
        if bench_name is None:
            return None
        try:
            bench = registry.get(bench_name)
        except KeyError as exc:
            return [DatasetErrorItem.from_parent(collector, name=name, message=str(exc.args[0]))]
        if not self._keyword_selects(collector, name):
            self.not_loaded.append(bench_name)
            return []
        if bench.prepare is not None:
            root = bench.prepare(self._cache_dir("satbench-data"))
        else:
            if self.settings.data_root is None:
                self._leave_out(f"{bench_name} left out: no data root; pass --data-root or set SATBENCH_DATA_ROOT")
                return []
            root = self.settings.data_root
        missing = bench.missing(root)
        if missing:
            src = f" (data root from {self.settings.data_root_source})" if self.settings.data_root_source else ""
            self._leave_out(f"{bench_name} left out, not found: {', '.join(map(str, missing))}{src}")
            return []
        # Loading and building 222k items allocates millions of objects that all live to the
        # end of the session; the cyclic GC would rescan the growing heap again and again
        # (a third of the collection time at RSVQA-HR scale). Nothing here makes cycles.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            try:
                questions = load_questions(bench, LoadRequest(root, self.settings.limit), self._cache_dir("satbench-data"))
            except DatasetError as exc:
                return [DatasetErrorItem.from_parent(collector, name=name, message=str(exc))]
            if self.settings.servers or self.settings.builtin_server:
                self.dataset_hashes[bench_name] = dataset_hashes(bench, root)
            if self.settings.repeat_orig:
                self.repeat_keys |= repeat_sample(questions, self.settings.repeat_sample)
            return make_items(collector, name, questions)
        finally:
            if gc_was_enabled:
                gc.enable()

    def _keyword_selects(self, collector: pytest.Collector, name: str) -> bool:
        keyword = self.config.option.keyword
        if not keyword:
            return True
        own = [name]
        node: Any = collector
        while node is not None and not isinstance(node, pytest.Session):
            if not (isinstance(node, pytest.Directory) and isinstance(node.parent, pytest.Session)):
                own.append(node.name)
            node = node.parent
        others = [f"test_{b}" for b in registry.all_benchmarks() if f"test_{b}" != name]
        return keyword_could_match(keyword, own, others)

    def _leave_out(self, line: str) -> None:
        self.left_out.append(line)
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and not self.is_worker:
            reporter.write_line(f"satbench: {line}", yellow=True)

    def _cache_dir(self, name: str) -> Path:
        cache = getattr(self.config, "cache", None)
        if cache is not None:
            return Path(cache.mkdir(name))
        path = Path(self.config.rootpath) / ".satbench" / name  # -p no:cacheprovider
        path.mkdir(parents=True, exist_ok=True)
        return path

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # 222k collected items are never freed before the end: keep the cyclic GC off them
        # (a full collect first would cost 0.2 s at that size and find almost nothing).
        if len(session.items) > 10_000:
            gc.freeze()

    # ------------------------------------------------------------------ running
    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Any:
        items = [i for i in session.items if isinstance(i, QuestionItem)]
        if items and not self._is_controller() and not session.config.option.collectonly:
            self._runtime = Runtime.start(self, session, items)
        try:
            return (yield)
        finally:
            if self._runtime is not None:
                self._runtime.close()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        if isinstance(item, QuestionItem) and self._runtime is not None:
            return run_question_item(item, nextitem)
        return None  # pytest's own protocol

    def runtime(self, session: pytest.Session) -> Runtime:
        """Servers, images and store, started on first use (the public fixtures use this)."""
        if self._runtime is None:
            self._runtime = Runtime.start(self, session, [])
        return self._runtime

    def _is_controller(self) -> bool:
        dsession = self.config.pluginmanager.get_plugin("dsession")
        return dsession is not None and not self.is_worker

    def run_item(self, item: QuestionItem) -> None:
        assert self._runtime is not None, "satbench runtime not started"
        result = self._runtime.lookahead.result(item)
        self._results[item.nodeid] = result
        if result.fingerprints:
            self._runtime.store.record_item(
                self.run_id, item.nodeid, item.question.benchmark, question_record(item.question, result.prompt),
                result.fingerprints,
            )
        outcome = classify(result)
        if outcome == ERROR:
            raise QuestionFailed(failure_message(result))
        if outcome == REGRESSED and self.settings.fail_on == "regression":
            raise QuestionFailed(regression_message(result))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        rep = yield
        if call.when == "call" and isinstance(item, QuestionItem):
            result = self._results.pop(item.nodeid, None)
            if result is not None:
                bench = registry.get(item.question.benchmark)
                types = [bench.reported_type(t) for t in item.question.types]
                rep.satbench = payload(result, types, chance(item.question))
                rep.satbench_outcome = classify(result)
        return rep

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report: pytest.TestReport, config: pytest.Config) -> Any:
        outcome = getattr(report, "satbench_outcome", None)
        if outcome is None or report.when != "call":
            return None
        return teststatus(outcome, report.failed)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" and not self.is_worker:
            data = getattr(report, "satbench", None)
            if data is not None:
                self.summary.add(data)

    # ------------------------------------------------------------------ reporting
    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        s = self.settings
        if not (s.servers or s.builtin_server):
            return []
        servers = "builtin reference server" if s.builtin_server else ", ".join(s.servers)
        arms = ", ".join(["orig"] + [a.canonical for a in s.arms] + (["blind"] if s.blind else []))
        root = f"{s.data_root} ({s.data_root_source})" if s.data_root else "none"
        return [f"satbench: servers: {servers}; arms: {arms}; data root: {root}; prompt style: {s.prompt_style}"]

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """Controller only, after every item: statistics, gates, reports."""
        if self.is_worker:
            if self.summary.model:
                self.config.workeroutput["satbench_model"] = self.summary.model  # type: ignore[attr-defined]
            return
        if not self.summary.by_benchmark:
            return
        stats = self.summary.stats()
        self.gate_results = gates.evaluate(list(self.settings.gates), stats)
        if any(not g.passed for g in self.gate_results) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = gates.GATE_FAILED_EXIT
        store = ResultStore(self._cache_dir("satbench") / "results.sqlite")
        try:
            store.finish_run(self.run_id)
            if self.settings.reports:
                self.report_dirs = self._write_reports(store)
        finally:
            store.close()

    def _write_reports(self, store: ResultStore) -> list[Path]:
        try:
            from pytest_satbench.report import write_reports
        except ImportError:
            return []
        out = Path(self.config.rootpath) / "reports"
        try:
            return write_reports(
                store, self.run_id, out, gates=[g.to_dict() for g in self.gate_results],
                iterations=self.settings.bootstrap,
            )
        except Exception as exc:  # a report bug must not hide the run's results
            self.report_error = f"{type(exc).__name__}: {exc}"
            return []

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        if self.is_worker:
            return
        self.summary.render(terminalreporter)
        if self.gate_results:
            terminalreporter.write_sep("-", "satbench gates")
            for line in gates.render(self.gate_results):
                terminalreporter.write_line(line, red="FAIL" in line[:80] and "  FAIL  " in line, green="  PASS  " in line)
            failed = sum(not g.passed for g in self.gate_results)
            if failed:
                terminalreporter.write_line(f"satbench: {failed} gate(s) failed (exit status {gates.GATE_FAILED_EXIT} when no item failed)", red=True)
        for folder in self.report_dirs:
            terminalreporter.write_line(f"satbench: report written to {folder}")
        if self.report_error:
            terminalreporter.write_line(f"satbench: writing reports failed: {self.report_error}", red=True)
        if self.not_loaded and config.option.verbose > 0:
            terminalreporter.write_line(f"satbench: not loaded (-k selects none of their items): {', '.join(self.not_loaded)}")
        if self.settings.export_jsonl:
            store = ResultStore(self._cache_dir("satbench") / "results.sqlite")
            out = Path(config.rootpath) / "reports" / "results.jsonl"
            n = store.export_jsonl(out)
            store.close()
            terminalreporter.write_line(f"satbench: exported {n} stored rows to {out}")

    # ------------------------------------------------------------------ xdist
    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["satbench_run_id"] = self.run_id
        if self._builtin is None and self.settings.builtin_server:
            from pytest_satbench.server import start_server

            self._builtin = start_server()
        if self._builtin is not None:
            node.workerinput["satbench_builtin_url"] = self._builtin.url

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        model = getattr(node, "workeroutput", {}).get("satbench_model")
        if model:
            self.summary.model = model

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._builtin is not None:
            self._builtin.close()
