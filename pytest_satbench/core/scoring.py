"""How a model's reply is turned into a verdict: answer extraction and scoring.

Every rule the benchmarks are scored by lives in this module, so that a number in a report
can be traced to one readable place. Pure functions, no I/O.

1. The final answer (`final_answer`)
------------------------------------
Reasoning models (RSThinker / Geo-CoT380k, R1-style RS models) answer as
``<think>...</think><answer>...</answer>``; ScoreRS-style models use ``<reasoning>``. In order:

* closed ``<think>...</think>`` and ``<reasoning>...</reasoning>`` blocks are removed, so a box
  or a letter mentioned while reasoning is never taken for the answer;
* a stray closing ``</think>`` (chat templates that pre-fill the opening tag) drops everything
  before it;
* if an ``<answer>`` tag remains, the content of the LAST one is the answer, up to its
  ``</answer>`` or, when that is missing (truncated output), to the end of the text;
* otherwise an unclosed ``<think>``/``<reasoning>`` means the reply was cut off mid-reasoning:
  the answer is empty (unparseable) rather than the reasoning text, which would otherwise be
  matched by substring rules by accident;
* otherwise the whole reply is the answer. GLM-4.1V's ``<|begin_of_box|>``/``<|end_of_box|>``
  markers and leftover answer tags are removed, LaTeX ``\\boxed{C}`` becomes ``C`` (R1-style
  models), and the result is stripped.

2. Free-form VQA (`score_vqa`) - RSVQA-LR/HR, VRSBench-VQA
---------------------------------------------------------
Headline verdict (``correct``): exact match after `normalize_vqa` on both the prediction and the
ground truth. This is the seed script's behaviour made a little more forgiving of formatting:
lower-case; ``m²``, ``m^2``, ``sq m``, ``square meter(s)/metre(s)`` -> ``m2`` and a number is
joined to it (``"2173 m2"`` -> ``"2173m2"``, the RSVQA-HR answer form); thousands separators
between digits removed (``"2,392"`` -> ``"2392"``); a ``.`` between digits kept (decimals);
every other punctuation character becomes a space (``"ground-track-field"`` ==
``"ground track field"``); number words become digits (``zero``..``nineteen``, the tens,
compounds like ``twenty-one``; ``none`` -> ``0`` as in the EvalAI/TextVQA processor that
LHRS-Bot uses); whitespace squeezed. Articles are NOT dropped (the seed did not), so
``"a ship"`` does not match ``"ship"``; the VRSBench official view below does accept it.
An empty final answer is unparseable (``parsed=False``) and wrong.

Extra views (``Score.views``), computed where the benchmark declares them
(``ScoreOptions.views``, from ``Benchmark.score_views``):

* ``("binned", 0|1)`` for RSVQA ``count`` and ``area`` questions: the class of the original
  RSVQA metric (Lobry et al. 2020; syvlo/RSVQA ``VocabEncoder``): ``0`` / ``1-10`` /
  ``11-100`` / ``101-1000`` / ``>1000`` on the count, or on the m² value for areas. The
  prediction must be a bare number (an ``m2`` unit is optional for areas). The original work
  binned LR counts and HR areas but scored HR counts exactly; we bin every count and area so the
  view means one thing everywhere (for HR counts the original metric is the headline).
* ``("official", 0|1)`` for the benchmarks that declare it (VRSBench VQA): the deterministic
  part of the official VRSBench protocol (lx709/VRSBench ``eval_vqa_gpt.ipynb``), on the
  lower-cased, stripped final answer ``pred`` and ground truth ``gt``: correct if ``gt`` is a
  substring of ``pred``; else, if ``gt`` is ``yes``/``no``/``0``..``99``, correct iff
  ``gt == pred``; else 0. The official protocol asks GPT-4o-mini in that last case, which we
  do not, so this view is a lower bound of the published VRSBench numbers.

3. Multiple choice (`pick`, `score_mc`) - LHRS-Bench
---------------------------------------------------
``question.choices`` are the option texts in letter order (A, B, ...); letters beyond the
number of options are not valid. `pick` collects every option the final answer names, by
these rules (markdown ``*``/`````` ` `````` removed first), and returns the letter only when
exactly one valid option is named. Precedence matters only for rule e: a letter, when one
is named, is the answer, and the option texts are not consulted (except in rules b and c):

a. the whole answer (or its first line) is a letter: ``C``, ``c``, ``C.``, ``(C)``, ``C)``,
   ``C:``, ``**C**``, ``C`` then a new line and an explanation;
b. the answer starts with a letter and a delimiter (``.``, ``)``, ``:``) or ``(C)``:
   ``C. Farm``, ``(C) Farm``. If the text after it is exactly the text of a DIFFERENT
   option (``A. Farm`` where Farm is C), the answer names two options;
c. a letter after a cue word ``answer``/``option``/``choice`` (optionally ``is``, ``:``):
   ``Answer: C``, ``The answer is C.``, ``I choose option (B)``. The letter must be followed
   by the end, ``.``, ``)`` or ``:`` (a capital letter also by ``,`` or ``;``) - so the
   article in ``The answer is a farm`` is not a letter. A capital letter followed by words
   is read as the letter after ``answer`` (``The answer is C because ...``) unless the words
   are a different option's text (``The answer is A farm`` - an article) or the letter is
   ``A`` or ``I``, which are also English words (``The answer is A because ...`` must be
   written ``A.`` to count); after ``option``/``choice`` it describes rather than answers
   (``Option B is wrong``) unless the words are the letter's own option text;
d. a parenthesised capital letter anywhere: ``... so the answer is (C) ...``;
e. only when rules a-d found no letter: the option text alone (first line), compared after
   `normalize_vqa` with a leading cue (``answer:``, ``the answer is``) and a leading article
   removed: ``Farm``, ``a farm.``, ``The answer is Farm``. Only exact matches count:
   ``farmland`` does not name ``Farm``, and ``A farm is visible`` names nothing.

Two different letters (``The answer is A. No, the answer is C.``, ``(A) or (C)``), or a
letter that is not a valid option (``E`` with four options), make the answer unparseable:
``parsed=False``, scored wrong and counted separately, so a format problem is not mistaken
for a knowledge problem.
Why not the official LHRS-Bot scorer: it compares only the FIRST character of the output and
runs SQuAD ``normalize_answer``, which deletes ``a`` as an article - so option A can never be
matched by a lower-case reply and ``(C)`` reads as ``(``. ScoreRS' variant counts an empty
prediction as correct (``"" in answer``). Neither behaviour measures the model.

4. Grounding (`parse_box`, `to_grid`, `iou`, `score_ref`) - VRSBench referring
------------------------------------------------------------------------------
* Boxes are read from the final answer only (never from ``<think>``): the first of
  ``[x1, y1, x2, y2]`` (ints or floats; in a nested list ``[[...], [...]]`` the first box)
  or ``{<x1><y1><x2><y2>}`` (braces optional), whichever comes first in the text. A box
  whose corners are given in the wrong order (``x2 < x1`` or ``y2 < y1``) is reordered: it
  denotes the same rectangle, and the official formula would give a negative area instead.
  Any other text (four bare numbers, ``(x, y, w, h)``) is unparseable - a model that does not
  answer with a box did not localise the object.
* Ground truth is VRSBench's ``{<x1><y1><x2><y2>}`` on a 0-100 grid. The model's box is
  converted to that grid from ``ScoreOptions.box_grid`` (``--box-grid``): ``1000`` (the
  GLM-V / Geo-CoT380k convention, the default) divides by 10; ``100`` is used as is;
  ``pixels`` divides by the width/height of the image the model saw, times 100. Mixing grids
  silently gives near-zero or spuriously high IoU, which is why the grid is an explicit option.
  No clipping and no rounding is applied after conversion.
* IoU (``ScoreOptions.iou``): ``inclusive`` (default) is VRSBench's official pixel convention,
  ``inter = (min(x2)-max(x1)+1) * (min(y2)-max(y1)+1)``, ``area = (x2-x1+1)*(y2-y1+1)``;
  ``continuous`` is the plain geometric IoU. Example: GT ``[25,40,33,60]`` vs
  ``[26,41,34,61]`` is 0.734 inclusive, 0.711 continuous; a zero-width GT such as
  ``[92,0,96,0]`` (VRSBench has a few) can only be hit under the inclusive convention. An empty
  union gives 0.
* ``correct`` = IoU >= 0.5; views ``("iou", v)``, ``("acc@0.5", 0|1)``, ``("acc@0.7", 0|1)``.
  An unparseable answer is a miss and stays in the denominator, as in the official metric.
  Reports split Acc@0.5/0.7 into Unique / Non-unique / All with `ref_split`.

Aggregation (per type, overall, average accuracy) is not scoring: see `stats` and `results`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pytest_satbench.core.question import Question

__all__ = [
    "Score",
    "ScoreOptions",
    "BOX_GRIDS",
    "IOU_MODES",
    "final_answer",
    "normalize_vqa",
    "rsvqa_bin",
    "score_vqa",
    "pick",
    "score_mc",
    "parse_box",
    "to_grid",
    "iou",
    "score_ref",
    "ref_split",
    "score",
    "vrsbench_official",
]

BOX_GRIDS = ("1000", "100", "pixels")
IOU_MODES = ("inclusive", "continuous")
GT_GRID = "100"  # VRSBench ground-truth boxes are integers on 0..100
_EXTRACT_CAP = 200  # unparsed answers are kept this long in `Score.extracted`, for reading


@dataclass(frozen=True, slots=True)
class Score:
    """The verdict on one answer."""

    correct: bool  # the headline verdict
    parsed: bool  # False: could not be interpreted (no letter, no box, empty); also wrong
    extracted: str  # the answer as interpreted: letter, normalised text, or "x1,y1,x2,y2"
    views: tuple[tuple[str, float], ...] = ()  # extra named views, e.g. ("official", 1.0)

    def view(self, name: str, default: float | None = None) -> float | None:
        for k, v in self.views:
            if k == name:
                return v
        return default


@dataclass(frozen=True, slots=True)
class ScoreOptions:
    box_grid: str = "1000"  # grid of the MODEL's boxes: "1000" | "100" | "pixels"
    iou: str = "inclusive"  # "inclusive" (VRSBench +1) | "continuous"
    image_size: tuple[int, int] | None = None  # (W, H) the model saw; for box_grid="pixels"
    # The optional VQA views a benchmark declares for itself (`Benchmark.score_views`):
    # "binned" (RSVQA count/area classes), "official" (VRSBench's deterministic rules).
    views: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.box_grid not in BOX_GRIDS:
            raise ValueError(
                f"--box-grid {self.box_grid!r} is not one of {', '.join(BOX_GRIDS)}")
        if self.iou not in IOU_MODES:
            raise ValueError(f"--iou {self.iou!r} is not one of {', '.join(IOU_MODES)}")


# --------------------------------------------------------------------------- final answer

_FLAGS = re.IGNORECASE | re.DOTALL
_CLOSED_BLOCK = re.compile(r"<(think|reasoning)>.*?</\1\s*>", _FLAGS)
_STRAY_CLOSE = re.compile(r"^.*</(?:think|reasoning)\s*>", _FLAGS)
_ANSWER_OPEN = re.compile(r"<answer\s*>", re.IGNORECASE)
_ANSWER_CLOSE = re.compile(r"</answer\s*>", re.IGNORECASE)
_UNCLOSED_OPEN = re.compile(r"<(?:think|reasoning)>.*$", _FLAGS)
_NOISE = re.compile(r"<\|(?:begin|end)_of_box\|>|</?answer\s*>", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def final_answer(text: str) -> str:
    """The model's final answer: the last <answer> content, reasoning removed (rules: §1)."""
    s = _CLOSED_BLOCK.sub(" ", text or "")
    s = _STRAY_CLOSE.sub("", s)  # greedy: up to the LAST stray closing tag
    opens = list(_ANSWER_OPEN.finditer(s))
    if opens:
        s = s[opens[-1].end():]
        close = _ANSWER_CLOSE.search(s)
        if close:
            s = s[: close.start()]
    else:
        s = _UNCLOSED_OPEN.sub("", s)
    return _BOXED.sub(r"\1", _NOISE.sub("", s)).strip()


