"""The fleet simulator (tests/fleet_sim.py) over real loopback HTTP.

Timing assertions are bounds a correct engine meets even on a loaded 2-core machine, while a
wrong one (batch cap ignored, per-seq cost ignored, speed ignored, fixed sleeps drifting the
rate) falls outside them: the engine can never beat its schedule, so upper bounds are tight,
and deadline scheduling repays small delays, so lower bounds can be fairly tight too.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from fleet_sim import (
    EngineParams,
    SimProcess,
    SimServer,
    SimStats,
    answer_for,
    fetch_stats,
    fleet,
    post_speed,
)


def chat_body(model: str = "sim-model", text: str = "Is there a road?", image: bool = True,
              max_tokens: int | None = None) -> bytes:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    if image:
        content.append({"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + "A" * 40000}})
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": content}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return json.dumps(body).encode()


def conn_for(url: str, timeout: float = 30.0) -> http.client.HTTPConnection:
    host, port = url.removeprefix("http://").split(":")
    return http.client.HTTPConnection(host, int(port), timeout=timeout)


def request(conn: http.client.HTTPConnection, method: str, path: str,
            body: bytes | None = None) -> tuple[int, bytes, http.client.HTTPResponse]:
    conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
    resp = conn.getresponse()
    return resp.status, resp.read(), resp


def chat(url: str, body: bytes | None = None) -> tuple[int, dict[str, Any]]:
    conn = conn_for(url)
    try:
        status, raw, _ = request(conn, "POST", "/v1/chat/completions", body or chat_body())
        return status, json.loads(raw)
    finally:
        conn.close()


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not reached in time"
        time.sleep(0.005)


class Load:
    """`n` client threads, each on its own keep-alive connection, sending back to back: with n
    above max_num_seqs the FIFO never empties, so the batch stays full."""

    def __init__(self, url: str, n: int, body: bytes | None = None) -> None:
        self.url, self.body = url, body or chat_body()
        self.stop = threading.Event()
        self.statuses: list[int] = []
        self.threads = [threading.Thread(target=self._work, daemon=True) for _ in range(n)]

    def _work(self) -> None:
        conn = conn_for(self.url)
        while not self.stop.is_set():
            status, _, _ = request(conn, "POST", "/v1/chat/completions", self.body)
            self.statuses.append(status)
        conn.close()

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=20)


def rate(stats: Callable[[], SimStats], seconds: float) -> float:
    """Completions/s over `seconds`, timed by the server's own clock (uptime_s)."""
    a = stats()
    time.sleep(seconds)
    b = stats()
    return (b.completed - a.completed) / (b.uptime_s - a.uptime_s)


# ------------------------------------------------------------------------------- parameters

def one_running_two_waiting(srv: SimServer, ask: Callable[[], object]) -> list[threading.Thread]:
    """Three requests from threads: the first running (a batch of one), two queued behind it."""
    threads = [threading.Thread(target=ask, daemon=True) for _ in range(3)]
    threads[0].start()
    wait_for(lambda: srv.stats().running == 1)
    for t in threads[1:]:
        t.start()
    wait_for(lambda: srv.stats().waiting == 2)
    return threads

def test_capacity_is_computed_from_the_parameters() -> None:
    p = EngineParams(max_num_seqs=4, base_ms=5, per_seq_ms=1, output_tokens=5)
    assert p.capacity_rps == pytest.approx(4 / (5 * 0.009))
    assert p.throughput_rps(1) == pytest.approx(1 / (5 * 0.006))
    assert p.throughput_rps(100) == p.capacity_rps and p.throughput_rps(0) == 0.0
    d = EngineParams()
    assert d.capacity_rps == pytest.approx(256 / (40 * (30 + 0.16 * 256) / 1000))
    with pytest.raises(ValueError):
        EngineParams(max_num_seqs=0)
    with pytest.raises(ValueError):
        EngineParams(base_ms=0, per_seq_ms=0)


