"""A continuous-batching fleet simulator: an OpenAI-compatible loopback server whose capacity is
known exactly, so a client's utilisation (achieved / capacity) can be measured, not guessed.

The engine model is vLLM's continuous batching reduced to its arithmetic:

- one engine step takes ``base_ms + per_seq_ms * running`` milliseconds (divided by the speed
  factor, see `SimServer.set_speed`);
- at the start of every step the engine admits requests from a FIFO while fewer than
  ``max_num_seqs`` run; every running request gains one output token per step;
- a request needing N tokens (``min(max_tokens, output_tokens)``) completes at the end of its
  N-th step and its HTTP handler answers at once.

So a full batch completes ``max_num_seqs`` requests every ``output_tokens`` steps, and
`EngineParams.capacity_rps` is exactly what a client that keeps the batch full must achieve.
A batch that filled all at once stays in lockstep: it completes in bursts of ``max_num_seqs``
once per ``output_tokens`` steps, so measure achieved rates over many such periods, or from
`SimStats.generation_tokens` (one token per running request per step), not over a short window.

In-process use (the server runs in daemon threads of the calling process)::

    with SimServer(EngineParams(max_num_seqs=8, base_ms=5, per_seq_ms=1, output_tokens=5)) as srv:
        ...  # point a client at srv.url
        print(srv.stats().completed / srv.capacity_rps())

    with fleet(EngineParams(), EngineParams(base_ms=60)) as servers:  # a mixed fleet
        urls = [s.url for s in servers]

In a process of its own (so that a client's GIL does not slow the engine thread)::

    python tests/fleet_sim.py --max-num-seqs 256 --base-ms 30 --per-seq-ms 0.16 --output-tokens 40

prints ``fleet_sim listening on http://127.0.0.1:PORT`` and serves until SIGTERM/SIGINT;
`SimProcess` wraps exactly that, and `post_speed` / `fetch_stats` drive the control endpoints
(``POST /sim/speed`` with ``{"factor": 0.5}``, ``GET /sim/stats``) across processes.

HTTP: ``GET /v1/models``, ``POST /v1/chat/completions``, ``GET /metrics`` (Prometheus text
format with vLLM v1's metric names and ``engine``/``model_name`` labels; 404 when
``metrics=False``), ``GET /health``. Answers are "yes" or "no" by a hash of the prompt's
text, so they are the same in every run. KV-cache usage is modelled as batch-slot occupancy,
``running / max_num_seqs``: every sequence is taken to reserve an equal share of the cache,
which is what bounds the batch in the first place.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import math
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
LISTENING = "fleet_sim listening on"  # the CLI's first stdout line: "<LISTENING> <url>"

# The engine is allowed to run late steps back to back to keep its average rate, but a debt
# larger than this (a stalled process, a suspended VM) is forgiven rather than repaid as a
# burst of zero-length steps no real GPU could run.
MAX_LAG_S = 0.25

# A rough prompt-token estimate for `usage`: ~4 characters a token, a fixed cost per image.
CHARS_PER_TOKEN = 4
IMAGE_TOKENS = 256


# ---------------------------------------------------------------------------------- parameters
@dataclass(frozen=True)
class EngineParams:
    """One simulated engine. Frozen so a fleet's description can be shared and hashed."""

    max_num_seqs: int = 256
    base_ms: float = 30.0
    per_seq_ms: float = 0.16
    output_tokens: int = 40
    model: str = "sim-model"
    metrics: bool = True  # False: GET /metrics answers 404 (a server without metrics)
    # When this many requests already queue beyond the batch, a new one gets `reject_status`
    # (overload shedding, as some deployments and gateways do). None: the FIFO is unbounded.
    max_waiting: int | None = None
    reject_status: int = 503  # or 429

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, not {self.max_num_seqs}")
        if self.output_tokens < 1:
            raise ValueError(f"output_tokens must be >= 1, not {self.output_tokens}")
        if self.base_ms < 0 or self.per_seq_ms < 0 or self.base_ms + self.per_seq_ms <= 0:
            raise ValueError(f"step time must be positive: base_ms={self.base_ms}, "
                             f"per_seq_ms={self.per_seq_ms}")
        if self.max_waiting is not None and self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0 or None, not {self.max_waiting}")
        if not 400 <= self.reject_status <= 599:
            raise ValueError(f"reject_status must be an HTTP error status, not {self.reject_status}")

    def step_ms(self, running: int) -> float:
        """Duration of one engine step (at speed 1) with `running` sequences in the batch."""
        return self.base_ms + self.per_seq_ms * running

    @property
    def capacity_rps(self) -> float:
        """Requests/s at a full batch of full-length requests: the most this engine can do."""
        return self.throughput_rps(self.max_num_seqs)

    def throughput_rps(self, running: int) -> float:
        """Requests/s with `running` sequences kept in the batch (capped at max_num_seqs)."""
        n = min(max(running, 0), self.max_num_seqs)
        if n == 0:
            return 0.0
        return n / (self.output_tokens * self.step_ms(n) / 1000.0)

    def cli_args(self) -> list[str]:
        """The command-line arguments that make `python tests/fleet_sim.py` run these params."""
        args = ["--max-num-seqs", str(self.max_num_seqs), "--base-ms", repr(self.base_ms),
                "--per-seq-ms", repr(self.per_seq_ms), "--output-tokens", str(self.output_tokens),
                "--model", self.model, "--reject-status", str(self.reject_status)]
        if not self.metrics:
            args.append("--no-metrics")
        if self.max_waiting is not None:
            args += ["--max-waiting", str(self.max_waiting)]
        return args


