"""Scoring rules, checked against worked examples of each benchmark's answer formats and
official rules (RSVQA bins, VRSBench's official VQA rules and IoU convention, LHRS-Bench
letters) and the edge cases a wrong implementation would get wrong."""

from __future__ import annotations

import pytest

from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.core.scoring import (
    REORDERED,
    Score,
    ScoreOptions,
    final_answer,
    iou,
    normalize_vqa,
    parse_box,
    pick,
    ref_split,
    score,
    score_mc,
    score_ref,
    score_vqa,
    to_grid,
)

# each benchmark's own rule lives in its module and reaches the scorer as a declared view
from pytest_satbench.datasets.lhrs import LHRS_VIEWS, lhrs_official
from pytest_satbench.datasets.rsvqa import RSVQA_VIEWS, rsvqa_bin
from pytest_satbench.datasets.vrsbench import VQA_VIEWS, vrsbench_official

CHOICES = ("Factory", "Park", "Farm", "Forest")  # LHRS-Bench style, answer C = Farm
OPTS = ScoreOptions(views=RSVQA_VIEWS | VQA_VIEWS)  # both optional views on


def q(benchmark: str = "rsvqa_lr", answer: str = "yes", types: tuple[str, ...] = ("presence",),
      kind: str = "vqa", choices: tuple[str, ...] | None = None,
      extra: tuple[tuple[str, str], ...] = (), key: str = "k1") -> Question:
    return Question(benchmark=benchmark, key=key, image=ImageRef(id="img0", path="/x/0.tif"),
                    text="?", answer=answer, types=types, kind=kind,  # type: ignore[arg-type]  # kind: one of Question's kinds
                    choices=choices, extra=extra)


# --------------------------------------------------------------------------- final_answer

@pytest.mark.parametrize("raw, want", [
    ("<think>It could be [1,2,3,4] or no.</think><answer>Yes</answer>", "Yes"),
    ("<reasoning>maybe A</reasoning>\n<answer> C </answer>", "C"),
    ("<answer>A</answer> second thoughts <answer>B</answer>", "B"),  # the LAST answer
    ("<think>x</think><answer>[250, 400, 330, 600]", "[250, 400, 330, 600]"),  # no </answer>
    ("reasoning prefilled by the template</think>\nurban", "urban"),  # stray closing tag
    ("<think>counting the roads... 3, 4, 5", ""),  # cut off mid-reasoning: no answer
    ("<think>\nlong\n</think>\n\nrural\n", "rural"),
    ("  Yes.  ", "Yes."),  # no tags: the stripped text
    ("<THINK>x</THINK><Answer>no</Answer>", "no"),  # tags are case-insensitive
    ("<answer><|begin_of_box|>C<|end_of_box|></answer>", "C"),  # GLM-4.1V box markers
    ("<answer>\\boxed{B}</answer>", "B"),
    ("", ""),
])
def test_final_answer(raw: str, want: str) -> None:
    assert final_answer(raw) == want


# --------------------------------------------------------------------------- normalize_vqa

@pytest.mark.parametrize("raw, want", [
    ("Yes.", "yes"),
    ("zero", "0"), ("One", "1"), ("seven", "7"), ("ten", "10"), ("twelve", "12"),
    ("nineteen", "19"), ("twenty", "20"), ("Twenty-one", "21"), ("forty four", "44"),
    ("none", "0"),  # EvalAI processor
    ("no", "no"),  # yes/no answers are not numbers
    ("There are three ships.", "there are 3 ships"),
    ("2,392", "2392"),  # thousands separator
    ("2.5", "2.5"),  # decimal point kept
    ("2173 m2", "2173m2"), ("2173 m²", "2173m2"), ("2173 square meters", "2173m2"),
    ("2,173 sq m", "2173m2"),
    ("Ground-track-field", "ground track field"),
    ("  a   ship ", "a ship"),  # articles are kept
    ("rural.", "rural"),
])
def test_normalize_vqa(raw: str, want: str) -> None:
    assert normalize_vqa(raw) == want


# --------------------------------------------------------------------------- score_vqa

