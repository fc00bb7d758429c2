"""Client for a pool of OpenAI-compatible chat-completion servers (vLLM, OpenRouter, ...).

One `ServerPool` per process. It owns a keep-alive connection pool per server, spreads requests
over the servers by load, caps the requests in flight, retries transient failures, and keeps
per-server usage accounting. It knows nothing about questions or scoring: a wrong answer is an
answer, and is never retried.

Only a real answer is an answer: every reply passes one gate (`wire.read_completion`, where
the rules are) before anything else sees it. A reply without an answer is a transient
failure: retried (on another server when there is one), then a RequestFailed naming the
server and the reason, never an Answer. The wire format lives in `engine/wire.py`, the
failure types and their advice in `engine/failures.py`; this module is the pool: slots,
retries, servers up and down, accounting.

Bounded requests. `timeout` is the deadline of each attempt as a whole (connect, send, the
reply's headers and body), so a server that trickles its reply or sends it without end fails
at the deadline. A reply body over `max_reply_bytes` fails at once, without a retry: at
temperature 0 the same request would run away again, and each try costs the cap in memory
and transfer. An answer's text is clipped to `max_text_chars` (`Answer.clipped` says so), so
one runaway answer cannot bloat the store or the reports.

Servers up and down. Only a connection that cannot be made (refused, unreachable, no
connection within `connect_timeout`) marks a server down, and a server that is down gets a
growing pause between probes; a connection reset after the request went out, a timeout or an
HTTP error is retried without pausing the server. `on_state_change(server, up, reason)` is
called once on each transition (down when first refused, up at its next answer), in order,
from the thread of the request that saw it; `server_states()` and `last_answer_at()` tell a
watchdog how the servers are doing.

A fleet that changes. `set_servers(urls)` makes the fleet these servers from now on, and a
pool given a `FileFleet` (`--servers @FILE`, engine/fleetfile.py) calls it from its control
thread when the file changes (it stats the file about once a second). A new server gets the
start-up check (GET /v1/models, and it must list the model the run asks for) on a thread of
its own, retried with a growing pause while it fails, and joins with a fresh limit; a removed
server gets no new request, its requests in flight finish and their answers count, and its
counters stay in `usage()` (the reports' traffic table) and `totals()` (the progress line's
retries): a run's counts never drop when a server leaves. A removal that would leave no server
serving waits until a listed one has joined. `on_notice(line)` gets one line per change.

The file is over 500 lines because ServerPool is one state machine under one lock: slot
choice, retries, servers up and down, servers joining and leaving, limits and counters all
read and write the same
`_Server` records, and the snapshots it hands out (ServerCounters, ServerState, ServerLoad)
are those records' public faces.
"""

from __future__ import annotations

import base64
import contextlib
import math
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pytest_satbench.core.records import ServerTraffic
from pytest_satbench.engine.concurrency import ConcurrencySpec
from pytest_satbench.engine.config import config_default
from pytest_satbench.engine.failures import (
    PROXY_ADVICE,
    AttemptFailed,
    ModelMismatch,
    RequestFailed,
    ServerUnavailable,
    final_advice,
    health_failure,
    transport_failure,
)
from pytest_satbench.engine.fleetfile import FileFleet
from pytest_satbench.engine.limits import EngineMetrics, Limiter, LimitPoint
from pytest_satbench.engine.transport import (
    Connections,
    ProxySettings,
    TransportError,
)
from pytest_satbench.engine.wire import (
    ModelCard,
    chat_payload,
    read_completion,
    read_model_list,
)

__all__ = [
    "MAX_REPLY_BYTES",
    "MAX_TEXT_CHARS",
    "Answer",
    "ServerCounters",
    "ServerLoad",
    "ServerPool",
    "ServerState",
]

# Defaults of ServerPool's caps: a reply body (bytes) and an answer's stored text (characters).
MAX_REPLY_BYTES = config_default("max_reply_bytes")
MAX_TEXT_CHARS = config_default("max_answer_chars")
# The control thread's period: limits move at most this often, /metrics is read this often.
CONTROL_PERIOD_S = 0.25
# A /metrics page slower than this is skipped for this tick (the limiter holds).
METRICS_TIMEOUT_S = 2.0
# Health checks are a GET of a tiny list; a server that cannot answer it in this time is not
# ready, whatever --request-timeout says.
HEALTH_TIMEOUT_S = 60.0
# A server file is stat'ed this often (from the control thread); a new server that fails its
# health check is checked again after 1 s, doubling up to this.
FLEET_POLL_S = 1.0
JOIN_RETRY_MAX_S = 30.0


