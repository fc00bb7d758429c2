# Why one file of ~840 lines: the module docstring (about 190 lines) is the one home of the
# shared scoring rules (docs/scoring.md shows it), and the final-answer, normalisation, letter
# and box readers share their compiled patterns; a benchmark's own rules live in its module.
"""How a model's reply is turned into a verdict: answer extraction and scoring.

Every rule the benchmarks share lives in this module, so that a number in a report can be
traced to one readable place; a rule of one benchmark only is a view that benchmark declares in
its own module (`View`, `apply_views`). Pure functions, no I/O.

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
* otherwise the whole reply is the answer;
* then, where the model marked its final answer with a box, only the box counts: the content of
  the last GLM-V ``<|begin_of_box|>...<|end_of_box|>`` (as GLM-4.1V-Thinking's own extractor,
  ``glmv_reward/utils/text.py`` ``find_boxed_content``), else of the last LaTeX ``\\boxed{...}``,
  braces inside it kept and ``\\text{...}`` unwrapped (as Qwen2.5-Math's
  ``evaluation/parser.py`` ``extract_answer``), so ``... so the answer is \\boxed{yes}.`` is
  ``yes``; leftover answer tags are removed and the result is stripped.

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
``"a ship"`` does not match ``"ship"``; VRSBench's official view (``datasets/vrsbench.py``)
does accept it.
An empty final answer is unparseable (``parsed=False``) and wrong.

Extra views (``Score.views``): each benchmark declares its own (`View`, in its module under
``datasets/``, registered with its ``Benchmark.score_views`` and passed in
``ScoreOptions.views``); `apply_views` adds their values after the kind's own. The rules of
the built-in ones live beside their benchmarks: RSVQA's count/area classes (``binned``,
``datasets/rsvqa.py``), VRSBench's deterministic rules (``official``, ``datasets/vrsbench.py``)
and LHRS-Bot's first-character rule (``lhrs_official``, ``datasets/lhrs.py``).

3. Multiple choice (`pick`, `score_mc`) - LHRS-Bench
----------------------------------------------------
``question.choices`` are the option texts in letter order (A, B, ...); letters beyond the
number of options are not valid. `pick` collects every option the final answer names, by
these rules (markdown ``*``/`````` ` `````` removed first), and returns the letter only when
exactly one valid option is named. A letter, when one is named, is the answer, and the
option texts are consulted only to catch a letter written with ANOTHER option's text.
"Brackets" below are ``()``, ``[]``, quotes (``'B'``, ``"B"``, curly quotes) and their
full-width forms (``（B）``, ``【B】``, ``「B」``):

a. the whole first line is a letter: ``C``, ``c``, ``C.``, ``(C)``, ``C)``, ``C:``, ``[C]``,
   ``'C'``, ``"C"``, ``C。``, ``**C**``, ``C`` then a new line and an explanation;
b. the answer starts with a letter and a delimiter (``.`` ``)`` ``:`` ``,`` ``;`` a spaced
   dash, or their full-width forms) or a bracketed letter: ``C. Farm``, ``(C) Farm``,
   ``C, because ...``, ``C - Farm``;
b'. the first line starts with a capital letter, a space and words: ``C because ...``,
   ``C Farm``, ``C (Farm)``, ``C is correct.``. ``A`` and ``I`` are also English words, so
   they count only when what follows cannot follow the article or the pronoun: a bracket,
   or ``because``/``since``/``is``/``was``/``seems``/``appears``/``looks``/``fits``/
   ``matches`` (``A because ...``, ``A is correct``; not ``A farm is visible``, ``I think
   ...``). A first line that is exactly an option's text (``L shape``) is that text.
   In b and b', the words after the letter are checked: if they are (or start, up to a
   delimiter or ``because``/``since``/``which``/``is``, with) the text of a DIFFERENT option
   (``A. Farm``, ``B (Farm)``, ``B Farm, because ...`` where Farm is C), or a second lone
   letter (``B, C``), the answer names two options;
c. a letter after a cue: ``answer``, ``option``, ``choice``, ``choose``/``chose``,
   ``select``, ``pick``, ``go with``, ``say``, and the Chinese ``答案`` (answer), ``选项``
   (option), ``选择``/``选`` (choose), optionally then ``is``/``是``/``为`` and ``:``/``：``:
   ``Answer: C``, ``The answer is C.``, ``I choose option (B)``, ``I would choose B.``,
   ``答案：B``. The letter must be bracketed or followed by the end or punctuation (a
   capital letter also by ``,`` ``;`` or a Chinese character) - so the article in ``The
   answer is a farm`` is not a letter. A capital letter followed by words is the answer
   (``The answer is C because ...``) unless the words are a different option's text (``The
   answer is A farm``: an article), or the letter is ``A``/``I`` not followed by one of the
   connectives of b'; after ``option``/``choice`` it describes rather than answers
   (``Option B is wrong``) unless the words are the letter's own option text;
c'. weak cue: a capital letter right after ``is``, ``be``, ``it's``, ``so``, ``thus``,
   ``hence`` or ``therefore``, followed by the end, punctuation or ``because``/``since``/
   ``as``: ``I think it's B.``, ``It is B. Park.``, ``so it must be (C)``, ``..., so B.``;
c''. a capital letter said to be right: ``B is correct``, ``B is the best``, ``B is the
   answer``, ``B is the most likely`` (anywhere; ``B is not correct`` names nothing);
d. a bracketed capital letter anywhere: ``... so the answer is (C) ...``; weak: a capital
   letter that ends the answer after a comma, colon, line break or a sentence (``Based on
   the image, B.``, ``This is a park. B``); two letters joined by ``or`` or ``/`` on the
   first line (``B or C``, ``B/C``, not ``not C or D``), which names both;
e. only when rules a-d found no letter: the option text alone (first line), compared after
   `normalize_vqa` with a leading cue (``answer:``, ``the answer is``, ``it is``, ``I think
   it's``) and a leading article removed: ``Farm``, ``a farm.``, ``The answer is Farm``;
   or the first line's start up to a delimiter (``,`` ``;`` ``:`` ``(`` a spaced dash or a
   full stop), checked as in b for a second option: ``Farm, because ...`` names C,
   ``Farm, Forest`` two options. Only exact matches count: ``farmland`` does not name
   ``Farm``, and ``A farm is visible`` names nothing.

Two different letters (``The answer is A. No, the answer is C.``, ``(A) or (C)``,
``B, C``), or a letter that is not a valid option (``E`` with four options) named by rules
a-d (weak rules only ever add valid letters), make the answer unparseable: ``parsed=False``,
scored wrong and counted separately, so a format problem is not mistaken for a knowledge
problem.

LHRS-Bot's own scorer (its first-character rule) is LHRS-Bench's view ``lhrs_official``,
declared in ``datasets/lhrs.py``; `gt_letter` gives it the ground-truth letter.

4. Grounding (`parse_box`, `to_grid`, `iou`, `score_ref`) - VRSBench referring
------------------------------------------------------------------------------
* Boxes are read from the final answer only (never from ``<think>``); the first of these,
  whichever comes first in the text:
  - ``[x1, y1, x2, y2]`` (ints or floats; in a nested list ``[[...], [...]]`` or Qwen2.5-VL's
    JSON ``[{"bbox_2d": [...], "label": ...}]`` the first box);
  - ``{<x1><y1><x2><y2>}`` (braces optional), also GeoChat's rotated form
    ``{<x1><y1><x2><y2>|<angle>}`` (the angle is ignored);
  - Qwen2-VL's ``(x1,y1),(x2,y2)``, with or without ``<|box_start|>``/``<|box_end|>`` and a
    leading ``<|object_ref_start|>...<|object_ref_end|>`` (a server that skips special
    tokens sends the bare pairs). The Qwen2-VL technical report (arXiv:2409.12191, visual
    grounding) defines this form with corners normalised to [0, 1000): the default grid of
    the ``geocot`` style, so such a model scores with ``--box-grid 1000`` (the grid is never
    guessed from the form);
  - MiniCPM-V's ``<box>x1 y1 x2 y2</box>`` (space-separated numbers, only inside the tag);
  - named corners, in any order: ``x1=25, y1=40, x2=33, y2=60``, ``x1: 25``, JSON
    ``{"x1": 25, ...}``, ``x_min``/``xmin``..``y_max``, ``left``/``top``/``right``/``bottom``
    (the first complete set of one naming).
  Any other text (four bare numbers, ``(x, y, w, h)``) is unparseable - a model that does not
  answer with a box did not localise the object.
* Fractions: a box whose four coordinates are all in [0, 1] and at least one is written with
  a decimal point (``[0.25, 0.4, 0.33, 0.6]``) gives its corners as fractions of the image's
  width and height, whatever ``--box-grid`` says: it is multiplied by 100. On any grid such a
  box would be under one unit wide, which no model means. ``[0, 0, 1, 1]`` (integers) is read
  on the grid.
* Reversed corners (``x2 < x1`` or ``y2 < y1``, after conversion) give IoU 0, as the official
  ``computeIoU`` (lx709/VRSBench ``eval_fianl/eval_utils.py``) gives for a box reversed by at
  least one unit: its intersection width is then never positive. (Earlier versions reordered
  the corners.) The lenient reading is available as the views ``("iou_reordered", v)`` and
  ``("acc@0.5_reordered", 0|1)`` (`REORDERED`), computed only where a benchmark declares
  them.
* Ground truth is VRSBench's ``{<x1><y1><x2><y2>}`` on a 0-100 grid. The model's box is
  converted to that grid from ``ScoreOptions.box_grid`` (``--box-grid``): ``1000`` (the
  GLM-V / Geo-CoT380k / Qwen2-VL convention, the default) divides by 10; ``100`` is used as
  is; ``pixels`` divides by the width/height of the image the model saw, times 100. Mixing
  grids silently gives near-zero or spuriously high IoU, which is why the grid is an explicit
  option. No clipping and no rounding is applied after conversion.
* IoU (``ScoreOptions.iou``): ``inclusive`` (default) is VRSBench's official pixel convention
  (``computeIoU``): ``inter = (min(x2)-max(x1)+1) * (min(y2)-max(y1)+1)``,
  ``area = (x2-x1+1)*(y2-y1+1)``; ``continuous`` is the plain geometric IoU. Example: GT
  ``[25,40,33,60]`` vs ``[26,41,34,61]`` is 0.734 inclusive, 0.711 continuous; a zero-width
  GT such as ``[92,0,96,0]`` (VRSBench has a few) can only be hit under the inclusive
  convention. An empty union gives 0.
* ``correct`` = IoU >= 0.5; views ``("iou", v)``, ``("acc@0.5", 0|1)``, ``("acc@0.7", 0|1)``.
  An unparseable answer is a miss and stays in the denominator, as in the official metric
  (``compute_metrics.ipynb`` divides by every sample). Reports split Acc@0.5/0.7 into Unique
  / Non-unique / All with `ref_split`.
* Where this differs from the official parsing on purpose: the official notebook
  (``eval_fianl/compute_metrics.ipynb``) takes the first four runs of digits anywhere in the
  raw answer (``re.findall(r'\\d+', ...)``) and applies no grid conversion. That reads
  ``0.25`` as ``0`` and ``25``, a reasoning trace's numbers as the box, and a 0-1000 box as
  if it were on 0-100; we read only well-formed boxes in the final answer, on the declared
  grid.

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
    "FRACTION_GRID",
    "IOU_MODES",
    "REORDERED",
    "View",
    "ViewRule",
    "apply_views",
    "final_answer",
    "inline_reasoning",
    "gt_letter",
    "normalize_vqa",
    "score_vqa",
    "pick",
    "score_mc",
    "parse_box",
    "to_grid",
    "iou",
    "score_ref",
    "ref_split",
    "score",
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
    # The per-question views the benchmark declares for itself (`Benchmark.score_views`): each
    # a `View`, its name with its rule; `apply_views` computes them. A plain name computes
    # nothing: it only says the view is declared (`name in options.views`).
    views: frozenset[str] = frozenset()
    # the prompt convention the run used: which model resizing `image_size` follows
    # (`core.verdict.question_options`)
    prompt_style: str = "geocot"

    def __post_init__(self) -> None:
        if self.box_grid not in BOX_GRIDS:
            raise ValueError(
                f"--box-grid {self.box_grid!r} is not one of {', '.join(BOX_GRIDS)}")
        if self.iou not in IOU_MODES:
            raise ValueError(f"--iou {self.iou!r} is not one of {', '.join(IOU_MODES)}")


ViewRule = Callable[[Question, str, "ScoreOptions"], "float | bool | None"]


class View(str):
    """One per-question view a benchmark declares: its name (what its labels, figures and the
    judge address it by) with its rule, a pure function (question, raw reply, options) ->
    value, or None where the view does not apply to the question (RSVQA's classes to a
    presence question). Declared in the benchmark's module, e.g.
    ``Benchmark(score_views=frozenset({View("binned", binned)}))``; the rule must be a
    module-level function, so options that hold it pickle.

    A view is a string equal to its name, so ``"binned" in options.views`` and a set of names
    compare as before; two views are equal only when their rules are too (options that hold
    different rules under one name are different memo keys)."""

    rule: ViewRule

    def __new__(cls, name: str, rule: ViewRule) -> View:
        if not callable(rule):
            raise TypeError(f"View {name!r}: its rule must be a function (question, reply, options) -> value")
        self = super().__new__(cls, name)
        self.__dict__["rule"] = rule
        return self

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError("a View is immutable")

    def __reduce__(self) -> tuple[object, tuple[str, ViewRule]]:
        return View, (str(self), self.rule)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, View):
            return str.__eq__(self, other) and self.rule == other.rule
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = str.__hash__

    def __repr__(self) -> str:
        return f"View({str.__repr__(self)}, {getattr(self.rule, '__qualname__', self.rule)})"


def apply_views(question: Question, text: str, options: ScoreOptions) -> tuple[tuple[str, float], ...]:
    """The values of the views `options` carries (`ScoreOptions.views`) for the raw reply
    `text`, in name order; a view whose rule gives None is left out for this question."""
    out: list[tuple[str, float]] = []
    for view in sorted(options.views):
        if isinstance(view, View):
            value = view.rule(question, text, options)
            if value is not None:
                out.append((str(view), float(value)))
    return tuple(out)


# --------------------------------------------------------------------------- final answer

_FLAGS = re.IGNORECASE | re.DOTALL
_CLOSED_BLOCK = re.compile(r"<(think|reasoning)>.*?</\1\s*>", _FLAGS)
_STRAY_CLOSE = re.compile(r"^.*</(?:think|reasoning)\s*>", _FLAGS)
_ANSWER_OPEN = re.compile(r"<answer\s*>", re.IGNORECASE)
_ANSWER_CLOSE = re.compile(r"</answer\s*>", re.IGNORECASE)
_UNCLOSED_OPEN = re.compile(r"<(?:think|reasoning)>.*$", _FLAGS)
_NOISE = re.compile(r"<\|(?:begin|end)_of_box\|>|</?answer\s*>", re.IGNORECASE)
_GLM_BOX = re.compile(r"<\|begin_of_box\|>(.*?)<\|end_of_box\|>", re.DOTALL)
_TEX_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")


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
    boxed = _last_box(s)
    if boxed is not None:
        s = boxed
    return _NOISE.sub("", s).strip()


def inline_reasoning(text: str | None) -> str | None:
    """The thinking a reply left inline in its text, by the tags `final_answer` removes: the
    contents of closed `<think>`/`<reasoning>` blocks, what comes before a stray closing tag (a
    chat template that pre-filled the opening one) and what follows an opening tag never closed
    (cut off while thinking), joined by blank lines; "" when the tags are there but empty (a
    model asked not to think), None when there are none. Kept beside the answer, never scored:
    `final_answer` decides what is scored, and this changes nothing in it."""
    if not text or "<" not in text:
        return None
    parts = [m.group(0)[m.group(0).index(">") + 1: m.group(0).rindex("<")] for m in _CLOSED_BLOCK.finditer(text)]
    rest = _CLOSED_BLOCK.sub(" ", text)
    stray = _STRAY_CLOSE.search(rest)
    if stray is not None:
        parts.insert(0, rest[: stray.group(0).rindex("<")])
    else:
        unclosed = _UNCLOSED_OPEN.search(rest)
        if unclosed is not None:
            parts.append(unclosed.group(0)[unclosed.group(0).index(">") + 1:])
        elif not parts:
            return None
    return "\n\n".join(p.strip() for p in parts if p.strip())


def _last_box(s: str) -> str | None:
    """The content of the last answer box, where the model marked its final answer with one:
    GLM-V's `<|begin_of_box|>...<|end_of_box|>` (its own extractor, THUDM/GLM-4.1V-Thinking
    `glmv_reward/utils/text.py` `find_boxed_content`, keeps only that), else LaTeX's
    `\\boxed{...}` with braces inside it and `\\text{...}` unwrapped (QwenLM/Qwen2.5-Math
    `evaluation/parser.py` `extract_answer`, `strip_string`). None when there is no box."""
    glm: list[str] = _GLM_BOX.findall(s)  # one group: the strings it matched
    if glm:
        return glm[-1]
    start = s.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(s)):
        if s[j] == "{":
            depth += 1
        elif s[j] == "}":
            depth -= 1
            if depth == 0:
                return _TEX_TEXT.sub(r"\1", s[i:j])
    return None  # an unclosed box (a truncated reply): no final answer in it


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


def score_vqa(question: Question, text: str, options: ScoreOptions) -> Score:
    """Normalised exact match, plus the views the benchmark declares (rules: §2)."""
    pred = normalize_vqa(final_answer(text))
    gt = normalize_vqa(question.answer)
    parsed = bool(pred)
    return Score(correct=parsed and pred == gt, parsed=parsed,
                 extracted=pred[:_EXTRACT_CAP], views=apply_views(question, text, options))


# --------------------------------------------------------------------------- multiple choice

_LETTERS = "ABCDEFGHIJKLMNOP"  # LHRS-Bench allows options up to P
_STRIP_MD = re.compile(r"[*`]+")
_OPENERS = "([【「『'\"“‘（"
_CLOSERS = ")]】」』'\"”’）"
_O = "[" + re.escape(_OPENERS) + "]"
_C = "[" + re.escape(_CLOSERS) + "]"
# what may follow a letter token: the end, or punctuation (ASCII or full-width)
_STOP = ".:)。：）!！?？"
_SOFT_STOP = ",;，；、"  # after a capital letter only ("B, because ...")
# (a) the whole first line is a letter: C  c  C.  (C)  [C]  'C'  "C"  C。
_WHOLE = re.compile(r"^" + _O + r"?\s*([A-Za-z])\s*" + _C + r"?\s*[.:)。：!！]?$")
# (b) a leading letter and a delimiter, then text: C. Farm  (C) Farm  C, because  C - Farm
_LEAD = re.compile(
    r"^(?:" + _O + r"\s*(?P<l1>[A-Za-z])\s*" + _C
    + r"|(?P<l2>[A-Za-z])(?:\s*[.):：。）]|\s*[,;，；、]|\s+[-–—]|[-–—]\s))\s*(?P<rest>.*)$",
    re.DOTALL)
# (b') a leading capital letter and a space, then words: B because ...  B Park  B is correct
_LEAD_WORD = re.compile(r"^(?P<l>[A-P])\s+(?P<rest>\S.*)$", re.DOTALL)
# Words after a leading "A"/"I" that neither an article nor the pronoun is followed by.
_CONNECTIVE = re.compile(
    r"^(?:because|since|is|was|seems|appears|looks|fits|matches)\b|^[(（]", re.IGNORECASE)
# (c) a cue, then a letter token; what follows the letter is checked in `_cue_letter`
# (the letter is matched in a lookahead so "answer is option C" still finds the cue "option";
# "：" is the full-width colon; 答案 "answer", 选项 "option", 选择/选 "choose")
_CUE = re.compile(
    r"(?:\b(?P<cue>answers?|options?|choices?|choose|chose|chosen|select(?:ed)?|pick(?:ed)?"
    r"|go(?:ing)?\s+with|say)\b|(?P<cjk>答案|选项|选择|选))"
    r"(?=(?:\s+is)?\s*(?:是|为)?\s*[:：\-]?\s*(?P<open>" + _O + r")?(?P<letter>[A-Za-z])"
    r"(?P<close>" + _C + r")?)",
    re.IGNORECASE)
_DESCRIBING_CUES = frozenset({"option", "options", "choice", "choices"})
# (c') a weak cue: a capital letter right after "is"/"be"/"it's", followed by nothing or
# punctuation: "I think it's B.", "It is B. Park.", "so it must be (C)"
_WEAK_CUE = re.compile(
    r"\b(?i:is|be|it['’]?s|so|thus|hence|therefore)\s*[:：,]?\s*(?P<open>" + _O
    + r")?(?P<letter>[A-P])(?P<close>" + _C + r")?(?=$|\s*$|[" + re.escape(_STOP + _SOFT_STOP)
    + r"]|\s+(?i:because|since|as)\b)")
# (c'') a capital letter said to be right: "Among the options, B is the best."
_IS_RIGHT = re.compile(
    r"(?<![\w'’])" + _O + r"?(?P<letter>[A-P])" + _C + r"?\s+(?i:is\s+(?:the\s+)?"
    r"(?:correct|right|best|answer|most\s+likely))\b")
# (d) a bracketed capital letter anywhere: "... so the answer is (C) ..."
_PAREN = re.compile(r"[(（\[【]([A-P])[)）\]】]")
# (d') a capital letter that ends the answer after a comma, colon or line break
_TAIL = re.compile(
    r"(?:^|[,:;，：；\n]|[.。!！]\s)\s*" + _O + r"?([A-P])" + _C + r"?\s*[.。!！]?\s*$")
# (d'') two letters joined by "or" / "/" on the first line: "B or C", "B/C", "(A) or (C)";
# not "not C or D", which excludes them
_OR = re.compile(
    r"(?<![\w'’])(?<!not )(?<!nor )(?<!neither )" + _O + r"?([A-P])" + _C
    + r"?\s*(?:or|/)\s*(?:maybe\s+|possibly\s+|perhaps\s+)?" + _O + r"?([A-P])" + _C
    + r"?(?![\w'’])")
# (e) where an option text alone ends on the first line: "Farm, because ..."
_TEXT_END = re.compile(r"[,;:，；：(（]|\s[-–—]\s|\.(?:\s|$)")
# (e) cue prefixes and an article removed before comparing option texts
_TEXT_PREFIX = re.compile(
    r"^(?:(?:the\s+)?(?:correct\s+|final\s+)?(?:answer|option|choice)\b(?:\s+is)?\s*[:\-]?\s*"
    r"|(?:i\s+think\s+|i\s+believe\s+)?(?:it\s+is|it\s+s|this\s+is)\s+)?"
    r"(?:(?:a|an|the)\s+)?", re.IGNORECASE)
# where the option text after a leading letter ends: "Park, because ...", "Park (the trees)"
_HEAD_END = re.compile(
    r"[,;:，；：(（]|\s[-–—]\s|\.(?:\s|$)|(?:^|\s)(?:because|since|as|which|that|is|was)\b",
    re.IGNORECASE)
_LONE_LETTER = re.compile(r"^" + _O + r"?([A-P])" + _C + r"?$")
_WORD_LETTERS = frozenset("AI")  # capital letters that are also English words
_OWN_LETTER = re.compile(r"^\(?([A-Pa-p])\)?\s*[.):]\s*")
_CJK = re.compile(r"[\u3400-\u9fff]")


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


def _named_after(rest: str, text_letters: Callable[[str], set[str]]) -> set[str]:
    """The options the words after a letter name: an option text (the whole first line, its
    bracketed start, or its start up to a delimiter), or a lone second letter ("B, C")."""
    line = _first_line(rest).rstrip(".。").strip()
    if not line:
        return set()
    m = _LONE_LETTER.match(line)
    if m:
        return {m.group(1)}
    named = set(text_letters(line))
    if line[0] in _OPENERS:
        close = next((i for i, ch in enumerate(line[1:], 1) if ch in _CLOSERS), None)
        if close is not None:
            named |= text_letters(line[1:close])
    else:
        cut = _HEAD_END.search(line)
        if cut and cut.start() > 0:
            named |= text_letters(line[: cut.start()])
    return named


def _cue_letter(c: re.Match[str], s: str, text_letters: Callable[[str], set[str]]) -> bool:
    """Whether the letter after a cue is an option letter rather than the start of a word
    ("The answer is a farm", "Option A is wrong")."""
    opened, letter, closed = c.group("open"), c.group("letter"), c.group("close")
    after = s[c.end("close") if closed else c.end("letter"):]
    if opened:
        return bool(closed)  # "(C)", "'C'"; "(C" is not a letter token
    if closed or not after.strip() or after[0] in _STOP:
        return True
    if after[0] in _SOFT_STOP or _CJK.match(after[0]):
        return letter.isupper()  # "Answer: C, because"; "答案是B因为..."
    if after[0].isspace() and letter.isupper():
        named = _named_after(after, text_letters)
        if named:  # "Answer: C Farm" names C; "The answer is A farm" is an article
            return letter in named
        if c.group("cjk") is None and c.group("cue").lower() in _DESCRIBING_CUES:
            return False  # "Option B is wrong" describes an option rather than answering
        # "The answer is C because ...": a letter, unless it is a word ("A", "I") that is not
        # followed by a word an article or the pronoun cannot be ("A because ...")
        return letter not in _WORD_LETTERS or bool(_CONNECTIVE.match(after.lstrip()))
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
    line = _first_line(s)
    found: set[str] = set()  # letters named by the strong rules, valid or not
    weak: set[str] = set()  # letters named by the weak rules; only valid ones count

    m = _WHOLE.match(line)
    if m:  # (a) - on the first line, so "C\n\nBecause ..." reads as C
        found.add(m.group(1).upper())
    elif (m := _LEAD.match(s)):  # (b)
        found.add((m.group("l1") or m.group("l2")).upper())
        found |= _named_after(m.group("rest"), text_letters)  # another option's text: two
    elif (m := _LEAD_WORD.match(line)) and m.group("l") in valid:
        # (b') "B because ...", "B Park", "B (Park)", "B is correct"; not "A farm is
        # visible" (an article), "I think ..." (the pronoun), nor a whole option text that
        # starts with a capital letter and a space ("L shape")
        letter, rest = m.group("l"), m.group("rest")
        bracketed = rest[0] in _OPENERS
        if (bracketed or not text_letters(line)) and (
                letter not in _WORD_LETTERS or _CONNECTIVE.match(rest)):
            found.add(letter)
            found |= _named_after(rest, text_letters)
    for c in _CUE.finditer(s):  # (c)
        if _cue_letter(c, s, text_letters):
            found.add(c.group("letter").upper())
    for w in _WEAK_CUE.finditer(s):  # (c')
        if not w.group("open") or w.group("close"):
            weak.add(w.group("letter"))
    found |= {r.group("letter") for r in _IS_RIGHT.finditer(s)}  # (c'')
    found |= {p.group(1) for p in _PAREN.finditer(s)}  # (d)
    if (tail := _TAIL.search(s)):  # (d')
        weak.add(tail.group(1))
    for o in _OR.finditer(line):  # (d'')
        found |= {o.group(1), o.group(2)}
    found |= weak & set(valid)
    if not found:  # (e) only when no letter was named
        found |= text_letters(line.rstrip("."))
        cut = _TEXT_END.search(line)
        if not found and cut and cut.start() > 0 and (head := text_letters(line[: cut.start()])):
            # "Farm, because ...": the text, then what follows it ("Farm, Forest": two)
            rest = line[cut.start():] if line[cut.start()] in _OPENERS else line[cut.end():]
            found |= head | _named_after(rest, text_letters)
    if len(found) != 1:
        return None
    (letter,) = found
    return letter if letter in valid else None


def gt_letter(question: Question) -> str:
    """The ground-truth option letter of a multiple-choice question (a letter, or an answer
    `pick` reads as one); ValueError naming the question when it is neither."""
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


_gt_letter = gt_letter  # the name `core.analysis` reads


def score_mc(question: Question, text: str, options: ScoreOptions) -> Score:
    """The picked letter against the ground-truth letter, plus the views the benchmark
    declares (rules: §3)."""
    if not question.choices:
        raise ValueError(
            f"{question.benchmark} question {question.key}: multiple-choice question without "
            f"choices; the loader must fill Question.choices")
    gt = gt_letter(question)
    views = apply_views(question, text, options)
    got = pick(text, question.choices)
    if got is None:
        return Score(correct=False, parsed=False,
                     extracted=final_answer(text)[:_EXTRACT_CAP], views=views)
    return Score(correct=got == gt, parsed=True, extracted=got, views=views)


# --------------------------------------------------------------------------- grounding

Box = tuple[float, float, float, float]
_NUM = r"(-?\d+(?:\.\d+)?)"
_N = r"\s*" + _NUM + r"\s*"
_SQUARE = re.compile(r"\[" + ",".join([_N] * 4) + r"\]")
# {<x1><y1><x2><y2>}, braces optional; GeoChat's rotated form {<x1><y1><x2><y2>|<angle>} too
_ANGLE = re.compile(
    r"\{?\s*" + r"\s*".join([r"<" + _N + r">"] * 4) + r"\s*(?:\|\s*<[^<>]*>\s*)?\}?")
# Qwen2-VL: <|box_start|>(x1,y1),(x2,y2)<|box_end|>; a server that skips special tokens
# sends the bare (x1,y1),(x2,y2)
_QWEN_MARKS = re.compile(r"<\|(?:box_start|box_end|object_ref_start|object_ref_end)\|>")
_PAIRS = re.compile(r"\(" + _N + "," + _N + r"\)\s*,?\s*\(" + _N + "," + _N + r"\)")
# MiniCPM-V: <box>x1 y1 x2 y2</box> (space-separated; the tag makes it a box)
_TAGGED = re.compile(r"<box>\s*" + r"\s+".join([_NUM] * 4) + r"\s*</box>", re.IGNORECASE)
# named corners: x1=25, y1=40, ...; "x1": 25 (JSON); x_min/xmin ...; left/top/right/bottom
_KEY = re.compile(
    r"(?<![\w])[\"']?(?P<key>x_?1|y_?1|x_?2|y_?2|x_?min|y_?min|x_?max|y_?max"
    r"|left|top|right|bottom)[\"']?\s*[:=]\s*[\"']?" + _NUM, re.IGNORECASE)
_KEY_SETS = (("x1", "y1", "x2", "y2"), ("xmin", "ymin", "xmax", "ymax"),
             ("left", "top", "right", "bottom"))
FRACTION_GRID = "1"  # corners given as fractions of the image's width and height


def _named_corners(s: str) -> tuple[int, tuple[str, ...]] | None:
    """(position, the four numbers as written) of the first complete set of named corners."""
    seen: dict[str, tuple[int, str]] = {}
    for m in _KEY.finditer(s):
        seen.setdefault(m.group("key").lower().replace("_", ""), (m.start(), m.group(2)))
    sets = [(min(seen[n][0] for n in names), tuple(seen[n][1] for n in names))
            for names in _KEY_SETS if all(n in seen for n in names)]
    return min(sets) if sets else None


def _find_box(text: str) -> tuple[Box, bool] | None:
    """The first box in the final answer, as written, and whether it is in fractions (§4)."""
    s = _QWEN_MARKS.sub(" ", final_answer(text))
    hits: list[tuple[int, tuple[str, ...]]] = []
    for rx in (_SQUARE, _ANGLE, _PAIRS, _TAGGED):
        m = rx.search(s)
        if m:
            hits.append((m.start(), m.group(1, 2, 3, 4)))
    named = _named_corners(s)
    if named:
        hits.append(named)
    if not hits:
        return None
    raw = min(hits)[1]
    x1, y1, x2, y2 = (float(v) for v in raw)
    box = (x1, y1, x2, y2)
    fraction = all(0.0 <= v <= 1.0 for v in box) and any("." in v for v in raw)
    return box, fraction


def parse_box(text: str) -> Box | None:
    """The first box in the final answer, in any format of §4, as written: corners are not
    reordered and fractions are not converted (`score_ref` does that)."""
    found = _find_box(text)
    return found[0] if found else None


def _scale(grid: str, image_size: tuple[int, int] | None) -> tuple[float, float]:
    if grid == "pixels":
        if not image_size or image_size[0] <= 0 or image_size[1] <= 0:
            raise ValueError("--box-grid pixels needs the (width, height) of the image the "
                             "model saw; pass ScoreOptions(image_size=...)")
        return float(image_size[0]), float(image_size[1])
    if grid not in BOX_GRIDS and grid != FRACTION_GRID:
        raise ValueError(f"--box-grid {grid!r} is not one of {', '.join(BOX_GRIDS)}")
    g = float(grid)
    return g, g


def to_grid(box: Sequence[float], from_grid: str, to_grid: str,
            image_size: tuple[int, int] | None = None) -> Box:
    """`box` converted between grids ("1000", "100", "pixels" with `image_size` = (W, H), and
    "1" for fractions of the image)."""
    fw, fh = _scale(from_grid, image_size)
    tw, th = _scale(to_grid, image_size)
    x1, y1, x2, y2 = box
    return (x1 / fw * tw, y1 / fh * th, x2 / fw * tw, y2 / fh * th)


def iou(a: Sequence[float], b: Sequence[float], mode: str = "inclusive") -> float:
    """Intersection over union; "inclusive" adds 1 to widths/heights as VRSBench does.

    A negative extent counts as empty (the official formula would multiply it in); a box
    with reversed corners gets 0 from `score_ref` before this is reached."""
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


def _hits(v: float) -> tuple[bool, bool]:
    # Rounded so that a value printed as 0.5 in a report is never counted as a miss.
    return round(v, 9) >= 0.5, round(v, 9) >= 0.7


def score_ref(question: Question, text: str, options: ScoreOptions) -> Score:
    """IoU of the answer box with the 0-100 ground truth; correct at IoU >= 0.5 (rules: §4)."""
    gt = _gt_box(question)
    declared = apply_views(question, text, options)
    p = _answer_box(text, options)
    if p is None:
        return Score(correct=False, parsed=False, extracted=final_answer(text)[:_EXTRACT_CAP],
                     views=(("iou", 0.0), ("acc@0.5", 0.0), ("acc@0.7", 0.0)) + declared)
    reversed_corners = p[2] < p[0] or p[3] < p[1]
    v = 0.0 if reversed_corners else iou(p, gt, options.iou)
    hit5, hit7 = _hits(v)
    return Score(correct=hit5, parsed=True, extracted=_fmt_box(p),
                 views=(("iou", v), ("acc@0.5", float(hit5)), ("acc@0.7", float(hit7))) + declared)


def _gt_box(question: Question) -> Box:
    gt = parse_box(question.answer)
    if gt is None:
        raise ValueError(
            f"{question.benchmark} question {question.key}: ground truth {question.answer!r} "
            f"is not a box '{{<x1><y1><x2><y2>}}'; fix the loader or the record")
    return gt


def _answer_box(text: str, options: ScoreOptions) -> Box | None:
    """The reply's box on the ground truth's grid (fractions and --box-grid applied), as
    written otherwise; None when the reply has no box."""
    found = _find_box(text)
    if found is None:
        return None
    box, fraction = found
    return to_grid(box, FRACTION_GRID if fraction else options.box_grid, GT_GRID, options.image_size)


def _iou_reordered(question: Question, text: str, options: ScoreOptions) -> float | None:
    """IoU with the reply's corners reordered (the lenient reading of §4); 0 without a box."""
    if question.kind != "ref":
        return None
    gt = _gt_box(question)
    p = _answer_box(text, options)
    if p is None:
        return 0.0
    r = (min(p[0], p[2]), min(p[1], p[3]), max(p[0], p[2]), max(p[1], p[3]))
    return iou(r, gt, options.iou)


def _acc50_reordered(question: Question, text: str, options: ScoreOptions) -> float | None:
    v = _iou_reordered(question, text, options)
    return None if v is None else float(_hits(v)[0])


# The lenient reading of boxes with reversed corners (§4), for a benchmark that declares it
# beside the official IoU 0: ``score_views=REORDERED``.
REORDERED = frozenset({View("iou_reordered", _iou_reordered), View("acc@0.5_reordered", _acc50_reordered)})


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