# --------------------------------------------------------------------------- VQA

_UNITS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13,
    "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18,
    "nineteen": 19, "none": 0,
}
_TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70,
         "eighty": 80, "ninety": 90}
_SQM = re.compile(r"m²|m\^2|\bsq\.?\s*m\b|\bsquare\s+met(?:er|re)s?\b", re.IGNORECASE)
_NUM_UNIT = re.compile(r"(\d)\s+m2\b")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
_DECIMAL = re.compile(r"(?<=\d)\.(?=\d)")
_PUNCT = re.compile(r"[^\w\s\x00]|_")
_DOT = "\x00"  # placeholder keeping decimal points through the punctuation pass


def normalize_vqa(text: str) -> str:
    """Lower-case, units and punctuation normalised, number words as digits (rules: §2)."""
    s = _SQM.sub("m2", text.lower())
    s = _THOUSANDS.sub("", s)
    s = _DECIMAL.sub(_DOT, s)
    s = _PUNCT.sub(" ", s).replace(_DOT, ".")
    words = s.split()
    out: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        if w in _TENS:
            n = _TENS[w]
            nxt = words[i + 1] if i + 1 < len(words) else ""
            if nxt in _UNITS and 0 < _UNITS[nxt] < 10:
                n += _UNITS[nxt]
                i += 1
            out.append(str(n))
        elif w in _UNITS:
            out.append(str(_UNITS[w]))
        else:
            out.append(w)
        i += 1
    return _NUM_UNIT.sub(r"\1m2", " ".join(out))


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


