"""The live progress line: answered / total, rate, elapsed, ETA, load per server, errors.

(Just over 500 lines: the line's text and the xdist snapshots it is summed from change together.)

    satbench: 12,345/222,684 answered (5.5%) · 41.2 q/s · 5m12s elapsed · ETA 1h25m ·
      in flight gpu1:8000 230/256, gpu2:8000 DOWN · 3 errors, 12 retries

(one line). pytest's dots and its integer percentage say nothing useful in a 20-hour run: at
RSVQA-HR size 1% is 2,200 items, about 12 minutes. This line says how far, how fast, how long
still, and whether a server is in trouble.

Where it is written (`plugin/terminal.py` does the writing):

- on a terminal, on a line of its own under pytest's current line, rewritten in place at most
  once a second; pytest's dots and -v lines are never touched (see `terminal.StatusLine`);
  it is gone before pytest writes its summary;
- otherwise (CI logs, SLURM output files) as a plain line every `--progress-every` seconds
  (default 60); `--progress-every 0` turns the line off in both cases.

When it is refreshed: from pytest's own thread, in `pytest_runtest_logreport`, after a
time check (one `time.monotonic()` per report, `ProgressPlugin.tick`): no thread of its own
ever writes to the terminal, and nothing is written while an item's output is being
captured (question items have no capture; your own items run with the line erased). While
pytest's thread waits for a slow item there is no report: the line stands still unless the
session calls its `wait_listeners` each second of the wait (then `tick` runs there too).

Under xdist only the controller writes: it counts the outcomes on the reports it receives,
and each worker attaches a small snapshot of its servers' load to at most one report a
second (`satbench_progress`: its id, the number of question items, its retries so far and per
server up, in flight, limit and whether it is leaving the fleet), which the controller sums
per server.

Counts never go down: the retries are the pool's `totals()`, which keep a server removed from
`--servers @FILE` (shown `leaving` until its requests in flight finish), and the controller
keeps a finished worker's retries.

The numbers are made by pure functions of a `Progress` record (`format_progress`), so they
are tested directly; the rate is over the last minute (`RateWindow`), the ETA from that rate.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_satbench.plugin.terminal import StatusLine

NAME = "satbench-progress"
FLAG = "--progress-every"
TTY_REFRESH_S = 1.0  # on a terminal: at most one refresh a second
SAMPLE_S = 1.0  # the rate window takes at most one sample a second
RATE_WINDOW_S = 60.0  # the rate is over the last minute
SNAPSHOT_S = 1.0  # an xdist worker attaches its servers' load to at most one report a second
MAX_LISTED_SERVERS = 4  # more servers than this are summed on the line, the down ones named
ERROR = "error"  # plugin/outcomes.py's outcome of an item whose answer failed
REPORT_ATTR = "satbench_progress"


# ---------------------------------------------------------------------- the numbers (pure)
@dataclass(frozen=True)
class ServerShare:
    """One server's load as the line shows it (summed over xdist workers)."""

    name: str  # as shown: the URL without its scheme, e.g. gpu1:8000
    up: bool
    in_flight: int
    limit: int
    leaving: bool = False  # removed from the fleet, its requests in flight finishing


@dataclass(frozen=True)
class Progress:
    """Everything the line shows, at one moment."""

    answered: int  # question items done with an answer
    total: int  # question items this run runs (0: not known yet)
    elapsed_s: float
    rate: float | None  # items done per second over the last minute; None: not known yet
    errors: int = 0  # question items that failed (no answer after retries)
    retries: int = 0  # requests retried, all servers the run has had (those that left too)
    servers: tuple[ServerShare, ...] = ()  # empty: not known (no snapshot yet)
    # --precision / --margin: the benchmark being asked, its first reconstruction arm's running
    # delta with the sequence's half-width and the images until the rule is met
    sequential: str = ""

    @property
    def remaining(self) -> int:
        return max(0, self.total - self.answered - self.errors)

    @property
    def eta_s(self) -> float | None:
        if self.total <= 0:
            return None
        if self.remaining == 0:
            return 0.0
        if not self.rate:  # unknown, or nothing done in the last minute
            return None
        return self.remaining / self.rate


def format_count(n: int) -> str:
    return f"{n:,}"


