"""Downloading one file (HTTP Range resume, a progress bar), the lock file, and unpacking.

Standard library only (urllib): a `.part` file grows until the server's length is reached; an
interrupted transfer continues from the `.part`'s size with ``Range: bytes=N-`` (RFC 9110
§14.2). A server that answers a range request with 200 sends the whole file, so the `.part`
is restarted from byte 0; 416 means the `.part` is already whole or wrong: restarted too.
"""

from __future__ import annotations

import fnmatch
import hashlib
import http.client
import json
import os
import shutil
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

CHUNK = 1 << 20
ATTEMPTS = 5  # transfers cut short are resumed this many times in one fetch
LOCK_NAME = "satbench-data.lock.json"
USER_AGENT = "pytest-satbench-data"


class FetchError(Exception):
    """One line for the user: what failed, and what to do."""


class Unreachable(FetchError):
    """The host (or mirror) cannot be reached at all."""


@dataclass
class Transfer:
    """What one download did: its requests (for the log and the tests) and the result."""

    path: Path
    size: int
    sha256: str
    md5: str
    headers: dict[str, str]
    requests: int
    resumed_from: list[int]


def _progress(out: IO[str], name: str, done: int, total: int | None, final: bool = False) -> None:
    width = 30
    mb = f"{done / 1e6:.1f}" + (f"/{total / 1e6:.1f} MB" if total else " MB")
    if total:
        filled = min(width, done * width // max(total, 1))
        bar = "#" * filled + "-" * (width - filled)
        line = f"\r{name} [{bar}] {done * 100 // max(total, 1):3d}% {mb}"
    else:
        line = f"\r{name} {mb}"
    out.write(line + ("\n" if final else ""))
    out.flush()


def _open(url: str, start: int, timeout: float) -> Any:
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    if start:
        req.add_header("Range", f"bytes={start}-")
    return urllib.request.urlopen(req, timeout=timeout)


def download(url: str, dest: Path, *, label: str, timeout: float = 60.0,
             progress: IO[str] | None = None) -> Transfer:
    """Download `url` to `dest` through `dest.part`, resuming a `.part` left by an earlier try.
    Raises Unreachable when the host cannot be reached, FetchError on an HTTP error."""
    out = progress if progress is not None else sys.stderr
    part = dest.with_name(dest.name + ".part")
    part.parent.mkdir(parents=True, exist_ok=True)
    requests = 0
    resumed: list[int] = []
    headers: dict[str, str] = {}
    total: int | None = None
    last_error = ""
    for _ in range(ATTEMPTS):
        start = part.stat().st_size if part.exists() else 0
        requests += 1
        try:
            resp = _open(url, start, timeout)
        except urllib.error.HTTPError as exc:
            if exc.code == 416 and start:  # the range starts past the end: start again
                part.unlink()
                last_error = "HTTP 416"
                continue
            raise FetchError(f"{url}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise Unreachable(f"{url}: {reason}") from None
        with resp:
            headers = {k.lower(): v for k, v in resp.headers.items()}
            if start and resp.status == 206 and headers.get("content-range", "").startswith(f"bytes {start}-"):
                resumed.append(start)
                mode = "ab"
                done = start
            else:  # 200: the server sends the whole file (it ignored the range, or none was asked)
                mode, done = "wb", 0
            length = headers.get("content-length")
            total = done + int(length) if length and length.isdigit() else None
            if "content-range" in headers and "/" in headers["content-range"]:
                whole = headers["content-range"].rsplit("/", 1)[1]
                total = int(whole) if whole.isdigit() else total
            shown = 0.0
            try:
                with open(part, mode) as fh:
                    while True:
                        chunk = resp.read(CHUNK)
                        if not chunk:
                            break
                        fh.write(chunk)
                        done += len(chunk)
                        now = time.monotonic()
                        if now - shown > 0.2:
                            _progress(out, label, done, total)
                            shown = now
            except (http.client.IncompleteRead, ConnectionError, TimeoutError, OSError) as exc:
                last_error = f"transfer cut short at {done} bytes ({type(exc).__name__})"
                continue
        if total is not None and part.stat().st_size < total:
            last_error = f"transfer cut short at {part.stat().st_size} of {total} bytes"
            continue
        _progress(out, label, part.stat().st_size, total, final=True)
        sha, md5 = hashes(part)
        part.replace(dest)
        return Transfer(dest, dest.stat().st_size, sha, md5, headers, requests, resumed)
    raise FetchError(f"{url}: {last_error} after {ATTEMPTS} attempts; rerun to resume from {part}")


def hashes(path: Path) -> tuple[str, str]:
    sha, md5 = hashlib.sha256(), hashlib.md5()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            sha.update(chunk)
            md5.update(chunk)
    return sha.hexdigest(), md5.hexdigest()


def get_json(url: str, timeout: float = 30.0) -> Any:
    """A small JSON document (a source's published checksums); None when the host answers
    without one (an HTTP error, not JSON); Unreachable when the host cannot be reached."""
    try:
        req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError) as exc:
        raise Unreachable(f"{url}: {getattr(exc, 'reason', exc)}") from None
    except ValueError:
        return None


# ---------------------------------------------------------------------------------- lock file


class Lock:
    """`<root>/satbench-data.lock.json`: per file (keyed "<source>/<path>"), the SHA-256 and
    size seen, how it was verified ("md5"/"sha256": against a shipped or published checksum;
    "first-seen": trust on first use), and per Hub source the revision pinned at first use."""

    def __init__(self, root: Path) -> None:
        self.path = root / LOCK_NAME
        self.data: dict[str, Any] = {"files": {}, "revisions": {}}
        if self.path.is_file():
            try:
                loaded = json.loads(self.path.read_text())
            except ValueError:
                raise FetchError(f"{self.path}: not valid JSON; move it away to start the lock anew") from None
            self.data["files"].update(loaded.get("files", {}))
            self.data["revisions"].update(loaded.get("revisions", {}))

    def file(self, key: str) -> dict[str, Any] | None:
        entry = self.data["files"].get(key)
        return entry if isinstance(entry, dict) else None

    def put(self, key: str, entry: dict[str, Any]) -> None:
        self.data["files"][key] = entry

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True) + "\n")
        tmp.replace(self.path)


