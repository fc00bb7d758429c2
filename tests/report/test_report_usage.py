"""Per-server traffic in the reports of a real run: a loopback server that fails some requests
with 503 before answering shows its attempts, failures and retries in report.md, report.html
and summary.json."""

from __future__ import annotations

import json
import re

import pytest
from datasets_fake import rsvqa_suite
from servers import Fail, FakeVLM

BENCH_MODULE = """
from pytest_satbench import benchmark_test
test_rsvqa_lr = benchmark_test("rsvqa_lr")
"""
N_IMAGES, PER_TYPE = 2, 1
N = N_IMAGES * 4 * PER_TYPE
FAILED = 3  # 503s injected on the first requests; each is retried and then answered

USAGE_HEADER = ("| server | attempts | answers | failures | retries | prompt tokens | completion tokens | "
                "cost (reported) | answers with cost | latency mean | p50 | p95 | limit at end | peak in flight | "
                "limit steered by | models returned |")


def _usage_rows(md: str) -> dict[str, list[str]]:
    lines = md.splitlines()
    start = lines.index(USAGE_HEADER) + 2
    rows = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        rows[cells[0]] = cells
    return rows


def test_a_real_run_reports_attempts_failures_and_retries(pytester: pytest.Pytester) -> None:
    data = rsvqa_suite(pytester, BENCH_MODULE, n_images=N_IMAGES, per_type=PER_TYPE)
    script = {k: Fail.http(503, "overloaded") for k in range(1, FAILED + 1)}
    with FakeVLM(models=["m"], answer=lambda prompt, has_image, image: "yes", fail_at=script) as srv:
        result = pytester.runpytest("--servers", srv.url, "--data-root", str(data), "--retries", "3",
                                    "--concurrency", "1", "-q", "-W", "ignore::pytest.PytestAssertRewriteWarning")
        assert srv.chat_requests == N + FAILED
        url = srv.url
    assert result.ret == 0, result.stdout.str()
    folder = pytester.path / "reports" / "rsvqa_lr" / "default"
    usage = json.loads((folder / "summary.json").read_text())["usage"]
    server = usage["by_server"][url]
    assert (server["requests"], server["answers"], server["failures"], server["retries"]) == (N + FAILED, N, FAILED, FAILED)
    # --concurrency 1: a cap of one per server, under which the limit adapts; a server without
    # /metrics is steered by latency, and the 503s could not push it below one
    assert (server["limit"], server["peak_in_flight"], server["steered_by"]) == (1, 1, "latency")
    assert [t["server"] for t in usage["limits"]] == [url] and usage["limits"][0]["process"] == "main"

    md = (folder / "report.md").read_text()
    rows = _usage_rows(md)
    assert set(rows) == {url, "all"}
    for name in (url, "all"):  # one server: the total is that server
        attempts, answers, failures, retries = rows[name][1:5]
        assert (attempts, answers, failures, retries) == (str(N + FAILED), str(N), str(FAILED), str(FAILED))
    assert rows[url][12:15] == ["1", "1", "latency"]
    assert f"Answers: {N} asked by this run, 0 reused from the store." in md

    page = (folder / "report.html").read_text()
    assert ("<th>server</th><th class=\"num\">attempts</th><th class=\"num\">answers</th>"
            "<th class=\"num\">failures</th><th class=\"num\">retries</th>") in page
    assert (f'<tr><td>{url}</td><td class="num">{N + FAILED}</td><td class="num">{N}</td>'
            f'<td class="num">{FAILED}</td><td class="num">{FAILED}</td>') in page
