"""`python -m pytest_satbench.server --port 8000` (also the `satbench-server` script)."""

from __future__ import annotations

import argparse
import sys

from pytest_satbench.server import DEFAULT_MODEL
from pytest_satbench.server.app import bound_address, make_server


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="satbench-server",
        description="The pytest-satbench reference VLM server (OpenAI-compatible; answers "
                    "the demo benchmark from the pixels).",
    )
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=8000, help="port (0: any free port)")
    ap.add_argument("--model", default=DEFAULT_MODEL, help="model id it reports")
    args = ap.parse_args(argv)
    try:
        httpd = make_server(args.host, args.port, args.model)
    except OSError as exc:
        print(f"satbench-server: cannot listen on {args.host}:{args.port} ({exc}); "
              "pick another --port", file=sys.stderr)
        return 2
    host, port = bound_address(httpd)
    # The first line is machine-readable enough for scripts that start it with --port 0.
    print(f"satbench-server: serving model {args.model!r} on http://{host}:{port}", flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
