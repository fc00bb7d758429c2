"""Faults of the servers' replies, each scattered over a run, then reruns until complete."""

from __future__ import annotations

import pytest
from faults_answer import answer
from faults_harness import MODEL, Project, Reference, compare, record, settle
from servers import Fail, FakeVLM, chat_completion

EVERY = 9  # one request in EVERY fails (from the 5th on)


def scattered(fail: Fail, every: int = EVERY, start: int = 5, upto: int = 400) -> dict[int, Fail]:
    return {n: fail for n in range(start, upto, every)}


def fault_body(**extra: object) -> dict[str, object]:
    return chat_completion("FAULT", MODEL) | extra


CASES = {
    "http-500": scattered(Fail.http(500)),
    "http-503": scattered(Fail.http(503, "overloaded")),
    "429-storm-retry-after": {n: Fail.rate_limited(retry_after=1) for n in range(20, 44)},
    "hang": scattered(Fail.hang(4), every=25),
    "reset": scattered(Fail.reset()),
    "reset-mid-body": scattered(Fail.reset_mid_body()),
    "non-json-200": scattered(Fail.malformed()),
    "truncated-json-200": scattered(Fail.truncated()),
    "no-choices-200": scattered(Fail.reply({"id": "x", "object": "chat.completion", "model": MODEL})),
    "empty-choices-200": scattered(Fail.reply(fault_body(choices=[]))),
    "error-200": scattered(Fail.reply(fault_body(error={"message": "FAULT: out of memory", "code": 500}))),
    "null-content-200": scattered(Fail.reply(chat_completion(None, MODEL))),
    "other-model-200": scattered(Fail.reply(chat_completion("FAULT", "another-model"))),
    "trickle": scattered(Fail.trickle(0.05, 6), every=30),
    "endless": scattered(Fail.endless(seconds=6), every=30),
    "huge": scattered(Fail.huge(200_000), every=30),
}


@pytest.mark.parametrize("case", list(CASES))
def test_reply_fault(case: str, tmp_path, reference: Reference, healthy: FakeVLM) -> None:
    project = Project.make(tmp_path)
    with FakeVLM([MODEL], answer=answer, fail_at=CASES[case]) as faulty:
        first = project.run(faulty.url)
        asked = faulty.chat_requests
    first.check_lines()
    assert first.rc in (0, 1, 8, 9), first.out[-3000:]  # 9: the model swapped under the run
    final = settle(project, healthy.url)
    compare(project, reference, final)
    record(case, project, asked + healthy.chat_requests, reference, first_exit=first.rc)