_VRS_EXACT = frozenset(["yes", "no", *(str(i) for i in range(100))])


def vrsbench_official(gt: str, pred: str) -> bool:
    """Rules 1 and 2 of the official VRSBench VQA protocol (rule 3, a GPT judge, is not run)."""
    g, p = gt.strip().lower(), pred.strip().lower()
    if not g:
        return False
    if g in p:
        return True
    if g in _VRS_EXACT:
        return g == p
    return False


def score_vqa(question: Question, text: str, options: ScoreOptions) -> Score:
    """Normalised exact match, plus the binned and VRSBench-official views (rules: §2)."""
    ans = final_answer(text)
    pred = normalize_vqa(ans)
    gt = normalize_vqa(question.answer)
    views: list[tuple[str, float]] = []
    if "binned" in options.views:
        for t in ("count", "area"):
            if t in question.types:
                gb = rsvqa_bin(question.answer, t)
                pb = rsvqa_bin(ans, t)
                views.append(("binned", float(gb is not None and gb == pb)))
                break
    if "official" in options.views:
        views.append(("official", float(vrsbench_official(question.answer, ans))))
    parsed = bool(pred)
    return Score(correct=parsed and pred == gt, parsed=parsed,
                 extracted=pred[:_EXTRACT_CAP], views=tuple(views))


