"""The bundled reference server as one task of the local job array runs it (tests/report/
test_cluster_array.py), with what a test needs to see from outside: every chat request it
receives is a line in `--count-file` (appended and flushed before it is answered, so the count
survives a SIGKILL of the task), and `--delay S` slows each answer (a task killed mid-run).

    python array_server.py --count-file F [--delay S] [--model M] --host H --port P

(the array script adds --host and --port to its SERVE command, as to `vllm serve MODEL`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from pytest_satbench.server import DEFAULT_MODEL
from pytest_satbench.server.app import make_server


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count-file", required=True)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    httpd = make_server(args.host, args.port, args.model)
    base = httpd.RequestHandlerClass
    fd = os.open(args.count_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    class Counting(base):  # type: ignore[misc, valid-type]  # base: a class chosen at run time
        def do_POST(self) -> None:
            if self.path.rstrip("/").endswith("/chat/completions"):
                os.write(fd, b"chat\n")
                if args.delay:
                    time.sleep(args.delay)
            super().do_POST()

    httpd.RequestHandlerClass = Counting
    try:
        httpd.serve_forever(poll_interval=0.1)
    finally:
        httpd.server_close()
    return 0


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the script stops its server with SIGTERM
    sys.exit(main())
