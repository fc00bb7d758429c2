"""Writers of tiny fake benchmark datasets in the exact on-disk formats of the real ones
(as the loaders' docstrings describe them). Each writer returns what it wrote, including the questions a
correct loader must yield (`Expected`), so tests compare loader output with the source.

    from tests.datasets_fake import (
        write_lhrs_parquet, write_lhrs_qa_json, write_rsvqa, write_vrsbench)

All writers take the DATA ROOT (the folder holding `RSVQA-LR/`, `LHRS_Bench/`, ...).
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from PIL import Image


@dataclass(frozen=True)
class Expected:
    """One question a loader must yield, as its Question fields should read."""

    key: str
    text: str
    answer: str
    types: tuple[str, ...]
    image_id: str
    choices: tuple[str, ...] | None = None


@dataclass
class Written:
    """What a writer put on disk."""

    root: Path  # the data root passed in
    files: list[Path]  # dataset files (JSON / parquet), not images
    images: dict[str, Path | bytes]  # image id -> file, or encoded bytes for parquet
    expected: list[Expected]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def keys(self) -> set[str]:
        return {e.key for e in self.expected}

    def by_key(self) -> dict[str, Expected]:
        return {e.key: e for e in self.expected}


def image_bytes(seed: int, size: int = 32, fmt: str = "PNG") -> bytes:
    """Encoded bytes of a deterministic, seed-specific RGB image."""
    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt)
    return buf.getvalue()


def write_image(path: Path, seed: int, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fmt = {".tif": "TIFF", ".png": "PNG", ".jpg": "JPEG"}[path.suffix]
    path.write_bytes(image_bytes(seed, size, fmt))
    return path


# --------------------------------------------------------------------------- RSVQA

_RSVQA_SAMPLES = {
    "presence": ("Is there a residential building in the image?", "yes"),
    "comp": ("Are there more roads than water areas?", "no"),
    "count": ("What is the number of roads?", "403"),
    "rural_urban": ("Is it a rural or an urban area", "urban"),
    "area": ("What is the area covered by residential buildings?", "2173m2"),
}


def write_rsvqa(
    root: Path,
    which: Literal["lr", "hr", "hr_phili"] = "lr",
    *,
    n_images: int = 2,
    per_type: int = 1,
    stubs: int = 3,
    first_img_id: int = 10,
    image_ext: str = "tif",
    image_size: int | None = None,
    write_images: bool = True,
) -> Written:
    """RSVQA-LR / -HR test split: `stubs` leading `{"id", "active": false}` records, then
    for each image `per_type` active questions of each type, plus one inactive-but-complete
    record (another split's question). Ids are contiguous, answers_ids == [id]."""
    folder, prefix, image_dir, split, types, default_size = {
        "lr": ("RSVQA-LR", "LR", "Images_LR", "test",
               ("presence", "comp", "count", "rural_urban"), 256),
        "hr": ("RSVQA-HR", "USGS", "Data", "test", ("presence", "comp", "count", "area"), 512),
        "hr_phili": ("RSVQA-HR", "USGS", "Data", "test_phili",
                     ("presence", "comp", "count", "area"), 512),
    }[which]
    base = root / folder
    base.mkdir(parents=True, exist_ok=True)
    questions: list[dict[str, Any]] = [{"id": i, "active": False} for i in range(stubs)]
    answers: list[dict[str, Any]] = [{"id": i, "active": False} for i in range(stubs)]
    expected: list[Expected] = []
    images: dict[str, Path | bytes] = {}

    def add(img_id: int, qtype: str, text: str, answer: str, active: bool) -> None:
        qid = len(questions)
        questions.append({
            "id": qid, "date_added": 1569489630.7, "img_id": img_id, "people_id": 0,
            "type": qtype, "question": text, "answers_ids": [qid], "active": active,
        })
        answers.append({
            "id": qid, "date_added": 1569489630.7, "question_id": qid, "people_id": 0,
            "answer": answer, "active": active,
        })
        if active:
            expected.append(Expected(str(qid), text, answer, (qtype,), str(img_id)))

    for n in range(n_images):
        img_id = first_img_id + n
        for qtype in types:
            for k in range(per_type):
                text, answer = _RSVQA_SAMPLES[qtype]
                add(img_id, qtype, text if k == 0 else f"{text[:-1]} {k}?", answer, True)
        if write_images:
            images[str(img_id)] = write_image(
                base / image_dir / f"{img_id}.{image_ext}", img_id, image_size or default_size
            )
    # Complete but inactive: belongs to another split, must not be loaded.
    add(first_img_id, types[0], "Is there an inactive question?", "no", False)
    qpath = base / f"{prefix}_split_{split}_questions.json"
    apath = base / f"{prefix}_split_{split}_answers.json"
    qpath.write_text(json.dumps({"questions": questions}))
    apath.write_text(json.dumps({"answers": answers}))
    return Written(root, [qpath, apath], images, expected,
                   extra={"folder": base, "image_dir": base / image_dir})



def write_rsvqa_counts(
    root: Path,
    counts: dict[str, int],
    *,
    which: Literal["lr", "hr"] = "lr",
    n_images: int = 10,
    image_size: int = 16,
    first_img_id: int = 10,
    stubs: int = 3,
    answer: Callable[[str, int], str] | None = None,
) -> Written:
    """An RSVQA-LR / -HR test split with exactly `counts[type]` active questions of each type
    (types of the split only; a type left out gets none), spread round-robin over `n_images`
    small images (`image_size` px, to keep a run of thousands of questions fast), after
    `stubs` inactive stubs. The k-th question of a type (k = 0, 1, ...) reads as the type's
    sample question numbered k ("Is there a residential building in the image 17?") and its
    ground truth is `answer(type, k)` (default: the sample answer). answers_ids == [id]."""
    folder, prefix, image_dir, types = {
        "lr": ("RSVQA-LR", "LR", "Images_LR", ("presence", "comp", "count", "rural_urban")),
        "hr": ("RSVQA-HR", "USGS", "Data", ("presence", "comp", "count", "area")),
    }[which]
    unknown = set(counts) - set(types)
    if unknown:
        raise ValueError(f"write_rsvqa_counts: {sorted(unknown)} are not RSVQA-{which.upper()} types")
    base = root / folder
    base.mkdir(parents=True, exist_ok=True)
    questions: list[dict[str, Any]] = [{"id": i, "active": False} for i in range(stubs)]
    answers: list[dict[str, Any]] = [{"id": i, "active": False} for i in range(stubs)]
    expected: list[Expected] = []
    n = 0
    for qtype in types:
        sample, default = _RSVQA_SAMPLES[qtype]
        for k in range(counts.get(qtype, 0)):
            qid, img_id = len(questions), first_img_id + n % n_images
            text, gt = f"{sample.rstrip('?')} {k}?", answer(qtype, k) if answer else default
            questions.append({"id": qid, "date_added": 1569489630.7, "img_id": img_id, "people_id": 0,
                              "type": qtype, "question": text, "answers_ids": [qid], "active": True})
            answers.append({"id": qid, "date_added": 1569489630.7, "question_id": qid, "people_id": 0,
                            "answer": gt, "active": True})
            expected.append(Expected(str(qid), text, gt, (qtype,), str(img_id)))
            n += 1
    images: dict[str, Path | bytes] = {
        str(first_img_id + i): write_image(base / image_dir / f"{first_img_id + i}.tif", first_img_id + i, image_size)
        for i in range(min(n_images, n))
    }
    qpath = base / f"{prefix}_split_test_questions.json"
    apath = base / f"{prefix}_split_test_answers.json"
    qpath.write_text(json.dumps({"questions": questions}))
    apath.write_text(json.dumps({"answers": answers}))
    return Written(root, [qpath, apath], images, expected,
                   extra={"folder": base, "image_dir": base / image_dir})


# --------------------------------------------------------------------------- LHRS-Bench

@dataclass(frozen=True)
class LhrsRow:
    question: str
    options: tuple[str, ...]
    answer: str  # exactly as written to the file: "C", "C.", "(B)", "Farm", ...
    letter: str  # the letter the loader must produce
    types: tuple[str, ...]  # ids "1".."11"
    image: str  # image file name


LHRS_TYPE_NAMES = {
    "1": "identity", "2": "color", "3": "orientation", "4": "shape", "5": "quantity",
    "6": "area", "7": "distance", "8": "resolution", "9": "modality", "10": "location",
    "11": "reasoning",
}

DEFAULT_LHRS_ROWS = (
    LhrsRow("What is the main land-use type in the image?",
            ("Factory", "Park", "Farm", "Forest"), "C.", "C", ("1",), "lhrs_0001.png"),
    LhrsRow("What color are the roofs?", ("Red", "Blue", "Grey", "Green"),
            "B", "B", ("2",), "lhrs_0001.png"),
    LhrsRow("How many ships are docked and which way do they face?",
            ("2, north", "3, south", "4, east", "5, west"), "D", "D", ("5", "3"), "lhrs_0002.png"),
    LhrsRow("What is the shape of the pond?", ("Round", "Square", "Triangular", "Oval"),
            "Square", "B", ("4",), "lhrs_0002.png"),
    LhrsRow("Which facility is nearest the river?",
            ("School", "Hospital", "Stadium", "Airport", "Harbor", "Mall"),
            "(E)", "E", ("7", "10"), "lhrs_0003.png"),
    LhrsRow("What is the likely ground resolution?", ("0.5 m", "1 m", "10 m", "30 m"),
            "A. 0.5 m", "A", ("8",), "lhrs_0003.png"),
)


def lhrs_choices_string(options: tuple[str, ...]) -> str:
    return "; ".join(f"{'ABCDEFGHIJKLMNOP'[i]}. {o}" for i, o in enumerate(options)) + "."


def _lhrs_expected(
    rows: tuple[LhrsRow, ...], keys: list[str], image_ids: list[str]
) -> list[Expected]:
    return [
        Expected(key, r.question, r.letter, tuple(LHRS_TYPE_NAMES.get(t, t) for t in r.types),
                 image_id, r.options)
        for r, key, image_id in zip(rows, keys, image_ids)
    ]


def write_lhrs_parquet(
    root: Path,
    rows: tuple[LhrsRow, ...] = DEFAULT_LHRS_ROWS,
    *,
    relpath: str = "LHRS_Bench/data/val-00000-of-00001.parquet",
    choices_as: Literal["string", "list"] = "string",
    type_as: Literal["list", "string", "none"] = "list",
    question_ids: list[Any] | None = None,
    image_paths: bool = True,
    key_offset: int = 0,
) -> Written:
    """The HF `datasets` parquet layout: image struct<bytes, path> with PNG bytes.

    `type_as="string"` writes the first type id only; `question_ids` adds that column;
    `image_paths=False` leaves the struct's path null (ids then come from the bytes);
    `key_offset` is the number of rows in parquet files sorted before this one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = root / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    names = sorted({r.image for r in rows})
    blobs = {name: image_bytes(1000 + names.index(name) + key_offset) for name in names}
    columns: dict[str, pa.Array] = {
        "image": pa.array(
            [{"bytes": blobs[r.image], "path": r.image if image_paths else None} for r in rows],
            type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
        ),
        "question": pa.array([r.question for r in rows], pa.string()),
        "choices": (
            pa.array([lhrs_choices_string(r.options) for r in rows], pa.string())
            if choices_as == "string"
            else pa.array([list(r.options) for r in rows], pa.list_(pa.string()))
        ),
        "answer": pa.array([r.answer for r in rows], pa.string()),
    }
    if type_as == "list":
        columns["type"] = pa.array([list(r.types) for r in rows], pa.list_(pa.string()))
    elif type_as == "string":
        columns["type"] = pa.array([r.types[0] for r in rows], pa.string())
    if question_ids is not None:
        columns["question_id"] = pa.array(question_ids)
    pq.write_table(pa.table(columns), path)

    if type_as == "string":
        rows = tuple(
            LhrsRow(r.question, r.options, r.answer, r.letter, r.types[:1], r.image) for r in rows
        )
    elif type_as == "none":
        rows = tuple(LhrsRow(r.question, r.options, r.answer, r.letter, (), r.image) for r in rows)
    keys = ([str(q) for q in question_ids] if question_ids is not None
            else [str(key_offset + i) for i in range(len(rows))])
    image_ids = [r.image if image_paths else hashlib.sha1(blobs[r.image]).hexdigest()[:16]
                 for r in rows]
    return Written(root, [path], {i: blobs[r.image] for i, r in zip(image_ids, rows)},
                   _lhrs_expected(rows, keys, image_ids))


def write_lhrs_qa_json(
    root: Path,
    rows: tuple[LhrsRow, ...] = DEFAULT_LHRS_ROWS,
    *,
    image_format: Literal["jpg", "png"] = "jpg",
    write_images: bool = True,
) -> Written:
    """The original release: `LHRS_Bench/qa.json` + `imgs_jpg/` (or `imgs_png/`).
    Image file names in qa.json carry the folder's extension."""
    base = root / "LHRS_Bench"
    base.mkdir(parents=True, exist_ok=True)
    order: list[str] = []
    for r in rows:
        if r.image not in order:
            order.append(r.image)
    fname = {name: f"{Path(name).stem}.{image_format}" for name in order}
    data = [
        {
            "filename": fname[name],
            "qa_pairs": [
                {"question": r.question, "choices": lhrs_choices_string(r.options),
                 "answer": r.answer, "type": list(r.types)}
                for r in rows if r.image == name
            ],
        }
        for name in order
    ]
    qtype = {f"{k} {v}": v for k, v in LHRS_TYPE_NAMES.items()}
    path = base / "qa.json"
    path.write_text(json.dumps({"data": data, "qtype": qtype}, indent=2))
    images: dict[str, Path | bytes] = {}
    if write_images:
        for n, name in enumerate(order):
            images[fname[name]] = write_image(
                base / f"imgs_{image_format}" / fname[name], 2000 + n, 32
            )
    flat = [r for name in order for r in rows if r.image == name]  # file order
    expected = _lhrs_expected(tuple(flat), [str(i) for i in range(len(flat))],
                              [fname[r.image] for r in flat])
    return Written(root, [path], images, expected)


# --------------------------------------------------------------------------- VRSBench

VRSBENCH_VQA_SAMPLES = (
    ("object category", "What category does the large object in the top-left belong to?", "ship"),
    ("object existence", "Is there a tennis court?", "yes"),
    ("object quantity", "How many vehicles are parked?", "2"),
    ("object color", "What color is the roof of the largest building?", "Yellow"),
    ("object shape", "What shape is the roundabout?", "circular"),
    ("object size", "How large is the storage tank compared with the others?", "larger"),
    ("object position", "Where is the harbor located?", "bottom-left"),
    ("object direction", "Which direction does the runway run?", "north-south"),
    ("scene type", "What type of scene is shown?", "airport"),
    ("image", "What kind of image is this?", "aerial"),
    ("reasoning", "Why are the ships clustered?", "docking"),
    ("rural or urban", "Is this a rural or urban area?", "urban"),
)


def box_string(corners: list[float]) -> str:
    """The authors' GT formula: axis-aligned box of the 4 corners, floor(100 x), clipped."""
    xs, ys = corners[0::2], corners[1::2]
    x1, x2 = int(max(min(xs), 0) * 100), int(min(max(xs), 1) * 100)
    y1, y2 = int(max(min(ys), 0) * 100), int(min(max(ys), 1) * 100)
    return "{" + f"<{x1}><{y1}><{x2}><{y2}>" + "}"


VRSBENCH_REF_SAMPLES = (
    # (expression, obj_corner, unique, obj_cls, size_group)
    ("The large yellow vehicle situated closest to the green area.",
     [0.333984, 0.589844, 0.287109, 0.603516, 0.255859, 0.416016, 0.289062, 0.400391],
     False, "vehicle", ""),
    ("The ship positioned towards the lower right within the image.",
     [0.70, 0.80, 0.90, 0.80, 0.90, 0.95, 0.70, 0.95], True, "ship", "large"),
    ("The thin bridge at the top.",  # zero height: y1 == y2
     [0.92, 0.0, 0.96, 0.0, 0.96, 0.0, 0.92, 0.0], True, "bridge", "small"),
    ("A small storage tank near the left edge.",
     [0.01, 0.40, 0.06, 0.40, 0.06, 0.45, 0.01, 0.45], False, "storage-tank", "small"),
)


def write_vrsbench(
    root: Path,
    *,
    n_images: int = 2,
    vqa: bool = True,
    ref: bool = True,
    unique_key: Literal["unique", "is_unique"] = "unique",
    image_size: int = 512,
    write_images: bool = True,
    vqa_name: str = "VRSBench_EVAL_vqa.json",
    ref_name: str = "VRSBench_EVAL_referring.json",
) -> Written:
    """`VRSBench/VRSBench_EVAL_{vqa,referring}.json` (lists, indent=4, the released key
    set) and `Images_val/<image_id>` PNGs. Every image gets all 12 VQA types and all
    referring samples. `extra["vqa"]` / `extra["ref"]` hold the Expected lists; ref
    expectations carry `unique` in `types` as the loader must produce."""
    base = root / "VRSBench"
    base.mkdir(parents=True, exist_ok=True)
    image_ids = [f"P{3 + n:04d}_{2 + n:04d}.png" for n in range(n_images)]
    images: dict[str, Path | bytes] = {}
    if write_images:
        for n, image_id in enumerate(image_ids):
            images[image_id] = write_image(base / "Images_val" / image_id, 3000 + n, image_size)
    files: list[Path] = []
    exp_vqa: list[Expected] = []
    exp_ref: list[Expected] = []
    if vqa:
        recs = []
        for image_id in image_ids:
            for qtype, text, gt in VRSBENCH_VQA_SAMPLES:
                qid = len(recs)
                recs.append({"image_id": image_id, "question": text, "ground_truth": gt,
                             "dataset": "RSBench", "question_id": qid, "type": qtype})
                exp_vqa.append(Expected(str(qid), text, gt, (qtype,), image_id))
        (base / vqa_name).write_text(json.dumps(recs, indent=4))
        files.append(base / vqa_name)
    if ref:
        recs = []
        for image_id in image_ids:
            for text, corners, unique, cls, size in VRSBENCH_REF_SAMPLES:
                qid = len(recs)
                gt = box_string(corners)
                recs.append({"image_id": image_id, "question": text, "ground_truth": gt,
                             "dataset": "RSBench", "question_id": qid, "type": "ref",
                             unique_key: unique, "obj_corner": corners, "obj_cls": cls,
                             "obj_ids": [0], "size_group": size})
                exp_ref.append(Expected(str(qid), text, gt,
                                        ("unique",) if unique else ("non-unique",), image_id))
        (base / ref_name).write_text(json.dumps(recs, indent=4))
        files.append(base / ref_name)
    return Written(root, files, images, exp_vqa + exp_ref,
                   extra={"vqa": exp_vqa, "ref": exp_ref, "image_ids": image_ids})


def rsvqa_suite(pytester: Any, module: str, *, n_images: int, per_type: int) -> Path:
    """A pytester directory with a benchmark test module and an RSVQA-LR data root;
    returns the data root."""
    pytester.makepyfile(test_bench=module)
    root = pytester.path / "data"
    write_rsvqa(root, "lr", n_images=n_images, per_type=per_type)
    return root
