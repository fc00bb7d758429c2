"""The single-flight image cache alone."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from PIL import Image

from pytest_satbench.codecs.base import ArmSpec, Codec
from pytest_satbench.core.arms import ORIG
from pytest_satbench.core.question import ImageRef
from pytest_satbench.engine.images import ImageError, ImagePipeline


class CountingCodec(Codec):
    def __init__(self) -> None:
        self.arms = (ArmSpec("count"),)
        self.calls = 0
        self._lock = threading.Lock()

    def reconstruct(self, image: Image.Image) -> list[Image.Image]:
        with self._lock:
            self.calls += 1
        time.sleep(0.05)  # long enough for every thread to miss the cache at once
        return [image.resize((image.width // 2, image.height // 2))]

    def output_size(self, size: tuple[int, int]) -> tuple[int, int]:
        return (size[0] // 2, size[1] // 2)


def test_single_flight_one_reconstruction_per_image(tmp_path: Path) -> None:
    path = tmp_path / "a.png"
    Image.new("RGB", (64, 48), (10, 200, 30)).save(path)
    codec = CountingCodec()
    pipe = ImagePipeline([codec], cache_images=4, workers=4)
    ref = ImageRef(id="a", path=str(path))
    with ThreadPoolExecutor(32) as ex:
        prepared = list(ex.map(lambda _: pipe.get(ref).result(), range(64)))
    assert codec.calls == 1
    assert pipe.reconstructions == 1
    first = prepared[0]
    assert all(p is first for p in prepared)
    # both arms are sent at the reconstruction's geometry
    assert first.arms[ORIG].size == first.arms["count"].size == (32, 24)
    with Image.open(__import__("io").BytesIO(first.arms[ORIG].jpeg)) as im:
        assert im.size == (32, 24) and im.format == "JPEG"


def test_corrupt_image_is_one_line_error_naming_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tif"
    bad.write_bytes(b"not an image at all")
    pipe = ImagePipeline([], cache_images=2)
    with pytest.raises(ImageError) as exc:
        pipe.get(ImageRef(id="bad", path=str(bad))).result()
    assert str(bad) in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(ImageError, match="missing.tif"):
        pipe.get(ImageRef(id="m", path=str(tmp_path / "missing.tif"))).result()
