"""HTTP client cost: the plugin's transport against urllib3 (and requests), side by side.

    .venv/bin/python performance/http_client.py                   # 4000 requests per run, 5 reps
    .venv/bin/python performance/http_client.py --requests 10000 --concurrency 1,64 --reps 3

Every side POSTs the same chat-completion body (a ~24 kB base64 image, as the plugin sends)
to the same zero-latency loopback server in its own process (performance/throughput.py's FakeVLM,
answering "yes"), from `concurrency` threads, each on its own keep-alive connection, and
reads the whole answer. Sides:

- http.client: `pytest_satbench.engine.transport.Connections`, what the plugin ships;
- urllib3: the same calls written on urllib3 as well as it allows: one connection pool
  taken once, `urlopen(method, path)` with retries and redirects off and the body preloaded
  (what a transport built on urllib3 would do);
- requests.Session: for reference, when requests is installed (it runs on urllib3).

What is measured is the client's CPU per request (user+sys of this process, all threads,
from getrusage), the number that bounds a GIL-bound client at hundreds of questions per
second; requests/s is shown too, but against a Python server on a 2-core machine it mostly
measures the server. Runs alternate sides and the order rotates every repetition; a fresh
server per run; the table shows medians and per-repetition ratios to http.client.
Results go to performance/out/http_client.json.
"""

from __future__ import annotations

import argparse
import base64
import os
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol

from _measure import write_result  # performance/ is on sys.path when run as a script
from _server import ZeroLatencyServer as Server
from throughput import OUT

try:
    import urllib3
except ImportError:  # not a dependency of the plugin: only this comparison needs it
    raise SystemExit("performance/http_client.py compares against urllib3: .venv/bin/pip install urllib3") from None

from pytest_satbench.engine.transport import Connections
from pytest_satbench.engine.wire import chat_payload

PATH = "/v1/chat/completions"
HEADERS = {"Content-Type": "application/json", "Accept": "application/json",
           "Authorization": "Bearer sk-bench"}
CONNECT_S, READ_S = 10.0, 600.0


class Side(Protocol):
    def post(self, body: bytes) -> int: ...
    def close(self) -> None: ...


class HttpClientSide:
    def __init__(self, url: str, threads: int) -> None:
        self.conns = Connections(url, connect_timeout=CONNECT_S, read_timeout=READ_S, headers=HEADERS)

    def post(self, body: bytes) -> int:
        r = self.conns.request("POST", PATH, body)
        return r.status

    def close(self) -> None:
        self.conns.close()


class Urllib3Side:
    def __init__(self, url: str, threads: int) -> None:
        self.manager = urllib3.PoolManager(maxsize=threads, retries=False,
                                           timeout=urllib3.Timeout(connect=CONNECT_S, read=READ_S))
        self.pool = self.manager.connection_from_url(url)

    def post(self, body: bytes) -> int:
        r = self.pool.urlopen("POST", PATH, body=body, headers=HEADERS, retries=False,
                              redirect=False, assert_same_host=False, preload_content=True)
        _ = r.data
        return r.status

    def close(self) -> None:
        self.manager.clear()


class RequestsSide:
    def __init__(self, url: str, threads: int) -> None:
        import requests
        from requests.adapters import HTTPAdapter

        self.url = url + PATH
        self.session = requests.Session()
        self.session.mount("http://", HTTPAdapter(pool_maxsize=threads))

    def post(self, body: bytes) -> int:
        r = self.session.post(self.url, data=body, headers=HEADERS, timeout=(CONNECT_S, READ_S))
        _ = r.content
        return r.status_code

    def close(self) -> None:
        self.session.close()


def sides() -> dict[str, Callable[[str, int], Side]]:
    out: dict[str, Callable[[str, int], Side]] = {"http.client": HttpClientSide, "urllib3": Urllib3Side}
    try:
        import requests  # noqa: F401 (imported only to check that it is installed)
    except ImportError:
        pass
    else:
        out["requests.Session"] = RequestsSide
    return out


