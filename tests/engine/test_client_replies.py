"""Replies the client reads (issue 17), through a ServerPool against real loopback servers.

Every reply passes one gate: odd JSON (a 100,000-deep array, a lone surrogate, Infinity in
the usage) is a failure of that attempt or a dropped figure, never an exception; a reasoning
model out of tokens has answered; a reply the server closes after, compresses or frames as
HTTP/1.0 is read whole and never asked again.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from client_helpers import FAST, ask, no_proxy_environment  # noqa: F401 (an autouse fixture)
from servers import Fail, FakeVLM, chat_completion, one_line

from pytest_satbench.engine.client import Answer, ServerPool
from pytest_satbench.engine.failures import RequestFailed


def ask_many(pool: ServerPool, n: int, threads: int = 8) -> list[Answer]:
    with ThreadPoolExecutor(threads) as ex:
        return list(ex.map(lambda i: ask(pool, f"q{i}"), range(n)))


# ---------------------------------------------------------------------------- the gate

ODD = {
    # RecursionError in the JSON parser
    "deep-array": (Fail.raw("[" * 100_000 + "]" * 100_000), "JSON nested too deep"),
    "not-utf8": (Fail.raw('{"choices": "\udc80"}'), "not UTF-8"),
}


@pytest.mark.parametrize("fail,reason", ODD.values(), ids=ODD.keys())
def test_an_unreadable_reply_is_a_transient_failure_naming_the_server(fail: Fail, reason: str) -> None:
    with (
        FakeVLM(["m"], fail_always=fail) as srv,
        ServerPool([srv.url], retries=2, **FAST) as pool,
    ):
        with pytest.raises(RequestFailed) as ei:
            ask(pool)
        u = pool.usage()[srv.url]
    s = one_line(ei.value)
    assert srv.chat_requests == 3 and ei.value.transient and ei.value.attempts == 3
    assert s.startswith(srv.url) and "HTTP 200 but" in s and reason in s
    s.encode("utf-8")  # the store and the terminal can hold the message
    assert (u.requests, u.answered, u.failures) == (3, 0, 3)


@pytest.mark.parametrize("fail", list(ODD.values()), ids=list(ODD))
def test_an_unreadable_reply_then_a_real_one_is_an_answer(fail: tuple[Fail, str]) -> None:
    with (
        FakeVLM(["m"], fail_prompt={"q": [fail[0]]}) as srv,
        ServerPool([srv.url], retries=2, **FAST) as pool,
    ):
        a = ask(pool)
    assert (a.text, a.attempts) == ("fake answer", 2)


def test_an_answer_with_a_lone_surrogate_is_kept_repaired_and_never_asked_again() -> None:
    # a str no UTF-8 encoder (the store's) takes: the model's answer, a whole generation
    with (
        FakeVLM(["m"], fail_always=Fail.reply(chat_completion("yes\ud800"))) as srv,
        ServerPool([srv.url], retries=2, **FAST) as pool,
    ):
        a = ask(pool)
    assert (a.text, a.repaired, a.attempts, srv.chat_requests) == ("yes\ufffd", True, 1, 1)


def test_an_error_message_with_a_lone_surrogate_is_repaired_in_the_failure() -> None:
    with (
        FakeVLM(["m"], fail_always=Fail.http(500, "boom \ud800 here")) as srv,
        ServerPool([srv.url], retries=1, **FAST) as pool,
    ):
        with pytest.raises(RequestFailed) as ei:
            ask(pool)
        last = pool.server_states()[srv.url].last_error or ""
    assert "boom \ufffd here" in str(ei.value) and "\ufffd" in last
    str(ei.value).encode("utf-8")
    last.encode("utf-8")


USAGE = {
    "infinity": ({"prompt_tokens": float("inf"), "completion_tokens": 3}, (None, 3, None), 1),
    "nan-and-negative": ({"prompt_tokens": float("nan"), "completion_tokens": -2}, (None, None, None), 2),
    "fraction-bool-huge": ({"prompt_tokens": 1.5, "completion_tokens": True, "cost": 1e999}, (None, None, None), 3),
    "integral-float-and-digits": ({"prompt_tokens": 12.0, "completion_tokens": "7", "cost": 0.5}, (12, 7, 0.5), 0),
    "not-a-dict": ([1, 2], (None, None, None), 1),
}


@pytest.mark.parametrize("usage,want,dropped", USAGE.values(), ids=USAGE.keys())
def test_usage_that_is_no_count_is_dropped_and_counted_and_the_answer_kept(
        usage: Any, want: tuple[Any, ...], dropped: int) -> None:
    with FakeVLM(["m"], usage=usage) as srv, ServerPool([srv.url], retries=3, **FAST) as pool:
        a = ask(pool)
        u = pool.usage()[srv.url]
    assert (a.text, a.attempts, srv.chat_requests) == ("fake answer", 1, 1)
    assert (a.prompt_tokens, a.completion_tokens, a.cost) == want and a.usage_dropped == dropped
    assert u.usage_dropped == dropped and u.answered == 1 and u.failures == 0


# ---------------------------------------------------------------------------- reasoning models

def test_a_reasoning_model_out_of_tokens_has_answered_once() -> None:
    thought = "Let me count the buildings. " * 40
    with (
        FakeVLM(["m"], answer=lambda p, h, i: None, reasoning=lambda p, h, i: thought,
                finish_reason="length") as srv,
        ServerPool([srv.url], retries=4, **FAST) as pool,
    ):
        answers = [ask(pool, f"q{i}") for i in range(5)]
        u = pool.usage()[srv.url]
    assert srv.chat_requests == 5 and (u.answered, u.failures, u.retries) == (5, 0, 0)
    for a in answers:
        assert (a.text, a.finish_reason, a.attempts) == ("", "length", 1)
        assert a.reasoning_chars == len(thought)


@pytest.mark.parametrize("body", [
    chat_completion(None, finish_reason="length"),  # no reasoning field at all
    {"model": "m", "choices": [{"finish_reason": "length", "message": {"role": "assistant"}}]},  # content missing
    chat_completion([{"type": "image_url"}], finish_reason="length", reasoning=""),  # type: ignore[arg-type]  # content of the wrong shape on purpose
], ids=["null", "missing", "parts-without-text"])
def test_a_reply_that_stopped_for_length_is_an_answer_whatever_it_holds(body: dict[str, Any]) -> None:
    with FakeVLM(["m"], fail_always=Fail.reply(body)) as srv, ServerPool([srv.url], retries=3, **FAST) as pool:
        a = ask(pool)
    assert (a.text, a.finish_reason, a.attempts, srv.chat_requests) == ("", "length", 1, 1)


def test_a_reasoning_model_that_answered_keeps_its_answer_and_the_reasoning_length() -> None:
    with (
        FakeVLM(["m"], answer=lambda p, h, i: "yes", reasoning=lambda p, h, i: "hmm" * 7) as srv,
        ServerPool([srv.url], **FAST) as pool,
    ):
        a = ask(pool)
    assert (a.text, a.reasoning_chars, a.finish_reason) == ("yes", 21, "stop")


def test_thinking_without_an_answer_and_without_a_length_stop_is_a_fault() -> None:
    body = chat_completion(None, reasoning="I think", finish_reason="stop")
    with (
        FakeVLM(["m"], fail_prompt={"q": [Fail.reply(body)]}) as srv,
        ServerPool([srv.url], retries=2, **FAST) as pool,
    ):
        a = ask(pool)
    assert (a.text, a.attempts, srv.chat_requests) == ("fake answer", 2, 2)


# ---------------------------------------------------------------------------- framing and connections

@pytest.mark.parametrize("content_length", [True, False], ids=["content-length", "body-to-close"])
def test_an_http10_server_passes_the_health_check_and_answers(content_length: bool) -> None:
    with (
        FakeVLM(["m"], http10=True, content_length=content_length) as srv,
        ServerPool([srv.url], retries=0, **FAST) as pool,
    ):
        assert pool.health_check() == {srv.url: ["m"]}
        answers = ask_many(pool, 20, threads=4)
        u = pool.usage()[srv.url]
    assert all(a.text == "fake answer" and a.attempts == 1 for a in answers)
    assert srv.chat_requests == srv.replies == 20 and u.failures == 0
    assert srv.connections == 21  # one per reply, the health check's included


@pytest.mark.parametrize("share", [0.3, 1.0])
def test_replies_that_close_the_connection_are_read_whole_and_never_asked_again(share: float) -> None:
    with (
        FakeVLM(["m"], close_share=share) as srv,
        ServerPool([srv.url], retries=0, **FAST) as pool,
    ):
        answers = ask_many(pool, 60)
        u = pool.usage()[srv.url]
    assert all(a.text == "fake answer" and a.attempts == 1 for a in answers)
    # every generation the server made reached an answer: none thrown away, none asked twice
    assert srv.chat_requests == srv.replies == 60 and (u.requests, u.failures) == (60, 0)


def test_a_connection_closed_silently_after_each_reply_costs_no_failure() -> None:
    with (
        FakeVLM(["m"], drop_share=1.0) as srv,
        ServerPool([srv.url], retries=0, **FAST) as pool,
    ):
        answers = [ask(pool, f"q{i}") for i in range(30)]  # one at a time: each reuses the last
        u = pool.usage()[srv.url]
    assert all(a.text == "fake answer" and a.attempts == 1 for a in answers)
    assert srv.chat_requests == srv.replies == 30 and (u.requests, u.failures) == (30, 0)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "deflate-raw"])
def test_a_compressed_reply_is_decoded(encoding: str) -> None:
    with FakeVLM(["m"], encoding=encoding) as srv, ServerPool([srv.url], retries=0, **FAST) as pool:
        assert pool.health_check() == {srv.url: ["m"]}
        a = ask(pool)
    assert (a.text, a.attempts, a.prompt_tokens) == ("fake answer", 1, 1)


def test_an_encoding_the_client_cannot_read_is_one_line_naming_it_and_not_retried() -> None:
    with (
        FakeVLM(["m"], encoding="br") as srv,
        ServerPool([srv.url], retries=3, **FAST) as pool,
        pytest.raises(RequestFailed) as ei,
    ):
        ask(pool)
    s = one_line(ei.value)
    assert "Content-Encoding: br" in s and "gzip" in s and not ei.value.transient
    assert srv.chat_requests == 1 and ei.value.attempts == 1


def test_a_gzip_body_that_inflates_past_the_cap_is_too_large() -> None:
    body = json.dumps(chat_completion("x" * 200_000))
    with (
        FakeVLM(["m"], encoding="gzip", fail_always=Fail.raw(body)) as srv,
        ServerPool([srv.url], retries=2, max_reply_bytes=100_000, **FAST) as pool,
        pytest.raises(RequestFailed) as ei,
    ):
        ask(pool)
    assert "inflates to over the 100000-byte cap" in str(ei.value) and not ei.value.transient
    assert srv.chat_requests == 1
