"""The no-metrics limiter on a simulated clock (tests/limit_sim.py): deterministic, no threads.

A server whose capacity does not grow with concurrency (a CPU-bound server, a fixed-rate
gateway) must be held near its knee, the smallest in-flight count that reaches its throughput:
past it requests only queue. A continuous-batching server's throughput grows with its batch up
to max_num_seqs, and its latency with it: the same rules must still take the batch there.
"""

from __future__ import annotations

import pytest
from fleet_sim import EngineParams
from limit_sim import BatchServer, FlatServer, drive

from pytest_satbench.engine.concurrency import ConcurrencySpec
from pytest_satbench.engine.limits import AdaptiveLimit


@pytest.mark.parametrize(("workers", "service_s", "drift"), [
    (4, 0.02, 0.0), (4, 0.02, 0.1), (8, 0.05, 0.1), (8, 0.1, 0.1), (16, 0.01, 0.0)])
def test_a_flat_server_is_held_near_its_knee(workers: int, service_s: float, drift: float) -> None:
    srv = FlatServer(workers, service_s, jitter=0.3, seed=1, drift=drift)
    lim = ConcurrencySpec().limiter(0.0)  # the defaults: 32 in flight, 8x past a 4-worker knee
    run = drive(lim, srv, 40.0)
    rate, median = run.window(15.0, 40.0)
    assert rate >= 0.9 * srv.capacity_rps, (rate, lim.history)
    assert median <= 1.5 * srv.unloaded_s, (median, lim.history)
    assert lim.limit <= 1.5 * workers + 1, lim.history


@pytest.mark.parametrize("params", [
    EngineParams(max_num_seqs=32, base_ms=5.0, per_seq_ms=0.5, output_tokens=8),  # tests/engine/test_concurrency.py's
    EngineParams(max_num_seqs=64),  # performance/fleet.py's small server
    EngineParams(max_num_seqs=256),  # and its big one
], ids=["small", "fleet64", "fleet256"])
def test_a_batching_server_is_still_filled(params: EngineParams) -> None:
    srv = BatchServer(params, jitter=0.3, seed=1)
    lim = AdaptiveLimit(0.0, cap=512, initial=4 if params.max_num_seqs <= 32 else 32)
    seconds = 40.0 if params.max_num_seqs <= 32 else 120.0
    run = drive(lim, srv, seconds)
    rate, _ = run.window(seconds / 4, seconds)
    assert rate >= 0.9 * srv.capacity_rps, (rate, srv.capacity_rps, lim.history)


def test_a_cut_that_costs_once_is_measured_against_its_limit_again() -> None:
    # Drift redraws the machine's speed every second: the halving from 32 to 16 lands in a
    # slow second and looks 11% dearer than the 32 before it. Measured again at 32 just after,
    # it costs nothing, and the search goes on down to the knee.
    srv = FlatServer(4, 0.02, jitter=0.3, seed=1, drift=0.1)
    lim = AdaptiveLimit(0.0, cap=512, initial=32)
    rate, median = drive(lim, srv, 40.0).window(15.0, 40.0)
    assert lim.limit <= 7 and median <= 1.5 * srv.unloaded_s, [(p.t, p.limit, p.why) for p in lim.history]
    assert rate >= 0.9 * srv.capacity_rps


def test_a_bound_on_the_search_is_forgotten_after_a_minute() -> None:
    # A cut to 14 found costly at t=10 bounds the search: 16 is within 25% of it, so the
    # search holds. The bound is dropped a minute later, whether or not the limit moved in
    # between (it used to count from the last change, so a limit held at the bound kept it).
    lim = AdaptiveLimit(0.0, cap=512, initial=16)
    lim._knee_below = (14.0, 10.0)
    assert lim._search_target(30.0) is None
    assert lim._search_target(71.0) == 8.0  # forgotten: half the limit again


def test_a_cut_s_window_opens_once_the_higher_limit_s_requests_have_gone() -> None:
    # Cut from 32 to 8 with 32 in flight: until 24 of them have completed, the load is the old
    # limit's. A window that counted it would rate 8 at 32's throughput (on a batching server
    # the raises after it then look like they do not pay: simulated, a 64-sequence server was
    # left at 32 in flight, a quarter of its capacity).
    lim = AdaptiveLimit(0.0, cap=512, initial=8)
    for t, n in ((0.0, 32), (1.0, 20), (2.0, 8), (3.0, 8)):
        lim.in_flight_changed(t, n)
    w = lim._window
    assert w.started == 2.0  # the first time no more than 8 were in flight
    assert w.mean_in_flight(3.0) == pytest.approx(8.0)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_client_that_never_quite_fills_its_limit_still_finds_the_knee(seed: int) -> None:
    # A 2-worker server answering in 4 ms, and a client that takes 2 ms to put a request in
    # a freed slot: in flight at the limit only in moments (15 or 16 of 16), so the limit
    # never counted as filled and held at 16, 7x the unloaded latency, for the whole run.
    srv = FlatServer(2, 0.004, jitter=0.3, seed=seed, drift=0.1)
    lim = ConcurrencySpec().limiter(0.0)
    rate, median = drive(lim, srv, 40.0, turnaround_s=0.002).window(15.0, 40.0)
    assert median <= 1.5 * srv.unloaded_s, [(p.t, p.limit, p.why) for p in lim.history]
    assert rate >= 0.85 * srv.capacity_rps  # the client's turnaround costs a little at the knee


def test_the_simulated_servers_keep_their_arithmetic() -> None:
    # a limit held at the knee reaches capacity at unloaded latency; twice the knee only queues
    for limit, latency in ((4, 0.02), (8, 0.04)):
        srv = FlatServer(4, 0.02)
        run = drive(_Fixed(limit), srv, 5.0)
        rate, median = run.window(1.0, 5.0)
        assert rate == pytest.approx(200, rel=0.02) and median == pytest.approx(latency, rel=0.02)
    # a full batch with a queue behind it completes max_num_seqs every output_tokens steps
    p = EngineParams(max_num_seqs=8, base_ms=5, per_seq_ms=1, output_tokens=5)
    rate, _ = drive(_Fixed(16), BatchServer(p), 5.0).window(1.0, 5.0)
    assert rate == pytest.approx(p.capacity_rps, rel=0.02)


class _Fixed:
    def __init__(self, n: int) -> None:
        self.limit = n

    def in_flight_changed(self, now: float, in_flight: int) -> None: ...
    def completed(self, now: float, latency_s: float) -> None: ...
    def tick(self, now: float, metrics: object) -> None: ...
