"""`--plan TAG --width W | --detect D` on a synthetic pilot whose per-image variance is known:
the pilot's estimate, the images it says a width needs, and the width a full run of that many
images then reaches (from the report's own clustered bootstrap)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pytest_satbench.core.compare import cluster_variance, images_for_detect, images_for_width, interval_width
from pytest_satbench.core.records import AnswerRow
from pytest_satbench.engine.store import ResultStore
from pytest_satbench.report.__main__ import main as report_main
from pytest_satbench.report.build import collect
from pytest_satbench.report.plan import plan

BENCH = "demo"
ARM = "jpeg:quality=10"
PER_IMAGE = 5
# per image the reconstruction is right with probability 0.2 or 0.8 (half the images each), the
# original always: Var(D_j) = 5 * E[p(1-p)] + 25 * Var(p) = 0.8 + 2.25, per image / 5^2
TRUE_VARIANCE = (PER_IMAGE * 0.16 + PER_IMAGE**2 * 0.09) / PER_IMAGE**2


def write_sweep(store: ResultStore, run_id: str, tag: str, n_images: int, seed: int, started: float,
                first: int = 0) -> None:
    """A run of `n_images` new images (ids from `first`), 5 questions each, orig and one recon arm."""
    rng = np.random.default_rng(seed)
    keys = n_images * PER_IMAGE
    store.start_run(run_id, tag, {"model": "m", "prompt_style": "geocot", "arms": ["orig", ARM],
                                  "sampling": {"temperature": 0.0, "max_tokens": 64}, "planned": {BENCH: keys}})
    for j in range(first, first + n_images):
        p = 0.2 if rng.random() < 0.5 else 0.8
        for i in range(PER_IMAGE):
            k = j * PER_IMAGE + i
            nodeid = f"t::test_demo[{k}]"
            q = {"key": str(k), "text": "Is there a road?", "answer": "yes", "types": ["presence"], "kind": "vqa",
                 "choices": None, "extra": [], "image_id": f"img{j}", "image_path": None, "prompt": "?"}
            fps = {"orig": f"o{k}", ARM: f"j{k}"}
            store.record_item(run_id, nodeid, BENCH, q, fps)
            for arm, text in (("orig", "yes"), (ARM, "yes" if rng.random() < p else "no")):
                store.put(AnswerRow(nodeid=nodeid, arm=arm, fingerprint=fps[arm], status="ok", benchmark=BENCH,
                                    question_key=str(k), image_id=f"img{j}", text=text, run_id=run_id))
    store.finish_run(run_id)
    # the run took 10 s: 2 answers per question
    store._write("UPDATE runs SET started=?, finished=? WHERE run_id=?", (started, started + 10.0, run_id), wait=True)


def test_the_cluster_variance_is_the_known_one_on_a_large_sample() -> None:
    rng = np.random.default_rng(3)
    ids, vals = [], []
    for j in range(20_000):
        p = 0.2 if rng.random() < 0.5 else 0.8
        for _ in range(PER_IMAGE):
            ids.append(str(j))
            vals.append(float(rng.random() < p) - 1.0)
    cv = cluster_variance(ids, vals)
    assert cv.per_image_variance == pytest.approx(TRUE_VARIANCE, rel=0.03)
    assert cv.mean == pytest.approx(-0.5, abs=0.01)
    # J = (2 z sigma / W)^2 and ((z + z_0.8) sigma / D)^2, sigma in points
    sigma = 100 * math.sqrt(cv.per_image_variance)
    assert images_for_width(cv, 10.0) == math.ceil((2 * 1.959964 * sigma / 10) ** 2)
    assert images_for_detect(cv, 5.0) == math.ceil(((1.959964 + 0.841621) * sigma / 5) ** 2)
    assert interval_width(cv, images_for_width(cv, 10.0)) == pytest.approx(10.0, rel=0.01)


def test_a_pilot_predicts_the_width_a_full_run_reaches(tmp_path: Path, capsys) -> None:
    path = tmp_path / "r.sqlite"
    store = ResultStore(path)
    write_sweep(store, "pilot", "pilot", n_images=60, seed=11, started=1000.0)
    [p] = plan(store, "pilot", width=10.0, detect=5.0)
    overall = next(r for r in p.rows if r.arm == ARM and r.group == "overall")
    # the pilot's estimate of the per-image variance, within its own uncertainty (60 images)
    assert overall.cv.per_image_variance == pytest.approx(TRUE_VARIANCE, rel=0.35)
    # its predicted width now agrees with the report's clustered bootstrap on the same answers
    [pilot] = collect(store, "pilot", iterations=2000)
    boot = pilot.stats.overall.paired[ARM]
    assert interval_width(overall.cv) == pytest.approx(boot.ci_high - boot.ci_low, rel=0.15)
    assert p.rate == pytest.approx(60 * PER_IMAGE * 2 / 10.0)
    need = overall.images_width
    assert need is not None and 120 < need < 300  # the truth: (2 * 1.96 * 34.9 / 10)^2 = 187
    # a full run of that many new images reaches the width asked for, within the pilot's uncertainty
    write_sweep(store, "full", "full", n_images=need, seed=12, started=2000.0, first=1000)
    [full] = collect(store, "full", iterations=2000)
    reached = full.stats.overall.paired[ARM]
    assert reached.ci_high - reached.ci_low == pytest.approx(10.0, rel=0.25)
    store.close()

    assert report_main(["--store", str(path), "--plan", "pilot", "--width", "10", "--detect", "5"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("satbench plan demo: pilot tag pilot (run pilot): 60 images, 300 questions, 2 arm(s)")
    assert out[0].endswith("60.00 answers/s over its runs' wall time")
    row = next(x for x in out if x.startswith("jpeg:q10  overall"))
    cells = row.split()
    assert cells[6:8] == [str(need), str(need * PER_IMAGE)]
    # time: questions x 2 arms at 60 answers/s
    seconds = need * PER_IMAGE * 2 / 60
    assert cells[8] == f"0:{int(round(seconds)) // 60:02d}:{int(round(seconds)) % 60:02d}"
    assert report_main(["--store", str(path), "--plan", "nope", "--width", "1"]) == 2
    assert "no run with tag 'nope'" in capsys.readouterr().err