@dataclass(frozen=True, slots=True)
class Answer:
    """One answer, as the reply gate read it (engine/wire.py), with how it was got."""

    text: str  # choices[0].message.content ("" when it stopped for length first), clipped to max_text_chars
    finish_reason: str | None
    model: str  # model id in the response body, maybe an allowed alias (fallback: requested model)
    server: str  # base URL that answered
    latency_s: float  # of the successful attempt
    prompt_tokens: int | None
    completion_tokens: int | None
    cost: float | None  # usage.cost when the server reports it (OpenRouter)
    attempts: int
    clipped: bool = False  # the text was longer than max_text_chars and is its first max_text_chars
    reasoning_chars: int | None = None  # what the model spent thinking (reasoning_content), in characters
    reasoning: str | None = None  # the thinking itself (engine/wire.py), clipped to max_text_chars
    reasoning_tokens: int | None = None  # the reasoning tokens the server reported
    usage_dropped: int = 0  # usage values the gate dropped (not finite non-negative numbers)
    repaired: bool = False  # the text held lone surrogates, replaced with U+FFFD (engine/wire.py)


@dataclass(frozen=True, slots=True)
class ServerCounters(ServerTraffic):
    """Snapshot of what the client counted of one server (`ServerTraffic`, the one counters
    record: attempts, answers, failures, retries, dropped usage values, resent requests) and
    how it limited it. Tokens, costs, models and latencies per server are the reports' (from
    the stored rows, `core.usage`), not counted twice here."""

    limit: int | None = None  # its in-flight limit now
    limit_history: tuple[LimitPoint, ...] = field(default=(), repr=False)  # each change
    max_in_flight: int = 0  # the most it had in flight at once
    steered_by: str = ""  # "metrics", "latency" or "fixed": what set its limit


@dataclass(frozen=True, slots=True)
class ServerState:
    """How one server is doing now (ServerPool.server_states). Times are time.monotonic()."""

    server: str
    up: bool  # False from a refused connection until its next answer
    last_answer_at: float | None  # its last answer; None if none yet
    last_error: str | None  # the reason of its last failed attempt, one line, no credentials
    last_error_at: float | None
    failures_in_a_row: int  # failed attempts since its last answer, of any kind


@dataclass(frozen=True, slots=True)
class ServerLoad:
    """One server's load now (ServerPool.loads): cheap enough to read every second. Load
    only: the counters, which must outlive a server that leaves the fleet, are `usage()`'s
    and `totals()`'s."""

    server: str
    up: bool
    in_flight: int
    limit: int
    leaving: bool = False  # removed from the fleet: only its requests in flight finish there


def _normalise_url(url: str) -> str:
    """Base URL without a trailing slash or /v1: OpenAI SDK users habitually write .../v1."""
    u = url.strip().rstrip("/").removesuffix("/v1")
    parts = urlsplit(u)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"server URL {_display(url)!r} is not an http(s) base URL; "
                         "write it like http://127.0.0.1:8000")
    return u


def _display(url: str) -> str:
    """The URL without user:password@, for messages."""
    try:
        p = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if p.username is None and p.password is None:
        return url
    host = p.hostname or ""
    netloc = f"{host}:{p.port}" if p.port else host
    return urlunsplit((p.scheme, netloc, p.path, p.query, p.fragment))


@dataclass(eq=False, slots=True)
class _Server:
    url: str  # for connecting only: it may carry user:password@
    name: str  # the URL as shown everywhere (answers, usage, errors)
    conns: Connections
    limiter: Limiter  # its in-flight limit
    route: str = ""  # how failures name it: the name, plus the proxy it is reached through
    in_flight: int = 0
    max_in_flight: int = 0
    metrics: bool | None = None  # serves vLLM /metrics; None: not asked yet
    not_before: float = 0.0  # monotonic time before which no attempt goes here
    consecutive_failures: int = 0  # refused connections, drives the cool-down
    models: list[str] | None = None
    cards: dict[str, ModelCard] = field(default_factory=dict)  # what /v1/models says of each
    # state, for on_state_change and server_states()
    down: bool = False
    down_since: float = 0.0
    last_answer_at: float | None = None
    last_error: str | None = None
    last_error_at: float | None = None
    failures_in_a_row: int = 0
    # accounting
    requests: int = 0
    answered: int = 0
    failures: int = 0
    retries: int = 0
    usage_dropped: int = 0
    # the fleet (set_servers): False while a new server's health check has not passed
    joined: bool = True
    retired: bool = False  # no longer listed: no new request
    checking: bool = False  # a health-check thread is running for it
    held_said: bool = False  # "no longer listed, but serving until a listed one joins" was said
    limits_from: float = 0.0  # when its limiter started, in seconds after the pool's (it joined then)

    @property
    def serving(self) -> bool:
        return self.joined and not self.retired


