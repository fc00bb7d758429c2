"""LHRS-Bench: single-choice questions on Google-Earth images (LHRS-Bot, ECCV 2024).

Two on-disk layouts under `<data root>/LHRS_Bench/`:

* parquet (what the seed script read; HF `datasets` layout, e.g.
  `data/val-00000-of-00001.parquet`): columns `question`, `choices`, `answer`, `image`
  (struct `{bytes, path}`), optional `type` and `question_id`. Every `*.parquet` below
  the folder is read, files in sorted path order.
* the original release (HF `PumpkinCat/LHRS_Data`, folder `LHRS-Bench`): `qa.json` =
  `{"data": [{"filename", "qa_pairs": [{"question", "choices", "answer", "type"}]}],
  "qtype": {...}}` with images in `imgs_jpg/` and/or `imgs_png/`.

When both are present the parquet layout wins (it is the one earlier results were keyed
on). Keys: `question_id` when the parquet has one, else the question's position in file
order (rows of the sorted parquet files, or qa.json's images then their qa_pairs), so a
parquet converted from qa.json in order gets the same keys.

`choices` is one string such as `"A. Factory; B. Park; C. Farm; D. Forest."` or a list;
`answer` is a letter (`"C"`, `"C."`, `"(C)"`) or the option text, normalised to the letter
at load time. `type` is a list of ids "1".."11" (multi-label) or one string; ids map to
the names below (ScoreRS' LHRS_TYPE_MAP, the same as qa.json's `qtype`).

Answers are scored by `core/scoring.py` §3 (the option letter the reply names); the view
`lhrs_official` reproduces LHRS-Bot's own scorer (its first-character rule) beside it.

View ``("lhrs_official", 0|1)`` (`lhrs_official_view`, declared in `LHRS_VIEWS`): LHRS-Bot's
own scorer, reproduced so its table can be (NJU-LHRS/LHRS-Bot ``main_bench_gen.py``,
``main``; its ``normalize_answer`` is SQuAD's). The official script takes the FIRST character
of the decoded output, strips it, and compares it with the ground truth after
``normalize_answer`` on both (lower-case, ASCII punctuation removed, the articles
``a``/``an``/``the`` removed, whitespace squeezed). Consequences, reproduced as they are:
``c`` reads as C; ``a`` and ``A`` normalise to the empty string, exactly as the ground truth
``A`` does, so option A IS readable, and so is every reply whose first character is ASCII
punctuation or whitespace (``(C)``, ``**C**``, ``<think>``, `` C``) - all count as option A;
``The answer is C`` and ``Farm`` are wrong whatever the truth. The view reads the raw reply,
not the final answer (the official script does not remove reasoning). An empty reply is 0:
the official script has no character to read there (it fails). Why the headline is not this
rule: it scores format, not knowledge - a reply that names C plainly is wrong, a reply that
opens with a bracket is right when the truth is A. (ScoreRS' variant counts an empty
prediction as correct, ``"" in answer``.)
"""

from __future__ import annotations

import hashlib
import re
import string
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_satbench.core.labels import Labels, ViewLabel
from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.core.scoring import ScoreOptions, View, gt_letter
from pytest_satbench.datasets._common import check_key, read_json
from pytest_satbench.datasets.registry import (
    Benchmark,
    DatasetError,
    LoadRequest,
    all_benchmarks,
    register,
)
from pytest_satbench.datasets.selection import sort_by_image, stratified_limit

FOLDER = "LHRS_Bench"
PARQUET_GLOB = "**/*.parquet"
QA_JSON = "qa.json"
IMAGE_DIRS = ("imgs_jpg", "imgs_png")

TYPE_NAMES = (
    "identity", "color", "orientation", "shape", "quantity", "area",
    "distance", "resolution", "modality", "location", "reasoning",
)
_TYPE_BY_ID = {str(i): name for i, name in enumerate(TYPE_NAMES, start=1)}
LETTERS = "ABCDEFGHIJKLMNOP"  # the official scorer allows options up to P

# An option marker: "A." / "A)" / "(A)" / "A:" at the start or after a separator.
_MARKER = re.compile(r"(?:^|(?<=[\s;,]))\(?([A-P])(?:[.:]|\))\s*")
_LETTER_ONLY = re.compile(r"\(?([A-Pa-p])\)?[.):]?")
_LETTER_TEXT = re.compile(r"\(?([A-P])(?:[.:]|\))\s*(.+)", re.S)


