"""The transport's framing and connections (issue 17), against real loopback servers.

A reply arrives whole however the server ends it (Content-Length, chunks, the close of an
HTTP/1.0 connection or of a `Connection: close` reply) and is never thrown away; a pooled
connection the server closed is found before a request goes out on it; a request that a
reused connection dropped before any reply is sent again on a new one, once, and is not a
failure; compressed bodies are decoded within the cap.
"""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from servers import Fail, FakeVLM, chat_completion

from pytest_satbench.engine import transport
from pytest_satbench.engine.transport import Connections, TransportError

BODY = b'{"model": "m", "messages": [{"role": "user", "content": "%s"}]}'


@contextmanager
def connections(srv: FakeVLM, **kw: object) -> Iterator[Connections]:
    conns = Connections(srv.url, connect_timeout=2.0, read_timeout=10.0, headers={}, proxies=transport.ProxySettings(),
                        **kw)  # type: ignore[arg-type]  # kw: the caller's reply fields
    try:
        yield conns
    finally:
        conns.close()


def chat(conns: Connections, prompt: str = "q") -> transport.Response:
    return conns.request("POST", "/v1/chat/completions", BODY % prompt.encode())


def wait_until(cond: object, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]  # cond: a callable
            return True
        time.sleep(0.005)
    return bool(cond())  # type: ignore[operator]  # cond: a callable


@pytest.mark.parametrize("content_length", [True, False], ids=["content-length", "body-to-close"])
def test_an_http10_reply_is_read_to_its_end_and_its_connection_not_pooled(content_length: bool) -> None:
    with FakeVLM(["m"], http10=True, content_length=content_length) as srv, connections(srv) as conns:
        models = conns.request("GET", "/v1/models")
        replies = [chat(conns, f"q{i}") for i in range(3)]
        idle = len(conns._idle)
    assert models.json()["data"][0]["id"] == "m"
    assert all(r.json()["choices"][0]["message"]["content"] == "fake answer" for r in replies)
    assert idle == 0 and srv.connections == 4 and conns.resent == 0


def test_a_body_to_close_over_the_cap_is_too_large() -> None:
    with (
        FakeVLM(["m"], http10=True, content_length=False, fail_always=Fail.huge(50_000)) as srv,
        connections(srv, max_body=10_000) as conns,
        pytest.raises(TransportError) as ei,
    ):
        chat(conns)
    assert ei.value.kind == "too-large"


def test_a_pooled_connection_the_server_closed_is_dropped_before_reuse() -> None:
    with FakeVLM(["m"], drop_share=1.0) as srv, connections(srv) as conns:
        assert chat(conns).status == 200
        (conn, _), = conns._idle
        # the server closes it after its reply; once that has reached us, the check sees it
        assert wait_until(lambda: not transport._still_open(conn))
        assert chat(conns).status == 200
    assert conns.resent == 0 and srv.connections == 2 and srv.chat_requests == 2


def test_an_idle_connection_still_open_is_reused() -> None:
    with FakeVLM(["m"]) as srv, connections(srv) as conns:
        for _ in range(3):
            assert chat(conns).status == 200
        (conn, _), = conns._idle
        assert transport._still_open(conn)
    assert srv.connections == 1


def test_a_request_a_reused_connection_dropped_is_sent_again_once_and_is_no_failure() -> None:
    # the server reads request 2 and closes without a word, as it does to an idle connection
    # it times out just as a request arrives: the client cannot tell, and sends it again once
    with FakeVLM(["m"], fail_at={2: Fail.hangup()}) as srv, connections(srv) as conns:
        assert chat(conns).status == 200
        again = chat(conns)
    assert again.json()["choices"][0]["message"]["content"] == "fake answer"
    assert conns.resent == 1 and srv.chat_requests == 3 and srv.connections == 2


def test_a_new_connection_closed_without_a_reply_is_a_reset_not_resent() -> None:
    with (
        FakeVLM(["m"], fail_always=Fail.hangup()) as srv,
        connections(srv) as conns,
        pytest.raises(TransportError) as ei,
    ):
        chat(conns)
    assert ei.value.kind == "reset" and conns.resent == 0 and srv.chat_requests == 1


def test_a_reused_connection_dropped_twice_is_a_reset() -> None:
    # the resend goes on a new connection; when that one drops too, it is a failure
    with FakeVLM(["m"], fail_at={2: Fail.hangup(), 3: Fail.hangup()}) as srv, connections(srv) as conns:
        assert chat(conns).status == 200
        with pytest.raises(TransportError) as ei:
            chat(conns)
    assert ei.value.kind == "reset" and conns.resent == 1 and srv.chat_requests == 3


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "deflate-raw"])
def test_compressed_bodies_are_decoded(encoding: str) -> None:
    with FakeVLM(["m"], encoding=encoding) as srv, connections(srv) as conns:
        r = chat(conns)
        models = conns.request("GET", "/v1/models")
    assert r.json()["choices"][0]["message"]["content"] == "fake answer"
    assert models.json()["data"][0]["id"] == "m"


def test_a_gzip_body_is_capped_after_inflating() -> None:
    # 2 MB of spaces gzip to a few kB: the cap is on what it inflates to
    raw = json.dumps(chat_completion("x")) + " " * 2_000_000
    with (
        FakeVLM(["m"], encoding="gzip", fail_always=Fail.raw(raw)) as srv,
        connections(srv, max_body=100_000) as conns,
        pytest.raises(TransportError) as ei,
    ):
        chat(conns)
    assert ei.value.kind == "too-large" and "inflates to over the 100000-byte cap" in str(ei.value)
    assert len(gzip.compress(raw.encode())) < 100_000


def test_an_unknown_encoding_is_named_and_a_body_that_does_not_decode_is_corrupt() -> None:
    with (
        FakeVLM(["m"], encoding="not-really", fail_always=Fail.raw("{}")) as srv,
        connections(srv) as conns,
        pytest.raises(TransportError) as unknown,
    ):
        chat(conns)
    assert unknown.value.kind == "encoding" and "Content-Encoding: not-really" in str(unknown.value)
    assert transport._decoded(b"plain", "identity", 100, 200) == b"plain"
    with pytest.raises(TransportError) as corrupt:
        transport._decoded(b"{}", "gzip", 100, 200)
    assert corrupt.value.kind == "corrupt" and "gzip" in str(corrupt.value)
    with pytest.raises(TransportError) as cut:
        transport._decoded(gzip.compress(b"x" * 1000)[:20], "gzip", 10_000, 200)
    assert cut.value.kind == "corrupt"
    # listed encodings are undone from the last
    assert transport._decoded(gzip.compress(gzip.compress(b"ab")), "gzip, x-gzip", 100, 200) == b"ab"
