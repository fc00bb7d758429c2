"""Look-ahead: keep the servers busy while pytest runs items one at a time.

pytest runs items sequentially and reports them in order. A feeder thread walks the items
that will run next (in order) and submits up to `window` of them to the runner ahead of
time, so by the time pytest reaches an item its answers are usually there. Items whose
answers are all stored complete at once and cost no request.

Memory stays bounded by the window, not by the number of selected items: the feeder holds
at most `window` unconsumed results (the seed queued the whole dataset in its thread pool).
The window may be a callable, read before each submission: it follows the servers' limits
as they adapt.

Under pytest-xdist the items a worker will run are the ones the controller has sent it;
`worker_upcoming` reads that queue, so look-ahead works per worker too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FuturesTimeout
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_CLAIMED = object()  # the item asked for its result before the feeder reached it


class LookAhead(Generic[T, R]):
    """Submits upcoming items ahead of time and hands each its future when it runs."""

    def __init__(
        self,
        upcoming: Iterable[T],
        submit: Callable[[T], Future[R]],
        key: Callable[[T], str],
        window: int | Callable[[], int],
    ) -> None:
        self._upcoming = upcoming
        self._submit = submit
        self._key = key
        self._window = window if callable(window) else (lambda: window)
        self._held = 0  # results submitted ahead and not yet handed out
        self._state: dict[str, Any] = {}  # key -> Future (submitted ahead) or _CLAIMED
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.submitted_ahead = 0
        self.submitted_on_demand = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._feed, name="satbench-lookahead", daemon=True)
        self._thread.start()

    def _feed(self) -> None:
        try:
            for item in self._upcoming:
                window = max(1, self._window())
                k = self._key(item)
                with self._room:
                    # wait for room, but wake up promptly when stopped (and re-read the window)
                    while self._held >= window:
                        if self._stop.is_set():
                            return
                        self._room.wait(0.1)
                        window = max(1, self._window())
                    if self._stop.is_set():
                        return
                    if k in self._state:  # already claimed by its runner; nothing to do
                        if self._state[k] is _CLAIMED:
                            del self._state[k]
                        continue
                    fut = self._submit(item)
                    self._state[k] = fut
                    self._held += 1
                    self.submitted_ahead += 1
        except Exception:  # the feeder is an optimisation: items still run on demand
            return

    def result(self, item: T, timeout: float | None = None, *, poll: Callable[[], None] | None = None,
               every: float = 1.0) -> R:
        """The item's result, submitting it now if the feeder has not reached it yet. While it
        waits, `poll` (if given) is called every `every` seconds; an exception it raises ends
        the wait (a run that has stopped asking does not wait out slow retries)."""
        k = self._key(item)
        with self._lock:
            got = self._state.pop(k, None)
            ahead = isinstance(got, Future)
            if not ahead:
                self._state[k] = _CLAIMED
        if ahead:
            with self._room:
                self._held -= 1
                self._room.notify()
            fut: Future[R] = got  # a Future, checked above
            return _wait(fut, timeout, poll, every)
        self.submitted_on_demand += 1
        return _wait(self._submit(item), timeout, poll, every)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            pending = [f for f in self._state.values() if isinstance(f, Future)]
            self._state.clear()
        for fut in pending:
            fut.cancel()
        if self._thread is not None:
            self._thread.join(timeout=2)


def _wait(fut: Future[R], timeout: float | None, poll: Callable[[], None] | None, every: float) -> R:
    if poll is None:
        return fut.result(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        step = every if deadline is None else max(0.0, min(every, deadline - time.monotonic()))
        try:
            return fut.result(step)
        except FuturesTimeout:
            if deadline is not None and time.monotonic() >= deadline:
                raise
            poll()


def worker_upcoming(
    queue_snapshot: Callable[[], list[Any] | None],
    items: list[T],
    stopped: Callable[[], bool],
    poll: float = 0.02,
) -> Iterator[T]:
    """Upcoming items of an xdist worker, read from its queue of received indices.

    `queue_snapshot` returns the indices queued on the worker (None when the worker's queue
    is unreachable, which ends look-ahead: items then run on demand). Indices are yielded
    once each, in the order received; the generator ends at the shutdown marker.
    """
    seen: set[int] = set()
    while not stopped():
        snap = queue_snapshot()
        if snap is None:
            return
        fresh = False
        for idx in snap:
            if not isinstance(idx, int):
                return  # the shutdown marker: nothing more will come
            if idx not in seen:
                seen.add(idx)
                fresh = True
                yield items[idx]
        if not fresh:
            time.sleep(poll)
