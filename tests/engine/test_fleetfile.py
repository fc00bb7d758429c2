"""A fleet that changes mid-run: the server file (engine/fleetfile.py) and the pool's joins and
leaves (ServerPool.set_servers), against continuous-batching simulators on loopback
(tests/fleet_sim.py). Every wait is for something the servers or the pool show (a request
count, a health check, a line said), bounded only to fail instead of hanging."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from fleet_sim import EngineParams, SimServer
from servers import dead_url

from pytest_satbench.engine.client import ServerPool
from pytest_satbench.engine.concurrency import ConcurrencySpec
from pytest_satbench.engine.fleetfile import FileFleet, parse_server_lines, read_server_file

FAST = {"backoff_base": 0.01, "backoff_max": 0.05, "timeout": 20.0, "connect_timeout": 2.0}
TWO_EACH = ConcurrencySpec(per_server=2, adaptive=False)
QUICK = EngineParams(max_num_seqs=4, base_ms=1.0, per_seq_ms=0.1, output_tokens=2)


@pytest.fixture(autouse=True)
def no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "no_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def ask(pool: ServerPool, prompt: str = "q") -> str:
    return pool.ask(model="sim-model", prompt=prompt, image_jpeg=None, max_tokens=2).server


def write(path: Path, text: str) -> None:
    """Replace the file's text so that a poll sees a new stamp (size or mtime)."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    if path.stat().st_mtime_ns == before:  # a coarse clock: move the mtime on by hand
        os.utime(path, ns=(before + 1_000_000, before + 1_000_000))


# ---------------------------------------------------------------------- the file
def test_lines_comments_and_bad_lines(tmp_path: Path) -> None:
    f = tmp_path / "fleet.txt"
    urls, problems = parse_server_lines(f, "\n".join([
        "# the fleet", "", "http://gpu1:8000   # node 1", "htp//gpu2:8000", "http://gpu3:8000/v1",
        "http://gpu1:8000/", "builtin", "https://gpu4:8443"]))
    assert urls == ("http://gpu1:8000", "https://gpu4:8443")
    assert [p.split(":", 1)[0] for p in problems] == [f"--servers @{f} line {n}" for n in (4, 5, 6, 7)]
    assert "is not a URL" in problems[0] and "without /v1 (http://gpu3:8000)" in problems[1]
    assert "listed already on line 3" in problems[2] and all(p.endswith("; ignored") for p in problems)


def test_a_bad_line_never_shows_a_password(tmp_path: Path) -> None:
    _, problems = parse_server_lines(tmp_path / "f", "ftp://user:s3cretpw@host:21\n")
    assert problems and "s3cretpw" not in problems[0]


def test_the_file_is_followed_and_a_bad_state_keeps_the_last_good_list(tmp_path: Path) -> None:
    f = tmp_path / "fleet.txt"
    f.write_text("http://a:1\n")
    said: list[str] = []
    fleet = FileFleet(read_server_file(f), say=said.append)
    clock = iter(range(1, 1000))

    def poll() -> tuple[str, ...] | None:
        return fleet.poll(now=float(next(clock)))

    assert poll() is None and not said  # unchanged
    write(f, "http://a:1\nhttp://b:2\nnot a url\n")
    assert poll() == ("http://a:1", "http://b:2")
    assert said == [f"--servers @{f} line 3: 'not a url' is not a URL; write base URLs like http://gpu1:8000, "
                    "one per line; ignored"]
    write(f, "http://a:1\nhttp://b:2\nnot a url\n# a comment\n")  # the same bad line: not said again
    assert poll() is None and len(said) == 1
    write(f, "# emptied\n")
    assert poll() is None and poll() is None
    assert said[1] == f"--servers @{f} lists no server; keeping its last good list (http://a:1, http://b:2)"
    f.unlink()
    assert poll() is None and poll() is None
    assert len(said) == 3 and "cannot be read" in said[2] and fleet.urls == ("http://a:1", "http://b:2")
    write(f, "http://b:2\n")
    assert poll() == ("http://b:2",)
    assert said[3] == f"--servers @{f} is good again: 1 server(s) listed" and len(said) == 4


