"""Keep-alive HTTP/1.1 connections to one server, on the standard library's http.client.

Why not urllib3 or requests: at hundreds of questions per second the client is CPU-bound
(one Python process, one GIL). Measured side by side (performance/http_client.py; numbers in
docs/performance.md, "HTTP client"), a chat POST on a reused connection costs this transport
about half the client CPU that urllib3 needs for it (urllib3 runs the same http.client under
per-call timeout, retry, pool-queue and response layers) and a fifth of what requests needs.
Chat completions need none of those layers: one POST of a prepared body to a fixed URL.

What those libraries gave that matters is kept here: proxies from the environment
(HTTP_PROXY / HTTPS_PROXY / NO_PROXY, lower case first, read once per pool) with
`user:password@` in the proxy URL sent as Proxy-Authorization, a forward proxy for http://
servers and a CONNECT tunnel for https:// ones; HTTPS with the system's CA store (or
REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE / SSL_CERT_FILE); `user:password@` in the server URL
as basic auth; a connect timeout. Not done: proxies reached over TLS
(https:// proxy URLs) and SOCKS proxies, refused with a one-line error naming the proxy, and
ALL_PROXY, which is not read.

Bounded requests. A request's timeout is the deadline of the whole request: connect, send,
status line, headers and body together, not a per-read timeout (http.client's socket
timeout restarts with every byte, so a server sending a byte every half second never times
out). Every send and receive on the connection gets only the time left until that deadline
(`_DeadlineSocket`), so a trickling or endless reply fails at the deadline, wherever it
trickles. The body is read in pieces and counted: a reply that announces, or grows to, more
than `max_body` bytes fails at once ("too-large") without buffering more than that.

Every reply that arrives whole is returned, however the server frames it: a Content-Length,
chunks, or (HTTP/1.0 servers, `Connection: close`, proxies without keep-alive) the end of the
connection; each is a whole GPU generation, so none is thrown away and asked again. A body
sent with Content-Encoding gzip or deflate although the client asked for identity (reverse
proxies do) is decoded, within the same cap; any other encoding fails in one line naming it.
Servers also close idle keep-alive connections without a word: a pooled connection is
checked before reuse, and a request that a reused connection dropped before it reached the
server is sent again on a new one, which is not a failure.

The file is over 500 lines because the proxy settings (NO_PROXY matching, proxy URLs) live
here with the connections that use them; they are read nowhere else.
"""

from __future__ import annotations

import base64
import http.client
import io
import ipaddress
import json
import math
import os
import re
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from pytest_satbench.engine.config import config_default

__all__ = ["IDLE_MAX_S", "MAX_BODY_BYTES", "Connections", "Proxy", "ProxySettings", "Response", "TransportError"]

# A connection idle longer than this is closed instead of reused: servers close idle
# keep-alive connections (uvicorn after 5 s), and a request sent on one that is being
# closed fails for no reason of its own.
IDLE_MAX_S = 4.0
# Default cap on a reply body: a chat completion is a few kB; the /v1/models list of a large
# provider (OpenRouter) is under 1 MB.
MAX_BODY_BYTES = config_default("max_reply_bytes")  # the reply cap (--max-reply-bytes)
_PIECE = 64 * 1024  # bytes per read of a body: the most read past the cap before it fails

# http.client reports a refused CONNECT only as this text in an OSError.
_TUNNEL_REFUSED = re.compile(r"Tunnel connection failed: (\d{3})\s*(.*)")


