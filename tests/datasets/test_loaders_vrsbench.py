"""VRSBench VQA and referring loaders on tiny copies of the released list-of-dicts files."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from pytest_satbench.core.question import Question
from pytest_satbench.datasets.registry import DatasetError, LoadRequest, get
from tests.datasets_fake import (
    VRSBENCH_REF_SAMPLES,
    VRSBENCH_VQA_SAMPLES,
    Expected,
    box_string,
    write_vrsbench,
)


def load(root: Path, name: str, limit: int | None = None, seed: int = 0) -> list[Question]:
    return list(get(name).load(LoadRequest(root, limit=limit, seed=seed)))


def check_against(qs: list[Question], expected: list[Expected]) -> None:
    exp = {e.key: e for e in expected}
    assert sorted(q.key for q in qs) == sorted(exp)
    for q in qs:
        e = exp[q.key]
        assert (q.text, q.answer, q.types, q.image.id) == (e.text, e.answer, e.types, e.image_id)


def edit(path: Path, fn) -> None:  # rewrite a JSON file in place
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc, indent=4))


# --------------------------------------------------------------------------- VQA

def test_vqa_questions_match_the_file(tmp_path: Path) -> None:
    w = write_vrsbench(tmp_path, n_images=3)
    qs = load(tmp_path, "vrsbench")
    assert len(qs) == 3 * len(VRSBENCH_VQA_SAMPLES)
    check_against(qs, w.extra["vqa"])
    assert {q.kind for q in qs} == {"vqa"}
    for q in qs:  # image_id includes the extension; the path is Images_val/<image_id>
        assert q.image.path == str(w.images[q.image.id])


def test_vqa_keeps_12_raw_types_and_reports_10(tmp_path: Path) -> None:
    write_vrsbench(tmp_path)
    bench = get("vrsbench")
    raw = {q.type for q in load(tmp_path, "vrsbench")}
    assert len(raw) == 12 and {"image", "rural or urban", "scene type"} <= raw
    reported = {bench.reported_type(t) for t in raw}
    assert len(reported) == 10
    assert bench.reported_type("image") == bench.reported_type("rural or urban") == "scene type"
    assert set(bench.types) == raw


def test_vqa_images_shared_and_items_sorted_by_image(tmp_path: Path) -> None:
    w = write_vrsbench(tmp_path, n_images=3)
    # reverse the file so file order and image order disagree
    edit(w.files[0], lambda d: d.reverse())
    qs = load(tmp_path, "vrsbench")
    ids = [q.image.id for q in qs]
    assert ids == sorted(ids)
    assert len({id(q.image) for q in qs}) == 3


def test_vqa_limit_is_stratified_by_raw_type(tmp_path: Path) -> None:
    write_vrsbench(tmp_path, n_images=4)
    a = load(tmp_path, "vrsbench", limit=24)
    assert Counter(q.type for q in a) == {t: 2 for t, _, _ in VRSBENCH_VQA_SAMPLES}
    assert [q.key for q in a] == [q.key for q in load(tmp_path, "vrsbench", limit=24)]
    assert len(load(tmp_path, "vrsbench", limit=5)) == 12  # at least one per type


def test_old_file_name_is_accepted(tmp_path: Path) -> None:
    w = write_vrsbench(tmp_path, ref=False, vqa_name="RSBench_EVAL_vqa.json")
    assert get("vrsbench").missing(tmp_path) == []
    check_against(load(tmp_path, "vrsbench"), w.extra["vqa"])


def test_image_id_without_extension_gets_png(tmp_path: Path) -> None:
    w = write_vrsbench(tmp_path, ref=False)
    edit(w.files[0], lambda d: [r.update(image_id=r["image_id"][:-4]) for r in d])
    for q in load(tmp_path, "vrsbench"):
        assert q.image.path is not None and Path(q.image.path).is_file()


def test_missing_question_id_uses_the_index(tmp_path: Path) -> None:
    w = write_vrsbench(tmp_path, ref=False)
    edit(w.files[0], lambda d: [r.pop("question_id") for r in d])
    assert {q.key for q in load(tmp_path, "vrsbench")} == {str(i) for i in range(24)}


# --------------------------------------------------------------------------- referring

@pytest.mark.parametrize("unique_key", ["unique", "is_unique"])
def test_ref_questions_match_the_file(tmp_path: Path, unique_key: str) -> None:
    w = write_vrsbench(tmp_path, unique_key=unique_key)  # type: ignore[arg-type]
    qs = load(tmp_path, "vrsbench_ref")
    check_against(qs, w.extra["ref"])
    assert {q.kind for q in qs} == {"ref"}
    by_text = {text: (unique, cls, size) for text, _, unique, cls, size in VRSBENCH_REF_SAMPLES}
    for q in qs:
        unique, cls, size = by_text[q.text]
        assert q.get("unique") == ("1" if unique else "0")
        assert q.get("obj_cls") == cls
        assert q.get("size_group") == (size or "medium")


def test_ref_ground_truth_formula() -> None:
    corners = [0.333984, 0.589844, 0.287109, 0.603516, 0.255859, 0.416016, 0.289062, 0.400391]
    assert box_string(corners) == "{<25><40><33><60>}"


def test_ref_limit_is_stratified_by_uniqueness(tmp_path: Path) -> None:
    write_vrsbench(tmp_path, n_images=3)
    qs = load(tmp_path, "vrsbench_ref", limit=4)
    assert Counter(q.type for q in qs) == {"unique": 2, "non-unique": 2}


@pytest.mark.parametrize("name, file_name", [("vrsbench", "VRSBench_EVAL_vqa.json"),
                                             ("vrsbench_ref", "VRSBench_EVAL_referring.json")])
def test_missing_files_are_named(tmp_path: Path, name: str, file_name: str) -> None:
    assert get(name).missing(tmp_path) == [
        tmp_path / "VRSBench" / file_name, tmp_path / "VRSBench" / "Images_val"
    ]
    write_vrsbench(tmp_path, write_images=False)
    assert get(name).missing(tmp_path) == [tmp_path / "VRSBench" / "Images_val"]


# --------------------------------------------------------------------------- broken files

def test_not_a_list(tmp_path: Path) -> None:
    w = write_vrsbench(tmp_path, ref=False)
    w.files[0].write_text(json.dumps({"data": []}))
    with pytest.raises(DatasetError, match=r"VRSBench_EVAL_vqa\.json: expected a JSON list"):
        load(tmp_path, "vrsbench")


def test_truncated_json(tmp_path: Path) -> None:
    w = write_vrsbench(tmp_path, ref=False)
    w.files[0].write_text(w.files[0].read_text()[:100])
    with pytest.raises(DatasetError, match=r"not valid JSON"):
        load(tmp_path, "vrsbench")


@pytest.mark.parametrize("name, index, change, message", [
    ("vrsbench", 5, lambda r: r.pop("ground_truth"), "missing key 'ground_truth'"),
    ("vrsbench", 5, lambda r: r.pop("type"), "missing key 'type'"),
    ("vrsbench_ref", 3, lambda r: r.update(ground_truth="[1, 2, 3, 4]"),
     "ground_truth '[1, 2, 3, 4]' is not '{<x1><y1><x2><y2>}'"),
    ("vrsbench_ref", 3, lambda r: r.update(ground_truth="{<250><400><330><600>}"),
     "is not on the 0-100 grid"),
    ("vrsbench_ref", 3, lambda r: r.pop("unique"), "('is_unique' or 'unique') is missing"),
    ("vrsbench_ref", 3, lambda r: r.update(unique="maybe"), "is 'maybe'; expected true/false"),
    ("vrsbench_ref", 3, lambda r: r.update(question_id="a b"), "cannot be a pytest node id"),
    ("vrsbench", 5, lambda r: r.update(question_id="vrsbench_ref_5"),
     "contains the benchmark name"),
])
def test_bad_record_names_file_and_record(tmp_path, name, index, change, message) -> None:
    w = write_vrsbench(tmp_path)
    path = w.files[0 if name == "vrsbench" else 1]
    edit(path, lambda d: change(d[index]))
    with pytest.raises(DatasetError) as err:
        load(tmp_path, name)
    text = str(err.value)
    assert text.startswith(f"{path}: record {index}") and message in text, text


def test_record_not_an_object(tmp_path: Path) -> None:
    w = write_vrsbench(tmp_path, ref=False)
    edit(w.files[0], lambda d: d.insert(2, "oops"))
    with pytest.raises(DatasetError, match=r"record 2 is not an object"):
        load(tmp_path, "vrsbench")


def test_duplicate_question_id(tmp_path: Path) -> None:
    w = write_vrsbench(tmp_path, vqa=False)
    edit(w.files[0], lambda d: d[4].update(question_id=1))
    with pytest.raises(DatasetError, match=r"question_id 1 appears more than once"):
        load(tmp_path, "vrsbench_ref")
