"""RSVQA-LR and RSVQA-HR (test set 1 and the Philadelphia test set 2).

Format (Lobry et al. 2020, the files as distributed on Zenodo): per split, `<P>_split_<S>_questions.json` =
`{"questions": [...]}` and `..._answers.json` = `{"answers": [...]}`, views of one global
database. Records of other splits are stubs `{"id": N, "active": false}` with no other key,
so `active` is read before anything else. Answers are joined through `answers_ids[0]`,
which works whether or not the two lists are positionally aligned. Images are
`<image dir>/<img_id>.tif` (HR also ships `.png` copies).

All four question types are kept (presence, comp, count, rural_urban or area). The
headline figures follow the original RSVQA evaluation (count/area classes, see `_labels`);
the field's published view and exact match per type are reported beside them.

The view ``("binned", 0|1)`` (`binned`, declared in `RSVQA_VIEWS`) for ``count`` and ``area``
questions: the class of the original RSVQA metric (Lobry et al. 2020; syvlo/RSVQA
``VocabEncoder``): ``0`` / ``1-10`` / ``11-100`` / ``101-1000`` / ``>1000`` on the count, or
on the m² value for areas. The final answer (`core.scoring.final_answer`, after
`normalize_vqa`) must be a bare number (an ``m2`` unit is optional for areas). The original
work binned LR counts and HR areas but scored HR counts exactly; we bin every count and area
so the view means one thing everywhere (for HR counts the original metric is the headline).
Other question types have no binned value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pytest_satbench.core.labels import Aggregate, Labels, ViewLabel
from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.core.scoring import ScoreOptions, View, final_answer, normalize_vqa
from pytest_satbench.datasets.registry import Benchmark, DatasetError, LoadRequest, register
from pytest_satbench.datasets.selection import sort_by_image, stratified_limit

_QUESTION_KEYS = ("id", "img_id", "type", "question", "answers_ids")


def _active_only(pairs: list[tuple[str, Any]]) -> dict[str, Any] | None:
    """JSON object hook: inactive records become None as they are parsed.

    An RSVQA-HR split file is ~1M stubs `{"id": N, "active": false}` around 222k real
    records; building a dict for every stub only to drop it doubled the peak memory of
    loading (530 MB -> 310 MB here) and cost time. Objects without an `active` key (the
    top-level object) are kept as they are.
    """
    if len(pairs) == 2 and pairs[1][0] == "active" and pairs[1][1] is False:
        return None  # the common stub, decided without building a dict
    record = dict(pairs)
    if "active" in record and not record["active"]:
        return None
    return record


# `{"id": N, "active": false},` as json.dump writes the stubs: cut from the text before
# parsing, which halves the parse time of an RSVQA-HR file (0.35 s of regex instead of
# ~0.8 s of parsing 1M objects). A stub written any other way is still dropped by the
# object hook; only whole "stub," runs are cut, so the JSON stays valid.
_STUB_THEN_COMMA = re.compile(r'\{\s*"id"\s*:\s*\d+\s*,\s*"active"\s*:\s*false\s*\}\s*,\s*')


def _read_list(path: Path, top_key: str) -> list[Any]:
    """The active records of an RSVQA split file (inactive ones dropped or None)."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = _STUB_THEN_COMMA.sub("", fh.read())
        doc = json.JSONDecoder(object_pairs_hook=_active_only).decode(text)
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
    records: list[Any] = doc[top_key]
    return records


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

    # Answers and types repeat ("yes", "no", "presence"): one string/tuple object each, not
    # one per question (the JSON parser makes a new string for every value).
    shared: dict[object, object] = {}
    answers: dict[int, str] = {}
    for rec in _read_list(apath, "answers"):
        if rec is None:
            continue  # a stub, or a record of another split
        if not isinstance(rec, dict):
            raise DatasetError(f"{apath}: an answer record is not an object: {str(rec)[:60]!r}")
        if not rec.get("active"):
            continue
        try:
            answer = str(rec["answer"])
            answers[rec["id"]] = shared.setdefault(answer, answer)  # type: ignore[assignment]  # gives back an equal str
        except KeyError as exc:
            raise DatasetError(f"{apath}: answer id {rec.get('id')}: missing key {exc}") from None

    images: dict[Any, ImageRef] = {}
    texts: dict[str, str] = {}  # one string object per distinct question text (templates repeat)
    questions: list[Question] = []
    for rec in _read_list(qpath, "questions"):
        if rec is None:
            continue  # a stub, or a record of another split
        if not isinstance(rec, dict):
            raise DatasetError(f"{qpath}: a question record is not an object: {str(rec)[:60]!r}")
        if not rec.get("active"):
            continue
        try:
            qid, img_id, qtype, text, ids = (
                rec["id"], rec["img_id"], rec["type"], rec["question"], rec["answers_ids"]
            )
        except KeyError:
            missing = next(k for k in _QUESTION_KEYS if k not in rec)
            raise DatasetError(f"{qpath}: question id {rec.get('id')}: missing key {missing!r}") from None
        if not isinstance(ids, list) or not ids:
            raise DatasetError(f"{qpath}: question id {qid}: 'answers_ids' is empty")
        truth = answers.get(ids[0])
        if truth is None:
            raise DatasetError(
                f"{qpath}: question id {qid}: answer id {ids[0]} is not an active "
                f"record of {apath.name}; the two files are from different releases"
            )
        ref = images.get(img_id)
        if ref is None:
            ref = images[img_id] = _image_ref(root / image_dir, img_id, extensions)
        text = str(text)
        types = (str(qtype),)
        questions.append(
            Question(
                benchmark=benchmark,
                key=str(qid),
                image=ref,
                text=texts.setdefault(text, text),
                answer=truth,
                types=shared.setdefault(types, types),  # type: ignore[arg-type]  # gives back an equal tuple
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


# What RSVQA's numbers mean (docs/benchmarks.md has the sources):
#
# * the headline is the original RSVQA evaluation (Lobry et al. 2020; syvlo/RSVQA
#   VQA_model/VocabEncoder.py and computeStats.py): answers are classes, LR count answers
#   in 5 classes (`range_numbers=True` for LR only), areas (`...m2`) in the same 5 classes on
#   every split, HR counts exact; OA = right / all questions of the 4 types, AA = the mean of
#   the 4 type accuracies. The "binned" view (`binned`, below) is those classes;
# * the field's published view: GeoChat, EarthDial, LHRS-Bot and SkySenseGPT report
#   presence, comparison (and rural/urban on LR) only, and GeoChat's "Avg" is
#   question-weighted over them: (91.09*2955 + 90.33*4002 + 94.00*100) / 7057 = 90.70 on LR;
#   the unweighted mean of the same types is given too (reports only), since not every
#   paper says which it averages;
# * the per-type table is exact match on every type (counts and areas too).
_BARE_NUMBER = re.compile(r"^(\d+(?:\.\d+)?)$")
_AREA_NUMBER = re.compile(r"^(\d+(?:\.\d+)?)\s*m2$")
BIN_LABELS = ("0", "1-10", "11-100", "101-1000", ">1000")


def rsvqa_bin(answer: str, qtype: str) -> str | None:
    """The original RSVQA class of a count (or an m² area): "0", "1-10", "11-100",
    "101-1000" or ">1000"; None when `answer` is not a bare number or `qtype` is not
    "count"/"area"."""
    s = normalize_vqa(answer)
    if qtype == "count":
        m = _BARE_NUMBER.match(s)
    elif qtype == "area":
        m = _BARE_NUMBER.match(s) or _AREA_NUMBER.match(s)
    else:
        return None
    if not m:
        return None
    v = float(m.group(1))
    # Boundaries as in syvlo/RSVQA VocabEncoder: 0, (0,10], (10,100], (100,1000], >1000.
    if v == 0:
        return BIN_LABELS[0]
    if v <= 10:
        return BIN_LABELS[1]
    if v <= 100:
        return BIN_LABELS[2]
    if v <= 1000:
        return BIN_LABELS[3]
    return BIN_LABELS[4]


def binned(question: Question, reply: str, options: ScoreOptions) -> float | None:
    """The view "binned": 1 when the reply's final answer is in the ground truth's RSVQA class
    (module docstring); None for a question that is neither a count nor an area."""
    for t in ("count", "area"):
        if t in question.types:
            gb = rsvqa_bin(question.answer, t)
            return float(gb is not None and gb == rsvqa_bin(final_answer(reply), t))
    return None


RSVQA_VIEWS = frozenset({View("binned", binned)})
BINNED = ViewLabel(
    "binned",
    "binned: the original RSVQA classes (0 / 1-10 / 11-100 / 101-1000 / >1000)",
    "binned accuracy (count/area answers in the RSVQA bins)",
)
_CLASSES = "the 5 RSVQA classes 0, 1-10, 11-100, 101-1000, >1000"
_TABLE = "exact match per question type (%), counts and areas exact too"


def _labels(lr: bool) -> Labels:
    published: tuple[str, ...]
    if lr:
        binned, published = "count", ("presence", "comp", "rural_urban")
        how = f"count answers in {_CLASSES}"
        which = "presence, comparison and rural/urban"
        left = "count"
    else:
        binned, published = "area", ("presence", "comp")
        how = f"area answers in {_CLASSES} (m2), counts exact"
        which = "presence and comparison"
        left = "count and area"
    return Labels(
        overall=f"RSVQA overall accuracy (OA), original evaluation (syvlo/RSVQA): {how}; "
                "right / all questions of the 4 types",
        average=f"RSVQA average accuracy (AA), original evaluation (syvlo/RSVQA): {how}; "
                "mean of the {types} type accuracies",
        views=(BINNED,),
        verdicts=((binned, "binned"),),
        aggregates=(
            Aggregate(
                "published",
                f"published view, GeoChat's convention (the types GeoChat, EarthDial, LHRS-Bot and "
                f"SkySenseGPT report): {which}, exact match, question-weighted; {left} left out",
                "questions", published,
            ),
            Aggregate(
                "published_mean",
                f"{which}, exact match, unweighted mean of the {len(published)} type accuracies; "
                f"{left} left out",
                "types", published, terminal=False,
            ),
        ),
        table=_TABLE,
    )


RSVQA_LR_LABELS = _labels(lr=True)
RSVQA_HR_LABELS = _labels(lr=False)


def _split(
    name: str, title: str, folder: str, prefix: str, split: str, image_dir: str,
    extensions: tuple[str, ...], types: tuple[str, ...], labels: Labels,
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
            sources=lambda root: [
                root / folder / f"{prefix}_split_{split}_questions.json",
                root / folder / f"{prefix}_split_{split}_answers.json",
                root / folder / image_dir,  # its mtime changes when images come or go
            ],
            types=types,
            metric="original RSVQA OA and AA (count/area classes), the published view, exact match per type",
            score_views=RSVQA_VIEWS,
            labels=labels,
        )
    )


RSVQA_LR = _split(
    "rsvqa_lr", "RSVQA-LR test (Sentinel-2, 256 px)", "RSVQA-LR", "LR", "test",
    "Images_LR", ("tif",), ("presence", "comp", "count", "rural_urban"), RSVQA_LR_LABELS,
)
RSVQA_HR = _split(
    "rsvqa_hr", "RSVQA-HR test set 1 (USGS, 512 px)", "RSVQA-HR", "USGS", "test",
    "Data", ("tif", "png"), ("presence", "comp", "count", "area"), RSVQA_HR_LABELS,
)
RSVQA_HR_PHILI = _split(
    "rsvqa_hr_phili", "RSVQA-HR test set 2, Philadelphia", "RSVQA-HR", "USGS", "test_phili",
    "Data", ("tif", "png"), ("presence", "comp", "count", "area"), RSVQA_HR_LABELS,
)