def format_duration(seconds: float) -> str:
    """42s, 5m12s, 1h24m, 2d03h: two units at most, the larger first."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def format_rate(rate: float | None) -> str:
    if rate is None:
        return "-- q/s"
    if rate >= 100:
        return f"{rate:,.0f} q/s"
    if rate >= 10:
        return f"{rate:.1f} q/s"
    return f"{rate:.2f} q/s"


def format_servers(servers: Sequence[ServerShare], *, compact: bool = False) -> str:
    """Per server `name in_flight/limit`, `name DOWN` or `name N leaving` (removed, its last
    requests finishing); summed past MAX_LISTED_SERVERS servers (or when `compact`), the
    down ones still named, the leaving ones in the requests in flight only."""
    if not servers:
        return ""
    if len(servers) <= MAX_LISTED_SERVERS and not compact:
        return "in flight " + ", ".join(
            f"{s.name} {s.in_flight:,} leaving" if s.leaving
            else f"{s.name} {s.in_flight:,}/{s.limit:,}" if s.up else f"{s.name} DOWN" for s in servers
        )
    in_flight = sum(s.in_flight for s in servers)
    fleet = [s for s in servers if not s.leaving]
    limit = sum(s.limit for s in fleet if s.up)
    down = [s.name for s in fleet if not s.up]
    text = f"in flight {in_flight:,}/{limit:,}" + (f" on {len(fleet)} servers" if len(fleet) > 1 else "")
    if down:
        shown = ", ".join(down[:MAX_LISTED_SERVERS]) + (", ..." if len(down) > MAX_LISTED_SERVERS else "")
        text += f", {len(down)} DOWN ({shown})"
    return text


def format_progress(p: Progress, sep: str = " · ", width: int | None = None) -> str:
    """The line, e.g. `satbench: 12,345/222,684 answered (5.5%) · 41.2 q/s · 5m12s elapsed ·
    ETA 1h24m · in flight gpu1:8000 230/256, gpu2:8000 DOWN · 3 errors, 12 retries`.

    `sep`: the separator (" | " where the terminal cannot encode the middle dot). `width`:
    the most characters the line may take (a terminal's row): what matters least goes
    first, elapsed time, then the per-server detail (summed, then only the down servers,
    then only how many are down); then the end is cut."""
    if p.total > 0:
        head = f"{format_count(p.answered)}/{format_count(p.total)} answered ({100 * p.answered / p.total:.1f}%)"
    else:
        head = f"{format_count(p.answered)} answered"
    eta = p.eta_s
    trouble = []
    if p.errors:
        trouble.append(f"{p.errors:,} error{'s' if p.errors != 1 else ''}")
    if p.retries:
        trouble.append(f"{p.retries:,} retr{'ies' if p.retries != 1 else 'y'}")
    elapsed = f"{format_duration(p.elapsed_s)} elapsed"
    servers = format_servers(p.servers)

    def line(elapsed: str, servers: str) -> str:
        # the ETA rounded up: "ETA 0s" only when nothing is left
        parts = [head, format_rate(p.rate), elapsed,
                 "ETA unknown" if eta is None else f"ETA {format_duration(math.ceil(eta))}",
                 p.sequential, servers, ", ".join(trouble)]
        return "satbench: " + sep.join(x for x in parts if x)

    text = line(elapsed, servers)
    if width is None or len(text) <= width:
        return text
    down = [s.name for s in p.servers if not s.up and not s.leaving]
    for shorter in (line("", servers), line("", format_servers(p.servers, compact=True)),
                    line("", ", ".join(down) + " DOWN" if down else ""),
                    line("", f"{len(down)} server{'s' if len(down) != 1 else ''} DOWN" if down else "")):
        if len(shorter) <= width:
            return shorter
    return shorter[:width]


def server_name(url: str) -> str:
    """How the line names a server: its URL without the scheme (credentials are already
    gone: the pool names servers by their displayed URL)."""
    return url.split("://", 1)[-1].rstrip("/")


@dataclass
class RateWindow:
    """Items done per second over the last `span_s` seconds, from (time, done) samples."""

    span_s: float = RATE_WINDOW_S
    samples: deque[tuple[float, int]] = field(default_factory=deque)

    def add(self, t: float, done: int) -> None:
        self.samples.append((t, done))
        # keep the newest sample at least `span_s` old, so the window spans a full minute
        while len(self.samples) > 2 and t - self.samples[1][0] >= self.span_s:
            self.samples.popleft()

    def rate(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        if t1 - t0 < SAMPLE_S / 2:
            return None
        return (d1 - d0) / (t1 - t0)


# snapshot rows as they travel on a report: [server, up, in flight, limit, leaving]
Row = Sequence[Any]


def merge_rows(snapshots: Iterable[Sequence[Row]]) -> tuple[ServerShare, ...]:
    """Per server, summed over workers. A server is DOWN when any worker has it marked down,
    leaving when every worker that lists it has it leaving; servers keep the order the first
    snapshot lists them in. Load only: the counters travel as totals (`pool_retries`)."""
    merged: dict[str, list[Any]] = {}
    for rows in snapshots:
        for name, up, in_flight, limit, leaving in rows:
            m = merged.setdefault(name, [True, 0, 0, True])
            m[0] = m[0] and bool(up)
            m[1] += int(in_flight)
            m[2] += 0 if leaving else int(limit)  # a leaving server has no room on that worker
            m[3] = m[3] and bool(leaving)
    return tuple(ServerShare(server_name(n), up, f, lim, gone) for n, (up, f, lim, gone) in merged.items())


def pool_rows(pool: Any) -> list[list[Any]]:
    """The pool's load now (`ServerPool.loads()`, cheap and thread-safe), as rows."""
    loads = getattr(pool, "loads", None)
    if loads is None:
        return []
    return [[s.server, bool(s.up), int(s.in_flight), int(s.limit), bool(s.leaving)] for s in loads()]


def pool_retries(pool: Any) -> int:
    """The pool's retries so far over every server it has had, those that left the fleet
    too (`ServerPool.totals()`): never less than a moment before."""
    totals = getattr(pool, "totals", None)
    return int(totals().retries) if totals is not None else 0


# ---------------------------------------------------------------------- the plugin
def progress_every(config: pytest.Config) -> int:
    """--progress-every's validated value (parsed by the option table's row)."""
    from pytest_satbench.plugin.options import OPTIONS, _value

    return int(_value(config, next(o for o in OPTIONS if o.flag == FLAG)))


def register(config: pytest.Config) -> None:
    """Called from the entry point's pytest_configure where servers are configured: the line
    on the process that writes (the only one, or an xdist controller), the snapshots on
    xdist workers. Each object has only the hooks its side needs: every hook costs a call
    per item."""
    if config.option.collectonly:
        return
    every = progress_every(config)
    if every <= 0:  # --progress-every 0: off, on workers too (no snapshots)
        return
    if hasattr(config, "workerinput"):
        config.pluginmanager.register(WorkerSnapshots(config), NAME)
    else:
        config.pluginmanager.register(ProgressPlugin(config, every), NAME)


def _question_items(session: pytest.Session) -> int:
    from pytest_satbench.plugin.items import QuestionItem

    return sum(isinstance(i, QuestionItem) for i in session.items)


def _runtime(config: pytest.Config) -> Any:
    """The session's engine, read only: None until it started (this never starts it)."""
    from pytest_satbench.plugin.items import SESSION_KEY

    return getattr(config.stash.get(SESSION_KEY, None), "_runtime", None)


class WorkerSnapshots:
    """On an xdist worker: attaches its servers' load to at most one call report a second."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.total = 0
        self.worker = str(getattr(config, "workerinput", {}).get("workerid", ""))
        self._next = 0.0  # the first question's report carries one: the controller learns the total

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.total = _question_items(session)  # every worker collects every item

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        rep = yield
        if call.when == "call":
            now = time.monotonic()
            if now >= self._next:
                from pytest_satbench.plugin.items import QuestionItem

                if isinstance(item, QuestionItem):
                    self._next = now + SNAPSHOT_S
                    setattr(rep, REPORT_ATTR, self.snapshot())
        return rep

    def snapshot(self) -> dict[str, Any]:
        runtime = _runtime(self.config)
        rows = pool_rows(runtime.pool) if runtime is not None else []
        retries = pool_retries(runtime.pool) if runtime is not None else 0
        # plain lists and numbers: execnet serialises them with the report
        return {"worker": self.worker, "total": self.total, "servers": rows, "retries": retries}


class ProgressPlugin:
    """Counts, samples and writes the line (the only process, or the xdist controller)."""

    def __init__(self, config: pytest.Config, every_s: int) -> None:
        self.config = config
        self.every_s = float(every_s)
        self.total = 0
        self.answered = 0
        self.errors = 0
        self.started: float | None = None
        self.window = RateWindow()
        self._next_sample = 0.0
        self._next_write = 0.0
        self._snapshots: dict[str, dict[str, Any]] = {}  # xdist controller: worker id -> its last
        self._retries: dict[str, int] = {}  # xdist controller: worker id -> its last, kept after it ends
        self._total_seen = 0  # xdist controller: the workers' total, once every worker finished
        self._line: StatusLine | None = None  # on a terminal
        self._pause: PauseForOwnItems | None = None
        self._reporter: Any = None  # None: nothing is written

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.total = _question_items(session)  # 0 on an xdist controller: the workers collect

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Any:
        self.started = time.monotonic()
        self._start_writing()
        try:
            return (yield)
        finally:
            self._stop_writing()

    def _start_writing(self) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        controller = self.config.pluginmanager.get_plugin("dsession") is not None
        if not controller and self.total == 0:
            return  # no question item runs here
        self._reporter = reporter
        assert self.started is not None
        self.window.add(self.started, 0)
        self._next_sample = self.started + SAMPLE_S
        from pytest_satbench.plugin import terminal
        from pytest_satbench.plugin.items import SESSION_KEY

        listeners = getattr(self.config.stash.get(SESSION_KEY, None), "wait_listeners", None)
        if isinstance(listeners, list) and self.tick not in listeners:
            listeners.append(self.tick)
        if terminal.can_rewrite(reporter):
            self._line = terminal.StatusLine(reporter._tw)
            self._next_write = self.started  # shown at the first report
            if not controller:
                self._pause = PauseForOwnItems(self._line)
                self.config.pluginmanager.register(self._pause, NAME + "-pause")
        else:
            self._next_write = self.started + self.every_s

    def _stop_writing(self) -> None:
        if self._pause is not None:
            self.config.pluginmanager.unregister(self._pause)
            self._pause = None
        if self._line is not None:
            self._line.close()  # erased: pytest's summary follows
            self._line = None
        self._reporter = None

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self._reporter is None:
            return
        if report.when == "call":
            outcome = getattr(report, "satbench_outcome", None)
            if outcome is not None:
                if outcome == ERROR:
                    self.errors += 1
                else:
                    self.answered += 1
            snapshot = getattr(report, REPORT_ATTR, None)
            if snapshot is not None:
                worker = str(snapshot.get("worker", ""))
                self._snapshots[worker] = snapshot
                self._retries[worker] = max(self._retries.get(worker, 0), int(snapshot.get("retries", 0)))
        self.tick()

    def tick(self) -> None:
        """The time check: samples the rate and writes the line when due. Called by every
        report, on pytest's thread; and, where the session offers it (`wait_listeners`),
        every second while pytest's thread waits for an item's answers, so the line (its
        elapsed time, a server marked down) stays live through a stall."""
        if self._reporter is None:
            return
        now = time.monotonic()  # the whole cost of a report between refreshes
        if now >= self._next_sample:
            self._sample(now)
        if now >= self._next_write and not (self._pause is not None and self._pause.paused):
            self._write(now)

    def _sample(self, now: float) -> None:
        self._next_sample = now + SAMPLE_S
        self.window.add(now, self.answered + self.errors)

    def _write(self, now: float) -> None:
        from pytest_satbench.plugin import terminal

        self._next_write = now + (TTY_REFRESH_S if self._line is not None else self.every_s)
        progress = self.progress(now)
        if progress.total == 0 and self.answered + self.errors == 0:
            return  # an xdist controller before its first question report: nothing to say yet
        sep = terminal.separator(self._reporter._tw)
        if self._line is not None:
            self._line.show(format_progress(progress, sep, width=self._line.columns() - 1))
        else:
            terminal.write_plain_line(self._reporter, format_progress(progress, sep))

    def progress(self, now: float) -> Progress:
        assert self.started is not None
        total = self.total
        if self._retries:  # xdist: the controller collected nothing; the workers know
            total = max((int(s.get("total", 0)) for s in self._snapshots.values()), default=self._total_seen)
            self._total_seen = total
            servers = merge_rows(s.get("servers", ()) for s in self._snapshots.values())
            retries = sum(self._retries.values())  # finished workers too
        else:
            runtime = _runtime(self.config)
            servers = merge_rows([pool_rows(runtime.pool)]) if runtime is not None else ()
            retries = pool_retries(runtime.pool) if runtime is not None else 0
        return Progress(answered=self.answered, total=total, elapsed_s=now - self.started,
                        rate=self.window.rate(), errors=self.errors, retries=retries, servers=servers,
                        sequential=self._sequential())

    def _sequential(self) -> str:
        from pytest_satbench.plugin.sequential import SEQUENTIAL_KEY

        seq = self.config.stash.get(SEQUENTIAL_KEY, None)
        return seq.progress() if seq is not None else ""

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        # a finished worker's last snapshot would keep its requests in flight on the line;
        # its retries stay in the total (`_retries`)
        self._snapshots.pop(str(getattr(getattr(node, "gateway", None), "id", "")), None)

    @pytest.hookimpl(tryfirst=True)
    def pytest_exception_interact(self, node: Any, call: Any, report: Any) -> None:
        # --pdb: the debugger owns the terminal until the next draw
        if self._line is not None:
            self._line.hide()

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self._stop_writing()  # also when the loop never ran to its end

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self._stop_writing()


class PauseForOwnItems:
    """On a terminal, in a run that is not distributed: items with pytest's own runtest
    (your tests in the same run) may print under -s or log to the terminal while they run,
    past pytest's writer; the line is erased for them and drawn again after. Registered only
    while the line is shown: a hook wrapper costs a call per item."""

    def __init__(self, line: StatusLine) -> None:
        self.line = line
        self.paused = False

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        from pytest_satbench.plugin.items import QuestionItem

        if isinstance(item, QuestionItem):
            return (yield)
        self.paused = True
        self.line.hide()
        try:
            return (yield)
        finally:
            self.paused = False
            self.line.redraw()
