"""A loopback mirror for `python -m pytest_satbench.data` tests: a real HTTP server (stdlib
http.server in a thread) serving bytes by relative path, with Range support (RFC 9110
§14), and modes that cut a transfer short, ignore Range, or serve corrupted bytes. Every GET
is logged with its Range header, so tests count requests and byte ranges."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass
class Mirror:
    files: dict[str, bytes] = field(default_factory=dict)  # relative path -> body
    truncate_once: set[str] = field(default_factory=set)  # first GET sends half, then drops
    ignore_range: set[str] = field(default_factory=set)  # answers 200 with the whole body
    corrupt: set[str] = field(default_factory=set)  # serves the body with one byte flipped
    log: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Range header)
    url: str = ""

    def add_json(self, path: str, doc: Any) -> None:
        self.files[path] = json.dumps(doc).encode()

    def requests(self, path: str) -> list[str | None]:
        return [rng for p, rng in self.log if p == path]


def _handler(mirror: Mirror) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            """What `huggingface_hub` asks before a download: size, ETag and the commit a
            resolve URL's revision names (the Hub's X-Repo-Commit header)."""
            path = self.path.lstrip("/").split("?", 1)[0]
            mirror.log.append((path, "HEAD"))
            body = mirror.files.get(path)
            self.send_response(404 if body is None else 200)
            self.send_header("Content-Length", str(len(body or b"")))
            if body is not None:
                self.send_header("ETag", f'"{hashlib.sha256(body).hexdigest()}"')
                if "/resolve/" in path:
                    self.send_header("X-Repo-Commit", path.split("/resolve/", 1)[1].split("/", 1)[0])
            self.end_headers()

        def do_GET(self) -> None:
            path = self.path.lstrip("/").split("?", 1)[0]
            rng = self.headers.get("Range")
            mirror.log.append((path, rng))
            body = mirror.files.get(path)
            if body is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if path in mirror.corrupt:
                body = body[:-1] + bytes([body[-1] ^ 0xFF])
            start = 0
            if rng and path not in mirror.ignore_range and rng.startswith("bytes=") and rng.endswith("-"):
                start = int(rng[6:-1])
                if start >= len(body):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(body)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            else:
                self.send_response(200)
            part = body[start:]
            self.send_header("Content-Length", str(len(part)))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            if path in mirror.truncate_once:
                mirror.truncate_once.discard(path)
                self.wfile.write(part[: len(part) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(part)

    return Handler


@contextmanager
def serve(mirror: Mirror) -> Iterator[Mirror]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(mirror))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    mirror.url = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        yield mirror
    finally:
        server.shutdown()
        server.server_close()


def zip_folder(folder: Path, prefix: str) -> bytes:
    """`folder`'s files as a zip, member names under `prefix` ("" for none)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                zf.write(p, (prefix + "/" if prefix else "") + p.relative_to(folder).as_posix())
    return buf.getvalue()


def tar_folder(folder: Path, prefix: str, extra: dict[str, bytes] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                tf.add(p, f"{prefix}/{p.relative_to(folder).as_posix()}")
        for name, data in (extra or {}).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()
