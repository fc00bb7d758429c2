"""The plugin's state for one pytest run: settings, the engine's runtime, and the end of run.

Registered as a plugin object by `plugin/__init__.py` (the pytest-xdist / pytest-benchmark
pattern), so its hooks are methods and nothing lives in module globals. On an xdist
controller nothing is started: the workers run the items, and the controller computes the
summary, gates and reports from the store once they are done.

This module is imported at every pytest start-up where the plugin is installed: what it
imports at the top stays light (pytest and the standard library); the engine, the store,
numpy and PIL are imported where a benchmark actually runs.
"""

from __future__ import annotations

import gc
import os
import queue
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_satbench.plugin.items import (
    DatasetErrorItem,
    QuestionFailed,
    QuestionItem,
    benchmark_of,
    keyword_could_match,
    make_items,
    record_error_items,
)
from pytest_satbench.plugin.options import Settings
from pytest_satbench.plugin.outcomes import ERROR, REGRESSED, classify, failure_message, regression_message, teststatus
from pytest_satbench.plugin.protocol import run_question_item
from pytest_satbench.plugin.signals import STOP_LINES, StopSignals

if TYPE_CHECKING:
    from pytest_satbench.core.gates import GateResult
    from pytest_satbench.core.results import BenchmarkResult
    from pytest_satbench.engine.config import RuntimeConfig
    from pytest_satbench.engine.runtime import Runtime
    from pytest_satbench.server import RunningServer


# what sets the data root, as a left-out benchmark's line says it
SETS_DATA_ROOT = "--data-root DIR (ini satbench_data_root) or $SATBENCH_DATA_ROOT"

STORE_FAILED_EXIT = 7  # the results store failed: the run stopped asking (gates: 6)
SERVERS_GONE_EXIT = 8  # no server answered for --give-up-after while requests failed
MODEL_SWAPPED_EXIT = 9  # a server answered as another model: the servers changed under the run


