"""How many requests each server gets in flight: one limiter per server.

(Over 500 lines: the two steering rules share one window and one history; split, each half
would need the other's state.)

vLLM batches continuously: a server's throughput grows with the requests it holds, up to its
`max_num_seqs` and its KV-cache room, and past that point extra requests only wait in its
queue. The right number differs per server and per model and changes during a run, so the
client finds it instead of asking the user to guess one global figure.

Two strategies behind one small protocol (`Limiter`), as pytest-xdist keeps its schedulers:

- `FixedLimit`: the limit is the cap, always (`--concurrency-control fixed`; with
  `--concurrency total:64` it is the plugin's behaviour before adaptive limits).
- `AdaptiveLimit`: starts moderately and finds the knee. When the server publishes vLLM's
  Prometheus metrics it steers by them: the batch is full when requests wait, so it raises
  the limit while nothing waits and trims it to keep a short queue (a few requests, never a
  long one); preemptions and a KV cache at its end back it off. Without metrics it steers by
  what the client sees (below). 429, 503, 504 and timeouts back it off at once (at most once
  per latency, since a burst of refusals is one event).

Without metrics: a latency gradient checked by throughput. Two server shapes must be told
apart by latency and completion rate alone. A continuous-batching server's latency grows with
its batch while its rate grows too, up to max_num_seqs; a server whose capacity does not grow
with concurrency (CPU-bound, a fixed-rate gateway or hosted endpoint) runs `k` requests at
once, and every request past `k` only waits, so latency grows with the limit and the rate
does not. The limit must end near the knee (the fewest in flight that reach the server's
rate), not at any count that is merely not slower: a queue held at the server hides its
failures, inflates latency and costs client threads and memory.

- Every judgement is of a settled window: it starts one latency after the change (requests
  sent right after a raise queue behind the old limit's, and a window that mixes them
  overrates the raise; that is how slow start used to overshoot past the knee), and after a
  cut, not before the requests sent under the higher limit have gone (else the window counts
  their load as the new limit's, rates it at the old limit's throughput, and the raises after
  it look like they do not pay).
- Slow start doubles while the rate's elasticity to the limit (d log rate / d log limit) is
  at least `ELASTIC`; by Little's law that is the gradient of latency against the limit
  staying below 1 - ELASTIC. A raise that does not pay ends it, and the search from above
  begins at once.
- The gradient, as TCP Vegas (Brakmo and Peterson, "TCP Vegas: end to end congestion
  avoidance on a global internet", IEEE JSAC 1995) and Netflix concurrency-limits' Gradient2
  (`Gradient2Limit`: short-window latency against a long-window one) compare latency: each
  judged window's mean latency is held against the least of the last `BASE_MEMORY_S` (the
  unloaded latency, kept as a windowed minimum as BBR keeps min_rtt). Latency `INFLATED`
  times that least, or no window at half the limit or fewer in that time (past the knee of
  a fixed-rate server every request waits alike, so the unloaded latency is unknown until
  fewer run: BBR's ProbeRTT drains its queue for the same reason), means requests may be
  queueing. Unlike Vegas and Gradient2, which would then shrink the limit by the latency
  ratio alone and so starve a batching server (its latency at a full batch is 2-3x its
  unloaded one), the limit is only moved by the search below, which throughput checks.
- The search from above, while requests may be queueing: halve the limit; a cut is kept
  unless the rate falls by more than `KNEE_LOSS` from the median rate of the last
  `BASE_MEMORY_S` at the limit cut from or above (so cuts cannot each lose a little, step
  after step). A cut that costs is judged again against the limit it was cut from, measured
  once more just after it: the machine's other work comes and goes, and a cut measured in a
  slow second would otherwise end the search (simulated: a 4-worker server whose speed is
  redrawn within +-10% every second was held at 19 in flight, 4.7x its unloaded latency).
  If it costs against that too it bounds the search from below for `BASE_MEMORY_S`, and the
  next cut is to the geometric middle of the bounds, until they are within 25%.
- A limit counts as filled when requests were in flight at it most of the time, or when the
  mean in flight was at least `USED_SHARE` of it (a client with some turnaround between an
  answer and the next request is at its limit only in moments). A limit the client does not
  fill while requests may be queueing is cut to what is used, on trial as a cut of the search
  (else no verdict ever comes: against a CPU-bound server on the client's own cores, 13 of 16
  in flight held the limit at 16 for a whole run, at 20x the unloaded latency). The knee of a fixed-rate server is so found in a
  handful of windows instead of the 0.8x steps (and their noisy verdicts) of steady state.
- Otherwise steady state probes as before: now and then 0.8x or 1.25x + 1, a change kept
  when the elasticity says so, and while latency is inflated a raise must show twice the
  elasticity. Probes back off (5 s doubling to `max_probe_interval_s`) when they fail.

Measured on a simulated clock (tests/limit_sim.py, tests/engine/test_limits_flat.py,
performance/limits_sim.py): flat servers of 4-16 workers, with and without a machine speed
that drifts, are held at their knee at their full rate and unloaded latency from the default
start (59 of 60 seeded runs; 32 of 60 before the search from above); the continuous-batching servers of
performance/fleet.py are still filled (docs/performance.md, "Short queues without metrics").

Everything is driven by the pool: `in_flight_changed` and `completed` on the request path
(cheap, under the pool's lock), `tick` from one control thread a few times a second. Limits
are floats inside (steps of a fraction of a request add up) and integers outside.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Protocol

__all__ = ["ELASTIC", "AdaptiveLimit", "EngineMetrics", "FixedLimit", "LimitPoint", "Limiter"]

# A raise is kept while the completion rate grows at least this fast with the limit
# (d log rate / d log limit). Below the knee of a continuous-batching server it is
# base / (base + per_seq * running), typically 0.4-1; past the knee it is 0.
ELASTIC = 0.2
# Latency this many times the least of the last BASE_MEMORY_S is a queue that must pay for
# itself (see "Without metrics" in the module docstring).
INFLATED = 1.5
# While latency is inflated, a cut is kept unless it loses more than this share of the rate.
KNEE_LOSS = 0.07
# A window whose mean in flight is below this share of the limit, unsaturated, while requests
# may queue at the server, moves the limit to what was used (see _by_rate).
USED_SHARE = 0.8
# How long a window's latency counts as the server's least (its unloaded latency).
BASE_MEMORY_S = 60.0
# How long a batch size counts as what the server "recently ran" (see _by_metrics).
PEAK_MEMORY_S = 30.0
# Kept short: a point per change at most, thinned when it grows past this.
HISTORY_POINTS = 2000


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """One scrape of a vLLM server's /metrics (summed over its engines)."""

    running: float  # vllm:num_requests_running
    waiting: float  # vllm:num_requests_waiting
    kv_cache_usage: float | None = None  # vllm:kv_cache_usage_perc (a fraction, 0-1)
    preemptions: float | None = None  # vllm:num_preemptions_total (a counter)