@dataclass(frozen=True, slots=True)
class Options:
    texts: tuple[str, ...]  # option texts in letter order, markers stripped
    shown: str  # the choices as the prompt shows them: the dataset's own string if it had one


def _clean(text: str) -> str:
    text = text.strip().rstrip(";,").strip()
    return text[:-1].rstrip() if text.endswith(".") else text


def _norm(text: str) -> str:
    return " ".join(_clean(text).lower().split())


def parse_choices(raw: Any) -> Options:
    """Parse a `choices` value; raises ValueError saying what is wrong."""
    if isinstance(raw, str):
        found: list[re.Match[str]] = []
        for m in _MARKER.finditer(raw):
            if len(found) < len(LETTERS) and m.group(1) == LETTERS[len(found)]:
                found.append(m)
        if len(found) < 2:
            raise ValueError(f"choices {raw!r} has no 'A. ...; B. ...' options")
        ends = [m.start() for m in found[1:]] + [len(raw)]
        texts = tuple(_clean(raw[m.end():end]) for m, end in zip(found, ends))
        shown = raw.strip()
    elif isinstance(raw, Sequence) and not isinstance(raw, (bytes, bytearray)):
        items = [str(x) for x in raw]
        if len(items) < 2 or len(items) > len(LETTERS):
            raise ValueError(f"choices list has {len(items)} options (2-{len(LETTERS)} expected)")
        texts_l = []
        for letter, item in zip(LETTERS, items):
            marked = _LETTER_TEXT.fullmatch(item.strip())
            # A list may carry its own markers ("A. Factory"); strip them when they match.
            texts_l.append(_clean(marked.group(2)) if marked and marked.group(1) == letter else _clean(item))
        texts = tuple(texts_l)
        # Same shape as the string form the parquet release uses.
        shown = "; ".join(f"{letter}. {t}" for letter, t in zip(LETTERS, texts)) + "."
    else:
        raise ValueError(f"choices is a {type(raw).__name__}, expected a string or a list")
    if any(not t for t in texts):
        raise ValueError(f"choices {raw!r} has an empty option")
    return Options(texts=texts, shown=shown)


def answer_letter(raw: Any, texts: Sequence[str]) -> str:
    """The option letter an `answer` value names; raises ValueError if it names none."""
    if raw is None:
        raise ValueError("answer is missing")
    s = str(raw).strip()
    letters = LETTERS[: len(texts)]
    m = _LETTER_ONLY.fullmatch(s)
    if m:
        letter = m.group(1).upper()
        if letter not in letters:
            raise ValueError(f"answer {s!r} is not one of the options {', '.join(letters)}")
        return letter
    m = _LETTER_TEXT.fullmatch(s)
    if m and m.group(1) in letters:
        letter = m.group(1)
        if _norm(m.group(2)) != _norm(texts[LETTERS.index(letter)]):
            raise ValueError(
                f"answer {s!r} names option {letter}, but {letter} is "
                f"{texts[LETTERS.index(letter)]!r}"
            )
        return letter
    hits = [letters[i] for i, t in enumerate(texts) if _norm(t) == _norm(s)]
    if len(hits) == 1:
        return hits[0]
    raise ValueError(f"answer {s!r} matches no option (options: {'; '.join(texts)})")


def parse_types(raw: Any) -> tuple[str, ...]:
    """Type names from a list of ids, one id, an id list in a string, or names."""
    if raw is None:
        return ()
    if isinstance(raw, str):
        tokens = [t for t in re.split(r"[\s,;\[\]'\"]+", raw) if t]
    elif isinstance(raw, (int, float)):
        tokens = [str(int(raw))]
    elif isinstance(raw, Sequence) and not isinstance(raw, (bytes, bytearray)):
        tokens = [str(int(t)) if isinstance(t, (int, float)) else str(t).strip() for t in raw]
    else:
        raise ValueError(f"type is a {type(raw).__name__}, expected ids '1'-'11'")
    names: list[str] = []
    for tok in tokens:
        name = _TYPE_BY_ID.get(tok) or (tok.lower() if tok.lower() in TYPE_NAMES else None)
        if name is None:
            raise ValueError(f"type {tok!r} is not an LHRS-Bench type id 1-11 or name")
        if name not in names:
            names.append(name)
    return tuple(names)