# ---------------------------------------------------------------------------------- unpacking


def _safe_target(base: Path, name: str, archive: Path) -> Path:
    """The member's path under `base`; an absolute path or one that climbs out is refused."""
    pure = PurePosixPath(name.replace("\\", "/"))
    if pure.is_absolute() or ".." in pure.parts or (pure.parts and ":" in pure.parts[0]):
        raise FetchError(f"{archive}: member {name!r} would be written outside {base}; refusing the archive")
    target = (base / Path(*pure.parts)) if pure.parts else base
    if not target.resolve().is_relative_to(base.resolve()):
        raise FetchError(f"{archive}: member {name!r} would be written outside {base}; refusing the archive")
    return target


def _chosen(names: list[str], patterns: tuple[str, ...]) -> set[str]:
    picked = {n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)} if patterns else set()
    return picked or set(names)


def unpack(archive: Path, kind: str, dest: Path, top: str, members: tuple[str, ...] = ()) -> int:
    """Unpack `archive` so that `dest/top` holds what the loader reads; returns members written.
    Links, devices and members outside `dest` are refused (or, links, skipped)."""
    dest.mkdir(parents=True, exist_ok=True)
    if kind == "zip":
        with zipfile.ZipFile(archive) as zf:
            infos = [i for i in zf.infolist() if not i.is_dir()]
            names = [i.filename for i in infos]
            base = dest if names and all(n.startswith(f"{top}/") for n in names) else dest / top
            keep = _chosen(names, members)
            count = 0
            for info in infos:
                if info.filename not in keep:
                    continue
                target = _safe_target(base, info.filename, archive)
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, CHUNK)
                count += 1
            return count
    if kind == "tar":
        with tarfile.open(archive) as tf:
            entries = [m for m in tf.getmembers() if m.isfile()]
            names = [m.name for m in entries]
            base = dest if names and all(n.startswith(f"{top}/") for n in names) else dest / top
            keep = _chosen(names, members)
            count = 0
            for entry in entries:  # regular files only: links and devices are never written
                if entry.name not in keep:
                    continue
                target = _safe_target(base, entry.name, archive)
                target.parent.mkdir(parents=True, exist_ok=True)
                stream = tf.extractfile(entry)
                if stream is None:
                    continue
                with stream, open(target, "wb") as dst:
                    shutil.copyfileobj(stream, dst, CHUNK)
                count += 1
            return count
    raise FetchError(f"{archive}: unknown archive kind {kind!r}")


def move_into(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(src, dest)