@dataclass(frozen=True, slots=True)
class LimitPoint:
    t: float  # seconds since the limiter started
    limit: int
    why: str  # "start", "raise", "trim", "back off", "revert", ...


class Limiter(Protocol):
    """A server's in-flight limit. Called under the pool's lock: methods must be quick."""

    @property
    def limit(self) -> int: ...

    @property
    def history(self) -> tuple[LimitPoint, ...]: ...

    def in_flight_changed(self, now: float, in_flight: int) -> None: ...

    def completed(self, now: float, latency_s: float) -> None: ...

    def overloaded(self, now: float) -> None: ...

    def tick(self, now: float, metrics: EngineMetrics | None) -> None: ...


class _History:
    def __init__(self, start: float) -> None:
        self.start = start
        self.points: list[LimitPoint] = []

    def add(self, now: float, limit: int, why: str) -> None:
        if self.points and self.points[-1].limit == limit:
            return
        self.points.append(LimitPoint(round(now - self.start, 3), limit, why))
        if len(self.points) > HISTORY_POINTS:  # keep the first and every other point after it
            self.points = self.points[:1] + self.points[1::2]


class FixedLimit:
    """The limit is the cap: no adaptation."""

    def __init__(self, cap: int, now: float) -> None:
        if cap < 1:
            raise ValueError(f"a concurrency limit must be >= 1, got {cap}")
        self._limit = cap
        self._history = _History(now)
        self._history.add(now, cap, "fixed")

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def history(self) -> tuple[LimitPoint, ...]:
        return tuple(self._history.points)

    def in_flight_changed(self, now: float, in_flight: int) -> None:
        pass

    def completed(self, now: float, latency_s: float) -> None:
        pass

    def overloaded(self, now: float) -> None:
        pass

    def tick(self, now: float, metrics: EngineMetrics | None) -> None:
        pass