# --------------------------------------------------------------------------- multiple choice

_LETTERS = "ABCDEFGHIJKLMNOP"  # LHRS-Bench allows options up to P
_STRIP_MD = re.compile(r"[*`]+")
# (a) the whole answer is a letter
_WHOLE = re.compile(r"^\(?([A-Za-z])\)?\s*[.:)]?$")
# (b) leading letter + delimiter, then option text
_LEAD = re.compile(r"^(?:\(([A-Za-z])\)|([A-Za-z])\s*[.):])\s*(.*)$", re.DOTALL)
# (c) cue word, then a letter token; what follows the letter is checked in code
# (the letter is matched in a lookahead so "answer is option C" still finds the cue "option")
# ("：" is the full-width colon GLM/Qwen-family models emit after Chinese-style cues)
_CUE = re.compile(
    r"\b(?P<cue>answer|option|choice)s?\b"
    r"(?=(?:\s+is)?\s*[:：\-]?\s*(?P<open>\()?(?P<letter>[A-Za-z])(?P<close>\))?)",
    re.IGNORECASE)
# (d) a parenthesised capital letter anywhere
_PAREN = re.compile(r"\(([A-P])\)")
# (e) cue prefixes and an article removed before comparing option texts
_TEXT_PREFIX = re.compile(
    r"^(?:(?:the\s+)?(?:correct\s+|final\s+)?(?:answer|option|choice)\b(?:\s+is)?\s*[:\-]?\s*)?"
    r"(?:(?:a|an|the)\s+)?", re.IGNORECASE)
_WORD_LETTERS = frozenset("AI")  # capital letters that are also English words
_OWN_LETTER = re.compile(r"^\(?([A-Pa-p])\)?\s*[.):]\s*")


def _norm_option(text: str) -> str:
    return normalize_vqa(_TEXT_PREFIX.sub("", normalize_vqa(text)))


def _option_texts(choices: Sequence[str]) -> list[str]:
    # Loaders pass bare option texts; tolerate "C. Farm" in case one was left unsplit.
    out = []
    for i, c in enumerate(choices):
        m = _OWN_LETTER.match(c.strip())
        if m and m.group(1).upper() == _LETTERS[i]:
            c = c.strip()[m.end():]
        out.append(_norm_option(c))
    return out


def _first_line(s: str) -> str:
    return s.strip().split("\n", 1)[0].strip()