class TransportError(Exception):
    """A request that got no complete HTTP response. `kind` says what happened:
    connect (refused, unreachable), connect-timeout, timeout (no complete reply before the
    request's deadline), reset (the connection dropped), cut-off (the body ended early),
    too-large (the body is over the cap; `status` holds the HTTP status), protocol (not
    HTTP), proxy (the proxy refused the CONNECT tunnel, `status` holding its answer, or the
    proxy settings are unusable, `status` None)."""

    def __init__(self, kind: str, message: str, *, status: int | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.detail = detail  # a timeout's: how far the request got


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


@dataclass(frozen=True, slots=True)
class Proxy:
    """One HTTP proxy, as a proxy URL names it."""

    host: str
    port: int
    display: str  # the URL without credentials: the only form that goes into messages
    authorization: str | None = field(default=None, repr=False)  # "Basic ..." from user:password@
    password: str | None = field(default=None, repr=False)  # for callers to scrub from what they show

    @classmethod
    def parse(cls, url: str) -> Proxy:
        """Raises ValueError (one line, no credentials) for a URL this transport cannot use."""
        # "proxy:3128" without a scheme is common in cluster environments; curl and requests
        # read it as http://.
        parts = urlsplit(url if "://" in url else f"http://{url}")
        host = parts.hostname or ""
        try:
            port = parts.port or 80
        except ValueError:
            port = -1
        netloc = f"[{host}]" if ":" in host else host
        display = f"{parts.scheme}://{netloc}" + (f":{parts.port}" if port > 0 and parts.port else "")
        if parts.scheme != "http":
            raise ValueError(
                f"proxy {display} from the environment is not an http:// proxy (only http:// proxy URLs "
                "are supported; https:// servers are still reached end to end through a CONNECT tunnel)")
        if not host or port < 0:
            raise ValueError(f"proxy URL {display!r} from the environment has no usable host:port")
        auth = None
        password = None
        if parts.username is not None:
            password = unquote(parts.password or "") or None
            token = f"{unquote(parts.username)}:{password or ''}".encode()
            auth = "Basic " + base64.b64encode(token).decode("ascii")
        return cls(host, port, display, authorization=auth, password=password)


@dataclass(frozen=True, slots=True)
class ProxySettings:
    """HTTP_PROXY, HTTPS_PROXY and NO_PROXY as read from the environment at one moment.

    Read once per pool, not per request: the lookups showed up in profiles when requests
    made them per call, and a run should not change route halfway because a variable did.
    """

    http: str | None = None  # proxy URL for http:// servers
    https: str | None = None  # proxy URL for https:// servers (a CONNECT tunnel)
    no_proxy: tuple[str, ...] = ()

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> ProxySettings:
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            # Lower case first, and a set-but-empty lower-case variable switches the proxy
            # off: what curl, urllib and requests do.
            for key in (name, name.upper()):
                if key in env:
                    return env[key].strip() or None
            return None

        raw = get("no_proxy") or ""
        entries = tuple(e.lower() for e in re.split(r"[,\s]+", raw) if e)
        return cls(http=get("http_proxy"), https=get("https_proxy"), no_proxy=entries)

    def bypasses(self, host: str, port: int) -> bool:
        """Whether NO_PROXY exempts host:port: `*`, a host or domain (a leading `.` or `*.`
        is optional and the domain's subdomains match too), an IP, a CIDR range, each
        optionally with `:port`."""
        host = host.lower().strip("[]")
        try:
            ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
        except ValueError:
            ip = None
        for entry in self.no_proxy:
            if entry == "*":
                return True
            name, want_port = _split_port(entry)
            if want_port is not None and want_port != port:
                continue
            name = name.lstrip("*").lstrip(".")
            if not name:
                continue
            if "/" in name:
                if ip is not None:
                    try:
                        if ip in ipaddress.ip_network(name, strict=False):
                            return True
                    except ValueError:
                        pass
                continue
            if host == name or host.endswith("." + name):
                return True
        return False

    def proxy_url_for(self, scheme: str, host: str, port: int) -> str | None:
        """The proxy URL a request to scheme://host:port goes through, None for direct."""
        raw = self.https if scheme == "https" else self.http
        if not raw or self.bypasses(host, port):
            return None
        return raw


def _split_port(entry: str) -> tuple[str, int | None]:
    """'host:8000' -> ('host', 8000); '[::1]:8000' -> ('::1', 8000); '::1' -> ('::1', None)."""
    if entry.startswith("["):
        name, _, rest = entry[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif entry.count(":") == 1:
        name, _, port = entry.partition(":")
    else:
        return entry, None
    return name, int(port) if port.isdigit() else None


class Connections:
    """A LIFO pool of keep-alive connections to one base URL; thread-safe.

    `proxies`: the proxy settings to route by; None reads them from the environment now.
    A proxy URL that cannot be used does not raise here: every request raises
    TransportError("proxy") naming it, so it surfaces as the server's health-check failure.

    `read_timeout` (the name is historical): the default deadline of a whole request, in
    seconds; `connect_timeout` bounds the connect (and TLS handshake) within it. `max_body`:
    the default cap on a reply body in bytes.
    """

    def __init__(self, url: str, *, connect_timeout: float, read_timeout: float, headers: dict[str, str],
                 proxies: ProxySettings | None = None, max_body: int = MAX_BODY_BYTES) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url}")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.base_path = parts.path.rstrip("/")
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_body = max_body
        self.headers = {"Connection": "keep-alive", **headers}
        if parts.username and "Authorization" not in self.headers:
            token = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            self.headers["Authorization"] = "Basic " + base64.b64encode(token).decode("ascii")
        settings = ProxySettings.from_environment() if proxies is None else proxies
        self.proxy: Proxy | None = None
        self.proxy_problem: str | None = None
        raw = settings.proxy_url_for(parts.scheme, self.host, self.port)
        if raw is not None:
            try:
                self.proxy = Proxy.parse(raw)
            except ValueError as exc:
                self.proxy_problem = str(exc)
        netloc = f"[{self.host}]" if ":" in self.host else self.host
        self._absolute_prefix = f"http://{netloc}:{self.port}"
        self._tunnel_headers: dict[str, str] = {}
        if self.proxy is not None and self.proxy.authorization is not None:
            if self.https:  # the proxy sees only the CONNECT; everything after is TLS to the server
                self._tunnel_headers["Proxy-Authorization"] = self.proxy.authorization
            else:  # a forward proxy reads every request, and strips this header on its way on
                self.headers["Proxy-Authorization"] = self.proxy.authorization
        self._context = _ssl_context() if self.https else None
        self._idle: list[tuple[http.client.HTTPConnection, float]] = []
        self._lock = threading.Lock()
        self.resent = 0  # requests sent again because a reused connection was closed under them

    # ------------------------------------------------------------------ connections
    def _new(self) -> http.client.HTTPConnection:
        if self.proxy is None:
            if self.https:
                return http.client.HTTPSConnection(self.host, self.port, timeout=self.connect_timeout, context=self._context)
            return http.client.HTTPConnection(self.host, self.port, timeout=self.connect_timeout)
        phost, pport = self.proxy.host, self.proxy.port
        if self.https:  # CONNECT tunnel through the proxy, then TLS with the server inside it
            conn = http.client.HTTPSConnection(phost, pport, timeout=self.connect_timeout, context=self._context)
            conn.set_tunnel(self.host, self.port, headers=self._tunnel_headers)
            return conn
        return http.client.HTTPConnection(phost, pport, timeout=self.connect_timeout)

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        """A connection for the next request and whether it carried one before. An idle one
        the server has closed (or that holds bytes nobody asked for) is dropped here, before
        a request is written to it: a request sent on it would fail for no fault of its own."""
        now = time.monotonic()
        with self._lock:
            while self._idle:
                conn, since = self._idle.pop()
                if now - since < IDLE_MAX_S and _still_open(conn):
                    return conn, True
                conn.close()
        return self._new(), False

    def _give(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._idle.append((conn, time.monotonic()))

    # ------------------------------------------------------------------ requests
    def request(self, method: str, path: str, body: bytes | None = None, *, timeout: float | None = None,
                max_body: int | None = None) -> Response:
        """One request on a pooled connection. `timeout`: the deadline of the whole request in
        seconds (default `read_timeout`); `max_body`: the cap on the reply body in bytes
        (default `max_body`). Raises TransportError.

        A reused connection that turns out closed before any byte of a reply came back (the
        server closed it while idle, just as the request went out) carried nothing to the
        server: the request is sent once more on a new connection, within the same deadline,
        and it is not a failure (`resent` counts them)."""
        if self.proxy_problem is not None:
            raise TransportError("proxy", self.proxy_problem)
        limit = timeout or self.read_timeout
        cap = self.max_body if max_body is None else max_body
        deadline = time.monotonic() + limit
        conn, reused = self._take()
        try:
            return self._exchange(conn, method, path, body, limit, deadline, cap)
        except _NeverArrived as exc:
            if not reused:
                raise TransportError("reset", _describe(exc.cause)) from None
        with self._lock:
            self.resent += 1
        try:
            return self._exchange(self._new(), method, path, body, limit, deadline, cap)
        except _NeverArrived as exc:
            raise TransportError("reset", _describe(exc.cause)) from None

    def _exchange(self, conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None,
                  limit: float, deadline: float, cap: int) -> Response:
        """Send the request on `conn` and read its reply whole: to its Content-Length, to the
        end of its chunks, or, from a server that closes after each reply (HTTP/1.0,
        `Connection: close`), to the close. Raises TransportError, or _NeverArrived when the
        connection was found closed before the request reached the server."""
        target = self.base_path + path
        if self.proxy is not None and not self.https:
            target = self._absolute_prefix + target  # absolute form, as a forward proxy wants
        stage = "connect"
        read = 0  # body bytes read so far
        try:
            if conn.sock is None:  # a resend connects within what is left of the deadline
                conn.timeout = min(self.connect_timeout, limit, max(deadline - time.monotonic(), 0.001))
                conn.connect()
            sock = conn.sock
            if not isinstance(sock, _DeadlineSocket):
                sock = conn.sock = _DeadlineSocket(sock)
            sock.deadline = deadline
            stage = "send"
            conn.request(method, target, body=body, headers=self.headers)
            stage = "headers"
            resp = conn.getresponse()
            stage = "body"
            if resp.length is not None and resp.length > cap:
                raise _TooLarge(f"the reply announces {resp.length} bytes, over the {cap}-byte cap",
                                resp.status)
            pieces: list[bytes] = []
            while True:  # read1: at most one receive per piece, so `read` is what has arrived
                piece = resp.read1(min(_PIECE, cap + 1 - read))
                if not piece:
                    break
                read += len(piece)
                if read > cap:
                    raise _TooLarge(f"the reply is over the {cap}-byte cap ({read} bytes read)", resp.status)
                pieces.append(piece)
            if not resp.chunked and resp.length:  # read1 ends early at EOF without a word
                raise http.client.IncompleteRead(b"", resp.length)
            resp.close()  # the body is read: the connection may carry the next request
            data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            coding = resp.headers.get("Content-Encoding")
            if coding:
                data = _decoded(data, coding, cap, resp.status)
        except _TooLarge as exc:
            conn.close()
            raise TransportError("too-large", str(exc), status=exc.status) from None
        except TransportError:
            conn.close()
            raise
        except TimeoutError:
            conn.close()
            if stage == "connect":
                to = " to the proxy" if self.proxy is not None else ""
                within = min(self.connect_timeout, limit)
                raise TransportError("connect-timeout", f"no connection{to} within {within:g} s") from None
            doing = {"send": "while sending the request", "headers": "no reply headers yet",
                     "body": f"{read} bytes of the body read"}[stage]
            raise TransportError("timeout", f"no complete reply within {limit:g} s ({doing})", detail=doing) from None
        except http.client.IncompleteRead:
            conn.close()
            raise TransportError("cut-off", f"IncompleteRead: {read} bytes read") from None
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError) as exc:
            conn.close()
            if stage == "connect":
                raise TransportError("connect", self._at_proxy(exc) + _describe(exc)) from None
            # Closed under the request before it got in (a broken pipe while sending), or
            # closed with not one byte of a reply (the status line never came): what a
            # server does to a connection it had let go idle. Anything later is a reset.
            if stage == "send" or isinstance(exc, http.client.RemoteDisconnected):
                raise _NeverArrived(exc) from None
            raise TransportError("reset", _describe(exc)) from None
        except (ssl.SSLError, http.client.HTTPException, OSError) as exc:
            conn.close()
            if stage != "connect":
                raise TransportError("protocol", _describe(exc)) from None
            refused = _TUNNEL_REFUSED.match(str(exc)) if self.proxy is not None else None
            if refused:
                answer = f"{refused.group(1)} {refused.group(2).strip()}".strip()
                raise TransportError("proxy", f"the proxy refused CONNECT {self.host}:{self.port} ({answer})",
                                     status=int(refused.group(1))) from None
            raise TransportError("connect", self._at_proxy(exc) + _describe(exc)) from None
        except Exception as exc:  # noqa: BLE001 - whatever http.client raises on a reply it cannot read
            conn.close()
            raise TransportError("protocol", _describe(exc)) from None
        if resp.will_close:
            conn.close()
        else:
            self._give(conn)
        return Response(resp.status, resp.headers, data)

    def _at_proxy(self, exc: BaseException) -> str:
        """Prefix for a connect-stage failure that happened between us and the proxy. A TLS
        error through a tunnel is the server's (the proxy only relays bytes)."""
        if self.proxy is None or isinstance(exc, ssl.SSLError):
            return ""
        return "to the proxy: "

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()


class _TooLarge(Exception):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class _NeverArrived(Exception):
    """The connection was closed before the request reached the server (see _exchange)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _DeadlineSocket:
    """A connected socket as http.client uses it (sendall, makefile, close), where every send
    and receive may take only the time left until `deadline` (time.monotonic()). A plain
    socket timeout restarts with each byte received; this one does not. Everything else is
    the socket's own.

    Closing it while a response still reads from it (http.client closes the connection as
    soon as the headers say the server will close: HTTP/1.0, `Connection: close`) closes
    the socket only once that reader is closed too, as a plain socket and its makefile do;
    closing at once would cut the body off (EBADF) and throw a whole reply away."""

    __slots__ = ("closed", "deadline", "readers", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.deadline = math.inf
        self.readers = 0  # makefile readers not closed yet
        self.closed = False

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's deadline passed")
        return left

    def sendall(self, data: Any) -> None:
        # Since Python 3.5 a timeout bounds the whole sendall, not each send inside it.
        self.sock.settimeout(self._left())
        self.sock.sendall(data)

    def recv_into(self, buffer: Any, nbytes: int = 0) -> int:
        self.sock.settimeout(self._left())
        return self.sock.recv_into(buffer, nbytes)

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        if mode != "rb":
            raise ValueError(f"_DeadlineSocket.makefile supports 'rb' only, not {mode!r}")
        self.readers += 1
        return io.BufferedReader(_DeadlineReader(self))

    def reader_closed(self) -> None:
        self.readers -= 1
        if self.closed and self.readers <= 0:
            self.sock.close()

    def close(self) -> None:
        self.closed = True
        if self.readers <= 0:
            self.sock.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


class _DeadlineReader(io.RawIOBase):
    """The raw stream under a response's buffered reader. Closing it leaves the socket open
    (the connection is kept alive), as socket.SocketIO does, unless the connection was closed
    while it read."""

    def __init__(self, sock: _DeadlineSocket) -> None:
        super().__init__()
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self._sock.recv_into(buffer)

    def close(self) -> None:
        if not self.closed:
            super().close()
            self._sock.reader_closed()


def _still_open(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle pooled connection can carry a request. An idle connection has nothing
    to read: if it is readable, the server closed it (end of file), reset it, or sent bytes
    nobody asked for, and it is dropped. One non-blocking peek, about a microsecond."""
    sock = conn.sock
    raw = sock.sock if isinstance(sock, _DeadlineSocket) else sock
    if raw is None:
        return True  # not connected yet: the request connects it
    try:
        raw.settimeout(0.0)  # every send and receive sets its own timeout again
        if isinstance(raw, ssl.SSLSocket):
            # TLS cannot peek; a record that is only TLS housekeeping (a TLS 1.3 session
            # ticket) is consumed and leaves no application data: still open.
            raw.recv(1)
        else:
            raw.recv(1, socket.MSG_PEEK)
    except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
        return True  # nothing to read: open
    except (OSError, ValueError):
        return False
    return False  # end of file, or stray bytes


def _decoded(data: bytes, header: str, cap: int, status: int) -> bytes:
    """The body with its Content-Encoding undone. The client asks for identity, but reverse
    proxies compress anyway; gzip and deflate (zlib-wrapped or raw: servers differ) are
    decoded, to at most `cap` bytes (a small body can inflate to gigabytes). An encoding it
    does not read ("encoding") or a body that does not decode ("corrupt") is a TransportError
    naming the encoding."""
    codings = [c.strip().lower() for c in header.split(",") if c.strip()]
    for coding in reversed(codings):  # applied in the order listed: undone from the last
        if coding == "identity":
            continue
        if coding in ("gzip", "x-gzip"):
            data = _inflate(data, (16 + zlib.MAX_WBITS,), cap, coding, status)
        elif coding == "deflate":
            data = _inflate(data, (zlib.MAX_WBITS, -zlib.MAX_WBITS), cap, coding, status)
        else:
            raise TransportError("encoding", f"the reply came with Content-Encoding: {_printable(coding)}, "
                                             "which this client does not decode (it reads gzip and deflate)",
                                 status=status)
    return data


def _inflate(data: bytes, formats: tuple[int, ...], cap: int, coding: str, status: int) -> bytes:
    problem = ""
    for wbits in formats:
        inflater = zlib.decompressobj(wbits)
        try:
            out = inflater.decompress(data, cap + 1)
        except zlib.error as exc:
            problem = str(exc)
            continue
        if len(out) > cap:
            raise _TooLarge(f"the {coding} reply inflates to over the {cap}-byte cap", status)
        if not inflater.eof:
            problem = "the compressed stream ends early"
            continue
        return out
    raise TransportError("corrupt", f"the {coding}-encoded reply does not decode ({problem})", status=status)


def _printable(text: str) -> str:
    return text.encode("ascii", "backslashreplace").decode("ascii")[:40]


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _ssl_context() -> ssl.SSLContext:
    # SSL_CERT_FILE / SSL_CERT_DIR are honoured by the default context itself.
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    return ssl.create_default_context(cafile=bundle or None)
