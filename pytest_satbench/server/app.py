"""The reference server's HTTP side: a small OpenAI-compatible chat-completions endpoint.

Endpoints: `GET /v1/models`, `GET /v1/models/{id}`, `POST /v1/chat/completions`,
`GET /health`. HTTP/1.1 with keep-alive: every plain response carries a Content-Length and a
stream (`"stream": true`) goes out as server-sent events in chunked transfer encoding, so a
client's connection pool reuses sockets either way. Errors get an OpenAI-style body
(`{"error": {"message", "type", "param", "code"}}`) whose message says what to fix: 400 for a
malformed request, 404 (vLLM's wording) for a model id the server does not serve.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import ipaddress
import json
import math
import socket
import threading
import time
import urllib.parse
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from pytest_satbench.server.reference_answers import answer, sampled
from pytest_satbench.server.vision import SceneReading, read_scene
from pytest_satbench.server.wire import (
    ApiError,
    Completion,
    ModelCard,
    ReplyOptions,
    RequestError,
    Sampling,
    model_not_found,
    parse_reply_options,
    parse_sampling,
)

__all__ = ["ParsedRequest", "RequestError", "bound_address", "estimate_tokens",
           "make_server", "parse_chat_request"]

_MAX_BODY = 64 * 1024 * 1024
_PATCH = 28  # pixels per image token side in the usage estimate (a Qwen2-VL-like patching)


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    text: str  # all text parts of the last user message, joined by newlines
    image: bytes | None  # encoded bytes of the first attached image
    options: ReplyOptions = field(default_factory=ReplyOptions)
    sampling: Sampling = field(default_factory=Sampling)  # temperature and seed


class _ReadingCache:
    """Per-image readings, keyed by a digest of the encoded bytes.

    A benchmark asks ~10 questions about each image, so the segmentation runs once per image
    rather than once per question; bounded so a long run does not grow without limit.
    """

    def __init__(self, capacity: int = 512) -> None:
        self._items: OrderedDict[str, SceneReading] = OrderedDict()
        self._lock = threading.Lock()
        self._capacity = capacity

    def get(self, data: bytes, compute: Callable[[], SceneReading]) -> SceneReading:
        key = hashlib.sha1(data).hexdigest()
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit
        value = compute()  # outside the lock: two threads may compute one image; harmless
        with self._lock:
            self._items[key] = value
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)
        return value


def parse_chat_request(body: bytes, served_model: str | None = None) -> ParsedRequest:
    """The request's question, image and reply options; ApiError says what is wrong.

    With `served_model`, a request naming another model is a 404 before its messages are
    looked at, as vLLM checks the model first; naming none means the served one, as on vLLM.
    """
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"request body is not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise RequestError("request body must be a JSON object")
    options = parse_reply_options(doc)
    sampling = parse_sampling(doc)
    if served_model is not None and options.model is not None and options.model != served_model:
        raise model_not_found(options.model)
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of chat messages", "messages")
    user = [m for m in messages if isinstance(m, dict) and m.get("role", "user") == "user"]
    if not user:
        raise RequestError("'messages' has no message with role 'user'", "messages")
    content = user[-1].get("content")
    texts: list[str] = []
    image: bytes | None = None
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        for i, part in enumerate(content):
            if not isinstance(part, dict):
                raise RequestError(f"content part {i} is not an object", "messages")
            kind = part.get("type")
            if kind == "text":
                texts.append(str(part.get("text", "")))
            elif kind == "image_url":
                if image is None:  # the first image is the one looked at
                    image = _decode_data_url(part.get("image_url"), i)
            else:
                raise RequestError(
                    f"content part {i} has unsupported type {kind!r} (use 'text' or "
                    "'image_url')",
                    "messages",
                )
    else:
        raise RequestError("message 'content' must be a string or a list of parts", "messages")
    return ParsedRequest(text="\n".join(texts), image=image, options=options, sampling=sampling)


def _decode_data_url(spec: Any, index: int) -> bytes:
    url = spec.get("url") if isinstance(spec, dict) else spec
    if not isinstance(url, str) or not url.startswith("data:"):
        raise RequestError(
            f"content part {index}: image_url must be a base64 data URL "
            "('data:image/jpeg;base64,...'); this server fetches nothing",
            "messages",
        )
    header, _, payload = url.partition(",")
    if ";base64" not in header:
        raise RequestError(f"content part {index}: image data URL is not base64", "messages")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(
            f"content part {index}: image data URL has invalid base64", "messages"
        ) from None


def _decode_image(data: bytes) -> np.ndarray:
    try:
        with Image.open(io.BytesIO(data)) as im:
            return np.asarray(im.convert("RGB"))
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise RequestError(f"attached image cannot be decoded ({exc})", "messages") from None


def estimate_tokens(text: str, image_size: tuple[int, int] | None) -> int:
    """A deterministic stand-in for a tokenizer: words plus one token per 28x28 patch."""
    n = len(text.split())
    if image_size is not None:
        w, h = image_size
        n += math.ceil(w / _PATCH) * math.ceil(h / _PATCH)
    return n


class ReferenceHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a Content-Length, or chunked for a stream
    server_version = "satbench-reference/1"
    # Headers and body go out in two writes; with Nagle on, the second waits for the
    # client's delayed ACK (~40 ms a request on Linux loopback).
    disable_nagle_algorithm = True
    model_id = "satbench-reference"  # set per server by make_server
    readings: _ReadingCache

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib method's own parameter name)
        pass  # one line per request would flood a benchmark run's output

    def _send_json(self, status: int, doc: dict[str, Any]) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_error(self, err: ApiError) -> None:
        self._send_json(err.status, err.body())

    def _send_events(self, docs: Iterable[dict[str, Any]]) -> None:
        """A 200 server-sent-event stream: one `data: {json}` event per doc, then [DONE].

        Chunked transfer encoding frames the stream, so the connection stays usable for
        the next request (keep-alive) without knowing the length up front.
        """
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for doc in docs:
                self._write_chunk(b"data: " + json.dumps(doc).encode() + b"\n\n")
            self._write_chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")  # the terminating zero-length chunk
        except (BrokenPipeError, ConnectionResetError):
            # The client stopped reading mid-stream (e.g. broke out of its loop): nothing
            # to report to anyone, and the socket is no use for another request.
            self.close_connection = True

    def _write_chunk(self, data: bytes) -> None:
        # One write per event: it reaches the client at once (Nagle is off), as a token
        # stream from vLLM would.
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _route(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/")

    def do_GET(self) -> None:
        path = self._route()
        if path == "/v1/models":
            self._send_json(200, {"object": "list",
                                  "data": [ModelCard.of(self.model_id).to_json()]})
        elif path.startswith("/v1/models/"):
            # Clients percent-encode the id (the openai client sends a "/" in an id such
            # as "Qwen/Qwen2-VL-7B" as %2F); either spelling names the same model.
            wanted = urllib.parse.unquote(path[len("/v1/models/"):])
            if wanted == self.model_id:
                self._send_json(200, ModelCard.of(self.model_id).to_json())
            else:
                self._send_error(model_not_found(wanted))
        elif path == "/health":
            self._send_json(200, {"status": "ok"})
        else:
            self._send_error(ApiError(404, f"no route GET {path}; try /v1/models",
                                      kind="not_found_error"))

    def do_POST(self) -> None:
        path = self._route()
        raw_length = self.headers.get("Content-Length") or "0"
        length = int(raw_length) if raw_length.isdigit() else -1
        if length < 0:
            # Without a usable length the body's end is unknown (read(-1) would wait for
            # EOF), so the connection cannot carry another request either.
            self.close_connection = True
            self._send_error(RequestError(f"Content-Length {raw_length!r} is not a byte count"))
            return
        if length > _MAX_BODY:
            self.close_connection = True  # the unread body would corrupt the next request
            self._send_error(ApiError(413, f"request body over {_MAX_BODY} bytes"))
            return
        body = self.rfile.read(length)
        if path != "/v1/chat/completions":
            self._send_error(ApiError(404, f"no route POST {path}; use /v1/chat/completions",
                                      kind="not_found_error"))
            return
        try:
            req = parse_chat_request(body, self.model_id)
            size = None
            scene: Callable[[], SceneReading] | None = None
            if req.image is not None:
                data = req.image
                pixels = _decode_image(data)  # decoded up front: a bad image is a 400
                size = (pixels.shape[1], pixels.shape[0])
                scene = lambda: self.readings.get(data, lambda: read_scene(pixels))  # noqa: E731 (a thunk: read only if the answer needs it)
            content = sampled(answer(req.text, scene), req.text, req.sampling.temperature, req.sampling.seed)
        except ApiError as exc:
            self._send_error(exc)
            return
        done = Completion(id="chatcmpl-" + uuid.uuid4().hex[:24], created=int(time.time()),
                          model=self.model_id, content=content, n=req.options.n,
                          prompt_tokens=estimate_tokens(req.text, size))
        if req.options.stream:
            # The answer is complete before the first event: the stream has vLLM's framing
            # and order, not its timing (nothing is generated token by token here).
            self._send_events(done.chunks(req.options.include_usage))
        else:
            self._send_json(200, done.response())


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a stuck client must not keep the interpreter alive
    request_queue_size = 128  # many parallel clients connect at once


class _Server6(_Server):
    address_family = socket.AF_INET6


def make_server(host: str, port: int, model: str) -> ThreadingHTTPServer:
    """A bound (not yet serving) server; each server gets its own handler class and cache.

    Raises ValueError for a port outside 0-65535 (the socket layer would raise a bare
    OverflowError), OSError when the address cannot be bound (socket.gaierror for a host
    that does not resolve).
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an integer from 0 to 65535 (0: any free port), "
                         f"not {port!r}")
    handler = type("Handler", (ReferenceHandler,),
                   {"model_id": model, "readings": _ReadingCache()})
    # An IPv6 literal ("::1") needs an IPv6 socket; names and IPv4 addresses bind as IPv4,
    # as before, so "localhost" keeps meaning 127.0.0.1 for clients that dial that.
    cls = _Server6 if _is_ipv6_literal(host) else _Server
    return cls((host, port), handler)


def _is_ipv6_literal(host: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address)
    except ValueError:
        return False


def bound_address(httpd: ThreadingHTTPServer) -> tuple[str, int]:
    """The (host, port) a server actually listens on (port 0 resolves to the real one)."""
    host = httpd.server_address[0]
    return (host.decode() if isinstance(host, bytes) else str(host)), int(httpd.server_port)
