"""The live progress line (plugin/progress.py, plugin/terminal.py).

Its numbers from given figures (`format_progress` is a pure function of a `Progress`), and
real pytest runs against slow loopback servers (FakeVLM with a delay per answer, so a run
lasts a few seconds whatever the machine): the plain line in a log, the line from an xdist
controller, a server going down, the off switch, and the line rewritten in place on a
pseudo-terminal, whose output is replayed through a small VT100 emulator to the screen a
user would see: pytest's own lines must come out exactly as without the line.

No assertion is timed beyond "at least one line appeared": on a terminal the line is drawn
at the first report; in a log every second (`--progress-every 1`) of a run that the server's
delay keeps longer than that.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from datasets_fake import rsvqa_suite
from servers import Fail, FakeVLM

from pytest_satbench.engine.client import ServerPool
from pytest_satbench.plugin.progress import (
    Progress,
    ProgressPlugin,
    RateWindow,
    ServerShare,
    format_duration,
    format_progress,
    format_rate,
    format_servers,
    merge_rows,
    pool_retries,
    pool_rows,
    server_name,
)

BENCH_MODULE = """
from pytest_satbench import benchmark_test
test_rsvqa_lr = benchmark_test("rsvqa_lr")
"""
N_IMAGES, PER_TYPE = 3, 4
N = N_IMAGES * 4 * PER_TYPE  # 48 questions; at 2 in flight and 0.1 s each, 2.4 s at least
DELAY = 0.1
SERVERS_PY = Path(__file__).resolve().parents[1] / "servers.py"
# a plain progress line, as a log gets it
LOG_LINE = re.compile(rf"^satbench: (\d+)/{N} answered \(\d+\.\d%\) · [\d.,-]+ q/s · \S+ elapsed · ETA \S+")


def yes(prompt: str, has_image: bool, image: object) -> str:
    return "yes"


# ---------------------------------------------------------------------- the numbers
def test_the_line_of_given_numbers() -> None:
    p = Progress(answered=12_345, total=222_684, elapsed_s=312, rate=41.2, errors=3, retries=12,
                 servers=(ServerShare("gpu1:8000", True, 230, 256), ServerShare("gpu2:8000", True, 198, 256)))
    assert format_progress(p) == (
        "satbench: 12,345/222,684 answered (5.5%) · 41.2 q/s · 5m12s elapsed · ETA 1h25m · "
        "in flight gpu1:8000 230/256, gpu2:8000 198/256 · 3 errors, 12 retries"
    )
    # 210,336 left at 41.2/s: 5,105 s
    assert p.remaining == 222_684 - 12_345 - 3 and round(p.eta_s or 0) == 5105
    assert format_progress(p, sep=" | ").startswith("satbench: 12,345/222,684 answered (5.5%) | 41.2 q/s | ")


def test_a_down_server_and_an_unknown_eta() -> None:
    p = Progress(answered=0, total=400, elapsed_s=0.4, rate=None,
                 servers=(ServerShare("gpu1:8000", True, 64, 64), ServerShare("gpu2:8000", False, 0, 64)))
    assert format_progress(p) == (
        "satbench: 0/400 answered (0.0%) · -- q/s · 0s elapsed · ETA unknown · in flight gpu1:8000 64/64, gpu2:8000 DOWN"
    )
    # nothing done in the last minute: the rate is 0 and the ETA unknown, not infinite
    stalled = Progress(answered=10, total=400, elapsed_s=3_700, rate=0.0, errors=1, retries=1)
    assert format_progress(stalled) == (
        "satbench: 10/400 answered (2.5%) · 0.00 q/s · 1h01m elapsed · ETA unknown · 1 error, 1 retry"
    )
    done = Progress(answered=399, total=400, elapsed_s=10, rate=None, errors=1)
    assert done.eta_s == 0.0 and "ETA 0s" in format_progress(done)
    # an xdist controller before any worker said how many items there are
    assert format_progress(Progress(answered=7, total=0, elapsed_s=2, rate=3.5)) == (
        "satbench: 7 answered · 3.50 q/s · 2s elapsed · ETA unknown"
    )


def test_many_servers_are_summed_with_the_down_ones_named() -> None:
    servers = tuple(ServerShare(f"gpu{i}:8000", i != 3, 0 if i == 3 else 100, 128) for i in range(1, 9))
    line = format_progress(Progress(answered=5, total=10, elapsed_s=1, rate=5.0, servers=servers))
    assert line.endswith("· in flight 700/896 on 8 servers, 1 DOWN (gpu3:8000)"), line


def test_the_line_fits_a_terminal_row_dropping_what_matters_least() -> None:
    p = Progress(answered=12_345, total=222_684, elapsed_s=312, rate=41.2, errors=3, retries=12,
                 servers=(ServerShare("gpu1:8000", True, 230, 256), ServerShare("gpu2:8000", False, 0, 256)))
    full = format_progress(p)
    assert format_progress(p, width=len(full)) == full
    no_elapsed = format_progress(p, width=len(full) - 1)
    assert "elapsed" not in no_elapsed and "gpu1:8000 230/256" in no_elapsed
    # narrower: only the down server named, then only counted, then the end is cut
    down_named = format_progress(p, width=len(no_elapsed) - 1)
    assert down_named.endswith("ETA 1h25m · gpu2:8000 DOWN · 3 errors, 12 retries"), down_named
    counted = format_progress(p, width=len(down_named) - 1)
    assert counted.endswith("ETA 1h25m · 1 server DOWN · 3 errors, 12 retries"), counted
    for width in (len(counted) - 1, 80, 40):
        assert format_progress(p, width=width) == counted[:width]
    # many servers: summed before the down ones alone
    many = Progress(answered=1, total=2, elapsed_s=1, rate=1.0,
                    servers=tuple(ServerShare(f"gpu{i}:8000", i != 3, 10, 16) for i in range(1, 4)))
    listed = format_progress(many)
    summed = format_progress(many, width=len(listed) - len(" · 1s elapsed") - 1)
    assert summed.endswith("ETA 1s · in flight 30/32 on 3 servers, 1 DOWN (gpu3:8000)"), summed


def test_durations_rates_and_server_names() -> None:
    assert [format_duration(s) for s in (0, 59.4, 60, 312, 3599, 3600, 5105, 86399, 86400, 200_000)] == [
        "0s", "59s", "1m00s", "5m12s", "59m59s", "1h00m", "1h25m", "23h59m", "1d00h", "2d07h"]
    assert [format_rate(r) for r in (None, 0.0, 4.567, 41.24, 741.4, 12_345.6)] == [
        "-- q/s", "0.00 q/s", "4.57 q/s", "41.2 q/s", "741 q/s", "12,346 q/s"]
    assert server_name("http://gpu1:8000") == "gpu1:8000"
    assert server_name("https://api.example.com/openai/") == "api.example.com/openai"


def test_the_rate_is_over_the_last_minute() -> None:
    w = RateWindow()
    assert w.rate() is None
    w.add(0.0, 0)
    assert w.rate() is None  # one sample: no rate yet
    for t in range(1, 121):  # 10 a second for a minute, then 1 a second
        w.add(float(t), 10 * t if t <= 60 else 600 + (t - 60))
    assert w.rate() == pytest.approx(1.0)  # the last minute only
    assert len(w.samples) <= 62  # bounded: one sample a second over a minute


def test_worker_snapshots_are_summed_per_server() -> None:
    gw0 = [["http://gpu1:8000", True, 10, 32, False], ["http://gpu2:8000", True, 3, 32, False]]
    gw1 = [["http://gpu1:8000", True, 12, 32, False], ["http://gpu2:8000", False, 0, 32, False],
           ["http://gpu3:8000", True, 2, 32, True]]
    assert merge_rows([gw0, gw1]) == (ServerShare("gpu1:8000", True, 22, 64), ServerShare("gpu2:8000", False, 3, 64),
                                      ServerShare("gpu3:8000", True, 2, 0, leaving=True))


def test_a_server_leaving_the_fleet_is_marked_and_out_of_the_limit() -> None:
    shares = (ServerShare("gpu1:8000", True, 3, 8, leaving=True), ServerShare("gpu2:8000", True, 5, 8))
    p = Progress(answered=10, total=100, elapsed_s=5, rate=1.0, retries=2, servers=shares)
    assert "in flight gpu1:8000 3 leaving, gpu2:8000 5/8 · 2 retries" in format_progress(p)
    # summed: its requests still in flight, but no limit and not a server of the fleet
    assert format_servers(shares, compact=True) == "in flight 8/8"
    assert format_servers((*shares, ServerShare("gpu3:8000", False, 0, 8)), compact=True) == \
        "in flight 8/8 on 2 servers, 1 DOWN (gpu3:8000)"


def test_the_retries_of_a_server_that_left_the_fleet_stay_in_the_line() -> None:
    """The reported defect: the line's retries were summed over the servers in the fleet, so a
    server removed from --servers @FILE took its retries with it. Here a's first request
    fails (503, counted by request, no timing) and is retried on a: one retry; then a leaves
    and b serves. The line's retries stay 1, and a's counters stay in the pool's totals and
    in its usage (what the reports' traffic table is made from)."""
    with FakeVLM(models=["m"], fail_at={1: Fail.http(503)}) as a, FakeVLM(models=["m"]) as b, \
            ServerPool([a.url], retries=2, backoff_base=0.01, backoff_max=0.05) as pool:
        pool.resolve_model(None)
        assert pool.ask(model="m", prompt="q", image_jpeg=None, max_tokens=2).server == a.url
        assert a.chat_requests == 2 and pool_retries(pool) == 1
        assert [s.name for s in merge_rows([pool_rows(pool)])] == [server_name(a.url)]
        joined = threading.Event()
        pool.on_notice = lambda line: joined.set() if "joined" in line else None
        pool.set_servers([b.url])
        assert joined.wait(20) and pool.urls == [b.url]
        assert pool.ask(model="m", prompt="q2", image_jpeg=None, max_tokens=2).server == b.url
        assert [s.name for s in merge_rows([pool_rows(pool)])] == [server_name(b.url)]  # a is off the per-server part
        assert pool_retries(pool) == 1  # was 0: a's retry had left with it
        totals = pool.totals()
        assert (totals.requests, totals.answered, totals.failures, totals.retries) == (3, 2, 1, 1)
        usage = pool.usage()[a.url]
        assert (usage.requests, usage.answered, usage.failures, usage.retries) == (2, 1, 1, 1)


def test_under_xdist_a_finished_workers_retries_stay_in_the_total(pytester: pytest.Pytester) -> None:
    """The controller drops a finished worker's servers (nothing in flight there any more)
    but keeps the retries it counted."""
    plugin = ProgressPlugin(pytester.parseconfig(), 1)
    plugin.started, plugin._reporter, plugin._next_write = time.monotonic(), object(), float("inf")

    def report(worker: str, retries: int) -> SimpleNamespace:
        snap = {"worker": worker, "total": 10, "retries": retries,
                "servers": [["http://gpu1:8000", True, 1, 4, False]]}
        return SimpleNamespace(when="call", satbench_outcome="correct", satbench_progress=snap)

    plugin.pytest_runtest_logreport(report("gw0", 2))  # type: ignore[arg-type]
    plugin.pytest_runtest_logreport(report("gw1", 3))  # type: ignore[arg-type]
    before = plugin.progress(time.monotonic())
    assert before.retries == 5 and before.servers == (ServerShare("gpu1:8000", True, 2, 8),)
    plugin.pytest_testnodedown(SimpleNamespace(gateway=SimpleNamespace(id="gw0")), None)
    after = plugin.progress(time.monotonic())
    assert after.retries == 5 and after.total == 10 and after.servers == (ServerShare("gpu1:8000", True, 1, 4),)
    plugin.pytest_testnodedown(SimpleNamespace(gateway=SimpleNamespace(id="gw1")), None)
    assert plugin.progress(time.monotonic()).retries == 5


# ---------------------------------------------------------------------- runs, in a log
@pytest.fixture
def bench(pytester: pytest.Pytester) -> Path:
    pytester.makeini("[pytest]\n")
    return rsvqa_suite(pytester, BENCH_MODULE, n_images=N_IMAGES, per_type=PER_TYPE)


def args(url: str, data: Path, *more: str) -> list[str]:
    return ["--servers", url, "--data-root", str(data), "--concurrency", "total:2", "--no-reports",
            "-p", "no:randomly", "-W", "ignore::pytest.PytestAssertRewriteWarning", *more]


def progress_lines(result: pytest.RunResult) -> list[str]:
    return [line for line in result.outlines if re.match(r"satbench: \d", line)]


def test_a_log_gets_a_plain_line_every_interval(pytester: pytest.Pytester, bench: Path) -> None:
    with FakeVLM(models=["m"], answer=yes, delay=DELAY) as srv:
        result = pytester.runpytest_subprocess(*args(srv.url, bench, "-q", "--progress-every", "1"))
    assert result.ret == 0, result.stdout.str()
    lines = progress_lines(result)
    assert lines, result.stdout.str()
    for line in lines:  # each a line of its own, with answered/total, the rate and the ETA
        m = LOG_LINE.match(line)
        assert m, line
        assert 0 < int(m.group(1)) <= N
        assert f"in flight {srv.url.removeprefix('http://')} " in line
    assert sum(result.parseoutcomes().values()) == N  # pytest's own counts are untouched
    # pytest's letters are all there: the line interrupts the dots, never replaces one
    letters = "".join(line for line in result.outlines if re.fullmatch(r"[.w]+( +\[\d+%\])?", line))
    assert len(re.sub(r"[^.w]", "", letters)) == N


def test_under_xdist_the_controller_writes_the_line_with_the_workers_servers(
        pytester: pytest.Pytester, bench: Path) -> None:
    with FakeVLM(models=["m"], answer=yes, delay=DELAY) as srv:
        result = pytester.runpytest_subprocess(*args(srv.url, bench, "-n", "2", "--progress-every", "1"))
    assert result.ret == 0, result.stdout.str()
    lines = progress_lines(result)
    assert lines, result.stdout.str()
    assert all(LOG_LINE.match(line) for line in lines), lines
    # the workers' snapshots, summed: both workers ask the one server (total:2, one each)
    assert any(re.search(rf"in flight {re.escape(srv.url.removeprefix('http://'))} \d+/\d+", line) for line in lines)
    assert sum(result.parseoutcomes().values()) == N


def test_progress_every_0_is_off_and_collect_only_prints_no_line(pytester: pytest.Pytester, bench: Path) -> None:
    with FakeVLM(models=["m"], answer=yes, delay=DELAY) as srv:
        off = pytester.runpytest_subprocess(*args(srv.url, bench, "-q", "--progress-every", "0"))
        listing = pytester.runpytest_subprocess(*args(srv.url, bench, "--collect-only", "-q", "--progress-every", "1"))
        off_n = pytester.runpytest_subprocess(*args(srv.url, bench, "-n", "2", "--progress-every", "0", "--fresh"))
    assert off.ret == listing.ret == off_n.ret == 0
    for result in (off, listing, off_n):
        assert not [line for line in result.outlines if "answered (" in line], result.stdout.str()


def test_a_server_going_down_is_marked_down_on_the_line(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")
    data = rsvqa_suite(pytester, BENCH_MODULE, n_images=10, per_type=10)  # 400 questions
    # the second server in its own process, so a kill closes its kept-alive connections too
    other = subprocess.Popen([sys.executable, str(SERVERS_PY), "--model", "m", "--answer", "yes", "--delay", "0.05"],
                             stdout=subprocess.PIPE, text=True)
    try:
        other_url = other.stdout.readline().strip()  # type: ignore[union-attr]  # stdout=PIPE: not None
        with FakeVLM(models=["m"], answer=yes, delay=0.05) as srv:
            cmd = [sys.executable, "-m", "pytest", "-q", *args(f"{srv.url},{other_url}", data, "--progress-every", "1"),
                   "--concurrency", "total:4", "-p", "no:cacheprovider"]
            run = subprocess.Popen(cmd, cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            out = []
            assert run.stdout is not None
            for line in run.stdout:  # the first progress line: both servers answer; then one dies
                out.append(line)
                if re.match(r"satbench: \d", line):
                    other.kill()
                    break
            out += run.stdout.readlines()
            run.wait(timeout=120)
    finally:
        other.kill()
    text = "".join(out)
    assert run.returncode == 0, text[-3000:]
    lines = [line for line in text.splitlines() if re.match(r"satbench: \d", line)]
    assert " DOWN" not in lines[0]
    name = other_url.removeprefix("http://")
    assert any(f"{name} DOWN" in line for line in lines[1:]), lines


# ---------------------------------------------------------------------- runs, on a terminal
def on_a_terminal(cmd: list[str], cwd: Path, cols: int, rows: int) -> str:
    """Run `cmd` with its output on a pseudo-terminal of `cols` x `rows`; all it wrote."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = {**os.environ, "TERM": "xterm", "COLUMNS": str(cols), "LINES": str(rows), "PYTHONIOENCODING": "utf-8"}
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.Popen(cmd, cwd=cwd, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
    finally:
        proc.kill()
        proc.wait()
        os.close(master)
    return out.decode("utf-8", "replace")


class Screen:
    """Just enough of a VT100 to see what a user sees: a screen of `rows` rows that scrolls,
    printable text with auto-wrap (pending in the last column), CR, LF (the pty's onlcr
    makes it CR LF), CSI K/A/B/G, ESC 7/8 (a saved position is a screen row, so a scroll
    after saving would show), SGR and OSC sequences ignored."""

    def __init__(self, cols: int, rows: int) -> None:
        self.cols, self.rows = cols, rows
        self.lines: list[list[str]] = [[]]
        self.top = 0  # the history's index of the screen's first row
        self.r = self.c = 0  # the cursor: history row, column
        self.pending = False
        self.saved = (0, 0, False)

    def _row(self) -> list[str]:
        while len(self.lines) <= self.r:
            self.lines.append([])
        row = self.lines[self.r]
        row.extend(" " * (self.cols - len(row)))
        return row

    def _down(self, scroll: bool) -> None:
        if self.r - self.top == self.rows - 1:
            if not scroll:
                return
            self.top += 1
        self.r += 1

    def feed(self, s: str) -> None:
        i = 0
        while i < len(s):
            ch = s[i]
            if ch == "\x1b":
                nxt = s[i + 1:i + 2]
                if nxt == "7":
                    self.saved = (self.r - self.top, self.c, self.pending)
                elif nxt == "8":
                    row, self.c, self.pending = self.saved
                    self.r = self.top + row
                if nxt in ("7", "8"):
                    i += 2
                    continue
                m = re.match(r"\x1b\[([0-9;?]*)([A-Za-z])", s[i:])
                if m:
                    arg, op = m.groups()
                    n = int(arg) if arg.isdigit() else 1
                    if op == "K":
                        row = self._row()
                        row[self.c:] = [" "] * (self.cols - self.c)
                    elif op == "A":
                        self.r = max(self.top, self.r - n)
                    elif op == "B":
                        for _ in range(n):
                            self._down(scroll=False)
                    elif op == "G":
                        self.c = min(self.cols - 1, n - 1)
                    self.pending = self.pending and op not in "KABG"
                    i += len(m.group(0))
                    continue
                m = re.match(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)", s[i:])
                i += len(m.group(0)) if m else 1
                continue
            if ch == "\r":
                self.c, self.pending = 0, False
            elif ch == "\n":
                self._down(scroll=True)
                self.c, self.pending = 0, False
            elif ch >= " ":
                if self.pending:
                    self._down(scroll=True)
                    self.c, self.pending = 0, False
                self._row()[self.c] = ch
                if self.c == self.cols - 1:
                    self.pending = True
                else:
                    self.c += 1
            i += 1
        self._row()

    def row(self, r: int) -> str:
        return "".join(self.lines[r]).rstrip() if r < len(self.lines) else ""

    def text(self) -> list[str]:
        return [self.row(r) for r in range(len(self.lines))]


# the end of one draw of the line: its text, erase to the end of the row, then the cursor
# goes back to pytest's line (restored, or one row up and to its column)
DRAWN = re.compile(r"(satbench: \d[^\x1b]*)\x1b\[K(?:\x1b8|\x1b\[A(?:\r|\x1b\[\d+G))")


def pytest_lines(screen: list[str]) -> list[str]:
    """The screen without the lines that hold times (pytest's last line, the header's)."""
    return [line for line in screen if not re.search(r"\bin \d+\.\d+s\b", line)]


OWN_TEST = """
def test_{name}():
    print("{name} prints a line under -s")
    print("and another")
"""


@pytest.mark.parametrize(("mode", "cols"), [("-q", 100), ("-v", 44), ("-s", 100)],
                         ids=["dots", "verbose-narrow", "own-tests-printing"])
def test_on_a_terminal_the_line_is_rewritten_in_place_and_pytests_lines_are_untouched(
        pytester: pytest.Pytester, bench: Path, mode: str, cols: int) -> None:
    rows = 12  # a short screen: the run scrolls while the line is shown
    if mode == "-s":  # tests of your own in the run, before and after the questions, printing
        pytester.makepyfile(test_a=OWN_TEST.format(name="a"), test_z=OWN_TEST.format(name="z"))
    with FakeVLM(models=["m"], answer=yes, delay=DELAY) as srv:
        base = [sys.executable, "-m", "pytest", mode, "-p", "no:cacheprovider", *args(srv.url, bench)]
        shown = on_a_terminal([*base, "--store", str(pytester.path / "a.sqlite")], pytester.path, cols, rows)
        plain = on_a_terminal([*base, "--store", str(pytester.path / "b.sqlite"), "--progress-every", "0"],
                              pytester.path, cols, rows)
    draws = list(DRAWN.finditer(shown))
    assert draws, shown[-2000:]
    assert not DRAWN.search(plain)
    # Replayed draw by draw: each time the line is drawn it is on the row under the cursor,
    # the cursor is on pytest's row, and that row holds none of the line.
    screen, fed = Screen(cols, rows), 0
    for m in draws:
        screen.feed(shown[fed:m.end()])
        fed = m.end()
        assert screen.row(screen.r + 1) == m.group(1)[: cols - 1].rstrip(), (screen.row(screen.r), m.group(1))
        assert "satbench: " not in screen.row(screen.r)[: screen.c]
        assert re.match(rf"satbench: \d+/{N} answered", m.group(1))
    screen.feed(shown[fed:])
    # at the end the line is gone, and the screen is what pytest alone wrote, line for line
    reference = Screen(cols, rows)
    reference.feed(plain)
    assert pytest_lines(screen.text()) == pytest_lines(reference.text())
    assert any(" passed" in line for line in screen.text())


def test_on_a_terminal_under_xdist_pytests_lines_keep_their_shape(pytester: pytest.Pytester, bench: Path) -> None:
    cols, rows = 80, 12
    with FakeVLM(models=["m"], answer=yes, delay=DELAY) as srv:
        base = [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", *args(srv.url, bench)]
        shown = on_a_terminal([*base, "--store", str(pytester.path / "a.sqlite")], pytester.path, cols, rows)
        plain = on_a_terminal([*base, "--store", str(pytester.path / "b.sqlite"), "--progress-every", "0"],
                              pytester.path, cols, rows)
    draws = DRAWN.findall(shown)
    assert draws, shown[-2000:]
    assert any(" in flight " in d for d in draws)  # the workers' snapshots reached the controller
    screen, reference = Screen(cols, rows), Screen(cols, rows)
    screen.feed(shown)
    reference.feed(plain)
    # workers interleave differently in every run: the same rows of the same lengths, the
    # same letters in all, and no line of the progress left
    def shape(lines: list[str]) -> list[tuple[int, str]]:
        return [(len(line), re.sub(r"[.w]", "x", line)) for line in pytest_lines(lines)]

    assert shape(screen.text()) == shape(reference.text())
    def letters(lines: list[str]) -> tuple[int, int]:
        return "".join(lines).count("."), "".join(lines).count("w")

    assert letters(screen.text()) == letters(reference.text())
    assert not any(re.match(r"satbench: \d", line) for line in screen.text())
