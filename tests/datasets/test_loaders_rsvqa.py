"""RSVQA-LR / -HR / Philadelphia loaders on tiny copies with the real split-file quirks:
`{"id", "active": false}` stubs, an inactive-but-complete record, answers joined by id."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from pytest_satbench.core.question import Question
from pytest_satbench.datasets.registry import DatasetError, LoadRequest, get
from tests.datasets_fake import Written, write_rsvqa


def load(root: Path, name: str, limit: int | None = None, seed: int = 0) -> list[Question]:
    return list(get(name).load(LoadRequest(root, limit=limit, seed=seed)))


def check_against(qs: list[Question], w: Written) -> None:
    exp = w.by_key()
    assert sorted(q.key for q in qs) == sorted(exp)
    for q in qs:
        e = exp[q.key]
        assert (q.text, q.answer, q.types, q.image.id) == (e.text, e.answer, e.types, e.image_id)


def edit(path: Path, fn) -> None:
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("name, which, types", [
    ("rsvqa_lr", "lr", {"presence", "comp", "count", "rural_urban"}),
    ("rsvqa_hr", "hr", {"presence", "comp", "count", "area"}),
    ("rsvqa_hr_phili", "hr_phili", {"presence", "comp", "count", "area"}),
])
def test_active_questions_only(tmp_path: Path, name: str, which: str, types: set[str]) -> None:
    w = write_rsvqa(tmp_path, which, n_images=2, image_size=8)  # type: ignore[arg-type]  # which: the parameter's "lr" or "hr"
    qs = load(tmp_path, name)
    check_against(qs, w)  # stubs and the inactive-but-complete record are left out
    assert len(qs) == 2 * len(types) and {q.type for q in qs} == types
    for q in qs:
        assert q.image.path == str(w.images[q.image.id])


def test_phili_and_test_split_are_separate(tmp_path: Path) -> None:
    w1 = write_rsvqa(tmp_path, "hr", n_images=1, image_size=8)
    w2 = write_rsvqa(tmp_path, "hr_phili", n_images=2, first_img_id=50, stubs=7, image_size=8)
    check_against(load(tmp_path, "rsvqa_hr"), w1)
    check_against(load(tmp_path, "rsvqa_hr_phili"), w2)


def test_hr_falls_back_to_png(tmp_path: Path) -> None:
    write_rsvqa(tmp_path, "hr", image_ext="png", image_size=8)
    for q in load(tmp_path, "rsvqa_hr"):
        assert q.image.path is not None and q.image.path.endswith(".png")
        assert Path(q.image.path).is_file()


def test_hr_prefers_tif_when_both_exist(tmp_path: Path) -> None:
    write_rsvqa(tmp_path, "hr", image_ext="png", image_size=8)
    write_rsvqa(tmp_path, "hr", image_ext="tif", image_size=8)
    assert all(q.image.path.endswith(".tif") for q in load(tmp_path, "rsvqa_hr"))  # type: ignore[union-attr]  # path: set for images read from files


def test_sorted_by_image_numerically(tmp_path: Path) -> None:
    w = write_rsvqa(tmp_path, "lr", n_images=3, first_img_id=9, image_size=8)
    # file order 11, 10, 9: the loader must give 9, 10, 11 (numeric, not "10" < "9")
    edit(w.files[0], lambda d: d["questions"].reverse())
    ids = [int(q.image.id) for q in load(tmp_path, "rsvqa_lr")]
    assert ids == sorted(ids) and set(ids) == {9, 10, 11}
    assert len({id(q.image) for q in load(tmp_path, "rsvqa_lr")}) == 3  # shared per image


def test_limit_is_stratified_by_type(tmp_path: Path) -> None:
    write_rsvqa(tmp_path, "lr", n_images=3, per_type=3, image_size=8)
    a = load(tmp_path, "rsvqa_lr", limit=8)
    assert Counter(q.type for q in a) == {"presence": 2, "comp": 2, "count": 2, "rural_urban": 2}
    assert [q.key for q in a] == [q.key for q in load(tmp_path, "rsvqa_lr", limit=8)]
    assert len(load(tmp_path, "rsvqa_lr")) == 36


def test_missing_files_are_named(tmp_path: Path) -> None:
    base = tmp_path / "RSVQA-LR"
    assert get("rsvqa_lr").missing(tmp_path) == [
        base / "LR_split_test_questions.json", base / "LR_split_test_answers.json"
    ]


def test_answer_not_in_answers_file(tmp_path: Path) -> None:
    w = write_rsvqa(tmp_path, "lr", image_size=8)
    qpath, apath = w.files
    victim = w.expected[2].key
    edit(apath, lambda d: d["answers"][int(victim)].update(active=False))
    with pytest.raises(DatasetError) as err:
        load(tmp_path, "rsvqa_lr")
    assert str(err.value).startswith(f"{qpath}: question id {victim}: answer id")


def test_active_record_missing_a_key(tmp_path: Path) -> None:
    w = write_rsvqa(tmp_path, "lr", image_size=8)
    edit(w.files[0], lambda d: d["questions"][4].pop("img_id"))
    with pytest.raises(DatasetError, match=r"question id 4: missing key 'img_id'"):
        load(tmp_path, "rsvqa_lr")


def test_answer_record_missing_answer(tmp_path: Path) -> None:
    w = write_rsvqa(tmp_path, "lr", image_size=8)
    edit(w.files[1], lambda d: d["answers"][5].pop("answer"))
    with pytest.raises(DatasetError, match=r"answers\.json: answer id 5: missing key 'ans"):
        load(tmp_path, "rsvqa_lr")


def test_wrong_top_level_key(tmp_path: Path) -> None:
    w = write_rsvqa(tmp_path, "lr", image_size=8)
    w.files[0].write_text(json.dumps({"answers": []}))
    with pytest.raises(DatasetError, match=r"expected an object with a 'questions' list"):
        load(tmp_path, "rsvqa_lr")


def test_truncated_json(tmp_path: Path) -> None:
    w = write_rsvqa(tmp_path, "hr", image_size=8)
    w.files[1].write_text(w.files[1].read_text()[:-10])
    with pytest.raises(DatasetError, match=r"USGS_split_test_answers\.json: not valid JSON"):
        load(tmp_path, "rsvqa_hr")


def test_each_split_declares_its_protocol_and_the_published_view() -> None:
    """The headline is the original RSVQA protocol (LR counts and all areas in classes, HR
    counts exact); the published view covers the types the field's papers report."""
    lr, hr, phili = get("rsvqa_lr").labels, get("rsvqa_hr").labels, get("rsvqa_hr_phili").labels
    assert lr.verdicts == (("count", "binned"),)
    assert hr.verdicts == phili.verdicts == (("area", "binned"),)
    published = {a.name: a for a in lr.aggregates}["published"]
    assert (published.types, published.weighting) == (("presence", "comp", "rural_urban"), "questions")
    assert "GeoChat's convention" in published.label and "count left out" in published.label
    assert {a.name: a for a in hr.aggregates}["published"].types == ("presence", "comp")
    assert lr.overall.startswith("RSVQA overall accuracy (OA), original evaluation")
    assert "count answers in the 5 RSVQA classes" in lr.overall and "counts exact" in hr.overall