def _cue_letter(c: re.Match[str], s: str, text_letters: Callable[[str], set[str]]) -> bool:
    """Whether the letter after a cue word is an option letter rather than the start of a word
    ("The answer is a farm", "Option A is wrong")."""
    opened, letter, closed = c.group("open"), c.group("letter"), c.group("close")
    after = s[c.end("close") if closed else c.end("letter"):]
    if opened:
        return bool(closed)  # "(C)"; "(C" is not a letter token
    if closed or not after.strip() or after[0] in ".:)":
        return True
    if after[0] in ",;":
        return letter.isupper()
    if after[0].isspace() and letter.isupper():
        named = text_letters(_first_line(after).rstrip("."))
        if named:  # "Answer: C Farm" names C; "The answer is A farm" is an article
            return letter in named
        # "The answer is C because ...": a letter, unless it is a word ("A", "I");
        # but "Option B is wrong" describes an option rather than answering
        return c.group("cue").lower() == "answer" and letter not in _WORD_LETTERS
    return False


def pick(text: str, choices: Sequence[str]) -> str | None:
    """The option letter the answer names, or None when it names none, two, or an invalid one.

    Precedence and reasons: module docstring §3.
    """
    if not choices or len(choices) > len(_LETTERS):
        raise ValueError(f"pick: {len(choices)} choices; 1..{len(_LETTERS)} supported")
    valid = _LETTERS[: len(choices)]
    opts = _option_texts(choices)
    by_text: dict[str, set[str]] = {}
    for i, t in enumerate(opts):
        if t:
            by_text.setdefault(t, set()).add(_LETTERS[i])

    def text_letters(rest: str) -> set[str]:
        return by_text.get(_norm_option(rest), set())

    s = _STRIP_MD.sub("", final_answer(text)).strip()
    found: set[str] = set()

    m = _WHOLE.match(_first_line(s))
    if m:  # (a) - on the first line, so "C\n\nBecause ..." reads as C
        found.add(m.group(1).upper())
    else:
        m = _LEAD.match(s)
        if m:  # (b)
            found.add((m.group(1) or m.group(2)).upper())
            rest = _first_line(m.group(3)).rstrip(".")
            found |= text_letters(rest)  # a different option's text: two options named
    for c in _CUE.finditer(s):  # (c)
        if _cue_letter(c, s, text_letters):
            found.add(c.group("letter").upper())
    found |= {p.group(1) for p in _PAREN.finditer(s)}  # (d)
    if not found:  # (e) only when no letter was named
        found |= text_letters(_first_line(s).rstrip("."))
    if len(found) != 1:
        return None
    (letter,) = found
    return letter if letter in valid else None


def _gt_letter(question: Question) -> str:
    choices = question.choices or ()
    gt = question.answer.strip().rstrip(".").strip().upper()
    if len(gt) == 1 and gt in _LETTERS[: len(choices)]:
        return gt
    got = pick(question.answer, choices) if choices else None
    if got is None:
        raise ValueError(
            f"{question.benchmark} question {question.key}: ground truth {question.answer!r} "
            f"is not an option letter of its {len(choices)} choices; fix the loader or the record")
    return got


def score_mc(question: Question, text: str, options: ScoreOptions) -> Score:
    """The picked letter against the ground-truth letter (rules: §3)."""
    if not question.choices:
        raise ValueError(
            f"{question.benchmark} question {question.key}: multiple-choice question without "
            f"choices; the loader must fill Question.choices")
    gt = _gt_letter(question)
    got = pick(text, question.choices)
    if got is None:
        return Score(correct=False, parsed=False,
                     extracted=final_answer(text)[:_EXTRACT_CAP])
    return Score(correct=got == gt, parsed=True, extracted=got)


# --------------------------------------------------------------------------- grounding

Box = tuple[float, float, float, float]
_N = r"\s*(-?\d+(?:\.\d+)?)\s*"
_SQUARE = re.compile(r"\[" + ",".join([_N] * 4) + r"\]")
_ANGLE = re.compile(r"\{?\s*" + r"\s*".join([r"<" + _N + r">"] * 4) + r"\s*\}?")


def parse_box(text: str) -> Box | None:
    """The first box in the final answer, in either format, corners ordered (rules: §4)."""
    s = final_answer(text)
    hits = [m for m in (_SQUARE.search(s), _ANGLE.search(s)) if m]
    if not hits:
        return None
    m = min(hits, key=lambda h: h.start())
    x1, y1, x2, y2 = (float(m.group(i)) for i in range(1, 5))
    return (min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2))


