r"""Prompt styles: how a `Question` is worded for the model (`--prompt-style`).

A model is measured off-distribution when it is asked in a phrasing it was not trained on,
so the wording is a named, documented choice rather than strings buried in loaders. Each
style is three templates, one per question kind, plus the box grid its grounding answers
use (`default_box_grid`; `--box-grid` overrides). Template fields:

* `{question}`: the question as stored.
* `{expression}`: the referring expression, stripped; `{expression_lc}`: the same with its
  first letter lower-cased; `{phrase}`: `{expression_lc}` without a final full stop, for
  templates that embed the expression mid-sentence (VRSBench stores
  `The ship positioned towards the lower right.`, a sentence; the models below were trained
  on noun phrases such as `the eyes on a giraffe`).
* `{choices}`: the options as one string: the dataset's own string when it had one, else
  `A. x; B. y; ...`. `{options}`: one option a line (`A. x\nB. y`), from the parsed options
  (the dataset's string when there are none).

| style | VQA | grounding | multiple choice | box grid |
|---|---|---|---|---|
| `geocot` (default) | `{question}` | `where is {expression_lc}` | `{question}\n{choices}\n` + letter instruction | 1000 |
| `geochat` | `{question}\nAnswer the question using a single word or phrase.` | `[refer] Give me the location of <p> {phrase} </p>` | as `geocot` | 100 |
| `qwen2vl` | `{question}\nPlease try to answer the question with short words or phrases if possible.` | `<\|object_ref_start\|>{phrase}<\|object_ref_end\|>` | `Question: {question}\nOptions:\n{options}\nPlease select the correct answer from the options above.` | 1000 |
| `qwen25vl` | as `qwen2vl` | `Locate {phrase}, output its bbox coordinates using JSON format.` | as `qwen2vl` | pixels (of the resized input) |

Sources:

* `geocot`: the seed script's prompts, i.e. Geo-CoT380k / RSThinker training phrasing. VQA is
  the plain question (no "single word" suffix); grounding is `where is <expression>` with a
  lower-cased first letter (a bare capitalised noun phrase reads as a yes/no prompt to these
  models and they answer "Yes"), boxes `[x1, y1, x2, y2]` on 0-1000 (GLM-V convention);
  multiple choice keeps an explicit letter instruction (no training analogue).
* `geochat`: GeoChat's own evaluation (mbzuai-oryx/GeoChat). VQA: docs/Evaluation.md adds
  `Answer the question using a single word or phrase.` after each LRBEN/HRBEN question.
  Grounding: `geochat/eval/batch_geochat_grounding.py` (`eval_model`) asks a referring item
  as `[refer] Give me the location of <p> ` + expression + ` </p>` (the `[refer]` task token
  and `<p>...</p>` phrase markers follow MiniGPT-v2's convention; as published the script
  never assigns the expression to `qs` before building that string, but the intended wording
  is unambiguous). GeoChat answers `{<x1><y1><x2><y2>|<theta>}` on 0-100 with a rotation angle (`geochat_demo.py`:
  `bounding_box_size = 100`), which the box parser reads as its first four numbers. The
  script inserts its bench's expression verbatim; GeoChat's referring expressions are noun
  phrases, so `{phrase}` is used. (The previous wording, `... as {<x1><y1><x2><y2>}, where
  coordinates are integers from 0 to 100.`, was the VRSBench lmms-eval task's, not
  GeoChat's.) Multiple choice: GeoChat has no multiple-choice evaluation (its scene
  classification asks for a class name, `Classify the image from the following classes.
  Answer in one word or a short phrase.`), so it keeps LLaVA-1.5's letter instruction, which
  GeoChat inherits from its training mix (LHRS-Bot's own "Answer from the given choices with
  A., B., ..." is a different model's convention).
* `qwen2vl`: Qwen2-VL (QwenLM/Qwen2-VL; its README documents no grounding prompt). Grounding
  follows the Qwen2-VL technical report (arXiv:2409.12191, "Visual Grounding" and the data
  format example): the referring expression is wrapped in `<|object_ref_start|>` /
  `<|object_ref_end|>` and the model answers `<|box_start|>(x1,y1),(x2,y2)<|box_end|>`, the
  corners normalised to [0, 1000). Servers decode with special tokens skipped by default, so
  the answer text is usually the bare `(x1,y1),(x2,y2)` (possibly after the phrase). VQA and
  multiple choice: VLMEvalKit's prompts for Qwen2-VL (open-compass/VLMEvalKit
  `vlmeval/vlm/qwen2_vl/prompt.py`, `Qwen2VLPromptMixin._build_vqa_prompt` and
  `_build_mcq_prompt`; the Qwen repositories publish no VQA or multiple-choice wording).
* `qwen25vl`: Qwen2.5-VL changed the grounding convention (QwenLM/Qwen2.5-VL README,
  "Precise Object Grounding Across Formats": absolute position coordinates, JSON). The
  wording is `cookbooks/spatial_understanding.ipynb`'s "detect a specific object using
  descriptions" prompt (`Locate the top right brown cake, output its bbox coordinates using
  JSON format.`); the answer is JSON such as `[{"bbox_2d": [x1, y1, x2, y2], "label": ...}]`
  in absolute pixels of the image *as the model saw it*: the processor first resizes it to
  sides that are multiples of 28 within a pixel budget (`qwen_vl_utils.smart_resize`; the
  cookbook maps boxes back with the resized size). `model_image_size` gives that size for a
  sent image; a server started with other `min_pixels`/`max_pixels` sees another size. VQA
  and multiple choice as `qwen2vl` (VLMEvalKit uses the same prompt mixin for both).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_satbench.core.question import Question

MC_INSTRUCTION = "Answer with the option's letter from the given choices directly."
LETTERS = "ABCDEFGHIJKLMNOP"

QWEN_VQA = "{question}\nPlease try to answer the question with short words or phrases if possible."
QWEN_MC = (
    "Question: {question}\nOptions:\n{options}\nPlease select the correct answer from the options above."
)


@dataclass(frozen=True, slots=True)
class Resize:
    """How a server resizes an image before the model sees it (Qwen2.5-VL's processor)."""

    factor: int  # both sides become multiples of this
    min_pixels: int
    max_pixels: int


# qwen_vl_utils / Qwen2.5-VL's preprocessor_config.json defaults: 14-px patches merged 2x2,
# 4 to 16384 merged patches per image.
QWEN25VL_RESIZE = Resize(factor=28, min_pixels=4 * 28 * 28, max_pixels=16384 * 28 * 28)


@dataclass(frozen=True, slots=True)
class PromptStyle:
    name: str
    summary: str  # one line for --help and the docs
    vqa: str
    ref: str
    mc: str
    box_grid: str  # the grid grounding answers are expected on: "1000", "100" or "pixels"
    resize: Resize | None = None  # for "pixels": the resize the model's input goes through


STYLES: dict[str, PromptStyle] = {
    s.name: s
    for s in (
        PromptStyle(
            name="geocot",
            summary="Geo-CoT380k/RSThinker phrasing (the seed script): plain questions, "
            "'where is <expression>', boxes on 0-1000",
            vqa="{question}",
            ref="where is {expression_lc}",
            mc="{question}\n{choices}\n" + MC_INSTRUCTION,
            box_grid="1000",
        ),
        PromptStyle(
            name="geochat",
            summary="GeoChat's own evaluation wording: single word or phrase answers, "
            "'[refer] Give me the location of <p> ... </p>', boxes {<x1><y1><x2><y2>|<angle>} on 0-100",
            vqa="{question}\nAnswer the question using a single word or phrase.",
            ref="[refer] Give me the location of <p> {phrase} </p>",
            mc="{question}\n{choices}\n" + MC_INSTRUCTION,
            box_grid="100",
        ),
        PromptStyle(
            name="qwen2vl",
            summary="Qwen2-VL: short-answer VQA and option prompts as in VLMEvalKit, the expression "
            "between <|object_ref_start|> and <|object_ref_end|>, boxes (x1,y1),(x2,y2) on 0-1000",
            vqa=QWEN_VQA,
            ref="<|object_ref_start|>{phrase}<|object_ref_end|>",
            mc=QWEN_MC,
            box_grid="1000",
        ),
        PromptStyle(
            name="qwen25vl",
            summary="Qwen2.5-VL: as qwen2vl, grounding 'Locate <expression>, output its bbox "
            "coordinates using JSON format.', boxes bbox_2d in pixels of the resized input",
            vqa=QWEN_VQA,
            ref="Locate {phrase}, output its bbox coordinates using JSON format.",
            mc=QWEN_MC,
            box_grid="pixels",
            resize=QWEN25VL_RESIZE,
        ),
    )
}
DEFAULT_STYLE = "geocot"


def get_style(style: str) -> PromptStyle:
    try:
        return STYLES[style]
    except KeyError:
        raise ValueError(
            f"unknown prompt style {style!r}; known: {', '.join(sorted(STYLES))}"
        ) from None


def format_choices(texts: Sequence[str]) -> str:
    """`A. x; B. y; ...` -- the shape of LHRS-Bench's own choices string."""
    return "; ".join(f"{letter}. {t}" for letter, t in zip(LETTERS, texts)) + "."


def render(question: Question, style: str) -> str:
    """The text sent to the model with the image."""
    st = get_style(style)
    text = question.text  # as stored, like the seed; only expressions are stripped
    if question.kind == "vqa":
        return st.vqa.format(question=text)
    if question.kind == "ref":
        text = text.strip()
        lc = text[:1].lower() + text[1:]
        phrase = lc[:-1].rstrip() if lc.endswith(".") and not lc.endswith("..") else lc
        return st.ref.format(expression=text, expression_lc=lc, phrase=phrase)
    if question.kind == "mc":
        shown = question.get("choices_text")
        if shown is None:
            if not question.choices:
                raise ValueError(
                    f"{question.benchmark}[{question.key}]: a choice question without choices"
                )
            shown = format_choices(question.choices)
        options = (
            "\n".join(f"{letter}. {t}" for letter, t in zip(LETTERS, question.choices))
            if question.choices else shown
        )
        return st.mc.format(question=text, choices=shown, options=options)
    raise ValueError(
        f"{question.benchmark}[{question.key}]: unknown question kind {question.kind!r}"
    )


def default_box_grid(style: str) -> str:
    return get_style(style).box_grid


def model_image_size(style: str, size: tuple[int, int]) -> tuple[int, int]:
    """(W, H) of the image the model sees when sent one of `size`: what `pixels` boxes are in.

    The size itself unless the style's model resizes its input: Qwen2.5-VL rounds each side
    to the nearest multiple of 28, then, if the area is outside its pixel budget, scales both
    sides by one factor to fit, flooring (too large) or ceiling (too small) to multiples of
    28 (qwen_vl_utils `smart_resize`). A 512x512 VRSBench image is seen at 504x504.
    """
    rs = get_style(style).resize
    w, h = size
    if rs is None or w <= 0 or h <= 0:
        return size
    f = rs.factor

    def nearest(v: float) -> int:
        return max(f, round(v / f) * f)

    out_w, out_h = nearest(w), nearest(h)
    if out_w * out_h > rs.max_pixels:
        k = math.sqrt(rs.max_pixels / (w * h))
        out_w, out_h = max(f, math.floor(w * k / f) * f), max(f, math.floor(h * k / f) * f)
    elif out_w * out_h < rs.min_pixels:
        k = math.sqrt(rs.min_pixels / (w * h))
        out_w, out_h = math.ceil(w * k / f) * f, math.ceil(h * k / f) * f
    return out_w, out_h


def describe(style: str) -> str:
    """Markdown for the docs: the summary and the three templates."""
    st = get_style(style)
    def show(template: str) -> str:  # as a reader sees it: one line, no format escapes
        return template.replace("{{", "{").replace("}}", "}").replace("\n", "\\n")

    return (
        f"`{st.name}`: {st.summary}. VQA: `{show(st.vqa)}`; grounding: `{show(st.ref)}`; "
        f"multiple choice: `{show(st.mc)}`"
    )

