"""SIGTERM stops a benchmark run as Ctrl-C does.

SLURM preempts a job (and `scancel` ends one) with SIGTERM, then SIGKILL after a grace of
30 s by default; Kubernetes does the same to a pod. Python's default for SIGTERM is to die
on the spot: no line, no report, no last-failed list, and the answers in flight lost. Here
SIGTERM becomes the KeyboardInterrupt that Ctrl-C raises, so it takes Ctrl-C's path through
pytest and the plugin (one line, the unfinished report, the never-reached items in pytest's
last-failed list, exit status 2), and the run waits up to `GRACE_S` for the requests in
flight before giving up on them (`drain`), for Ctrl-C too.

Under pytest-xdist both sides may get the signal: SLURM signals every process of the job
step, Kubernetes only the first. A worker stops as a sequential run does, but ends as a run
this plugin stopped (`session.shouldstop`), not as an interrupted one, which xdist would
count as a crashed worker and replace. The controller does not stop itself: it passes
SIGTERM on to its workers, which stop, keep what is in flight and report their ends, and
xdist then ends the run; should they not end within `CONTROLLER_WAIT_S`, the controller
stops anyway.

After the first stop signal nothing raises again: a second signal during `drain` gives up
on the requests in flight at once, and a second SIGTERM later (not the copy a worker gets
from both SLURM and its controller within a second) ends the process at once. Every answer
already committed is in the store either way (SQLite's WAL), as after a SIGKILL.
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
import time
from typing import Any

import pytest

GRACE_S = 5.0  # the longest a stopped run waits for the requests it has in flight
CONTROLLER_WAIT_S = 12.0  # an xdist controller stops itself if its workers have not ended by then
DUPLICATE_S = 1.0  # a second SIGTERM this soon after the first is the same stop (SLURM + the controller)

STOP_LINES = {
    "SIGINT": "satbench: interrupted; every answer received so far is stored: rerun the same command to resume",
    "SIGTERM": ("satbench: stopped by SIGTERM (scancel, preemption, a pod stopping); every answer received so far "
                "is stored: rerun the same command to resume"),
}


class StopSignals:
    """SIGTERM's handler for one pytest process, installed for the run and restored after."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.received: str | None = None  # "SIGTERM" once one arrived, "SIGINT" for Ctrl-C
        self.first_at = 0.0
        self.hurry = threading.Event()  # give up on the requests in flight now
        self.finishing = False  # the items are over: a signal no longer raises
        self.draining = False
        self._previous: Any = None
        self._installed = False

    # ------------------------------------------------------------------ install
    def install(self) -> None:
        """Only the main thread can set a handler (a plugin loaded elsewhere keeps the default)."""
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        except (ValueError, OSError):
            return
        self._installed = True

    def restore(self) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
            self._installed = False

    # ------------------------------------------------------------------ the handler
    def _on_sigterm(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        if self.received is not None:  # a stop is under way
            if now - self.first_at < DUPLICATE_S:
                return
            if self.draining:
                self.hurry.set()
                return
            sys.stderr.write("satbench: second SIGTERM: exiting now; every answer committed so far is in the store\n")
            sys.stderr.flush()
            os._exit(int(pytest.ExitCode.INTERRUPTED))
        self.received, self.first_at = "SIGTERM", now
        if self.finishing:
            return  # the items are over: the summary and reports finish (seconds), then pytest exits
        if _is_xdist_controller(self.config) and _forward_to_workers(self.config, signum):
            # the workers stop (keeping what they have in flight) and xdist ends the run
            threading.Thread(target=_interrupt_later, args=(self, CONTROLLER_WAIT_S), daemon=True).start()
            return
        raise KeyboardInterrupt  # the main thread takes Ctrl-C's path from wherever it is

    def interrupted(self) -> None:
        """A KeyboardInterrupt reached the run loop: Ctrl-C unless SIGTERM raised it."""
        if self.received is None:
            self.received, self.first_at = "SIGINT", time.monotonic()

    def line(self) -> str:
        return STOP_LINES.get(self.received or "SIGINT", STOP_LINES["SIGINT"])

    # ------------------------------------------------------------------ the grace
    def drain(self, runtime: Any, grace_s: float = GRACE_S) -> None:
        """Stop asking, then wait up to `grace_s` for the requests in flight (their answers are
        stored as they arrive); a second Ctrl-C or SIGTERM ends the wait at once."""
        self.draining = True
        previous_int = _set_handler(signal.SIGINT, lambda *_: self.hurry.set())
        try:
            _stop_asking(runtime)
            # Until nothing is in flight: a call that was already waiting for a free slot when the
            # run stopped may still send its request; its answer is waited for and kept too.
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and not self.hurry.is_set():
                if not sum(s.in_flight for s in runtime.pool.loads()):
                    break
                self.hurry.wait(0.05)
        finally:
            self.draining = False
            _set_handler(signal.SIGINT, previous_int)


def _stop_asking(runtime: Any) -> None:
    """No new question starts: the look-ahead stops feeding and the queued calls are dropped."""
    lookahead = getattr(runtime, "lookahead", None)
    if lookahead is not None:
        lookahead.stop()
    runtime.runner.close()


def _set_handler(signum: int, handler: Any) -> Any:
    if threading.current_thread() is not threading.main_thread() or handler is None:
        return None
    try:
        return signal.signal(signum, handler)
    except (ValueError, OSError):
        return None


def _is_xdist_controller(config: pytest.Config) -> bool:
    """An xdist controller whose workers are running items (before that, it stops as Ctrl-C
    stops it: its workers are still collecting, and are ended with it)."""
    if hasattr(config, "workerinput"):
        return False
    sched = getattr(config.pluginmanager.get_plugin("dsession"), "sched", None)
    return sched is not None and getattr(sched, "collection_is_completed", False)


def _worker_pids(config: pytest.Config) -> list[int]:
    """The pids of this controller's local xdist workers (execnet's popen gateways)."""
    dsession = config.pluginmanager.get_plugin("dsession")
    group = getattr(getattr(dsession, "nodemanager", None), "group", None)
    pids = []
    for gateway in list(group or ()):
        popen = getattr(getattr(gateway, "_io", None), "popen", None)
        pid = getattr(popen, "pid", None)
        if isinstance(pid, int) and popen is not None and popen.poll() is None:
            pids.append(pid)
    return pids


def _forward_to_workers(config: pytest.Config, signum: int) -> bool:
    sent = False
    for pid in _worker_pids(config):
        try:
            os.kill(pid, signum)
            sent = True
        except OSError:
            pass
    return sent


def _interrupt_later(stops: StopSignals, after_s: float) -> None:
    """The controller's own stop, should its workers not end in time."""
    time.sleep(after_s)
    if not stops.finishing:
        _thread.interrupt_main()
