"""DiskCache: hits, misses, key changes, corrupt entries, eviction, concurrent processes."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from pytest_satbench.engine.diskcache import DiskCache


def test_miss_then_hit(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path / "c", max_bytes=1 << 20)
    key = DiskCache.key_for("image-sha", "jpeg:quality=10", "")
    assert cache.get(key) is None and key not in cache
    cache.put(key, b"payload")
    assert cache.get(key) == b"payload" and key in cache
    # A new instance (another run) sees it too.
    assert DiskCache(tmp_path / "c", max_bytes=1 << 20).get(key) == b"payload"


def test_spec_change_is_a_different_key(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=1 << 20)
    a = DiskCache.key_for("img", "onedpiece:nlatent=48", "ckpt-sha256=aa")
    cache.put(a, b"48 tokens")
    for other in (
        DiskCache.key_for("img", "onedpiece:nlatent=64", "ckpt-sha256=aa"),
        DiskCache.key_for("img", "onedpiece:nlatent=48", "ckpt-sha256=bb"),
        DiskCache.key_for("img2", "onedpiece:nlatent=48", "ckpt-sha256=aa"),
    ):
        assert other != a and cache.get(other) is None
    # Parts are length-prefixed, so moving a boundary changes the key.
    assert DiskCache.key_for("ab", "c") != DiskCache.key_for("a", "bc")
    assert DiskCache.key_for("x") == DiskCache.key_for("x") and len(DiskCache.key_for("x")) == 64


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "foreign"])
def test_corrupt_entry_is_a_miss_and_removed(tmp_path: Path, damage: str) -> None:
    cache = DiskCache(tmp_path, max_bytes=1 << 20)
    key = DiskCache.key_for(damage)
    cache.put(key, bytes(range(256)) * 4)
    (path,) = [p for p in tmp_path.rglob(key)]
    blob = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(blob[: len(blob) // 2])
    elif damage == "flip":
        path.write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        path.write_bytes(b"\xff\xd8 a jpeg someone copied here")
    assert cache.get(key) is None
    assert not path.exists()
    cache.put(key, b"fresh")
    assert cache.get(key) == b"fresh"


def test_rejects_non_hex_keys(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=1024)
    with pytest.raises(ValueError, match="key_for"):
        cache.put("../escape", b"x")


def test_eviction_keeps_size_bounded_and_recently_used(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path, max_bytes=10_000)
    keys = [DiskCache.key_for(str(i)) for i in range(40)]
    t0 = time.time() - 1000
    for i, key in enumerate(keys):
        cache.put(key, bytes(1000))
        os.utime(next(tmp_path.rglob(key)), (t0 + i, t0 + i))  # deterministic age order
        if i == 5:
            assert cache.get(keys[0]) is not None  # refreshes keys[0]'s mtime to now
    total = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    assert total <= 10_000
    assert cache.get(keys[-1]) is not None  # the newest survives
    assert cache.get(keys[0]) is not None  # old but recently read: kept
    assert cache.get(keys[1]) is None  # old and unused: evicted


def test_stale_temp_files_are_cleaned(tmp_path: Path) -> None:
    sub = tmp_path / "ab"
    sub.mkdir()
    stale = sub / ".abcd.123.x.tmp"
    stale.write_bytes(b"half")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    fresh = sub / ".abce.124.y.tmp"
    fresh.write_bytes(b"in progress")
    DiskCache(tmp_path, max_bytes=1024)
    assert not stale.exists() and fresh.exists()


def _writer(root: str, worker: int, n: int) -> int:
    cache = DiskCache(Path(root), max_bytes=1 << 30)
    bad = 0
    for i in range(n):
        shared = DiskCache.key_for("shared", str(i % 5))
        cache.put(shared, (f"shared-{i % 5}-".encode()) * 2000)
        own = DiskCache.key_for("own", str(worker), str(i))
        cache.put(own, f"{worker}:{i}".encode() * 500)
        got = cache.get(shared)
        if got is not None and got != (f"shared-{i % 5}-".encode()) * 2000:
            bad += 1
    return bad


def test_concurrent_writer_processes(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(4) as pool:
        bad = pool.starmap(_writer, [(str(tmp_path), w, 40) for w in range(4)])
    assert bad == [0, 0, 0, 0]
    cache = DiskCache(tmp_path, max_bytes=1 << 30)
    for i in range(5):
        assert cache.get(DiskCache.key_for("shared", str(i))) == (f"shared-{i}-".encode()) * 2000
    for w in range(4):
        for i in range(40):
            assert cache.get(DiskCache.key_for("own", str(w), str(i))) == f"{w}:{i}".encode() * 500
    assert not list(tmp_path.rglob("*.tmp"))


def test_concurrent_writers_under_a_small_bound(tmp_path: Path) -> None:
    """Several processes evicting at once neither crash nor leave corrupt entries."""
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(3) as pool:
        pool.starmap(_bounded_writer, [(str(tmp_path), w) for w in range(3)])
    cache = DiskCache(tmp_path, max_bytes=50_000)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    assert total <= 50_000 * 1.5  # each process may overshoot by a fraction before it rescans
    for p in files:
        assert cache.get(p.name) is not None  # every surviving entry is intact


def _bounded_writer(root: str, worker: int) -> None:
    cache = DiskCache(Path(root), max_bytes=50_000)
    for i in range(100):
        key = DiskCache.key_for(str(worker), str(i))
        cache.put(key, bytes([worker]) * 1000)
        cache.get(DiskCache.key_for(str((worker + 1) % 3), str(i)))
