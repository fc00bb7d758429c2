"""Fixtures of the fault suite: the clean reference run (once per session), and the measured
figures printed at the end of the session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from faults_answer import answer
from faults_harness import (
    FIGURES,
    MODEL,
    N_ANSWERS,
    Project,
    Reference,
    ok_answers,
    verdict_line,
)
from servers import FakeVLM


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    project = Project.make(tmp_path_factory.mktemp("clean"))
    with FakeVLM([MODEL], answer=answer) as srv:
        result = project.run(srv.url)
        requests = srv.chat_requests
    assert result.rc == 0, result.out[-3000:]
    result.check_lines()
    answers = ok_answers(project)
    assert len(answers) == N_ANSWERS and requests == N_ANSWERS
    return Reference(answers, verdict_line(result.out), requests)


@pytest.fixture
def healthy() -> Iterator[FakeVLM]:
    """The server every case reruns against until its run completes."""
    with FakeVLM([MODEL], answer=answer) as srv:
        yield srv


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not FIGURES:
        return
    tr = terminalreporter
    tr.section("satbench fault suite: chat requests over all runs vs a clean run")
    for f in FIGURES:
        extra = "  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                          for k, v in f.items() if k not in ("case", "runs", "requests", "ratio", "max_run_s"))
        tr.write_line(f"{f['case']:<34} runs={f['runs']}  requests={f['requests']:>4}  x{f['ratio']:.2f}  "
                      f"longest run {f['max_run_s']:.1f} s  {extra}")