def test_vqa_exact_match_after_normalisation_and_think_stripping() -> None:
    s = score_vqa(q(answer="yes"), "<think>is it no?</think><answer>Yes.</answer>", OPTS)
    assert (s.correct, s.parsed, s.extracted) == (True, True, "yes")
    s = score_vqa(q(answer="no"), "<think>is it no?</think><answer>Yes.</answer>", OPTS)
    assert (s.correct, s.parsed) == (False, True)
    assert score_vqa(q(answer="Urban", types=("rural_urban",)), "urban", OPTS).correct
    # a sentence is not an exact match (seed behaviour)
    assert not score_vqa(q(answer="yes"), "Yes, there is a farm.", OPTS).correct


def test_vqa_number_words_count_as_digits() -> None:
    count = q(answer="44", types=("count",))
    assert score_vqa(count, "forty-four", OPTS).correct
    assert not score_vqa(count, "forty", OPTS).correct
    assert score_vqa(q(answer="0", types=("count",)), "None", OPTS).correct


def test_vqa_empty_answer_is_unparseable() -> None:
    for raw in ("", "   ", "<think>never finished"):
        s = score_vqa(q(answer="yes"), raw, OPTS)
        assert (s.correct, s.parsed) == (False, False)


@pytest.mark.parametrize("value, label", [
    ("0", "0"), ("1", "1-10"), ("10", "1-10"), ("11", "11-100"), ("100", "11-100"),
    ("101", "101-1000"), ("1000", "101-1000"), ("1001", ">1000"), ("2392", ">1000"),
    ("ten", "1-10"), ("There are 4", None), ("", None),
])
def test_rsvqa_count_bins(value: str, label: str | None) -> None:
    assert rsvqa_bin(value, "count") == label


@pytest.mark.parametrize("value, label", [
    ("0m2", "0"), ("10m2", "1-10"), ("11 m2", "11-100"), ("2173m2", ">1000"),
    ("1000 square meters", "101-1000"), ("2173", ">1000"),  # unit optional
])
def test_rsvqa_area_bins(value: str, label: str) -> None:
    assert rsvqa_bin(value, "area") == label


def test_rsvqa_bin_ignores_other_types() -> None:
    assert rsvqa_bin("4", "presence") is None


def test_vqa_binned_view_for_counts_and_areas() -> None:
    count = q(answer="403", types=("count",))
    s = score_vqa(count, "350", OPTS)
    assert not s.correct and s.view("binned") == 1.0  # same class 101-1000
    assert score_vqa(count, "1001", OPTS).view("binned") == 0.0
    assert score_vqa(count, "403", OPTS).view("binned") == 1.0
    assert score_vqa(count, "many", OPTS).view("binned") == 0.0
    # 0 is its own class: "1" is in the 1-10 class, not the 0 class
    assert score_vqa(q(answer="0", types=("count",)), "1", OPTS).view("binned") == 0.0

    area = q(benchmark="rsvqa_hr", answer="2173m2", types=("area",))
    assert score_vqa(area, "2173 m2", OPTS).correct
    s = score_vqa(area, "1500m2", OPTS)
    assert not s.correct and s.view("binned") == 1.0
    s = score_vqa(area, "2173", OPTS)  # no unit: not an exact match, but the same class
    assert not s.correct and s.view("binned") == 1.0


def test_vqa_views_only_where_they_apply() -> None:
    rsvqa, vrsbench = ScoreOptions(views=RSVQA_VIEWS), ScoreOptions(views=VQA_VIEWS)
    assert score_vqa(q(answer="yes"), "yes", rsvqa).views == ()
    vrs = q(benchmark="vrsbench", answer="2", types=("object quantity",))
    assert [k for k, _ in score_vqa(vrs, "2", vrsbench).views] == ["official"]
    # a view is computed where its benchmark declares it, not by the benchmark's name
    assert score_vqa(vrs, "2", ScoreOptions()).views == ()


