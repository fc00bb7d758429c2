"""LHRS-Bench loader on tiny copies of both layouts (parquet with image bytes; qa.json)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from pytest_satbench.core.question import Question
from pytest_satbench.datasets import lhrs
from pytest_satbench.datasets.registry import DatasetError, LoadRequest, get
from tests.datasets_fake import (
    DEFAULT_LHRS_ROWS,
    LhrsRow,
    Written,
    lhrs_choices_string,
    write_lhrs_parquet,
    write_lhrs_qa_json,
)


def load(root: Path, limit: int | None = None, seed: int = 0) -> list[Question]:
    return list(get("lhrs").load(LoadRequest(root, limit=limit, seed=seed)))


def check_against(qs: list[Question], written: Written) -> None:
    exp = written.by_key()
    assert sorted(q.key for q in qs) == sorted(exp)
    for q in qs:
        e = exp[q.key]
        assert (q.text, q.answer, q.types, q.image.id, q.choices) == (
            e.text, e.answer, e.types, e.image_id, e.choices
        )
        assert q.kind == "mc" and q.benchmark == "lhrs"


# --------------------------------------------------------------------------- parquet

def test_parquet_questions_match_the_file(tmp_path: Path) -> None:
    w = write_lhrs_parquet(tmp_path)
    qs = load(tmp_path)
    assert len(qs) == len(DEFAULT_LHRS_ROWS)
    check_against(qs, w)
    # "C." / "B" / "(E)" / "A. 0.5 m" / option text all become the bare letter
    assert Counter(q.answer for q in qs) == Counter(r.letter for r in DEFAULT_LHRS_ROWS)
    assert any(len(q.types) == 2 for q in qs)  # multi-label rows keep every type


def test_parquet_images_are_embedded_and_shared_per_image(tmp_path: Path) -> None:
    w = write_lhrs_parquet(tmp_path)
    qs = load(tmp_path)
    for q in qs:
        assert q.image.path is None and q.image.read_bytes() == w.images[q.image.id]
    by_image: dict[str, set[int]] = {}
    for q in qs:
        by_image.setdefault(q.image.id, set()).add(id(q.image))
    assert all(len(objs) == 1 for objs in by_image.values())  # one ImageRef (and bytes) per image


def test_parquet_prompt_shows_the_original_choices_string(tmp_path: Path) -> None:
    write_lhrs_parquet(tmp_path)
    for q, row in zip(sorted(load(tmp_path), key=lambda q: int(q.key)), DEFAULT_LHRS_ROWS):
        assert q.get("choices_text") == lhrs_choices_string(row.options)


def test_parquet_choices_as_list_and_type_as_string(tmp_path: Path) -> None:
    w = write_lhrs_parquet(tmp_path, choices_as="list", type_as="string")
    qs = load(tmp_path)
    check_against(qs, w)
    assert all(len(q.types) == 1 for q in qs)
    # reconstructed in the string layout's own shape
    q0 = next(q for q in qs if q.key == "0")
    assert q0.get("choices_text") == "A. Factory; B. Park; C. Farm; D. Forest."


def test_parquet_without_type_column(tmp_path: Path) -> None:
    write_lhrs_parquet(tmp_path, type_as="none")
    assert {q.types for q in load(tmp_path)} == {()}


def test_parquet_question_id_column_gives_the_keys(tmp_path: Path) -> None:
    ids = [100 + 7 * i for i in range(len(DEFAULT_LHRS_ROWS))]
    w = write_lhrs_parquet(tmp_path, question_ids=ids)
    check_against(load(tmp_path), w)


def test_parquet_without_image_paths_uses_a_digest_id(tmp_path: Path) -> None:
    w = write_lhrs_parquet(tmp_path, image_paths=False)
    qs = load(tmp_path)
    check_against(qs, w)
    assert len({q.image.id for q in qs}) == len({r.image for r in DEFAULT_LHRS_ROWS})


def test_parquet_shards_are_read_in_path_order_with_running_keys(tmp_path: Path) -> None:
    first, second = DEFAULT_LHRS_ROWS[:2], DEFAULT_LHRS_ROWS[2:]
    # written out of order on purpose: the key order follows the sorted paths
    w2 = write_lhrs_parquet(tmp_path, second, relpath="LHRS_Bench/data/val-00001-of-00002.parquet",
                            key_offset=len(first))
    w1 = write_lhrs_parquet(tmp_path, first, relpath="LHRS_Bench/data/val-00000-of-00002.parquet")
    qs = load(tmp_path)
    check_against(qs, Written(tmp_path, [], {}, w1.expected + w2.expected))


def test_items_are_sorted_by_image(tmp_path: Path) -> None:
    rows = tuple(reversed(DEFAULT_LHRS_ROWS))
    write_lhrs_parquet(tmp_path, rows)
    ids = [q.image.id for q in load(tmp_path)]
    assert ids == sorted(ids) and len(set(ids)) > 1


def many_rows(per_type: int) -> tuple[LhrsRow, ...]:
    out = []
    for t in ("1", "2", "5"):
        for i in range(per_type):
            out.append(LhrsRow(f"Question {t}-{i}?", ("x", "y", "z", "w"), "A", "A", (t,),
                               f"img_{i % 4}.png"))
    return tuple(out)


def test_limit_is_stratified_by_type_and_reproducible(tmp_path: Path) -> None:
    write_lhrs_parquet(tmp_path, many_rows(10))
    a = load(tmp_path, limit=6)
    assert Counter(q.type for q in a) == {"identity": 2, "color": 2, "quantity": 2}
    assert [q.key for q in a] == [q.key for q in load(tmp_path, limit=6)]
    others = [{q.key for q in load(tmp_path, limit=6, seed=s)} for s in range(1, 6)]
    assert any(o != {q.key for q in a} for o in others)  # the seed really drives the draw
    assert len(load(tmp_path)) == 30


# --------------------------------------------------------------------------- qa.json

@pytest.mark.parametrize("fmt", ["jpg", "png"])
def test_qa_json_layout(tmp_path: Path, fmt: str) -> None:
    w = write_lhrs_qa_json(tmp_path, image_format=fmt)
    assert get("lhrs").missing(tmp_path) == []
    qs = load(tmp_path)
    check_against(qs, w)
    for q in qs:
        assert q.image.path == str(w.images[q.image.id])
        assert Path(q.image.path).parent.name == f"imgs_{fmt}"


def test_qa_json_and_parquet_of_the_same_data_get_the_same_keys(tmp_path: Path) -> None:
    # the qa.json writer flattens in file order (images, then their pairs); a parquet
    # written from that same order must key each question identically
    wj = write_lhrs_qa_json(tmp_path / "a")
    by_text = {e.text: e.key for e in wj.expected}
    flat = tuple(sorted(DEFAULT_LHRS_ROWS, key=lambda r: int(by_text[r.question])))
    write_lhrs_parquet(tmp_path / "b", flat)
    assert {q.text: q.key for q in load(tmp_path / "b")} == by_text


def test_parquet_wins_when_both_layouts_are_present(tmp_path: Path) -> None:
    write_lhrs_qa_json(tmp_path)
    wp = write_lhrs_parquet(tmp_path, DEFAULT_LHRS_ROWS[:3])
    qs = load(tmp_path)
    check_against(qs, wp)


# --------------------------------------------------------------------------- missing files

def test_missing_benchmark_names_where_it_looked(tmp_path: Path) -> None:
    base = tmp_path / "LHRS_Bench"
    assert get("lhrs").missing(tmp_path) == [base / "**/*.parquet", base / "qa.json"]


def test_qa_json_without_image_folders_is_missing(tmp_path: Path) -> None:
    write_lhrs_qa_json(tmp_path, write_images=False)
    assert get("lhrs").missing(tmp_path) == [
        tmp_path / "LHRS_Bench" / "imgs_jpg", tmp_path / "LHRS_Bench" / "imgs_png"
    ]


# --------------------------------------------------------------------------- broken files

def broken_parquet(tmp_path: Path, **changes: object) -> Path:
    rows = list(DEFAULT_LHRS_ROWS)
    rows[2] = LhrsRow(**{**rows[2].__dict__, **changes})
    return write_lhrs_parquet(tmp_path, tuple(rows)).files[0]


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"answer": "Z"}, "answer 'Z' matches no option"),
        ({"answer": "F"}, "answer 'F' is not one of the options A, B, C, D"),
        ({"answer": "C. 5, west"}, "names option C, but C is '4, east'"),
        ({"types": ("12",)}, "type '12' is not an LHRS-Bench type"),
    ],
)
def test_bad_record_names_file_and_row(tmp_path: Path, changes: dict, message: str) -> None:
    path = broken_parquet(tmp_path, **changes)
    with pytest.raises(DatasetError) as err:
        load(tmp_path)
    text = str(err.value)
    assert text.startswith(f"{path}: row 2:") and message in text and "\n" not in text


def test_unparseable_choices_string(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = write_lhrs_parquet(tmp_path).files[0]
    table = pq.read_table(path)
    choices = table.column("choices").to_pylist()
    choices[4] = "Factory or Park"
    table = table.set_column(table.column_names.index("choices"), "choices", pa.array(choices))
    pq.write_table(table, path)
    with pytest.raises(DatasetError, match=r"row 4: choices 'Factory or Park' has no 'A\. \.\.\."):
        load(tmp_path)


def test_missing_column(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    path = write_lhrs_parquet(tmp_path).files[0]
    pq.write_table(pq.read_table(path).drop_columns(["answer"]), path)
    with pytest.raises(DatasetError, match=r"no column 'answer'"):
        load(tmp_path)


def test_garbage_parquet(tmp_path: Path) -> None:
    path = tmp_path / "LHRS_Bench" / "data" / "val-00000-of-00001.parquet"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not parquet at all")
    with pytest.raises(DatasetError, match=r"not a readable parquet file"):
        load(tmp_path)


@pytest.mark.parametrize("bad_id", ["a b", "x::y", "q[1]", "lhrs_7", "vrsbench-3"])
def test_question_id_unusable_in_a_node_id(tmp_path: Path, bad_id: str) -> None:
    ids: list[object] = [str(i) for i in range(len(DEFAULT_LHRS_ROWS))]
    ids[1] = bad_id
    write_lhrs_parquet(tmp_path, question_ids=ids)
    with pytest.raises(DatasetError, match=r"row 1 \(question_id .*\): question id"):
        load(tmp_path)


def test_duplicate_question_id(tmp_path: Path) -> None:
    write_lhrs_parquet(tmp_path, question_ids=[1, 2, 3, 3, 5, 6])
    with pytest.raises(DatasetError, match=r"row 3 \(question_id 3\): key 3 repeats .*row 2"):
        load(tmp_path)


def test_qa_json_not_json(tmp_path: Path) -> None:
    path = write_lhrs_qa_json(tmp_path).files[0]
    path.write_text('{"data": [')
    with pytest.raises(DatasetError, match=r"qa\.json: not valid JSON"):
        load(tmp_path)


def test_qa_json_wrong_shape(tmp_path: Path) -> None:
    path = write_lhrs_qa_json(tmp_path).files[0]
    path.write_text(json.dumps([{"filename": "x.jpg"}]))
    with pytest.raises(DatasetError, match=r"expected an object with a 'data' list"):
        load(tmp_path)


def test_qa_json_record_missing_answer(tmp_path: Path) -> None:
    path = write_lhrs_qa_json(tmp_path).files[0]
    doc = json.loads(path.read_text())
    del doc["data"][1]["qa_pairs"][1]["answer"]
    path.write_text(json.dumps(doc))
    with pytest.raises(DatasetError) as err:
        load(tmp_path)
    assert str(err.value) == (
        f"{path}: data[1] (lhrs_0002.jpg) qa_pairs[1]: missing 'answer'"
    )


# --------------------------------------------------------------------------- parsing rules

@pytest.mark.parametrize(
    "raw, texts",
    [
        ("A. Factory; B. Park; C. Farm; D. Forest.", ("Factory", "Park", "Farm", "Forest")),
        ("A. 0.5 m; B. 1 m", ("0.5 m", "1 m")),
        ("A.Factory B.Park C.Farm", ("Factory", "Park", "Farm")),
        ("(A) St. Louis (B) Park", ("St. Louis", "Park")),
        ("A. north\nB. south\nC. east", ("north", "south", "east")),
        ("Choices: A. yes; B. no", ("yes", "no")),
        (["Factory", "Park", "Farm"], ("Factory", "Park", "Farm")),
        (["A. Factory", "B. Park"], ("Factory", "Park")),
    ],
)
def test_parse_choices(raw: object, texts: tuple[str, ...]) -> None:
    assert lhrs.parse_choices(raw).texts == texts


@pytest.mark.parametrize(
    "raw, letter",
    [("C", "C"), ("C.", "C"), ("(C)", "C"), ("c", "C"), (" C. ", "C"), ("C. Farm", "C"),
     ("Farm", "C"), ("farm.", "C"), ("C) Farm", "C")],
)
def test_answer_letter(raw: str, letter: str) -> None:
    assert lhrs.answer_letter(raw, ("Factory", "Park", "Farm", "Forest")) == letter


@pytest.mark.parametrize(
    "raw, names",
    [(["1"], ("identity",)), (["5", "3"], ("quantity", "orientation")), ("11", ("reasoning",)),
     ("['2', '7']", ("color", "distance")), ([9, 10], ("modality", "location")),
     ("Identity", ("identity",)), (["1", "1"], ("identity",)), (None, ())],
)
def test_parse_types(raw: object, names: tuple[str, ...]) -> None:
    assert lhrs.parse_types(raw) == names


def test_the_benchmark_declares_lhrs_bots_scorer_as_a_labelled_view() -> None:
    bench = get("lhrs")
    assert bench.score_views == frozenset({"lhrs_official"})
    label = bench.labels.view("lhrs_official")
    assert label.title.startswith("lhrs_official: LHRS-Bot's scorer")
    assert "first character" in label.label


def test_loaded_questions_score_under_lhrs_bots_rule(tmp_path: Path) -> None:
    from pytest_satbench.core.scoring import ScoreOptions, score

    write_lhrs_parquet(tmp_path)
    opts = ScoreOptions(views=get("lhrs").score_views)
    for q in load(tmp_path):
        # the loader's answer is the bare letter, which the official rule compares with
        assert score(q, q.answer, opts).view("lhrs_official") == 1.0
        assert score(q, f"The answer is {q.answer}.", opts).view("lhrs_official") == 0.0
