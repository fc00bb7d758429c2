"""The prepared-image cache is bounded by bytes as well as by a count (--cache-mb)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from pytest_satbench.core.question import ImageRef
from pytest_satbench.engine.images import ImagePipeline


def noisy_images(tmp_path: Path, n: int, size: int) -> list[ImageRef]:
    rng = np.random.default_rng(0)
    refs = []
    for i in range(n):
        path = tmp_path / f"{i}.png"
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(path)
        refs.append(ImageRef(id=str(i), path=str(path)))
    return refs


def test_the_cache_keeps_no_more_megabytes_than_allowed(tmp_path: Path) -> None:
    refs = noisy_images(tmp_path, 12, 256)  # noise: ~0.25 MB of JPEG + base64 an image
    pipe = ImagePipeline([], cache_images=100, cache_mb=1)
    try:
        sizes = []
        for ref in refs:
            got = pipe.get(ref).result(timeout=30)
            sizes.append(sum(len(a.jpeg) + len(a.b64) for a in got.arms.values()))
            assert pipe.cached_bytes <= 2**20 or len(pipe._cache) == 1
        assert min(sizes) > 2**20 / 8  # so a count of 12 would have held more than 1 MB
        assert len(pipe._cache) < len(refs)
        assert pipe.cached_bytes == sum(sizes[-len(pipe._cache):])  # the newest are kept
        # what is cached is served from memory, the rest is prepared again
        decodes = pipe.decodes
        pipe.get(refs[-1]).result(timeout=30)
        assert pipe.decodes == decodes
        pipe.get(refs[0]).result(timeout=30)
        assert pipe.decodes == decodes + 1
    finally:
        pipe.close()


def test_an_image_larger_than_the_bound_is_still_kept_while_newest(tmp_path: Path) -> None:
    (ref,) = noisy_images(tmp_path, 1, 512)
    pipe = ImagePipeline([], cache_images=10, cache_mb=0)
    try:
        pipe.get(ref).result(timeout=30)
        decodes = pipe.decodes
        pipe.get(ref).result(timeout=30)
        assert pipe.decodes == decodes and pipe.cached_bytes > 0
    finally:
        pipe.close()