class ServerPool:
    """Thread-safe pool of OpenAI-compatible servers. See the module docstring.

    `timeout`: the deadline of one attempt, whole (s); `connect_timeout`: of its connect.
    `max_reply_bytes`: the cap on a reply body; `max_text_chars`: the cap on Answer.text.
    `model_aliases`: model ids a reply may name instead of the one asked for (a str is read
    as a comma-separated list); the Answer keeps the id the reply named.
    `on_state_change(server, up, reason)`: called once per down/up transition of a server.
    `names`: how the servers are named in answers, usage and errors, in `urls` order (default:
    the URL without credentials); a server on a port of the day keeps one name across runs.
    `concurrency`: a ConcurrencySpec (default: adaptive per-server limits, engine.concurrency);
    an int is a fixed cap on the whole pool, shared by fewest in flight.
    `fleet`: the server file to follow (engine/fleetfile.py); `on_notice(line)`: called with
    one line per change of the fleet (a server joining or leaving, a bad line of the file).
    """

    def __init__(self, urls: Sequence[str], *, timeout: float = config_default("request_timeout"),
                 retries: int = config_default("retries"),
                 concurrency: ConcurrencySpec | int = ConcurrencySpec(), api_key: str | None = None,
                 backoff_base: float = 0.5, backoff_max: float = 30.0,
                 connect_timeout: float = 10.0, proxies: ProxySettings | None = None,
                 max_reply_bytes: int = MAX_REPLY_BYTES, max_text_chars: int = MAX_TEXT_CHARS,
                 model_aliases: Iterable[str] = frozenset(),
                 on_state_change: Callable[[str, bool, str], None] | None = None,
                 names: Sequence[str] | None = None, fleet: FileFleet | None = None,
                 on_notice: Callable[[str], None] | None = None) -> None:
        if isinstance(urls, str):
            urls = [u for u in urls.split(",") if u.strip()]
        if not urls:
            raise ValueError("no servers given; pass --servers http://HOST:PORT[,http://HOST:PORT...]")
        if isinstance(concurrency, int):
            concurrency = ConcurrencySpec(total=concurrency, adaptive=False)
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        if timeout <= 0 or connect_timeout <= 0:
            raise ValueError("timeouts must be > 0 seconds")
        if max_reply_bytes < 1 or max_text_chars < 1:
            raise ValueError("max_reply_bytes and max_text_chars must be >= 1")
        if isinstance(model_aliases, str):
            model_aliases = [a for a in model_aliases.split(",") if a.strip()]
        norm = [_normalise_url(u) for u in urls]
        dup = [u for u, n in Counter(norm).items() if n > 1]
        if dup:
            raise ValueError(f"server {_display(dup[0])} is listed twice in --servers; list each once")
        self.timeout = float(timeout)
        self.connect_timeout = float(connect_timeout)
        self.retries = int(retries)
        self.concurrency = concurrency
        self.backoff_base = float(backoff_base)
        self.backoff_max = float(backoff_max)
        self.max_reply_bytes = int(max_reply_bytes)
        self.max_text_chars = int(max_text_chars)
        self.model_aliases = frozenset(a.strip() for a in model_aliases)
        self.on_state_change = on_state_change
        self._api_key = api_key or None
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        # The proxy environment is read once, here: every server routes by the same snapshot.
        proxies = ProxySettings.from_environment() if proxies is None else proxies
        # One keep-alive pool per server: connections are reused instead of opening one per
        # request (the seed did). Nothing below retries a request the server may have
        # received: we decide what is retried (the transport only sends again a request that
        # a reused connection dropped before it got in).
        if names is not None and len(names) != len(norm):
            raise ValueError(f"{len(names)} server names for {len(norm)} servers")
        shown = list(names) if names is not None else [_display(u) for u in norm]
        started = time.monotonic()
        self._headers, self._proxies, self._started = headers, proxies, started
        self._secrets = [self._api_key] if self._api_key else []
        # replaced, never changed in place, when servers join: a loop over it needs no lock
        self._servers = [self._new_server(u, name, started) for u, name in zip(norm, shown, strict=True)]
        self._lock = threading.Lock()
        self._slot_freed = threading.Condition(self._lock)  # a request ended or a limit rose
        self._fleet = fleet
        self._source = f"--servers @{fleet.path}" if fleet is not None else "the server list"
        self._wanted = set(norm)  # the servers listed now
        self.on_notice = on_notice
        self._model: str | None = None  # what resolve_model settled on: a joining server must list it
        self._total_cap = concurrency.total_cap
        self._in_flight = 0
        self._peak_in_flight = 0
        self._control: threading.Thread | None = None
        self._control_stop = threading.Event()
        self._rr = 0
        self._closed = False
        self._model_swap: tuple[str, str] | None = None  # see model_swap()
        self._last_answer_at: float | None = None
        # State changes, queued in the order they happened (under _lock) and delivered in that
        # order (under _notify_lock), outside _lock so that a callback may call back in.
        self._events: deque[tuple[str, bool, str]] = deque()
        self._notify_lock = threading.RLock()  # a callback that asks must not deadlock

    # ------------------------------------------------------------------ setup
    def _new_server(self, url: str, name: str, now: float) -> _Server:
        srv = _Server(url=url, name=name, limiter=self.concurrency.limiter(now), conns=Connections(
            url, connect_timeout=self.connect_timeout, read_timeout=self.timeout, headers=self._headers,
            proxies=self._proxies, max_body=self.max_reply_bytes))
        proxy = srv.conns.proxy
        srv.route = srv.name if proxy is None else f"{srv.name} via proxy {proxy.display}"
        # A very short password would also match ordinary words of the message.
        if proxy is not None and proxy.password and len(proxy.password) >= 6 and proxy.password not in self._secrets:
            self._secrets.append(proxy.password)
        if not self.concurrency.metrics:
            srv.metrics = False
        return srv

    def __repr__(self) -> str:
        urls = ", ".join(s.name for s in self._servers)
        key = ", api_key=<set>" if self._api_key else ""
        return f"ServerPool([{urls}], concurrency={self.concurrency.describe()!r}, retries={self.retries}{key})"

    def __enter__(self) -> ServerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def urls(self) -> list[str]:
        """The servers new requests go to, as named in answers, usage and errors (no credentials)."""
        return [s.name for s in self._servers if s.serving]

    def _scrub(self, text: str) -> str:
        """Last line of defence: servers (and proxies) do echo credentials in error bodies."""
        for secret in self._secrets:
            text = text.replace(secret, "<api-key>" if secret == self._api_key else "<password>")
        return text

    # ------------------------------------------------------------------ health and model
    def health_check(self) -> dict[str, list[str]]:
        """GET {url}/v1/models on every server -> {url: model ids}. Raises ServerUnavailable."""
        problems: list[str] = []
        result: dict[str, list[str]] = {}
        proxied = False  # a failure on the way through a proxy that the reason does not explain
        for srv in [s for s in self._servers if s.serving]:
            try:
                ids = self._list_models(srv)
            except AttemptFailed as e:
                problems.append(f"{srv.route} ({e.reason}; {e.advice})" if e.advice
                                else f"{srv.route} ({e.reason})")
                proxied = proxied or (srv.conns.proxy is not None and not e.advice)
                continue
            srv.models = ids
            result[srv.name] = ids
        if problems:
            what = "server fails" if len(problems) == 1 else "servers fail"
            via = f"; if it is the proxy, {PROXY_ADVICE}" if proxied else ""
            raise ServerUnavailable(self._scrub(
                f"{what} the health check GET /v1/models: {'; '.join(problems)}; "
                f"start the server(s) or fix --servers (and the API key for 401/403){via}"))
        return result

    def _list_models(self, srv: _Server) -> list[str]:
        try:
            r = srv.conns.request("GET", "/v1/models", timeout=min(self.timeout, HEALTH_TIMEOUT_S))
        except TransportError as e:
            raise health_failure(e) from None
        srv.cards = read_model_list(r, proxied=srv.conns.proxy is not None)
        return list(srv.cards)

    def resolve_model(self, requested: str | None) -> str:
        """The model to ask for. None: the one model every server lists; given: every server
        must list it. Runs the health check first if it has not run."""
        self._model = self._resolve_model(requested)
        return self._model

    def _resolve_model(self, requested: str | None) -> str:
        live = [s for s in self._servers if s.serving]
        if any(s.models is None for s in live):
            self.health_check()
        listed = {s.name: list(s.models or []) for s in live}

        def show(ids: list[str]) -> str:
            more = f", ... ({len(ids)} in all)" if len(ids) > 5 else ""
            return ", ".join(ids[:5]) + more

        if requested is not None:
            missing = [u for u, ids in listed.items() if requested not in ids]
            if missing:
                u = missing[0]
                raise ModelMismatch(
                    f"model {requested!r} is not served by {u} (it lists: {show(listed[u])}); "
                    "pass a --model every server lists, or drop that server from --servers")
            return requested
        for u, ids in listed.items():
            if len(ids) > 1:
                raise ModelMismatch(
                    f"{u} serves {len(ids)} models ({show(ids)}); pass --model to pick one")
        distinct = {ids[0] for ids in listed.values()}
        if len(distinct) > 1:
            each = "; ".join(f"{u} serves {ids[0]!r}" for u, ids in listed.items())
            raise ModelMismatch(f"servers disagree on the model ({each}); point --servers at servers "
                                "of one model, or pass --model if they share one")
        return distinct.pop()

    def model_card(self, model: str) -> ModelCard | None:
        """What the first server that lists `model` says of it; None when none says anything."""
        for srv in self._servers:
            card = srv.cards.get(model)
            if card is not None and (card.root is not None or card.max_model_len is not None):
                return card
        return None

    # ------------------------------------------------------------------ asking
    def ask(self, *, model: str, prompt: str, image_jpeg: bytes | None, max_tokens: int,
            temperature: float = 0.0, image_b64: bytes | None = None, top_p: float | None = None,
            seed: int | None = None, system_prompt: str | None = None,
            extra_body: Mapping[str, Any] | None = None) -> Answer:
        """One chat completion, retried on transient failures. Blocking and thread-safe;
        blocks while every server has as many requests in flight as its limit allows.
        image_jpeg=None asks the question without an image (the blind control). `top_p`,
        `seed` (this request's: a repeated sample passes its own), `system_prompt` and
        `extra_body` go into the body as `engine.wire.chat_payload` says; None sends nothing."""
        if self._closed:
            raise RuntimeError("ServerPool is closed")
        if self._control is None:
            self._start_control()
        if image_b64 is None and image_jpeg is not None:
            image_b64 = base64.b64encode(image_jpeg)
        payload = chat_payload(model, prompt, image_b64, max_tokens, temperature, top_p=top_p, seed=seed,
                               system_prompt=system_prompt, extra_body=extra_body)

        tries = 1 + self.retries
        last_failed: _Server | None = None
        failure: AttemptFailed | None = None
        srv: _Server | None = None
        tried: list[str] = []
        for attempt in range(1, tries + 1):
            if attempt > 1:
                # Full jitter: retries from many threads that failed together spread out
                # instead of hitting the server again in lockstep.
                cap = min(self.backoff_max, self.backoff_base * 2 ** (attempt - 2))
                time.sleep(random.uniform(0.0, cap))
            srv = self._acquire(avoid=last_failed)
            if srv.name not in tried:
                tried.append(srv.name)
            try:
                answer = self._attempt(srv, payload, model, attempt)
            except AttemptFailed as e:
                failure = e
                self._record_failure(srv, e)
                if not e.transient:
                    break
                last_failed = srv
                continue
            finally:
                self._release(srv)
            return answer
        assert failure is not None and srv is not None
        advice = final_advice(failure, proxied=srv.conns.proxy is not None)
        n = attempt
        where = f" (on {', '.join(tried)})" if len(tried) > 1 else ""
        msg = (f"{srv.route}: POST /v1/chat/completions failed after {n} "
               f"attempt{'s' if n != 1 else ''}{where}: {failure.reason}; {advice}")
        raise RequestFailed(self._scrub(msg), server=srv.name, attempts=n, status=failure.status,
                            transient=failure.transient)

    def _acquire(self, avoid: _Server | None) -> _Server:
        """Pick a server with room under its limit and count the request in flight there;
        waits while none has room (or every one is cooling down)."""
        with self._slot_freed:
            while True:
                if self._closed:
                    raise RuntimeError("ServerPool is closed")
                now = time.monotonic()
                n = len(self._servers)
                self._rr %= n
                start = self._rr
                self._rr = (self._rr + 1) % n
                best: _Server | None = None
                best_rank: tuple[bool, float, int] | None = None
                soonest = math.inf
                if self._total_cap is None or self._in_flight < self._total_cap:
                    for i, srv in enumerate(self._servers):
                        if not srv.serving:
                            continue  # joining (health check) or left the fleet
                        if srv.not_before > now:
                            soonest = min(soonest, srv.not_before)
                            continue
                        limit = srv.limiter.limit
                        if srv.in_flight >= limit:
                            continue
                        # The emptiest server relative to its own limit: servers fill in
                        # proportion to what each can take, and a slow server, holding its
                        # requests longer, gets fewer new ones. A retry goes elsewhere when
                        # there is an elsewhere.
                        rank = (srv is avoid and n > 1, srv.in_flight / limit, (i - start) % n)
                        if best_rank is None or rank < best_rank:
                            best, best_rank = srv, rank
                if best is not None:
                    best.in_flight += 1
                    best.max_in_flight = max(best.max_in_flight, best.in_flight)
                    self._in_flight += 1
                    self._peak_in_flight = max(self._peak_in_flight, self._in_flight)
                    best.limiter.in_flight_changed(now, best.in_flight)
                    return best
                self._slot_freed.wait(min(soonest - now, 1.0) if soonest < math.inf else 1.0)

    def _release(self, srv: _Server) -> None:
        with self._slot_freed:
            srv.in_flight -= 1
            self._in_flight -= 1
            srv.limiter.in_flight_changed(time.monotonic(), srv.in_flight)
            self._slot_freed.notify()

    def _attempt(self, srv: _Server, payload: bytes, model: str, attempt: int) -> Answer:
        with self._lock:
            srv.requests += 1
            if attempt > 1:
                srv.retries += 1
        t0 = time.monotonic()
        try:
            r = srv.conns.request("POST", "/v1/chat/completions", payload)
        except TransportError as e:
            raise transport_failure(e, connect_timeout=self.connect_timeout, timeout=self.timeout) from None
        latency = time.monotonic() - t0
        got = read_completion(r, model, self.model_aliases, proxied=srv.conns.proxy is not None)
        clipped = len(got.text) > self.max_text_chars
        ans = Answer(
            text=got.text[: self.max_text_chars] if clipped else got.text,
            finish_reason=got.finish_reason,
            model=got.model or model,
            server=srv.name,
            latency_s=latency,
            prompt_tokens=got.prompt_tokens,
            completion_tokens=got.completion_tokens,
            cost=got.cost,
            attempts=attempt,
            clipped=clipped,
            reasoning_chars=got.reasoning_chars,
            reasoning=got.reasoning[: self.max_text_chars] if got.reasoning is not None else None,
            reasoning_tokens=got.reasoning_tokens,
            usage_dropped=got.usage_dropped,
            repaired=got.repaired,
        )
        now = time.monotonic()
        with self._lock:
            srv.answered += 1
            srv.consecutive_failures = 0
            srv.failures_in_a_row = 0
            srv.last_answer_at = self._last_answer_at = now
            if srv.down:
                srv.down = False
                self._events.append((srv.name, True, f"answering again after {now - srv.down_since:.0f} s down"))
            srv.usage_dropped += ans.usage_dropped
            srv.limiter.completed(now, latency)
        if self._events:
            self._notify()
        return ans

    def model_swap(self) -> tuple[str, str] | None:
        """(server, model id) of the first reply that named another model than the one asked
        for (and no allowed alias): the servers were swapped under the run. None otherwise."""
        return self._model_swap

    def _record_failure(self, srv: _Server, e: AttemptFailed) -> None:
        with self._lock:
            if e.other_model is not None and self._model_swap is None:
                self._model_swap = (srv.name, e.other_model)
            srv.failures += 1
            srv.failures_in_a_row += 1
            now = time.monotonic()
            srv.last_error = self._scrub(e.reason)
            srv.last_error_at = now
            if e.retry_after is not None:
                srv.not_before = max(srv.not_before, now + e.retry_after)
            if e.overload:
                srv.limiter.overloaded(now)
            if e.server_down:
                # A refusing server answers instantly, so "fewest in flight" would send it
                # every request; a growing cool-down keeps traffic on the live servers and
                # probes the dead one now and then.
                srv.consecutive_failures += 1
                cool = min(self.backoff_max,
                           self.backoff_base * 2 ** (srv.consecutive_failures - 1))
                srv.not_before = max(srv.not_before, now + cool)
                if not srv.down:
                    srv.down, srv.down_since = True, now
                    self._events.append((srv.name, False, srv.last_error))
        if self._events:
            self._notify()

    def _notify(self) -> None:
        """Deliver queued state changes in the order they happened. A callback that raises
        does not fail the request that saw the change."""
        with self._notify_lock:
            while True:
                with self._lock:
                    if not self._events:
                        return
                    event = self._events.popleft()
                if self.on_state_change is not None:
                    with contextlib.suppress(Exception):  # a reporting hook must not fail a request
                        self.on_state_change(*event)

    # ------------------------------------------------------------------ limits
    def _start_control(self) -> None:
        with self._lock:
            if self._control is not None or self._closed:
                return
            self._control = threading.Thread(target=self._steer, name="satbench-limits", daemon=True)
        self._control.start()

    def _steer(self) -> None:
        """Ticks every server's limiter, with its /metrics when it serves them; follows the
        server file, when there is one."""
        while not self._control_stop.wait(CONTROL_PERIOD_S):
            if self._fleet is not None:
                with contextlib.suppress(Exception):  # a file that cannot be followed keeps the fleet
                    changed = self._fleet.poll(every_s=FLEET_POLL_S)
                    if changed is not None:
                        self.set_servers(changed)
            for srv in self._servers:
                if srv.down or not srv.serving:
                    continue  # its cool-down probes it; the limit waits for its answers
                metrics = None
                if srv.metrics is not False:
                    metrics = self._scrape(srv)
                    if metrics is None and srv.metrics:
                        continue  # a missed scrape of a server with metrics: hold its limit
                with self._slot_freed:
                    before = srv.limiter.limit
                    srv.limiter.tick(time.monotonic(), metrics)
                    if srv.limiter.limit > before:
                        self._slot_freed.notify_all()

    def _scrape(self, srv: _Server) -> EngineMetrics | None:
        """The server's vLLM metrics now; None when it has none (then never asked again) or
        this scrape failed (asked again next tick)."""
        from pytest_satbench.engine import metrics

        try:
            r = srv.conns.request("GET", "/metrics", timeout=min(self.timeout, METRICS_TIMEOUT_S),
                                  max_body=4 * 2**20)
        except TransportError:
            return None
        found = metrics.parse(r.body.decode("utf-8", "replace"), None) if r.status == 200 else None
        if srv.metrics is None:
            srv.metrics = found is not None
        return found

    def loads(self) -> list[ServerLoad]:
        """Each server's in flight and limit now, in --servers order (a server that left the
        fleet while its requests are still in flight too, marked `leaving`)."""
        with self._lock:
            return [ServerLoad(s.name, not s.down, s.in_flight, s.limiter.limit, leaving=not s.serving)
                    for s in self._servers if s.serving or s.in_flight]

    def limits(self) -> dict[str, int]:
        """Each serving server's in-flight limit now."""
        with self._lock:
            return {s.name: s.limiter.limit for s in self._servers if s.serving}

    def max_in_flight(self) -> int:
        """The most this pool can have in flight now (what a caller should keep queued)."""
        with self._lock:
            room = sum(s.limiter.limit for s in self._servers if s.serving)
        return room if self._total_cap is None else min(room, self._total_cap)

    def peak_in_flight(self) -> int:
        """The most requests this pool has had in flight at once, over all servers."""
        return self._peak_in_flight

    def max_possible_in_flight(self) -> int:
        """The most it could ever have in flight (the caps): threads to provision. A pool that
        follows a server file counts on twice the servers it has (at least two more): servers
        may join, and threads are started only as they are needed."""
        n = sum(1 for s in self._servers if s.serving)
        if self._fleet is not None:
            n = max(2 * n, n + 2)
        room = n * self.concurrency.server_cap
        return room if self._total_cap is None else min(room, self._total_cap)

    # ------------------------------------------------------------------ state
    def last_answer_at(self) -> float | None:
        """time.monotonic() of the last answer from any server; None before the first."""
        return self._last_answer_at

    def server_states(self) -> dict[str, ServerState]:
        """Per server: up or down, its last answer and its last error (cheap, thread-safe)."""
        with self._lock:
            return {
                s.name: ServerState(server=s.name, up=not s.down, last_answer_at=s.last_answer_at,
                                    last_error=s.last_error, last_error_at=s.last_error_at,
                                    failures_in_a_row=s.failures_in_a_row)
                for s in self._servers if s.serving
            }

    # ------------------------------------------------------------------ accounting
    def _counted(self) -> list[_Server]:
        """The servers whose counters are the run's (under _lock): every one that served or
        joined, those that left the fleet too. The one rule behind `usage()` and `totals()`:
        a run's counts never drop when a server leaves."""
        return [s for s in self._servers if s.joined or s.requests]

    def totals(self) -> ServerTraffic:
        """The counters summed over `_counted()` servers (the progress line's retries): they
        only grow, whatever the fleet does. Cheap enough to read every second."""
        total = ServerTraffic("", 0, 0, 0, 0)
        with self._lock:
            for s in self._counted():
                total += ServerTraffic("", s.requests, s.answered, s.failures, s.retries,
                                       s.usage_dropped, s.conns.resent)
        return total

    def usage(self) -> dict[str, ServerCounters]:
        """Per server, its counters and limits (the reports' traffic table): `_counted()`."""
        with self._lock:
            return {
                s.name: ServerCounters(
                    server=s.name, requests=s.requests, answered=s.answered, failures=s.failures,
                    retries=s.retries, usage_dropped=s.usage_dropped, resent=s.conns.resent,
                    limit=s.limiter.limit, limit_history=_history(s), max_in_flight=s.max_in_flight,
                    steered_by=_steered_by(s, self.concurrency),
                )
                for s in self._counted()
            }

    def close(self) -> None:
        with self._slot_freed:
            self._closed = True
            self._slot_freed.notify_all()
        self._control_stop.set()
        if self._control is not None and self._control is not threading.current_thread():
            self._control.join(timeout=5)
        for s in self._servers:
            s.conns.close()


    # ------------------------------------------------------------------ a fleet that changes
    def set_servers(self, urls: Sequence[str]) -> None:
        """The fleet is these servers from now on. A new one joins once it passes the start-up
        health check (on a thread of its own); one no longer listed gets no new request once
        a listed server serves. Raises ValueError for a URL that is not an http(s) base URL."""
        norm = list(dict.fromkeys(_normalise_url(u) for u in urls))
        if not norm:
            raise ValueError("set_servers: no server given")
        notices: list[str] = []
        joining: list[_Server] = []
        with self._slot_freed:
            if self._closed:
                return
            self._wanted = set(norm)
            by_url = {s.url: s for s in self._servers}
            now = time.monotonic()
            for u in norm:
                srv = by_url.get(u)
                if srv is None:
                    srv = self._new_server(u, _display(u), now)
                    srv.joined = False
                    self._servers = [*self._servers, srv]
                elif srv.retired:  # listed again: checked again, and a fresh limit
                    srv.retired, srv.joined = False, False
                elif srv.joined or srv.checking:
                    continue
                srv.checking = True
                joining.append(srv)
            notices += self._reconcile()
            self._slot_freed.notify_all()
        self._say_all(notices)
        for srv in joining:
            threading.Thread(target=self._join, args=(srv,), name="satbench-join", daemon=True).start()

    def _reconcile(self, say_held: bool = False) -> list[str]:
        """Retire the serving servers that are no longer listed, once a listed one serves
        (under _lock); returns the lines to say (with `say_held`, once, that unlisted servers
        keep serving)."""
        if not any(s.serving and s.url in self._wanted for s in self._servers):
            if not say_held:
                return []
            held = [s for s in self._servers if s.serving and s.url not in self._wanted and not s.held_said]
            for s in held:
                s.held_said = True
            return [f"{self._source}: no listed server has passed its health check yet: "
                    f"{', '.join(s.name for s in held)} keep(s) serving until one does"] if held else []
        out = []
        for s in self._servers:
            if s.serving and s.url not in self._wanted:
                s.retired, s.held_said = True, False
                out.append(f"{self._source}: server {s.name} left the fleet: no new request goes to it"
                           + (f"; its {s.in_flight} request(s) in flight finish" if s.in_flight else ""))
        return out

    def _join(self, srv: _Server) -> None:
        """Health-check a listed server until it passes (it joins), leaves the list, or the
        pool closes."""
        delay, said = 1.0, None
        while True:
            with self._lock:
                if self._closed or srv.url not in self._wanted:
                    srv.checking = False
                    return
            try:
                ids = self._list_models(srv)
                problem = None
                if self._model is not None and self._model not in ids:
                    shown = ", ".join(ids[:5]) + (f", ... ({len(ids)} in all)" if len(ids) > 5 else "")
                    problem = f"it does not serve model {self._model!r} (it lists: {shown or 'nothing'})"
            except AttemptFailed as e:
                problem = f"{e.reason}; {e.advice}" if e.advice else e.reason
            except Exception as e:  # noqa: BLE001 (the pool closed under it, a bug): not this thread's to raise
                problem = f"{type(e).__name__}: {e}"
            if self._closed:
                srv.checking = False
                return
            if problem is None:
                with self._slot_freed:
                    if self._closed or srv.url not in self._wanted:
                        srv.checking = False
                        return
                    srv.models = ids
                    now = time.monotonic()
                    srv.limiter = self.concurrency.limiter(now)  # a fresh limit
                    srv.limits_from = now - self._started
                    srv.joined, srv.checking = True, False
                    srv.down, srv.not_before, srv.consecutive_failures = False, 0.0, 0
                    notices = [f"{self._source}: server {srv.name} joined the fleet "
                               f"(health check passed{f', serves {self._model!r}' if self._model else ''})"]
                    notices += self._reconcile()
                    self._slot_freed.notify_all()
                self._say_all(notices)
                return
            if problem != said:
                said = problem
                lines = [f"{self._source}: server {srv.route} fails the health check GET /v1/models "
                         f"({problem}); it gets no request, checked again every {JOIN_RETRY_MAX_S:.0f} s "
                         "at most until it passes or leaves the list"]
                with self._lock:
                    lines += self._reconcile(say_held=True)
                self._say_all(lines)
            if self._control_stop.wait(delay):
                with self._lock:
                    srv.checking = False
                return
            delay = min(JOIN_RETRY_MAX_S, delay * 2)

    def _say_all(self, lines: list[str]) -> None:
        if self.on_notice is None:
            return
        for line in lines:
            with contextlib.suppress(Exception):  # a reporting hook must not fail the fleet
                self.on_notice(self._scrub(line))


def _history(srv: _Server) -> tuple[LimitPoint, ...]:
    """Its limits over time, in seconds after the pool started (a server that joined later
    has a limiter that started then)."""
    points = srv.limiter.history
    if not srv.limits_from:
        return points
    return tuple(LimitPoint(round(p.t + srv.limits_from, 3), p.limit, p.why) for p in points)


def _steered_by(srv: _Server, spec: ConcurrencySpec) -> str:
    if not spec.adaptive:
        return "fixed"
    return "metrics" if srv.metrics else "latency"
