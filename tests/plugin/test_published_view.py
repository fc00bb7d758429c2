"""A real pytest run (pytester) on an RSVQA-LR copy with uneven type sizes: the terminal shows
the original RSVQA OA/AA and the field's published view under their labels, with values
computed here by hand, and summary.json agrees."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from datasets_fake import write_rsvqa
from servers import FakeVLM

BENCH_MODULE = """
from pytest_satbench import benchmark_test
test_rsvqa_lr = benchmark_test("rsvqa_lr")
"""
N_IMAGES, PER_TYPE = 4, 5
KEEP = {"presence": 5, "comp": 3, "count": 5, "rural_urban": 1}  # questions per image kept active


def _k(prompt: str) -> int:
    """The writer numbers the questions of a type on one image: 'text?', 'text 1?', ..."""
    m = re.search(r" (\d+)\?", prompt)
    return int(m.group(1)) if m else 0


def answer(prompt: str, has_image: bool, image: object) -> str:
    k = _k(prompt)
    if "residential building" in prompt:  # presence, gt yes: right on k < 4 -> 16 / 20
        return "yes" if k < 4 else "no"
    if "more roads" in prompt:  # comp, gt no: right on k < 2 -> 8 / 12
        return "no" if k < 2 else "yes"
    if "number of roads" in prompt:  # count, gt 403: never exact; in its class (101-1000) on k < 4
        return "400" if k < 4 else "5"
    return "urban"  # rural/urban, gt urban: 4 / 4


def _data(root: Path) -> Path:
    w = write_rsvqa(root, "lr", n_images=N_IMAGES, per_type=PER_TYPE)
    qpath, apath = w.files
    questions, answers = json.loads(qpath.read_text()), json.loads(apath.read_text())
    dropped = set()
    for rec in questions["questions"]:
        if rec.get("active") and _k(rec["question"]) >= KEEP[rec["type"]]:
            rec["active"] = False
            dropped.add(rec["id"])
    for rec in answers["answers"]:
        if rec["id"] in dropped:
            rec["active"] = False
    qpath.write_text(json.dumps(questions))
    apath.write_text(json.dumps(answers))
    return root


def test_terminal_shows_the_original_protocol_and_the_published_view(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_bench=BENCH_MODULE)
    data = _data(pytester.path / "data")
    with FakeVLM(models=["m"], answer=answer) as srv:
        result = pytester.runpytest("--servers", srv.url, "--data-root", str(data), "--recon", "jpeg:quality=50",
                                    "-W", "ignore::pytest.PytestAssertRewriteWarning")
    assert result.ret == 0, result.stdout.str()
    out = result.stdout.str()
    # by hand: presence 16/20, comp 8/12, rural/urban 4/4, count 0/20 exact and 16/20 in classes
    # original OA = (16 + 8 + 4 + 16) / 56 = 78.6, AA = (80 + 66.7 + 100 + 80) / 4 = 81.7
    # published (GeoChat: presence, comparison, rural/urban, question-weighted) = 28 / 36 = 77.8
    # (its unweighted mean would be 82.2, exact match over all 4 types 50.0)
    result.stdout.fnmatch_lines([
        "exact match per question type (%), counts and areas exact too",
        "overall * 56 * 50.0 * 50.0 *",
        "benchmark figures (%)*",
        "RSVQA overall accuracy (OA), original protocol (syvlo/RSVQA): count answers*",
        "  arm * n * value * 95% CI * delta 95% CI",
        "  orig * 56 * 78.6 *",
        "  jpeg:q50 * 56 * 78.6 * +0.0 *",
        "RSVQA average accuracy (AA), original protocol*",
        "  orig * 56 * 81.7 *",
        "published view, GeoChat's convention*",
        "*question-weighted; count left out",
        "  orig * 36 * 77.8 *",
    ])
    assert "unweighted mean of the 3 type accuracies" not in out  # in the reports only
    [summary] = (pytester.path / "reports").glob("rsvqa_lr/*/summary.json")
    agg = json.loads(summary.read_text())["aggregate_views"]
    assert agg["aggregate:published"]["per_arm"]["orig"] == pytest.approx(28 / 36)
    assert agg["aggregate:published_mean"]["per_arm"]["orig"] == pytest.approx((16 / 20 + 8 / 12 + 1) / 3)
    assert agg["overall_accuracy"]["per_arm"]["orig"] == pytest.approx(44 / 56)
