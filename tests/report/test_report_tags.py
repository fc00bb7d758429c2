"""A report covers every stored answer of its tag's questions (`report.build.collect` with
`tag_runs` and `ResultStore.tag_items`): per question and arm the newest run's answer; runs of
another protocol are never merged; counts of what each run selected, reached and answered."""

from __future__ import annotations

import json
from pathlib import Path

from pytest_satbench.engine.store import AnswerRow, ResultStore
from pytest_satbench.report import write_reports
from pytest_satbench.report.__main__ import main as report_main
from pytest_satbench.report.build import collect, tag_runs

BENCH = "demo"
BASE = {"model": "m", "prompt_style": "geocot", "sampling": {"temperature": 0.0, "max_tokens": 64},
        "datasets": {BENCH: {"q.json": "aaa"}}, "limit": None}


def _question(k: int) -> dict[str, object]:
    return {"key": str(k), "text": "Is there a road?", "answer": "yes", "types": ["presence" if k % 2 else "comp"],
            "kind": "vqa", "choices": None, "extra": [], "image_id": f"img{k // 2}", "image_path": None, "prompt": "?"}


def _run(store: ResultStore, run_id: str, started: float, keys: range | list[int], answers: dict[str, str],
         tag: str = "t", finished: bool = True, **protocol: object) -> None:
    """A run that recorded `keys`, answering every arm of `answers` ({arm: text}; text "ERR":
    an error row), fingerprints per arm and key (`<arm>-<key>`, `fp=` in protocol changes them)."""
    fp = protocol.pop("fp", "")
    planned = protocol.pop("planned", len(keys))
    store.start_run(run_id, tag, {**BASE, **protocol, "planned": {BENCH: planned}})
    store._write("UPDATE runs SET started=? WHERE run_id=?", (started, run_id), wait=True)
    for k in keys:
        nodeid = f"t::test_demo[{k}]"
        fps = {arm: f"{arm}-{k}{fp}" for arm in answers}
        store.record_item(run_id, nodeid, BENCH, _question(k), fps)
        for arm, text in answers.items():
            ok = text != "ERR"
            store.put(AnswerRow(nodeid=nodeid, arm=arm, fingerprint=fps[arm], status="ok" if ok else "error",
                                benchmark=BENCH, question_key=str(k), image_id=f"img{k // 2}",
                                text=text if ok else None, error=None if ok else "HTTP 500", run_id=run_id))
    if finished:
        store.finish_run(run_id)


