"""ServerPool against real loopback HTTP servers (tests/servers.py), no mocked HTTP."""

from __future__ import annotations

import base64
import http.client
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from servers import Fail, FakeVLM, dead_url, one_line

from pytest_satbench.core.records import ServerTraffic
from pytest_satbench.core.usage import percentile as _percentile
from pytest_satbench.engine.client import Answer, ServerPool
from pytest_satbench.engine.failures import ModelMismatch, RequestFailed, ServerUnavailable

FAST = {"backoff_base": 0.01, "backoff_max": 0.05, "timeout": 5.0, "connect_timeout": 2.0}
JPEG = bytes(range(256)) * 3  # the client never decodes it; any bytes must round-trip


@pytest.fixture(autouse=True)
def no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loopback servers are reached directly whatever proxy the machine runs behind
    (tests/engine/test_proxy.py tests proxies)."""
    for name in ("http_proxy", "https_proxy", "no_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)




def ask(pool: ServerPool, prompt: str = "q", image: bytes | None = JPEG, **kw: object) -> Answer:
    return pool.ask(model="m", prompt=prompt, image_jpeg=image, max_tokens=kw.pop("max_tokens", 16),
                    **kw)  # type: ignore[arg-type]  # kw: the caller's reply fields


# ---------------------------------------------------------------------------- request format

def test_request_body_is_the_seed_format_with_image_and_key() -> None:
    with FakeVLM(["m"]) as srv, ServerPool([srv.url], api_key="sk-test", **FAST) as pool:
        a = pool.ask(model="m", prompt="how many ships?", image_jpeg=JPEG, max_tokens=33)
        b = pool.ask(model="m", prompt="blind", image_jpeg=None, max_tokens=7)
    assert a.text == "fake answer" and a.finish_reason == "stop" and a.attempts == 1
    r1, r2 = srv.recorded
    assert (r1.model, r1.max_tokens, r1.temperature) == ("m", 33, 0.0)
    assert r1.image_bytes == JPEG and r1.prompt == "how many ships?"
    content = r1.body["messages"][0]["content"]
    assert [p["type"] for p in content] == ["image_url", "text"]
    assert content[0]["image_url"]["url"] == "data:image/jpeg;base64," + base64.b64encode(JPEG).decode()
    assert r1.body["messages"][0]["role"] == "user"
    assert r2.body["messages"][0]["content"] == [{"type": "text", "text": "blind"}]
    assert not r2.has_image and r2.max_tokens == 7
    assert r1.authorization == "Bearer sk-test"
    assert b.server == srv.url


def test_empty_content_is_an_answer_and_an_aliased_model_is_reported() -> None:
    # Issue 10: a null content is no answer (tests/engine/test_client_faults.py); "" is one.
    # A reply from another model id is accepted only when that id is an allowed alias.
    empty: Callable[[str, bool, bytes | None], str] = lambda p, h, i: ""  # noqa: E731 (typed inline: the server's answer)
    with (
        FakeVLM(["m"], answer=empty, response_model="org/m-2025", finish_reason="length", usage=None) as srv,
        ServerPool([srv.url], model_aliases=frozenset({"org/m-2025"}), **FAST) as pool,
    ):
        a = ask(pool)
    assert (a.text, a.finish_reason, a.model, a.clipped) == ("", "length", "org/m-2025", False)
    assert a.prompt_tokens is None and a.completion_tokens is None and a.cost is None


# ---------------------------------------------------------------------------- retries

@pytest.mark.parametrize("failure", [
    Fail.http(500), Fail.http(502), Fail.http(503), Fail.rate_limited(), Fail.reset(),
    Fail.malformed(), Fail.truncated(), Fail.hang(2.0),
], ids=lambda f: f"{f.kind}-{f.status}" if f.kind == "status" else f.kind)
def test_transient_failures_are_retried(failure: Fail) -> None:
    with (
        FakeVLM(["m"], fail_prompt={"q": [failure, failure]}) as srv,
        ServerPool([srv.url], retries=3, **{**FAST, "timeout": 0.5}) as pool,
    ):
        a = ask(pool)
        u = pool.usage()[srv.url]
    assert a.text == "fake answer" and a.attempts == 3
    assert srv.prompt_hits["q"] == 3
    assert (u.requests, u.answered, u.failures, u.retries) == (3, 1, 2, 2)


def test_retry_after_is_honoured() -> None:
    def timed(fail: Fail) -> float:
        with (
            FakeVLM(["m"], fail_prompt={"q": [fail]}) as srv,
            ServerPool([srv.url], retries=1, **FAST) as pool,
        ):
            t0 = time.monotonic()
            assert ask(pool).attempts == 2
            return time.monotonic() - t0

    assert timed(Fail.rate_limited(retry_after=1)) >= 1.0
    # the wait came from the header, not from the backoff
    assert timed(Fail.rate_limited()) < 0.5


@pytest.mark.parametrize("status,advice", [(400, "--max-new"), (401, "API key"),
                                           (403, "API key"), (404, "--model"), (422, "--model")])
def test_client_errors_fail_at_once(status: int, advice: str) -> None:
    msg = f"maximum context length is 4096 tokens (status {status})"
    with (
        FakeVLM(["m"], fail_always=Fail.http(status, msg)) as srv,
        ServerPool([srv.url], retries=4, **FAST) as pool,
        pytest.raises(RequestFailed) as ei,
    ):
        ask(pool)
    s = one_line(ei.value)
    assert srv.chat_requests == 1
    assert ei.value.attempts == 1 and ei.value.status == status and not ei.value.transient
    assert srv.url in s and f"HTTP {status}" in s and msg in s and advice in s
    assert "after 1 attempt:" in s


def test_an_answer_is_never_retried_whatever_it_says() -> None:
    # empty, truncated by length, obviously wrong: still an answer
    with (
        FakeVLM(["m"], answer=lambda p, h, i: "", finish_reason="length") as srv,
        ServerPool([srv.url], retries=4, **FAST) as pool,
    ):
        a = ask(pool)
    assert a.attempts == 1 and a.text == "" and srv.chat_requests == 1


def test_retries_exhausted_gives_one_line_naming_server_and_attempts() -> None:
    with (
        FakeVLM(["m"], fail_always=Fail.http(500, "CUDA out of memory\nat line 3")) as srv,
        ServerPool([srv.url], retries=2, **FAST) as pool,
    ):
        with pytest.raises(RequestFailed) as ei:
            ask(pool)
        u = pool.usage()[srv.url]
    s = one_line(ei.value)
    assert srv.chat_requests == 3 and ei.value.attempts == 3 and ei.value.transient
    assert srv.url in s and "3 attempts" in s and "CUDA out of memory at line 3" in s
    assert "--retries" in s
    assert (u.requests, u.failures, u.answered) == (3, 3, 0)


def test_refused_connection_exhausted() -> None:
    url = dead_url()
    with ServerPool([url], retries=1, **FAST) as pool, pytest.raises(RequestFailed) as ei:
        ask(pool)
    s = one_line(ei.value)
    assert url in s and "refused" in s.lower() and ei.value.attempts == 2


def test_retry_goes_to_another_server() -> None:
    with (
        FakeVLM(["m"], fail_always=Fail.http(500)) as bad, FakeVLM(["m"]) as good,
        ServerPool([bad.url, good.url], retries=1, **FAST) as pool,
    ):
        answers = [ask(pool, prompt=f"q{i}") for i in range(6)]
    assert all(a.server == good.url for a in answers)
    assert bad.chat_requests >= 1  # it was tried, and every try it failed was moved over
    assert sum(a.attempts - 1 for a in answers) == bad.chat_requests


def test_retry_prefers_another_server_even_a_busier_one() -> None:
    with (
        FakeVLM(["m"], fail_prompt={"q": [Fail.http(500)] * 5}) as a, FakeVLM(["m"], delay=0.6) as b,
        ServerPool([a.url, b.url], retries=1, **FAST) as pool,
    ):
        assert ask(pool, prompt="warm-up").server == a.url  # the tie goes to a; next tie to b
        with ThreadPoolExecutor(1) as ex:
            busy = ex.submit(ask, pool, "busy")
            while b.chat_requests == 0:  # b now holds one request for 0.6 s
                time.sleep(0.01)
            answer = ask(pool, prompt="q")  # idle a first, then the retry to busy b
            assert busy.result().server == b.url
    assert answer.server == b.url and answer.attempts == 2
    assert a.prompt_hits["q"] == 1


def test_dead_server_is_cooled_down_not_hammered() -> None:
    url = dead_url()
    with (
        FakeVLM(["m"], delay=0.01) as live,
        ServerPool([url, live.url], retries=4, concurrency=8, backoff_base=0.05, backoff_max=5.0) as pool,
    ):
        with ThreadPoolExecutor(8) as ex:
            answers = list(ex.map(lambda i: ask(pool, prompt=f"q{i}"), range(80)))
        u = pool.usage()
    assert len(answers) == 80 and all(a.server == live.url for a in answers)
    assert u[url].requests >= 1 and u[url].answered == 0
    # "fewest in flight" alone would send the instantly-failing server half the traffic
    assert u[url].requests < u[live.url].requests / 4


# ---------------------------------------------------------------------------- spreading, cap, pooling

def _run_parallel(pool: ServerPool, n: int, threads: int) -> list[Answer]:
    with ThreadPoolExecutor(threads) as ex:
        return list(ex.map(lambda i: ask(pool, prompt=f"q{i}"), range(n)))


def test_load_is_spread_over_servers() -> None:
    with (
        FakeVLM(["m"], delay=0.02) as a, FakeVLM(["m"], delay=0.02) as b,
        ServerPool([a.url, b.url], concurrency=8, **FAST) as pool,
    ):
        answers = _run_parallel(pool, 40, 8)
        u = pool.usage()
    assert a.chat_requests + b.chat_requests == 40
    assert min(a.chat_requests, b.chat_requests) >= 10
    assert u[a.url].answered == a.chat_requests and u[b.url].answered == b.chat_requests
    assert {x.server for x in answers} == {a.url, b.url}


def test_slow_server_gets_fewer_requests() -> None:
    with (
        FakeVLM(["m"], delay=0.3) as slow, FakeVLM(["m"], delay=0.01) as fast,
        ServerPool([slow.url, fast.url], concurrency=8, **FAST) as pool,
    ):
        _run_parallel(pool, 40, 8)
    assert slow.chat_requests >= 1
    assert slow.chat_requests * 2 < fast.chat_requests


def test_concurrency_cap_is_respected() -> None:
    with FakeVLM(["m"], delay=0.15) as srv, ServerPool([srv.url], concurrency=3, **FAST) as pool:
        answers = _run_parallel(pool, 12, 12)
    assert len(answers) == 12
    assert srv.max_in_flight == 3


def test_keep_alive_connections_are_reused() -> None:
    with FakeVLM(["m"]) as srv:
        with ServerPool([srv.url], **FAST) as pool:
            pool.health_check()
            latencies = sorted(ask(pool, prompt=f"q{i}").latency_s for i in range(10))
            p50 = latencies[len(latencies) // 2]
        assert srv.hits["/v1/chat/completions"] == 10
        # a reused connection must not cost a Nagle/delayed-ACK stall (~40 ms) per request;
        # loopback answers take a few ms
        assert p50 is not None and p50 < 0.03
        assert srv.connections == 1
        # the seed's requests.post without a session: one connection per request
        host, port = srv.url.removeprefix("http://").split(":")
        for _ in range(3):
            once = http.client.HTTPConnection(host, int(port), timeout=5)
            once.request("POST", "/v1/chat/completions", headers={"Content-Type": "application/json"},
                         body=json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}))
            once.getresponse().read()
            once.close()
        assert srv.connections == 4


# ---------------------------------------------------------------------------- health and model

def test_health_check_lists_models_per_server() -> None:
    with (
        FakeVLM(["m"]) as a, FakeVLM(["m", "lora"]) as b,
        ServerPool([a.url + "/v1/", b.url], **FAST) as pool,
    ):
        assert pool.health_check() == {a.url: ["m"], b.url: ["m", "lora"]}


def test_health_check_failure_names_the_server() -> None:
    url = dead_url()
    with (
        FakeVLM(["m"]) as live, ServerPool([live.url, url], **FAST) as pool,
        pytest.raises(ServerUnavailable) as ei,
    ):
        pool.health_check()
    s = one_line(ei.value)
    assert url in s and live.url not in s and "refused" in s.lower()


def test_health_check_401_never_shows_the_key() -> None:
    key = "sk-or-v1-0123456789abcdef"
    with (
        FakeVLM(["m"], fail_models=Fail.http(401, "invalid key: {authorization}")) as srv,
        ServerPool([srv.url], api_key=key, **FAST) as pool,
        pytest.raises(ServerUnavailable) as ei,
    ):
        pool.health_check()
    s = one_line(ei.value)
    assert "401" in s and srv.url in s and "invalid key" in s
    assert key not in s and key not in repr(ei.value)


def test_resolve_model() -> None:
    with FakeVLM(["rsthinker"]) as a, FakeVLM(["rsthinker"]) as b, FakeVLM(["other"]) as c, \
            FakeVLM(["rsthinker", "lora"]) as d:
        with ServerPool([a.url, b.url], **FAST) as pool:
            assert pool.resolve_model(None) == "rsthinker"
            assert pool.resolve_model("rsthinker") == "rsthinker"
            with pytest.raises(ModelMismatch) as ei:
                pool.resolve_model("nope")
            s = one_line(ei.value)
            assert "'nope'" in s and a.url in s and "rsthinker" in s and "--model" in s
        with ServerPool([a.url, c.url], **FAST) as pool:
            with pytest.raises(ModelMismatch) as ei:
                pool.resolve_model(None)
            s = one_line(ei.value)
            assert a.url in s and c.url in s and "'other'" in s and "disagree" in s
        with ServerPool([a.url, d.url], **FAST) as pool:
            with pytest.raises(ModelMismatch) as ei:
                pool.resolve_model(None)
            assert d.url in one_line(ei.value) and "--model" in str(ei.value)
            assert pool.resolve_model("rsthinker") == "rsthinker"
            with pytest.raises(ModelMismatch) as ei:
                pool.resolve_model("lora")
            assert a.url in one_line(ei.value)


# ---------------------------------------------------------------------------- usage and secrets

def test_usage_accounting_per_server() -> None:
    """The client counts attempts per server (one `ServerTraffic` record, with its limits);
    each answer carries its usage, which the reports sum per server from the stored rows."""
    usage_a = {"prompt_tokens": 1234, "completion_tokens": 56, "cost": 0.00125}
    with (
        FakeVLM(["m"], usage=usage_a, response_model="provider/m-a",
                fail_prompt={"q0": [Fail.http(503)]}) as a,
        FakeVLM(["m"], usage=None) as b,
        ServerPool([a.url, b.url], retries=2, model_aliases=frozenset({"provider/m-a"}), **FAST) as pool,
    ):
        answers = [ask(pool, prompt=f"q{i}") for i in range(10)]
        u = pool.usage()
    on_a = [x for x in answers if x.server == a.url]
    on_b = [x for x in answers if x.server == b.url]
    assert on_a and on_b
    ua, ub = u[a.url], u[b.url]
    assert isinstance(ua, ServerTraffic)
    assert ua.answered == len(on_a) and ub.answered == len(on_b)
    assert all((x.prompt_tokens, x.completion_tokens, x.model) == (1234, 56, "provider/m-a") for x in on_a)
    assert all(x.prompt_tokens is None and x.model == "m" for x in on_b)
    assert ua.failures == 1 and ua.retries + ub.retries == 1
    assert ua.requests + ub.requests == len(answers) + 1
    assert all(x.cost == usage_a["cost"] for x in on_a) and all(x.cost is None for x in on_b)
    both = ua + ua  # xdist workers' records of one server add up
    assert (both.requests, both.answered, both.failures) == (2 * ua.requests, 2 * ua.answered, 2)


def test_percentile_matches_numpy() -> None:
    xs = [0.3, 1.7, 0.2, 9.0, 4.4, 2.5, 0.9]
    for q in (0, 50, 95, 100):
        assert _percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert _percentile([], 50) is None


def test_api_key_never_in_errors_or_repr() -> None:
    key = "sk-secret-4f9a8b7c6d5e"
    with FakeVLM(["m"], fail_always=Fail.http(401, "Incorrect API key provided: {authorization}")) as s401, \
            FakeVLM(["m"], fail_always=Fail.http(500, "upstream said {authorization}")) as s500:
        for srv in (s401, s500):
            with ServerPool([srv.url], api_key=key, retries=1, **FAST) as pool:
                with pytest.raises(RequestFailed) as ei:
                    ask(pool)
                assert srv.recorded[0].authorization == f"Bearer {key}"  # it was sent...
                for text in (str(ei.value), repr(ei.value), repr(pool)):  # ...and never shown
                    assert key not in text
                assert "<api-key>" in str(ei.value)


def test_bad_urls_are_refused_with_one_line() -> None:
    for urls, needle in ([["127.0.0.1:8000"]], "127.0.0.1:8000"), ([[]], "--servers"), \
            ([["http://h:1", "http://h:1/v1"]], "twice"):
        with pytest.raises(ValueError) as ei:
            ServerPool(*urls)
        assert needle in one_line(ei.value)
    pool = ServerPool(["http://user:pw@h:1/v1/"])
    assert pool.urls == ["http://h:1"] and "pw" not in repr(pool)


# ---------------------------------------------------------------------------- the fake as a process

def test_fake_server_runs_as_a_process() -> None:
    script = Path(__file__).parent.parent / "servers.py"
    proc = subprocess.Popen([sys.executable, str(script), "--model", "px", "--answer", "B"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        with ServerPool([url], **FAST) as pool:
            assert pool.resolve_model(None) == "px"
            assert pool.ask(model="px", prompt="q", image_jpeg=None, max_tokens=4).text == "B"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_pool_is_thread_safe_under_mixed_failures() -> None:
    script = {f"q{i}": [Fail.reset()] for i in range(0, 60, 3)}
    script |= {f"q{i}": [Fail.http(500)] for i in range(1, 60, 3)}
    with (
        FakeVLM(["m"], fail_prompt=script) as a, FakeVLM(["m"], fail_prompt=script) as b,
        ServerPool([a.url, b.url], retries=3, concurrency=6, **FAST) as pool,
    ):
        answers = _run_parallel(pool, 60, 16)
        u = pool.usage()
    assert len(answers) == 60
    total = sum(x.requests for x in u.values())
    assert total == a.chat_requests + b.chat_requests
    assert sum(x.answered for x in u.values()) == 60
    assert sum(x.failures for x in u.values()) == total - 60 == sum(x.attempts - 1 for x in answers)
    assert threading.active_count() < 40  # no thread leak from retries or cool-downs


def test_thread_server_serves_a_pytester_subprocess(pytester: pytest.Pytester) -> None:
    # The documented way to hand a FakeVLM to a pytest run in another process: its URL.
    with FakeVLM(["m"], answer=lambda p, h, i: p.upper()) as srv:
        pytester.makepyfile(f"""
            from pytest_satbench.engine.client import ServerPool

            def test_ask():
                with ServerPool([{srv.url!r}]) as pool:
                    assert pool.resolve_model(None) == "m"
                    a = pool.ask(model="m", prompt="ships", image_jpeg=b"x", max_tokens=4)
                    assert a.text == "SHIPS"
        """)
        result = pytester.runpytest_subprocess("-p", "no:satbench", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert srv.prompt_hits["ships"] == 1


def test_exhausted_over_several_servers_names_them_all() -> None:
    with (
        FakeVLM(["m"], fail_always=Fail.http(503)) as a, FakeVLM(["m"], fail_always=Fail.reset()) as b,
        ServerPool([a.url, b.url], retries=3, **FAST) as pool,
        pytest.raises(RequestFailed) as ei,
    ):
        ask(pool)
    s = one_line(ei.value)
    assert a.url in s and b.url in s and "4 attempts" in s
    assert a.chat_requests + b.chat_requests == 4 and a.chat_requests >= 1 and b.chat_requests >= 1


def test_credentials_in_server_url_never_shown() -> None:
    with FakeVLM(["m"]) as srv:
        secret_url = srv.url.replace("http://", "http://user:hunter2@")
        with ServerPool([secret_url], **FAST) as pool:
            models = pool.health_check()
            a = ask(pool)
            shown = [repr(pool), a.server, *pool.usage(), *models, repr(pool.usage()), *pool.urls]
    assert srv.recorded[0].authorization is not None  # sent as Basic auth
    assert a.server == srv.url and not any("hunter2" in x for x in shown)


def test_chat_payload_is_the_seeds_message_as_json() -> None:
    import base64 as b64

    from pytest_satbench.engine.wire import chat_payload

    image = bytes(range(256)) * 40
    prompt = 'Is there a "ship"?\nAnswer: é ✓'
    body = json.loads(chat_payload("m-1", prompt, b64.b64encode(image), 64, 0.0))
    assert body == {
        "model": "m-1", "temperature": 0.0, "max_tokens": 64,
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + b64.b64encode(image).decode()}},
            {"type": "text", "text": prompt},
        ]}],
    }
    blind = json.loads(chat_payload("m-1", prompt, None, 64, 0.0))
    assert blind["messages"][0]["content"] == [{"type": "text", "text": prompt}]


def test_chat_payload_carries_the_model_settings() -> None:
    """--top-p, a request seed, a system prompt and --extra-body's keys reach the body; the
    default body (none of them) is the one above, key for key."""
    from pytest_satbench.engine.wire import chat_payload

    body = json.loads(chat_payload("m-1", "q?", b"QUJD", 64, 0.7, top_p=0.9, seed=12,
                                   system_prompt='You are "careful".\n',
                                   extra_body={"chat_template_kwargs": {"enable_thinking": False}}))
    assert body["temperature"] == 0.7 and body["top_p"] == 0.9 and body["seed"] == 12
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["messages"][0]["content"] == 'You are "careful".\n'
    assert body["messages"][1]["content"][1] == {"type": "text", "text": "q?"}
    plain = json.loads(chat_payload("m-1", "q?", None, 64, 0.0))
    assert set(plain) == {"model", "temperature", "max_tokens", "messages"}