# ------------------------------------------------------------------------------------ http
def test_models_chat_reply_and_keep_alive() -> None:
    p = EngineParams(max_num_seqs=4, base_ms=1, per_seq_ms=0.1, output_tokens=3, model="m1")
    with SimServer(p) as srv:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", srv.url)
        conn = conn_for(srv.url)
        status, raw, resp = request(conn, "GET", "/v1/models")
        assert status == 200 and resp.getheader("Content-Length") == str(len(raw))
        assert json.loads(raw) == {"object": "list", "data": [{
            "id": "m1", "object": "model", "created": json.loads(raw)["data"][0]["created"],
            "owned_by": "sim", "root": "m1", "max_model_len": 4096}]}
        sock = conn.sock
        answers = {}
        for text in ("a", "b", "c", "d", "e", "f", "a"):
            status, raw, _ = request(conn, "POST", "/v1/chat/completions", chat_body("m1", text))
            reply = json.loads(raw)
            assert status == 200 and reply["object"] == "chat.completion" and reply["model"] == "m1"
            choice = reply["choices"][0]
            assert choice["finish_reason"] == "stop" and choice["message"]["role"] == "assistant"
            assert choice["message"]["content"] == answer_for(text)
            answers.setdefault(text, choice["message"]["content"])
            assert answers[text] == choice["message"]["content"]  # stable per prompt
            u = reply["usage"]
            assert u["completion_tokens"] == 3 and u["total_tokens"] == u["prompt_tokens"] + 3
            assert u["prompt_tokens"] > 256  # the image counts
        assert set(answers.values()) == {"yes", "no"}
        # a smaller max_tokens ends the request early, on "length"
        status, raw, _ = request(conn, "POST", "/v1/chat/completions", chat_body("m1", max_tokens=1))
        reply = json.loads(raw)
        assert reply["usage"]["completion_tokens"] == 1 and reply["choices"][0]["finish_reason"] == "length"
        # unknown model: 404 with an OpenAI error body, and the connection stays usable
        status, raw, _ = request(conn, "POST", "/v1/chat/completions", chat_body("other"))
        assert status == 404 and "other" in json.loads(raw)["error"]["message"]
        status, _, _ = request(conn, "GET", "/v1/models")
        assert status == 200
        assert conn.sock is sock  # one connection served everything
        conn.close()
        assert srv.stats().completed == 8


LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{((?:[a-zA-Z_]\w*="(?:[^"\\]|\\.)*",?)*)\} (\S+)$')


def parse_metrics(text: str) -> tuple[dict[str, str], dict[str, str], dict[str, list[tuple[dict[str, str], float]]]]:
    """HELP texts, TYPEs and samples of a Prometheus text exposition; asserts its grammar."""
    helps: dict[str, str] = {}
    types: dict[str, str] = {}
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_ = line[7:].partition(" ")
            helps[name] = help_
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert name in helps, f"TYPE before HELP for {name}"
            types[name] = kind
        else:
            m = LINE.match(line)
            assert m, f"not a sample line: {line!r}"
            labels = {k: re.sub(r"\\(.)", lambda e: {"n": "\n"}.get(e.group(1), e.group(1)), v)
                      for k, v in re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2))}
            assert m.group(1) in types, f"sample before its TYPE line: {line!r}"
            samples.setdefault(m.group(1), []).append((labels, float(m.group(3))))
    return helps, types, samples


def test_metrics_names_types_labels_and_values() -> None:
    p = EngineParams(max_num_seqs=1, base_ms=200, per_seq_ms=0, output_tokens=5, model='q"m')
    with SimServer(p) as srv:
        conn = conn_for(srv.url)
        status, raw, resp = request(conn, "GET", "/metrics")
        assert status == 200 and resp.getheader("Content-Type").startswith("text/plain; version=0.0.4")
        _, types, samples = parse_metrics(raw.decode())
        expected = {"vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
                    "vllm:kv_cache_usage_perc": "gauge", "vllm:gpu_cache_usage_perc": "gauge",
                    "vllm:num_preemptions_total": "counter", "vllm:request_success_total": "counter",
                    "vllm:prompt_tokens_total": "counter", "vllm:generation_tokens_total": "counter"}
        assert {k: types.get(k) for k in expected} == expected
        for name, rows in samples.items():
            assert all(labels["model_name"] == 'q"m' for labels, _ in rows), name
        # one running, two waiting: the gauges say so
        threads = one_running_two_waiting(srv, lambda: chat(srv.url, chat_body('q"m')))
        _, _, samples = parse_metrics(request(conn, "GET", "/metrics")[1].decode())
        value = {name: rows[0][1] for name, rows in samples.items()}
        assert value["vllm:num_requests_running"] == 1 and value["vllm:num_requests_waiting"] == 2
        assert value["vllm:kv_cache_usage_perc"] == 1.0 == value["vllm:gpu_cache_usage_perc"]
        srv.set_speed(1000)  # drain
        for t in threads:
            t.join(timeout=10)
        _, _, samples = parse_metrics(request(conn, "GET", "/metrics")[1].decode())
        success = {labels["finished_reason"]: v for labels, v in samples["vllm:request_success_total"]}
        assert success["stop"] == 3 and samples["vllm:num_preemptions_total"][0][1] == 0
        assert samples["vllm:generation_tokens_total"][0][1] == 15
        assert samples["vllm:num_requests_running"][0][1] == 0
        conn.close()
    with SimServer(EngineParams(metrics=False)) as srv:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{srv.url}/metrics", timeout=10)
        assert e.value.code == 404


