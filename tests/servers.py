"""Loopback OpenAI-compatible test servers that misbehave on request.

(Over 500 lines: one home for every purpose-built test server, so no test file grows its own.)

`FakeVLM` is a real `ThreadingHTTPServer` on 127.0.0.1 (an ephemeral port) running in a
daemon thread, speaking HTTP/1.1 keep-alive like vLLM does:

    with FakeVLM(models=["m"], answer=lambda prompt, has_image, img: "yes") as srv:
        pool = ServerPool([srv.url], ...)

Failures are scripted with `Fail` values, per chat request number (1-based, counting only
POST /v1/chat/completions) or per prompt (the n-th request carrying that prompt gets the
n-th entry of its list; later ones succeed):

    FakeVLM(fail_at={1: Fail.status(500)}, fail_prompt={"q": [Fail.reset(), Fail.hang(5)]})

Replies that are no answer or never end (issue 10): `Fail.reply(body)` (any JSON, e.g. a 200
with `content: null`), `Fail.raw(text)` (a body sent as is: JSON no encoder writes, such as a
100,000-deep array), `Fail.trickle` (a byte every so often), `Fail.endless` (a chunked body
without end), `Fail.huge` (a real completion of a given size) and `Fail.reset_mid_body`.

How the server frames and ends its replies (issue 17), for every reply it sends: `http10`
(an HTTP/1.0 server: one reply per connection; `content_length=False` ends each body by
closing), `close_share` (that share of chat replies say `Connection: close` and close),
`drop_share` (that share of chat replies keep the connection alive in their headers, then
the server closes it without a word), `encoding` ("gzip", "deflate", "deflate-raw", or any
other name, sent as is: the body is compressed although the client asked for identity).
The shares are spread evenly by reply number, so a run is reproducible; `replies` counts
the chat replies written whole (each one a generation the client must not throw away).

`JsonServer(reply, model=...)` is the bare one for a test that builds each reply itself:
every chat request's JSON body goes to `reply`, whose JSON document is the answer.

Using it from pytester: the server is a real TCP listener in the test process, so a pytest
run by `pytester.runpytest()` (in-process) and by `pytester.runpytest_subprocess()` can both
reach it: pass `srv.url` on the command line (`--servers`), and read the counters after the
run returns. For a server in a process of its own (manual runs, a test that kills the test
process), run `python tests/servers.py --model m [--answer TEXT] [--port N]`: it prints its
URL on the first line of stdout and serves until killed.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import signal
import socket
import struct
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

AnswerFn = Callable[[str, bool, "bytes | None"], "str | None"]  # None: content null

FailKind = Literal["status", "reset", "hangup", "hang", "malformed", "truncated", "reply", "raw", "trickle", "endless",
                   "huge", "reset-mid-body"]


def dead_url() -> str:
    """A loopback port nobody listens on (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def one_line(e: BaseException) -> str:
    """str(e), checked to be one non-empty line, as every user-facing error must be."""
    s = str(e)
    assert "\n" not in s and s.strip() == s and s
    return s


def interruptible() -> None:
    """`preexec_fn` of a run a test will Ctrl-C: SIGINT back to its default in the child. A
    process started in the background by a non-interactive shell (a CI script's `cmd &`) ignores
    SIGINT, its children inherit that, and Python then never raises KeyboardInterrupt in them."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@dataclass(frozen=True, slots=True)
class Fail:
    """One injected failure. Build with the class methods."""

    kind: FailKind
    status: int = 500
    retry_after: str | None = None
    message: str = "injected failure"
    seconds: float = 0.0
    body: str | None = None  # JSON text of a scripted reply (a string keeps Fail hashable)
    interval: float = 0.0  # seconds between the bytes or pieces of a slow reply
    size: int = 0  # bytes: of an endless reply's pieces, or of a huge reply's content
    chunked: bool = False  # Transfer-Encoding: chunked instead of Content-Length
    headers_too: bool = False  # trickle the status line and headers as well

    @classmethod
    def http(cls, status: int, message: str = "injected failure",
             retry_after: str | float | None = None) -> Fail:
        """An HTTP error with an OpenAI-style error body. `message` may contain
        "{authorization}", replaced by the request's Authorization header (servers that
        echo credentials exist; the client must not repeat them)."""
        return cls("status", status=status, message=message,
                   retry_after=None if retry_after is None else str(retry_after))

    @classmethod
    def rate_limited(cls, retry_after: str | float | None = None) -> Fail:
        return cls.http(429, "rate limited", retry_after=retry_after)

    @classmethod
    def reset(cls) -> Fail:
        """Close the connection with an RST and no response."""
        return cls("reset")

    @classmethod
    def hangup(cls) -> Fail:
        """Read the request, then close the connection without a reply and without a reset
        (a FIN): what a client sees when a server closes an idle connection just as a
        request goes out on it."""
        return cls("hangup")

    @classmethod
    def hang(cls, seconds: float) -> Fail:
        """Say nothing for `seconds` (longer than the client's timeout), then answer."""
        return cls("hang", seconds=seconds)

    @classmethod
    def malformed(cls) -> Fail:
        """HTTP 200 with a body that is not valid JSON (a truncated chat completion)."""
        return cls("malformed")

    @classmethod
    def truncated(cls) -> Fail:
        """HTTP 200 announcing more bytes than it sends, then closing."""
        return cls("truncated")

    @classmethod
    def reply(cls, body: Any, status: int = 200) -> Fail:
        """Answer with this JSON body (e.g. a 200 with `content: null`, no choices, an
        error object, another model), with a Content-Length."""
        return cls("reply", status=status, body=json.dumps(body))

    @classmethod
    def raw(cls, text: str, status: int = 200) -> Fail:
        """Answer with this body exactly as given (no JSON encoder involved), with a
        Content-Length: JSON an encoder would refuse to write, e.g. 100,000 nested arrays.
        "\udc80".."\udcff" in `text` are the bytes 0x80..0xff (bytes that are not UTF-8)."""
        return cls("raw", status=status, body=text)

    @classmethod
    def trickle(cls, interval: float, seconds: float, *, headers_too: bool = False) -> Fail:
        """A real chat completion sent one byte every `interval` seconds, padded with
        whitespace so that it takes at least `seconds` (Content-Length announced up front).
        `headers_too`: the status line and headers trickle as well."""
        return cls("trickle", interval=interval, seconds=seconds, headers_too=headers_too)

    @classmethod
    def endless(cls, piece: int = 64 * 1024, interval: float = 0.0, seconds: float = 120.0) -> Fail:
        """HTTP 200, chunked, a body that never ends: `piece` bytes of whitespace every
        `interval` seconds until the client hangs up (or `seconds` pass)."""
        return cls("endless", size=piece, interval=interval, seconds=seconds, chunked=True)

    @classmethod
    def huge(cls, size: int, *, chunked: bool = False) -> Fail:
        """A real chat completion whose content is `size` bytes of "x", announced with a
        Content-Length, or chunked (64 kB chunks) so that only counting finds its size."""
        return cls("huge", size=size, chunked=chunked)

    @classmethod
    def reset_mid_body(cls) -> Fail:
        """Headers and half of a real chat completion, then an RST."""
        return cls("reset-mid-body")


def chat_completion(content: str | None, model: str | None = "m", finish_reason: str | None = "stop",
                    reasoning: str | None = None, **extra: Any) -> dict[str, Any]:
    """A chat completion body as vLLM sends it (`extra` adds or replaces top-level keys).
    `reasoning`: what a reasoning model thought, as vLLM's reasoning parsers put it
    (`message.reasoning_content`)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    body: dict[str, Any] = {
        "id": "chatcmpl-x", "object": "chat.completion", "model": model,
        "choices": [{"index": 0, "finish_reason": finish_reason, "message": message}],
    }
    return body | extra


def _every(share: float, n: int) -> bool:
    """Whether reply `n` (1-based) is one of `share` of the replies, spread evenly."""
    return share > 0 and int(n * share) != int((n - 1) * share)


def _encode(raw: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return gzip.compress(raw, mtime=0)
    if encoding == "deflate":  # zlib-wrapped, as RFC 9110 means it
        return zlib.compress(raw)
    if encoding == "deflate-raw":  # what some servers send under the same name
        c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        return c.compress(raw) + c.flush()
    return raw  # an encoding nobody here reads: the name is what the test is about


@dataclass(frozen=True, slots=True)
class Recorded:
    """One chat request as the server saw it."""

    prompt: str
    model: str | None
    max_tokens: int | None
    temperature: float | None
    has_image: bool
    image_bytes: bytes | None
    authorization: str | None
    body: dict[str, Any] = field(repr=False)


def _default_answer(prompt: str, has_image: bool, image: bytes | None) -> str:
    return "fake answer"


class FakeVLM:
    """A scriptable OpenAI-compatible chat server. Counters are safe to read at any time."""

    def __init__(self, models: list[str] | None = None, *, answer: AnswerFn | None = None,
                 fail_at: dict[int, Fail] | None = None,
                 fail_prompt: dict[str, list[Fail]] | None = None,
                 fail_always: Fail | None = None, fail_models: Fail | None = None,
                 delay: float = 0.0, finish_reason: str | None = "stop",
                 usage: dict[str, Any] | None | Literal["auto"] | Callable[[str, bool, bytes | None], dict[str, Any]] = "auto",
                 response_model: str | None = None, reasoning: AnswerFn | None = None,
                 http10: bool = False, content_length: bool = True, close_share: float = 0.0,
                 drop_share: float = 0.0, encoding: str | None = None) -> None:
        self.models = list(models) if models is not None else ["fake-vlm"]
        self.answer = answer or _default_answer
        self.fail_at = dict(fail_at or {})
        self.fail_prompt = {k: list(v) for k, v in (fail_prompt or {}).items()}
        self.fail_always = fail_always
        self.fail_models = fail_models
        self.delay = delay  # seconds every chat answer takes: a slow server
        self.finish_reason = finish_reason
        # "auto": prompt_tokens = len(prompt), completion_tokens = len(answer); None: omit.
        self.usage = usage
        self.response_model = response_model  # model id put in answers; default: the requested one
        # a reasoning model: what it thought (message.reasoning_content) before its answer
        self.reasoning = reasoning
        self.http10 = http10  # an HTTP/1.0 server: every reply ends its connection
        self.content_length = content_length  # False: bodies end with the connection (HTTP/1.0 only)
        self.close_share = close_share  # chat replies that say Connection: close
        self.drop_share = drop_share  # chat replies after which the connection is closed silently
        self.encoding = encoding  # Content-Encoding forced on every reply
        self.replies = 0  # chat replies written whole
        self._reply_seq = 0  # chat replies begun: what the shares count by
        self.model_card: dict[str, Any] = {}  # more fields of each /v1/models entry (root, max_model_len)
        self.lock = threading.Lock()
        self.hits: Counter[str] = Counter()  # per path
        self.prompt_hits: Counter[str] = Counter()
        self.chat_requests = 0
        self.connections = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.recorded: list[Recorded] = []
        self.chat_times: list[float] = []  # time.monotonic() at each chat request's arrival
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        assert self._httpd is not None, "FakeVLM is not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self, port: int = 0) -> FakeVLM:
        fake = self

        class Server(ThreadingHTTPServer):
            daemon_threads = True  # a hanging handler must not block shutdown

            def process_request(self, request: Any, client_address: Any) -> None:
                with fake.lock:
                    fake.connections += 1
                super().process_request(request, client_address)

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # clients that hang up on a hanging handler are expected here

        self._httpd = Server(("127.0.0.1", port), _handler_for(self))
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeVLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ scripting
    def _pick_failure(self, prompt: str) -> Fail | None:
        with self.lock:
            self.chat_requests += 1
            self.prompt_hits[prompt] += 1
            n, k = self.chat_requests, self.prompt_hits[prompt]
            script = self.fail_prompt.get(prompt, [])
            if k <= len(script):
                return script[k - 1]
            if n in self.fail_at:
                return self.fail_at[n]
            return self.fail_always


def _handler_for(fake: FakeVLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0" if fake.http10 else "HTTP/1.1"  # keep-alive, as vLLM/uvicorn
        # Headers and body go out in two writes; with Nagle on, the body of every response
        # after a connection's first waits ~40 ms for a delayed ACK. uvicorn sets TCP_NODELAY.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None, *,
                  reply_no: int = 0) -> None:
            """Send `obj`, framed and ended as the server is told to (`reply_no`: the chat
            reply's number, for the shares; 0 for other replies)."""
            raw = json.dumps(obj).encode()
            close = _every(fake.close_share, reply_no)
            drop = _every(fake.drop_share, reply_no)
            if fake.encoding is not None:
                raw = _encode(raw, fake.encoding)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            if fake.encoding is not None:
                self.send_header("Content-Encoding", fake.encoding.removesuffix("-raw"))
            if fake.content_length or not fake.http10:
                self.send_header("Content-Length", str(len(raw)))
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(raw)
            if reply_no:
                self.wfile.flush()
                with fake.lock:
                    fake.replies += 1
            if drop:
                # the headers promised keep-alive; the server goes away anyway (an idle timeout
                # shorter than the client's, a restarted worker behind the port)
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True

        def _fail(self, f: Fail) -> None:
            if f.kind == "status":
                msg = f.message.replace("{authorization}", self.headers.get("Authorization", ""))
                hdr = {"Retry-After": f.retry_after} if f.retry_after is not None else None
                self._json(f.status, {"error": {"message": msg, "code": f.status}}, hdr)
            elif f.kind == "reset":
                # SO_LINGER 0 makes close() send RST: "connection reset by peer".
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                           struct.pack("ii", 1, 0))
                self.connection.close()
                self.close_connection = True
            elif f.kind == "hangup":
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
            elif f.kind in ("reply", "raw", "trickle", "endless", "huge", "reset-mid-body"):
                self._slow_fail(f)
            elif f.kind == "hang":
                time.sleep(f.seconds)
                self.close_connection = True
                try:
                    self._json(503, {"error": {"message": "too late"}})
                except OSError:
                    pass
            elif f.kind == "malformed":
                raw = b'{"id": "x", "choices": [{"index": 0, "message": {"role": "assist'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)
            elif f.kind == "truncated":
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "1000")
                self.end_headers()
                self.wfile.write(b'{"choices": [')
                self.close_connection = True

        def _slow_fail(self, f: Fail) -> None:
            model = fake.response_model or getattr(self, "_model", None)
            try:
                if f.kind in ("reply", "raw"):
                    assert f.body is not None
                    raw = f.body.encode("utf-8", "surrogateescape")  # "\udc80": the byte 0x80
                    self.send_response(f.status)
                    self.send_header("Content-Type", "application/json")
                    if fake.encoding is not None:
                        raw = _encode(raw, fake.encoding)
                        self.send_header("Content-Encoding", fake.encoding.removesuffix("-raw"))
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                elif f.kind == "trickle":
                    raw = json.dumps(chat_completion("trickled", model)).encode()
                    raw += b" " * max(0, int(f.seconds / f.interval) + 1 - len(raw))
                    head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                            f"Content-Length: {len(raw)}\r\n\r\n").encode()
                    self.close_connection = True
                    if not f.headers_too:
                        self.wfile.write(head)
                        head = b""
                    data = head + raw
                    for i in range(len(data)):
                        time.sleep(f.interval)
                        self.wfile.write(data[i:i + 1])
                elif f.kind == "endless":
                    self.close_connection = True
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    self.wfile.write(b'd\r\n{"choices": [\r\n')
                    chunk = f"{f.size:x}\r\n".encode() + b" " * f.size + b"\r\n"
                    end = time.monotonic() + f.seconds
                    while time.monotonic() < end:
                        self.wfile.write(chunk)
                        if f.interval:
                            time.sleep(f.interval)
                elif f.kind == "huge":
                    raw = json.dumps(chat_completion("x" * f.size, model)).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    if f.chunked:
                        self.send_header("Transfer-Encoding", "chunked")
                        self.end_headers()
                        for i in range(0, len(raw), 65536):
                            piece = raw[i:i + 65536]
                            self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                        self.wfile.write(b"0\r\n\r\n")
                    else:
                        self.send_header("Content-Length", str(len(raw)))
                        self.end_headers()
                        self.wfile.write(raw)
                elif f.kind == "reset-mid-body":
                    raw = json.dumps(chat_completion("never whole", model)).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw[: len(raw) // 2])
                    time.sleep(0.01)  # let the half arrive before the RST
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               struct.pack("ii", 1, 0))
                    self.connection.close()
                    self.close_connection = True
            except OSError:  # the client hung up: what a deadline or a size cap does
                self.close_connection = True

        def do_GET(self) -> None:
            with fake.lock:
                fake.hits[self.path] += 1
            if self.path.rstrip("/") != "/v1/models":
                self._json(404, {"error": {"message": f"no route {self.path}"}})
                return
            if fake.fail_models is not None:
                self._fail(fake.fail_models)
                return
            self._json(200, {"object": "list",
                             "data": [{"id": m, "object": "model", **fake.model_card} for m in fake.models]})

        def do_POST(self) -> None:
            with fake.lock:
                fake.hits[self.path] += 1
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if self.path != "/v1/chat/completions":
                self._json(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                body = json.loads(raw)
                # the question is the last user message (a system message may come first)
                content = [m for m in body["messages"] if m.get("role", "user") == "user"][-1]["content"]
                parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
                prompt = "".join(p.get("text", "") for p in parts if p.get("type") == "text")
                image: bytes | None = None
                for p in parts:
                    if p.get("type") == "image_url":
                        url = p["image_url"]["url"]
                        image = base64.b64decode(url.split(",", 1)[1])
            except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
                self._json(400, {"error": {"message": f"bad request body: {e}"}})
                return
            self._model = body.get("model")
            with fake.lock:
                fake.chat_times.append(time.monotonic())
                fake.recorded.append(Recorded(
                    prompt=prompt, model=body.get("model"), max_tokens=body.get("max_tokens"),
                    temperature=body.get("temperature"), has_image=image is not None,
                    image_bytes=image, authorization=self.headers.get("Authorization"),
                    body=body))
                fake.in_flight += 1
                fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
            try:
                failure = fake._pick_failure(prompt)
                if failure is not None:
                    self._fail(failure)
                    return
                if fake.delay:
                    time.sleep(fake.delay)
                text = fake.answer(prompt, image is not None, image)
                usage: dict[str, Any] | None
                if fake.usage == "auto":
                    n = len(text or "")  # a reasoning model out of tokens answers None
                    usage = {"prompt_tokens": len(prompt), "completion_tokens": n,
                             "total_tokens": len(prompt) + n}
                elif callable(fake.usage):  # usage per request: (prompt, has_image, image) -> dict
                    usage = fake.usage(prompt, image is not None, image)
                else:
                    usage = fake.usage
                message: dict[str, Any] = {"role": "assistant", "content": text}
                if fake.reasoning is not None:
                    message["reasoning_content"] = fake.reasoning(prompt, image is not None, image)
                out: dict[str, Any] = {
                    "id": f"chatcmpl-{fake.chat_requests}", "object": "chat.completion",
                    "model": fake.response_model or body.get("model"),
                    "choices": [{"index": 0, "finish_reason": fake.finish_reason, "message": message}],
                }
                if usage is not None:
                    out["usage"] = usage
                with fake.lock:
                    fake._reply_seq += 1
                    reply_no = fake._reply_seq
                self._json(200, out, reply_no=reply_no)
            finally:
                with fake.lock:
                    fake.in_flight -= 1

    return Handler


class JsonServer:
    """A purpose-built OpenAI-compatible server on 127.0.0.1 for a test whose replies FakeVLM's
    options do not say: every POST answers 200 with `reply(body)` (the request's JSON body ->
    the JSON document sent back), every GET with a /v1/models list naming `model`. HTTP/1.1
    keep-alive as vLLM, one daemon thread per connection. Bound when made (`url` is known),
    serving from `start()` or `with`, until `stop()`."""

    def __init__(self, reply: Callable[[dict[str, Any]], Any], *, model: str = "m") -> None:
        models = {"object": "list", "data": [{"id": model, "object": "model"}]}

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # as in FakeVLM: no 40 ms delayed-ACK wait per reply

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _json(self, doc: Any) -> None:
                raw = json.dumps(doc).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                self._json(models)

            def do_POST(self) -> None:
                self._json(reply(json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))))

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 256  # a client opening many connections at once: none refused under load

        self._httpd = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> JsonServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> JsonServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def load_answer(spec: str) -> AnswerFn:
    """`FILE:FUNCTION` -> that function of that Python file, imported by path."""
    import importlib.util

    path, _, name = spec.rpartition(":")
    mod_spec = importlib.util.spec_from_file_location(f"_answer_{abs(hash(path))}", path)
    assert mod_spec is not None and mod_spec.loader is not None, f"cannot import {path}"
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return getattr(module, name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run a FakeVLM until killed; prints its URL.")
    ap.add_argument("--model", action="append", help="model id to list (repeatable)")
    ap.add_argument("--answer", default="fake answer", help="text every question gets")
    ap.add_argument("--delay", type=float, default=0.0, help="seconds per answer")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--answer-from", metavar="FILE:FUNCTION",
                    help="answer with FUNCTION(prompt, has_image, image) of the Python file FILE "
                         "(a deterministic server in a process of its own); overrides --answer")
    a = ap.parse_args(argv)
    text = a.answer
    answer: AnswerFn = lambda p, h, i: text  # noqa: E731 (the default, replaced by --answer-from below)
    if a.answer_from:
        answer = load_answer(a.answer_from)
    srv = FakeVLM(a.model or ["fake-vlm"], answer=answer, delay=a.delay)
    srv.start(a.port)
    print(srv.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
