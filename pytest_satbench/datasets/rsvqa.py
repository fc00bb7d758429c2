"""RSVQA-LR and RSVQA-HR (test set 1 and the Philadelphia test set 2).

Format (/work/shared/notes/datasets.md §1-3): per split, `<P>_split_<S>_questions.json` =
`{"questions": [...]}` and `..._answers.json` = `{"answers": [...]}`, views of one global
database. Records of other splits are stubs `{"id": N, "active": false}` with no other key,
so `active` is read before anything else. Answers are joined through `answers_ids[0]`,
which works whether or not the two lists are positionally aligned. Images are
`<image dir>/<img_id>.tif` (HR also ships `.png` copies).

All four question types are kept (presence, comp, count, rural_urban or area); scoring
reports exact match and, for count/area, the original RSVQA binned classes as a second view.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..question import ImageRef, Question
from ..registry import (
    Benchmark,
    DatasetError,
    LoadRequest,
    register,
    sort_by_image,
    stratified_limit,
)

_QUESTION_KEYS = ("id", "img_id", "type", "question", "answers_ids")


def _read_list(path: Path, top_key: str) -> list[Any]:
    try:
        with open(path, "rb") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise DatasetError(f"{path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DatasetError(
            f"{path}: not valid JSON ({exc}); re-extract the file from the RSVQA archive"
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get(top_key), list):
        raise DatasetError(
            f"{path}: expected an object with a {top_key!r} list (an RSVQA split file)"
        )
    return doc[top_key]


def load_rsvqa_split(
    root: Path,
    *,
    benchmark: str,
    prefix: str,
    split: str,
    image_dir: str,
    extensions: tuple[str, ...] = ("tif",),
    limit: int | None = None,
    seed: int = 0,
) -> list[Question]:
    qpath = root / f"{prefix}_split_{split}_questions.json"
    apath = root / f"{prefix}_split_{split}_answers.json"

    answers: dict[int, str] = {}
    for i, rec in enumerate(_read_list(apath, "answers")):
        if not isinstance(rec, dict):
            raise DatasetError(f"{apath}: record {i} is not an object")
        if not rec.get("active"):
            continue
        try:
            answers[rec["id"]] = str(rec["answer"])
        except KeyError as exc:
            raise DatasetError(f"{apath}: record {i} (id {rec.get('id')}): missing key {exc}") from None

    images: dict[Any, ImageRef] = {}
    texts: dict[str, str] = {}  # one string object per distinct question text (templates repeat)
    questions: list[Question] = []
    for i, rec in enumerate(_read_list(qpath, "questions")):
        if not isinstance(rec, dict):
            raise DatasetError(f"{qpath}: record {i} is not an object")
        if not rec.get("active"):
            continue
        missing = [k for k in _QUESTION_KEYS if k not in rec]
        if missing:
            raise DatasetError(
                f"{qpath}: record {i} (id {rec.get('id')}): missing key {missing[0]!r}"
            )
        ids = rec["answers_ids"]
        if not isinstance(ids, list) or not ids:
            raise DatasetError(f"{qpath}: record {i} (id {rec['id']}): 'answers_ids' is empty")
        if ids[0] not in answers:
            raise DatasetError(
                f"{qpath}: record {i} (id {rec['id']}): answer id {ids[0]} is not an active "
                f"record of {apath.name}; the two files are from different releases"
            )
        img_id = rec["img_id"]
        ref = images.get(img_id)
        if ref is None:
            ref = images[img_id] = _image_ref(root / image_dir, img_id, extensions)
        text = str(rec["question"])
        questions.append(
            Question(
                benchmark=benchmark,
                key=str(rec["id"]),
                image=ref,
                text=texts.setdefault(text, text),
                answer=answers[ids[0]],
                types=(str(rec["type"]),),
                kind="vqa",
            )
        )
    return sort_by_image(stratified_limit(questions, limit, seed))


def _image_ref(folder: Path, img_id: Any, extensions: tuple[str, ...]) -> ImageRef:
    # A missing image is not a dataset error: its questions fail one by one at run time
    # with the path in the reason, and the rest of the benchmark runs.
    candidates = [folder / f"{img_id}.{ext}" for ext in extensions]
    path = next((p for p in candidates if p.is_file()), candidates[0])
    return ImageRef(id=str(img_id), path=str(path))


def _split(
    name: str, title: str, folder: str, prefix: str, split: str, image_dir: str,
    extensions: tuple[str, ...], types: tuple[str, ...],
) -> Benchmark:
    def load(req: LoadRequest) -> Iterator[Question]:
        yield from load_rsvqa_split(
            req.data_root / folder,
            benchmark=name,
            prefix=prefix,
            split=split,
            image_dir=image_dir,
            extensions=extensions,
            limit=req.limit,
            seed=req.seed,
        )

    return register(
        Benchmark(
            name=name,
            kind="vqa",
            title=title,
            requires=(
                f"{folder}/{prefix}_split_{split}_questions.json",
                f"{folder}/{prefix}_split_{split}_answers.json",
            ),
            load=load,
            types=types,
            metric="exact match (count/area also binned); overall and average accuracy",
        )
    )


RSVQA_LR = _split(
    "rsvqa_lr", "RSVQA-LR test (Sentinel-2, 256 px)", "RSVQA-LR", "LR", "test",
    "Images_LR", ("tif",), ("presence", "comp", "count", "rural_urban"),
)
RSVQA_HR = _split(
    "rsvqa_hr", "RSVQA-HR test set 1 (USGS, 512 px)", "RSVQA-HR", "USGS", "test",
    "Data", ("tif", "png"), ("presence", "comp", "count", "area"),
)
RSVQA_HR_PHILI = _split(
    "rsvqa_hr_phili", "RSVQA-HR test set 2, Philadelphia", "RSVQA-HR", "USGS", "test_phili",
    "Data", ("tif", "png"), ("presence", "comp", "count", "area"),
)
