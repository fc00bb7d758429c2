"""The benches' zero-latency loopback server: tests/servers.py's FakeVLM answering "yes" at
once, in its own process, so its CPU is not the client's.

    with ZeroLatencyServer() as srv:      # srv.url
        ...
        stats = srv.stop()                # server CPU, chat requests, TCP connections
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class ServerStats:
    cpu_s: float  # the server process's user+sys
    requests: int  # chat requests it answered
    connections: int  # TCP connections it accepted


def serve() -> None:
    from collections import deque
    from http.server import ThreadingHTTPServer

    sys.path.insert(0, str(REPO / "tests"))
    from servers import FakeVLM

    # socketserver listens with a backlog of 5; the seed opens a connection per request from
    # 64 threads, and a full backlog resets them. vLLM (uvicorn) listens with 2048.
    ThreadingHTTPServer.request_queue_size = 2048
    srv = FakeVLM(["bench-vlm"], answer=lambda prompt, has_image, image: "yes")
    # FakeVLM keeps every request and arrival time for tests to inspect; hundreds of thousands
    # of image requests would grow the server by gigabytes
    srv.recorded = deque(maxlen=1)  # type: ignore[assignment]  # a bounded list: appended to only
    srv.chat_times = deque(maxlen=1)  # type: ignore[assignment]  # likewise
    srv.start()

    def stop(*_: object) -> None:
        print(json.dumps({"requests": srv.chat_requests, "connections": srv.connections}), flush=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    print(srv.url, flush=True)
    while True:
        time.sleep(3600)


class ZeroLatencyServer:
    def __enter__(self) -> ZeroLatencyServer:  # noqa: PYI034 (never subclassed)
        self.proc = subprocess.Popen([sys.executable, __file__], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://"):
            raise SystemExit(f"bench server did not start (printed {self.url!r})")
        return self

    def stop(self) -> ServerStats:
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.stdout is not None
        counts = json.loads(self.proc.stdout.readline() or "{}")
        _, status, ru = os.wait4(self.proc.pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        return ServerStats(ru.ru_utime + ru.ru_stime, int(counts.get("requests", -1)), int(counts.get("connections", -1)))

    def __exit__(self, *exc: object) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    serve()
