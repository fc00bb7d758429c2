"""The reply gate (engine/wire.py): every reply gives an answer, a transient failure or a
permanent failure, never an exception, and an answer holds only what the store can keep.

The property tests feed it arbitrary JSON documents (chat-shaped and not, with NaN,
Infinity, lone surrogates, huge numbers) and arbitrary bytes; the examples are the replies
that escaped the old checks (issue 17).
"""

from __future__ import annotations

import http.client
import json
import math
import sqlite3
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pytest_satbench.engine.failures import AttemptFailed
from pytest_satbench.engine.transport import Response
from pytest_satbench.engine.wire import Completion, read_completion, read_model_list

# deterministic under load: the same examples every run, no deadline, nothing written to disk
GATE = settings(max_examples=400, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])

DEEP = b"[" * 100_000 + b"]" * 100_000
SURROGATE = b'{"model": "m", "choices": [{"message": {"content": "yes\\ud800"}, "finish_reason": "stop"}]}'
INFINITE_USAGE = (b'{"model": "m", "choices": [{"message": {"content": "yes"}, "finish_reason": "stop"}],'
                  b' "usage": {"prompt_tokens": Infinity, "completion_tokens": NaN, "cost": -Infinity}}')


def response(body: bytes, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    msg = http.client.HTTPMessage()
    for k, v in (headers or {}).items():
        msg[k] = v
    return Response(status, msg, body)


def reply(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return response(json.dumps(doc).encode(), status, headers)


def chat(content: Any, finish: Any = "stop", **top: Any) -> dict[str, Any]:
    return {"model": "m", "choices": [{"index": 0, "finish_reason": finish,
                                       "message": {"role": "assistant", "content": content}}], **top}


def verdict(r: Response, proxied: bool = False) -> str:
    """What the gate made of `r`, checked to be one of its three promises."""
    try:
        got = read_completion(r, "m", frozenset({"m-alias"}), proxied=proxied)
    except AttemptFailed as f:
        assert isinstance(f.transient, bool) and f.reason and "\n" not in f.reason
        f.reason.encode("utf-8")
        (f.advice or "").encode("utf-8")
        return "transient" if f.transient else "permanent"
    assert isinstance(got, Completion) and 200 <= r.status < 300
    assert isinstance(got.text, str)
    for count in (got.prompt_tokens, got.completion_tokens):
        assert count is None or (type(count) is int and 0 <= count <= 2**53)
    assert got.cost is None or (type(got.cost) is float and math.isfinite(got.cost) and got.cost >= 0)
    assert got.reasoning_chars is None or (type(got.reasoning_chars) is int and got.reasoning_chars >= 0)
    assert got.usage_dropped >= 0
    assert got.model in (None, "m", "m-alias")
    # what an answer row keeps, the store can hold
    with sqlite3.connect(":memory:") as db:
        db.execute("SELECT ?, ?, ?, ?, ?, ?", (got.text, got.finish_reason, got.model, got.prompt_tokens,
                                             got.completion_tokens, got.cost))
    return "answer"


# ---------------------------------------------------------------------------- properties

ODD_TEXT = st.builds(lambda a, s, b: a + s + b, st.text(max_size=4),
                     st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff", "\x00", "\ufffd"]),
                     st.text(max_size=4))
TEXT = st.text(max_size=12) | ODD_TEXT
NUMBER = (st.integers() | st.integers(min_value=-(10**30), max_value=10**30)
          | st.floats(allow_nan=True, allow_infinity=True))
SCALAR = st.none() | st.booleans() | NUMBER | TEXT
JSON = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                    max_leaves=12)
MESSAGE = st.fixed_dictionaries({}, optional={
    "role": JSON, "content": TEXT | st.none() | JSON | st.lists(st.fixed_dictionaries({"type": TEXT}, optional={"text": JSON})),
    "reasoning_content": TEXT | JSON, "reasoning": TEXT | JSON})
CHOICE = st.fixed_dictionaries({}, optional={
    "message": MESSAGE | JSON, "finish_reason": st.sampled_from(["stop", "length", None]) | JSON, "index": JSON})
USAGE = st.fixed_dictionaries({}, optional={"prompt_tokens": SCALAR, "completion_tokens": SCALAR, "cost": SCALAR})
COMPLETION = st.fixed_dictionaries({}, optional={
    "model": st.sampled_from(["m", "m-alias", "other"]) | JSON,
    "choices": st.lists(CHOICE, max_size=2) | JSON,
    "usage": USAGE | JSON,
    "error": JSON,
})
# the shape of a real completion, every value drawn: reaches the checks behind the shape
SHAPED = st.builds(
    lambda content, finish, model, reasoning, usage: {
        "model": model, "usage": usage,
        "choices": [{"finish_reason": finish, "message": {"content": content, "reasoning_content": reasoning}}]},
    content=TEXT | st.none() | SCALAR, finish=st.sampled_from(["stop", "length", None]) | SCALAR,
    model=st.sampled_from(["m", "m-alias", "other", None]) | SCALAR, reasoning=TEXT | st.none() | SCALAR,
    usage=USAGE | SCALAR)
STATUS = st.sampled_from([200, 200, 200, 201, 400, 401, 404, 407, 408, 429, 500, 503]) | st.integers(100, 599)
HEADERS = st.fixed_dictionaries({}, optional={"Retry-After": st.text(alphabet="0123456789.- :,GMTMonDecinf", max_size=30)})


@GATE
@given(doc=SHAPED | COMPLETION | JSON, status=STATUS, headers=HEADERS, proxied=st.booleans())
def test_any_json_document_gets_a_verdict(doc: Any, status: int, headers: dict[str, str], proxied: bool) -> None:
    verdict(reply(doc, status, headers), proxied)


@GATE
@given(body=st.binary(max_size=300), status=STATUS)
@example(body=DEEP, status=200)
@example(body=SURROGATE, status=200)
@example(body=INFINITE_USAGE, status=200)
@example(body=b"\xff\xfe\x00", status=200)
@example(body=b'{"choices": [{"message": {"content": "x"}}], "model": ["unhashable"]}', status=200)
@example(body=b"1" * 5000, status=200)  # past int's digit limit
@example(body=DEEP, status=500)
def test_any_bytes_get_a_verdict(body: bytes, status: int) -> None:
    verdict(response(body, status))


@GATE
@given(doc=SHAPED | COMPLETION, cut=st.integers(0, 400))
def test_a_truncated_completion_gets_a_verdict(doc: Any, cut: int) -> None:
    raw = json.dumps(doc).encode()
    verdict(response(raw[:cut]))


@GATE
@given(doc=st.fixed_dictionaries({}, optional={"data": st.lists(st.fixed_dictionaries(
    {}, optional={"id": TEXT | JSON, "root": JSON, "max_model_len": SCALAR}), max_size=3) | JSON}) | JSON,
       status=STATUS)
@example(doc={"data": [{"id": "m", "max_model_len": float("inf")}]}, status=200)
def test_any_model_list_gets_a_verdict(doc: Any, status: int) -> None:
    try:
        cards = read_model_list(reply(doc, status))
    except AttemptFailed as f:
        f.reason.encode("utf-8")
        return
    assert cards and status == 200
    for model, card in cards.items():
        model.encode("utf-8")
        assert card.max_model_len is None or type(card.max_model_len) is int
        assert card.root is None or isinstance(card.root, str)


# ---------------------------------------------------------------------------- the rules, one by one

@pytest.mark.parametrize("body,reason", [
    (DEEP, "JSON nested too deep"),
    (b"\x80{}", "not UTF-8"),
    (b"<html>502 Bad Gateway</html>", "invalid JSON"),
    (b"[1, 2]", "not a chat completion"),
    (json.dumps(chat(None)).encode(), "content null"),
    (json.dumps(chat(None, reasoning_content="x")).encode(), "content null"),
    (json.dumps(chat("x", model=7)).encode(), "model id that is not text"),
    (json.dumps(chat("x", model=["a"])).encode(), "model id that is not text"),
], ids=["deep", "not-utf8", "html", "array", "null", "null-reasoning-stop", "model-int",
        "model-list"])
def test_replies_without_an_answer_are_transient(body: bytes, reason: str) -> None:
    with pytest.raises(AttemptFailed) as ei:
        read_completion(response(body), "m")
    assert ei.value.transient and reason in ei.value.reason and ei.value.reason.startswith("HTTP 200 but")


def test_a_lone_surrogate_is_repaired_and_flagged_never_asked_again() -> None:
    """The model answered, a whole generation: the characters no encoder takes become U+FFFD."""
    got = read_completion(response(SURROGATE), "m")
    assert (got.text, got.repaired) == ("yes\ufffd", True)
    got.text.encode("utf-8")
    pair = read_completion(reply(chat("ok \ud83d\ude00 \udfff")), "m")  # a pair stays a character
    assert (pair.text, pair.repaired) == ("ok \U0001f600 \ufffd", True)
    assert read_completion(reply(chat("fine")), "m").repaired is False


def test_usage_that_is_no_count_is_dropped_and_counted() -> None:
    got = read_completion(response(INFINITE_USAGE), "m")
    assert (got.text, got.prompt_tokens, got.completion_tokens, got.cost, got.usage_dropped) == \
        ("yes", None, None, None, 3)
    big = read_completion(reply(chat("y", usage={"prompt_tokens": 10**30, "completion_tokens": 2**53})), "m")
    assert (big.prompt_tokens, big.completion_tokens, big.usage_dropped) == (None, 2**53, 1)


def test_a_length_stop_is_an_answer_with_the_reasoning_length() -> None:
    msg = {"role": "assistant", "content": None, "reasoning_content": "a" * 1234}
    got = read_completion(reply({"model": "m", "choices": [{"finish_reason": "length", "message": msg}]}), "m")
    assert (got.text, got.finish_reason, got.reasoning_chars) == ("", "length", 1234)
    # OpenRouter's name for it
    msg = {"content": "B", "reasoning": "thinking"}
    got = read_completion(reply({"model": "m", "choices": [{"finish_reason": "stop", "message": msg}]}), "m")
    assert (got.text, got.reasoning_chars) == ("B", 8)
    # reasoning is never the answer
    assert read_completion(reply(chat("", finish="length")), "m").reasoning_chars is None


def test_statuses_and_the_proxy() -> None:
    def fail(status: int, *, proxied: bool = False, **headers: str) -> AttemptFailed:
        with pytest.raises(AttemptFailed) as ei:
            read_completion(reply({"error": {"message": "nope \ud800"}}, status, headers), "m", proxied=proxied)
        return ei.value

    assert fail(500).transient and "nope \ufffd" in fail(500).reason
    assert fail(429, **{"Retry-After": "7"}).retry_after == 7.0 and fail(429).overload
    assert fail(429, **{"Retry-After": "99999"}).retry_after == 120.0
    assert fail(429, **{"Retry-After": "Fri, 99 Dec 99999 99:99:99 GMT"}).retry_after is None
    assert not fail(400).transient and fail(400).status == 400
    assert not fail(407).transient and fail(407).advice is None
    assert "from the proxy" in fail(407, proxied=True).reason and fail(407, proxied=True).advice


def test_another_model_is_named_and_an_alias_accepted() -> None:
    with pytest.raises(AttemptFailed) as ei:
        read_completion(reply(chat("x", model="other")), "m")
    assert ei.value.other_model == "other" and "--allow-model-alias" in (ei.value.advice or "")
    assert read_completion(reply(chat("x", model="a")), "m", frozenset({"a"})).model == "a"
    assert read_completion(reply(chat("x", model=None)), "m").model is None