@dataclass(slots=True)
class _Window:
    """What the server did while the limit held one value, from `started` on.

    `started` may lie ahead of the change that opened the window: requests sent just after
    a change still queue behind (or run beside) the old limit's, so their latency tells of
    neither limit; a window that settles first measures the new limit alone.
    """

    limit: float
    started: float
    in_flight: int = 0  # now
    changed: float = 0.0  # from when `in_flight` counts in `load`
    load: float = 0.0  # the integral of in_flight over time, up to `changed`
    busy_since: float | None = None  # in flight at the limit since then
    saturated_s: float = 0.0  # time with as many in flight as the limit allows
    latency_sum: float = 0.0  # of requests sent after `started`
    fresh: int = 0  # how many of those have completed
    settled: bool = False  # it waited out a latency after the change that opened it

    def __post_init__(self) -> None:
        self.changed = self.started

    def update(self, now: float, in_flight: int, at_limit: bool) -> None:
        if max(in_flight, self.in_flight) > int(self.limit) and not self.fresh and now > self.started:
            # a cut's requests sent under the higher limit are still in flight: the window
            # opens once they have gone, or its load would be the old limit's
            self.started = self.changed = now
            self.load = self.saturated_s = 0.0
            self.busy_since = None
        t = max(now, self.started)
        self.load += self.in_flight * (t - self.changed)
        self.in_flight, self.changed = in_flight, t
        if at_limit and self.busy_since is None:
            self.busy_since = t
        elif not at_limit and self.busy_since is not None:
            self.saturated_s += t - self.busy_since
            self.busy_since = None

    def span(self, now: float) -> float:
        return max(0.0, now - self.started)

    def saturation(self, now: float) -> float:
        t = max(now, self.started)
        held = self.saturated_s + (t - self.busy_since if self.busy_since is not None else 0.0)
        span = self.span(now)
        return held / span if span > 0 else 0.0

    def mean_in_flight(self, now: float) -> float:
        span = self.span(now)
        total = self.load + self.in_flight * (max(now, self.started) - self.changed)
        return total / span if span > 0 else float(self.in_flight)

    def rate(self, now: float) -> float:
        """Completions per second at this limit, by Little's law: the mean in flight over the
        mean latency of the requests sent in the window. Known one latency after the window
        starts, where counting completions would first see earlier requests end."""
        if not self.fresh or self.latency_sum <= 0:
            return 0.0
        return self.mean_in_flight(now) / (self.latency_sum / self.fresh)


