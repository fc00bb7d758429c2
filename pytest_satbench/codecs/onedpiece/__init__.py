"""One-D-Piece image tokenizer: an independent PyTorch implementation (`model`), checkpoint
loading (`checkpoint`), batched reconstruction (`engine`) and InternVL-style tiling
(`tiling`). Only `tiling` is imported here: the rest needs torch (the `onedpiece` extra)."""

from pytest_satbench.codecs.onedpiece.tiling import (
    TileLayout,
    candidate_grids,
    choose_grid,
    tokens_per_image,
)

__all__ = ["TileLayout", "candidate_grids", "choose_grid", "tokens_per_image"]
