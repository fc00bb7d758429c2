"""Faults of processes: the run killed or interrupted at random moments, several times in a
row; `-n 2` with its controller killed; two runs on one store at once; one and two servers
dying mid-run. Each ends with the clean run's answers, answer by answer."""

from __future__ import annotations

import random
import signal
import time

from faults_answer import answer
from faults_harness import (
    MODEL,
    N_ANSWERS,
    Project,
    Reference,
    ServerProcess,
    compare,
    group_alive,
    record,
    settle,
    wait_until,
)
from servers import FakeVLM

SEED = 20240610


def _interrupt_several_times(sig: int, tmp_path, reference: Reference, healthy: FakeVLM, times: int = 3):
    rng = random.Random(SEED + sig)
    project = Project.make(tmp_path)
    stops = []
    with FakeVLM([MODEL], answer=answer, delay=0.02) as srv:
        for i in range(times):
            before = srv.chat_requests
            # a random moment: before any request (collection, startup) once, else mid-run
            target = 0 if i == 0 else rng.randrange(5, N_ANSWERS // times)
            # mid-run means before the end: a start that was quick to ask leaves fewer
            target = min(target, max(1, (N_ANSWERS - srv.chat_requests) // 2)) if target else 0
            running = project.start(srv.url)
            if target == 0:
                time.sleep(rng.uniform(0.2, 1.0))
            else:
                reached = wait_until(lambda b=before, t=target, r=running: srv.chat_requests - b >= t
                                     or r.proc.poll() is not None, 120)
                asked_now = srv.chat_requests - before
                assert reached and asked_now >= target, (
                    f"run {i}: {asked_now} of the {target} requests to wait for (exit {running.proc.poll()}):\n"
                    + running.log.read_text()[-3000:])
            t0 = time.monotonic()
            running.signal(sig)
            result = running.wait(60)
            stops.append(time.monotonic() - t0)
            result.check_lines()
            if sig == signal.SIGKILL:
                assert result.rc == -signal.SIGKILL
            else:
                assert result.rc in (2, 0), result.out[-3000:]
                if target:
                    assert "satbench: interrupted; every answer received so far is stored" in result.out, result.out[-2000:]
        asked = srv.chat_requests
    final = settle(project, healthy.url)
    compare(project, reference, final)
    requests = asked + healthy.chat_requests
    record(f"{signal.Signals(sig).name} x{times}", project, requests, reference, stop_s=max(stops))
    # nothing asked twice but what was in flight at each stop (concurrency 6)
    assert requests <= N_ANSWERS + times * 6, requests
    return stops


def test_sigkill_at_random_moments_several_times(tmp_path, reference: Reference, healthy: FakeVLM) -> None:
    _interrupt_several_times(signal.SIGKILL, tmp_path, reference, healthy)


def test_sigint_at_random_moments_several_times(tmp_path, reference: Reference, healthy: FakeVLM) -> None:
    stops = _interrupt_several_times(signal.SIGINT, tmp_path, reference, healthy)
    assert max(stops) < 10, stops  # Ctrl-C ends the run at once, not after the requests in flight


def test_xdist_controller_killed(tmp_path, reference: Reference, healthy: FakeVLM) -> None:
    project = Project.make(tmp_path)
    with FakeVLM([MODEL], answer=answer, delay=0.02) as srv:
        running = project.start(srv.url, "-n", "2")
        assert wait_until(lambda: srv.chat_requests >= 60, 60)
        running.proc.send_signal(signal.SIGKILL)  # the controller only: its workers are orphaned
        t0 = time.monotonic()
        workers_gone = wait_until(lambda: not group_alive(running.proc.pid), 30, step=0.1)
        orphan_s = time.monotonic() - t0
        asked_after = srv.chat_requests
        running.wait(5)
        asked = srv.chat_requests
    assert workers_gone, "the workers of a killed controller kept running"
    final = settle(project, healthy.url, "-n", "2")
    compare(project, reference, final)
    requests = asked + healthy.chat_requests
    record("-n 2, controller SIGKILL", project, requests, reference, orphans_gone_s=orphan_s,
           asked_by_orphans=asked - asked_after)
    assert requests <= N_ANSWERS + 12, requests


def test_two_concurrent_runs_on_one_store(tmp_path, reference: Reference) -> None:
    project = Project.make(tmp_path)
    with FakeVLM([MODEL], answer=answer, delay=0.01) as srv:
        a, b = project.start(srv.url, name="a"), project.start(srv.url, name="b")
        ra, rb = a.wait(), b.wait()
        asked = srv.chat_requests
    for r in (ra, rb):
        r.check_lines()
        assert r.rc == 0, r.out[-3000:]
    compare(project, reference, rb if rb.took >= ra.took else ra)
    record("two concurrent runs, one store", project, asked, reference)
    assert asked <= 2 * N_ANSWERS


def test_one_of_two_servers_dies(tmp_path, reference: Reference) -> None:
    project = Project.make(tmp_path)
    with ServerProcess(delay=0.02) as dying, FakeVLM([MODEL], answer=answer, delay=0.02) as alive:
        running = project.start([dying.url, alive.url])
        assert wait_until(lambda: alive.chat_requests >= 30, 60)
        dying.kill()
        t0 = time.monotonic()
        result = running.wait()
        after_kill = time.monotonic() - t0
        asked_alive = alive.chat_requests
    result.check_lines()
    assert result.rc == 0, result.out[-3000:]  # the other server took the rest
    assert f"satbench: server {dying.url} is DOWN" in result.out
    compare(project, reference, result)
    # the dead server's requests are not counted here (its counters died with it): the live one's
    record("one of two servers dies", project, asked_alive, reference, end_after_kill_s=after_kill)


def test_both_servers_die(tmp_path, reference: Reference, healthy: FakeVLM) -> None:
    project = Project.make(tmp_path)
    with ServerProcess(delay=0.02) as s1, ServerProcess(delay=0.02) as s2:
        running = project.start([s1.url, s2.url])
        assert wait_until(lambda: project.stored_ok() >= 40, 60)
        s1.kill()
        s2.kill()
        t0 = time.monotonic()
        result = running.wait()
        stop_s = time.monotonic() - t0
    result.check_lines()
    assert result.rc == 8, result.out[-3000:]
    gone = [ln for ln in result.out.splitlines() if "no server has answered for" in ln]
    assert gone and s1.url in gone[-1] and s2.url in gone[-1]
    # bounded: --give-up-after 4; the wait for an answer checks the window every second
    assert stop_s < 4 + 1.5 + 5, stop_s
    final = settle(project, healthy.url)
    compare(project, reference, final)
    record("both servers die", project, healthy.chat_requests, reference,
           stop_after_kill_s=stop_s, rerun_asked=healthy.chat_requests)

