"""The reference server's HTTP side: a small OpenAI-compatible chat-completions endpoint.

Endpoints: `GET /v1/models`, `POST /v1/chat/completions`, `GET /health`. HTTP/1.1 with
keep-alive and a Content-Length on every response, so a client's connection pool reuses
sockets under heavy concurrency. Malformed requests get a 400 with an OpenAI-style error
body (`{"error": {"message", "type", "param", "code"}}`) whose message says what to fix.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import math
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from pytest_satbench.server.answering import answer
from pytest_satbench.server.vision import SceneReading, read_scene

_MAX_BODY = 64 * 1024 * 1024
_PATCH = 28  # pixels per image token side in the usage estimate (a Qwen2-VL-like patching)


class RequestError(Exception):
    """The request is malformed; the message is returned to the client with a 400."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    text: str  # all text parts of the last user message, joined by newlines
    image: bytes | None  # encoded bytes of the first attached image


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


def parse_chat_request(body: bytes) -> ParsedRequest:
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"request body is not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise RequestError("request body must be a JSON object")
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
    return ParsedRequest(text="\n".join(texts), image=image)


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
    protocol_version = "HTTP/1.1"  # keep-alive; every response carries Content-Length
    server_version = "satbench-reference/1"
    # Headers and body go out in two writes; with Nagle on, the second waits for the
    # client's delayed ACK (~40 ms a request on Linux loopback).
    disable_nagle_algorithm = True
    model_id = "satbench-reference"  # set per server by make_server
    readings: _ReadingCache

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # one line per request would flood a benchmark run's output

    def _send_json(self, status: int, doc: dict[str, Any]) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, param: str | None = None,
               kind: str = "invalid_request_error") -> None:
        self._send_json(
            status, {"error": {"message": message, "type": kind, "param": param, "code": None}}
        )

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [{
                "id": self.model_id, "object": "model", "created": 0,
                "owned_by": "pytest-satbench"}]})
        elif path == "/health":
            self._send_json(200, {"status": "ok"})
        else:
            self._error(404, f"no route GET {path}; try /v1/models", kind="not_found_error")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        length = int(self.headers.get("Content-Length") or 0)
        if length > _MAX_BODY:
            self.close_connection = True  # the unread body would corrupt the next request
            self._error(413, f"request body over {_MAX_BODY} bytes")
            return
        body = self.rfile.read(length)
        if path != "/v1/chat/completions":
            self._error(404, f"no route POST {path}; use /v1/chat/completions",
                        kind="not_found_error")
            return
        try:
            req = parse_chat_request(body)
            size = None
            scene: Callable[[], SceneReading] | None = None
            if req.image is not None:
                data = req.image
                pixels = _decode_image(data)  # decoded up front: a bad image is a 400
                size = (pixels.shape[1], pixels.shape[0])
                scene = lambda: self.readings.get(data, lambda: read_scene(pixels))  # noqa: E731
            content = answer(req.text, scene)
        except RequestError as exc:
            self._error(400, str(exc), exc.param)
            return
        prompt = estimate_tokens(req.text, size)
        completion = max(1, len(content.split()))
        self._send_json(200, {
            "id": "chatcmpl-" + uuid.uuid4().hex[:24],
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_id,
            "choices": [{"index": 0,
                         "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion},
        })


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a stuck client must not keep the interpreter alive
    request_queue_size = 128  # many parallel clients connect at once


def make_server(host: str, port: int, model: str) -> ThreadingHTTPServer:
    """A bound (not yet serving) server; each server gets its own handler class and cache."""
    handler = type("Handler", (ReferenceHandler,),
                   {"model_id": model, "readings": _ReadingCache()})
    return _Server((host, port), handler)


def bound_address(httpd: ThreadingHTTPServer) -> tuple[str, int]:
    """The (host, port) a server actually listens on (port 0 resolves to the real one)."""
    host = httpd.server_address[0]
    return (host.decode() if isinstance(host, bytes) else str(host)), int(httpd.server_port)