class SatbenchSession:
    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        workerinput: dict[str, Any] = getattr(config, "workerinput", {})
        self.is_worker = bool(workerinput)
        self.run_id: str = workerinput.get("satbench_run_id") or uuid.uuid4().hex[:16]
        self.left_out: list[str] = []  # benchmarks the run could select whose data is missing, one line each
        self.not_loaded: list[str] = []
        # the loaders' notes, and `left_out`: said once collection is over (pytest captures and
        # drops what is said during it), and by an xdist controller in its summary
        self._notes: list[str] = []
        self._from_workers = False
        self.dataset_hashes: dict[str, dict[str, str]] = {}
        self.score_views: dict[str, frozenset[str]] = {}
        self.repeat_keys: set[tuple[str, str]] = set()
        self.results: list[BenchmarkResult] = []
        self.gate_results: list[GateResult] = []
        self.report_dirs: list[Path] = []
        self.sent: int | None = None  # requests this run's clients sent (None: not recorded)
        self.report_error: str | None = None
        self._runtime: Runtime | None = None
        self._builtin: RunningServer | None = None
        self._outcomes: dict[str, str] = {}  # node id -> outcome, from runtest to its report
        # why this run stopped asking before the end (the store failed, no server answers, the
        # model changed): the first reason wins, with its exit status
        self.stopped: tuple[int, str] | None = None
        self._server_lines: queue.SimpleQueue[str] = queue.SimpleQueue()  # from request threads
        self._stopped = threading.Event()
        self._planned: dict[str, int] = {}
        self.interrupted = False
        # items whose run is over (pytest_runtest_logfinish), for what a stopped run never reached:
        # a count where items run in collection order, their node ids on an xdist controller
        self._finished = 0
        self._last_finished: str | None = None
        self._finished_ids: set[str] | None = None
        self.not_reached: list[str] = []  # node ids of the items a stopped run never reached
        self._start_failed = False
        self._signals: Any = None  # plugin/signals.py: SIGTERM as Ctrl-C, in runs with servers

    # ------------------------------------------------------------------ collection
    @pytest.hookimpl(tryfirst=True)
    def pytest_pycollect_makeitem(self, collector: pytest.Collector, name: str, obj: object) -> Any:
        bench_name = benchmark_of(obj)
        if bench_name is None:
            return None
        from pytest_satbench.datasets import registry

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
                self._leave_out(
                    f"{bench_name} left out: no data root is set, so {', '.join(bench.requires)} could not be looked "
                    f"for; point {SETS_DATA_ROOT} at the folder holding {_folders(bench.requires)}")
                return []
            root = self.settings.data_root
        missing = bench.missing(root)
        if missing:
            self._leave_out(f"{bench_name} left out, not found: {', '.join(str(p.absolute()) for p in missing)} "
                            f"(data root {root.absolute()}, "
                            f"from {self._root_source()}; point {SETS_DATA_ROOT} at the folder holding "
                            f"{_folders(bench.requires)})")
            return []
        return self._load(collector, name, bench, root)

    def _load(self, collector: pytest.Collector, name: str, bench: Any, root: Path) -> list[pytest.Item]:
        from pytest_satbench.datasets.cache import load_questions
        from pytest_satbench.core.labels import notes
        from pytest_satbench.datasets.registry import DatasetError, LoadRequest, RecordErrors
        from pytest_satbench.datasets.selection import repeat_sample

        # Loading and building 222k items allocates millions of objects that all live to the
        # end of the session; the cyclic GC would rescan the growing heap again and again
        # (a third of the collection time at RSVQA-HR scale). Nothing here makes cycles.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            unreadable: list[tuple[str, str]] = []
            try:
                questions = load_questions(bench, LoadRequest(root, self.settings.limit), self._cache_dir("satbench-data"))
            except RecordErrors as exc:  # some records cannot be read: each fails alone
                questions, unreadable = list(exc.questions), list(exc.failed)
            except DatasetError as exc:
                return [DatasetErrorItem.from_parent(collector, name=name, message=str(exc))]
            for line in notes(questions):
                self._notes.append(f"satbench: {bench.name}: {line}")  # said after collection
            if self.settings.servers or self.settings.builtin_server:
                from pytest_satbench.engine.provenance import dataset_hashes

                self.dataset_hashes[bench.name] = dataset_hashes(bench.requires, root)
            self.score_views[bench.name] = bench.score_views
            if self.settings.repeat_orig:
                self.repeat_keys |= repeat_sample(questions, self.settings.repeat_sample)
            return [*make_items(collector, name, questions), *record_error_items(collector, name, unreadable)]
        finally:
            if gc_was_enabled:
                gc.enable()

    def _keyword_selects(self, collector: pytest.Collector, name: str) -> bool:
        from pytest_satbench.datasets import registry

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

    def _root_source(self) -> str:
        source = self.settings.data_root_source
        return f"ini {source}" if source and source[0] not in "-$" else source or "?"

    def _leave_out(self, line: str) -> None:
        """A benchmark the run could select but cannot load (its data is missing). Said after
        collection, not now: pytest captures the output of collection and throws it away."""
        self.left_out.append(line)

    def _say(self, line: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and not self.is_worker:
            reporter.write_line(line, yellow=True)

    def _cache_dir(self, name: str) -> Path:
        cache = getattr(self.config, "cache", None)
        if cache is not None:
            return Path(cache.mkdir(name))
        path = Path(self.config.rootpath) / ".satbench" / name  # -p no:cacheprovider
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def store_path(self) -> Path:
        if self.settings.store is not None:
            return self.settings.store
        return self._cache_dir("satbench") / "results.sqlite"

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # 222k collected items are never freed before the end: keep the cyclic GC off them
        # (a full collect first would cost 0.2 s at that size and find almost nothing).
        if len(session.items) > 10_000:
            gc.freeze()
        # question items' reports stay small to the end of the session (plugin/protocol.py)
        from pytest_satbench.plugin.protocol import QuestionReports

        pm = self.config.pluginmanager
        if not pm.has_plugin(QuestionReports.NAME) and any(isinstance(i, QuestionItem) for i in session.items):
            pm.register(QuestionReports(self.config, lambda item: isinstance(item, QuestionItem)), QuestionReports.NAME)
        workeroutput = getattr(self.config, "workeroutput", None)
        if workeroutput is not None:  # an xdist worker: its controller says them in its summary
            workeroutput["satbench_collection"] = {"notes": self._notes, "left_out": self.left_out}

    def pytest_report_collectionfinish(self, config: pytest.Config, start_path: Path, items: list[pytest.Item]) -> list[str]:
        """Under pytest's "collected N items": the lines collection had to say (captured if said then)."""
        if self.is_worker:
            return []
        return [*self._notes, *(f"satbench: {line}" for line in self.left_out)]

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        # an xdist controller collects nothing: its workers' collection lines come with their output
        output = getattr(node, "workeroutput", None) or {}
        stopped = output.get("satbench_stopped")  # a worker's stop (store, servers, model) is the run's
        if stopped:
            self._stop(None, int(stopped[0]), str(stopped[1]))
        got = output.get("satbench_collection")
        if got and not self._from_workers:
            self._from_workers = True
            self._notes, self.left_out = list(got.get("notes") or ()), list(got.get("left_out") or ())

    # ------------------------------------------------------------------ running
    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Any:
        items = [i for i in session.items if isinstance(i, QuestionItem)]
        if items and not self._is_controller() and not session.config.option.collectonly:
            self._planned = dict(Counter(i.question.benchmark for i in items))
            self._start(self._upcoming(session, items))
        try:
            return (yield)
        except KeyboardInterrupt as exc:
            if type(exc) is KeyboardInterrupt and self._signals is not None:  # Ctrl-C or SIGTERM, not a stop
                self._signals.interrupted()
                if self._runtime is not None:
                    self._signals.drain(self._runtime)  # keeps what is in flight, for seconds at most
                if self.is_worker:
                    # an xdist worker ends as a run this plugin stopped: its controller then ends the
                    # run cleanly (a worker that exits interrupted counts as crashed and is replaced)
                    session.shouldstop = self._signals.line()
                    return True
            raise
        finally:
            if self._signals is not None:
                self._signals.finishing = True
            self._stopped.set()
            if self._runtime is not None:
                self._runtime.close()

    def _start(self, upcoming: Iterator[QuestionItem] | None) -> Runtime:
        from pytest_satbench.engine.runtime import Runtime, StartError

        try:
            self._runtime = Runtime.start(self._runtime_config(), upcoming)
        except StartError as exc:
            self._start_failed = True  # nothing was attempted: no item counts as never reached
            raise pytest.UsageError(f"satbench: {exc}") from None
        if not self.is_worker:
            for line in self._runtime.notices:
                self._say(f"satbench: {line}")
        return self._runtime

    def _runtime_config(self) -> RuntimeConfig:
        from pytest_satbench.engine.config import RuntimeConfig

        s = self.settings
        workerinput: dict[str, Any] = getattr(self.config, "workerinput", {})
        urls: tuple[str, ...] = s.servers
        if s.builtin_server:
            url = workerinput.get("satbench_builtin_url") or self._builtin_server().url
            urls = (url,)
        # --concurrency's caps are for the whole run: xdist workers share them
        workers = int(workerinput.get("workercount", 1) or 1)
        return RuntimeConfig(
            run_id=self.run_id, tag=s.tag, urls=urls, store_path=self.store_path,
            recon_cache_dir=self._cache_dir("satbench-recon"),
            recon_cache_bytes=int(os.environ.get("SATBENCH_RECON_CACHE_BYTES", 20 * 2**30)),
            arms=s.arms, model=s.model, max_new=s.max_new, prompt_style=s.prompt_style,
            box_grid=s.box_grid, iou=s.iou, blind=s.blind, fresh=s.fresh,
            concurrency=s.concurrency.split(workers), cache_images=s.cache_images,
            request_timeout=s.request_timeout, retries=s.retries, api_key=s.api_key,
            judge_url=s.judge_url, judge_model=s.judge_model, max_reply_bytes=s.max_reply_bytes,
            max_answer_chars=s.max_answer_chars, model_aliases=s.model_aliases, on_server_state=self._server_state,
            allow_protocol_change=s.allow_protocol_change, repeat_orig=s.repeat_orig,
            repeat_keys=frozenset(self.repeat_keys), score_views=dict(self.score_views),
            process=str(workerinput.get("workerid", "main")),
            command=("pytest", *self.config.invocation_params.args),
            servers_shown=("builtin reference server",) if s.builtin_server else (),
            dataset_hashes=self.dataset_hashes, limit=s.limit, planned=self._planned,
        )

    def _server_state(self, server: str, up: bool, reason: str) -> None:
        # called on a request thread: the line is written by pytest's thread (`_say_server_states`)
        self._server_lines.put(f"satbench: server {server} is {'back' if up else 'DOWN'}: {reason}")

    def _drain_server_lines(self) -> list[str]:
        lines = []
        while True:
            try:
                lines.append(self._server_lines.get_nowait())
            except queue.Empty:
                return lines

    def _say_server_states(self) -> None:
        for line in self._drain_server_lines():
            self._say(line)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # the lines travel on the report, so an xdist worker's reach the controller's terminal
        for line in getattr(report, "satbench_lines", None) or ():
            self._say(line)

    def _builtin_server(self) -> RunningServer:
        if self._builtin is None:
            from pytest_satbench.server import start_server

            self._builtin = start_server()
        return self._builtin

    def _upcoming(self, session: pytest.Session, items: list[QuestionItem]) -> Iterator[QuestionItem]:
        """The question items this process will run, in order, for the look-ahead: under
        xdist the ones the controller has sent this worker so far."""
        interactor = _xdist_interactor(self.config)
        if interactor is None:
            return iter(items)
        from pytest_satbench.engine.lookahead import worker_upcoming

        wanted = {id(i) for i in items}

        def snapshot() -> list[Any] | None:
            try:
                with interactor.torun.lock() as queue:
                    return list(queue)
            except Exception:
                return None

        return (i for i in worker_upcoming(snapshot, session.items, self._stopped.is_set) if id(i) in wanted)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        if isinstance(item, QuestionItem) and self._runtime is not None:
            if self._compat is None:  # (a runtime has servers, so this is not expected)
                return run_question_item(item, nextitem)
            if self._compat.lean:
                return run_question_item(item, nextitem, phases_made=self._compat.phases_made)
        return None  # pytest's own protocol (for question items: a plugin needs it, plugin/compat.py)

    def runtime(self) -> Runtime:
        """The engine, started on first use (the public fixtures use this)."""
        return self._runtime if self._runtime is not None else self._start(None)

    def _is_controller(self) -> bool:
        dsession = self.config.pluginmanager.get_plugin("dsession")
        return dsession is not None and not self.is_worker

    def run_item(self, item: QuestionItem) -> None:
        from pytest_satbench.core.results import question_record

        from pytest_satbench.engine.store import StoreError

        from pytest_satbench.engine.runtime import GaveUp

        assert self._runtime is not None, "satbench runtime not started"
        try:
            result = self._runtime.result(item, give_up_after=self.settings.give_up_after)
        except GaveUp as exc:  # the wait itself is abandoned: a rerun asks this item again
            self._stop(item.session, SERVERS_GONE_EXIT, str(exc))
            self._outcomes[item.nodeid] = ERROR
            raise QuestionFailed(str(exc)) from None
        try:
            self._runtime.store.record_item(
                self.run_id, item.nodeid, item.question.benchmark,
                question_record(item.question, result.prompt, result.sent_size), result.fingerprints,
            )
        except StoreError:
            pass  # reported below through `failure`
        failure = self._runtime.store.failure
        if failure is not None:
            # Nothing more is asked: every answer would be thrown away. A rerun resumes.
            self._stop(item.session, STORE_FAILED_EXIT, str(failure))
            self._outcomes[item.nodeid] = ERROR
            raise QuestionFailed(str(failure))
        gave_up = self._runtime.doomed(self.settings.give_up_after)
        if gave_up is not None:
            self._stop(item.session, SERVERS_GONE_EXIT, gave_up)
        swap = self._runtime.pool.model_swap()
        if swap is not None:
            server, other = swap
            self._stop(item.session, MODEL_SWAPPED_EXIT, (
                f"server {server} answered as model {other!r}, not {self._runtime.model!r}: the servers changed under "
                f"this run; stopped asking. Measure {other!r} under another --tag (--model {other}), or pass "
                f"--allow-model-alias {other} if it is the same model"
            ))
        outcome = classify(result)
        self._outcomes[item.nodeid] = outcome
        if result.record is not None and self._compat is not None:
            item.satbench_arms = result.record.arm_verdicts()  # its properties (plugin/compat.py)
        if outcome == ERROR:
            raise QuestionFailed(failure_message(result))
        if outcome == REGRESSED and self.settings.fail_on == "regression":
            assert result.record is not None
            raise QuestionFailed(regression_message(result.record))

    # ------------------------------------------------------------------ --lf resumes
    # pytest's --lf reruns the items its cache lists as failed. Items a stopped run (Ctrl-C, -x,
    # --maxfail, a stop of this plugin's) never reached are in no such list: at the end of a
    # benchmark run they are added to it (`_mark_not_reached`), so --lf reruns the failed and
    # the never-run items, which is a resume (answered questions come from the store).
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if not (self.settings.servers or self.settings.builtin_server):
            return
        if not self.is_worker and not session.config.option.collectonly:
            self._check_store()  # before an xdist controller starts its workers
        if self._is_controller():
            self._finished_ids = set()

    def _check_store(self) -> None:
        """A store no answer could be kept in ends the run before it starts: one line, exit 4."""
        from pytest_satbench.engine.store import ResultStore, StoreError

        try:
            path = self.store_path
        except OSError as exc:  # .pytest_cache cannot be made or written
            raise pytest.UsageError(
                f"satbench: the results store's folder cannot be made ({exc.strerror or exc}: {exc.filename}); "
                "make it writable or pass --store PATH") from None
        if self.settings.store_recover:
            moved = ResultStore.recover(path)
            if moved is not None:
                self._say(f"satbench: the results store was corrupt; moved aside to {moved}, starting a new one")
        try:
            ResultStore.check_writable(path)
        except StoreError as exc:
            raise pytest.UsageError(f"satbench: {exc}") from None

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
        if self.is_worker or session.config.option.collectonly or self._start_failed:
            return []
        if self._finished_ids is not None:  # an xdist controller: the workers' common collection
            sched = getattr(self.config.pluginmanager.get_plugin("dsession"), "sched", None)
            collection = getattr(sched, "collection", None) or ()
            if len(self._finished_ids) >= len(collection):
                return []
            return [n for n in collection if n not in self._finished_ids]
        if not self._planned or self._finished >= len(session.items):
            return []
        return [item.nodeid for item in session.items[self._finished:]]

    def _finished_count(self) -> int:
        return len(self._finished_ids) if self._finished_ids is not None else self._finished

    def _mark_not_reached(self) -> None:
        """Adds `not_reached` to pytest's last-failed list, after pytest wrote it (unconfigure)."""
        cache = getattr(self.config, "cache", None)
        if not self.not_reached or cache is None or self.is_worker:
            return
        lastfailed = cache.get("cache/lastfailed", {})
        lastfailed.update(dict.fromkeys(self.not_reached, True))
        cache.set("cache/lastfailed", lastfailed)

    def _stop(self, session: pytest.Session | None, exit_status: int, line: str) -> None:
        """Stop asking: pytest ends the run after this item; the first reason is kept."""
        if self.stopped is None:
            self.stopped = (exit_status, line)
            if session is not None:
                session.shouldstop = f"satbench: {line}"

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        rep = yield
        if call.when == "call" and isinstance(item, QuestionItem):
            # only the outcome travels to an xdist controller: the numbers come from the store;
            # it and the arms' verdicts also go on the reports as properties (plugin/compat.py)
            outcome = self._outcomes.pop(item.nodeid, None)
            if self._compat is not None:
                outcome = self._compat.call_outcome(item, rep, outcome)
            if outcome is not None:
                rep.satbench_outcome = outcome
            lines = self._drain_server_lines()
            if lines:
                rep.satbench_lines = lines
        elif call.when == "teardown" and isinstance(item, QuestionItem) and self._compat is not None:
            self._compat.end_item(item)
        return rep

    def pytest_configure(self, config: pytest.Config) -> None:
        # called as the session is registered (pytest_configure is historic); question items
        # run only against servers, so a run without them (your own tests) never loads it
        self._compat: Any = None
        if self.settings.servers or self.settings.builtin_server:
            self._signals = StopSignals(config)  # SIGTERM stops the run as Ctrl-C does
            self._signals.install()
            from pytest_satbench.plugin import compat

            self._compat = compat.register(config, self.settings)

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report: pytest.TestReport, config: pytest.Config) -> Any:
        outcome = getattr(report, "satbench_outcome", None)
        if outcome is None or report.when != "call" or report.outcome == "rerun":
            return None  # (a try pytest-rerunfailures runs again is its "rerun")
        return teststatus(outcome, report.failed)

    # ------------------------------------------------------------------ reporting
    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        s = self.settings
        if not (s.servers or s.builtin_server):
            return []
        from pytest_satbench.core.arms import BLIND, ORIG

        servers = "builtin reference server" if s.builtin_server else ", ".join(s.servers)
        arms = ", ".join([ORIG] + [a.canonical for a in s.arms] + ([BLIND] if s.blind else []))
        root = (f"{s.data_root} ({s.data_root_source})" if s.data_root
                else "not set (the demo needs none; the others: --data-root or $SATBENCH_DATA_ROOT)")
        lines = [f"satbench: servers: {servers}; arms: {arms}; data root: {root}; prompt style: {s.prompt_style}"]
        from pytest_satbench.engine.store import network_store_warning

        warning = network_store_warning(self.store_path)
        if warning:
            lines.append(f"satbench: WARNING: {warning}")
        return lines

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """Controller (or the only process), after every item: from the store's rows, the
        statistics, gates and reports, all through `core.results`."""
        workeroutput = getattr(self.config, "workeroutput", None)
        if workeroutput is not None and self.stopped is not None:
            workeroutput["satbench_stopped"] = list(self.stopped)  # for the controller (pytest_testnodedown)
        try:
            self.not_reached = self._never_reached(session)
            self._finish_run(session)
        finally:
            if self.stopped is not None:
                session.exitstatus = self.stopped[0]

    def _finish_run(self, session: pytest.Session) -> None:
        if self.is_worker or not self.store_path.exists():
            return
        from pytest_satbench.engine.store import ResultStore, StoreError

        try:
            store = ResultStore(self.store_path)
        except StoreError as exc:
            if self._runtime is not None:  # else the start already said it, as a usage error
                self._stop(None, STORE_FAILED_EXIT, str(exc))
            return
        try:
            self._finish(session, store)
        except StoreError as exc:
            self._stop(None, STORE_FAILED_EXIT, str(exc))
        finally:
            store.close()

    def _finish(self, session: pytest.Session, store: Any) -> None:
        from pytest_satbench.core import gates
        from pytest_satbench.report import RunReports
        from pytest_satbench.report.build import collect

        if not any(r["run_id"] == self.run_id for r in store.runs(self.settings.tag)):
            return  # no question ran in this run
        if not (self.interrupted or self.stopped):
            store.finish_run(self.run_id)  # an interrupted or stopped run stays unfinished, and says so
        # the files that list every answer are written while the store is read, once: the
        # run's rows never wait in memory for them (report/__init__.py)
        reports = RunReports(Path(self.config.rootpath) / "reports", recon_cache=store.path.parent.parent / "satbench-recon") \
            if self.settings.reports else None
        # Re-scoring makes a few objects per question, none in a cycle, while the session's
        # millions (items, kept reports) stay: the cyclic GC would walk them all again and
        # again (~1 s of a 222k-question report)
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            self.results = collect(store, self.run_id, iterations=self.settings.bootstrap,
                                   each=reports.each if reports is not None else None,
                                   figure_parts=lambda bench: gates.figure_parts(self.settings.gates, bench))
            traffic = store.traffic(self.run_id)  # this run's own: a report may cover earlier runs too
            self.sent = sum(t.requests for t in traffic.values()) if traffic else None
            if not self.results:
                return
            self.gate_results = gates.evaluate(list(self.settings.gates), {r.benchmark: r for r in self.results})
            if any(not g.passed for g in self.gate_results) and session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = gates.GATE_FAILED_EXIT
            if reports is not None:
                self.report_dirs = self._write_reports(reports)
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

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        if self.is_worker:
            return
        if self.results:
            from pytest_satbench.plugin import terminal

            terminal.render(terminalreporter, self.results, self.results[0].protocol.get("model"), self.sent)
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
        if self.report_error:
            terminalreporter.write_line(f"satbench: writing reports failed: {self.report_error}", red=True)
        self._summary_left_out(terminalreporter, exitstatus)
        self._say_server_states()
        if self.stopped:
            status, line = self.stopped
            terminalreporter.write_line(f"satbench: {line} (exit status {status})", red=True)
        if self.not_reached:
            n = len(self.not_reached)
            how = ("they are added to pytest's last-failed list, so `pytest --lf` reruns them with the items that "
                   "failed; answered questions are reported from the store, not asked again"
                   if getattr(config, "cache", None) is not None else "rerun the same command to run them")
            terminalreporter.write_line(f"satbench: this run never reached {n} of its "
                                        f"{n + self._finished_count()} items: {how}", yellow=True)
        if self.not_loaded and config.option.verbose > 0:
            terminalreporter.write_line(f"satbench: not loaded (-k selects none of their items): {', '.join(self.not_loaded)}")
        if self.settings.export_jsonl:
            from pytest_satbench.engine.store import ResultStore

            store = ResultStore(self.store_path)
            out = Path(config.rootpath) / "reports" / "results.jsonl"
            n = store.export_jsonl(out)
            store.close()
            terminalreporter.write_line(f"satbench: exported {n} stored rows to {out}")

    def _summary_left_out(self, tr: Any, exitstatus: int) -> None:
        """The benchmarks left out for missing data, again at the end (a long run's first lines are
        far above; an xdist controller says its workers' here only), and, when nothing ran
        because of them, that and what to do."""
        if self._from_workers:
            for line in self._notes:
                tr.write_line(line, yellow=True)
        if not self.left_out:
            return
        nothing = exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED
        if self._from_workers or not nothing:
            for line in self.left_out:
                tr.write_line(f"satbench: {line}", yellow=True)
        if nothing:
            names = [line.split(" ", 1)[0] for line in self.left_out]
            one = len(names) == 1
            root = self.settings.data_root
            why = (f"{'its' if one else 'their'} files are not under the data root {root.absolute()} (from "
                   f"{self._root_source()})" if root is not None else "no data root is set")
            tr.write_line(
                f"satbench: no items ran: {', '.join(names)} {'was' if one else 'were'} left out, as {why}; point "
                f"{SETS_DATA_ROOT} at the folder that holds the benchmarks", red=True)

    @pytest.hookimpl(trylast=True)
    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        """Ctrl-C: one line instead of pytest's banner and the interrupted thread's frame. (A
        run stopped by this plugin, `session.shouldstop`, arrives here too, as pytest's
        `Interrupted`: its reason is already one line.)"""
        from _pytest.main import Interrupted

        if isinstance(excinfo.value, Interrupted):
            return
        if self.stopped is not None and (self._signals is None or self._signals.received is None):
            # an xdist controller's end after a worker's stop: said once, as pytest says its own
            reporter = self.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None and getattr(reporter, "_keyboardinterrupt_memo", None) is not None:
                reporter._keyboardinterrupt_memo = _OneLine(f"Interrupted: satbench: {self.stopped[1]}")
            return
        self.interrupted = True
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and getattr(reporter, "_keyboardinterrupt_memo", None) is not None:
            # pytest prints this memo's message as one "!!! ... !!!" line, then (for a message
            # naming KeyboardInterrupt) the frame of whichever thread wait the signal landed in
            line = self._signals.line() if self._signals is not None else STOP_LINES["SIGINT"]
            reporter._keyboardinterrupt_memo = _OneLine(line)

    # ------------------------------------------------------------------ xdist
    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["satbench_run_id"] = self.run_id
        if self.settings.builtin_server:
            node.workerinput["satbench_builtin_url"] = self._builtin_server().url

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        try:
            self._mark_not_reached()
        finally:
            if self._signals is not None:
                self._signals.restore()
            if self._builtin is not None:
                self._builtin.close()


class _OneLine:
    """Stands in for pytest's record of a KeyboardInterrupt: just its message."""

    def __init__(self, message: str) -> None:
        self.reprcrash = self
        self.message = message

    def toterminal(self, tw: Any) -> None:
        tw.line(self.message)


def _folders(requires: tuple[str, ...]) -> str:
    """The top folders of a benchmark's files under the data root: `RSVQA-LR/`."""
    tops = dict.fromkeys(rel.split("/", 1)[0] + ("/" if "/" in rel else "") for rel in requires)
    return " and ".join(tops) or "its files"


def _xdist_interactor(config: pytest.Config) -> Any:
    if not hasattr(config, "workerinput"):
        return None
    for plugin in config.pluginmanager.get_plugins():
        if type(plugin).__name__ == "WorkerInteractor" and hasattr(plugin, "torun"):
            return plugin
    return None