def _scale(grid: str, image_size: tuple[int, int] | None) -> tuple[float, float]:
    if grid == "pixels":
        if not image_size or image_size[0] <= 0 or image_size[1] <= 0:
            raise ValueError("--box-grid pixels needs the (width, height) of the image the "
                             "model saw; pass ScoreOptions(image_size=...)")
        return float(image_size[0]), float(image_size[1])
    if grid not in BOX_GRIDS:
        raise ValueError(f"--box-grid {grid!r} is not one of {', '.join(BOX_GRIDS)}")
    g = float(grid)
    return g, g


def to_grid(box: Sequence[float], from_grid: str, to_grid: str,
            image_size: tuple[int, int] | None = None) -> Box:
    """`box` converted between grids ("1000", "100", "pixels" with `image_size` = (W, H))."""
    fw, fh = _scale(from_grid, image_size)
    tw, th = _scale(to_grid, image_size)
    x1, y1, x2, y2 = box
    return (x1 / fw * tw, y1 / fh * th, x2 / fw * tw, y2 / fh * th)


def iou(a: Sequence[float], b: Sequence[float], mode: str = "inclusive") -> float:
    """Intersection over union; "inclusive" adds 1 to widths/heights as VRSBench does."""
    if mode not in IOU_MODES:
        raise ValueError(f"iou mode {mode!r} is not one of {', '.join(IOU_MODES)}")
    e = 1.0 if mode == "inclusive" else 0.0
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]) + e)
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]) + e)
    inter = iw * ih
    area_a = max(0.0, a[2] - a[0] + e) * max(0.0, a[3] - a[1] + e)
    area_b = max(0.0, b[2] - b[0] + e) * max(0.0, b[3] - b[1] + e)
    union = area_a + area_b - inter
    return inter / union if union > 0 else 0.0


def _fmt_box(box: Box) -> str:
    return ",".join(f"{round(v, 2):g}" for v in box)


def score_ref(question: Question, text: str, options: ScoreOptions) -> Score:
    """IoU of the answer box with the 0-100 ground truth; correct at IoU >= 0.5 (rules: §4)."""
    gt = parse_box(question.answer)
    if gt is None:
        raise ValueError(
            f"{question.benchmark} question {question.key}: ground truth {question.answer!r} "
            f"is not a box '{{<x1><y1><x2><y2>}}'; fix the loader or the record")
    pred = parse_box(text)
    if pred is None:
        return Score(correct=False, parsed=False, extracted=final_answer(text)[:_EXTRACT_CAP],
                     views=(("iou", 0.0), ("acc@0.5", 0.0), ("acc@0.7", 0.0)))
    p = to_grid(pred, options.box_grid, GT_GRID, options.image_size)
    v = iou(p, gt, options.iou)
    # Rounded so that a value printed as 0.5 in a report is never counted as a miss.
    hit5, hit7 = round(v, 9) >= 0.5, round(v, 9) >= 0.7
    return Score(correct=hit5, parsed=True, extracted=_fmt_box(p),
                 views=(("iou", v), ("acc@0.5", float(hit5)), ("acc@0.7", float(hit7))))


_TRUE = frozenset(["1", "true", "yes", "t", "y"])
_FALSE = frozenset(["0", "false", "no", "f", "n"])


def ref_split(question: Question) -> str | None:
    """"unique" / "non-unique" from the question's uniqueness flag (extra key `is_unique`,
    the name the official scorer reads, or `unique`, the name the VRSBench notebook writes);
    None when absent or unreadable."""
    raw = question.get("is_unique", question.get("unique"))
    if raw is None:
        return None
    v = raw.strip().lower()
    if v in _TRUE:
        return "unique"
    if v in _FALSE:
        return "non-unique"
    return None


# --------------------------------------------------------------------------- dispatch

_SCORERS: dict[str, Callable[[Question, str, ScoreOptions], Score]] = {
    "vqa": score_vqa, "mc": score_mc, "ref": score_ref,
}


def score(question: Question, text: str, options: ScoreOptions = ScoreOptions()) -> Score:
    """Score `text` (the raw model reply) against `question`, by its kind."""
    try:
        fn = _SCORERS[question.kind]
    except KeyError:
        raise ValueError(f"{question.benchmark} question {question.key}: unknown kind "
                         f"{question.kind!r}; expected one of {', '.join(_SCORERS)}") from None
    return fn(question, text, options)