def test_polls_are_at_most_one_stat_per_period(tmp_path: Path) -> None:
    f = tmp_path / "fleet.txt"
    f.write_text("http://a:1\n")
    fleet = FileFleet(read_server_file(f))
    assert fleet.poll(now=10.0) is None
    write(f, "http://b:2\n")
    assert fleet.poll(now=10.5) is None  # within the period: not looked at
    assert fleet.poll(now=11.0) == ("http://b:2",)


# ---------------------------------------------------------------------- the pool
def test_a_new_server_joins_and_a_removed_one_finishes_its_requests() -> None:
    notices: list[str] = []
    with SimServer(QUICK) as a, SimServer(QUICK) as b, \
            ServerPool([a.url], concurrency=TWO_EACH, on_notice=notices.append, **FAST) as pool, \
            ThreadPoolExecutor(8) as ex:
        assert pool.resolve_model(None) == "sim-model"
        assert ask(pool) == a.url
        pool.set_servers([a.url, b.url])
        wait_for(lambda: any("joined" in n for n in notices), "b to join")
        assert b.model_lists == 1  # the start-up health check
        assert notices == ["the server list: server " + b.url + " joined the fleet (health check passed, serves "
                           "'sim-model')"]
        assert pool.urls == [a.url, b.url]
        served = {ask(pool, f"q{i}") for i in range(20)}
        assert served == {a.url, b.url}  # traffic follows at once
        # a stalls with requests in flight, then leaves the list
        a.hold()
        futures: list[Future[str]] = [ex.submit(ask, pool, f"r{i}") for i in range(8)]
        wait_for(lambda: a.held() == 2, "a to hold its limit of requests")  # 2 each, fixed
        arrived = a.arrived
        pool.set_servers([b.url])
        assert pool.urls == [b.url]
        assert notices[-1] == (f"the server list: server {a.url} left the fleet: no new request goes to it; its 2 "
                               "request(s) in flight finish")
        assert [(x.server, x.in_flight, x.leaving) for x in pool.loads() if x.server == a.url] == [(a.url, 2, True)]
        wait_for(lambda: sum(f.done() for f in futures) == 6, "b to answer the others")
        a.release()
        got = [f.result(timeout=20) for f in futures]
        assert got.count(a.url) == 2 and got.count(b.url) == 6  # a's answers in flight count
        assert a.arrived == arrived  # nothing new went to a
        assert {ask(pool, f"s{i}") for i in range(5)} == {b.url}
        usage = pool.usage()
        assert set(usage) == {a.url, b.url}  # the one that left is still counted
        assert usage[a.url].answered == a.stats().completed
        assert [x.server for x in pool.loads()] == [b.url]  # gone from the load, not from the counts
        assert pool.totals().answered == sum(u.answered for u in usage.values()) == 1 + 20 + 8 + 5


def test_a_server_of_another_model_never_joins_and_says_why_once() -> None:
    notices: list[str] = []
    with SimServer(QUICK) as a, SimServer(EngineParams(max_num_seqs=4, base_ms=1.0, model="other")) as other, \
            ServerPool([a.url], on_notice=notices.append, **FAST) as pool:
        pool.resolve_model(None)
        pool.set_servers([a.url, other.url])
        wait_for(lambda: other.model_lists >= 2, "a second health check")  # retried after a pause
        assert len(notices) == 1 and f"server {other.url} fails the health check" in notices[0]
        assert "does not serve model 'sim-model' (it lists: other)" in notices[0]
        assert {ask(pool, f"q{i}") for i in range(10)} == {a.url} and other.arrived == 0
        assert set(pool.usage()) == {a.url}


def test_a_removal_that_would_leave_nothing_serving_waits_for_a_listed_server() -> None:
    notices: list[str] = []
    with SimServer(QUICK) as a, ServerPool([a.url], on_notice=notices.append, **FAST) as pool:
        pool.resolve_model(None)
        dead = dead_url()
        pool.set_servers([dead])  # a replacement that never comes up
        wait_for(lambda: len(notices) == 2, "two lines")
        assert f"server {dead} fails the health check" in notices[0]
        assert notices[1] == (f"the server list: no listed server has passed its health check yet: {a.url} "
                              "keep(s) serving until one does")
        assert ask(pool) == a.url  # the run goes on


