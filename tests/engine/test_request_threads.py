"""Request threads follow the limits (engine/answering.py, DaemonWorkers): a request holds its
thread while in flight and waits for a slot on it, so threads beyond the limits only wait."""

from __future__ import annotations

import threading
import time

from pytest_satbench.engine.answering import DaemonWorkers


def wait_for(cond: object, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]  # cond: a callable
        assert time.monotonic() < end, "condition not reached in time"
        time.sleep(0.01)


def test_threads_start_up_to_the_bound_read_now_and_end_when_it_falls() -> None:
    bound = [5]
    workers = DaemonWorkers(lambda: bound[0], "test-ask")
    gate = threading.Semaphore(0)
    running = [0]
    lock = threading.Lock()

    def call() -> None:
        with lock:
            running[0] += 1
        gate.acquire()
        with lock:
            running[0] -= 1

    try:
        for _ in range(40):
            workers.submit(call)
        wait_for(lambda: running[0] == 5)
        assert len(workers._threads) == 5  # 35 calls wait in the queue, not on threads
        bound[0] = 8  # a limit rose: the next call to finish starts threads for the queue
        gate.release()
        wait_for(lambda: running[0] == 8)
        assert len(workers._threads) == 8
        bound[0] = 2  # a limit fell: threads end as their calls finish
        for _ in range(8):
            gate.release()
        wait_for(lambda: len(workers._threads) == 2)
        assert running[0] <= 2
        for _ in range(40):
            gate.release()
        wait_for(lambda: running[0] == 0)
        assert len(workers._threads) == 2
    finally:
        workers.shutdown()


def test_a_fixed_number_still_bounds_the_threads() -> None:
    workers = DaemonWorkers(3, "test-ask")
    done = threading.Event()
    seen: set[str] = set()
    try:
        for _ in range(30):
            workers.submit(lambda: (seen.add(threading.current_thread().name), done.wait(0.01)))
        wait_for(lambda: workers._queue.qsize() == 0)
        assert len(workers._threads) <= 3 and len(seen) <= 3
    finally:
        workers.shutdown()