@pytest.mark.parametrize("gt, pred, headline, official", [
    ("ship", "A ship.", False, 1.0),  # rule 1: gt substring of pred
    ("Yellow", "yellow", True, 1.0),
    ("yes", "Yes, there is one.", False, 1.0),
    ("2", "12", False, 1.0),  # official quirk kept in the official view: "2" in "12"
    ("2", "two", True, 0.0),  # number words are ours, not official
    ("3", "2", False, 0.0),  # rule 2: 0..99 exact
    ("airport", "runway", False, 0.0),  # rule 3 (GPT judge) is not run: lower bound
    ("tennis court", "tennis-court", True, 0.0),
])
def test_vrsbench_official_view(gt: str, pred: str, headline: bool, official: float) -> None:
    s = score_vqa(q(benchmark="vrsbench_vqa", answer=gt, types=("object category",)), pred, OPTS)
    assert s.correct is headline
    assert s.view("official") == official


def test_vrsbench_official_rules_directly() -> None:
    assert vrsbench_official("no", "no")
    assert vrsbench_official("no", "nope, it is not")  # rule 1 comes first: official quirk
    assert not vrsbench_official("yes", "y")  # rule 2: yes/no exact
    assert not vrsbench_official("12", "1")
    assert not vrsbench_official("", "anything")


# --------------------------------------------------------------------------- pick

@pytest.mark.parametrize("raw", [
    "C", "c", "C.", "(C)", "C)", "C:", "C. Farm", "(C) Farm", "C. Farm\nBecause of the fields.",
    "Answer: C", "answer: c", "The answer is C", "The answer is C.", "The correct answer is (C).",
    "I choose option C", "Option: C", "Answers: C",
    "Farm", "farm", "Farm.", "a farm", "The answer is Farm", "The answer is a farm",
    "A farm", "<answer>C</answer>", "<think>A or B?</think><answer>C. Farm</answer>",
    "**C**", "\\boxed{C}", "Answer: C Farm", "It is clearly farmland, so (C).",
    "Option A is wrong; the answer is C.", "Option B is wrong, the answer is C.",
    "C\n\nThe fields indicate farmland.", "I choose option C: Farm", "Choice C",
    "The answer is option C", "The answer is: C", "Answer: Farm", "Answer：C",
    # issue 9: replies that plainly lead with a letter
    "C, because of the fields.", "C because of the fields.", "C Farm", "C - Farm", "C (Farm)",
    "[C]", "'C'", '"C"', "C。", "答案：C", "I think it's C.", "It is C. Farm.", "C is correct.",
    "I would choose C.",
    "The answer is A farm.",  # "A" followed by an option's text is the article
])
def test_pick_reads_c(raw: str) -> None:
    assert pick(raw, CHOICES) == "C"


@pytest.mark.parametrize("raw, want", [
    ("A", "A"), ("a", "A"), ("a.", "A"), ("(a)", "A"), ("A. Factory", "A"),
    ("The answer is A.", "A"), ("D", "D"), ("The answer is B, the park.", "B"),
    ("The answer is B because of the trees.", "B"), ("Answer: A Factory", "A"),
    # "because" cannot follow the article or the pronoun: the letter A (was unparseable)
    ("The answer is A because of the fields.", "A"), ("A because of the chimneys.", "A"),
    ("A is correct.", "A"), ("A (Factory)", "A"), ("I think it's A.", "A"),
])
def test_pick_other_letters(raw: str, want: str) -> None:
    # The official LHRS-Bot scorer deletes "a" as an article: option A must still be readable.
    assert pick(raw, CHOICES) == want


@pytest.mark.parametrize("raw", [
    "",
    "E",  # not an option with four choices
    "The answer is E.",
    "A. Farm",  # letter A, but the text of option C: two options named
    "The answer is A. No wait, the answer is C.",
    "A or C",
    "(A) and (C)",
    "farmland",  # not an option text
    "A farm is visible in the image.",  # a sentence, not a letter and not an option text
    "I am not sure.",
    "Park? No. Farm",  # not an option text on its own
    "A (Farm)",  # letter A, bracketed text of option C
    "Answer: C Forest",  # letter C, text of D
    "<think>The answer is C</think>",  # the letter only appears in the reasoning
    "<think>C</think><answer></answer>",
    # a letter followed by another option's text or a second letter names two options
    "C, Forest", "C Forest", "C (Forest)", "C - Forest", "C, D", "C or D", "C/D",
    "C or maybe D",
])
def test_pick_unparseable(raw: str) -> None:
    assert pick(raw, CHOICES) is None


