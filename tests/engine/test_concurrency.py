"""Adaptive per-server concurrency against the continuous-batching simulator (tests/fleet_sim.py).

Small, fast engines: a step takes base + per_seq x running milliseconds and a request needs a
few tokens, so a batch of 32 answers in about 170 ms and a test lasts seconds. The pool is
the real ServerPool over real HTTP; the assertions are about what the simulator saw (its
running batch, its queue) and about the limits the pool chose.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from fleet_sim import EngineParams, SimServer

from pytest_satbench.engine.client import ServerPool
from pytest_satbench.engine.concurrency import ConcurrencySpec
from pytest_satbench.engine.limits import AdaptiveLimit, EngineMetrics, FixedLimit
from pytest_satbench.engine.metrics import parse

MODEL = "sim-model"
# 32 sequences at most; a full batch steps in 5 + 0.5 x 32 = 21 ms, 8 tokens: 168 ms a request
SMALL = EngineParams(max_num_seqs=32, base_ms=5.0, per_seq_ms=0.5, output_tokens=8, model=MODEL)


class Driver:
    """Keeps `threads` requests queued on the pool for `seconds` (or until stopped) and
    records when each answer arrived."""

    def __init__(self, pool: ServerPool, threads: int = 160) -> None:
        self.pool = pool
        self.threads = threads
        self.done: list[float] = []
        self.errors = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def _loop(self, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            try:
                self.pool.ask(model=MODEL, prompt=f"q{i}-{n}", image_jpeg=None, max_tokens=64)
            except Exception:
                with self._lock:
                    self.errors += 1
                continue
            with self._lock:
                self.done.append(time.monotonic())

    def run(self, seconds: float, during: Callable[[float], None] | None = None) -> None:
        start = time.monotonic()
        with ThreadPoolExecutor(self.threads) as ex:
            for i in range(self.threads):
                ex.submit(self._loop, i)
            while (now := time.monotonic()) - start < seconds:
                if during is not None:
                    during(now - start)
                time.sleep(0.05)
            self._stop.set()

    def rate(self, since: float, until: float) -> float:
        """Answers per second between two monotonic times."""
        n = sum(1 for t in self.done if since <= t < until)
        return n / (until - since)


def pool_for(*servers: SimServer, **spec: object) -> ServerPool:
    pool = ServerPool([s.url for s in servers], concurrency=ConcurrencySpec(**spec), timeout=30,  # type: ignore[arg-type]  # spec: the case's ConcurrencySpec fields
                      backoff_base=0.05, backoff_max=0.2, retries=6)
    pool.health_check()
    return pool


@pytest.mark.parametrize("metrics", [True, False], ids=["metrics", "latency"])
def test_converges_to_the_knee_within_a_bounded_time(metrics: bool) -> None:
    with SimServer(SMALL) as sim, pool_for(sim, metrics=metrics, initial=4) as pool:
        drv = Driver(pool)
        t0 = time.monotonic()
        drv.run(8.0)
        limits = pool.usage()[sim.url]
    reached = next((p.t for p in limits.limit_history if p.limit >= SMALL.max_num_seqs), None)
    assert reached is not None and reached < 5.0, limits.limit_history  # 4 -> 32 in a few steps
    # the last 3 s run at the knee: nearly the engine's capacity
    assert drv.rate(t0 + 5.0, t0 + 8.0) >= 0.7 * SMALL.capacity_rps, (drv.rate(t0 + 5.0, t0 + 8.0), limits.limit_history)
    assert sim.stats().max_running_seen <= SMALL.max_num_seqs
    assert limits.steered_by == ("metrics" if metrics else "latency")
    if metrics:
        # steering by the queue keeps a short one: the limit ends near the batch, not at the ceiling
        assert limits.limit is not None and limits.limit <= 1.5 * SMALL.max_num_seqs, limits.limit_history
    assert drv.errors == 0


@pytest.mark.parametrize("status", [503, 429])
def test_backs_off_when_the_server_refuses(status: int) -> None:
    # a gateway that refuses once 4 requests wait; no metrics, so only the refusals tell
    params = EngineParams(max_num_seqs=32, base_ms=5.0, per_seq_ms=0.5, output_tokens=8, model=MODEL,
                          metrics=False, max_waiting=4, reject_status=status)
    with SimServer(params) as sim, pool_for(sim, initial=16) as pool:
        drv = Driver(pool)
        drv.run(6.0)
        usage = pool.usage()[sim.url]
        rejected = sim.stats().rejected
    assert rejected > 0  # the run did reach the refusals
    whys = [p.why for p in usage.limit_history]
    assert "back off" in whys, usage.limit_history
    peak = max(p.limit for p in usage.limit_history)
    assert usage.limit is not None and usage.limit < peak
    assert drv.errors == 0  # every refusal was retried to an answer


def test_never_exceeds_a_cap() -> None:
    with SimServer(SMALL) as a, SimServer(SMALL) as b:
        with pool_for(a, b, per_server=6) as pool:
            Driver(pool).run(2.0)
            assert max(u.max_in_flight for u in pool.usage().values()) <= 6
        assert a.stats().max_running_seen <= 6 and b.stats().max_running_seen <= 6
        with pool_for(a, b, total=10) as pool:
            Driver(pool).run(2.0)
            assert pool.peak_in_flight() <= 10
            assert all(u.limit is not None and u.limit <= 10 for u in pool.usage().values())
        with pool_for(a, b, total=5, adaptive=False) as pool:  # the old behaviour: one shared figure
            Driver(pool).run(1.0)
            assert pool.peak_in_flight() == 5


def test_recovers_after_a_slowdown() -> None:
    with SimServer(SMALL) as sim, pool_for(sim, metrics=False, initial=8) as pool:
        drv = Driver(pool)
        t0 = time.monotonic()

        def slow_then_back(elapsed: float) -> None:
            if 3.0 <= elapsed < 5.0 and sim.engine.speed != 0.5:
                sim.set_speed(0.5)
            elif elapsed >= 5.0 and sim.engine.speed != 1.0:
                sim.set_speed(1.0)

        drv.run(9.0, during=slow_then_back)
        usage = pool.usage()[sim.url]
    slow = drv.rate(t0 + 3.5, t0 + 5.0)
    after = drv.rate(t0 + 7.0, t0 + 9.0)
    assert slow < 0.7 * SMALL.capacity_rps  # the slowdown was real
    assert after >= 0.7 * SMALL.capacity_rps, (slow, after, " ".join(f"{p.t}:{p.limit}:{p.why}" for p in usage.limit_history))
    assert usage.limit is not None and usage.limit >= SMALL.max_num_seqs * 0.8


def test_a_slow_server_gets_less_of_a_fleet() -> None:
    with SimServer(SMALL) as fast, SimServer(SMALL) as slow, pool_for(fast, slow, initial=8) as pool:
        slow.set_speed(0.25)
        drv = Driver(pool)
        drv.run(5.0)
        usage = pool.usage()
    share = usage[slow.url].answered / (usage[slow.url].answered + usage[fast.url].answered)
    assert share < 0.35, share  # a quarter of the speed: a fifth of the capacity


# ---------------------------------------------------------------------- the limiter alone

def test_fixed_limit_never_moves() -> None:
    lim = FixedLimit(7, now=0.0)
    lim.overloaded(1.0)
    lim.tick(2.0, EngineMetrics(running=1, waiting=100))
    assert lim.limit == 7 and [p.limit for p in lim.history] == [7]


def test_metrics_trim_a_lasting_queue_and_hold_a_short_one() -> None:
    lim = AdaptiveLimit(0.0, initial=100, cap=512)
    lim.in_flight_changed(0.0, 100)
    lim.tick(1.0, EngineMetrics(running=60, waiting=40))  # one scrape: maybe a burst of arrivals
    assert lim.limit == 100
    lim.tick(2.0, EngineMetrics(running=60, waiting=40))  # it lasts: take the queue back
    assert lim.limit == 64  # what runs, plus a short queue (4)
    lim.in_flight_changed(2.0, 64)
    for t in (3.0, 4.0, 5.0):
        lim.tick(t, EngineMetrics(running=60, waiting=3))  # a short queue keeps the batch full
    assert lim.limit == 64


def test_arrivals_waiting_for_the_next_step_are_no_queue() -> None:
    # the batch ran 60 lately; now it runs 30 and requests wait for the next engine step
    lim = AdaptiveLimit(0.0, initial=100, cap=512)
    lim.in_flight_changed(0.0, 50)
    lim.tick(1.0, EngineMetrics(running=60, waiting=0))
    for t in (2.0, 3.0, 4.0, 5.0):
        lim.tick(t, EngineMetrics(running=30, waiting=20))
    assert lim.limit == 100 and [p.why for p in lim.history] == ["start"]


def test_a_trim_is_not_repeated_while_its_requests_drain() -> None:
    lim = AdaptiveLimit(0.0, initial=512, cap=512)
    lim.in_flight_changed(0.0, 512)
    for t in (1.0, 2.0):
        lim.tick(t, EngineMetrics(running=256, waiting=256))
    assert lim.limit == 266
    for t in (3.0, 4.0, 5.0):  # 400 still in flight: the queue is the trim's own
        lim.in_flight_changed(t, 400)
        lim.tick(t, EngineMetrics(running=256, waiting=144))
    assert lim.limit == 266


def test_preemptions_back_off() -> None:
    lim = AdaptiveLimit(0.0, initial=100, cap=512)
    lim.tick(1.0, EngineMetrics(running=100, waiting=0, preemptions=0))
    before = lim.limit
    lim.tick(2.0, EngineMetrics(running=100, waiting=0, preemptions=3))
    assert lim.limit < before and lim.history[-1].why == "back off"


def test_a_burst_of_refusals_is_one_back_off() -> None:
    lim = AdaptiveLimit(0.0, initial=100, cap=512)
    for i in range(50):
        lim.overloaded(1.0 + i * 0.001)
    assert lim.limit == 70


def test_vllm_metrics_page_is_read() -> None:
    page = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 7.0
vllm:num_requests_running{engine="1",model_name="m"} 5.0
vllm:num_requests_running{engine="0",model_name="other"} 99.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
python_gc_objects_collected_total{generation="0"} 1.0
"""
    m = parse(page, "m")
    assert m == EngineMetrics(running=12.0, waiting=3.0, kv_cache_usage=0.75, preemptions=2.0)
    assert parse("<html>not found</html>") is None
    assert parse("vllm:num_requests_waiting 1\n") is None  # no running count: not a page to steer by


def test_the_simulator_page_is_read_as_vllm_s() -> None:
    with SimServer(SMALL) as sim:
        import urllib.request

        text = urllib.request.urlopen(sim.url + "/metrics", timeout=5).read().decode()
    m = parse(text, MODEL)
    assert m is not None and m.running == 0 and m.waiting == 0 and m.kv_cache_usage == 0.0
