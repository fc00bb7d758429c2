"""The cache of loaded questions: reused while the sources are unchanged, never stale."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from datasets_fake import write_rsvqa

from pytest_satbench.datasets import registry
from pytest_satbench.datasets.cache import load_questions
from pytest_satbench.datasets.registry import LoadRequest


def test_cache_hit_change_and_corruption(tmp_path: Path) -> None:
    write_rsvqa(tmp_path / "data", "lr", n_images=3)
    real = registry.get("rsvqa_lr")
    calls = []
    bench = dataclasses.replace(real, load=lambda req: calls.append(1) or real.load(req))  # counts loads
    cache = tmp_path / "cache"
    cache.mkdir()
    req = LoadRequest(tmp_path / "data")

    first = load_questions(bench, req, cache)
    again = load_questions(bench, req, cache)
    assert len(calls) == 1  # the second time came from the cache
    assert again == first and again[0].image is again[1].image  # equal, images still shared

    limited = load_questions(bench, LoadRequest(tmp_path / "data", limit=4), cache)
    assert len(calls) == 2 and len(limited) == 4  # other options: another entry

    qfile = tmp_path / "data" / "RSVQA-LR" / "LR_split_test_questions.json"
    os.utime(qfile, ns=(qfile.stat().st_atime_ns, qfile.stat().st_mtime_ns + 10**9))
    load_questions(bench, req, cache)
    assert len(calls) == 3  # a changed source file is parsed again

    for f in cache.glob("rsvqa_lr-*.pickle"):
        f.write_bytes(b"\x80\x05truncated")
    assert load_questions(bench, req, cache) == first
    assert len(calls) == 4  # a broken cache file is a miss, not an error
    assert len(list(cache.glob("rsvqa_lr-*.pickle"))) == 1  # old entries are pruned