def test_pick_letter_range_follows_number_of_choices() -> None:
    six = ("Factory", "Park", "Farm", "Forest", "Lake", "Road")
    assert pick("F", six) == "F"
    assert pick("Road", six) == "F"
    assert pick("F", CHOICES) is None
    assert pick("B", ("Yes", "No")) == "B"
    assert pick("C", ("Yes", "No")) is None


def test_pick_tolerates_choices_with_letter_prefixes() -> None:
    prefixed = ("A. Factory", "B. Park", "C. Farm", "D. Forest")
    assert pick("Farm", prefixed) == "C"
    assert pick("C", prefixed) == "C"


def test_pick_duplicate_option_texts_are_ambiguous() -> None:
    assert pick("Farm", ("Farm", "Park", "Farm")) is None
    assert pick("C", ("Farm", "Park", "Farm")) == "C"


def test_pick_rejects_bad_choices() -> None:
    with pytest.raises(ValueError, match="choices"):
        pick("A", ())


# --------------------------------------------------------------------------- score_mc

def mc(answer: str = "C", choices: tuple[str, ...] | None = CHOICES, types=("1",)) -> Question:
    return q(benchmark="lhrs", answer=answer, types=types, kind="mc", choices=choices)


def test_score_mc_verdicts() -> None:
    s = score_mc(mc(), "<answer>C. Farm</answer>", OPTS)
    assert (s.correct, s.parsed, s.extracted) == (True, True, "C")
    s = score_mc(mc(), "B", OPTS)
    assert (s.correct, s.parsed, s.extracted) == (False, True, "B")
    s = score_mc(mc(), "I cannot tell from this image.", OPTS)
    assert (s.correct, s.parsed) == (False, False)
    assert s.extracted == "I cannot tell from this image."


@pytest.mark.parametrize("gt", ["C", "C.", "c", "(C)", "Farm"])
def test_score_mc_accepts_ground_truth_forms(gt: str) -> None:
    assert score_mc(mc(answer=gt), "C", OPTS).correct
    assert not score_mc(mc(answer=gt), "A", OPTS).correct


def test_score_mc_bad_ground_truth_names_the_question() -> None:
    with pytest.raises(ValueError, match=r"lhrs question k1: ground truth 'E'"):
        score_mc(mc(answer="E"), "C", OPTS)
    with pytest.raises(ValueError, match="without choices"):
        score_mc(mc(choices=None), "C", OPTS)


@pytest.mark.parametrize("raw, gt, want", [
    ("C", "C", 1.0), ("c", "C", 1.0), ("C. Farm", "C", 1.0),
    ("a", "A", 1.0), ("A", "A", 1.0),  # SQuAD drops "a" on both sides: option A is readable
    ("(C)", "C", 0.0), ("(C)", "A", 1.0),  # "(" normalises to "", as "A" does
    ("**C**", "A", 1.0), (" C", "C", 0.0), ("<think>C</think>C", "A", 1.0),  # the raw reply
    ("The answer is C", "C", 0.0), ("Farm", "C", 0.0),
    ("B", "C", 0.0), ("", "A", 0.0),  # empty: the official script has no character to read
])
def test_lhrs_official_first_character_rule(raw: str, gt: str, want: float) -> None:
    s = score_mc(mc(answer=gt), raw, ScoreOptions(views=LHRS_VIEWS))
    assert s.view("lhrs_official") == want
    assert lhrs_official(raw, gt) is bool(want)


def test_lhrs_official_view_only_where_declared() -> None:
    assert score_mc(mc(), "C", OPTS).views == ()
    s = score_mc(mc(), "Farm", ScoreOptions(views=LHRS_VIEWS))
    assert (s.correct, s.view("lhrs_official")) == (True, 0.0)  # the headline reads the text
    s = score_mc(mc(), "I cannot tell.", ScoreOptions(views=LHRS_VIEWS))
    assert (s.parsed, s.views) == (False, (("lhrs_official", 0.0),))


