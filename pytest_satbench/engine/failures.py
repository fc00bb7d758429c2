"""Why a request to a server failed, and what to tell the user about it.

The client's failures in one place: what a caller may catch (`RequestFailed`,
`ServerUnavailable`, `ModelMismatch`), the verdict on one failed attempt (`AttemptFailed`:
is another try worth it, does it mark the server down, does it say the server is
overloaded), and the advice each kind of failure ends with. Every message is one line, and
it holds only text a terminal, a JSON report and the store can all take (`one_line`): a
server's own words are quoted in it, and servers send anything.
"""

from __future__ import annotations

import re

from pytest_satbench.engine.transport import TransportError

__all__ = [
    "PROXY_ADVICE",
    "PROXY_AUTH_ADVICE",
    "AttemptFailed",
    "ModelMismatch",
    "RequestFailed",
    "ServerUnavailable",
    "final_advice",
    "health_failure",
    "one_line",
    "proxy_failure",
    "transport_failure",
]

SNIPPET = 200  # characters of a server's error message quoted in our one-line errors
PROXY_ADVICE = ("check HTTPS_PROXY / HTTP_PROXY (an http://[USER:PASSWORD@]HOST:PORT URL), "
                "or add the server to NO_PROXY")
PROXY_AUTH_ADVICE = ("the proxy wants credentials: put them in the proxy URL, "
                     "HTTPS_PROXY / HTTP_PROXY=http://USER:PASSWORD@HOST:PORT")
_NO_ANSWER_ADVICE = "the server replied without an answer; check its log, or raise --retries"
# A lone UTF-16 surrogate (JSON's "\ud800") is a str character that no UTF-8 encoder takes:
# quoted as is, it would crash the store's writer or the terminal.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class RequestFailed(Exception):
    """A chat request that did not produce an answer. str() is one line.

    `transient` is True when the request gave up on failures that might pass (server down,
    overloaded, timeouts, a 200 without an answer); False when the same request would fail
    the same way again (a 4xx refusal, a reply over the size cap).
    """

    def __init__(self, message: str, *, server: str, attempts: int, status: int | None,
                 transient: bool) -> None:
        super().__init__(message)
        self.server = server
        self.attempts = attempts
        self.status = status
        self.transient = transient


class ServerUnavailable(Exception):
    """A server failed its health check. str() is one line naming the server."""


class ModelMismatch(Exception):
    """The servers do not serve one common model, or not the one asked for. One line."""


class AttemptFailed(Exception):
    """One failed attempt, inside the client. `transient` decides whether another try is
    worth it; `server_down` (a connection that could not be made) pauses the server;
    `overload` (429, 503, 504, a timeout) lowers its in-flight limit."""

    def __init__(self, reason: str, *, transient: bool, status: int | None = None,
                 retry_after: float | None = None, server_down: bool = False,
                 advice: str | None = None, other_model: str | None = None,
                 overload: bool = False) -> None:
        super().__init__(reason)
        self.overload = overload  # the server says it has more than it can take
        self.other_model = other_model  # the reply named this model, not the one asked for
        self.reason = reason
        self.transient = transient
        self.status = status
        self.retry_after = retry_after
        self.server_down = server_down
        self.advice = advice  # what to do, when it is not the server's doing (a proxy's)

    @classmethod
    def no_answer(cls, what: str, *, status: int = 200, advice: str = _NO_ANSWER_ADVICE,
                  other_model: str | None = None) -> AttemptFailed:
        """A reply that holds no answer: a proxy or server hiccup (a truncated body, an HTML
        error page, an error object, a generation that produced nothing, bytes that are not
        text). It says nothing about the question, so it is retried."""
        return cls(f"HTTP {status} but {what}", transient=True, status=status, advice=advice,
                   other_model=other_model)


def one_line(text: object, limit: int = SNIPPET) -> str:
    """`text` on one line of at most `limit` characters, lone surrogates replaced by U+FFFD."""
    s = " ".join(str(text).split())
    if not s.isascii():
        s = _LONE_SURROGATE.sub("\ufffd", s)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def transport_failure(e: TransportError, *, connect_timeout: float, timeout: float) -> AttemptFailed:
    """The verdict on a chat attempt that got no complete reply."""
    if e.kind == "proxy":
        return proxy_failure(e)
    if e.kind == "connect-timeout":
        return AttemptFailed(f"timed out (no connection within {connect_timeout:g} s)",
                             transient=True, server_down=True)
    if e.kind == "connect":  # refused or unreachable: the only failure that marks it down
        return AttemptFailed(f"connection failed ({one_line(e)})", transient=True, server_down=True)
    if e.kind == "timeout":
        return AttemptFailed(f"timed out (no complete reply within --request-timeout {timeout:g} s: "
                             f"{e.detail})", transient=True, overload=True)
    if e.kind == "too-large":
        return AttemptFailed(f"reply too large ({one_line(e)})", transient=False, status=e.status,
                             advice="a chat reply this large is a runaway (an endless or unbounded body); "
                                    "check the server, or raise --max-reply-bytes")
    if e.kind == "encoding":  # every reply will come the same way: asking again only costs
        return AttemptFailed(one_line(e), transient=False, status=e.status,
                             advice="have the server (or the proxy in front of it) send replies "
                                    "uncompressed, gzip or deflate")
    if e.kind == "corrupt":
        return AttemptFailed.no_answer(f"a body that does not decode ({one_line(e)})", status=e.status or 200)
    if e.kind == "cut-off":
        return AttemptFailed(f"response cut off ({one_line(e)})", transient=True)
    # reset after the request went out, or not HTTP: retried, and the server is not paused
    # (a reset mid-body says nothing about the next request: it is not a refusal)
    return AttemptFailed(f"connection failed ({one_line(e)})", transient=True)


def health_failure(e: TransportError) -> AttemptFailed:
    """The verdict on a health check (GET /v1/models) that got no complete reply."""
    if e.kind == "proxy":
        return proxy_failure(e)
    if e.kind in ("timeout", "connect-timeout"):
        return AttemptFailed("timed out", transient=True)
    return AttemptFailed(one_line(e), transient=e.kind not in ("too-large", "encoding"))


def proxy_failure(e: TransportError) -> AttemptFailed:
    """The proxy refused the tunnel, or its URL is unusable. Refusals it might lift (5xx: it
    cannot reach the server just now) are retried; a 403 or 407 would only be refused again."""
    status = e.status
    if status is None:
        return AttemptFailed(one_line(e), transient=False, advice=PROXY_ADVICE)
    if status == 407:
        return AttemptFailed(one_line(e), transient=False, status=status, advice=PROXY_AUTH_ADVICE)
    transient = status >= 500 or status in (408, 429)
    return AttemptFailed(one_line(e), transient=transient, status=status, server_down=transient,
                         advice=None if transient else PROXY_ADVICE)


def final_advice(failure: AttemptFailed, *, proxied: bool) -> str:
    """What to do, at the end of a request's last failed attempt."""
    if failure.advice:
        return failure.advice
    if failure.transient and failure.server_down and proxied:
        return "the server or the proxy is down; " + PROXY_ADVICE
    if failure.transient:
        return "the server is down, overloaded or too slow; check it, or raise --retries / --request-timeout"
    if failure.status in (401, 403):
        advice = "check the API key (OPENAI_API_KEY / SATBENCH_API_KEY)"
        if proxied:  # a forward proxy's refusal looks the same
            advice += "; if the proxy refused it, " + PROXY_ADVICE
        return advice
    if failure.status == 404:
        return "check --model and the server URL"
    return "the server refused this request; check --model and --max-new against the server"