# --------------------------------------------------------------------------- layouts

def parquet_files(base: Path) -> list[Path]:
    return sorted(base.glob(PARQUET_GLOB), key=lambda p: p.relative_to(base).as_posix())


def locate(data_root: Path) -> list[Path]:
    """Missing paths for `Benchmark.missing`: empty when either layout is present."""
    base = data_root / FOLDER
    if parquet_files(base):
        return []
    if (base / QA_JSON).is_file():
        dirs = [base / d for d in IMAGE_DIRS]
        return [] if any(d.is_dir() for d in dirs) else dirs
    return [base / PARQUET_GLOB, base / QA_JSON]


def _question(
    key: str, where: str, rec: dict[str, Any], image: ImageRef, names: tuple[str, ...]
) -> Question:
    for field_name in ("question", "choices", "answer"):
        if rec.get(field_name) is None:
            raise DatasetError(f"{where}: missing {field_name!r}")
    try:
        opts = parse_choices(rec["choices"])
        letter = answer_letter(rec["answer"], opts.texts)
        types = parse_types(rec.get("type"))
    except ValueError as exc:
        raise DatasetError(f"{where}: {exc}") from None
    return Question(
        benchmark="lhrs",
        key=check_key(key, where, names),
        image=image,
        text=str(rec["question"]),
        answer=letter,
        types=types,
        kind="mc",
        choices=opts.texts,
        extra=(("choices_text", opts.shown),),
    )


def load_parquet(files: Sequence[Path]) -> list[Question]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = tuple(all_benchmarks())
    images: dict[str, ImageRef] = {}  # sha1 of the bytes -> one shared ImageRef
    used_ids: set[str] = set()
    questions: list[Question] = []
    seen: dict[str, str] = {}
    index = 0
    for path in files:
        try:
            table = pq.read_table(path)
        except (pa.ArrowException, OSError) as exc:
            raise DatasetError(f"{path}: not a readable parquet file ({exc})") from None
        cols = set(table.column_names)
        for col in ("image", "question", "choices", "answer"):
            if col not in cols:
                raise DatasetError(
                    f"{path}: no column {col!r} (has {', '.join(sorted(cols))}); "
                    "expected the LHRS-Bench parquet layout"
                )
        data = {c: table.column(c).to_pylist() for c in table.column_names}
        del table
        for row in range(len(data["question"])):
            rec = {c: data[c][row] for c in data}
            qid = rec.get("question_id")
            key = str(qid) if qid is not None else str(index)
            where = f"{path}: row {row}" + (f" (question_id {qid})" if qid is not None else "")
            index += 1
            image = _embedded_image(rec["image"], where, images, used_ids)
            q = _question(key, where, rec, image, names)
            if key in seen:
                raise DatasetError(f"{where}: key {key} repeats {seen[key]}")
            seen[key] = where
            questions.append(q)
    return questions


def _embedded_image(
    raw: Any, where: str, images: dict[str, ImageRef], used_ids: set[str]
) -> ImageRef:
    name = None
    if isinstance(raw, dict):
        data, name = raw.get("bytes"), raw.get("path")
    else:
        data = raw
    if not isinstance(data, (bytes, bytearray)) or not data:
        raise DatasetError(f"{where}: 'image' has no bytes (expected struct<bytes, path>)")
    digest = hashlib.sha1(data).hexdigest()
    ref = images.get(digest)
    if ref is None:
        # The struct's file name is the readable, stable id; the digest stands in when the
        # name is absent or already names different bytes.
        image_id = Path(name).name if name else ""
        if not image_id or image_id in used_ids:
            image_id = digest[:16]
        used_ids.add(image_id)
        ref = images[digest] = ImageRef(id=image_id, data=bytes(data))
    return ref


