"""InternVL-style tiling for One-D-Piece: grid choice, crop order, exact stitching. No torch."""

from __future__ import annotations

import random

import numpy as np
import pytest
from PIL import Image

from pytest_satbench.codecs.onedpiece.tiling import (
    TileLayout,
    candidate_grids,
    choose_grid,
    tokens_per_image,
)

# InternVL's dynamic tiling: the candidate order for max_num=12 and worked examples.
NOTES_ORDER_12 = [
    (1, 1), (1, 2), (2, 1), (3, 1), (1, 3), (2, 2), (4, 1), (1, 4), (5, 1), (1, 5), (1, 6), (6, 1),
    (3, 2), (2, 3), (7, 1), (1, 7), (4, 2), (2, 4), (1, 8), (8, 1), (1, 9), (3, 3), (9, 1), (2, 5),
    (5, 2), (10, 1), (1, 10), (11, 1), (1, 11), (12, 1), (3, 4), (4, 3), (1, 12), (6, 2), (2, 6),
]
NOTES_EXAMPLES = [
    ((1920, 1080), (4, 2)),
    ((1280, 720), (4, 2)),
    ((1024, 768), (4, 3)),
    ((640, 480), (4, 3)),
    ((4000, 3000), (4, 3)),
    ((512, 512), (2, 2)),
    ((256, 256), (1, 1)),
    ((100, 100), (1, 1)),
    ((300, 400), (3, 4)),
    ((3000, 1000), (6, 2)),
]


def test_candidate_order_is_internvls() -> None:
    assert list(candidate_grids(12)) == NOTES_ORDER_12


@pytest.mark.parametrize(("size", "grid"), NOTES_EXAMPLES)
def test_worked_examples(size: tuple[int, int], grid: tuple[int, int]) -> None:
    assert choose_grid(*size, max_tiles=12) == grid
    layout = TileLayout.for_size(size, 12)
    assert layout.canvas_size == (256 * grid[0], 256 * grid[1])
    assert tokens_per_image(size, 48, 12) == 48 * grid[0] * grid[1]


def test_tie_goes_to_more_tiles_only_for_large_images() -> None:
    # 2:1 matches (2,1) and (4,2) equally; only an image above half of (4,2)'s area moves up.
    assert choose_grid(1024, 512, 12) == (4, 2)
    assert choose_grid(512, 256, 12) == (2, 1)


def test_cap_is_exact() -> None:
    rng = random.Random(0)
    for _ in range(500):
        w, h = rng.randint(1, 6000), rng.randint(1, 6000)
        cap = rng.randint(1, 16)
        cols, rows = choose_grid(w, h, cap)
        assert 1 <= cols * rows <= cap


def _tile_coloured(layout: TileLayout) -> Image.Image:
    """A canvas where tile i is filled with the colour (i, 255 - i, 7)."""
    canvas = np.zeros((layout.canvas_size[1], layout.canvas_size[0], 3), np.uint8)
    for i in range(layout.count):
        x0, y0, x1, y1 = layout.box(i)
        canvas[y0:y1, x0:x1] = (i, 255 - i, 7)
    return Image.fromarray(canvas)


def test_crops_are_row_major() -> None:
    layout = TileLayout(cols=4, rows=3, tile=256)
    crops = layout.crops(_tile_coloured(layout))
    assert crops.shape == (12, 256, 256, 3) and crops.dtype == np.uint8
    for i in range(12):
        assert (crops[i] == (i, 255 - i, 7)).all()
    assert layout.box(5) == (256, 256, 512, 512)  # row 1, column 1


@pytest.mark.parametrize("size", [(1920, 1080), (300, 400), (512, 512), (100, 100), (3000, 1000), (37, 911)])
def test_identity_round_trip_is_exact(size: tuple[int, int]) -> None:
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    layout = TileLayout.for_size(size, 12)
    stitched = layout.stitch(layout.crops(image))
    assert stitched.size == layout.canvas_size
    assert np.array_equal(np.asarray(stitched), np.asarray(layout.resize(image)))


def test_canvas_sized_image_is_not_resampled() -> None:
    rng = np.random.default_rng(1)
    image = Image.fromarray(rng.integers(0, 256, (512, 512, 3), dtype=np.uint8))
    layout = TileLayout.for_size(image.size, 12)
    assert np.array_equal(np.asarray(layout.stitch(layout.crops(image))), np.asarray(image))


def test_resize_matches_internvl_pil_default() -> None:
    rng = np.random.default_rng(2)
    image = Image.fromarray(rng.integers(0, 256, (400, 300, 3), dtype=np.uint8))
    layout = TileLayout.for_size(image.size, 12)
    # InternVL calls Image.resize with PIL's default resampling.
    assert np.array_equal(np.asarray(layout.resize(image)), np.asarray(image.resize(layout.canvas_size)))


def test_stitch_rejects_wrong_crop_count() -> None:
    layout = TileLayout(2, 2, 8)
    with pytest.raises(ValueError, match=r"expected crops of shape \(4, 8, 8, 3\)"):
        layout.stitch(np.zeros((3, 8, 8, 3), np.uint8))


def test_onedpiece_spec_imports_without_torch(tmp_path) -> None:
    """The codec module is imported by codec discovery (the entry points, on the first
    --recon spec); it must not need torch
    (without torch, normalising a onedpiece spec is a one-line SpecError instead)."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from pytest_satbench.codecs.base import factories, normalise_spec, SpecError\n"
        "assert 'onedpiece' in factories()\n"
        "try:\n"
        f"    normalise_spec('onedpiece:ckpt={tmp_path}/x.bin')\n"
        "except SpecError as e:\n"
        "    print('ERR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ERR" in out.stdout and "pytest-satbench[onedpiece]" in out.stdout
