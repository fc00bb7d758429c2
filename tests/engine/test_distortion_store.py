"""The distortion table of the results store: kept once per (original, arm) pair of images
sent, read back one at a time or in batches, and made in stores written before it existed."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

from pytest_satbench.core.records import Distortion
from pytest_satbench.engine.store import ResultStore


def test_distortion_round_trip_infinity_and_batches(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r.sqlite")
    store.put_distortion("o1", "a1", Distortion(math.inf, 1.0, 1.0))
    store.put_distortion("o1", "a2", Distortion(31.5, 0.91, 0.95, 0.12), lpips_weights="w1")
    store.flush()
    assert store.distortion("o1", "a1") == Distortion(math.inf, 1.0, 1.0)  # identical: inf, not NULL
    assert store.distortion("o1", "missing") is None
    assert store.distortion("o1", "a2") == Distortion(31.5, 0.91, 0.95, 0.12)
    # other LPIPS weights: the stored LPIPS is not theirs
    assert store.distortion("o1", "a2", lpips_weights="w2") == Distortion(31.5, 0.91, 0.95, None)
    assert store.distortion("o1", "a2", lpips_weights="w1").lpips == 0.12
    many = [(f"o{i}", f"a{i}") for i in range(1000)] + [("o1", "a1"), ("o1", "a2")] * 3
    got = store.distortions(many)
    assert got == {("o1", "a1"): Distortion(math.inf, 1.0, 1.0), ("o1", "a2"): Distortion(31.5, 0.91, 0.95, 0.12)}
    assert store.lpips_weights_used(many) == {"w1"}
    assert store.distortions([]) == {}
    store.close()
    reopened = ResultStore(tmp_path / "r.sqlite")  # kept across runs
    assert reopened.distortion("o1", "a1").psnr == math.inf


def test_distortion_table_made_in_an_old_store(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as conn:  # a store from before the table
        conn.execute("CREATE TABLE answers (nodeid TEXT NOT NULL, arm TEXT NOT NULL, fingerprint TEXT NOT NULL, "
                     "status TEXT NOT NULL, benchmark TEXT NOT NULL, question_key TEXT NOT NULL, image_id TEXT NOT NULL, "
                     "created REAL NOT NULL, PRIMARY KEY (nodeid, arm, fingerprint))")
    store = ResultStore(path)
    assert store.distortion("o", "a") is None
    store.put_distortion("o", "a", Distortion(20.0, 0.5))
    store.flush()
    assert store.distortions([("o", "a")]) == {("o", "a"): Distortion(20.0, 0.5)}
