"""Prompt styles: how a `Question` is worded for the model (`--prompt-style`).

A model is measured off-distribution when it is asked in a phrasing it was not trained on,
so the wording is a named, documented choice rather than strings buried in loaders. Each
style is three templates, one per question kind, plus the box grid its grounding answers
use. Fields: `{question}`, `{expression}` (the referring expression as stored),
`{expression_lc}` (the same, first letter lower-cased), `{choices}` (the options as one
string: the dataset's own string when it had one, else `A. x; B. y; ...`).

* `geocot` (default): the seed script's prompts, i.e. Geo-CoT380k / RSThinker training
  phrasing. VQA is the plain question (no "single word" suffix); grounding is
  `where is <expression>` with a lower-cased first letter (a bare capitalised noun phrase
  reads as a yes/no prompt to these models and they answer "Yes"), boxes on 0-1000;
  multiple choice keeps an explicit letter instruction (no training analogue).
* `geochat`: GeoChat / LLaVA-1.5 convention. VQA adds `Answer the question using a single
  word or phrase.` (GeoChat's docs/Evaluation.md); grounding asks for
  `{<x1><y1><x2><y2>}` integers on 0-100 (the VRSBench lmms-eval task's wording);
  multiple choice uses LLaVA-1.5's instruction, which GeoChat inherits from its
  training mix (LHRS-Bot's own "Answer from the given choices with A., B., ..." is a
  different model's convention).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_satbench.core.question import Question

MC_INSTRUCTION = "Answer with the option's letter from the given choices directly."
LETTERS = "ABCDEFGHIJKLMNOP"


@dataclass(frozen=True, slots=True)
class PromptStyle:
    name: str
    summary: str  # one line for --help and the docs
    vqa: str
    ref: str
    mc: str
    box_grid: str  # the grid grounding answers are expected on: "1000" or "100"


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
            summary="GeoChat/LLaVA-1.5 phrasing: single word or phrase answers, "
            "boxes as {<x1><y1><x2><y2>} on 0-100",
            vqa="{question}\nAnswer the question using a single word or phrase.",
            ref="{expression}\nProvide the bounding box of the described object as "
            "{{<x1><y1><x2><y2>}}, where coordinates are integers from 0 to 100.",
            mc="{question}\n{choices}\n" + MC_INSTRUCTION,
            box_grid="100",
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
        return st.ref.format(expression=text, expression_lc=lc)
    if question.kind == "mc":
        shown = question.get("choices_text")
        if shown is None:
            if not question.choices:
                raise ValueError(
                    f"{question.benchmark}[{question.key}]: a choice question without choices"
                )
            shown = format_choices(question.choices)
        return st.mc.format(question=text, choices=shown)
    raise ValueError(
        f"{question.benchmark}[{question.key}]: unknown question kind {question.kind!r}"
    )


def default_box_grid(style: str) -> str:
    return get_style(style).box_grid


def describe(style: str) -> str:
    """Markdown for the docs: the summary and the three templates."""
    st = get_style(style)
    def show(template: str) -> str:  # as a reader sees it: one line, no format escapes
        return template.replace("{{", "{").replace("}}", "}").replace("\n", "\\n")

    return (
        f"`{st.name}`: {st.summary}. VQA: `{show(st.vqa)}`; grounding: `{show(st.ref)}`; "
        f"multiple choice: `{show(st.mc)}`"
    )

