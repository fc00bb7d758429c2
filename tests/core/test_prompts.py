"""Prompt styles: exact wording per style and kind, errors, docs coverage."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_satbench.core import prompts
from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.core.scoring import BOX_GRIDS
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
    # docs/Evaluation.md (VQA suffix); geochat/eval/batch_geochat_grounding.py (referring)
    assert prompts.render(VQA, "geochat") == (
        "Is there a tennis court?\nAnswer the question using a single word or phrase."
    )
    assert prompts.render(REF, "geochat") == (
        "[refer] Give me the location of <p> the ship positioned towards the lower right </p>"
    )
    assert prompts.render(MC_STR, "geochat") == prompts.render(MC_STR, "geocot")


def test_qwen2vl_wording() -> None:
    # VLMEvalKit Qwen2VLPromptMixin (VQA, MCQ); Qwen2-VL report's grounding data format
    assert prompts.render(VQA, "qwen2vl") == (
        "Is there a tennis court?\nPlease try to answer the question with short words or "
        "phrases if possible."
    )
    assert prompts.render(REF, "qwen2vl") == (
        "<|object_ref_start|>the ship positioned towards the lower right<|object_ref_end|>"
    )
    assert prompts.render(MC_STR, "qwen2vl") == (
        "Question: What is the main land-use type?\nOptions:\nA. Factory\nB. Park\nC. Farm\n"
        "D. Forest\nPlease select the correct answer from the options above."
    )


def test_qwen25vl_wording() -> None:
    # Qwen2.5-VL cookbooks/spatial_understanding.ipynb: "Locate the top right brown cake, ..."
    assert prompts.render(REF, "qwen25vl") == (
        "Locate the ship positioned towards the lower right, output its bbox coordinates "
        "using JSON format."
    )
    assert prompts.render(VQA, "qwen25vl") == prompts.render(VQA, "qwen2vl")
    assert prompts.render(MC_STR, "qwen25vl") == prompts.render(MC_STR, "qwen2vl")


def test_phrase_keeps_an_expression_without_a_full_stop_and_an_ellipsis() -> None:
    bare = Question("vrsbench_ref", "6", IMG, "Small white car", "{<1><2><3><4>}", ("unique",), kind="ref")
    assert prompts.render(bare, "qwen25vl").startswith("Locate small white car, output")
    dots = Question("vrsbench_ref", "7", IMG, "the car...", "{<1><2><3><4>}", ("unique",), kind="ref")
    assert "<p> the car... </p>" in prompts.render(dots, "geochat")


def test_mc_options_one_a_line_fall_back_to_the_dataset_string() -> None:
    q = Question("lhrs", "8", IMG, "Which?", "A", ("identity",), kind="mc",
                 extra=(("choices_text", "A. yes; B. no."),))
    assert prompts.render(q, "qwen2vl") == (
        "Question: Which?\nOptions:\nA. yes; B. no.\nPlease select the correct answer from the "
        "options above."
    )
    assert "\nA. yes\nB. no\n" in prompts.render(MC_LIST, "qwen2vl")


def test_mc_without_original_string_reconstructs_it() -> None:
    assert prompts.render(MC_LIST, "geocot").startswith("Which?\nA. yes; B. no.\n")


def test_mc_without_choices_is_an_error() -> None:
    q = Question("lhrs", "5", IMG, "Which?", "A", (), kind="mc")
    with pytest.raises(ValueError, match=r"lhrs\[5\]: a choice question without choices"):
        prompts.render(q, "geocot")


def test_unknown_style_lists_the_known_ones() -> None:
    with pytest.raises(ValueError) as err:
        prompts.render(VQA, "llava")
    assert str(err.value) == (
        "unknown prompt style 'llava'; known: geochat, geocot, qwen25vl, qwen2vl"
    )
    with pytest.raises(ValueError):
        prompts.default_box_grid("llava")


def test_box_grid_per_style() -> None:
    assert prompts.default_box_grid("geocot") == "1000"
    assert prompts.default_box_grid("geochat") == "100"
    assert prompts.default_box_grid("qwen2vl") == "1000"  # [0, 1000), normalised
    assert prompts.default_box_grid("qwen25vl") == "pixels"  # absolute, of the resized input
    assert prompts.DEFAULT_STYLE == "geocot"
    for style in prompts.STYLES:
        assert prompts.default_box_grid(style) in BOX_GRIDS


@pytest.mark.parametrize("size, seen", [
    ((512, 512), (504, 504)),  # VRSBench: 512 / 28 = 18.3 -> 18 * 28
    ((256, 256), (252, 252)),  # RSVQA-LR
    ((800, 600), (812, 588)),  # each side to the nearest multiple of 28
    ((10, 10), (56, 56)),  # below 4 * 28 * 28 pixels: scaled up
    ((20000, 10000), (5068, 2520)),  # above 16384 * 28 * 28 pixels: scaled down
])
def test_model_image_size_is_qwen25vl_resize(size: tuple[int, int], seen: tuple[int, int]) -> None:
    assert prompts.model_image_size("qwen25vl", size) == seen
    w, h = seen
    assert w % 28 == 0 and h % 28 == 0 and 4 * 28 * 28 <= w * h <= 16384 * 28 * 28


@pytest.mark.parametrize("style", ["geocot", "geochat", "qwen2vl"])
def test_model_image_size_is_the_sent_size_without_a_resize(style: str) -> None:
    assert prompts.model_image_size(style, (512, 384)) == (512, 384)


def test_describe_shows_the_templates_as_sent() -> None:
    for style in prompts.STYLES:
        text = prompts.describe(style)
        assert "{{" not in text and "\n" not in text and "\\n" in text, style
    assert "`[refer] Give me the location of <p> {phrase} </p>`" in prompts.describe("geochat")


@pytest.mark.parametrize("style", sorted(prompts.STYLES))
def test_every_kind_renders_in_every_style(style: str) -> None:
    for q in (VQA, REF, MC_STR, MC_LIST):
        out = prompts.render(q, style)
        assert q.text.strip()[1:].rstrip(".") in out  # the question itself is never lost


def test_docs_cover_every_benchmark_and_style() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "datasets.md").read_text()
    for name in all_benchmarks():
        assert f"`{name}`" in doc, name
    for style in prompts.STYLES:
        assert f"`{style}`" in doc, style