def test_the_pool_follows_its_file(tmp_path: Path) -> None:
    notices: list[str] = []
    f = tmp_path / "fleet.txt"
    with SimServer(QUICK) as a, SimServer(QUICK) as b:
        f.write_text(f"{a.url}\n")
        fleet = FileFleet(read_server_file(f), say=notices.append)
        with ServerPool(list(fleet.urls), fleet=fleet, on_notice=notices.append, **FAST) as pool:
            pool.resolve_model(None)
            assert ask(pool) == a.url  # the control thread starts with the first request
            write(f, f"# the fleet\n{b.url}\nnot-a-url\n")
            wait_for(lambda: pool.urls == [b.url], "the pool to follow the file")
            assert notices[0] == f"--servers @{f} line 3: 'not-a-url' is not a URL; write base URLs like " \
                                 "http://gpu1:8000, one per line; ignored"
            assert notices[1].startswith(f"--servers @{f}: server {b.url} joined the fleet")
            assert notices[2] == f"--servers @{f}: server {a.url} left the fleet: no new request goes to it"
            arrived = a.arrived
            assert {ask(pool, f"q{i}") for i in range(5)} == {b.url} and a.arrived == arrived
            write(f, "")
            wait_for(lambda: len(notices) == 4, "the empty file said")
            assert notices[3] == f"--servers @{f} lists no server; keeping its last good list ({b.url})"
            assert ask(pool) == b.url


def test_a_server_that_comes_back_gets_a_fresh_limit() -> None:
    # b sheds what it cannot run at once (503): its adaptive limit backs off
    shedding = EngineParams(max_num_seqs=1, base_ms=20.0, output_tokens=2, max_waiting=0)
    with SimServer(QUICK) as a, SimServer(shedding) as b, \
            ServerPool([b.url], concurrency=ConcurrencySpec(initial=8), retries=20, **FAST) as pool, \
            ThreadPoolExecutor(8) as ex:
        pool.resolve_model(None)
        assert set(ex.map(lambda i: ask(pool, f"q{i}"), range(8))) == {b.url}
        assert "back off" in [p.why for p in pool.usage()[b.url].limit_history]
        joined = threading.Event()
        pool.on_notice = lambda line: joined.set() if "joined" in line else None
        pool.set_servers([a.url])
        assert joined.wait(20) and pool.urls == [a.url]
        joined.clear()
        pool.set_servers([a.url, b.url])
        assert joined.wait(20) and set(pool.urls) == {a.url, b.url}
        assert b.model_lists == 2  # checked again when it came back
        history = pool.usage()[b.url].limit_history
        assert [p.why for p in history] == ["start"]
        assert history[0].t > 0  # on the run's clock: when it came back, not when the pool started


def test_a_removed_server_that_dies_with_requests_in_flight_fails_nothing() -> None:
    """Drained, then stopped before its last answers: they are retried on a listed server."""
    with SimServer(QUICK) as b, ServerPool([b.url], concurrency=TWO_EACH, **FAST) as pool, \
            ThreadPoolExecutor(4) as ex:
        a = SimServer(QUICK).start()
        try:
            pool.resolve_model(None)
            joined = threading.Event()
            pool.on_notice = lambda line: joined.set() if "joined" in line else None
            pool.set_servers([b.url, a.url])
            assert joined.wait(20)
            a.hold()
            b.hold()
            futures = [ex.submit(ask, pool, f"q{i}") for i in range(4)]
            wait_for(lambda: a.held() == 2 and b.held() == 2, "both to hold two requests")
            pool.set_servers([b.url])
            b.release()
            a.engine.close()  # a dies: its two requests in flight are answered 503 (shutting down)
            a.release()
        finally:
            a.close()
        assert [f.result(timeout=20) for f in futures] == [b.url] * 4
        assert pool.usage()[a.url].failures == 2 and pool.usage()[a.url].answered == 0