@dataclass
class Run:
    side: str
    concurrency: int
    rep: int
    requests: int
    wall_s: float
    cpu_s: float
    server_requests: int
    server_connections: int

    @property
    def rps(self) -> float:
        return self.requests / self.wall_s

    @property
    def cpu_us_per_request(self) -> float:
        return 1e6 * self.cpu_s / self.requests


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def run_side(name: str, make: Callable[[str, int], Side], body: bytes, n: int, threads: int, rep: int) -> Run:
    per_thread = [n // threads + (i < n % threads) for i in range(threads)]
    errors: list[str] = []
    with Server() as srv:
        side = make(srv.url, threads)
        # One request per thread first, so connection set-up is not in the timed part (the
        # plugin holds its connections for a whole run).
        start = threading.Barrier(threads + 1)

        def work(k: int) -> None:
            try:
                side.post(body)
                start.wait()
                for _ in range(k):
                    if side.post(body) != 200:
                        errors.append("non-200")
            except Exception as e:  # noqa: BLE001 (three libraries' errors; one line, not a traceback per thread)
                errors.append(f"{type(e).__name__}: {e}")
                start.abort()

        workers = [threading.Thread(target=work, args=(k,)) for k in per_thread]
        for w in workers:
            w.start()
        start.wait()
        t0, c0 = time.perf_counter(), _cpu()
        for w in workers:
            w.join()
        wall, cpu = time.perf_counter() - t0, _cpu() - c0
        side.close()
        _, served, conns = srv.stop()
    if errors:
        raise SystemExit(f"{name} at concurrency {threads}: {len(errors)} failed requests, first: {errors[0]}")
    if served != n + threads:
        raise SystemExit(f"{name}: the server answered {served} requests, expected {n + threads}")
    return Run(name, threads, rep, n, wall, cpu, served, conns)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=4000, help="timed requests per run; default 4000")
    ap.add_argument("--concurrency", default="1,64", help="comma-separated thread counts; default 1,64")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    levels = [int(x) for x in a.concurrency.split(",") if x.strip()]
    if a.requests < 1 or a.reps < 1 or not levels or min(levels) < 1:
        ap.error("--requests, --reps and every --concurrency must be positive")
    # ~18 kB of JPEG as base64, the size of a 256x256 RSVQA-LR image at quality 95
    image_b64 = base64.b64encode(os.urandom(18_000))
    body = chat_payload("bench-vlm", "Is there a building?", image_b64, 16, 0.0)
    table = sides()
    names = list(table)
    OUT.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    for threads in levels:
        for rep in range(a.reps):
            order = names[rep % len(names):] + names[: rep % len(names)]
            for name in order:
                r = run_side(name, table[name], body, a.requests, threads, rep)
                runs.append(r)
                print(f"  c={threads:<3} rep {rep} {name:18} {r.rps:7.0f} req/s  "
                      f"client CPU {r.cpu_us_per_request:6.0f} us/req", flush=True)

    summary: dict[str, dict[str, float]] = {}
    print(f"\nbody {len(body)} bytes; median of {a.reps} reps; ratio = side / http.client in the same rep")
    print(f"{'concurrency':>11} {'side':18} {'req/s':>8} {'ratio':>6} {'CPU us/req':>11} {'ratio':>6}")
    for threads in levels:
        for name in names:
            mine = [r for r in runs if r.side == name and r.concurrency == threads]
            base = {r.rep: r for r in runs if r.side == "http.client" and r.concurrency == threads}
            row = {
                "requests_per_s": statistics.median(r.rps for r in mine),
                "client_cpu_us_per_request": statistics.median(r.cpu_us_per_request for r in mine),
                "rps_ratio": statistics.median(r.rps / base[r.rep].rps for r in mine),
                "cpu_ratio": statistics.median(r.cpu_s / base[r.rep].cpu_s for r in mine),
            }
            summary[f"{name} c={threads}"] = row
            print(f"{threads:>11} {name:18} {row['requests_per_s']:8.0f} {row['rps_ratio']:6.2f} "
                  f"{row['client_cpu_us_per_request']:11.0f} {row['cpu_ratio']:6.2f}")
    write_result(
        OUT / "http_client.json",
        versions={"python": sys.version.split()[0], "urllib3": urllib3.__version__},
        settings={"requests": a.requests, "concurrency": levels, "reps": a.reps, "body_bytes": len(body)},
        summary=summary,
        runs=[asdict(r) | {"requests_per_s": r.rps, "cpu_us_per_request": r.cpu_us_per_request} for r in runs],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
