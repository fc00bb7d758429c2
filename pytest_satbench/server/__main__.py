"""`python -m pytest_satbench.server --port 8000` (also the `satbench-server` script).

A bad option (a port out of range, a port in use, a host that is not this machine's) is one
line on stderr naming the option and what to do, and exit status 2, argparse's status for a
usage error: never a traceback.
"""

from __future__ import annotations

import argparse
import errno
import socket
import sys
from typing import NoReturn

from pytest_satbench.server import DEFAULT_MODEL
from pytest_satbench.server.app import bound_address, make_server

PROG = "satbench-server"
USAGE_ERROR = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse prints the whole usage block first; one line is what a script's log or
        # a terminal needs to see what to change.
        self.exit(USAGE_ERROR, f"{self.prog}: {message}; see {self.prog} --help\n")


def _port(raw: str) -> int:
    try:
        port = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{raw!r} is not a port number; pass 0-65535 (0: any free port)") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(
            f"{port} is out of range; pass 0-65535 (0: any free port)")
    return port


def _model(raw: str) -> str:
    if not raw.strip():
        raise argparse.ArgumentTypeError("the model id is empty; pass the id clients ask for")
    return raw


def _bind_problem(exc: OSError, host: str, port: int) -> str:
    """One line naming the option at fault and what to do about it."""
    if isinstance(exc, socket.gaierror):
        return (f"--host {host!r} does not resolve ({exc.strerror}); pass an address of this "
                "machine, e.g. 127.0.0.1 (loopback) or 0.0.0.0 (all interfaces)")
    if exc.errno == errno.EADDRINUSE:
        return (f"--port {port} is already in use on {host}:{port}; pick another --port "
                "(0: any free port)")
    if exc.errno == errno.EADDRNOTAVAIL:
        return (f"--host {host} is not an address of this machine; pass one of its own, e.g. "
                "127.0.0.1 (loopback) or 0.0.0.0 (all interfaces)")
    if exc.errno == errno.EACCES:
        return (f"--port {port} needs privileges on {host}:{port} ({exc.strerror}); pick "
                "--port 1024 or above (0: any free port)")
    return (f"cannot listen on {host}:{port} ({exc.strerror or exc}); check --host and "
            "--port")


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(
        prog=PROG,
        description="The pytest-satbench reference VLM server (OpenAI-compatible; answers "
                    "the demo benchmark from the pixels).",
    )
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    ap.add_argument("--port", type=_port, default=8000,
                    help="port, 0-65535 (default 8000; 0: any free port)")
    ap.add_argument("--model", type=_model, default=DEFAULT_MODEL,
                    help=f"model id it serves and reports (default {DEFAULT_MODEL}); a "
                         "request naming another id gets a 404, as on vLLM")
    args = ap.parse_args(argv)
    try:
        httpd = make_server(args.host, args.port, args.model)
    except OSError as exc:
        print(f"{PROG}: {_bind_problem(exc, args.host, args.port)}", file=sys.stderr)
        return USAGE_ERROR
    except (ValueError, OverflowError) as exc:
        # The port is checked above; this is a host the socket layer rejects outright
        # (e.g. one with a NUL byte in it).
        print(f"{PROG}: cannot listen on --host {args.host!r} ({exc}); pass an address of "
              "this machine, e.g. 127.0.0.1", file=sys.stderr)
        return USAGE_ERROR
    host, port = bound_address(httpd)
    url_host = f"[{host}]" if ":" in host else host
    # The first line is machine-readable enough for scripts that start it with --port 0.
    print(f"{PROG}: serving model {args.model!r} on http://{url_host}:{port}", flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
