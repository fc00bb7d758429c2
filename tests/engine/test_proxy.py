"""ServerPool behind HTTP proxies: a real loopback proxy (forward and CONNECT) in front of real
loopback chat servers (tests/servers.py), no mocked HTTP. Every socket is on 127.0.0.1; the
proxy refuses to relay anywhere else."""

from __future__ import annotations

import base64
import http.client
import ipaddress
import selectors
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from servers import FakeVLM, dead_url, one_line

from pytest_satbench.engine.client import ServerPool
from pytest_satbench.engine.failures import RequestFailed, ServerUnavailable
from pytest_satbench.engine.transport import Proxy, ProxySettings

FAST = {"backoff_base": 0.01, "backoff_max": 0.05, "timeout": 5.0, "connect_timeout": 2.0}
PROXY_VARS = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authorization", "proxy-connection", "te", "trailer",
              "transfer-encoding", "upgrade"}


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()




def ask(pool: ServerPool, prompt: str = "q") -> str:
    return pool.ask(model="m", prompt=prompt, image_jpeg=b"\xff\xd8jpeg", max_tokens=4).text


# ---------------------------------------------------------------------------- the proxy

@dataclass(frozen=True, slots=True)
class Seen:
    """One request as the proxy saw it."""

    method: str
    target: str  # the absolute URI of a forwarded request, host:port of a CONNECT
    proxy_authorization: str | None


