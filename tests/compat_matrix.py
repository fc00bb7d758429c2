"""The compatibility matrix's machinery: third-party pytest plugins, a counting reference
server and a demo project, for tests/plugin/test_compat.py.

The plugins are installed by `make install-test` into `.compat-plugins/` (pip --target, no
dependencies: the venv's pytest is the only pytest), never into the venv: pytest-sugar,
pytest-randomly and the others would change the output of every pytester run of the
project's own tests. A run here is a subprocess with `PYTHONPATH=.compat-plugins`, where
pytest finds their entry points:

- `plugins=ALL`: every plugin installed there, autoloaded (what a user with them installed
  gets);
- `plugins=("rerunfailures", ...)`: autoloading off (PYTEST_DISABLE_PLUGIN_AUTOLOAD) and only
  the named entry points loaded with `-p`, next to satbench and xdist;
- `plugins=()`: no plugin of .compat-plugins at all (the reference results).

The server is the bundled reference server (it answers the demo from the pixels, so JPEG
quality 10 really regresses answers) with a counter per (prompt, image) in front of it, and
optionally an injected HTTP 500 or a delay.
"""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PLUGINS_DIR = REPO / ".compat-plugins"
ALL = None  # plugins=ALL: everything in PLUGINS_DIR, autoloaded

TEST_MODULE = 'from pytest_satbench import benchmark_test\n\ntest_demo = benchmark_test("demo")\n'
# Writes the collected order (node id, image id) where the run's env says, once per process:
# the file is `ORDER_FILE`, or `ORDER_FILE.<worker>` on an xdist worker.
CONFTEST = '''\
import os

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    out = os.environ.get("ORDER_FILE")
    worker = getattr(session.config, "workerinput", {}).get("workerid")
    if out:
        with open(f"{out}.{worker}" if worker else out, "w") as f:
            for item in session.items:
                q = getattr(item, "question", None)
                f.write(f"{item.nodeid}\\t{q.image.id if q is not None else '-'}\\n")
'''

# (prompt text, sha256 of the image sent or "") -> requests
Key = tuple[str, str]


@dataclass
class Reference:
    """The reference server with a counter per (prompt, image) and optional faults: `fail`
    (key -> True: answer HTTP 500) and `delay` (seconds before each answer)."""

    fail: Callable[[Key], bool] | None = None
    delay: float = 0.0
    counts: Counter[Key] = field(default_factory=Counter)
    url: str = ""

    def __enter__(self) -> Reference:  # noqa: PYI034 (never subclassed)
        from pytest_satbench.server import start_server

        self._server = start_server()
        self.url = self._server.url
        handler = self._server._httpd.RequestHandlerClass
        answer = handler.do_POST
        lock = threading.Lock()
        ref = self

        def do_post(h: Any) -> None:
            body = h.rfile.read(int(h.headers.get("Content-Length") or 0))
            key = _key(body)
            with lock:
                ref.counts[key] += 1
            if ref.delay:
                time.sleep(ref.delay)
            if ref.fail is not None and ref.fail(key):
                payload = b'{"error": {"message": "injected failure", "type": "server_error"}}'
                h.send_response(500)
                h.send_header("Content-Type", "application/json")
                h.send_header("Content-Length", str(len(payload)))
                h.end_headers()
                h.wfile.write(payload)
                return
            real, h.rfile = h.rfile, io.BytesIO(body)
            try:
                answer(h)
            finally:
                h.rfile = real

        handler.do_POST = do_post
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.close()

    @property
    def requests(self) -> int:
        return sum(self.counts.values())

    def reset(self) -> None:
        self.counts.clear()


def _key(body: bytes) -> Key:
    try:
        content = json.loads(body)["messages"][-1]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return ("?", "")
    if isinstance(content, str):
        return (content, "")
    text = " ".join(p.get("text", "") for p in content if p.get("type") == "text")
    image = next((p["image_url"]["url"] for p in content if p.get("type") == "image_url"), "")
    return (text, hashlib.sha256(image.encode()).hexdigest() if image else "")


