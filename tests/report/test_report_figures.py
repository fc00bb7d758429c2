"""The benchmark's figures in the report files: summary.json, per_type.csv and report.md carry
the headline (RSVQA's original OA/AA), the published views and exact match per type, each
with its interval and, for a reconstruction arm, its paired delta."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from pytest_satbench.engine.store import AnswerRow, ResultStore
from pytest_satbench.report import write_reports

JPEG = "jpeg:quality=10"
BENCH = "rsvqa_lr"
# per image: (type, ground truth, orig's answer, jpeg's answer)
PLAN = [
    ("presence", "yes", "yes", "yes"),
    ("presence", "no", "no", "yes"),
    ("comp", "yes", "yes", "yes"),
    ("count", "42", "40", "4"),  # orig: class right, exact wrong; jpeg: both wrong
    ("rural_urban", "urban", "urban", "urban"),
]
N_IMAGES = 4
PROTOCOL = {"model": "m", "prompt_style": "geocot", "arms": ["orig", JPEG], "command": ["pytest"],
            "date": "2026-12-01T00:00:00+0000", "tag": "t"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("figures")
    store = ResultStore(root / "results.sqlite")
    store.start_run("r", "t", PROTOCOL)
    for i in range(N_IMAGES):
        for j, (qtype, gt, orig, recon) in enumerate(PLAN):
            key = f"{i}{j}"
            nodeid = f"t::test_{BENCH}[{key}]"
            q = {"key": key, "text": "?", "answer": gt, "types": [qtype], "kind": "vqa", "choices": None,
                 "extra": [], "image_id": f"img{i}", "image_path": None, "prompt": "?"}
            store.record_item("r", nodeid, BENCH, q, {"orig": "o" + key, JPEG: "j" + key})
            for arm, text in (("orig", orig), (JPEG, recon)):
                store.put(AnswerRow(nodeid=nodeid, arm=arm, fingerprint=("o" if arm == "orig" else "j") + key,
                                    benchmark=BENCH, question_key=key, image_id=f"img{i}", status="ok",
                                    text=text, finish_reason="stop", latency_s=1.0))
    store.finish_run("r")
    [out] = write_reports(store, "r", root / "reports", iterations=200)
    return out


def test_summary_carries_every_figure_with_interval_and_delta(folder: Path) -> None:
    agg = json.loads((folder / "summary.json").read_text())["aggregate_views"]
    oa, aa, pub = agg["overall_accuracy"], agg["average_accuracy"], agg["aggregate:published"]
    assert oa["label"].startswith("RSVQA overall accuracy (OA), original evaluation")
    assert oa["per_arm"] == {"orig": pytest.approx(1.0), JPEG: pytest.approx(3 / 5)}
    assert aa["per_arm"]["orig"] == pytest.approx(1.0)
    assert aa["per_arm"][JPEG] == pytest.approx((0.5 + 1 + 0 + 1) / 4)
    assert pub["per_arm"] == {"orig": pytest.approx(1.0), JPEG: pytest.approx(3 / 4)}
    assert pub["verdicts"] == {"presence": "exact match", "comp": "exact match", "rural_urban": "exact match"}
    for fig in (oa, aa, pub, agg["aggregate:published_mean"]):
        a = fig["accuracy"][JPEG]
        assert a["ci_low"] <= a["value"] <= a["ci_high"] and a["n"] > 0
        p = fig["paired"][JPEG]
        assert p["ci_low"] <= p["delta"] <= p["ci_high"] and p["n_pairs"] == a["n"]
        assert "orig" not in fig["paired"]
    assert oa["paired"][JPEG]["delta"] == pytest.approx(-40.0)
    assert pub["paired"][JPEG]["delta"] == pytest.approx(-25.0)


def test_per_type_csv_has_a_row_per_figure_and_arm(folder: Path) -> None:
    rows = list(csv.DictReader((folder / "per_type.csv").open()))
    by = {(r["type"], r["arm"]): r for r in rows}
    # exact match per type, as before: count is 0% on orig (40 is not 42)
    assert float(by["count", "orig"]["accuracy"]) == 0.0 and by["count", "orig"]["label"] == ""
    oa = by["overall_accuracy", JPEG]
    assert float(oa["accuracy"]) == pytest.approx(0.6) and float(oa["delta_pp"]) == pytest.approx(-40.0)
    assert oa["ci_low"] and oa["delta_ci_low_pp"] and oa["label"].startswith("RSVQA overall accuracy")
    assert int(oa["n"]) == 20 and int(oa["n_pairs"]) == 20
    pub = by["aggregate:published", JPEG]
    assert float(pub["accuracy"]) == pytest.approx(0.75) and "GeoChat" in pub["label"]
    assert by["aggregate:published", "orig"]["delta_pp"] == ""
    assert {r["type"] for r in rows} == {"presence", "comp", "count", "rural_urban", "overall",
                                         "overall_accuracy", "average_accuracy", "aggregate:published",
                                         "aggregate:published_mean"}


def test_report_md_lists_the_figures_and_what_they_are_made_of(folder: Path) -> None:
    md = (folder / "report.md").read_text()
    assert "## The benchmark's figures" in md
    assert "exact match per question type (%), counts and areas exact too" in md
    line = next(x for x in md.splitlines() if x.startswith("| RSVQA overall accuracy"))
    assert "| `overall_accuracy` | 20 | 100.0% [100.0-100.0] | 60.0% [60.0-60.0] | -40.0 [-40.0,-40.0] |" in line
    assert not any(x.startswith("| `aggregate:published` | count |") for x in md.splitlines())  # count left out
    assert "| `overall_accuracy` | count | binned | 100.0% of 4 | 0.0% of 4 |" in md
    assert "| `aggregate:published` | presence | exact match | 100.0% of 8 | 50.0% of 8 |" in md
    assert "published view, GeoChat's convention" in md