def _loopback(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class LoopbackProxy:
    """An HTTP proxy on 127.0.0.1: forwards absolute-URI requests and tunnels CONNECT, to
    loopback targets only. `credentials`: (user, password) it demands (407 otherwise);
    `refuse`: a status it answers every request with."""

    def __init__(self, *, credentials: tuple[str, str] | None = None, refuse: int | None = None) -> None:
        self.expected = basic(*credentials) if credentials else None
        self.refuse = refuse
        self.lock = threading.Lock()
        self.seen: list[Seen] = []
        self.connections = 0
        self._httpd: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._httpd is not None
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def url_with(self, user: str, password: str) -> str:
        return self.url.replace("http://", f"http://{user}:{password}@")

    def __enter__(self) -> LoopbackProxy:  # noqa: PYI034 (never subclassed)
        proxy = self

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def process_request(self, request: Any, client_address: Any) -> None:
                with proxy.lock:
                    proxy.connections += 1
                super().process_request(request, client_address)

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # clients hanging up on a tunnel are expected

        self._httpd = Server(("127.0.0.1", 0), _proxy_handler(self))
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._httpd is not None
        self._httpd.shutdown()
        self._httpd.server_close()

    def record(self, method: str, target: str, auth: str | None) -> None:
        with self.lock:
            self.seen.append(Seen(method, target, auth))


def _proxy_handler(proxy: LoopbackProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _answer(self, status: int, text: str, headers: dict[str, str] | None = None) -> None:
            raw = text.encode()
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _refused(self) -> bool:
            """Answer the request here if the proxy does not relay it."""
            length = int(self.headers.get("Content-Length") or 0)
            if proxy.refuse is not None:
                self.rfile.read(length)
                self._answer(proxy.refuse, "forbidden by the test proxy")
                return True
            if proxy.expected is not None and self.headers.get("Proxy-Authorization") != proxy.expected:
                self.rfile.read(length)
                self._answer(407, "proxy authentication required",
                             {"Proxy-Authenticate": 'Basic realm="test"'})
                return True
            return False

        def do_CONNECT(self) -> None:
            proxy.record("CONNECT", self.path, self.headers.get("Proxy-Authorization"))
            if self._refused():
                return
            host, _, port = self.path.rpartition(":")
            if not _loopback(host):
                self._answer(403, "this test proxy relays to loopback only")
                return
            try:
                upstream = socket.create_connection((host, int(port)), timeout=5)
            except OSError as e:
                self._answer(502, f"cannot reach {self.path}: {e}")
                return
            self.send_response(200, "Connection established")
            self.end_headers()
            self.close_connection = True  # the bytes that follow are the tunnel's, not HTTP
            _relay(self.connection, upstream)

        def _forward(self) -> None:
            proxy.record(self.command, self.path, self.headers.get("Proxy-Authorization"))
            if self._refused():
                return
            target = urlsplit(self.path)
            if target.scheme != "http" or not _loopback(target.hostname):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer(403, "this test proxy forwards absolute http:// URIs to loopback only")
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            conn = http.client.HTTPConnection(target.hostname, target.port or 80, timeout=10)
            try:
                conn.request(self.command, target.path + (f"?{target.query}" if target.query else ""),
                             body=body or None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            except OSError as e:
                self._answer(502, f"cannot reach {target.netloc}: {e}")
                return
            finally:
                conn.close()
            self.send_response(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in HOP_BY_HOP and k.lower() != "content-length":
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _forward

    return Handler


def _relay(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until either side closes."""
    peer = {a: b, b: a}
    with selectors.DefaultSelector() as sel:
        sel.register(a, selectors.EVENT_READ)
        sel.register(b, selectors.EVENT_READ)
        try:
            while True:
                events = sel.select(timeout=30)
                if not events:
                    return
                for key, _ in events:
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]  # fileobj: the sockets registered above
                    if not data:
                        return
                    peer[key.fileobj].sendall(data)  # type: ignore[index]  # fileobj: the sockets registered above
        except OSError:
            return
        finally:
            b.close()


# ---------------------------------------------------------------------------- fixtures

@pytest.fixture(autouse=True)
def no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start every test from an environment without proxy settings."""
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 -> (cert.pem, key.pem)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is needed to make a loopback TLS certificate")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


@pytest.fixture
def tls_server(certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeVLM, str]]:
    """A FakeVLM speaking HTTPS, trusted through REQUESTS_CA_BUNDLE -> (server, https URL)."""
    cert, key = certificate
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))
    with FakeVLM(["m"]) as srv:
        httpd = srv._httpd
        assert httpd is not None
        accept = httpd.get_request

        def get_request() -> tuple[socket.socket, Any]:
            sock, addr = accept()
            # the handshake happens in the handler's thread, on its first read
            return ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

        httpd.get_request = get_request  # type: ignore[method-assign]  # the server's accept, wrapped for this test
        yield srv, srv.url.replace("http://", "https://")


# ---------------------------------------------------------------------------- plain HTTP: forward proxy

def test_http_server_is_reached_through_http_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeVLM(["m"], answer=lambda p, h, i: p.upper()) as srv, LoopbackProxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        with ServerPool([srv.url], **FAST) as pool:
            assert pool.health_check() == {srv.url: ["m"]}
            assert [ask(pool, f"q{i}") for i in range(3)] == ["Q0", "Q1", "Q2"]
            assert pool.usage()[srv.url].answered == 3  # the server keeps its own name
    assert [(s.method, s.target) for s in proxy.seen] == [
        ("GET", f"{srv.url}/v1/models"), *[("POST", f"{srv.url}/v1/chat/completions")] * 3]
    assert all(s.proxy_authorization is None for s in proxy.seen)
    assert proxy.connections == 1  # keep-alive to the proxy
    assert srv.chat_requests == 3


@pytest.mark.parametrize("lower,upper,through", [
    ("PROXY", "DEAD", True),  # the lower-case variable wins
    ("", "PROXY", False),  # set but empty, it switches the proxy off
    (None, "PROXY", True),
], ids=["lower-wins", "empty-lower-disables", "upper-alone"])
def test_lower_case_variables(monkeypatch: pytest.MonkeyPatch, lower: str | None, upper: str,
                              through: bool) -> None:
    with FakeVLM(["m"]) as srv, LoopbackProxy() as proxy:
        value = {"PROXY": proxy.url, "DEAD": dead_url(), "": ""}
        if lower is not None:
            monkeypatch.setenv("http_proxy", value[lower])
        monkeypatch.setenv("HTTP_PROXY", value[upper])
        with ServerPool([srv.url], **FAST) as pool:
            assert ask(pool) == "fake answer"
    assert len(proxy.seen) == (1 if through else 0)


@pytest.mark.parametrize("no_proxy", ["127.0.0.1", "example.com, 127.0.0.1", "127.0.0.0/8", "*", "PORT"])
def test_no_proxy_bypasses_the_proxy(monkeypatch: pytest.MonkeyPatch, no_proxy: str) -> None:
    with FakeVLM(["m"]) as srv, LoopbackProxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("no_proxy", no_proxy.replace("PORT", srv.url.removeprefix("http://")))
        with ServerPool([srv.url], **FAST) as pool:
            pool.health_check()
            assert ask(pool) == "fake answer"
    assert proxy.seen == [] and srv.chat_requests == 1


def test_no_proxy_for_another_host_or_port_does_not_bypass(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeVLM(["m"]) as srv, LoopbackProxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.10,127.0.0.1:1,.0.0.1x")
        with ServerPool([srv.url], **FAST) as pool:
            ask(pool)
    assert len(proxy.seen) == 1


def test_proxy_credentials_are_sent_as_proxy_authorization(monkeypatch: pytest.MonkeyPatch) -> None:
    user, password = "alice", "p@ss:w0rd"
    with FakeVLM(["m"]) as srv, LoopbackProxy(credentials=(user, password)) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url_with(user, "p%40ss%3Aw0rd"))
        with ServerPool([srv.url], api_key="sk-key", **FAST) as pool:
            pool.health_check()
            assert ask(pool) == "fake answer"
            shown = repr(pool)
    assert [s.proxy_authorization for s in proxy.seen] == [basic(user, password)] * 2
    assert srv.recorded[0].authorization == "Bearer sk-key"  # the server's own credentials pass through
    assert password not in shown and "p%40ss" not in shown


@pytest.mark.parametrize("password", [None, "wrong"], ids=["no-credentials", "wrong-credentials"])
def test_proxy_wanting_credentials_fails_at_once_naming_it(monkeypatch: pytest.MonkeyPatch,
                                                           password: str | None) -> None:
    with FakeVLM(["m"]) as srv, LoopbackProxy(credentials=("alice", "secret")) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url if password is None else proxy.url_with("alice", password))
        with ServerPool([srv.url], retries=3, **FAST) as pool:
            with pytest.raises(RequestFailed) as ei:
                ask(pool)
            with pytest.raises(ServerUnavailable) as health:
                pool.health_check()
    s = one_line(ei.value)
    assert srv.url in s and f"via proxy {proxy.url}" in s and "407" in s and "USER:PASSWORD" in s
    assert ei.value.attempts == 1 and not ei.value.transient  # a retry would be refused again
    assert "wrong" not in s
    h = one_line(health.value)
    assert proxy.url in h and "407" in h and "USER:PASSWORD" in h
    assert srv.chat_requests == 0


def test_refusing_proxy_gives_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeVLM(["m"]) as srv, LoopbackProxy(refuse=403) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        with ServerPool([srv.url], retries=2, **FAST) as pool, pytest.raises(RequestFailed) as ei:
            ask(pool)
    s = one_line(ei.value)
    assert f"{srv.url} via proxy {proxy.url}" in s and "HTTP 403" in s and "NO_PROXY" in s
    assert ei.value.attempts == 1 and srv.chat_requests == 0


def test_dead_proxy_gives_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = dead_url()
    with FakeVLM(["m"]) as srv:
        monkeypatch.setenv("HTTP_PROXY", proxy)
        with ServerPool([srv.url], retries=1, **FAST) as pool:
            with pytest.raises(RequestFailed) as ei:
                ask(pool)
            with pytest.raises(ServerUnavailable) as health:
                pool.health_check()
    s = one_line(ei.value)
    assert f"via proxy {proxy}" in s and "to the proxy" in s and "refused" in s.lower()
    assert "HTTP_PROXY" in s and ei.value.attempts == 2 and ei.value.transient
    h = one_line(health.value)
    assert proxy in h and "HTTP_PROXY" in h and srv.chat_requests == 0


def test_proxy_that_cannot_reach_the_server_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    server = dead_url()
    with LoopbackProxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        with ServerPool([server], retries=2, **FAST) as pool, pytest.raises(RequestFailed) as ei:
            ask(pool)
    s = one_line(ei.value)
    assert f"{server} via proxy {proxy.url}" in s and "HTTP 502" in s
    assert ei.value.attempts == 3 and ei.value.transient and len(proxy.seen) == 3


def test_proxy_environment_is_read_once_per_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeVLM(["m"]) as srv, LoopbackProxy() as proxy, ServerPool([srv.url], **FAST) as before:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        ask(before)
        assert proxy.seen == []  # this pool read the environment when it was made
        with ServerPool([srv.url], **FAST) as after:
            ask(after)
    assert len(proxy.seen) == 1


def test_explicit_proxy_settings_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeVLM(["m"]) as srv, LoopbackProxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", dead_url())
        with ServerPool([srv.url], proxies=ProxySettings(http=proxy.url), **FAST) as pool:
            ask(pool)
        with ServerPool([srv.url], proxies=ProxySettings(), **FAST) as pool:
            ask(pool)
    assert len(proxy.seen) == 1 and srv.chat_requests == 2


@pytest.mark.parametrize("url", ["socks5://127.0.0.1:1080", "https://127.0.0.1:3128", "http://:3128"])
def test_unusable_proxy_url_fails_the_health_check_in_one_line(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    with FakeVLM(["m"]) as srv:
        monkeypatch.setenv("HTTP_PROXY", url.replace("127.0.0.1", "user:hunter2@127.0.0.1"))
        with ServerPool([srv.url], retries=2, **FAST) as pool:
            with pytest.raises(ServerUnavailable) as ei:
                pool.health_check()
            with pytest.raises(RequestFailed) as failed:
                ask(pool)
    s = one_line(ei.value)
    assert srv.url in s and "HTTP_PROXY" in s and "NO_PROXY" in s and "hunter2" not in s
    assert url.split("://")[0] in s
    assert failed.value.attempts == 1 and "hunter2" not in str(failed.value)
    assert sum(srv.hits.values()) == 0  # nothing was sent anywhere


# ---------------------------------------------------------------------------- HTTPS: CONNECT tunnel

def test_https_server_is_reached_through_a_connect_tunnel(monkeypatch: pytest.MonkeyPatch,
                                                           tls_server: tuple[FakeVLM, str]) -> None:
    srv, url = tls_server
    with LoopbackProxy(credentials=("bob", "tunnel pw")) as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url_with("bob", "tunnel%20pw"))
        monkeypatch.setenv("HTTP_PROXY", dead_url())  # for http:// servers only
        with ServerPool([url], api_key="sk-tls", **FAST) as pool:
            assert pool.health_check() == {url: ["m"]}
            assert [ask(pool, f"q{i}") for i in range(3)] == ["fake answer"] * 3
    host_port = url.removeprefix("https://")
    # one tunnel, kept alive for every request; the requests inside it are TLS the proxy cannot read
    assert proxy.seen == [Seen("CONNECT", host_port, basic("bob", "tunnel pw"))]
    assert proxy.connections == 1 and srv.connections == 1
    assert srv.chat_requests == 3 and srv.recorded[0].authorization == "Bearer sk-tls"


def test_https_without_https_proxy_goes_direct(monkeypatch: pytest.MonkeyPatch,
                                               tls_server: tuple[FakeVLM, str]) -> None:
    srv, url = tls_server
    with LoopbackProxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)  # applies to http:// servers, not this one
        with ServerPool([url], **FAST) as pool:
            assert ask(pool) == "fake answer"
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        with ServerPool([url], **FAST) as pool:
            assert ask(pool) == "fake answer"
    assert proxy.seen == [] and srv.chat_requests == 2


