"""The reference server as the official `openai` client, and raw HTTP, see it.

What vLLM does is the yardstick: server-sent-event streams (`data: {chunk}` ... `data:
[DONE]`), `GET /v1/models/{id}`, `n` choices, usage in every reply, and a 404 in vLLM's words
for a model id it does not serve. The client runs with strict response validation, so a
reply whose shape its types do not accept fails the test rather than passing half-parsed.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import requests
from PIL import Image

from pytest_satbench.server import RunningServer, start_server

TIMEOUT = 30
BOX = "[0, 0, 1000, 1000]"  # the multi-word fixed answer to a referring request


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with start_server() as srv:
        yield srv


def _client(srv: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT,
        # Loopback only: no proxy from the environment may route these requests elsewhere.
        http_client=openai.DefaultHttpxClient(trust_env=False),
        _strict_response_validation=True,
    )


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[openai.OpenAI]:
    with _client(server) as c:
        yield c


def _red_roof_jpeg() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 40, 40)).save(buf, format="JPEG", quality=95)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


# (question, with an image, the reference server's answer): one word read off the pixels,
# and a multi-piece text-only answer so a stream has more than one content delta.
CASES = [
    pytest.param("How many buildings are there?", True, "1", id="count-from-pixels"),
    pytest.param("where is the ship at the bottom", False, BOX, id="box-4-pieces"),
]


def _messages(text: str, with_image: bool) -> list[dict[str, Any]]:
    content: list[dict[str, Any]] = []
    if with_image:
        content.append({"type": "image_url", "image_url": {"url": _red_roof_jpeg()}})
    content.append({"type": "text", "text": text})
    return [{"role": "user", "content": content}]


@pytest.mark.parametrize(("text", "with_image", "expected"), CASES)
def test_non_streaming_reply(client: openai.OpenAI, server: RunningServer, text: str,
                             with_image: bool, expected: str) -> None:
    r = client.chat.completions.create(model=server.model, messages=_messages(text, with_image),
                                       temperature=0, max_tokens=16)
    assert r.object == "chat.completion" and r.model == server.model
    assert [c.index for c in r.choices] == [0]
    assert r.choices[0].message.content == expected
    assert r.choices[0].message.role == "assistant" and r.choices[0].finish_reason == "stop"
    assert r.usage is not None
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.completion_tokens == len(expected.split())


@pytest.mark.parametrize(("text", "with_image", "expected"), CASES)
def test_stream_joins_to_the_non_streaming_answer_and_ends_with_usage(
    client: openai.OpenAI, server: RunningServer, text: str, with_image: bool, expected: str
) -> None:
    messages = _messages(text, with_image)
    plain = client.chat.completions.create(model=server.model, messages=messages,
                                           temperature=0, max_tokens=16)
    chunks = list(client.chat.completions.create(
        model=server.model, messages=messages, temperature=0, max_tokens=16, stream=True,
        stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" and c.model == server.model
               for c in chunks)
    assert len({c.id for c in chunks}) == 1  # one id for the whole stream
    *body, last = chunks
    first = body[0].choices[0]
    assert first.delta.role == "assistant" and first.delta.content == ""
    assert "".join(c.choices[0].delta.content or "" for c in body) == expected
    assert len([c for c in body if c.choices[0].delta.content]) == len(expected.split())
    assert [c.choices[0].finish_reason for c in body] == [None] * (len(body) - 1) + ["stop"]
    assert all(c.usage is None for c in body)
    # The usage chunk: no choices, the same usage as the non-streaming reply.
    assert last.choices == [] and last.usage == plain.usage


def test_stream_without_include_usage_has_no_usage_chunk(client: openai.OpenAI,
                                                        server: RunningServer) -> None:
    chunks = list(client.chat.completions.create(
        model=server.model, messages=_messages("Describe the image.", False), stream=True))
    assert chunks and all(c.usage is None and len(c.choices) == 1 for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "unknown"


def test_models_list_and_retrieve(client: openai.OpenAI, server: RunningServer) -> None:
    listed = client.models.list().data
    assert [m.id for m in listed] == [server.model]
    m = client.models.retrieve(server.model)
    assert (m.id, m.object, m.owned_by, m.created) == (server.model, "model",
                                                      "pytest-satbench", 0)
    # vLLM's extra fields, in the retrieved card and in the list entry alike.
    assert m.model_extra == listed[0].model_extra
    assert m.model_extra is not None
    assert m.model_extra["root"] == server.model and m.model_extra["max_model_len"] > 0
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("no-such-model")
    assert e.value.status_code == 404 and e.value.body == {
        "message": "The model `no-such-model` does not exist.", "type": "NotFoundError",
        "param": "model", "code": 404}


def test_a_model_id_with_a_slash_is_retrieved_and_asked() -> None:
    # Hub-style ids are the norm on vLLM; the client percent-encodes the "/" in the path.
    with start_server(model="org/vlm-7B") as srv, _client(srv) as c:
        assert c.models.retrieve("org/vlm-7B").id == "org/vlm-7B"
        r = c.chat.completions.create(model="org/vlm-7B",
                                      messages=_messages("Describe the image.", False))
        assert r.model == "org/vlm-7B" and r.choices[0].message.content == "unknown"


def test_n_choices(client: openai.OpenAI, server: RunningServer) -> None:
    messages = _messages("where is the ship", False)
    one = client.chat.completions.create(model=server.model, messages=messages)
    three = client.chat.completions.create(model=server.model, messages=messages, n=3)
    # Deterministic: every choice is the same answer, indexed 0..n-1.
    assert [(c.index, c.message.content) for c in three.choices] == [
        (0, BOX), (1, BOX), (2, BOX)]
    assert one.usage is not None and three.usage is not None
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    assert three.usage.completion_tokens == 3 * one.usage.completion_tokens
    streamed: dict[int, str] = defaultdict(str)
    finished: list[int] = []
    usage = None
    for chunk in client.chat.completions.create(model=server.model, messages=messages, n=3,
                                                stream=True,
                                                stream_options={"include_usage": True}):
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
            if c.finish_reason is not None:
                finished.append(c.index)
        usage = chunk.usage or usage
    assert dict(streamed) == {0: BOX, 1: BOX, 2: BOX} and sorted(finished) == [0, 1, 2]
    assert usage == three.usage


@pytest.mark.parametrize("n", [0, -1, 129, "2", True, 1.5])
def test_a_bad_n_is_a_400_naming_n(server: RunningServer, n: object) -> None:
    r = requests.post(f"{server.url}/v1/chat/completions", timeout=TIMEOUT, json={
        "model": server.model, "n": n, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "n" and "'n' must be an integer from 1 to 128" in err["message"]
    assert err["type"] == "invalid_request_error"


def test_bad_n_through_the_client_is_a_bad_request(client: openai.OpenAI,
                                                   server: RunningServer) -> None:
    with pytest.raises(openai.BadRequestError, match="'n' must be"):
        client.chat.completions.create(model=server.model, n=0,
                                       messages=_messages("hi", False))


def test_stream_options_without_stream_is_a_400(server: RunningServer) -> None:
    r = requests.post(f"{server.url}/v1/chat/completions", timeout=TIMEOUT, json={
        "model": server.model, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_an_unknown_model_is_vllms_404(client: openai.OpenAI, stream: bool) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        r = client.chat.completions.create(model="gpt-4o", stream=stream,
                                           messages=_messages("hi", False))
        list(r) if stream else None  # type: ignore[call-overload]  # r: the stream when stream is set
    assert e.value.status_code == 404
    assert e.value.body == {"message": "The model `gpt-4o` does not exist.",
                            "type": "NotFoundError", "param": "model", "code": 404}


def test_a_request_naming_no_model_gets_the_served_one(server: RunningServer) -> None:
    # As on vLLM: "model" may be left out, and then means the one model served.
    r = requests.post(f"{server.url}/v1/chat/completions", timeout=TIMEOUT,
                      json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.json()["model"] == server.model


def _post(conn: http.client.HTTPConnection, doc: dict[str, Any]) -> http.client.HTTPResponse:
    conn.request("POST", "/v1/chat/completions", body=json.dumps(doc),
                 headers={"Content-Type": "application/json"})
    return conn.getresponse()


def test_sse_framing_and_keep_alive_after_a_stream(server: RunningServer) -> None:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
    ask = {"model": server.model, "messages": [{"role": "user", "content": "where is it"}]}
    try:
        resp = _post(conn, {**ask, "stream": True, "stream_options": {"include_usage": True}})
        assert resp.status == 200
        assert resp.getheader("Content-Type") == "text/event-stream"
        assert resp.getheader("Transfer-Encoding") == "chunked"
        assert resp.getheader("Content-Length") is None
        sock = conn.sock
        raw = resp.read().decode()  # http.client undoes the chunking, or fails on bad framing
        # Events are "data: <payload>" lines, each ended by a blank line; [DONE] comes last.
        assert raw.endswith("data: [DONE]\n\n")
        events = raw.split("\n\n")
        assert events[-1] == "" and events[-2] == "data: [DONE]"
        payloads = [e.removeprefix("data: ") for e in events[:-2]]
        assert all(e.startswith("data: ") and "\n" not in e for e in events[:-1])
        docs = [json.loads(p) for p in payloads]
        assert docs[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(d["choices"][0]["delta"].get("content", "")
                       for d in docs[:-1]) == BOX
        assert docs[-2]["choices"][0]["finish_reason"] == "stop"
        assert docs[-1]["choices"] == [] and docs[-1]["usage"]["completion_tokens"] == 4
        # The same socket serves a plain request next: the stream did not end the connection.
        plain = _post(conn, ask)
        assert conn.sock is sock and plain.status == 200
        assert plain.getheader("Content-Type") == "application/json"
        doc = json.loads(plain.read())
        assert doc["choices"][0]["message"]["content"] == BOX
        assert doc["usage"] == docs[-1]["usage"]
        # ... and another stream after that.
        again = _post(conn, {**ask, "stream": True})
        assert conn.sock is sock and again.read().decode().endswith("data: [DONE]\n\n")
    finally:
        conn.close()


def test_a_bad_content_length_is_a_400_not_a_hang(server: RunningServer) -> None:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
    try:
        conn.putrequest("POST", "/v1/chat/completions")
        conn.putheader("Content-Length", "-5")
        conn.endheaders()
        resp = conn.getresponse()
        assert resp.status == 400
        assert "Content-Length" in json.loads(resp.read())["error"]["message"]
    finally:
        conn.close()
