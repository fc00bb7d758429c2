"""The bundled reference VLM server: OpenAI-compatible, answers the demo from the pixels.

`--servers builtin` starts one on a free loopback port for the session; it also runs alone
(`python -m pytest_satbench.server --port 8000`, or the `satbench-server` script). It needs
no model weights and no accelerator: it answers the demo benchmark by colour segmentation
and object counting (`vision.py`, `reference_answers.py`), so a codec that blurs small objects really
costs it accuracy, and gives fixed, documented answers to everything else.

On the wire it behaves as vLLM does where a client can tell (`wire.py`): `"stream": true`
is server-sent events ending in `data: [DONE]`, `n` gives n choices (identical: the answers
are deterministic), every reply carries `usage`, `GET /v1/models/{id}` returns the model
card, and a request naming a model id it does not serve is a 404 in vLLM's words.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from types import TracebackType

from pytest_satbench.server.app import bound_address, make_server

__all__ = ["RunningServer", "start_server"]

DEFAULT_MODEL = "satbench-reference"


@dataclass
class RunningServer:
    """A reference server serving from a daemon thread; close() stops it and frees the port."""

    url: str  # e.g. http://127.0.0.1:54321 (no trailing slash, no /v1)
    model: str
    _httpd: ThreadingHTTPServer = field(repr=False)
    _thread: threading.Thread = field(repr=False)

    def close(self) -> None:
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join()
        self._httpd.server_close()

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def start_server(host: str = "127.0.0.1", port: int = 0, *,
                 model: str = DEFAULT_MODEL) -> RunningServer:
    """Start a reference server on `host:port` (port 0: a free one) and return at once.

    Raises ValueError for a port outside 0-65535, OSError when `host:port` cannot be bound.
    """
    httpd = make_server(host, port, model)
    bound_host, bound_port = bound_address(httpd)
    url_host = f"[{bound_host}]" if ":" in bound_host else bound_host
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1},
                              name=f"satbench-reference:{bound_port}", daemon=True)
    thread.start()
    return RunningServer(url=f"http://{url_host}:{bound_port}", model=model,
                         _httpd=httpd, _thread=thread)
