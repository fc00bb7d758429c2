"""A run across a fleet gives the results of a run on one server.

Real pytest runs (pytester) against continuous-batching simulators (tests/fleet_sim.py) on
loopback: answers depend on the prompt alone, so where a question was asked must not show in
any stored answer, verdict or figure, while the adaptive limits spread the requests.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from datasets_fake import rsvqa_suite
from fleet_sim import EngineParams, SimServer

BENCH_MODULE = """
from pytest_satbench import benchmark_test
test_rsvqa_lr = benchmark_test("rsvqa_lr")
"""
FAST = EngineParams(max_num_seqs=16, base_ms=2.0, per_seq_ms=0.2, output_tokens=4)


def _run(pytester: pytest.Pytester, data: Path, store: Path, *urls: str) -> pytest.RunResult:
    return pytester.runpytest(
        "--servers", ",".join(urls), "--data-root", str(data), "--store", str(store),
        "--recon", "jpeg:quality=40", "-q", "--no-reports", "-W", "ignore::pytest.PytestAssertRewriteWarning",
    )


def _answers(store: Path) -> dict[tuple[str, str], tuple[str, int]]:
    with sqlite3.connect(store) as conn:
        rows = conn.execute("SELECT nodeid, arm, text, correct FROM answers WHERE status='ok'").fetchall()
    return {(nodeid, arm): (text, correct) for nodeid, arm, text, correct in rows}


def test_two_simulated_servers_give_the_results_of_one(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")
    data = rsvqa_suite(pytester, BENCH_MODULE, n_images=6, per_type=5)
    with SimServer(FAST) as a, SimServer(FAST) as b, SimServer(FAST) as single:
        fleet = _run(pytester, data, pytester.path / "fleet.sqlite", a.url, b.url)
        alone = _run(pytester, data, pytester.path / "alone.sqlite", single.url)
        served = (a.stats().completed, b.stats().completed, single.stats().completed)
    assert fleet.ret == alone.ret
    assert served[0] > 0 and served[1] > 0  # both servers of the fleet answered
    assert served[0] + served[1] == served[2] == 2 * 120  # every question once per arm, nothing twice
    fleet_answers = _answers(pytester.path / "fleet.sqlite")
    assert len(fleet_answers) == 240
    assert fleet_answers == _answers(pytester.path / "alone.sqlite")
    # the verdicts and the summary table are the same
    assert fleet.outlines[-1].split(" in ")[0] == alone.outlines[-1].split(" in ")[0]
    table = [line for line in fleet.outlines if line.startswith(("overall", "presence", "count"))]
    assert table and table == [line for line in alone.outlines if line.startswith(("overall", "presence", "count"))]


def test_the_limits_over_the_run_reach_the_report(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")
    data = rsvqa_suite(pytester, BENCH_MODULE, n_images=6, per_type=5)
    with SimServer(EngineParams(max_num_seqs=8, base_ms=5.0, per_seq_ms=1.0, output_tokens=10)) as sim:
        result = pytester.runpytest("--servers", sim.url, "--data-root", str(data), "-q",
                                    "-W", "ignore::pytest.PytestAssertRewriteWarning")
        seen = sim.stats().max_running_seen
    assert result.ret in (0, 1), result.stdout.str()
    folder = pytester.path / "reports" / "rsvqa_lr" / "default"
    server = json.loads((folder / "summary.json").read_text())["usage"]["by_server"][sim.url]
    assert server["steered_by"] == "metrics"  # the simulator serves vLLM's /metrics
    assert 1 <= server["limit"] <= 32 and server["peak_in_flight"] >= seen
    page = (folder / "report.html").read_text()
    assert "in-flight limit per server over the run" in page and "<polyline" in page
