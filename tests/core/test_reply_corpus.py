"""The reply corpora in tests/data/: replies in the formats real models produce, each with
the verdict the scorer must give and the rule (official or ours) that decides it.

* `replies_mc.jsonl` (LHRS-Bench): `reply`, the question's `choices` and `answer` letter,
  the letter `pick` must read (null: unparseable), and `lhrs_official`, LHRS-Bot's own
  first-character verdict (NJU-LHRS/LHRS-Bot main_bench_gen.py).
* `replies_ref.jsonl` (VRSBench referring): `reply`, the ground truth `answer`, the
  `box_grid` (and `image_size` for pixels), the `box` the scorer must read on the 0-100
  grid (null: unparseable), its `iou` by the official computeIoU (lx709/VRSBench
  eval_fianl/eval_utils.py; 0 for reversed corners) and `acc@0.5`.

Every line has a `why`; the rules are in pytest_satbench/core/scoring.py, §3 and §4.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.core.scoring import ScoreOptions, pick, score_mc, score_ref

DATA = Path(__file__).resolve().parent.parent / "data"


def _lines(name: str) -> list[dict[str, Any]]:
    with open(DATA / name, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


MC = _lines("replies_mc.jsonl")
REF = _lines("replies_ref.jsonl")


def _question(kind: str, answer: str, choices: list[str] | None = None) -> Question:
    bench = "lhrs" if kind == "mc" else "vrsbench_ref"
    return Question(benchmark=bench, key="k", image=ImageRef(id="i", path="/x/i.png"), text="?",
                    answer=answer, types=("t",), kind=kind,  # type: ignore[arg-type]
                    choices=tuple(choices) if choices else None)


@pytest.mark.parametrize("name, lines, keys", [
    ("replies_mc.jsonl", MC, {"id", "source", "reply", "choices", "answer", "pick", "lhrs_official", "why"}),
    ("replies_ref.jsonl", REF, {"id", "source", "reply", "answer", "box_grid", "image_size", "box", "iou",
                                "acc@0.5", "why"}),
])
def test_corpus_is_large_and_every_expectation_is_explained(
        name: str, lines: list[dict[str, Any]], keys: set[str]) -> None:
    assert len(lines) >= 100, f"{name}: {len(lines)} replies, at least 100 wanted"
    assert len({r["id"] for r in lines}) == len(lines)
    for r in lines:
        assert set(r) == keys, r["id"]
        assert r["why"].strip() and r["source"].strip(), r["id"]
    if "choices" in keys:
        seen = [(r["reply"], tuple(r["choices"])) for r in lines]
    else:
        seen = [(r["reply"], r["answer"], r["box_grid"]) for r in lines]
    assert len(set(seen)) == len(seen), f"{name}: a reply repeats"


@pytest.mark.parametrize("r", MC, ids=[r["id"] for r in MC])
def test_mc_reply(r: dict[str, Any]) -> None:
    assert pick(r["reply"], r["choices"]) == r["pick"], r["why"]
    s = score_mc(_question("mc", r["answer"], r["choices"]), r["reply"],
                 ScoreOptions(views=frozenset({"lhrs_official"})))
    assert (s.parsed, s.correct) == (r["pick"] is not None, r["pick"] == r["answer"]), r["why"]
    assert s.view("lhrs_official") == r["lhrs_official"], r["why"]


def test_mc_corpus_covers_both_verdicts_of_both_rules() -> None:
    assert {r["pick"] is None for r in MC} == {True, False}
    assert {r["lhrs_official"] for r in MC} == {0, 1}
    # where the rules disagree on a readable reply: the reasons the headline is not official
    assert any(r["pick"] == r["answer"] and not r["lhrs_official"] for r in MC)
    assert any(r["pick"] != r["answer"] and r["lhrs_official"] for r in MC)


@pytest.mark.parametrize("r", REF, ids=[r["id"] for r in REF])
def test_ref_reply(r: dict[str, Any]) -> None:
    size = tuple(r["image_size"]) if r["image_size"] else None
    opts = ScoreOptions(box_grid=r["box_grid"], image_size=size)  # type: ignore[arg-type]
    s = score_ref(_question("ref", r["answer"]), r["reply"], opts)
    assert s.parsed is (r["box"] is not None), r["why"]
    if r["box"] is not None:
        got = [float(v) for v in s.extracted.split(",")]
        assert got == pytest.approx(r["box"], abs=0.006), r["why"]  # extracted: 2 decimals
    assert s.view("iou") == pytest.approx(r["iou"], abs=1e-4), r["why"]
    assert (s.correct, s.view("acc@0.5")) == (bool(r["acc@0.5"]), float(r["acc@0.5"])), r["why"]