class AdaptiveLimit:
    """Finds a server's knee: see the module docstring.

    `cap`: never more than this; `initial`: where it starts; `floor`: never fewer.
    Without metrics a limit is judged once `min_completions` requests sent under it (and at
    least half the limit) have completed, or 3 after four latencies, and at least
    `min_window_s` has passed.
    With metrics, `scrape_hold_s` is how long a change is given before the next one (vLLM
    admits waiting requests at its next step, tens of milliseconds; the scrape is what lags).
    `target_waiting`: the queue kept at the server, as a fraction of what runs (at least 2).
    """

    def __init__(self, now: float, *, cap: int, initial: int,
                 floor: int = 1, min_window_s: float = 0.4, min_completions: int = 20, scrape_hold_s: float = 0.5,
                 target_waiting: float = 0.04, max_probe_interval_s: float = 60.0) -> None:
        if cap < 1 or floor < 1:
            raise ValueError("concurrency limits must be >= 1")
        self.cap = cap
        self.floor = min(floor, cap)
        self._limit = float(min(max(initial, self.floor), cap))
        self._min_window_s = min_window_s
        self._min_completions = min_completions
        self._scrape_hold_s = scrape_hold_s
        self._target_waiting = target_waiting  # as a fraction of what runs; at least 2 requests
        self._max_probe_interval_s = max_probe_interval_s
        self._history = _History(now)
        self._history.add(now, self.limit, "start")
        self._in_flight = 0
        self._window = _Window(self._limit, now)
        self._latencies: deque[float] = deque(maxlen=64)  # recent, for the window's length
        self._slow_start = True  # doubling until the first raise that does not pay
        self._probe_up = False  # the direction of the next steady-state probe
        self._judged_twice = False  # the raise on trial in slow start failed once already
        # a change on trial: (the limit before it, the rate measured there, whether it is a
        # cut of the search for the knee from above while latency is inflated)
        self._trial: tuple[float, float, bool] | None = None
        # the last limit found to lose throughput by the search from above, and when
        self._knee_below: tuple[float, float] | None = None
        # a cut of the search found costly once, while the limit it was cut from is measured
        # again: (the cut, its rate)
        self._recheck: tuple[float, float] | None = None
        self._last_rate: float | None = None  # at the current limit, once measured
        # judged windows of the last BASE_MEMORY_S: (time, limit, mean latency, rate)
        self._base: deque[tuple[float, float, float, float]] = deque()
        self._inflated = False  # the last window's latency was INFLATED x the least of late
        self._next_probe_at = now
        self._probe_interval_s = 5.0
        self._backed_off_at = -math.inf
        self._changed_at = now
        self._preemptions: float | None = None
        self._running: deque[tuple[float, float]] = deque()  # (time, running) scraped lately
        self._queued_scrapes = 0  # scrapes in a row that saw a queue behind a full batch
        self.metrics_seen = False

    # ------------------------------------------------------------------ protocol
    @property
    def limit(self) -> int:
        return max(self.floor, min(self.cap, int(self._limit)))

    @property
    def history(self) -> tuple[LimitPoint, ...]:
        return tuple(self._history.points)

    def in_flight_changed(self, now: float, in_flight: int) -> None:
        self._in_flight = in_flight
        self._window.update(now, in_flight, in_flight >= self.limit)

    def completed(self, now: float, latency_s: float) -> None:
        self._latencies.append(latency_s)
        w = self._window
        if now - latency_s >= w.started:  # sent under the current limit
            w.fresh += 1
            w.latency_sum += latency_s

    def overloaded(self, now: float) -> None:
        """429, 503, 504 or a timeout: the server says it has more than it can take."""
        if now - self._backed_off_at < max(0.1, self._latency()):
            return  # the same overload, seen by the requests in flight at once
        self._backed_off_at = now
        self._slow_start = False
        self._trial = self._recheck = None
        self._judged_twice = False
        self._set(now, max(self.floor, self._limit * 0.7), "back off")
        self._probe_interval_s = min(self._max_probe_interval_s, self._probe_interval_s * 2)
        self._next_probe_at = now + self._probe_interval_s

    def tick(self, now: float, metrics: EngineMetrics | None) -> None:
        if metrics is not None:
            self.metrics_seen = True
            self._by_metrics(now, metrics)
        else:
            self._by_rate(now)

    # ------------------------------------------------------------------ with metrics
    def _by_metrics(self, now: float, m: EngineMetrics) -> None:
        preempted = self._preemptions is not None and m.preemptions is not None and m.preemptions > self._preemptions
        if m.preemptions is not None:
            self._preemptions = m.preemptions
        if now - self._changed_at < self._scrape_hold_s:
            return
        if preempted:  # the KV cache ran out and vLLM evicted running requests
            self.overloaded(now)
            return
        # Requests that arrived since the engine's last step wait for the next one even when
        # the batch has room: a queue means "full" only while the batch runs as big as it
        # has recently run. Trimming on arrivals would shrink a server with room, step by
        # step, to nothing.
        self._running.append((now, m.running))
        while self._running and self._running[0][0] < now - PEAK_MEMORY_S:
            self._running.popleft()
        peak = max(r for _, r in self._running)
        full = m.running > 0 and m.running >= 0.9 * peak
        target = max(4.0, self._target_waiting * m.running)
        queued = full and m.waiting > 2 * target
        self._queued_scrapes = self._queued_scrapes + 1 if queued else 0
        mine = self._in_flight
        if self._queued_scrapes >= 2 and mine <= self._limit:  # a queue that lasts, not arrivals
            # Our share of what runs, plus our share of a short queue (under xdist the other
            # processes see the same server and each keeps its own share). Not again while
            # the requests of a trim are still in flight: the queue they form is that trim's.
            total = m.running + m.waiting
            share = mine / total if total > 0 else 1.0
            self._slow_start = False
            self._queued_scrapes = 0
            self._set(now, max(self.floor, (m.running + target) * share), "trim")
            return
        if full and m.waiting >= 1:
            return  # the batch is full and a short queue keeps it full: hold
        if self._window.saturation(now) < 0.5:
            return  # we do not fill the limit: nothing to learn by raising it
        if m.kv_cache_usage is not None and m.kv_cache_usage >= 0.97:
            return  # no room for more sequences, whatever max_num_seqs allows
        step = self._limit if self._slow_start else max(2.0, 0.1 * self._limit)
        self._set(now, self._limit + step, "raise")

    # ------------------------------------------------------------------ without metrics
    def _latency(self) -> float:
        if not self._latencies:
            return 0.0
        s = sorted(self._latencies)
        return s[len(s) // 2]

    def _by_rate(self, now: float) -> None:
        w = self._window
        span = w.span(now)
        patience = 4 * max(self._latency(), self._min_window_s)
        # Half the requests in flight, at least: completions of a batch come in waves, and a
        # few of one wave tell the phase of the wave, not the rate.
        enough = max(self._min_completions, int(0.5 * self.limit))
        if span < self._min_window_s or w.fresh < (enough if span < patience else 3):
            return
        used = w.mean_in_flight(now)
        # the limit binds: in flight at it most of the time, or nearly as many on average (a
        # client with turnaround between an answer and the next request is at the limit only
        # in moments, yet holds more with a higher one)
        saturated = w.saturation(now) >= 0.6 or used >= USED_SHARE * self._limit
        rate = w.rate(now)
        if w.settled or w.started > self._changed_at:  # (the first window ramps up from 0)
            self._inflated = self._note(now, w.latency_sum / w.fresh, rate)
        if self._recheck is not None:
            self._judge_recheck(now, rate)
            return
        if self._trial is not None:
            before, before_rate, searching = self._trial
            self._trial = None
            if not saturated and not searching:
                # the client did not fill the new limit: nothing was learnt, and a limit
                # nobody uses only hides how much work is queued
                self._set(now, before, "revert")
                self._last_rate = before_rate
                return
            gain = _elasticity(before_rate, rate, before, self._limit)
            raised = self._limit > before
            if raised:  # while latency is inflated, a raise must pay twice as much
                pays = gain >= (2 * ELASTIC if self._inflated and not self._slow_start else ELASTIC)
            elif searching:  # a cut while requests queued: kept unless it clearly costs
                pays = rate >= (1 - KNEE_LOSS) * self._reference(before, before_rate)
            else:
                pays = gain < ELASTIC
            if searching and not pays and not self._judged_twice:
                # the machine's other work comes and goes: a cut found costly once is held
                # against `before` measured again right after it, the nearest rate in time
                # (a slowdown of the whole machine during the cut then lowers it too)
                self._judged_twice = True
                self._recheck = (self._limit, rate)
                self._set(now, before, "revert")
                return
            if pays:  # a raise that pays, or a cut that costs nothing
                if raised:
                    self._knee_below = None
                self._judged_twice = False
                self._last_rate = rate
                self._probe_interval_s = 5.0
                self._new_window(now)
                if self._slow_start:
                    self._probe(now, rate, up=True)
                else:  # it paid: go on the same way at the next verdict
                    self._probe_up = raised
                    self._next_probe_at = now
                return
            if self._slow_start and not self._judged_twice:
                # One verdict on a loaded client can be noise, and ending slow start too low
                # costs throughput for the rest of the run while a raise past the knee costs
                # only queueing: judge the same raise once more, settled, before going back.
                self._judged_twice = True
                self._trial = (before, before_rate, False)
                self._new_window(now, settle=True)
                return
            # the raise only added waiting, or the cut lost completions: go back, and probe
            # less often from now on
            ended_slow_start = self._slow_start
            self._slow_start = self._judged_twice = False
            self._last_rate = before_rate
            self._set(now, before, "revert")
            if ended_slow_start:
                # the knee is at or below `before`: look for it from above at once
                self._next_probe_at = now
            else:
                self._probe_interval_s = min(self._max_probe_interval_s, self._probe_interval_s * 2)
                self._next_probe_at = now + self._probe_interval_s
            self._probe_up = not raised
            return
        self._last_rate = rate
        settled = w.settled
        self._new_window(now)
        if not saturated and self._queued():
            # The client keeps fewer in flight than the limit (its own work is the bottleneck),
            # and they may queue at the server: no verdict of this limit would ever come, so the
            # search goes on from what is used, a cut like the others, checked by throughput
            # (a cut to what is used clips its peaks and so lowers it further). Measured
            # against a CPU-bound server on the client's own 2 cores: 13 of 16 in flight held
            # the limit at 16 for a whole run, at 20x the unloaded latency
            # (performance/short_queues.py).
            target = max(float(self.floor), math.ceil(used))
            if int(target) < self.limit:
                self._trial = (self._limit, rate, True)
                self._set(now, target, "trim")
                return
        if saturated and not self._slow_start and self._queued() and self._search_target(now) is not None:
            # requests queue at the server: look for fewer at once
            self._probe_up = False
            self._next_probe_at = now
        if saturated and (self._slow_start or now >= self._next_probe_at):
            if not self._slow_start and not settled:
                # a steady-state verdict needs a sound baseline: slow start's rates are not
                # settled (and run high past the knee), so measure this limit settled first
                self._new_window(now, settle=True)
                return
            self._probe(now, rate, up=self._slow_start or self._probe_up)

    def _judge_recheck(self, now: float, rate: float) -> None:
        """A cut of the search found costly once, judged against the limit it was cut from as
        measured again just after it (`rate`, now): kept if it lost at most KNEE_LOSS of that;
        else it bounds the search from below."""
        assert self._recheck is not None
        cut, cut_rate = self._recheck
        self._recheck = None
        self._judged_twice = False
        self._new_window(now)
        if cut_rate >= (1 - KNEE_LOSS) * rate:
            self._last_rate = cut_rate
            self._knee_below = None
            self._set(now, cut, "cut")
            self._probe_up, self._next_probe_at = False, now
            return
        self._knee_below = (cut, now)
        self._last_rate = rate
        self._probe_up, self._next_probe_at = False, now

    def _probe(self, now: float, rate: float, *, up: bool) -> None:
        """Try another limit: up (doubling in slow start), or down to find the knee from
        above (past it, fewer requests in flight lose no completions, only queueing)."""
        before = self._limit
        if up:
            if self.limit >= self.cap:
                if self._slow_start:  # doubled up to the cap: measure it settled, then cut
                    self._slow_start = False
                    self._new_window(now, settle=True)
                    return
                up = False
            else:
                target = 2 * before if self._slow_start else before * 1.25 + 1
        searching = False
        if not up:
            if self.limit <= self.floor:
                return
            target = before * 0.8
            if self._queued():
                found = self._search_target(now)
                if found is None:
                    return  # the knee is within a step below: hold
                target, searching = found, True
        if max(self.floor, min(self.cap, int(target))) == self.limit:
            return
        self._trial = (before, rate, searching)
        self._set(now, target, "raise" if up else "cut")
        self._next_probe_at = now + self._probe_interval_s

    def _queued(self) -> bool:
        """Whether requests may be queueing at the server: latency is inflated, or nothing
        of late ran at half this limit or fewer, so the unloaded latency is not known (past
        the knee of a fixed-rate server every request waits alike; BBR's ProbeRTT drains
        its queue now and then for the same reason)."""
        since = self._changed_at - BASE_MEMORY_S
        return self._inflated or not any(b[1] <= self._limit / 2 for b in self._base if b[0] >= since)

    def _search_target(self, now: float) -> float | None:
        """The next cut of the search from above: half the limit, or the geometric middle
        between it and the last limit that lost throughput; None once they are within 25%."""
        below = self._knee_below
        if below is not None and below[1] < now - BASE_MEMORY_S:
            below = self._knee_below = None
        if below is None:
            return max(float(self.floor), self._limit / 2)
        if self._limit <= 1.25 * below[0] or int(math.sqrt(below[0] * self._limit)) <= below[0]:
            return None
        return math.sqrt(below[0] * self._limit)

    def _note(self, now: float, latency: float, rate: float) -> bool:
        """Remember a judged window; whether its mean latency is INFLATED x the least of the
        last BASE_MEMORY_S (Vegas' BaseRTT, kept as a windowed minimum as BBR keeps min_rtt)."""
        self._base.append((now, self._limit, latency, rate))
        while self._base and self._base[0][0] < now - BASE_MEMORY_S:
            self._base.popleft()
        return latency >= INFLATED * min(b[2] for b in self._base)

    def _reference(self, limit: float, rate: float) -> float:
        """The rate a cut from `limit` is held to: the median of what the last BASE_MEMORY_S
        measured at `limit` or more, or the rate just measured there if higher. Cuts judged
        each against the one before could lose a few percent each, step after step."""
        above = sorted(b[3] for b in self._base if b[1] >= limit)
        return max(rate, above[len(above) // 2]) if above else rate

    # ------------------------------------------------------------------ bookkeeping
    def _set(self, now: float, limit: float, why: str) -> None:
        self._limit = float(min(max(limit, self.floor), self.cap))
        self._changed_at = now
        self._history.add(now, self.limit, why)
        # Without metrics every verdict waits one latency first: requests sent right after a
        # raise queue behind the old limit's, so an unsettled window sees the new limit's
        # load with the old limit's latency and overrates it (past the knee of a fixed-rate
        # server, a doubling looks a third faster), which is how slow start overshot. With
        # metrics the queue is read, not inferred: slow start raises as soon as the batch is
        # seen to be filled.
        self._new_window(now, settle=not (self.metrics_seen and self._slow_start))

    def _new_window(self, now: float, settle: bool = False) -> None:
        self._window = _Window(self._limit, now + (self._latency() if settle else 0.0), settled=settle)
        self.in_flight_changed(now, self._in_flight)


def _elasticity(rate0: float, rate1: float, limit0: float, limit1: float) -> float:
    """d log rate / d log limit between two measured points; 0 when it cannot be told."""
    if rate0 <= 0 or rate1 <= 0 or limit1 == limit0:
        return 0.0 if rate1 <= rate0 else 1.0
    return math.log(rate1 / rate0) / math.log(limit1 / limit0)
