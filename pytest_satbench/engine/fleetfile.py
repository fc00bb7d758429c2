"""`--servers @FILE`: a fleet listed in a file, one base URL per line, read again when it changes.

On a cluster a replica is added when the queue frees a GPU and drained before a preemption;
editing one file tells a running benchmark so, without a restart. This module is the file's
side only: reading it (`read_server_file`) and noticing a change (`FileFleet.poll`, called
about once a second by the server pool's control thread, engine/client.py, which adds and
retires the servers). It stats the file (modification time and size) on every poll and reads
it only when either changed: a cheap poll, no file-system events to depend on (NFS has none).

The format: one URL per line; blank lines and everything after a `#` are ignored. A line that
is not an http(s) base URL (or names /v1, or repeats an earlier line) is one notice naming the
file and line number, and the rest of the file still counts. A file that becomes empty (no URL
left), or cannot be read, keeps the last good list, said once until the file is good again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from pytest_satbench.core.redact import redact_url

__all__ = ["FileFleet", "ServerList", "parse_server_lines", "read_server_file"]


@dataclass(frozen=True, slots=True)
class ServerList:
    """One reading of a server file: the URLs in file order and one line per bad line."""

    path: Path
    urls: tuple[str, ...]
    problems: tuple[str, ...] = ()  # "--servers @FILE line N: ...; ignored", one per bad line
    stamp: tuple[int, int] = (0, 0)  # (st_mtime_ns, st_size) the reading saw


def _check(text: str) -> str | None:
    """Why `text` is not a base URL; None when it is one."""
    if text == "builtin":
        return "'builtin' cannot be listed in a file; list server URLs"
    try:
        parts = urlsplit(text)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        return f"{redact_url(text)!r} is not a URL; write base URLs like http://gpu1:8000, one per line"
    if text.endswith("/v1"):
        return f"write the base URL without /v1 ({redact_url(text[:-3])})"
    return None


def parse_server_lines(path: Path, text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(URLs in file order, one notice per bad line) of a server file's text."""
    urls: dict[str, int] = {}
    problems: list[str] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip().rstrip("/")
        if not line:
            continue
        why = _check(line)
        if why is None and line in urls:
            why = f"{redact_url(line)} is listed already on line {urls[line]}"
        if why is not None:
            problems.append(f"--servers @{path} line {n}: {why}; ignored")
            continue
        urls[line] = n
    return tuple(urls), tuple(problems)


def read_server_file(path: Path) -> ServerList:
    """The file's servers now. Raises OSError when it cannot be read (UnicodeDecodeError, a
    ValueError, when it is not text)."""
    st = os.stat(path)
    text = Path(path).read_text(encoding="utf-8")
    urls, problems = parse_server_lines(path, text)
    return ServerList(Path(path), urls, problems, (st.st_mtime_ns, st.st_size))


class FileFleet:
    """Follows a server file from its first reading. `poll()` returns the new URL list when the
    file changed to a good one, None otherwise; `say(line)` gets each notice (bad lines, a file
    gone empty or unreadable, and that it is good again)."""

    def __init__(self, first: ServerList, say: Callable[[str], None] | None = None) -> None:
        self.path = first.path
        self.urls = first.urls  # the last good list
        self._stamp: tuple[int, int] | None = first.stamp
        self._said_problems = set(first.problems)  # said at start already (the plugin's start line)
        self._kept: str | None = None  # why the last good list is kept, once said
        self._say = say
        self._next = 0.0

    def poll(self, now: float | None = None, every_s: float = 1.0) -> tuple[str, ...] | None:
        """At most one stat per `every_s` seconds; a read only when the stamp changed."""
        now = time.monotonic() if now is None else now
        if now < self._next:
            return None
        self._next = now + every_s
        try:
            st = os.stat(self.path)
        except OSError as exc:
            self._keep(f"cannot be read ({exc.strerror or exc})")
            self._stamp = None
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return None
        try:
            got = read_server_file(self.path)
        except (OSError, ValueError) as exc:
            self._keep(f"cannot be read ({getattr(exc, 'strerror', None) or exc})")
            self._stamp = None
            return None
        self._stamp = got.stamp
        for line in got.problems:
            if line not in self._said_problems:
                self._notice(line)
        self._said_problems = set(got.problems)
        if not got.urls:
            self._keep("lists no server")
            return None
        if self._kept is not None:
            self._notice(f"--servers @{self.path} is good again: {len(got.urls)} server(s) listed")
            self._kept = None
        if got.urls == self.urls:
            return None
        self.urls = got.urls
        return got.urls

    def _keep(self, why: str) -> None:
        if self._kept == why:
            return
        self._kept = why
        self._notice(f"--servers @{self.path} {why}; keeping its last good list ({', '.join(map(redact_url, self.urls))})")

    def _notice(self, line: str) -> None:
        if self._say is not None:
            self._say(line)