# --------------------------------------------------------------------------- boxes

@pytest.mark.parametrize("raw, want", [
    ("<think>first [1,2,3,4] then</think><answer>[250, 400, 330, 600]</answer>",
     (250, 400, 330, 600)),
    ("<answer>[[244, 290, 710, 638], [242, 646, 718, 980]]</answer>", (244, 290, 710, 638)),
    ("<answer>[250,400,330,600]", (250, 400, 330, 600)),  # missing </answer>
    ("[25.5, 40.25, 33, 60.0]", (25.5, 40.25, 33, 60)),
    ("{<25><40><33><60>}", (25, 40, 33, 60)),
    ("The ship is at { <25> <40> <33> <60> }.", (25, 40, 33, 60)),
    ("<25><40><33><60>", (25, 40, 33, 60)),  # braces optional
    ("{<25><40><33><60>} or [1, 2, 3, 4]", (25, 40, 33, 60)),  # the first box in the text
    # corners as written: reversed corners are not reordered (score_ref gives them IoU 0)
    ("[330, 600, 250, 400]", (330, 600, 250, 400)),
    ("[330, 400, 250, 600]", (330, 400, 250, 600)),
    ("{<25><40><33><60>|<45>}", (25, 40, 33, 60)),  # GeoChat's rotated box: angle ignored
    ("<|box_start|>(250,400),(330,600)<|box_end|>", (250, 400, 330, 600)),  # Qwen2-VL
    (("<|object_ref_start|>the ship<|object_ref_end|><|box_start|>(250,400),(330,600)"
      "<|box_end|>"), (250, 400, 330, 600)),
    ("the ship(250, 400), (330, 600)", (250, 400, 330, 600)),  # special tokens skipped
    ("[0.25, 0.4, 0.33, 0.6]", (0.25, 0.4, 0.33, 0.6)),  # fractions: converted by score_ref
    ("x1=250, y1=400, x2=330, y2=600", (250, 400, 330, 600)),
    ('{"y1": 400, "x1": 250, "y2": 600, "x2": 330}', (250, 400, 330, 600)),  # any order
    ("xmin: 250, ymin: 400, xmax: 330, ymax: 600", (250, 400, 330, 600)),
    ("left=250 top=400 right=330 bottom=600", (250, 400, 330, 600)),
])
def test_parse_box(raw: str, want: tuple[float, ...]) -> None:
    assert parse_box(raw) == tuple(float(v) for v in want)


@pytest.mark.parametrize("raw", [
    "Yes", "", "25, 40, 33, 60", "[25, 40, 33]", "<think>[1, 2, 3, 4]</think>no box",
    "(25, 40, 33, 60)", "x1=250, y1=400, x2=330",  # three named corners are not a box
])
def test_parse_box_unparseable(raw: str) -> None:
    assert parse_box(raw) is None


def test_to_grid() -> None:
    assert to_grid((250, 400, 330, 600), "1000", "100") == pytest.approx((25, 40, 33, 60))
    assert to_grid((25, 40, 33, 60), "100", "1000") == pytest.approx((250, 400, 330, 600))
    assert to_grid((25, 40, 33, 60), "100", "100") == (25, 40, 33, 60)
    # non-square image: x by width, y by height
    assert to_grid((200, 150, 400, 300), "pixels", "100", (800, 600)) == \
        pytest.approx((25, 25, 50, 50))
    assert to_grid((25, 25, 50, 50), "100", "pixels", (800, 600)) == \
        pytest.approx((200, 150, 400, 300))
    with pytest.raises(ValueError, match="pixels needs"):
        to_grid((1, 2, 3, 4), "pixels", "100")
    with pytest.raises(ValueError, match="--box-grid '10'"):
        to_grid((1, 2, 3, 4), "10", "100")


def test_iou_worked_examples_from_the_notes() -> None:
    gt = (25, 40, 33, 60)
    assert round(iou(gt, (26, 41, 34, 61), "continuous"), 3) == 0.711
    assert round(iou(gt, (26, 41, 34, 61), "inclusive"), 3) == 0.734
    assert round(iou(gt, (27, 42, 35, 62), "continuous"), 3) == 0.509
    assert round(iou(gt, (27, 42, 35, 62)), 3) == 0.543  # inclusive is the default
    assert iou(gt, gt) == 1.0 and iou(gt, gt, "continuous") == 1.0