@dataclass
class Run:
    name: str
    returncode: int
    output: str
    requests: int
    root: Path
    tag: str
    seconds: float

    @property
    def per_type(self) -> list[dict[str, str]]:
        """reports/demo/<tag>/per_type.csv: every figure of the run, from the store."""
        with open(self.root / "reports" / "demo" / self.tag / "per_type.csv") as f:
            return list(csv.DictReader(f))

    def outcomes(self, junit: str = "junit.xml") -> dict[str, tuple[tuple[str, str], ...]]:
        """Test name (`test_demo[<key>]`) -> the satbench properties junit XML recorded for it."""
        import xml.etree.ElementTree as ET

        out: dict[str, tuple[tuple[str, str], ...]] = {}
        for case in ET.parse(self.root / self.tag / junit).getroot().iter("testcase"):
            props = tuple((p.get("name", ""), p.get("value", "")) for p in case.iter("property")
                          if p.get("name", "").startswith("satbench"))
            out[case.get("name", "")] = props
        return out

    def lines(self, start: str) -> list[str]:
        return [line for line in self.output.splitlines() if line.startswith(start)]

    def order(self, worker: str | None = None) -> list[tuple[str, str]]:
        """The collected order; under xdist, worker gw0's (or `worker`'s)."""
        path = self.root / self.tag / ("order" + (f".{worker}" if worker else ""))
        if worker is None and not path.exists():
            path = path.with_name("order.gw0")
        return [tuple(line.split("\t")) for line in path.read_text().splitlines()]  # type: ignore[misc]  # pairs: the file's two tab-separated columns


def make_project(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "test_demo.py").write_text(TEST_MODULE)
    (root / "conftest.py").write_text(CONFTEST)
    return root


def run(root: Path, server: Reference, tag: str, *args: str, plugins: Sequence[str] | None = ALL,
        store: Path | None = None, limit: int = 80, timeout: float = 240, env: dict[str, str] | None = None,
        recon: str = "jpeg:quality=10", cache: bool = False) -> Run:
    """One pytest run of the demo in `root` against `server`, its junit XML, order file and
    reports under `root/<tag>`; the store is `root/<tag>/results.sqlite` unless given.
    pytest's cache plugin is off unless `cache` (--lf, --ff: its lastfailed is shared by the
    runs in `root`)."""
    out = root / tag
    out.mkdir(parents=True, exist_ok=True)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_", "COVERAGE_"))}
    environ.update(env or {})
    environ["ORDER_FILE"] = str(out / "order")
    environ["COVERAGE_FILE"] = str(out / ".coverage")  # pytest-cov's data: the run's own, runs go in parallel
    cmd = [sys.executable, "-m", "pytest", "test_demo.py", "-q", "--servers", server.url, "--recon", recon,
           "--limit", str(limit), "--store", str(store or out / "results.sqlite"), "--tag", tag,
           "--junitxml", str(out / "junit.xml"), "--progress-every", "0", *([] if cache else ["-p", "no:cacheprovider"])]
    if plugins is not ALL:
        environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        cmd += ["-p", "satbench", "-p", "xdist"]
        for name in plugins:
            cmd += ["-p", name]
    if plugins != ():
        environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLUGINS_DIR), environ.get("PYTHONPATH")]))
    cmd += [a.replace("{out}", str(out)) for a in args]  # "{out}": this run's folder
    before = server.requests
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=root, env=environ, capture_output=True, text=True, timeout=timeout, check=False)
    return Run(tag, done.returncode, done.stdout + done.stderr, server.requests - before, root, tag,
               time.monotonic() - t0)


def copy_store(src: Path, dst: Path) -> Path:
    """A copy of a closed run's store (its WAL checkpointed at close, copied if not)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.parent.glob(src.name + "*"):
        shutil.copy2(f, dst / f.name)
    return dst / src.name


def image_switches(order: Sequence[tuple[str, str]]) -> int:
    images = [image for _, image in order if image != "-"]
    return sum(1 for a, b in itertools.pairwise(images) if a != b)
