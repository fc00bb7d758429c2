"""InternVL-style dynamic tiling of an image into fixed-size square crops, and the inverse.

The rule is InternVL's `dynamic_preprocess` (OpenGVLab/InternVL, internvl_chat/internvl/train/
dataset.py) adapted to the tokenizer's 256-px input and with the thumbnail left out, so that
`max_tiles` is an exact cap on crops (and so on tokens: nlatent x crops). Pure PIL/numpy: the
tiling is testable, and usable by other codecs, without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from PIL import Image


@lru_cache(maxsize=64)
def candidate_grids(max_tiles: int, min_tiles: int = 1) -> tuple[tuple[int, int], ...]:
    """Every (cols, rows) with min_tiles <= cols*rows <= max_tiles, in InternVL's order.

    InternVL builds the candidates as a Python set and sorts them stably by tile count, so
    grids with the same count keep the set's iteration order; that order decides ties in
    `choose_grid`, so it is reproduced by building the very same set.
    """
    if max_tiles < 1 or min_tiles < 1 or min_tiles > max_tiles:
        raise ValueError(f"max_tiles={max_tiles}, min_tiles={min_tiles}: need 1 <= min <= max")
    grids = {
        (i, j)
        for n in range(min_tiles, max_tiles + 1)
        for i in range(1, n + 1)
        for j in range(1, n + 1)
        if min_tiles <= i * j <= max_tiles
    }
    return tuple(sorted(grids, key=lambda g: g[0] * g[1]))


def choose_grid(width: int, height: int, max_tiles: int, tile: int = 256) -> tuple[int, int]:
    """The (cols, rows) grid InternVL picks for a width x height image.

    The closest aspect ratio wins; an exact tie goes to the later (larger) grid only when
    the image has more than half the grid's pixel area, so small images are not blown up
    into many tiles but large ones are.
    """
    if width < 1 or height < 1:
        raise ValueError(f"image size {width}x{height} is empty")
    aspect = width / height
    area = width * height
    best, best_diff = (1, 1), float("inf")
    for cols, rows in candidate_grids(max_tiles):
        diff = abs(aspect - cols / rows)
        if diff < best_diff:
            best, best_diff = (cols, rows), diff
        elif diff == best_diff and area > 0.5 * tile * tile * cols * rows:
            best = (cols, rows)
    return best


@dataclass(frozen=True, slots=True)
class TileLayout:
    """Where the crops of one image come from: a cols x rows grid of tile x tile squares."""

    cols: int
    rows: int
    tile: int = 256

    @classmethod
    def for_size(cls, size: tuple[int, int], max_tiles: int, tile: int = 256) -> TileLayout:
        cols, rows = choose_grid(size[0], size[1], max_tiles, tile)
        return cls(cols, rows, tile)

    @property
    def count(self) -> int:
        return self.cols * self.rows

    @property
    def canvas_size(self) -> tuple[int, int]:
        return (self.cols * self.tile, self.rows * self.tile)

    def box(self, index: int) -> tuple[int, int, int, int]:
        """Pixel box of crop `index` on the canvas; crops are numbered row-major."""
        x0 = (index % self.cols) * self.tile
        y0 = (index // self.cols) * self.tile
        return (x0, y0, x0 + self.tile, y0 + self.tile)

    def resize(self, image: Image.Image) -> Image.Image:
        """The image stretched (aspect not kept, as InternVL does) onto the grid canvas."""
        rgb = image.convert("RGB")
        if rgb.size == self.canvas_size:
            return rgb
        return rgb.resize(self.canvas_size, Image.Resampling.BICUBIC)

    def crops(self, image: Image.Image) -> np.ndarray:
        """All crops as one uint8 array of shape (count, tile, tile, 3), row-major."""
        canvas = np.asarray(self.resize(image), dtype=np.uint8)
        t = self.tile
        # (rows*t, cols*t, 3) -> (rows, t, cols, t, 3) -> (rows, cols, t, t, 3): row-major crops.
        grid = canvas.reshape(self.rows, t, self.cols, t, 3).transpose(0, 2, 1, 3, 4)
        out = grid.reshape(self.count, t, t, 3)
        # Writable and contiguous, so torch.from_numpy can take it without a copy or warning.
        return out if out.flags.writeable and out.flags.c_contiguous else out.copy()

    def stitch(self, crops: np.ndarray) -> Image.Image:
        """Inverse of `crops`: place crop i at `box(i)` on the canvas."""
        t = self.tile
        if crops.shape != (self.count, t, t, 3):
            raise ValueError(
                f"stitch: expected crops of shape {(self.count, t, t, 3)}, got {tuple(crops.shape)}"
            )
        grid = crops.reshape(self.rows, self.cols, t, t, 3).transpose(0, 2, 1, 3, 4)
        canvas = np.ascontiguousarray(grid.reshape(self.rows * t, self.cols * t, 3))
        return Image.fromarray(canvas.astype(np.uint8, copy=False), "RGB")


def tokens_per_image(size: tuple[int, int], nlatent: int, max_tiles: int, tile: int = 256) -> int:
    """Tokens one image costs: nlatent per crop, no thumbnail."""
    return nlatent * TileLayout.for_size(size, max_tiles, tile).count
