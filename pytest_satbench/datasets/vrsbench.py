"""VRSBench: VQA and referring expressions (visual grounding) on DOTA/DIOR patches.

Format (lx709/VRSBench, the evaluation files of the release): `<data root>/VRSBench/VRSBench_EVAL_vqa.json` and
`VRSBench_EVAL_referring.json` are each ONE JSON list of records; images are
`Images_val/<image_id>` where `image_id` already includes the extension (`P0003_0002.png`).
Files from before the dataset's rename (`RSBench_EVAL_*.json`) are accepted too.
Keys are `question_id` (an int, sequential per file), or the record's index if absent.

VQA keeps the 12 raw types; `image` and `rural or urban` are reported under `scene type`
(the paper's 10-type table) through `Benchmark.type_groups`.

Referring: `ground_truth` is `"{<x1><y1><x2><y2>}"` on a 0-100 grid; the uniqueness flag
is stored as `unique` by the authors' notebook and read as `is_unique` by their scorer, so
both are accepted. Types are `unique` / `non-unique`, which gives the paper's split.

The VQA view ``("official", 0|1)`` (`official`): the deterministic part of the official
VRSBench evaluation (lx709/VRSBench ``eval_vqa_gpt.ipynb``), on the lower-cased, stripped final
answer ``pred`` (`core.scoring.final_answer`) and ground truth ``gt``: correct if ``gt`` is a
substring of ``pred``; else, if ``gt`` is ``yes``/``no``/``0``..``99``, correct iff
``gt == pred``; else 0. The official evaluation asks GPT-4o-mini in that last case, which we do
not unless the run asks a judge (``--judge``, `core.judge`), so without it this view is a
lower bound of the published VRSBench numbers.
The released ground truths are not clipped to the grid (an object cut by the patch border
has a corner below 0 or above 100): they load as the official scorer reads them (digits
only: `<-2>` is 2), each with a note. A record without a readable uniqueness flag counts
in All only, with a note. A record that cannot be read at all fails alone (`RecordErrors`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from pytest_satbench.core.judge import JUDGED_VIEW, official_rules
from pytest_satbench.core.labels import ANY_TYPE, NOTE, OVERALL_ONLY, Labels, ViewLabel
from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.core.scoring import ScoreOptions, View, final_answer
from pytest_satbench.datasets._common import check_key, read_json
from pytest_satbench.datasets.registry import (
    Benchmark,
    DatasetError,
    LoadRequest,
    RecordErrors,
    all_benchmarks,
    register,
)
from pytest_satbench.datasets.selection import sort_by_image, stratified_limit

FOLDER = "VRSBench"
IMAGE_DIR = "Images_val"
VQA_FILES = ("VRSBench_EVAL_vqa.json", "RSBench_EVAL_vqa.json")
REF_FILES = ("VRSBench_EVAL_referring.json", "RSBench_EVAL_referring.json")

# Raw types in the order of the paper's table; the last two merge into "scene type".
VQA_TYPES = (
    "object category", "object existence", "object quantity", "object color",
    "object shape", "object size", "object position", "object direction",
    "scene type", "reasoning", "image", "rural or urban",
)
VQA_TYPE_GROUPS = (("image", "scene type"), ("rural or urban", "scene type"))
REF_TYPES = ("unique", "non-unique")

_TRUE = {"1", "true", "yes"}
_FALSE = {"0", "false", "no"}


def find_file(data_root: Path, names: tuple[str, ...]) -> Path | None:
    return next((p for n in names if (p := data_root / FOLDER / n).is_file()), None)


def _locator(names: tuple[str, ...]) -> Callable[[Path], list[Path]]:
    def locate(data_root: Path) -> list[Path]:
        missing = [] if find_file(data_root, names) else [data_root / FOLDER / names[0]]
        if not (data_root / FOLDER / IMAGE_DIR).is_dir():
            missing.append(data_root / FOLDER / IMAGE_DIR)
        return missing

    return locate


def _records(path: Path) -> list[Any]:
    doc = read_json(path, "VRSBench eval file")
    if not isinstance(doc, list):
        raise DatasetError(f"{path}: expected a JSON list of records (a VRSBench eval file)")
    return doc


def _common(
    path: Path, i: int, rec: Any, required: tuple[str, ...], images: dict[str, ImageRef],
    names: tuple[str, ...],
) -> tuple[str, str, ImageRef]:
    """(key, where, image) of record `i`, after checking its required keys."""
    if not isinstance(rec, dict):
        raise DatasetError(f"{path}: record {i} is not an object")
    qid = rec.get("question_id")
    where = f"{path}: record {i}" + (f" (question_id {qid})" if qid is not None else "")
    missing = [k for k in required if rec.get(k) is None]
    if missing:
        raise DatasetError(f"{where}: missing key {missing[0]!r}")
    key = check_key(str(qid) if qid is not None else str(i), where, names)
    image_id = str(rec["image_id"])
    ref = images.get(image_id)
    if ref is None:
        # Some re-packagings drop the extension; the released images are all PNG.
        name = image_id if Path(image_id).suffix else f"{image_id}.png"
        # A missing image is not a dataset error: its questions fail at run time.
        ref = images[image_id] = ImageRef(id=image_id, path=str(path.parent / IMAGE_DIR / name))
    return key, where, ref


def _check_unique_keys(questions: list[Question], path: Path) -> None:
    seen: set[str] = set()
    for q in questions:
        if q.key in seen:
            raise DatasetError(f"{path}: question_id {q.key} appears more than once")
        seen.add(q.key)


def load_vqa(path: Path) -> list[Question]:
    names = tuple(all_benchmarks())
    images: dict[str, ImageRef] = {}
    types: dict[str, tuple[str, ...]] = {}
    answers: dict[str, str] = {}  # short answers repeat ("yes", "2"): keep one copy each
    questions = []
    for i, rec in enumerate(_records(path)):
        key, where, image = _common(
            path, i, rec, ("image_id", "question", "ground_truth", "type"), images, names
        )
        raw_type = str(rec["type"]).strip()
        questions.append(
            Question(
                benchmark="vrsbench",
                key=key,
                image=image,
                text=str(rec["question"]),
                answer=answers.setdefault(a := str(rec["ground_truth"]), a),
                types=types.setdefault(raw_type, (raw_type,)),
                kind="vqa",
            )
        )
    _check_unique_keys(questions, path)
    return questions


def _flag(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    s = str(value).strip().lower()
    return True if s in _TRUE else False if s in _FALSE else None


# How the official scorer (lx709/VRSBench eval_fianl/compute_metrics.ipynb, referring cell)
# reads a box: every run of digits, `re.findall(r'\d+', ...)`, so a sign is not part of it.
# The released ground truths come from `poly2hbb` then `int(x * 100)` without clipping
# (prepare_eval_all.ipynb), so an object cut by the patch border has a corner below 0 or
# above 100: `<-2>` is read as 2, `<103>` as 103.
_SIGNED_BOX = re.compile(r"\{<(-?\d+)><(-?\d+)><(-?\d+)><(-?\d+)>\}")
OFF_GRID = ("ground truth outside the 0-100 grid (an object cut by the patch border), read as "
            "VRSBench's scorer reads it: digits only, so <-2> is 2 and <103> stays 103")
NO_FLAG = ("no readable uniqueness flag ('is_unique' or 'unique'): counted in All only, "
           "in neither Unique nor Non-unique")
UNKNOWN_UNIQUENESS = "uniqueness unknown"  # its raw type, reported in no type (OVERALL_ONLY)


def load_ref(path: Path) -> list[Question]:
    """The referring records of `path` (see the module docstring). A ground truth outside
    0-100 loads as the official scorer reads it and a record without a readable uniqueness
    flag counts in All only, each with a note (`labels.NOTE`) that the run counts into one
    warning line; a record that cannot be read at all (not an object, a missing key, a
    ground truth that is not four integers in `{<x1><y1><x2><y2>}`, a key that cannot be a
    node id or is taken) fails alone: `RecordErrors` carries the rest."""
    names = tuple(all_benchmarks())
    images: dict[str, ImageRef] = {}
    extras: dict[tuple[str, str, str], tuple[tuple[str, str], ...]] = {}  # few distinct
    questions: list[Question] = []
    failed: list[tuple[str, str]] = []
    seen: set[str] = set()
    for i, rec in enumerate(_records(path)):
        try:
            key, where, image = _common(
                path, i, rec, ("image_id", "question", "ground_truth"), images, names
            )
            if key in seen:
                raise DatasetError(f"{where}: question_id {key} appears more than once")
            gt = str(rec["ground_truth"])
            m = _SIGNED_BOX.fullmatch("".join(gt.split()))
            if not m:
                raise DatasetError(f"{where}: ground_truth {gt!r} is not '{{<x1><y1><x2><y2>}}'")
        except DatasetError as exc:
            # keyed by its position: its own id may be what is wrong with it
            failed.append((f"record{i}", str(exc)))
            continue
        seen.add(key)
        values = [int(v) for v in m.groups()]
        off_grid = any(not 0 <= v <= 100 for v in values)
        if off_grid:
            gt = "{" + "".join(f"<{abs(v)}>" for v in values) + "}"
        unique = _flag(rec.get("is_unique", rec.get("unique")))
        # The authors' scorer treats an empty size group as medium.
        size = str(rec.get("size_group") or "medium")
        cls = str(rec.get("obj_cls") or "")
        flag = "" if unique is None else "1" if unique else "0"
        types = (UNKNOWN_UNIQUENESS,) if unique is None else ("unique",) if unique else ("non-unique",)
        fields = ((("unique", flag),) if flag else ((NOTE, NO_FLAG),)) + (("size_group", size), ("obj_cls", cls))
        extra: tuple[tuple[str, str], ...]
        if off_grid:  # what the file says is kept beside what is scored
            extra = fields + ((NOTE, OFF_GRID), ("ground_truth_raw", str(rec["ground_truth"])))
        else:
            extra = extras.setdefault((flag, size, cls), fields)
        questions.append(
            Question(
                benchmark="vrsbench_ref",
                key=key,
                image=image,
                text=str(rec["question"]),
                answer=gt,
                types=types,
                kind="ref",
                extra=extra,
            )
        )
    if failed:
        raise RecordErrors(questions, failed)
    return questions


def _loader(
    file_names: tuple[str, ...], parse: Callable[[Path], list[Question]]
) -> Callable[[LoadRequest], Iterator[Question]]:
    def load(req: LoadRequest) -> Iterator[Question]:
        path = find_file(req.data_root, file_names) or req.data_root / FOLDER / file_names[0]
        try:
            questions = parse(path)
        except RecordErrors as exc:
            # the readable records go through the same selection; each unreadable one fails
            raise RecordErrors(sort_by_image(stratified_limit(exc.questions, req.limit, req.seed)),
                               exc.failed) from None
        yield from sort_by_image(stratified_limit(questions, req.limit, req.seed))

    return load


# The official VQA evaluation (lx709/VRSBench eval_fianl/eval_vqa_gpt.ipynb) decides an answer
# by rules (ground truth contained in the reply; yes/no and 0-99 exact) and asks GPT-4o-mini
# about the rest; its per-type cell reports the mean over the 10 types (image and rural or
# urban merged into scene type) and the question-weighted overall accuracy. Without the
# judge the "official" view is the rules only: a lower bound of the published figures.
def vrsbench_official(gt: str, pred: str) -> bool:
    """Rules 1 and 2 of the official VRSBench VQA evaluation; an answer they leave to the judge
    (rule 3, `core.judge`) is not a match here (the run's results use the judge's verdict)."""
    return official_rules(gt, pred) is True


def official(question: Question, reply: str, options: ScoreOptions) -> float | None:
    """The view "official" of a VQA question: the official rules on the final answer
    (module docstring); None for a grounding question."""
    if question.kind != "vqa":
        return None
    return float(vrsbench_official(question.answer, final_answer(reply)))


VQA_VIEWS = frozenset({View(JUDGED_VIEW, official)})  # the judge rules where this view cannot
_RULES = "official rules (ground truth contained in the answer; yes/no and 0-99 exact)"
_LOWER = "rules only: a lower bound of the published evaluation, which asks an LLM judge about the rest"
VQA_LABELS = Labels(
    overall=f"VRSBench All (question-weighted), {_RULES}; {_LOWER}",
    average="VRSBench mean over the {types} question types, " + f"{_RULES}; {_LOWER}",
    views=(ViewLabel(
        "official",
        "official: VRSBench's rules only (gt contained in answer; yes/no and 0-99 exact), no LLM judge",
        "VRSBench official rules only (no LLM judge): a lower bound of the published evaluation",
    ),),
    verdicts=((ANY_TYPE, "official"),),
    table="exact match per question type (%), not VRSBench's evaluation (its rules give the figures below)",
)
# With --judge the rules' undecided answers get the judge's verdict: the published evaluation
# (the judge model is the user's choice, named in protocol.json).
_JUDGED = "the published evaluation: rules, then an LLM judge on the rest (protocol.json names the judge)"
JUDGED_VQA_LABELS = replace(
    VQA_LABELS,
    overall=f"VRSBench All (question-weighted), {_JUDGED}",
    average="VRSBench mean over the {types} question types, " + _JUDGED,
    views=(ViewLabel(
        "official",
        "official: VRSBench's evaluation (rules, then the LLM judge on the rest)",
        "VRSBench official evaluation (rules, then the LLM judge)",
    ),),
)
# Grounding is reported as Acc@0.5 / Acc@0.7, split by whether the object is unique. The
# mean of the Unique and Non-unique accuracies is no VRSBench figure: not labelled as one.
REF_LABELS = Labels(
    overall="VRSBench Acc@0.5, All (IoU >= 0.5, every record once)",
    average=None,
    views=(
        ViewLabel("acc@0.5", "acc@0.5: IoU >= 0.5 (VRSBench grounding headline)", "Acc@0.5 (IoU >= 0.5), by uniqueness"),
        ViewLabel("acc@0.7", "acc@0.7: IoU >= 0.7", "Acc@0.7 (IoU >= 0.7), by uniqueness"),
        ViewLabel("iou", "iou: mean IoU", "mean IoU"),
    ),
    table="Acc@0.5 per uniqueness (%), IoU >= 0.5",
)

VRSBENCH = register(
    Benchmark(
        name="vrsbench",
        kind="vqa",
        title="VRSBench VQA (DOTA/DIOR patches, 512 px)",
        requires=(f"{FOLDER}/{VQA_FILES[0]}", f"{FOLDER}/{IMAGE_DIR}"),
        locate=_locator(VQA_FILES),
        load=_loader(VQA_FILES, load_vqa),
        types=VQA_TYPES,
        type_groups=VQA_TYPE_GROUPS,
        metric="official rules (no judge): mean of the 10 types and All; exact match per type",
        score_views=VQA_VIEWS,
        judged_labels=JUDGED_VQA_LABELS,
        labels=VQA_LABELS,
    )
)
VRSBENCH_REF = register(
    Benchmark(
        name="vrsbench_ref",
        kind="ref",
        title="VRSBench referring expressions (box on a 0-100 grid)",
        requires=(f"{FOLDER}/{REF_FILES[0]}", f"{FOLDER}/{IMAGE_DIR}"),
        locate=_locator(REF_FILES),
        load=_loader(REF_FILES, load_ref),
        types=REF_TYPES,
        type_groups=((UNKNOWN_UNIQUENESS, OVERALL_ONLY),),
        metric="Acc@0.5 and Acc@0.7 (IoU), unique / non-unique / all",
        labels=REF_LABELS,
    )
)
