"""Prompt styles: exact wording per style and kind, errors, docs coverage."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_satbench.core import prompts
from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.datasets.registry import all_benchmarks

IMG = ImageRef(id="1", path="/nonexistent/1.png")
VQA = Question("vrsbench", "1", IMG, "Is there a tennis court?", "yes", ("object existence",))
REF = Question("vrsbench_ref", "2", IMG, "  The ship positioned towards the lower right.  ",
               "{<70><80><90><95>}", ("unique",), kind="ref")
MC_STR = Question("lhrs", "3", IMG, "What is the main land-use type?", "C", ("identity",),
                  kind="mc", choices=("Factory", "Park", "Farm", "Forest"),
                  extra=(("choices_text", "A. Factory; B. Park; C. Farm; D. Forest."),))
MC_LIST = Question("lhrs", "4", IMG, "Which?", "A", ("identity",), kind="mc",
                   choices=("yes", "no"))


def test_geocot_matches_the_seed_script() -> None:
    # eval_e2e.py: VQA = x["question"]; ref = "where is " + lower-cased first letter;
    # LHRS = f"{question}\n{choices}{MC_SUFFIX}"
    suffix = "\nAnswer with the option's letter from the given choices directly."
    assert prompts.render(VQA, "geocot") == "Is there a tennis court?"
    assert prompts.render(REF, "geocot") == "where is the ship positioned towards the lower right."
    assert prompts.render(MC_STR, "geocot") == (
        "What is the main land-use type?\nA. Factory; B. Park; C. Farm; D. Forest." + suffix
    )


def test_geochat_wording() -> None:
    assert prompts.render(VQA, "geochat") == (
        "Is there a tennis court?\nAnswer the question using a single word or phrase."
    )
    assert prompts.render(REF, "geochat") == (
        "The ship positioned towards the lower right.\nProvide the bounding box of the "
        "described object as {<x1><y1><x2><y2>}, where coordinates are integers from 0 to 100."
    )


def test_mc_without_original_string_reconstructs_it() -> None:
    assert prompts.render(MC_LIST, "geocot").startswith("Which?\nA. yes; B. no.\n")


def test_mc_without_choices_is_an_error() -> None:
    q = Question("lhrs", "5", IMG, "Which?", "A", (), kind="mc")
    with pytest.raises(ValueError, match=r"lhrs\[5\]: a choice question without choices"):
        prompts.render(q, "geocot")


def test_unknown_style_lists_the_known_ones() -> None:
    with pytest.raises(ValueError) as err:
        prompts.render(VQA, "llava")
    assert str(err.value) == "unknown prompt style 'llava'; known: geochat, geocot"
    with pytest.raises(ValueError):
        prompts.default_box_grid("llava")


def test_box_grid_per_style() -> None:
    assert prompts.default_box_grid("geocot") == "1000"
    assert prompts.default_box_grid("geochat") == "100"
    assert prompts.DEFAULT_STYLE == "geocot"


def test_describe_shows_the_templates_as_sent() -> None:
    text = prompts.describe("geochat")
    assert "{<x1><y1><x2><y2>}" in text and "{{" not in text and "\n" not in text


@pytest.mark.parametrize("style", sorted(prompts.STYLES))
def test_every_kind_renders_in_every_style(style: str) -> None:
    for q in (VQA, REF, MC_STR, MC_LIST):
        out = prompts.render(q, style)
        assert q.text.strip()[1:] in out  # the question itself is never lost


def test_docs_cover_every_benchmark_and_style() -> None:
    doc = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for name in all_benchmarks():
        assert f"`{name}`" in doc, name
    for style in prompts.STYLES:
        assert f"`{style}`" in doc, style