def test_iou_zero_width_ground_truth_only_hit_inclusive() -> None:
    gt = (92, 0, 96, 0)
    assert iou(gt, gt, "inclusive") == 1.0
    assert iou(gt, gt, "continuous") == 0.0  # empty union: 0, not a division error
    assert iou(gt, (92, 0, 96, 1), "inclusive") == pytest.approx(5 / 10)


def test_iou_edges() -> None:
    a, b = (0, 0, 10, 10), (10, 0, 20, 10)  # touching along x = 10
    assert iou(a, b, "continuous") == 0.0
    assert iou(a, b, "inclusive") == pytest.approx(11 / (121 + 121 - 11))
    assert iou((0, 0, 10, 10), (50, 50, 60, 60)) == 0.0
    assert iou(a, (2, 3, 7, 9)) == pytest.approx(iou((2, 3, 7, 9), a))  # symmetric
    with pytest.raises(ValueError, match="iou mode"):
        iou(a, b, "giou")


# --------------------------------------------------------------------------- score_ref

def ref(gt: str = "{<25><40><33><60>}", extra=(("unique", "true"),)) -> Question:
    return q(benchmark="vrsbench_ref", answer=gt, types=("vehicle",), kind="ref", extra=extra)


def test_score_ref_geocot_1000_grid() -> None:
    raw = "<think>first [1,2,3,4]</think><answer>[250, 400, 330, 600]</answer>"
    s = score_ref(ref(), raw, ScoreOptions(box_grid="1000"))
    assert (s.correct, s.parsed, s.extracted) == (True, True, "25,40,33,60")
    assert s.views == (("iou", 1.0), ("acc@0.5", 1.0), ("acc@0.7", 1.0))
    # the same answer read on the wrong grid is a miss: grids must not be mixed
    s = score_ref(ref(), raw, ScoreOptions(box_grid="100"))
    assert s.parsed and not s.correct and s.view("iou") < 0.05


def test_score_ref_thresholds_and_modes() -> None:
    inc, cont = ScoreOptions(box_grid="100"), ScoreOptions(box_grid="100", iou="continuous")
    s = score_ref(ref(), "{<26><41><34><61>}", inc)
    assert round(s.view("iou"), 3) == 0.734 and s.view("acc@0.7") == 1.0 and s.correct
    s = score_ref(ref(), "{<26><41><34><61>}", cont)
    assert round(s.view("iou"), 3) == 0.711 and s.view("acc@0.7") == 1.0
    s = score_ref(ref(), "{<27><42><35><62>}", inc)
    assert round(s.view("iou"), 3) == 0.543
    assert (s.correct, s.view("acc@0.5"), s.view("acc@0.7")) == (True, 1.0, 0.0)
    s = score_ref(ref(), "{<27><42><35><62>}", cont)
    assert round(s.view("iou"), 3) == 0.509 and s.correct
    # zero-width ground truth: a hit only under the inclusive convention
    zero = ref("{<92><0><96><0>}")
    assert score_ref(zero, "{<92><0><96><0>}", inc).correct
    assert not score_ref(zero, "{<92><0><96><0>}", cont).correct


def test_score_ref_pixel_grid_uses_the_size_the_model_saw() -> None:
    # 512x512 image: the GT box 25,40,33,60 is 128,204.8,168.96,307.2 in pixels
    opts = ScoreOptions(box_grid="pixels", image_size=(512, 512))
    s = score_ref(ref(), "[128, 204.8, 168.96, 307.2]", opts)
    assert s.correct and s.view("iou") == pytest.approx(1.0)
    with pytest.raises(ValueError, match="pixels needs"):
        score_ref(ref(), "[128, 204.8, 168.96, 307.2]", ScoreOptions(box_grid="pixels"))


