"""Option parsing: the seed's One-D-Piece shorthands."""

from __future__ import annotations

import pytest


def test_seed_shorthands_expand_to_onedpiece_arms(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_satbench.plugin.options import _expand_onedpiece

    out = _expand_onedpiece(["onedpiece:ckpt=/w/s.bin", "jpeg:quality=10"], "16,64", "6", "cuda:7")
    assert out == [
        "jpeg:quality=10",
        "onedpiece:ckpt=/w/s.bin,max_tiles=6,device=cuda:7,nlatent=16",
        "onedpiece:ckpt=/w/s.bin,max_tiles=6,device=cuda:7,nlatent=64",
    ]
    monkeypatch.delenv("SATBENCH_ONEDPIECE_CKPT", raising=False)
    with pytest.raises(pytest.UsageError, match="need a One-D-Piece checkpoint"):
        _expand_onedpiece([], "16", None, None)
    monkeypatch.setenv("SATBENCH_ONEDPIECE_CKPT", "/w/s.bin")
    assert _expand_onedpiece([], "8", None, None) == ["onedpiece:nlatent=8"]
