"""The demo benchmark's files: exact RSVQA-LR format, read by the real loader, deterministic."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pytest_satbench.datasets import registry
from pytest_satbench.datasets.demo_scenes import N_STUBS, OBJECTS, write_demo_dataset
from pytest_satbench.datasets.registry import LoadRequest
from pytest_satbench.datasets.rsvqa import load_rsvqa_split

N_IMAGES = 12
Q_KEYS = {"id", "date_added", "img_id", "people_id", "type", "question", "answers_ids", "active"}
A_KEYS = {"id", "date_added", "question_id", "people_id", "answer", "active"}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_dataset(tmp_path_factory.mktemp("demo") / "d", n_images=N_IMAGES)


def _records(root: Path) -> tuple[list[dict], list[dict]]:
    qdoc = json.loads((root / "LR_split_test_questions.json").read_text())
    adoc = json.loads((root / "LR_split_test_answers.json").read_text())
    assert list(qdoc) == ["questions"] and list(adoc) == ["answers"]
    return qdoc["questions"], adoc["answers"]


def test_records_follow_the_rsvqa_lr_layout(root: Path) -> None:
    questions, answers = _records(root)
    assert len(questions) == len(answers)
    # Leading stubs carry exactly two keys, like records of other splits in the real files.
    for i in range(N_STUBS):
        assert questions[i] == {"id": i, "active": False}
        assert answers[i] == {"id": i, "active": False}
    complete_inactive = 0
    pairs = zip(questions[N_STUBS:], answers[N_STUBS:], strict=True)
    for i, (q, a) in enumerate(pairs, start=N_STUBS):
        assert set(q) == Q_KEYS and set(a) == A_KEYS
        assert q["id"] == i == a["id"] == a["question_id"]
        assert q["answers_ids"] == [i]
        assert q["active"] == a["active"]
        assert isinstance(q["img_id"], int) and q["people_id"] == 0
        complete_inactive += not q["active"]
    assert complete_inactive == 1


def test_types_templates_and_answers(root: Path) -> None:
    questions, answers = _records(root)
    active = [(q, a) for q, a in zip(questions, answers, strict=True) if q["active"]]
    assert Counter(q["type"] for q, _ in active) == {
        "rural_urban": N_IMAGES, "presence": 3 * N_IMAGES, "count": 3 * N_IMAGES,
        "comp": 3 * N_IMAGES,
    }
    for q, a in active:
        if q["type"] == "rural_urban":
            assert q["question"] == "Is it a rural or an urban area"  # no "?", as in RSVQA
            assert a["answer"] in ("rural", "urban")
        elif q["type"] == "count":
            assert a["answer"].isdigit(), a
        else:
            assert q["question"].endswith("?") and a["answer"] in ("yes", "no")
    # Both answers occur for every yes/no type and both area types occur, so a constant
    # answer cannot score well.
    for t in ("presence", "comp", "rural_urban"):
        assert len({a["answer"] for q, a in active if q["type"] == t}) == 2, t
    asked = " ".join(q["question"] for q, _ in active)
    for obj in OBJECTS:
        assert obj in asked


def test_images_are_uint8_rgb_256(root: Path) -> None:
    questions, _ = _records(root)
    img_ids = {q["img_id"] for q in questions if q.get("active")}
    assert img_ids == set(range(N_IMAGES))
    for img_id in img_ids:
        with Image.open(root / "Images_LR" / f"{img_id}.tif") as im:
            assert im.format == "TIFF" and im.mode == "RGB" and im.size == (256, 256)
            assert np.asarray(im).dtype == np.uint8


def test_real_loader_reads_it_and_skips_inactive_records(root: Path) -> None:
    questions, _ = _records(root)
    qs = load_rsvqa_split(root, benchmark="demo", prefix="LR", split="test",
                          image_dir="Images_LR")
    active_ids = {str(q["id"]) for q in questions if q.get("active")}
    assert {q.key for q in qs} == active_ids
    inactive = next(q for q in questions if "question" in q and not q["active"])
    assert str(inactive["id"]) not in {q.key for q in qs}
    assert all(Path(q.image.path).is_file() for q in qs)  # type: ignore[arg-type]  # path: set for the demo's image files


def test_registered_benchmark_prepares_and_loads(tmp_path: Path) -> None:
    bench = registry.get("demo")
    assert bench.kind == "vqa" and bench.prepare is not None
    data_root = bench.prepare(tmp_path)
    assert data_root.parent == tmp_path and bench.missing(data_root) == []
    full = list(bench.load(LoadRequest(data_root)))
    assert len(full) == 400 and {q.type for q in full} == set(bench.types)
    limited = list(bench.load(LoadRequest(data_root, limit=40, seed=0)))
    # each type in proportion to its size (120/120/120/40 of 400)
    assert Counter(q.type for q in limited) == {"presence": 12, "comp": 12, "count": 12, "rural_urban": 4}
    assert [q.key for q in limited] == [
        q.key for q in bench.load(LoadRequest(data_root, limit=40, seed=0))
    ]


def test_deterministic_and_idempotent(root: Path, tmp_path: Path) -> None:
    again = write_demo_dataset(tmp_path / "again", n_images=N_IMAGES)
    files = sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    for rel in files:
        assert (root / rel).read_bytes() == (again / rel).read_bytes(), rel

    qfile = again / "LR_split_test_questions.json"
    before = qfile.stat().st_mtime_ns
    write_demo_dataset(again, n_images=N_IMAGES)
    assert qfile.stat().st_mtime_ns == before  # complete: left alone

    # An interrupted write leaves no marker (it is written last): the next call redoes it.
    qfile.write_text("{truncated")
    (again / ".satbench-demo.json").unlink()
    write_demo_dataset(again, n_images=N_IMAGES)
    assert qfile.read_bytes() == (root / "LR_split_test_questions.json").read_bytes()

    # Another size is another dataset, not a stale hit.
    write_demo_dataset(again, n_images=3)
    qs = json.loads(qfile.read_text())["questions"]
    assert {q["img_id"] for q in qs if q.get("active")} == {0, 1, 2}


def test_seed_changes_the_scenes(tmp_path: Path) -> None:
    a = write_demo_dataset(tmp_path / "a", n_images=2, seed=0)
    b = write_demo_dataset(tmp_path / "b", n_images=2, seed=1)
    assert (a / "Images_LR/0.tif").read_bytes() != (b / "Images_LR/0.tif").read_bytes()


def test_bad_size_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="n_images"):
        write_demo_dataset(tmp_path, n_images=0)