# ---------------------------------------------------------------------------------- engine
def test_batch_cap_fifo_and_all_complete() -> None:
    # Slow steps, so all twelve are queued well before the first can finish (>= 105 ms).
    p = EngineParams(max_num_seqs=4, base_ms=20, per_seq_ms=1, output_tokens=5)
    with SimServer(p) as srv:
        conns = [conn_for(srv.url) for _ in range(12)]
        for c in conns:
            c.connect()
        go = threading.Barrier(12)
        statuses: list[int] = []

        def one(c: http.client.HTTPConnection) -> None:
            go.wait()
            statuses.append(request(c, "POST", "/v1/chat/completions", chat_body())[0])

        t0 = time.monotonic()
        threads = [threading.Thread(target=one, args=(c,)) for c in conns]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20)
        elapsed = time.monotonic() - t0
        s = srv.stats()
    assert statuses == [200] * 12
    assert s.completed == 12 and s.running == 0 and s.waiting == 0
    assert s.max_running_seen == 4
    assert s.max_waiting_seen >= 8
    # 60 request-steps, at most 4 a step: at least 15 steps of >= 21 ms
    assert elapsed >= 0.95 * 15 * 0.021
    assert s.generation_tokens == 60 and s.steps >= 15
    assert 0 < s.busy_s <= elapsed + 0.05
    assert sum(s.completions_per_s) == 12


def test_saturated_throughput_matches_capacity() -> None:
    p = EngineParams(max_num_seqs=4, base_ms=5, per_seq_ms=1, output_tokens=5)
    with SimServer(p) as srv, Load(srv.url, 12) as load:
        time.sleep(0.3)
        achieved = rate(srv.stats, 1.5)
        s = srv.stats()
    assert s.max_running_seen == 4 and set(load.statuses) == {200}
    assert 0.88 * p.capacity_rps <= achieved <= 1.06 * p.capacity_rps, (achieved, p.capacity_rps)


def test_lone_request_latency() -> None:
    p = EngineParams(max_num_seqs=8, base_ms=20, per_seq_ms=5, output_tokens=4)
    expected = 4 * 0.025
    with SimServer(p) as srv:
        conn = conn_for(srv.url)
        request(conn, "GET", "/v1/models")  # connect first: measure the engine, not the handshake
        lat = []
        for max_tokens in (None, 2):
            t0 = time.perf_counter()
            status, _, _ = request(conn, "POST", "/v1/chat/completions", chat_body(max_tokens=max_tokens))
            lat.append(time.perf_counter() - t0)
            assert status == 200
        conn.close()
    assert 0.97 * expected <= lat[0] <= expected + 0.15, lat
    assert 0.97 * expected / 2 <= lat[1] < lat[0], lat


def test_set_speed_halves_throughput() -> None:
    p = EngineParams(max_num_seqs=4, base_ms=5, per_seq_ms=1, output_tokens=5)
    with SimServer(p) as srv, Load(srv.url, 12):
        time.sleep(0.3)
        full = rate(srv.stats, 1.2)
        srv.set_speed(0.5)
        assert srv.capacity_rps() == pytest.approx(p.capacity_rps / 2)
        time.sleep(0.1)
        half = rate(srv.stats, 1.2)
        assert srv.stats().speed == 0.5
        srv.set_speed(10)  # let the load drain quickly
    assert 0.4 <= half / full <= 0.6, (full, half)
    assert 0.85 * p.capacity_rps / 2 <= half <= 1.08 * p.capacity_rps / 2, half
    with pytest.raises(ValueError):
        SimServer(p).set_speed(0)


