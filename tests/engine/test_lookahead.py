"""The look-ahead alone: window, order, the xdist queue reader."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from pytest_satbench.engine.lookahead import LookAhead, worker_upcoming


def test_lookahead_runs_ahead_within_window_and_returns_in_order() -> None:
    started: list[int] = []
    outstanding = [0]
    peak = [0]
    lock = threading.Lock()
    pool = ThreadPoolExecutor(16)

    def submit(i: int) -> Future[int]:
        with lock:
            started.append(i)
            outstanding[0] += 1
            peak[0] = max(peak[0], outstanding[0])

        def work() -> int:
            time.sleep(0.005)
            return i * 10

        return pool.submit(work)

    la: LookAhead[int, int] = LookAhead(iter(range(100)), submit, key=str, window=8)
    la.start()
    time.sleep(0.1)
    assert len(started) == 8  # ran ahead, but no further than the window
    results = []
    for i in range(100):
        results.append(la.result(i))
        with lock:
            outstanding[0] -= 1
    la.stop()
    assert results == [i * 10 for i in range(100)]
    assert peak[0] <= 9  # window + the one being consumed
    assert sorted(started) == list(range(100)) and len(started) == 100  # each submitted once


def test_lookahead_item_before_feeder_is_submitted_once() -> None:
    calls: list[int] = []

    def submit(i: int) -> Future[int]:
        calls.append(i)
        f: Future[int] = Future()
        f.set_result(i)
        return f

    gate = threading.Event()

    def slow_upcoming():
        gate.wait(2)
        yield from range(5)

    la: LookAhead[int, int] = LookAhead(slow_upcoming(), submit, key=str, window=4)
    la.start()
    assert la.result(0) == 0  # on demand, before the feeder got there
    gate.set()
    assert [la.result(i) for i in range(1, 5)] == [1, 2, 3, 4]
    la.stop()
    assert sorted(calls) == [0, 1, 2, 3, 4]  # item 0 was not submitted a second time


def test_worker_upcoming_reads_queue_until_shutdown() -> None:
    snaps = iter([[0, 1], [1, 2], ["SHUTDOWN"]])
    items = ["a", "b", "c"]
    got = list(worker_upcoming(lambda: next(snaps), items, lambda: False, poll=0))
    assert got == ["a", "b", "c"]