@pytest.mark.parametrize("refuse,credentials,needle", [
    (403, None, "NO_PROXY"), (None, ("bob", "pw"), "USER:PASSWORD"),
], ids=["forbidden", "needs-credentials"])
def test_refused_connect_fails_at_once_naming_the_proxy(
        monkeypatch: pytest.MonkeyPatch, tls_server: tuple[FakeVLM, str], refuse: int | None,
        credentials: tuple[str, str] | None, needle: str) -> None:
    srv, url = tls_server
    with LoopbackProxy(refuse=refuse, credentials=credentials) as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        with ServerPool([url], retries=3, **FAST) as pool:
            with pytest.raises(RequestFailed) as ei:
                ask(pool)
            with pytest.raises(ServerUnavailable) as health:
                pool.health_check()
    s = one_line(ei.value)
    status = str(refuse or 407)
    assert f"{url} via proxy {proxy.url}" in s and f"refused CONNECT {url.removeprefix('https://')}" in s
    assert status in s and needle in s
    assert ei.value.attempts == 1 and not ei.value.transient
    assert proxy.url in one_line(health.value) and status in str(health.value)
    assert srv.connections == 0


def test_connect_to_an_unreachable_server_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    server = dead_url().replace("http://", "https://")
    with LoopbackProxy() as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        with ServerPool([server], retries=1, **FAST) as pool, pytest.raises(RequestFailed) as ei:
            ask(pool)
    s = one_line(ei.value)
    assert f"via proxy {proxy.url}" in s and "502" in s and ei.value.attempts == 2 and ei.value.transient