def load_qa_json(path: Path) -> list[Question]:
    names = tuple(all_benchmarks())
    doc = read_json(path, "LHRS-Bench qa.json")
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise DatasetError(f"{path}: expected an object with a 'data' list (LHRS-Bench qa.json)")
    base = path.parent
    images: dict[str, ImageRef] = {}
    questions: list[Question] = []
    index = 0
    for i, entry in enumerate(doc["data"]):
        where_img = f"{path}: data[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("filename"), str):
            raise DatasetError(f"{where_img}: expected an object with a 'filename' string")
        pairs = entry.get("qa_pairs")
        if not isinstance(pairs, list):
            raise DatasetError(f"{where_img} ({entry['filename']}): 'qa_pairs' is not a list")
        filename = entry["filename"]
        image = images.get(filename)
        if image is None:
            image = images[filename] = ImageRef(id=filename, path=str(_image_path(base, filename)))
        for j, rec in enumerate(pairs):
            where = f"{where_img} ({filename}) qa_pairs[{j}]"
            if not isinstance(rec, dict):
                raise DatasetError(f"{where}: not an object")
            questions.append(_question(str(index), where, rec, image, names))
            index += 1
    return questions


def _image_path(base: Path, filename: str) -> Path:
    # The authors' scorer opens `<image dir>/<filename>`; which of the two folders holds a
    # name (and with which extension) is not documented, so try the exact name in each
    # folder, then the same stem with the folder's own extension.
    stem = Path(filename).stem
    candidates = [base / d / filename for d in IMAGE_DIRS] + [base / filename]
    candidates += [base / "imgs_jpg" / f"{stem}.jpg", base / "imgs_png" / f"{stem}.png"]
    # A missing image is not a dataset error: its questions fail at run time with the path.
    return next((p for p in candidates if p.is_file()), candidates[0])


def load_lhrs(data_root: Path, limit: int | None = None, seed: int = 0) -> list[Question]:
    base = data_root / FOLDER
    files = parquet_files(base)
    if files:
        questions = load_parquet(files)
    else:
        questions = load_qa_json(base / QA_JSON)
    return sort_by_image(stratified_limit(questions, limit, seed))


def _load(req: LoadRequest) -> Iterator[Question]:
    yield from load_lhrs(req.data_root, req.limit, req.seed)


# SQuAD's normalize_answer, as LHRS-Bot's main_bench_gen.py runs it (written anew here).
_SQUAD_PUNCT = frozenset(string.punctuation)
_SQUAD_ARTICLES = re.compile(r"\b(a|an|the)\b")


def _squad_normalize(s: str) -> str:
    s = "".join(ch for ch in s.lower() if ch not in _SQUAD_PUNCT)
    return " ".join(_SQUAD_ARTICLES.sub(" ", s).split())


def lhrs_official(text: str, letter: str) -> bool:
    """LHRS-Bot's own verdict (NJU-LHRS/LHRS-Bot `main_bench_gen.py`, `main`): the FIRST
    character of the raw reply, stripped, against the ground-truth letter, both through SQuAD
    `normalize_answer`. Reproduced with its quirks (module docstring): ``a`` and ``A``
    become empty like the letter ``A``, so a reply that starts with ``a``, punctuation or
    whitespace counts as option A; ``(C)`` reads as ``(``. An empty reply is 0 (the official
    script has no first character to read there)."""
    if not text:
        return False
    return _squad_normalize(text[0].strip()) == _squad_normalize(letter)


def lhrs_official_view(question: Question, reply: str, options: ScoreOptions) -> float | None:
    """The view "lhrs_official" of a multiple-choice question: `lhrs_official` on the raw
    reply and the ground-truth letter."""
    if question.kind != "mc":
        return None
    return float(lhrs_official(reply, gt_letter(question)))


# LHRS-Bot's own scorer reads only the first character of the reply: beside our letter pick,
# so LHRS-Bot's table can be reproduced.
LHRS_VIEWS = frozenset({View("lhrs_official", lhrs_official_view)})
LHRS_LABELS = Labels(views=(ViewLabel(
    "lhrs_official",
    "lhrs_official: LHRS-Bot's scorer (first character after SQuAD normalisation)",
    "LHRS-Bot official scorer (first character of the reply)",
),))

LHRS = register(
    Benchmark(
        name="lhrs",
        kind="mc",
        title="LHRS-Bench (single choice, Google Earth)",
        requires=(f"{FOLDER}/{PARQUET_GLOB}",),  # documentation; `locate` decides
        locate=locate,
        load=_load,
        types=TYPE_NAMES,
        metric="accuracy of the option letter; per type (multi-label: once per type) and overall",
        score_views=LHRS_VIEWS,
        labels=LHRS_LABELS,
    )
)
