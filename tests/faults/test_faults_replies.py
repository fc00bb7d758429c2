"""Replies the client reads (issue 17): odd JSON, compressed bodies, servers that close the
connection, reasoning models out of tokens. Each case is a real `python -m pytest` run
against a real loopback server, compared answer by answer with the clean run.

The figures that matter here are the server's: `chat_requests` is the generations it made.
A reply that arrived whole must never be thrown away and asked again, so for every case
whose replies are all answers the run makes exactly one request per answer.
"""

from __future__ import annotations

import math
import sqlite3

import pytest
from faults_answer import answer
from faults_harness import MODEL, N_ANSWERS, Project, Reference, compare, record, settle
from servers import Fail, FakeVLM, chat_completion

DEEP = "[" * 100_000 + "]" * 100_000


def every(fail: Fail, step: int, start: int = 5, upto: int = 2000) -> dict[int, Fail]:
    return {n: fail for n in range(start, upto, step)}


def rows(project: Project, sql: str) -> list[tuple]:
    conn = sqlite3.connect(project.store)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def overall(out: str) -> list[str]:
    """The `overall` line of the accuracy table (the one whose header ends in err trn unp),
    split: overall, n, the arms, chance, err, trn, unp."""
    lines = out.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.split()[-3:] == ["err", "trn", "unp"])
    return next(ln.split() for ln in lines[head:] if ln.startswith("overall "))


# ---------------------------------------------------------------------------- odd replies

ODD = {
    # the JSON parser's RecursionError (200 kB: the run's --max-reply-bytes is raised for it)
    "nested-100000-deep": every(Fail.raw(DEEP), 9),
    # thinking is not saying: content null without a stop for length is a fault
    "null-content-not-length": every(Fail.reply(chat_completion(None, MODEL, reasoning="I see a road")), 9),
}


@pytest.mark.parametrize("case", list(ODD))
def test_an_odd_reply_is_a_failure_of_its_attempt(case: str, tmp_path, reference: Reference,
                                                 healthy: FakeVLM) -> None:
    project = Project.make(tmp_path)
    with FakeVLM([MODEL], answer=answer, fail_at=ODD[case]) as faulty:
        first = project.run(faulty.url, "--max-reply-bytes", "1000000")
        asked = faulty.chat_requests
    first.check_lines()
    assert first.rc in (0, 1), first.out[-3000:]
    assert "reply too large" not in first.out
    # every question has its row (the store never hung): an answer, or an error row that a
    # rerun replaces
    stored = rows(project, "SELECT status, COUNT(*) FROM answers GROUP BY status")
    assert sum(n for _, n in stored) == N_ANSWERS, stored
    final = settle(project, healthy.url)
    compare(project, reference, final)
    assert not rows(project, "SELECT 1 FROM answers WHERE status='ok' AND text LIKE '%' || char(65533) || '%'")
    record(case, project, asked + healthy.chat_requests, reference, first_exit=first.rc)


