"""`--curve TAG --margin M`: a sweep of three budgets of one codec, written to a real store as a
run writes it; the curve per budget and the margin line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_satbench.core.records import AnswerRow
from pytest_satbench.engine.store import ResultStore
from pytest_satbench.report.__main__ import main as report_main
from pytest_satbench.report.budget import curves, margin_sentence
from pytest_satbench.report.build import collect

BENCH = "demo"
SPEC = "onedpiece:ckpt=/w/s.bin,max_tiles=1,nlatent={}"
N_IMAGES, PER_IMAGE = 20, 5


def wrong(budget: int, image: int, i: int) -> bool:
    """tok16: wrong on questions 0 and 1 of every image (-40 points); tok32: on question 0 of the
    even images (-10 points); tok64: never (0 points)."""
    return {16: i < 2, 32: i == 0 and image % 2 == 0, 64: False}[budget]


def write_sweep(path: Path) -> None:
    store = ResultStore(path)
    arms = {"orig": None, **{SPEC.format(b): b for b in (16, 32, 64)}}
    store.start_run("sweep", "s256", {"model": "m", "prompt_style": "geocot", "arms": list(arms),
                                      "sampling": {"temperature": 0.0, "max_tokens": 64}})
    for j in range(N_IMAGES):
        for i in range(PER_IMAGE):
            k = j * PER_IMAGE + i
            nodeid = f"t::test_demo[{k}]"
            qtype = "presence" if i < 3 else "comp"
            q = {"key": str(k), "text": "Is there a road?", "answer": "yes", "types": [qtype], "kind": "vqa",
                 "choices": None, "extra": [], "image_id": f"img{j}", "image_path": None, "prompt": "?"}
            fps = {arm: f"{arm}-{k}" for arm in arms}
            store.record_item("sweep", nodeid, BENCH, q, fps)
            for arm, budget in arms.items():
                text = "no" if budget is not None and wrong(budget, j, i) else "yes"
                store.put(AnswerRow(nodeid=nodeid, arm=arm, fingerprint=fps[arm], status="ok", benchmark=BENCH,
                                    question_key=str(k), image_id=f"img{j}", text=text, run_id="sweep",
                                    image_tokens=budget))
    store.finish_run("sweep")
    store.close()


def test_a_sweep_of_three_budgets_gives_the_curve_and_the_margin_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "r.sqlite"
    write_sweep(path)
    store = ResultStore(path)
    [res] = collect(store, "sweep", iterations=500)
    store.close()
    [c] = curves(res, margin=1.0)
    assert c.codec == "onedpiece:ckpt=/w/s.bin,max_tiles=1"
    overall = c.groups["overall"]
    assert [(b.tokens, round(b.delta, 6)) for b in overall] == [(16.0, -40.0), (32.0, -10.0), (64.0, 0.0)]
    assert [b.accuracy for b in overall] == [0.6, 0.9, 1.0]
    # tok64's interval is [0, 0]; tok32 loses a question on half the images: its interval stays below -1
    assert (overall[2].delta_low, overall[2].delta_high) == (0.0, 0.0) and overall[1].delta_high < -1.0
    assert c.smallest_within().arm == SPEC.format(64)
    assert margin_sentence(c) == "overall: tok64 is within 1 point of the original, tok32 is not"
    # comp questions (3 and 4 of each image) are never wrong: every budget is within the margin there
    assert margin_sentence(c, "comp") == "comp: tok16 is within 1 point of the original (the smallest budget swept)"
    # a margin wide enough for tok32 (its whole interval above -20)
    [wide] = curves(res, margin=20.0)
    assert wide.smallest_within().arm == SPEC.format(32)

    out = tmp_path / "reports"
    assert report_main(["--store", str(path), "--curve", "--out", str(out), "--iterations", "500"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("satbench budget curve demo (tag s256): onedpiece:ckpt=/w/s.bin,max_tiles=1;")
    assert lines[1].startswith("  orig        accuracy 100.0")
    assert [x.split()[0:2] for x in lines[2:5]] == [["tok16", "16"], ["tok32", "32"], ["tok64", "64"]]
    assert [x.endswith(" not within") for x in lines[2:5]] == [True, True, False]
    assert lines[5] == "  overall: tok64 is within 1 point of the original, tok32 is not"
    folder = out / BENCH / "compare" / "s256-budget"
    summary = json.loads((folder / "summary.json").read_text())
    [curve] = summary["curves"]
    assert curve["smallest_within_margin"] == {"comp": SPEC.format(16), "presence": SPEC.format(64),
                                               "overall": SPEC.format(64)}
    assert [b["label"] for b in curve["budgets"]["overall"]] == ["tok16", "tok32", "tok64"]
    assert "tok64 is within 1 point of the original, tok32 is not" in (folder / "report.md").read_text()
    assert "<svg" in (folder / "report.html").read_text()
    # a tag without a sweep says so
    assert report_main(["--store", str(path), "--curve", "nope"]) == 2


BENCH_MODULE = """
from pytest_satbench import benchmark_test
test_demo = benchmark_test("demo")
"""


def test_a_sweep_run_prints_one_line_per_budget(pytester, tmp_path: Path, monkeypatch, capsys) -> None:
    """A real run of the demo through a tiny random One-D-Piece checkpoint at two budgets: the
    terminal summary has the curve's lines, the same as --curve prints from the store."""
    pytest.importorskip("torch")
    from pytest_satbench.codecs.onedpiece.checkpoint import save_random_checkpoint
    from pytest_satbench.codecs.onedpiece.model import tiny_config

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    ckpt = save_random_checkpoint(tmp_path / "tiny.bin", tiny_config(), seed=0)
    pytester.makepyfile(test_bench=BENCH_MODULE)
    result = pytester.runpytest("-q", "--servers", "builtin", "--limit", "12", "--recon", f"onedpiece:ckpt={ckpt}",
                                "--nlatent", "4,16", "--recon-device", "cpu", "-p", "no:randomly",
                                "-W", "ignore::pytest.PytestAssertRewriteWarning")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines([
        "satbench budget curve demo (tag default): onedpiece:*; delta vs orig in points, 95% CI clustered by image; "
        "margin 1",
        "  orig        accuracy *",
        "  tok4 * tok  accuracy * delta *",
        "  tok16 * tok  accuracy * delta *",
        "  overall: *",
    ])
    printed = [x for x in result.outlines if x.startswith(("  tok4 ", "  tok16 "))]
    assert len(printed) == 2
    store = pytester.path / ".pytest_cache" / "d" / "satbench" / "results.sqlite"
    capsys.readouterr()
    assert report_main(["--store", str(store), "--curve", "--out", str(tmp_path / "r")]) == 0
    assert [x for x in capsys.readouterr().out.splitlines() if x.startswith(("  tok4 ", "  tok16 "))] == printed
