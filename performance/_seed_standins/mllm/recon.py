"""Stand-in for the seed's `mllm.recon` (One-D-Piece on a GPU), for performance/throughput.py.

The seed script imports `load_onedpiece` and `reconstruct_batch` from here. The benchmark
compares request handling, not tokenizers, so the "reconstruction" is a cheap CPU JPEG
quality-50 round trip; the plugin side of the benchmark registers a codec (`cheap`) that
calls the same `jpeg_roundtrip`, so both clients do identical image work.
"""

from __future__ import annotations

import atexit
import io
import os
from typing import Any

from PIL import Image

QUALITY = 50
# performance/throughput.py reports how many reconstructions each client ran (the seed's per-image
# cache is not single-flight): with this variable set, the count is written there at exit.
COUNT_FILE = os.environ.get("SATBENCH_BENCH_RECON_COUNT")
_calls: list[int] = []  # list.append is atomic under the GIL; no lock needed


@atexit.register
def _write_count() -> None:
    if COUNT_FILE:
        with open(COUNT_FILE, "w") as fh:
            fh.write(str(len(_calls)))


def jpeg_roundtrip(image: Image.Image, quality: int = QUALITY) -> Image.Image:
    _calls.append(1)
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="JPEG", quality=quality)
    buf.seek(0)
    with Image.open(buf) as out:
        out.load()
        return out.convert("RGB")


def load_onedpiece(device: str = "cpu") -> object:
    """No model: the stand-in reconstruction has no weights. The device is ignored."""
    return object()


def reconstruct_batch(opd: Any, images: list[Image.Image], max_tiles: int = 12, nlatent: int = 48,
                      device: str = "cpu") -> list[Image.Image]:
    """The seed's call signature; one reconstruction per input image, same size."""
    return [jpeg_roundtrip(im) for im in images]