def test_a_lone_surrogate_in_20pct_of_answers_is_stored_repaired_and_never_asked_again(tmp_path) -> None:
    """An escape no UTF-8 encoder takes (vLLM's detokenizer can emit one) in one reply of five:
    the answer is the model's (a whole generation), kept with U+FFFD in its place and flagged
    `repaired`; nothing asked twice; the store's writer never hangs (it once did, forever)."""
    project = Project.make(tmp_path)
    count = iter(range(10**6))

    def broken(prompt: str, has_image: bool, image: bytes | None) -> str:
        text = answer(prompt, has_image, image)
        return text + "\ud800" if next(count) % 5 == 0 else text

    with FakeVLM([MODEL], answer=broken) as srv:
        result = project.run(srv.url)
        asked = srv.chat_requests
    result.check_lines()
    assert result.rc == 0 and asked == N_ANSWERS, result.out[-3000:]
    stored = rows(project, "SELECT status, repaired, text LIKE '%' || char(65533), COUNT(*) FROM answers "
                           "GROUP BY 1, 2, 3")
    assert stored == [("ok", None, 0, N_ANSWERS - N_ANSWERS // 5), ("ok", 1, 1, N_ANSWERS // 5)], stored


def test_a_lone_surrogate_in_every_error_message_is_stored_repaired(tmp_path, reference: Reference,
                                                                    healthy: FakeVLM) -> None:
    project = Project.make(tmp_path)
    with FakeVLM([MODEL], fail_always=Fail.http(500, "worker \ud800 died")) as faulty:
        first = project.run(faulty.url)
    first.check_lines()
    # no server ever answers: the run gives up (--give-up-after) in one line quoting the message
    assert first.rc == 8 and "HTTP 500: worker \ufffd died" in first.out, first.out[-3000:]
    errors = rows(project, "SELECT error FROM answers WHERE status='error'")
    assert errors and all("worker \ufffd died" in e for (e,) in errors)
    final = settle(project, healthy.url)
    compare(project, reference, final)


def test_infinity_in_the_usage_keeps_every_answer(tmp_path, reference: Reference) -> None:
    project = Project.make(tmp_path)
    usage = {"prompt_tokens": math.inf, "completion_tokens": 3, "total_tokens": math.nan}
    with FakeVLM([MODEL], answer=answer, usage=usage) as srv:
        result = project.run(srv.url)
        asked = srv.chat_requests
    result.check_lines()
    assert result.rc == 0 and asked == N_ANSWERS, result.out[-3000:]
    compare(project, reference, result)
    assert rows(project, "SELECT DISTINCT prompt_tokens, completion_tokens FROM answers") == [(None, 3)]
    record("infinity-in-usage", project, asked, reference)


# ---------------------------------------------------------------------------- framing and connections

SERVERS = {
    "gzip-forced": {"encoding": "gzip"},
    "http10-body-to-close": {"http10": True, "content_length": False},
    "connection-close-30pct": {"close_share": 0.3},
    "connection-close-every-reply": {"close_share": 1.0},
    "closed-silently-after-replies": {"drop_share": 0.5},
}


@pytest.mark.parametrize("case", list(SERVERS))
def test_every_reply_that_arrived_whole_is_an_answer(case: str, tmp_path, reference: Reference) -> None:
    project = Project.make(tmp_path)
    with FakeVLM([MODEL], answer=answer, **SERVERS[case]) as srv:  # type: ignore[arg-type]  # the case's FakeVLM keyword arguments
        result = project.run(srv.url)
        asked, replied = srv.chat_requests, srv.replies
    result.check_lines()
    assert result.rc == 0, result.out[-3000:]
    # one generation per answer: no complete reply thrown away and asked again
    assert asked == replied == N_ANSWERS
    compare(project, reference, result)
    record(case, project, asked, reference)


# ---------------------------------------------------------------------------- reasoning models

THOUGHT = "The image shows fields; let me count the buildings one by one. " * 30


def test_a_reasoning_model_out_of_tokens_answers_once_per_question(tmp_path) -> None:
    project = Project.make(tmp_path)
    with FakeVLM([MODEL], answer=lambda p, h, i: None, reasoning=lambda p, h, i: THOUGHT,
                 finish_reason="length") as srv:
        first = project.run(srv.url)
        asked = srv.chat_requests
        again = project.run(srv.url)
        asked_again = srv.chat_requests - asked
    first.check_lines()
    again.check_lines()
    # its answers, wrong (nothing to parse): never retried, never an error
    assert first.rc == 0 and asked == N_ANSWERS, first.out[-3000:]
    got = rows(project, "SELECT status, text, finish_reason, reasoning_chars, attempts, COUNT(*) FROM answers "
                        "GROUP BY 1, 2, 3, 4, 5")
    assert got == [("ok", "", "length", len(THOUGHT), 1, N_ANSWERS)]
    *_, err, trn, unp = overall(first.out)
    assert (err, trn, unp) == ("0", str(N_ANSWERS), str(N_ANSWERS)), first.out[-2000:]
    # settled: a rerun sends nothing
    assert again.rc == 0 and asked_again == 0, again.out[-3000:]