# ---------------------------------------------------------------------------- settings, no sockets

def test_no_proxy_matching() -> None:
    s = ProxySettings.from_environment({
        "NO_PROXY": "localhost, .corp.example *.b.org,10.0.0.0/8,host:8000,[::1]:9,fd00::1,,"})
    cases = {
        ("localhost", 1): True, ("a.corp.example", 1): True, ("corp.example", 1): True,
        ("xcorp.example", 1): False, ("c.b.org", 1): True, ("10.2.3.4", 1): True, ("11.0.0.1", 1): False,
        ("host", 8000): True, ("host", 8001): False, ("::1", 9): True, ("::1", 10): False,
        ("fd00::1", 5): True, ("LOCALHOST", 1): True, ("127.0.0.1", 1): False,
    }
    assert {k: s.bypasses(*k) for k in cases} == cases
    assert ProxySettings.from_environment({"no_proxy": "*"}).bypasses("anything", 1)


def test_proxy_settings_from_the_environment() -> None:
    env = {"HTTP_PROXY": "http://h:1", "https_proxy": "proxy.example:3128", "HTTPS_PROXY": "http://other:2"}
    s = ProxySettings.from_environment(env)
    assert (s.http, s.https, s.no_proxy) == ("http://h:1", "proxy.example:3128", ())
    assert s.proxy_url_for("https", "server", 443) == "proxy.example:3128"
    assert s.proxy_url_for("http", "server", 80) == "http://h:1"
    p = Proxy.parse("proxy.example:3128")  # no scheme: http://
    assert (p.host, p.port, p.display, p.authorization) == ("proxy.example", 3128, "http://proxy.example:3128", None)
    p = Proxy.parse("http://us%40er:pa%3Ass@h")
    assert (p.port, p.display, p.password) == (80, "http://h", "pa:ss")
    assert p.authorization == basic("us@er", "pa:ss") and "pa:ss" not in repr(p)
