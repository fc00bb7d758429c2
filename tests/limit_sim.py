"""A simulated clock for the in-flight limiters (engine/limits.py): deterministic servers and a
client that keeps as many requests in flight as the limiter allows, with no thread and no
socket, so a controller's behaviour over minutes of traffic is computed in milliseconds and is
the same on every run and under any load.

Two servers, the two shapes a limiter must tell apart:

- `FlatServer(workers, service_s)`: a server whose capacity does not grow with concurrency
  (a CPU-bound server, a fixed-rate gateway): `workers` requests are served at once, each for
  `service_s` seconds, the rest wait in a FIFO. Its knee is `workers`: fewer in flight lose
  throughput, more only queue.
- `BatchServer(params)`: tests/fleet_sim.py's continuous-batching arithmetic (a step takes
  base + per_seq x running ms, a request needs output_tokens steps, at most max_num_seqs run),
  stepped on the simulated clock: throughput grows with the batch up to max_num_seqs.

`jitter` (a fraction) scales each service time or step by a seeded uniform factor, as a loaded
machine does; `drive` ticks the limiter every `tick_s` as the pool's control thread does
(engine/client.py, CONTROL_PERIOD_S) and records every completion.
"""

from __future__ import annotations

import heapq
import itertools
import random
import statistics
from collections import deque
from dataclasses import dataclass, field

from fleet_sim import EngineParams

from pytest_satbench.engine.limits import Limiter


class FlatServer:
    def __init__(self, workers: int, service_s: float, jitter: float = 0.0, seed: int = 0,
                 drift: float = 0.0, drift_period_s: float = 1.0) -> None:
        self.workers, self.service_s, self.jitter = workers, service_s, jitter
        self.drift, self.drift_period_s = drift, drift_period_s
        self._free = [0.0] * workers  # when each worker is next free (a heap)
        self._rng = random.Random(seed)
        self._speeds: dict[int, float] = {}

    def _speed(self, t: float) -> float:
        """The machine's speed factor in the drift period holding t (other work comes and goes)."""
        k = int(t / self.drift_period_s)
        if k not in self._speeds:
            self._speeds[k] = 1 + self.drift * self._rng.uniform(-1, 1)
        return self._speeds[k]

    @property
    def capacity_rps(self) -> float:
        return self.workers / self.service_s

    @property
    def unloaded_s(self) -> float:
        return self.service_s

    def submit(self, now: float) -> float:
        """A request arrives now: the time it completes (FIFO: arrivals come in time order)."""
        start = max(now, heapq.heappop(self._free))
        done = start + self.service_s * (1 + self.jitter * self._rng.uniform(-1, 1)) / self._speed(start)
        heapq.heappush(self._free, done)
        return done


class BatchServer:
    """Continuous batching on the simulated clock. Completion times depend on later arrivals
    (they join the batch and slow its steps), so requests complete through `advance`."""

    def __init__(self, params: EngineParams, jitter: float = 0.0, seed: int = 0) -> None:
        self.p, self.jitter = params, jitter
        self._rng = random.Random(seed)
        self._waiting: deque[int] = deque()
        self._running: dict[int, int] = {}  # request -> steps still needed
        self._step_end: float | None = None  # the running step's end; None when idle

    @property
    def capacity_rps(self) -> float:
        return self.p.capacity_rps

    @property
    def unloaded_s(self) -> float:
        return self.p.output_tokens * self.p.step_ms(1) / 1000

    def submit(self, now: float, rid: int) -> None:
        self._waiting.append(rid)
        if self._step_end is None:
            self._start_step(now)

    def next_event(self) -> float | None:
        return self._step_end

    def advance(self) -> list[int]:
        """End the running step: the requests it completed (the next step starts at once)."""
        assert self._step_end is not None
        now = self._step_end
        done = []
        for rid in list(self._running):
            self._running[rid] -= 1
            if self._running[rid] == 0:
                del self._running[rid]
                done.append(rid)
        self._step_end = None
        if self._running or self._waiting:
            self._start_step(now)
        return done

    def _start_step(self, now: float) -> None:
        while self._waiting and len(self._running) < self.p.max_num_seqs:
            self._running[self._waiting.popleft()] = self.p.output_tokens
        step = self.p.step_ms(len(self._running)) / 1000
        self._step_end = now + step * (1 + self.jitter * self._rng.uniform(-1, 1))


@dataclass
class SimRun:
    done: list[tuple[float, float]] = field(default_factory=list)  # (completed at, latency)
    max_in_flight: int = 0

    def window(self, t0: float, t1: float) -> tuple[float, float]:
        """(completions per second, median latency) of the requests completed in [t0, t1)."""
        sel = [lat for t, lat in self.done if t0 <= t < t1]
        return len(sel) / (t1 - t0), statistics.median(sel) if sel else float("nan")


def drive(limiter: Limiter, server: FlatServer | BatchServer, seconds: float, tick_s: float = 0.25,
          start: float = 0.0, turnaround_s: float = 0.0) -> SimRun:
    """Keep `limiter.limit` requests in flight on `server` for `seconds` of simulated time.

    `turnaround_s`: the client's own work between an answer and the request that takes its
    place (a loaded client preparing the next image): a freed slot is refilled that much later,
    so a client whose turnaround is not small against the latency keeps fewer in flight than
    the limit allows."""
    run = SimRun()
    events: list[tuple[float, int, int]] = []  # (time, order, request) for FlatServer completions
    refills: list[float] = []  # when each freed slot can be refilled (a heap)
    sent: dict[int, float] = {}
    ids = itertools.count()
    order = itertools.count()
    now = start
    next_tick = start + tick_s
    end = start + seconds

    def fill() -> None:
        while refills and refills[0] <= now:
            heapq.heappop(refills)
        while len(sent) + len(refills) < limiter.limit:
            rid = next(ids)
            sent[rid] = now
            limiter.in_flight_changed(now, len(sent))
            run.max_in_flight = max(run.max_in_flight, len(sent))
            if isinstance(server, FlatServer):
                heapq.heappush(events, (server.submit(now), next(order), rid))
            else:
                server.submit(now, rid)

    def complete(rid: int) -> None:
        latency = now - sent.pop(rid)
        if turnaround_s > 0:
            heapq.heappush(refills, now + turnaround_s)
        run.done.append((now, latency))
        limiter.completed(now, latency)
        limiter.in_flight_changed(now, len(sent))

    fill()
    while now < end:
        t_server = events[0][0] if events else server.next_event() if isinstance(server, BatchServer) else None
        if refills and refills[0] < min(next_tick, t_server if t_server is not None else next_tick):
            now = refills[0]  # a slot is free again: fill() sends into it
        elif t_server is not None and t_server < next_tick:
            now = t_server
            if isinstance(server, FlatServer):
                complete(heapq.heappop(events)[2])
            else:
                for rid in server.advance():
                    complete(rid)
        else:
            now = next_tick
            next_tick += tick_s
            limiter.tick(now, None)
        fill()
    return run
