"""While items run: the engine's runtime, one item's outcome, and the run's stops (the run
concern of the plugin; `plugin/state.py` lists the others).

The runtime (servers, codecs, store, look-ahead; `engine/runtime.py`) starts as the items
start and closes when they are over, on every path. An item takes its answers from it and
its outcome from the record of its verdict (`core/verdict.py`): the letter, the properties,
the failure line. The run stops asking, with its own exit status, when the store fails
(7), no server answers (8) or a server answers as another model (9); Ctrl-C and SIGTERM keep
what is in flight for a few seconds (`plugin/signals.py`). On an xdist controller nothing
is started: the workers run the items.

Imported at every pytest start-up where the plugin is installed: the engine, the store,
numpy and PIL are imported where a benchmark actually runs.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_satbench.plugin.items import QuestionFailed, QuestionItem
from pytest_satbench.plugin.options import OPTIONS
from pytest_satbench.plugin.runtest import run_question_item
from pytest_satbench.plugin.signals import StopSignals
from pytest_satbench.plugin.state import MODEL_SWAPPED_EXIT, SERVERS_GONE_EXIT, STORE_FAILED_EXIT, RunState

# The same --servers @FILE line from several xdist workers within this time is said once.
FLEET_LINE_REPEAT_S = 60.0

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pytest_satbench.engine.config import RuntimeConfig
    from pytest_satbench.engine.runtime import Runtime
    from pytest_satbench.plugin.options import Settings
    from pytest_satbench.server import RunningServer


class RunController:
    """Registered as "satbench-session" (the public fixtures find the runtime through it)."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self._runtime: Runtime | None = None
        self._builtin: RunningServer | None = None
        self._compat: Any = None
        self._outcomes: dict[str, str] = {}  # node id -> outcome, from runtest to its report
        self._server_lines: queue.SimpleQueue[str] = queue.SimpleQueue()  # from request threads
        self._fleet_said: dict[str, float] = {}  # a --servers @FILE line -> when it was last said
        self._stopped = threading.Event()
        self._seq_plugin: Any = _UNSET
        self._seq: dict[str, list[Any]] = {}  # node id -> what its report carries for --precision/--margin

    @property
    def settings(self) -> Settings:
        return self.state.settings

    def pytest_configure(self, config: pytest.Config) -> None:
        # called as the object is registered (pytest_configure is historic); question items
        # run only against servers, so a run without them (your own tests) never loads these
        if self.state.with_servers:
            self.state.signals = StopSignals(config)  # SIGTERM stops the run as Ctrl-C does
            self.state.signals.install()
            # A stop signal lands wherever the main thread is: inside another plugin's old-style
            # hook wrapper (hypothesis's makereport), pluggy reports its unfinished teardown as
            # a warning naming KeyboardInterrupt. The stop already has its one line.
            config.addinivalue_line(
                "filterwarnings", "ignore:(?s)A plugin raised an exception during an old-style hookwrapper "
                "teardown.*KeyboardInterrupt:pluggy.PluggyTeardownRaisedWarning")
            from pytest_satbench.plugin import compat

            self._compat = compat.register(config, self.settings)

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if self.state.with_servers and not self.state.is_worker and not session.config.option.collectonly:
            self._check_store()  # before an xdist controller starts its workers
        if self.settings.servers_file is not None:  # its bad lines, once (said on the controller only)
            for line in self.settings.servers_file.problems:
                self.state.say(f"satbench: {line}")

    def _check_store(self) -> None:
        """A store no answer could be kept in ends the run before it starts: one line, exit 4."""
        from pytest_satbench.engine.store import ResultStore, StoreError

        try:
            path = self.state.store_path
        except OSError as exc:  # .pytest_cache cannot be made or written
            raise pytest.UsageError(
                f"satbench: the results store's folder cannot be made ({exc.strerror or exc}: {exc.filename}); "
                "make it writable or pass --store PATH") from None
        if self.settings.store_recover:
            moved = ResultStore.recover(path)
            if moved is not None:
                self.state.say(f"satbench: the results store was corrupt; moved aside to {moved}, starting a new one")
        try:
            ResultStore.check_writable(path)
        except StoreError as exc:
            raise pytest.UsageError(f"satbench: {exc}") from None

    # ------------------------------------------------------------------ the runtime
    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Any:
        state = self.state
        items = [i for i in session.items if isinstance(i, QuestionItem)]
        if items and not state.is_controller() and not session.config.option.collectonly:
            state.planned = dict(Counter(i.question.benchmark for i in items))
            upcoming = self._upcoming(session, items)
            seq = self._sequential()
            if seq is not None:  # --precision / --margin: images numbered in the order they run
                from pytest_satbench.plugin.xdist import queued_for

                s = self.settings
                seq.start(items, queued_for(s.concurrency, 1 if s.builtin_server else len(s.servers)))
                upcoming = seq.gate(upcoming, self._stopped.is_set)
            self._start(upcoming, session)
        try:
            return (yield)
        except KeyboardInterrupt as exc:
            if type(exc) is KeyboardInterrupt and state.signals is not None:  # Ctrl-C or SIGTERM, not a stop
                state.signals.interrupted()
                if self._runtime is not None:
                    state.signals.drain(self._runtime)  # keeps what is in flight, for seconds at most
                if state.is_worker:
                    # an xdist worker ends as a run this plugin stopped: its controller then ends the
                    # run cleanly (a worker that exits interrupted counts as crashed and is replaced)
                    session.shouldstop = state.signals.line()
                    return True
            raise
        finally:
            if state.signals is not None:
                state.signals.finishing = True
            self._stopped.set()
            if self._runtime is not None:
                self._runtime.close()

    def _start(self, upcoming: Iterator[QuestionItem] | None, session: pytest.Session | None) -> Runtime | None:
        """The started runtime; None when the store failed at the run's first write (the run is
        stopped, exit 7: `pytest_runtest_protocol` then asks nothing)."""
        from pytest_satbench.engine.runtime import Runtime, StartError
        from pytest_satbench.engine.store import StoreError

        try:
            self._runtime = Runtime.start(self._runtime_config(), upcoming)
        except StartError as exc:
            self.state.start_failed = True  # nothing was attempted: no item counts as never reached
            raise pytest.UsageError(f"satbench: {exc}") from None
        except StoreError as exc:
            # The store opened (the start's check wrote to it) and then failed at the run's first
            # write (`start_run`): deleted, its folder removed or made read-only in between. As a
            # store that fails mid-run: one line, exit 7, every item never reached (--lf reruns them).
            self.state.stop(session, STORE_FAILED_EXIT, str(exc))
            return None
        if not self.state.is_worker:
            for line in self._runtime.notices:
                self.state.say(f"satbench: {line}")
        return self._runtime

    def _sequential(self) -> Any:
        """The --precision/--margin plugin object (plugin/sequential.py), None without a rule:
        looked up once (it is registered at configure), not per item."""
        if self._seq_plugin is _UNSET:
            from pytest_satbench.plugin.sequential import SEQUENTIAL_KEY

            self._seq_plugin = self.state.config.stash.get(SEQUENTIAL_KEY, None)
        return self._seq_plugin

    def _runtime_config(self) -> RuntimeConfig:
        from pytest_satbench.engine.config import RuntimeConfig

        state, s = self.state, self.settings
        workerinput: dict[str, Any] = getattr(state.config, "workerinput", {})
        urls: tuple[str, ...] = s.servers
        if s.builtin_server:
            url = workerinput.get("satbench_builtin_url") or self.builtin_server().url
            urls = (url,)
        # --concurrency's caps are for the whole run: xdist workers share them
        workers = int(workerinput.get("workercount", 1) or 1)
        # each option names the field it fills (`Option.config`); the rest is this run's
        given = {opt.config: getattr(s, opt.settings_fields[0]) for opt in OPTIONS if opt.config}
        cache_bytes = os.environ.get("SATBENCH_RECON_CACHE_BYTES")
        bytes_given: dict[str, Any] = {"recon_cache_bytes": int(cache_bytes)} if cache_bytes else {}
        return RuntimeConfig(
            **given,
            run_id=state.run_id, tag=s.tag, urls=urls, store_path=state.store_path,
            recon_cache_dir=state.cache_dir("satbench-recon"),
            **bytes_given,
            arms=s.arms, concurrency=s.concurrency.split(workers), api_key=s.api_key,
            judge_url=s.judge_url, judge_model=s.judge_model, on_server_state=self._server_state,
            repeat_keys=frozenset(state.repeat_keys), score_views=dict(state.score_views),
            process=str(workerinput.get("workerid", "main")),
            command=("pytest", *state.config.invocation_params.args),
            servers_shown=("builtin reference server",) if s.builtin_server else (),
            servers_file=s.servers_file, say_midrun=self._say_midrun,
            dataset_hashes=state.dataset_hashes, planned=state.planned,
            order={"kind": "random", "seed": s.seed} if s.asking_order == "random" else {"kind": s.asking_order},
            sequential=seq.protocol() if (seq := self._sequential()) is not None else {},
            shard=self._shard_protocol(),
        )

    def _shard_protocol(self) -> dict[str, Any] | None:
        """--shard I/N as protocol.json records it (None: no --shard): per benchmark the complete
        benchmark's questions and images, this shard's (both before -k), and the questions this
        run selected (its `planned`: after -k, --lf, --deselect)."""
        from pytest_satbench.datasets.selection import SHARD_SCHEME

        shard, state = self.settings.shard, self.state
        if shard is None:
            return None
        return {"index": shard[0], "count": shard[1], "scheme": SHARD_SCHEME,
                "benchmarks": {b: {**counts, "planned": state.planned.get(b, 0)} for b, counts in state.shards.items()}}

    def _upcoming(self, session: pytest.Session, items: list[QuestionItem]) -> Iterator[QuestionItem]:
        """The question items this process will run, in order, for the look-ahead: under
        xdist the ones the controller has sent this worker so far."""
        from pytest_satbench.plugin.xdist import worker_upcoming_items

        upcoming = worker_upcoming_items(self.state.config, session, items, self._stopped.is_set)
        return iter(items) if upcoming is None else upcoming

    def runtime(self, session: pytest.Session | None = None) -> Runtime:
        """The engine, started on first use (the public fixtures use this)."""
        if self._runtime is None and self.state.stopped is None:
            self._start(None, session)
        if self._runtime is None:  # the store failed as it started (now or for an earlier test): its one line
            assert self.state.stopped is not None
            pytest.fail(self.state.stopped[1], pytrace=False)
        return self._runtime

    def builtin_server(self) -> RunningServer:
        if self._builtin is None:
            from pytest_satbench.server import start_server

            self._builtin = start_server()
        return self._builtin

    def _server_state(self, server: str, up: bool, reason: str) -> None:
        # called on a request thread: the line is written by pytest's thread (`say_server_states`)
        self._server_lines.put(f"satbench: server {server} is {'back' if up else 'DOWN'}: {reason}")

    def _say_midrun(self, line: str) -> None:
        # any line said mid-run (a --servers @FILE change: engine/fleetfile.py, the pool's joins
        # and leaves; a distortion not measured: engine/images.py), from any thread: as above
        self._server_lines.put(f"satbench: {line}")

    def _drain_server_lines(self) -> list[str]:
        lines = []
        while True:
            try:
                lines.append(self._server_lines.get_nowait())
            except queue.Empty:
                return lines

    def say_server_states(self) -> None:
        for line in self._drain_server_lines():
            self.state.say(line)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # the lines travel on the report, so an xdist worker's reach the controller's terminal
        for line in getattr(report, "satbench_lines", None) or ():
            if line.startswith("satbench: --servers @"):
                # every xdist worker follows the file and says the same change: once is enough
                now = time.monotonic()
                if now - self._fleet_said.get(line, -math.inf) < FLEET_LINE_REPEAT_S:
                    continue
                self._fleet_said[line] = now
            self.state.say(line)

    # ------------------------------------------------------------------ one item
    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        if isinstance(item, QuestionItem) and self._runtime is None and self.state.stopped is not None:
            return True  # the run stopped as its runtime started: nothing is asked, pytest stops after this item
        if isinstance(item, QuestionItem) and self._runtime is not None:
            if self._compat is None:  # (a runtime has servers, so this is not expected)
                return run_question_item(item, nextitem)
            if self._compat.lean:
                return run_question_item(item, nextitem, phases_made=self._compat.phases_made)
        return None  # pytest's own runtest (for question items: a plugin needs it, plugin/compat.py)

    def run_item(self, item: QuestionItem) -> None:
        from pytest_satbench.core.verdict import question_record
        from pytest_satbench.engine.runtime import GaveUp
        from pytest_satbench.engine.store import StoreError

        state = self.state
        assert self._runtime is not None, "satbench runtime not started"
        seq = self._sequential()
        if seq is not None:
            not_needed = seq.skip_reason(item, lambda: state.stopped is not None or state.interrupted)
            if not_needed is not None:  # --precision/--margin was met: reported as skipped, never asked
                pytest.skip(not_needed)
        try:
            result = self._runtime.result(item, give_up_after=self.settings.give_up_after)
        except GaveUp as exc:  # the wait itself is abandoned: a rerun asks this item again
            state.stop(item.session, SERVERS_GONE_EXIT, str(exc))
            self._outcomes[item.nodeid] = _outcomes().ERROR
            raise QuestionFailed(str(exc)) from None
        if seq is not None:
            # an arm with no answer counts as wrong, as in every figure (core/early_stop.py)
            record = result.record
            got = seq.item_seq(item, [record is not None and record.correct(a) for a in seq.arms])
            if got is not None:
                self._seq[item.nodeid] = got
        try:
            self._runtime.store.record_item(
                state.run_id, item.nodeid, item.question.benchmark,
                question_record(item.question, result.prompt, result.sent_size), result.fingerprints,
            )
        except StoreError:
            pass  # reported below through `failure`
        failure = self._runtime.store.failure
        if failure is not None:
            # Nothing more is asked: every answer would be thrown away. A rerun resumes.
            state.stop(item.session, STORE_FAILED_EXIT, str(failure))
            self._outcomes[item.nodeid] = _outcomes().ERROR
            raise QuestionFailed(str(failure))
        gave_up = self._runtime.doomed(self.settings.give_up_after)
        if gave_up is not None:
            state.stop(item.session, SERVERS_GONE_EXIT, gave_up)
        swap = self._runtime.pool.model_swap()
        if swap is not None:
            server, other = swap
            state.stop(item.session, MODEL_SWAPPED_EXIT, (
                f"server {server} answered as model {other!r}, not {self._runtime.model!r}: the servers changed under "
                f"this run; stopped asking. Measure {other!r} under another --tag (--model {other}), or pass "
                f"--allow-model-alias {other} if it is the same model"
            ))
        out = _outcomes()
        outcome = out.classify(result)
        self._outcomes[item.nodeid] = outcome
        if result.record is not None and self._compat is not None:
            item.satbench_arms = result.record.arm_verdicts()  # its properties (plugin/compat.py)
        if outcome == out.ERROR:
            raise QuestionFailed(out.failure_message(result))
        if outcome == out.REGRESSED and self.settings.fail_on == "regression":
            assert result.record is not None
            raise QuestionFailed(out.regression_message(result.record))

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
            seq = self._seq.pop(item.nodeid, None)
            if seq is not None:
                rep.satbench_seq = seq  # for the stopping rule, on this process or the xdist controller
            lines = self._drain_server_lines()
            if lines:
                rep.satbench_lines = lines
        elif call.when == "teardown" and isinstance(item, QuestionItem) and self._compat is not None:
            self._compat.end_item(item)
        return rep

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report: pytest.TestReport, config: pytest.Config) -> Any:
        outcome = getattr(report, "satbench_outcome", None)
        if outcome is None or report.when != "call" or report.outcome == "rerun":
            return None  # (a try pytest-rerunfailures runs again is its "rerun")
        return _outcomes().teststatus(outcome, report.failed)

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        s = self.settings
        if not self.state.with_servers:
            return []
        from pytest_satbench.core.arms import BLIND, ORIG
        from pytest_satbench.engine.store import network_store_warning

        servers = "builtin reference server" if s.builtin_server else ", ".join(s.servers)
        arms = ", ".join([ORIG] + [a.canonical for a in s.arms] + ([BLIND] if s.blind else []))
        root: Path | str = (f"{s.data_root} ({s.data_root_source})" if s.data_root
                            else "not set (the demo needs none; the others: --data-root or $SATBENCH_DATA_ROOT)")
        lines = [f"satbench: servers: {servers}; arms: {arms}; data root: {root}; prompt style: {s.prompt_style}"]
        warning = network_store_warning(self.state.store_path)
        if warning:
            lines.append(f"satbench: WARNING: {warning}")
        return lines

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._builtin is not None:
            self._builtin.close()


_UNSET = object()
_OUTCOMES: list[Any] = []


def _outcomes() -> Any:
    """plugin/outcomes.py, loaded with the first question item (it reads core.verdict, which
    a pytest run without benchmark items never needs: not at every start-up)."""
    if not _OUTCOMES:
        from pytest_satbench.plugin import outcomes

        _OUTCOMES.append(outcomes)
    return _OUTCOMES[0]
