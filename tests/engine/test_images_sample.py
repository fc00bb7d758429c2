"""A source image's remembered sha256 is reused only while the file is as it was: the same
size, mtime and content sample. An image rewritten in place with its old mtime restored is
measured again; what the sample reads, and what it costs, are pinned here.

`python tests/engine/test_images_sample.py DIR` measures the cost per image of what a resumed
run does (stat, stat + sample, a full sha256) on 512x512 TIFF and PNG files, RSVQA-HR's size.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

from pytest_satbench.core.question import ImageRef
from pytest_satbench.engine.images import (
    SAMPLE_BLOCK,
    SAMPLE_EDGE,
    ImagePipeline,
    _sample_spans,
    content_sample,
    sample_of,
)
from pytest_satbench.engine.store import ResultStore


def _tiff(path: Path, seed: int, size: int = 512) -> Path:
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, "TIFF")  # uncompressed: the same size whatever the pixels
    return path


def _rewrite_keeping_size_and_mtime(path: Path, new: bytes) -> None:
    st = os.stat(path)
    assert len(new) == st.st_size
    path.write_bytes(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns


def _sha(pipe_store: Path, path: Path, env_full: bool = False) -> str:
    store = ResultStore(pipe_store)
    pipe = ImagePipeline([], store=store)
    pipe.full_check = env_full
    try:
        info = pipe.info(ImageRef(id="a", path=str(path)))
        store.flush()
        return info.sha256
    finally:
        pipe.close()
        store.close()


def test_an_image_rewritten_with_other_pixels_and_its_old_mtime_is_measured_again(tmp_path: Path) -> None:
    path = _tiff(tmp_path / "a.tif", 1)
    store = tmp_path / "r.sqlite"
    first = _sha(store, path)
    assert first == hashlib.sha256(path.read_bytes()).hexdigest()
    other = _tiff(tmp_path / "b.tif", 2).read_bytes()  # another image, same size
    _rewrite_keeping_size_and_mtime(path, other)
    assert _sha(store, path) == hashlib.sha256(other).hexdigest()


def test_a_change_in_any_sampled_block_is_seen(tmp_path: Path) -> None:
    path = _tiff(tmp_path / "a.tif", 3)
    data = path.read_bytes()
    spans = _sample_spans(len(data))
    assert spans[0] == (0, SAMPLE_EDGE) and spans[-1] == (len(data) - SAMPLE_EDGE, SAMPLE_EDGE)
    assert all(n == SAMPLE_BLOCK for _, n in spans[1:-1]) and len(spans) == 18
    assert content_sample(str(path), len(data)) == sample_of(data)
    for off, n in spans:
        changed = bytearray(data)
        changed[off + n // 2] ^= 0xFF  # one byte in this block
        assert sample_of(bytes(changed)) != sample_of(data), (off, n)


def test_what_the_sample_misses_the_full_check_sees(tmp_path: Path) -> None:
    """The documented limit: a change confined to the bytes between sampled blocks (possible
    only in an uncompressed file) keeps the sample; SATBENCH_IMAGE_CHECK=full hashes it all."""
    path = _tiff(tmp_path / "a.tif", 4)
    data = path.read_bytes()
    store = tmp_path / "r.sqlite"
    first = _sha(store, path)
    spans = _sample_spans(len(data))
    gap = spans[1][0] + spans[1][1] + 10  # between the first two middle blocks
    assert gap < spans[2][0]
    changed = bytearray(data)
    changed[gap] ^= 0xFF
    _rewrite_keeping_size_and_mtime(path, bytes(changed))
    assert _sha(store, path) == first  # the sample cannot see it
    assert _sha(store, path, env_full=True) == hashlib.sha256(bytes(changed)).hexdigest()
    assert _sha(store, path) == hashlib.sha256(bytes(changed)).hexdigest()  # and it is remembered


def test_a_small_file_is_sampled_whole(tmp_path: Path) -> None:
    path = _tiff(tmp_path / "a.tif", 5, size=64)
    data = path.read_bytes()
    assert _sample_spans(len(data)) == [(0, len(data))]


def measure(folder: Path, n: int = 200) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for ext, fmt in (("tif", "TIFF"), ("png", "PNG")):
        paths = []
        for i in range(n):
            p = folder / f"{i}.{ext}"
            if not p.exists():
                Image.fromarray(rng.integers(0, 256, (512, 512, 3), dtype=np.uint8)).save(p, fmt)
            paths.append(str(p))
        size = os.path.getsize(paths[0])
        checks = (("stat", lambda p: os.stat(p)),
                  ("stat + sample", lambda p: content_sample(p, os.stat(p).st_size)),
                  ("full sha256", lambda p: hashlib.sha256(Path(p).read_bytes()).hexdigest()))
        for name, fn in checks:
            best = min(_timed(fn, paths) for _ in range(5))
            print(f"{ext} {size / 1e6:.2f} MB  {name:<14} {best * 1e6:7.1f} us/image (page cache warm)")


def _timed(fn, paths: list[str]) -> float:  # noqa: ANN001 (fn: any of the decoders compared)
    t = time.perf_counter()
    for p in paths:
        fn(p)
    return (time.perf_counter() - t) / len(paths)


if __name__ == "__main__":
    measure(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/satbench-image-check"))
