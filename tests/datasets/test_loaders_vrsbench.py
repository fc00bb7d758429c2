"""VRSBench VQA and referring loaders on tiny copies of the released list-of-dicts files."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from pytest_satbench.core.labels import NOTE, OVERALL_ONLY, notes
from pytest_satbench.core.question import Question
from pytest_satbench.datasets.registry import DatasetError, LoadRequest, get
from pytest_satbench.datasets.vrsbench import NO_FLAG, OFF_GRID, RecordErrors
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
    assert len(load(tmp_path, "vrsbench", limit=5)) == 5  # exact total; fewer seats than types


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
    w = write_vrsbench(tmp_path, unique_key=unique_key)  # type: ignore[arg-type]  # unique_key: one of the writer's names
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
    ("vrsbench_ref", 3, lambda r: r.update(ground_truth="{<2.5><4><33><60>}"),
     "ground_truth '{<2.5><4><33><60>}' is not '{<x1><y1><x2><y2>}'"),
    ("vrsbench_ref", 3, lambda r: r.pop("question"), "missing key 'question'"),
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


# --------------------------------------------------------------------------- referring: what loads anyway

def test_ground_truth_off_the_grid_loads_as_the_official_scorer_reads_it(tmp_path: Path) -> None:
    """The released boxes are not clipped (poly2hbb, then int(x * 100)): an object cut by the
    patch border has <-2> or <103>. The official scorer reads digits only: <-2> is 2."""
    w = write_vrsbench(tmp_path, vqa=False)
    gts = {1: "{<-2><5><30><103>}", 5: "{<250><400><330><600>}"}
    edit(w.files[0], lambda d: [d[i].update(ground_truth=gt) for i, gt in gts.items()])
    qs = {q.key: q for q in load(tmp_path, "vrsbench_ref")}
    assert len(qs) == len(w.extra["ref"])  # nothing rejected
    assert qs["1"].answer == "{<2><5><30><103>}" and qs["5"].answer == "{<250><400><330><600>}"
    assert qs["1"].get("ground_truth_raw") == "{<-2><5><30><103>}" and qs["1"].get(NOTE) == OFF_GRID
    assert qs["1"].types == ("unique",) and qs["1"].get("unique") == "1"  # otherwise read as usual
    assert qs["0"].get(NOTE) is None and qs["0"].get("ground_truth_raw") is None
    assert notes(qs.values()) == [f"{OFF_GRID}: 2 questions"]


@pytest.mark.parametrize("change", [lambda r: r.pop("unique"), lambda r: r.update(unique="maybe"),
                                    lambda r: r.update(unique=None)])
def test_record_without_a_uniqueness_flag_counts_in_all_only(tmp_path: Path, change) -> None:
    w = write_vrsbench(tmp_path, vqa=False)
    edit(w.files[0], lambda d: change(d[3]))
    bench = get("vrsbench_ref")
    qs = {q.key: q for q in load(tmp_path, "vrsbench_ref")}
    assert len(qs) == len(w.extra["ref"])
    q = qs["3"]
    assert q.get("unique") is None and q.get(NOTE) == NO_FLAG
    assert [bench.reported_type(t) for t in q.types] == [OVERALL_ONLY]  # in no type, in All
    assert {bench.reported_type(t) for k, x in qs.items() if k != "3" for t in x.types} == {"unique", "non-unique"}
    assert notes(qs.values()) == [f"{NO_FLAG}: 1 question"]


def test_both_notes_on_one_record_count_in_both_lines(tmp_path: Path) -> None:
    w = write_vrsbench(tmp_path, vqa=False)
    edit(w.files[0], lambda d: (d[1].pop("unique"), d[1].update(ground_truth="{<-1><5><30><40>}"),
                                d[2].update(ground_truth="{<3><5><30><101>}")))
    qs = {q.key: q for q in load(tmp_path, "vrsbench_ref")}
    assert qs["1"].answer == "{<1><5><30><40>}" and qs["1"].types == ("uniqueness unknown",)
    assert sorted(notes(qs.values())) == sorted([f"{NO_FLAG}: 1 question", f"{OFF_GRID}: 2 questions"])


def test_unreadable_records_fail_alone(tmp_path: Path) -> None:
    w = write_vrsbench(tmp_path, vqa=False)
    path = w.files[0]
    edit(path, lambda d: (d[2].update(ground_truth="[1, 2, 3, 4]"), d.insert(6, "oops")))
    with pytest.raises(RecordErrors) as err:
        load(tmp_path, "vrsbench_ref")
    exc = err.value
    assert isinstance(exc, DatasetError)  # a caller that knows no better fails the benchmark
    assert str(exc).startswith(f"{path}: record 2 (question_id 2): ground_truth '[1, 2, 3, 4]' is not")
    assert str(exc).endswith("(and 1 more unreadable record)")
    assert [k for k, _ in exc.failed] == ["record2", "record6"]
    assert exc.failed[1][1] == f"{path}: record 6 is not an object"
    # the readable records are all there, selected and ordered as usual
    assert sorted(q.key for q in exc.questions) == sorted(e.key for e in w.extra["ref"] if e.key != "2")
    assert [q.image.id for q in exc.questions] == sorted(q.image.id for q in exc.questions)


def test_a_repeated_question_id_fails_alone(tmp_path: Path) -> None:
    w = write_vrsbench(tmp_path, vqa=False)
    edit(w.files[0], lambda d: d[4].update(question_id=1))
    with pytest.raises(RecordErrors) as err:
        load(tmp_path, "vrsbench_ref")
    assert err.value.failed == [("record4", f"{w.files[0]}: record 4 (question_id 1): question_id 1 appears more than once")]
    assert len(err.value.questions) == len(w.extra["ref"]) - 1


def test_limit_applies_to_the_readable_records(tmp_path: Path) -> None:
    w = write_vrsbench(tmp_path, n_images=3, vqa=False)
    edit(w.files[0], lambda d: d[0].pop("image_id"))
    with pytest.raises(RecordErrors) as err:
        load(tmp_path, "vrsbench_ref", limit=4)
    assert len(err.value.questions) == 4 and len(err.value.failed) == 1