@dataclass(frozen=True)
class SimStats:
    """A consistent snapshot of one engine (taken under its lock)."""

    completed: int
    rejected: int
    running: int
    waiting: int
    max_running_seen: int
    max_waiting_seen: int
    busy_s: float  # wall-clock time with >= 1 request running
    started_at: float  # time.time() when the server started
    uptime_s: float
    speed: float
    capacity_rps: float  # at the current speed
    steps: int
    generation_tokens: int
    prompt_tokens: int
    # completions_per_s[i]: requests completed in second i after started_at (the last entry is
    # the second in progress)
    completions_per_s: tuple[int, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["completions_per_s"] = list(self.completions_per_s)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SimStats:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["completions_per_s"] = tuple(kw.get("completions_per_s", ()))
        return cls(**kw)


# -------------------------------------------------------------------------------------- engine
class _Request:
    """One chat request inside the engine; its handler thread waits on `done`."""

    __slots__ = ("done", "needed", "outcome")

    def __init__(self, needed: int) -> None:
        self.needed = needed
        self.done = threading.Event()
        self.outcome: str | None = None  # "stop" | "length" | "shutdown"


class Engine:
    """The step loop, in one thread. Steps are scheduled by deadline (each deadline is the
    previous one plus the step's duration, computed at the step's start), so the time Python
    spends between steps does not accumulate into a slower rate than the parameters promise."""

    def __init__(self, params: EngineParams) -> None:
        self.params = params
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._waiting: deque[_Request] = deque()
        # Requests in the batch, keyed by the step at whose end they complete: a step then
        # costs O(completions), not O(running), which keeps a 256-seq batch cheap to simulate.
        self._finish_at: dict[int, list[_Request]] = {}
        self._running = 0
        self._step = 0
        self._speed = 1.0
        self._completed = 0
        self._rejected = 0
        self._success: dict[str, int] = {"stop": 0, "length": 0}
        self._max_running_seen = 0
        self._max_waiting_seen = 0
        self._generation_tokens = 0
        self._prompt_tokens = 0
        self._busy_s = 0.0
        self._busy_since: float | None = None
        self._history: list[int] = []
        self._t0 = time.monotonic()
        self.started_at = time.time()
        self._thread = threading.Thread(target=self._loop, name="fleet_sim-engine", daemon=True)

    # ----------------------------------------------------------------------------- control
    def start(self) -> None:
        self._t0 = time.monotonic()
        self.started_at = time.time()
        self._thread.start()

    def close(self) -> None:
        """Stop stepping and wake every request still inside (their handlers answer 503)."""
        with self._cond:
            self._stop.set()
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        with self._cond:
            left = list(self._waiting) + [r for rs in self._finish_at.values() for r in rs]
            self._waiting.clear()
            self._finish_at.clear()
            self._running = 0
        for r in left:
            r.outcome = "shutdown"
            r.done.set()

    def set_speed(self, factor: float) -> None:
        if isinstance(factor, bool) or not (isinstance(factor, (int, float)) and math.isfinite(factor)
                                            and factor > 0):
            raise ValueError(f"speed factor must be a positive number, not {factor!r}")
        with self._cond:
            self._speed = float(factor)

    @property
    def speed(self) -> float:
        return self._speed

    def submit(self, max_tokens: int | None, prompt_tokens: int) -> _Request | None:
        """Queue a request; None when it is shed (`max_waiting`). After close() the request
        comes back already done, with outcome "shutdown"."""
        p = self.params
        needed = p.output_tokens if max_tokens is None else max(1, min(max_tokens, p.output_tokens))
        with self._cond:
            if self._stop.is_set():
                r = _Request(needed)
                r.outcome = "shutdown"
                r.done.set()
                return r
            # Requests that a free slot will admit at the next step do not count as queued:
            # only those that must wait for a completion do.
            if p.max_waiting is not None:
                beyond = self._running + len(self._waiting) - p.max_num_seqs
                if beyond >= p.max_waiting:
                    self._rejected += 1
                    return None
            r = _Request(needed)
            self._waiting.append(r)
            self._prompt_tokens += prompt_tokens
            self._max_waiting_seen = max(self._max_waiting_seen, len(self._waiting))
            self._cond.notify()
        return r

    # ------------------------------------------------------------------------------- loop
    def _loop(self) -> None:
        p = self.params
        deadline = 0.0
        while True:
            with self._cond:
                if self._running == 0 and not self._waiting:
                    if self._busy_since is not None:
                        self._busy_s += time.monotonic() - self._busy_since
                        self._busy_since = None
                    while not self._waiting and not self._stop.is_set():
                        self._cond.wait()
                    # An idle engine owes nothing: the clock restarts at the first arrival.
                    deadline = self._busy_since = time.monotonic()
                if self._stop.is_set():
                    return
                step = self._step
                while self._waiting and self._running < p.max_num_seqs:
                    r = self._waiting.popleft()
                    self._finish_at.setdefault(step + r.needed - 1, []).append(r)
                    self._running += 1
                running = self._running
                self._max_running_seen = max(self._max_running_seen, running)
                duration = p.step_ms(running) / 1000.0 / self._speed
            now = time.monotonic()
            if now - deadline > MAX_LAG_S:
                deadline = now
            deadline += duration
            delay = deadline - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                return
            with self._cond:
                self._step = step + 1
                done = self._finish_at.pop(step, [])
                self._running -= len(done)
                self._generation_tokens += running
                if done:
                    self._completed += len(done)
                    self._record_completions(len(done))
                    for r in done:
                        r.outcome = "length" if r.needed < p.output_tokens else "stop"
                        self._success[r.outcome] += 1
            for r in done:
                r.done.set()

    def _history_upto_now(self) -> int:
        """Grow the per-second history to the current second; returns its index."""
        i = int(time.monotonic() - self._t0)
        if len(self._history) <= i:
            self._history.extend([0] * (i + 1 - len(self._history)))
        return i

    def _record_completions(self, n: int) -> None:
        self._history[self._history_upto_now()] += n

    # ------------------------------------------------------------------------------ views
    def stats(self) -> SimStats:
        with self._cond:
            now = time.monotonic()
            busy = self._busy_s + (now - self._busy_since if self._busy_since is not None else 0.0)
            self._history_upto_now()
            return SimStats(
                completed=self._completed, rejected=self._rejected, running=self._running,
                waiting=len(self._waiting), max_running_seen=self._max_running_seen,
                max_waiting_seen=self._max_waiting_seen, busy_s=busy, started_at=self.started_at,
                uptime_s=now - self._t0, speed=self._speed,
                capacity_rps=self.params.capacity_rps * self._speed, steps=self._step,
                generation_tokens=self._generation_tokens, prompt_tokens=self._prompt_tokens,
                completions_per_s=tuple(self._history))

    def metrics_text(self) -> str:
        """Prometheus text exposition (format 0.0.4), named and labelled as vLLM v1 does."""
        p = self.params
        with self._cond:
            running, waiting = self._running, len(self._waiting)
            success = dict(self._success)
            gen, prompt = self._generation_tokens, self._prompt_tokens
        usage = running / p.max_num_seqs
        labels = f'engine="0",model_name="{_label_value(p.model)}"'
        out: list[str] = []

        def family(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            for lbl, value in samples:
                out.append(f"{name}{{{lbl}}} {float(value)!r}")

        family("vllm:num_requests_running", "gauge",
               "Number of requests in model execution batches.", [(labels, running)])
        family("vllm:num_requests_waiting", "gauge",
               "Number of requests waiting to be processed.", [(labels, waiting)])
        family("vllm:kv_cache_usage_perc", "gauge",
               "KV-cache usage. 1 means 100 percent usage.", [(labels, usage)])
        family("vllm:gpu_cache_usage_perc", "gauge",
               "GPU KV-cache usage. 1 means 100 percent usage.", [(labels, usage)])
        family("vllm:num_preemptions_total", "counter",
               "Cumulative number of preemption from the engine.", [(labels, 0)])
        family("vllm:prompt_tokens_total", "counter",
               "Number of prefill tokens processed.", [(labels, prompt)])
        family("vllm:generation_tokens_total", "counter",
               "Number of generation tokens processed.", [(labels, gen)])
        # label names sorted, as prometheus_client writes them
        family("vllm:request_success_total", "counter",
               "Count of successfully processed requests.",
               [(f'engine="0",finished_reason="{reason}",model_name="{_label_value(p.model)}"', n)
                for reason, n in success.items()])
        return "\n".join(out) + "\n"


def _label_value(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


# ---------------------------------------------------------------------------------------- http
def _prompt_of(body: dict[str, Any]) -> tuple[str, int]:
    """The text of all messages (joined) and the number of image parts."""
    texts: list[str] = []
    images = 0
    messages = body.get("messages")
    for m in messages if isinstance(messages, list) else ():
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, dict):
                    continue
                if part.get("type") == "text" and isinstance(part.get("text"), str):
                    texts.append(part["text"])
                elif part.get("type") in ("image_url", "input_image", "image"):
                    images += 1
    return "\n".join(texts), images


def answer_for(text: str) -> str:
    """'yes' or 'no', fixed by the prompt text (blake2b, not hash(): that is salted per process)."""
    return "yes" if hashlib.blake2b(text.encode("utf-8"), digest_size=1).digest()[0] & 1 else "no"


def _error(message: str, kind: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _handler_for(sim: SimServer) -> type[BaseHTTPRequestHandler]:
    engine, params = sim.engine, sim.params
    ids = itertools.count(1)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, so a client's connection pool is reused
        # Headers and body are two writes; with Nagle on, every reply after a connection's first
        # would wait for a delayed ACK (~40 ms) and distort latency.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, raw: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _json(self, status: int, obj: Any) -> None:
            self._send(status, json.dumps(obj).encode(), "application/json")

        def _body(self) -> bytes | None:
            """The request body, read whole so the connection stays in step; None: unreadable."""
            n = self.headers.get("Content-Length")
            if n is None:
                if self.headers.get("Transfer-Encoding"):
                    self.close_connection = True
                    self._json(411, _error("Content-Length required", "BadRequestError", 411))
                    return None
                return b""
            try:
                return self.rfile.read(int(n))
            except ValueError:
                self.close_connection = True
                self._json(400, _error("bad Content-Length", "BadRequestError", 400))
                return None

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/v1/models":
                with sim.inflight:
                    sim.model_lists += 1
                self._json(200, {"object": "list", "data": [{
                    "id": params.model, "object": "model", "created": int(engine.started_at),
                    "owned_by": "sim", "root": params.model, "max_model_len": 4096}]})
            elif path == "/metrics" and params.metrics:
                self._send(200, engine.metrics_text().encode(), "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/sim/stats":
                self._json(200, engine.stats().to_json())
            elif path == "/health":
                self._send(200, b"", "text/plain")
            else:
                self._json(404, _error(f"no route GET {path}", "NotFoundError", 404))

        def do_POST(self) -> None:
            raw = self._body()
            if raw is None:
                return
            path = self.path.split("?", 1)[0]
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                body = None
            if not isinstance(body, dict):
                self._json(400, _error("the body is not a JSON object", "BadRequestError", 400))
            elif path == "/v1/chat/completions":
                self._chat(body)
            elif path == "/sim/speed":
                try:
                    sim.set_speed(body.get("factor"))
                except ValueError as e:
                    self._json(400, _error(str(e), "BadRequestError", 400))
                else:
                    self._json(200, {"factor": engine.speed, "capacity_rps": sim.capacity_rps()})
            else:
                self._json(404, _error(f"no route POST {path}", "NotFoundError", 404))

        def _chat(self, body: dict[str, Any]) -> None:
            model = body.get("model", params.model)
            if model != params.model:
                self._json(404, _error(f"The model `{model}` does not exist.", "NotFoundError", 404))
                return
            max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
            if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
                self._json(400, _error(f"max_tokens must be a positive integer, not {max_tokens!r}",
                                       "BadRequestError", 400))
                return
            text, images = _prompt_of(body)
            prompt_tokens = len(text) // CHARS_PER_TOKEN + 1 + IMAGE_TOKENS * images
            with sim.inflight:
                sim.inflight_n += 1
                sim.arrived += 1
                n = sim.arrived
                if sim.hold_from is not None and n > sim.hold_from:  # `hold()`: a stalled server
                    sim.holding += 1
                    sim.inflight.notify_all()
                    sim.inflight.wait_for(lambda: sim.hold_from is None or n <= sim.hold_from)
                    sim.holding -= 1
                    sim.inflight.notify_all()
            try:
                self._answer(text, max_tokens, prompt_tokens)
            finally:
                with sim.inflight:
                    sim.inflight_n -= 1
                    sim.inflight.notify_all()

        def _answer(self, text: str, max_tokens: int | None, prompt_tokens: int) -> None:
            req = engine.submit(max_tokens, prompt_tokens)
            if req is None:
                self._json(params.reject_status, _error(
                    "the server is overloaded: too many requests waiting; retry later",
                    "ServiceUnavailableError" if params.reject_status == 503 else "RateLimitError",
                    params.reject_status))
                return
            req.done.wait()
            if req.outcome == "shutdown":
                self.close_connection = True
                self._json(503, _error("the server is shutting down", "ServiceUnavailableError", 503))
                return
            self._json(200, {
                "id": f"chatcmpl-sim-{next(ids)}", "object": "chat.completion",
                "created": int(time.time()), "model": params.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": answer_for(text)},
                             "finish_reason": req.outcome}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": req.needed,
                          "total_tokens": prompt_tokens + req.needed}})

    return Handler


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # a handler waiting on the engine must not block shutdown
    request_queue_size = 1024  # hundreds of clients connect at once in the fleet benches

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.open_sockets: set[socket.socket] = set()
        self.sockets_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.sockets_lock:
            self.open_sockets.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.sockets_lock:
            self.open_sockets.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients hanging up (or close() cutting them off) are expected here

    def cut_connections(self) -> None:
        """Shut every open keep-alive connection, so no handler thread outlives the server."""
        with self.sockets_lock:
            socks = list(self.open_sockets)
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


class SimServer:
    """One simulated engine behind an HTTP server on 127.0.0.1, in daemon threads."""

    def __init__(self, params: EngineParams = EngineParams(), port: int = 0) -> None:
        self.params = params
        self.port = port
        self.engine = Engine(params)
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        # Chat requests between arrival and their reply written: close() lets them answer
        # before it cuts connections.
        self.inflight = threading.Condition()
        self.inflight_n = 0
        self.arrived = 0  # chat requests received, held ones too
        self.model_lists = 0  # GET /v1/models answered (a client's health checks)
        self.hold_from: int | None = None  # `hold()`: chat requests after this many arrivals wait
        self.holding = 0  # chat requests waiting now

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("SimServer is not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> SimServer:
        if self._httpd is not None:
            raise RuntimeError("SimServer is already started")
        self._httpd = _HTTPServer((HOST, self.port), _handler_for(self))
        self.engine.start()
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fleet_sim-http", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop accepting, answer requests still inside with 503, then cut idle connections."""
        if self._httpd is None or self._closed:
            return
        self._closed = True
        self.release()
        self._httpd.shutdown()
        self.engine.close()
        with self.inflight:
            self.inflight.wait_for(lambda: self.inflight_n == 0, timeout=2.0)
        self._httpd.server_close()
        self._httpd.cut_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> SimServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_speed(self, factor: float) -> None:
        """0.5 = half speed (every step takes twice as long). Takes effect at the next step."""
        self.engine.set_speed(factor)

    def capacity_rps(self) -> float:
        """`EngineParams.capacity_rps` at the current speed."""
        return self.params.capacity_rps * self.engine.speed

    def stats(self) -> SimStats:
        return self.engine.stats()

    def hold(self, after: int = 0) -> None:
        """Chat requests that arrive after `after` more wait, before the engine, until
        `release()`: a server that stalls at a known point of a run (its requests stay in
        flight), for tests that must see a client move on whatever the timing."""
        with self.inflight:
            self.hold_from = self.arrived + after

    def release(self) -> None:
        """Let the held requests on (returns once they have left the hold)."""
        with self.inflight:
            self.hold_from = None
            self.inflight.notify_all()
            self.inflight.wait_for(lambda: self.holding == 0, timeout=5.0)

    def held(self) -> int:
        """Chat requests waiting in `hold()` now."""
        with self.inflight:
            return self.holding


@contextlib.contextmanager
def fleet(*params: EngineParams) -> Iterator[list[SimServer]]:
    """Start one SimServer per params (in this process); close them all on exit."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(SimServer(p)) for p in params]


# ------------------------------------------------------------------------ across processes
def post_speed(url: str, factor: float, timeout: float = 5.0) -> dict[str, Any]:
    """POST /sim/speed on a simulator (any process); returns its reply."""
    req = urllib.request.Request(f"{url}/sim/speed", data=json.dumps({"factor": factor}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def fetch_stats(url: str, timeout: float = 5.0) -> SimStats:
    """GET /sim/stats on a simulator (any process)."""
    with urllib.request.urlopen(f"{url}/sim/stats", timeout=timeout) as resp:
        return SimStats.from_json(json.loads(resp.read()))


class SimProcess:
    """The simulator as a child process (`python tests/fleet_sim.py ...`), so its engine thread
    competes with no client for a GIL. Same control surface as SimServer, over HTTP."""

    def __init__(self, params: EngineParams = EngineParams(), port: int = 0,
                 python: str = sys.executable, startup_timeout_s: float = 20.0) -> None:
        self.params = params
        self.port = port
        self.python = python
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen[str] | None = None
        self._url: str | None = None

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("SimProcess is not started")
        return self._url

    def start(self) -> SimProcess:
        cmd = [self.python, str(Path(__file__).resolve()), *self.params.cli_args(), "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], self.startup_timeout_s)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith(LISTENING):
            self.close()
            raise RuntimeError(f"fleet_sim did not start: first line {line!r}")
        self._url = line.split()[-1]
        return self

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> SimProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_speed(self, factor: float) -> None:
        post_speed(self.url, factor)

    def capacity_rps(self) -> float:
        return self.stats().capacity_rps

    def stats(self) -> SimStats:
        return fetch_stats(self.url)


# --------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    d = EngineParams()
    ap = argparse.ArgumentParser(description="Continuous-batching fleet simulator (OpenAI-compatible, loopback)")
    ap.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    ap.add_argument("--base-ms", type=float, default=d.base_ms)
    ap.add_argument("--per-seq-ms", type=float, default=d.per_seq_ms)
    ap.add_argument("--output-tokens", type=int, default=d.output_tokens)
    ap.add_argument("--model", default=d.model)
    ap.add_argument("--no-metrics", action="store_true", help="GET /metrics answers 404")
    ap.add_argument("--max-waiting", type=int, default=None, help="shed requests beyond this queue")
    ap.add_argument("--reject-status", type=int, default=d.reject_status, help="503 or 429")
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args(argv)
    try:
        params = EngineParams(max_num_seqs=a.max_num_seqs, base_ms=a.base_ms, per_seq_ms=a.per_seq_ms,
                              output_tokens=a.output_tokens, model=a.model, metrics=not a.no_metrics,
                              max_waiting=a.max_waiting, reject_status=a.reject_status)
    except ValueError as e:
        ap.error(str(e))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with SimServer(params, port=a.port) as srv:
        print(f"{LISTENING} {srv.url}", flush=True)
        while not stop.wait(0.5):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
