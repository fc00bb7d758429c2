"""One real pytest run per benchmark, on a tiny copy in its exact on-disk format, against a
loopback server that answers every question correctly in the model's own format (plain
text, an option letter, or a box on the 0-1000 grid). Everything must then be right in
both arms: loader, prompt, scoring and summary agree end to end."""

from __future__ import annotations

import pytest
from datasets_fake import (
    write_lhrs_parquet,
    write_lhrs_qa_json,
    write_rsvqa,
    write_vrsbench,
)
from servers import FakeVLM

from pytest_satbench.core import prompts
from pytest_satbench.datasets import registry
from pytest_satbench.datasets.registry import LoadRequest

MODULE = """
from pytest_satbench import benchmark_test
test_{name} = benchmark_test("{name}")
"""


def _model_answer(kind: str, answer: str) -> str:
    if kind == "ref":  # GT {<x1><y1><x2><y2>} on 0-100; a GeoCoT model answers on 0-1000
        nums = [int(n) * 10 for n in answer.strip("{}<>").replace("><", " ").split()]
        return f"<think>the object is near [1, 2, 3, 4]</think><answer>[{', '.join(map(str, nums))}]</answer>"
    if kind == "mc":
        return f"{answer}."
    return answer.capitalize()


@pytest.mark.parametrize(
    ("name", "write", "types"),
    [
        ("rsvqa_lr", lambda root: write_rsvqa(root, "lr"), ["presence", "comp", "count", "rural_urban"]),
        ("rsvqa_hr", lambda root: write_rsvqa(root, "hr", image_size=64), ["presence", "comp", "count", "area"]),
        ("rsvqa_hr_phili", lambda root: write_rsvqa(root, "hr_phili", image_ext="png", image_size=64), ["area"]),
        ("lhrs", lambda root: write_lhrs_parquet(root), ["identity", "orientation", "quantity", "location"]),
        ("lhrs", lambda root: write_lhrs_qa_json(root), ["identity", "distance"]),
        ("vrsbench", lambda root: write_vrsbench(root, ref=False, image_size=64), ["scene type", "object color"]),
        ("vrsbench_ref", lambda root: write_vrsbench(root, vqa=False, image_size=64), ["unique", "non-unique"]),
    ],
    ids=["rsvqa_lr", "rsvqa_hr", "rsvqa_hr_phili", "lhrs-parquet", "lhrs-qa.json", "vrsbench", "vrsbench_ref"],
)
def test_benchmark_end_to_end(pytester: pytest.Pytester, name: str, write, types: list[str]) -> None:
    root = pytester.path / "data"
    write(root)
    pytester.makepyfile(**{f"test_{name}": MODULE.format(name=name)})
    bench = registry.get(name)
    questions = list(bench.load(LoadRequest(root)))
    answers: dict[str, str] = {}
    for q in questions:
        prompt = prompts.render(q, "geocot")
        model = _model_answer(q.kind, q.answer)
        assert answers.setdefault(prompt, model) == model, "fake data: one prompt, two answers"

    with FakeVLM(models=["m"], answer=lambda prompt, has_image, image: answers.get(prompt, "?")) as srv:
        result = pytester.runpytest(
            "--servers", srv.url, "--data-root", str(root), "--recon", "jpeg:quality=50",
            "-W", "ignore::pytest.PytestAssertRewriteWarning", "-q",
        )
        assert srv.chat_requests == 2 * len(questions)
        assert all(r.has_image for r in srv.recorded)
    assert result.ret == 0, result.stdout.str()
    assert result.parseoutcomes() == {"passed": len(questions)}
    result.stdout.fnmatch_lines([f"*satbench: {name}*"])
    for t in types:  # reported types (VRSBench merges three raw types into "scene type")
        result.stdout.fnmatch_lines([f"{t[:15]}* 100.0 * 100.0 *"])
    result.stdout.fnmatch_lines([f"overall * {len(questions)} * 100.0 * 100.0 *"])


def test_vrsbench_ref_misses_stay_in_the_denominator(pytester: pytest.Pytester) -> None:
    root = pytester.path / "data"
    write_vrsbench(root, vqa=False, image_size=64)
    pytester.makepyfile(test_ref=MODULE.format(name="vrsbench_ref"))
    n = len(list(registry.get("vrsbench_ref").load(LoadRequest(root))))
    # answers on the wrong grid for GeoCoT (0-100 read as 0-1000) are all misses
    with FakeVLM(models=["m"], answer=lambda p, h, i: "{<0><0><1><1>}") as srv:
        result = pytester.runpytest("--servers", srv.url, "--data-root", str(root), "-q",
                                    "-W", "ignore::pytest.PytestAssertRewriteWarning")
    assert result.ret == 0
    assert result.parseoutcomes() == {"wrong": n}
    result.stdout.fnmatch_lines([f"overall * {n} * 0.0 *", "view acc@0.7*", f"overall * {n} * 0.0*"])


def test_qwen25vl_boxes_are_right_in_every_figure(pytester: pytest.Pytester) -> None:
    """Qwen2.5-VL answers on the pixel grid of the image it saw, 504x504 for VRSBench's 512x512:
    a server that answers every box right in that space scores 100% Acc@0.5 in the item
    letters, the terminal, summary.json and report.md alike (the report once scored the same
    boxes against 512x512)."""
    import json

    root = pytester.path / "data"
    written = write_vrsbench(root, vqa=False, image_size=512)
    # small boxes away from the corner, where the two image sizes disagree most
    recs = json.loads(written.files[0].read_text())
    for i, rec in enumerate(recs):
        rec["ground_truth"] = f"{{<{70 + 3 * i}><{90 - i}><{73 + 3 * i}><{93 - i}>}}"
        rec["question"] += f" ({i})"  # one prompt, one box
    written.files[0].write_text(json.dumps(recs, indent=4))
    pytester.makepyfile(test_ref=MODULE.format(name="vrsbench_ref"))
    questions = list(registry.get("vrsbench_ref").load(LoadRequest(root)))
    answers = {}
    for q in questions:  # ground truth on VRSBench's 0-100 grid, answered in 504-pixel space
        nums = [int(n) * 504 / 100 for n in q.answer.strip("{}<>").replace("><", " ").split()]
        answers[prompts.render(q, "qwen25vl")] = "[" + ", ".join(f"{v:.0f}" for v in nums) + "]"
    with FakeVLM(models=["m"], answer=lambda prompt, has_image, image: answers.get(prompt, "?")) as srv:
        result = pytester.runpytest(
            "--servers", srv.url, "--data-root", str(root), "--recon", "jpeg:quality=90",
            "--prompt-style", "qwen25vl", "-W", "ignore::pytest.PytestAssertRewriteWarning", "-q",
        )
    assert result.ret == 0, result.stdout.str()
    assert result.parseoutcomes() == {"passed": len(questions)}  # every letter ".": no regression, no error
    result.stdout.fnmatch_lines([f"overall * {len(questions)} * 100.0 * 100.0 *"])
    report = pytester.path / "reports" / "vrsbench_ref" / "default"
    summary = json.loads((report / "summary.json").read_text())
    headline = summary["aggregate_views"][summary["headline"]]
    assert headline["per_arm"] == {"orig": 1.0, "jpeg:quality=90": 1.0}
    assert summary["aggregate_views"]["view:acc@0.5"]["overall"]["orig"]["mean"] == 1.0
    assert "100.0" in (report / "report.md").read_text()
