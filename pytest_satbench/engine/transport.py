"""Keep-alive HTTP/1.1 connections to one server, on the standard library's http.client.

Why not requests: at hundreds of questions per second the client is CPU-bound (one
Python process, one GIL), and requests spent ~0.5 ms of CPU per call merging settings,
re-reading the proxy environment and re-preparing headers: a quarter of the plugin's
CPU per question. Chat completions need none of that: one POST of a prepared body to a
fixed URL on a reused connection. What requests gave that matters is kept: proxies from
the environment (HTTP(S)_PROXY, NO_PROXY, read once), HTTPS with the system's CA store
(or REQUESTS_CA_BUNDLE / SSL_CERT_FILE), `user:password@` in the URL as basic auth, and
separate connect and read timeouts.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

# A connection idle longer than this is closed instead of reused: servers close idle
# keep-alive connections (uvicorn after 5 s), and a request sent on one that is being
# closed fails for no reason of its own.
IDLE_MAX_S = 4.0


class TransportError(Exception):
    """A request that got no complete HTTP response. `kind` says what happened:
    connect (refused, unreachable), connect-timeout, timeout (no answer in time), reset
    (the connection dropped), cut-off (the body ended early), protocol (not HTTP)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class Connections:
    """A LIFO pool of keep-alive connections to one base URL; thread-safe."""

    def __init__(self, url: str, *, connect_timeout: float, read_timeout: float, headers: dict[str, str]) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url}")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.base_path = parts.path.rstrip("/")
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.headers = {"Connection": "keep-alive", **headers}
        if parts.username and "Authorization" not in self.headers:
            token = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            self.headers["Authorization"] = "Basic " + base64.b64encode(token).decode("ascii")
        self.proxy = _proxy_for(parts.scheme, self.host)
        self._context = _ssl_context() if self.https else None
        self._idle: list[tuple[http.client.HTTPConnection, float]] = []
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ connections
    def _new(self) -> http.client.HTTPConnection:
        if self.proxy is None:
            if self.https:
                return http.client.HTTPSConnection(self.host, self.port, timeout=self.connect_timeout, context=self._context)
            return http.client.HTTPConnection(self.host, self.port, timeout=self.connect_timeout)
        phost, pport = self.proxy
        if self.https:  # CONNECT tunnel through the proxy
            conn = http.client.HTTPSConnection(phost, pport, timeout=self.connect_timeout, context=self._context)
            conn.set_tunnel(self.host, self.port)
            return conn
        return http.client.HTTPConnection(phost, pport, timeout=self.connect_timeout)

    def _take(self) -> http.client.HTTPConnection:
        now = time.monotonic()
        with self._lock:
            while self._idle:
                conn, since = self._idle.pop()
                if now - since < IDLE_MAX_S:
                    return conn
                conn.close()
        return self._new()

    def _give(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._idle.append((conn, time.monotonic()))

    # ------------------------------------------------------------------ requests
    def request(self, method: str, path: str, body: bytes | None = None, *, timeout: float | None = None) -> Response:
        conn = self._take()
        target = self.base_path + path
        if self.proxy is not None and not self.https:
            target = f"http://{self.host}:{self.port}{target}"  # absolute form for an HTTP proxy
        stage = "connect"
        try:
            if conn.sock is None:
                conn.connect()
            stage = "request"
            conn.sock.settimeout(timeout or self.read_timeout)
            conn.request(method, target, body=body, headers=self.headers)
            resp = conn.getresponse()
            data = resp.read()
        except TimeoutError:
            conn.close()
            if stage == "connect":
                raise TransportError("connect-timeout", f"no connection within {self.connect_timeout:g} s") from None
            raise TransportError("timeout", f"no answer within {timeout or self.read_timeout:g} s") from None
        except http.client.IncompleteRead as exc:
            conn.close()
            raise TransportError("cut-off", f"IncompleteRead: {len(exc.partial)} bytes read") from None
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError) as exc:
            conn.close()
            raise TransportError("connect" if stage == "connect" else "reset", _describe(exc)) from None
        except (ssl.SSLError, http.client.HTTPException, OSError) as exc:
            conn.close()
            kind = "connect" if stage == "connect" else "protocol"
            raise TransportError(kind, _describe(exc)) from None
        if resp.will_close:
            conn.close()
        else:
            self._give(conn)
        return Response(resp.status, resp.headers, data)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _proxy_for(scheme: str, host: str) -> tuple[str, int] | None:
    if urllib.request.proxy_bypass(host):
        return None
    proxy = urllib.request.getproxies().get(scheme)
    if not proxy:
        return None
    parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if not parts.hostname:
        return None
    return parts.hostname, parts.port or 80


def _ssl_context() -> ssl.SSLContext:
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    return ssl.create_default_context(cafile=bundle or None)