def test_a_subset_run_reports_every_question_of_its_tag(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r.sqlite")
    _run(store, "full", 1.0, range(10), {"orig": "yes", "jpeg": "no"})
    _run(store, "other-tag", 2.0, range(3), {"orig": "no"}, tag="u", fp="u")
    _run(store, "lf", 3.0, [0, 1], {"orig": "no", "blind": "yes"})  # re-asked two questions, with another arm
    [res] = collect(store, "lf", iterations=0)
    assert res.runs == ("lf", "full") and len(res.items) == 10 and res.not_run == 0
    assert res.run_questions == 2 and res.run_selected == 2 and res.subset
    # per question and arm the newest run's answer: orig of 0 and 1 from "lf", jpeg from "full"
    assert res.stats.overall.accuracy["orig"].correct == 8
    assert res.stats.overall.accuracy["jpeg"].n == 10 and res.stats.overall.accuracy["blind"].n == 2
    assert res.usage.asked == 4 and res.usage.reused == 0 and res.usage.earlier == 18  # 8 other questions x 2 arms, and the jpeg arm of 0 and 1
    # the full run's report covers what it and its earlier runs recorded: not "lf"'s blind arm (its
    # orig rows are the store's one row per fingerprint, which "lf" answered again)
    [older] = collect(store, "full", iterations=0)
    assert older.runs == ("full",) and list(older.stats.arms) == ["orig", "jpeg"] and not older.subset
    # the store gives the merged questions once each, in the order the tag first recorded them
    merged = list(store.tag_items(("lf", "full"), BENCH))
    assert [n for n, *_ in merged] == [f"t::test_demo[{k}]" for k in range(10)]
    assert [sorted(own) for *_, own in merged] == [["blind", "orig"]] * 2 + [[]] * 8
    assert list(merged[0][2]) == ["orig", "blind", "jpeg"]  # the newest record's arms first
    assert merged[0][2]["orig"].run_id == "lf" and merged[0][2]["jpeg"].run_id == "full"


def test_runs_of_another_protocol_are_not_merged(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r.sqlite")
    _run(store, "old-data", 1.0, range(10), {"orig": "yes"}, datasets={BENCH: {"q.json": "zzz"}})
    _run(store, "a", 2.0, range(6), {"orig": "yes"})
    _run(store, "b", 3.0, range(4, 8), {"orig": "yes"})
    assert [r["run_id"] for r in tag_runs(store, "b", BENCH)] == ["b", "a"]  # the dataset changed before "a"
    [res] = collect(store, "b", iterations=0)
    assert len(res.items) == 8 and res.not_run == 0
    for change, value in (("model", "m2"), ("sampling", {"temperature": 0.0, "max_tokens": 9}),
                          ("prompt_style", "qwen2vl"), ("judge", {"model": "j"})):
        store2 = ResultStore(tmp_path / f"{change}.sqlite")
        _run(store2, "a", 1.0, range(6), {"orig": "yes"})
        _run(store2, "b", 2.0, range(2), {"orig": "yes"}, fp="x", **{change: value})
        [res] = collect(store2, "b", iterations=0)
        assert res.runs == ("b",) and len(res.items) == 2 and not res.subset, change


def test_never_reached_and_limits_across_runs(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r.sqlite")
    _run(store, "cut", 1.0, range(4), {"orig": "yes"}, planned=10, finished=False)  # stopped after 4 of 10
    [first] = collect(store, "cut", iterations=0)
    assert first.not_run == 6 and first.unfinished and first.questions == 10
    _run(store, "lim", 2.0, range(6), {"orig": "yes"}, limit=6)  # a --limit run reaches two more
    [res] = collect(store, "lim", iterations=0)
    assert len(res.items) == 6 and res.not_run == 4 and res.questions == 10 and res.subset
    assert res.limit is None  # one of the runs had no --limit: not a sample
    out = write_reports(store, "lim", tmp_path / "reports", iterations=0)
    summary = json.loads((out[0] / "summary.json").read_text())
    assert summary["questions"] == 6 and summary["not_run"] == 4 and summary["limited"] is None
    assert summary["coverage"] == {"runs": ["lim", "cut"], "run_selected": 6, "run_questions": 6, "subset": True,
                                   "shards": None}
    md = (out[0] / "report.md").read_text()
    assert "Run incomplete: 4 of the 10 questions of tag t never ran and are in no figure here" in md
    assert "Subset run: this run selected 6 of the 10 questions of tag t" in md


def test_report_list_counts_questions_answered_errors_and_missing(tmp_path: Path, capsys) -> None:
    store = ResultStore(tmp_path / "r.sqlite")
    _run(store, "cut", 1.0, range(4), {"orig": "yes", "jpeg": "ERR"}, planned=10, finished=False)
    _run(store, "two", 2.0, range(3), {"orig": "yes"}, tag="u")
    store._write("INSERT INTO run_items VALUES (?, ?, ?, ?, ?)", ("two", "x::y", "lhrs", json.dumps(_question(9)),
                                                                 json.dumps({"orig": "never-asked"})), wait=True)
    store.close()
    assert report_main(["--store", str(tmp_path / "r.sqlite"), "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("two  tag=u ") and lines[0].endswith("questions=4 answered=3 errors=0 missing=1")
    assert lines[1:3] == ["    demo: questions=3 answered=3 errors=0 missing=0",
                          "    lhrs: questions=1 answered=0 errors=0 missing=1"]
    assert lines[3].startswith("cut  tag=t ") and " unfinished " in lines[3]
    assert lines[3].endswith("questions=10 answered=0 errors=4 missing=6")
