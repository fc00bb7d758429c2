"""A run across a fleet gives the results of a run on one server.

Real pytest runs (pytester) against continuous-batching simulators (tests/fleet_sim.py) on
loopback: answers depend on the prompt alone, so where a question was asked must not show in
any stored answer, verdict or figure, while the adaptive limits spread the requests.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from datasets_fake import rsvqa_suite
from fleet_sim import EngineParams, SimServer

BENCH_MODULE = """
from pytest_satbench import benchmark_test
test_rsvqa_lr = benchmark_test("rsvqa_lr")
"""
FAST = EngineParams(max_num_seqs=16, base_ms=2.0, per_seq_ms=0.2, output_tokens=4)


def _run(pytester: pytest.Pytester, data: Path, store: Path, *urls: str) -> pytest.RunResult:
    return pytester.runpytest(
        "--servers", ",".join(urls), "--data-root", str(data), "--store", str(store),
        "--recon", "jpeg:quality=40", "-q", "--no-reports", "-W", "ignore::pytest.PytestAssertRewriteWarning",
    )


def _answers(store: Path) -> dict[tuple[str, str], tuple[str, int]]:
    with sqlite3.connect(store) as conn:
        rows = conn.execute("SELECT nodeid, arm, text, correct FROM answers WHERE status='ok'").fetchall()
    return {(nodeid, arm): (text, correct) for nodeid, arm, text, correct in rows}


def test_two_simulated_servers_give_the_results_of_one(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")
    data = rsvqa_suite(pytester, BENCH_MODULE, n_images=6, per_type=5)
    with SimServer(FAST) as a, SimServer(FAST) as b, SimServer(FAST) as single:
        fleet = _run(pytester, data, pytester.path / "fleet.sqlite", a.url, b.url)
        alone = _run(pytester, data, pytester.path / "alone.sqlite", single.url)
        served = (a.stats().completed, b.stats().completed, single.stats().completed)
    assert fleet.ret == alone.ret
    assert served[0] > 0 and served[1] > 0  # both servers of the fleet answered
    assert served[0] + served[1] == served[2] == 2 * 120  # every question once per arm, nothing twice
    fleet_answers = _answers(pytester.path / "fleet.sqlite")
    assert len(fleet_answers) == 240
    assert fleet_answers == _answers(pytester.path / "alone.sqlite")
    # the verdicts and the summary table are the same
    assert fleet.outlines[-1].split(" in ")[0] == alone.outlines[-1].split(" in ")[0]
    table = [line for line in fleet.outlines if line.startswith(("overall", "presence", "count"))]
    assert table and table == [line for line in alone.outlines if line.startswith(("overall", "presence", "count"))]


def test_the_limits_over_the_run_reach_the_report(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")
    data = rsvqa_suite(pytester, BENCH_MODULE, n_images=6, per_type=5)
    with SimServer(EngineParams(max_num_seqs=8, base_ms=5.0, per_seq_ms=1.0, output_tokens=10)) as sim:
        result = pytester.runpytest("--servers", sim.url, "--data-root", str(data), "-q",
                                    "-W", "ignore::pytest.PytestAssertRewriteWarning")
        seen = sim.stats().max_running_seen
    assert result.ret in (0, 1), result.stdout.str()
    folder = pytester.path / "reports" / "rsvqa_lr" / "default"
    server = json.loads((folder / "summary.json").read_text())["usage"]["by_server"][sim.url]
    assert server["steered_by"] == "metrics"  # the simulator serves vLLM's /metrics
    assert 1 <= server["limit"] <= 32 and server["peak_in_flight"] >= seen
    page = (folder / "report.html").read_text()
    assert "in-flight limit per server over the run" in page and "<polyline" in page


# ---------------------------------------------------------------------- --servers=@FILE
ALL_REQUESTS = 2 * 120  # 120 questions, the original and one reconstruction each


class _PoolOf:
    """Hands the test the run's server pool (the run is in this process): where the test must
    know that the pool has let a server go."""

    def __init__(self) -> None:
        self.config: pytest.Config | None = None
        self.pool: Any = None

    def pytest_configure(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.pool is None and self.config is not None:
            self.pool = self.config.pluginmanager.get_plugin("satbench-session").runtime().pool


def _wait(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _edit(path: Path, text: str) -> None:
    before = path.stat().st_mtime_ns
    path.write_text(text)
    if path.stat().st_mtime_ns == before:  # a coarse clock: the poll compares mtime and size
        os.utime(path, ns=(before + 1_000_000, before + 1_000_000))


def test_a_server_file_that_changes_during_the_run(pytester: pytest.Pytester) -> None:
    """c is added at 30% of the run, a removed at about 60%: no item fails, c serves, and a
    gets nothing once the pool has let it go, beyond what it had in flight (which counts).
    The points are the servers' own request counts, never the clock: a and b stall after 36
    requests each, so the run cannot end before c joins; c stalls after 24, so the three
    resume at a known point (at most 4 in flight each: --concurrency 4); a stalls again after
    12 more, so it has requests in flight when it is removed."""
    pytester.makeini("[pytest]\n")
    data = rsvqa_suite(pytester, BENCH_MODULE, n_images=6, per_type=5)
    listed = pytester.path / "fleet.txt"
    grab = _PoolOf()
    seen: dict[str, int] = {}
    problems: list[BaseException] = []
    with SimServer(FAST) as a, SimServer(FAST) as b, SimServer(FAST) as c:
        listed.write_text(f"# the fleet\n{a.url}\n{b.url}\nnot a url\n")
        a.hold(after=36)
        b.hold(after=36)
        c.hold(after=24)

        def drive() -> None:
            try:
                _wait(lambda: a.held() and b.held(), "a and b to stall at 30%")
                _edit(listed, f"# the fleet\n{a.url}\n{b.url}\nnot a url\n{c.url}\n")
                _wait(lambda: c.held() > 0, "c to serve")
                seen["c_at_release"] = c.stats().completed
                for sim in (a, b, c):
                    sim.release()
                a.hold(after=12)  # from its 13th request on, a stalls again
                _wait(lambda: a.held() > 0, "a to stall again")
                _edit(listed, f"# the fleet\n{b.url}\nnot a url\n{c.url}\n")
                _wait(lambda: grab.pool is not None and a.url not in grab.pool.urls, "the pool to let a go")
                # nothing completes on a while it holds: what the pool has in flight there now is
                # what it sent before letting a go; wait for all of it to arrive
                in_flight = sum(s.in_flight for s in grab.pool.loads() if s.server == a.url)
                _wait(lambda: a.held() == in_flight, "a's requests in flight to arrive")
                seen["a_arrived"], seen["a_in_flight"] = a.arrived, in_flight
                a.release()
            except BaseException as exc:  # noqa: BLE001 (reported by the test)
                problems.append(exc)
                for sim in (a, b, c):
                    sim.release()

        driver = threading.Thread(target=drive, daemon=True)
        driver.start()
        result = pytester.runpytest(f"--servers=@{listed}", "--data-root", str(data), "--recon", "jpeg:quality=40",
                                    "--concurrency", "4", "-q", "-W", "ignore::pytest.PytestAssertRewriteWarning",
                                    plugins=[grab])
        driver.join(timeout=90)
        assert not driver.is_alive(), "the run ended before the test could drive it"
        served = {s.url: s.arrived for s in (a, b, c)}
        completed = {s.url: s.stats().completed for s in (a, b, c)}
    assert not problems, problems
    out = result.stdout.str()
    assert result.ret == 0, out
    result.stdout.fnmatch_lines([f"*satbench: --servers @{listed} line 4: 'not a url' is not a URL*; ignored"])
    assert out.count("line 4: 'not a url'") == 1  # said at the start, not at every re-read
    assert f"--servers @{listed}: server {c.url} joined the fleet" in out
    assert f"--servers @{listed}: server {a.url} left the fleet: no new request goes to it" in out
    # every question answered once per arm, nothing lost or asked twice
    answers = _answers(pytester.path / ".pytest_cache" / "d" / "satbench" / "results.sqlite")
    assert len(answers) == ALL_REQUESTS == sum(completed.values()) == sum(served.values())
    # the shares follow the file: c served (more than the 24 it served alone), a nothing new
    # once it was let go: its last requests were the ones in flight, and they were answered
    assert 0 < seen["c_at_release"] <= 24 < completed[c.url] and 36 <= served[b.url]
    assert seen["a_in_flight"] >= 1 and served[a.url] == seen["a_arrived"] == completed[a.url]
    folder = pytester.path / "reports" / "rsvqa_lr" / "default"
    protocol = json.loads((folder / "protocol.json").read_text())
    assert protocol["servers_file"] == str(listed) and protocol["servers"] == [a.url, b.url]
    assert protocol["servers_served"] == sorted([a.url, b.url, c.url])
    by_server = json.loads((folder / "summary.json").read_text())["usage"]["by_server"]
    assert set(by_server) == {a.url, b.url, c.url}  # the one that left is in the traffic table
    assert by_server[a.url]["requests"] == completed[a.url]
    assert a.url in (folder / "report.md").read_text()


def test_a_server_file_that_is_missing_is_one_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")
    data = rsvqa_suite(pytester, BENCH_MODULE, n_images=1, per_type=1)
    missing = pytester.path / "nowhere.txt"
    result = pytester.runpytest_subprocess(f"--servers=@{missing}", "--data-root", str(data), "-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.strip()]
    assert errors == [f"ERROR: --servers: @{missing}: no such file; write the servers' base URLs in it, one per "
                      "line, or pass them comma-separated"]


def test_a_separate_at_file_argument_is_refused_with_the_spelling_that_works(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")
    data = rsvqa_suite(pytester, BENCH_MODULE, n_images=1, per_type=1)
    (pytester.path / "fleet.txt").write_text("http://127.0.0.1:9\n")  # pytest expands it as an arguments file
    result = pytester.runpytest_subprocess("--servers", "@fleet.txt", "--data-root", str(data), "-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --servers @FILE: pytest reads a separate @FILE argument as its own "
                                 "arguments file; write --servers=@FILE"])


def test_each_xdist_worker_follows_the_server_file(pytester: pytest.Pytester) -> None:
    """Under -n 2 every worker reads the file again and health-checks the new server itself;
    the terminal says each change once. a and b stall after 36 requests each (at most 4 in
    flight each, split between the workers), so the run waits for c, whatever the timing."""
    pytest.importorskip("xdist")
    pytester.makeini("[pytest]\n")
    data = rsvqa_suite(pytester, BENCH_MODULE, n_images=6, per_type=5)
    listed = pytester.path / "fleet.txt"
    problems: list[BaseException] = []
    with SimServer(FAST) as a, SimServer(FAST) as b, SimServer(FAST) as c:
        listed.write_text(f"{a.url}\n{b.url}\n")
        a.hold(after=36)
        b.hold(after=36)

        def drive() -> None:
            try:
                _wait(lambda: a.held() and b.held(), "a and b to stall at 30%")
                _edit(listed, f"{a.url}\n{b.url}\n{c.url}\n")
                _wait(lambda: c.model_lists >= 2 and c.stats().completed >= 24, "both workers to send to c")
            except BaseException as exc:  # noqa: BLE001 (reported by the test)
                problems.append(exc)
            finally:
                a.release()
                b.release()

        driver = threading.Thread(target=drive, daemon=True)
        driver.start()
        result = pytester.runpytest_subprocess(f"--servers=@{listed}", "--data-root", str(data), "--recon",
                                               "jpeg:quality=40", "-n", "2", "--concurrency", "4", "--no-reports", "-q")
        driver.join(timeout=30)
        completed = [s.stats().completed for s in (a, b, c)]
    assert not problems, problems
    out = result.stdout.str()
    assert result.ret == 0, out
    assert out.count(f"server {c.url} joined the fleet") == 1, out  # two workers, one line
    store = pytester.path / ".pytest_cache" / "d" / "satbench" / "results.sqlite"
    assert len(_answers(store)) == ALL_REQUESTS == sum(completed)
    with sqlite3.connect(store) as conn:
        by_process = dict(conn.execute("SELECT process, requests FROM run_traffic WHERE server=?", (c.url,)))
    assert set(by_process) == {"gw0", "gw1"} and sum(by_process.values()) == completed[2]
