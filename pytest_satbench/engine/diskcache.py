"""A content-addressed bytes cache on disk, shared by processes (xdist workers, later runs).

Used for reconstructions of expensive codecs: the key is derived from the source image's
bytes and the codec's full identity, so a second run, a resume, or a run against another
model never reruns the tokenizer on the same image.

Layout: `root/ab/abcdef...` (first two hex digits fan out the directory). Each entry is
`MAGIC | sha256(payload) | payload`; a reader that finds a short or corrupt file (a writer
killed mid-write on a filesystem without atomic rename, disk damage, a stray edit) treats it
as a miss and removes it. Writers write a private temp file and `os.replace` it into place,
so readers never see a partial entry and concurrent writers of one key just race to an
identical result. Size is bounded by evicting least-recently-used entries (mtime, which
`get` refreshes) whenever this process's running estimate passes `max_bytes`.

A report finds an entry by what a run recorded of it, the sha256 of the bytes it sent, which is
the payload hash in the entry's header: `PayloadLookup` reads the cache without changing it.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid
from pathlib import Path

_MAGIC = b"SATBC1\n"
_HEADER = len(_MAGIC) + 32
# Temp files older than this are leftovers of killed writers, not writes in progress.
_STALE_TMP_SECONDS = 3600.0


class DiskCache:
    def __init__(self, root: Path, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"DiskCache {root}: max_bytes must be positive, got {max_bytes}")
        self.root = Path(root)
        self.max_bytes = int(max_bytes)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # Bytes in the cache as far as this process knows: exact after a scan, then grown
        # by our own writes. Other processes' writes are seen at the next scan, which
        # happens at least every max_bytes/8 bytes we write, so the overshoot stays small.
        self._estimate = self._scan_and_evict()
        self._written_since_scan = 0

    @staticmethod
    def key_for(*parts: str) -> str:
        """sha256 over the parts, length-prefixed so ('ab','c') != ('a','bc')."""
        h = hashlib.sha256()
        for part in parts:
            data = part.encode("utf-8")
            h.update(len(data).to_bytes(8, "big"))
            h.update(data)
        return h.hexdigest()

    def _path(self, key: str) -> Path:
        if len(key) < 3 or not all(c in "0123456789abcdef" for c in key):
            raise ValueError(f"DiskCache key {key!r}: use DiskCache.key_for(...) (lowercase hex)")
        return self.root / key[:2] / key

    def get(self, key: str) -> bytes | None:
        path = self._path(key)
        try:
            blob = path.read_bytes()
        except OSError:  # absent, or evicted by another process meanwhile
            return None
        payload = blob[_HEADER:]
        if (
            len(blob) < _HEADER
            or not blob.startswith(_MAGIC)
            or hashlib.sha256(payload).digest() != blob[len(_MAGIC) : _HEADER]
        ):
            self._discard(path)
            return None
        try:
            os.utime(path)  # recently used: last to be evicted
        except OSError:
            pass
        return payload

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{key}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        blob = _MAGIC + hashlib.sha256(data).digest() + data
        try:
            with tmp.open("wb") as f:
                f.write(blob)
            os.replace(tmp, path)
        except BaseException:
            self._discard(tmp)
            raise
        with self._lock:
            self._estimate += len(blob)
            self._written_since_scan += len(blob)
            due = self._estimate > self.max_bytes or self._written_since_scan > self.max_bytes // 8
            if due:
                self._written_since_scan = 0
        if due:
            total = self._scan_and_evict()
            with self._lock:
                self._estimate = total

    def __contains__(self, key: str) -> bool:
        return self._path(key).is_file()

    def _scan_and_evict(self) -> int:
        """Total size after evicting oldest entries down to 90% of max_bytes (so eviction
        is not triggered again by the very next write)."""
        entries: list[tuple[float, int, Path]] = []
        now = time.time()
        for sub in self.root.iterdir() if self.root.is_dir() else ():
            if not sub.is_dir():
                continue
            for f in sub.iterdir():
                try:
                    st = f.stat()
                except OSError:
                    continue  # evicted or replaced by another process meanwhile
                if f.name.endswith(".tmp"):
                    if now - st.st_mtime > _STALE_TMP_SECONDS:
                        self._discard(f)
                    continue
                entries.append((st.st_mtime, st.st_size, f))
        total = sum(size for _, size, _ in entries)
        if total <= self.max_bytes:
            return total
        target = int(self.max_bytes * 0.9)
        entries.sort(key=lambda e: e[0])
        for _, size, f in entries:
            if total <= target:
                break
            self._discard(f)
            total -= size
        return total

    @staticmethod
    def _discard(path: Path) -> None:
        try:
            path.unlink()
        except OSError:
            pass


class PayloadLookup:
    """A cache's entries found by the sha256 of their payload (the header's hash: what a run
    records of the bytes it sent), read only: it creates, refreshes and evicts nothing. The
    headers are read once, on the first lookup (39 bytes an entry); a payload is returned
    only when it still hashes to what was asked."""

    def __init__(self, root: Path | None) -> None:
        self.root = Path(root) if root is not None else None
        self._index: dict[str, Path] | None = None

    def _scan(self) -> dict[str, Path]:
        index: dict[str, Path] = {}
        if self.root is None or not self.root.is_dir():
            return index
        for sub in self.root.iterdir():
            if not sub.is_dir():
                continue
            for f in sub.iterdir():
                if f.name.endswith(".tmp"):
                    continue
                try:
                    with open(f, "rb") as fh:
                        head = fh.read(_HEADER)
                except OSError:
                    continue
                if head.startswith(_MAGIC) and len(head) == _HEADER:
                    index[head[len(_MAGIC):].hex()] = f
        return index

    def get(self, sha256: str) -> bytes | None:
        """The payload whose sha256 is `sha256`, or None when the cache does not hold it."""
        if self._index is None:
            self._index = self._scan()
        path = self._index.get(sha256)
        if path is None:
            return None
        try:
            payload = path.read_bytes()[_HEADER:]
        except OSError:
            return None
        return payload if hashlib.sha256(payload).hexdigest() == sha256 else None