@pytest.mark.parametrize("status", [503, 429])
def test_overload_rejects_beyond_max_waiting(status: int) -> None:
    p = EngineParams(max_num_seqs=1, base_ms=200, per_seq_ms=0, output_tokens=5, max_waiting=2,
                     reject_status=status)
    with SimServer(p) as srv:
        results: list[int] = []
        threads = one_running_two_waiting(srv, lambda: results.append(chat(srv.url)[0]))
        t0 = time.monotonic()
        got, body = chat(srv.url)
        assert time.monotonic() - t0 < 0.5  # shed at once, not queued
        assert got == status and body["error"]["code"] == status and body["error"]["message"]
        assert srv.stats().rejected == 1
        srv.set_speed(1000)
        for t in threads:
            t.join(timeout=10)
        assert results == [200, 200, 200] and srv.stats().completed == 3


def test_close_answers_requests_inside_and_cuts_idle_connections() -> None:
    srv = SimServer(EngineParams(max_num_seqs=1, base_ms=2000, per_seq_ms=0, output_tokens=5)).start()
    results: list[int] = []
    t = threading.Thread(target=lambda: results.append(chat(srv.url)[0]), daemon=True)
    t.start()
    idle = conn_for(srv.url)
    request(idle, "GET", "/v1/models")
    wait_for(lambda: srv.stats().running == 1)
    t0 = time.monotonic()
    srv.close()
    t.join(timeout=5)
    assert results == [503] and time.monotonic() - t0 < 3
    with pytest.raises((OSError, http.client.HTTPException)):
        request(idle, "GET", "/v1/models")


def test_fleet_and_four_hundred_open_connections() -> None:
    # Requests last >= 0.5 s, so the batch fills while the connections are still being accepted.
    with fleet(EngineParams(max_num_seqs=256, base_ms=50, per_seq_ms=0.01, output_tokens=10),
               EngineParams(model="other", base_ms=60)) as servers:
        a, b = servers
        assert a.url != b.url and b.capacity_rps() < a.capacity_rps()
        port = int(a.url.rsplit(":", 1)[1])
        # 420 connections open at once, each with a request in flight; read back afterwards
        socks = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(420)]
        body = chat_body(image=False)
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        for s in socks:
            s.sendall(head + body)
        statuses = []
        for s in socks:
            resp = http.client.HTTPResponse(s)
            resp.begin()
            json.loads(resp.read())
            statuses.append(resp.status)
            s.close()
        st = a.stats()
    assert statuses == [200] * 420
    assert st.completed == 420 and st.max_running_seen == 256
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


# ------------------------------------------------------------------------------------ cli
def test_cli_process_control_endpoints_and_speed() -> None:
    p = EngineParams(max_num_seqs=4, base_ms=5, per_seq_ms=1, output_tokens=5, model="cli-model",
                     metrics=False)
    with SimProcess(p) as sim:
        assert sim.proc is not None and re.fullmatch(r"http://127\.0\.0\.1:\d+", sim.url)
        with urllib.request.urlopen(f"{sim.url}/v1/models", timeout=10) as r:
            assert json.loads(r.read())["data"][0]["id"] == "cli-model"
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{sim.url}/metrics", timeout=10)
        assert e.value.code == 404
        with urllib.request.urlopen(f"{sim.url}/sim/stats", timeout=10) as r:
            raw = json.loads(r.read())
        assert raw["completed"] == 0 and raw["capacity_rps"] == pytest.approx(p.capacity_rps)
        assert isinstance(raw["completions_per_s"], list)
        with Load(sim.url, 12, chat_body("cli-model")):
            time.sleep(0.3)
            full = rate(sim.stats, 1.2)
            reply = post_speed(sim.url, 0.5)
            assert reply["factor"] == 0.5 and reply["capacity_rps"] == pytest.approx(p.capacity_rps / 2)
            time.sleep(0.1)
            half = rate(sim.stats, 1.2)
            sim.set_speed(10)
        s = fetch_stats(sim.url)
        assert s.speed == 10 and s.max_running_seen == 4 and s.completed > 0
        proc = sim.proc
    assert proc.returncode == 0  # SIGTERM is a clean stop
    assert 0.4 <= half / full <= 0.6, (full, half)
    assert 0.85 * p.capacity_rps <= full <= 1.06 * p.capacity_rps, full