def test_score_ref_reversed_corners_are_a_miss_as_officially() -> None:
    # lx709/VRSBench computeIoU: a box reversed by a unit has no positive intersection width
    for raw in ("{<33><60><25><40>}", "{<33><40><25><60>}", "{<25><60><33><40>}"):
        s = score_ref(ref(), raw, ScoreOptions(box_grid="100"))
        assert (s.parsed, s.correct, s.view("iou")) == (True, False, 0.0)
        assert s.view("iou_reordered") is None  # the lenient view only where declared
    lenient = ScoreOptions(box_grid="100", views=REORDERED)
    s = score_ref(ref(), "{<33><60><25><40>}", lenient)
    assert (s.correct, s.view("iou"), s.view("iou_reordered"), s.view("acc@0.5_reordered")) == \
        (False, 0.0, 1.0, 1.0)
    s = score_ref(ref(), "Yes", lenient)
    assert (s.view("iou_reordered"), s.view("acc@0.5_reordered")) == (0.0, 0.0)


def test_score_ref_fractions_are_read_as_fractions_of_the_image() -> None:
    for grid in ("1000", "100"):
        s = score_ref(ref(), "[0.25, 0.40, 0.33, 0.60]", ScoreOptions(box_grid=grid))
        assert (s.correct, s.extracted) == (True, "25,40,33,60")
    s = score_ref(ref(), "[0.25, 0.40, 0.33, 0.60]", ScoreOptions(box_grid="pixels"))
    assert s.correct  # no image size needed: fractions are of the image
    # integers in [0, 1] are read on the grid: a box in the top-left corner
    s = score_ref(ref(), "[0, 0, 1, 1]", ScoreOptions(box_grid="100"))
    assert s.parsed and s.extracted == "0,0,1,1" and not s.correct


def test_score_ref_qwen2vl_and_named_corners_on_the_1000_grid() -> None:
    opts = ScoreOptions(box_grid="1000")
    for raw in ("<|box_start|>(250,400),(330,600)<|box_end|>", "(250,400),(330,600)",
                "x1=250, y1=400, x2=330, y2=600", '{"x1": 250, "y1": 400, "x2": 330, "y2": 600}'):
        s = score_ref(ref(), raw, opts)
        assert (s.correct, s.extracted, s.view("iou")) == (True, "25,40,33,60", 1.0), raw


def test_score_ref_unparseable_is_a_counted_miss() -> None:
    s = score_ref(ref(), "Yes", OPTS)
    assert (s.correct, s.parsed, s.extracted) == (False, False, "Yes")
    assert s.views == (("iou", 0.0), ("acc@0.5", 0.0), ("acc@0.7", 0.0))


def test_score_ref_bad_ground_truth_names_the_question() -> None:
    with pytest.raises(ValueError, match=r"vrsbench_ref question k1: ground truth 'car'"):
        score_ref(ref("car"), "[1, 2, 3, 4]", OPTS)


def test_score_options_reject_unknown_values() -> None:
    with pytest.raises(ValueError, match="--box-grid '512'"):
        ScoreOptions(box_grid="512")
    with pytest.raises(ValueError, match="--iou 'giou'"):
        ScoreOptions(iou="giou")


@pytest.mark.parametrize("extra, want", [
    ((("unique", "true"),), "unique"), ((("unique", "False"),), "non-unique"),
    ((("is_unique", "1"),), "unique"), ((("is_unique", "0"), ("unique", "1")), "non-unique"),
    ((), None), ((("unique", "maybe"),), None),
])
def test_ref_split(extra: tuple[tuple[str, str], ...], want: str | None) -> None:
    assert ref_split(ref(extra=extra)) == want


# --------------------------------------------------------------------------- dispatch

def test_score_dispatches_on_kind() -> None:
    assert score(q(answer="yes"), "Yes").correct
    assert score(mc(), "(C)").extracted == "C"
    assert score(ref(), "[250, 400, 330, 600]").correct  # default grid 1000
    with pytest.raises(ValueError, match="unknown kind 'caption'"):
        score(q(kind="caption"), "x")


def test_score_is_immutable() -> None:
    s = Score(correct=True, parsed=True, extracted="C")
    with pytest.raises(AttributeError):
        s.correct = False  # type: ignore[misc]  # the frozen dataclass' refusal is what is tested
