"""Reports are written from the store as a stream (report/__init__.py `RunReports`): the
per-question files are filled while the rows are read, nothing holds the run's rows, and a
failure there costs the report, not the results. Shape, not timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.core.results import QuestionOutcome, QuestionResult
from pytest_satbench.engine.store import AnswerRow, ResultStore
from pytest_satbench.report import RunReports, write_reports
from pytest_satbench.report.build import collect
from pytest_satbench.report.gallery import RegressedPicker

N = 30
PROTOCOL = {"model": "m", "prompt_style": "geocot", "arms": ["orig", "jpeg:quality=10"], "tag": "t"}


def _store(root: Path) -> ResultStore:
    store = ResultStore(root / "results.sqlite")
    store.start_run("r", "t", PROTOCOL)
    for k in range(N):
        key, nodeid = str(k), f"t::test_demo[{k}]"
        q = {"key": key, "text": "Is there a road?", "answer": "yes", "types": ["presence"], "kind": "vqa",
             "choices": None, "extra": [], "image_id": f"img{k // 3}", "image_path": None, "prompt": "?"}
        store.record_item("r", nodeid, "demo", q, {"orig": f"o{k}", "jpeg:quality=10": f"j{k}"})
        for arm, text in (("orig", "yes"), ("jpeg:quality=10", "no" if k % 2 else "yes")):
            store.put(AnswerRow(nodeid=nodeid, arm=arm, fingerprint=("o" if arm == "orig" else "j") + key,
                                status="ok", benchmark="demo", question_key=key, image_id=f"img{k // 3}",
                                text=text, latency_s=0.1, server="http://u:secret@h:1"))
    store.finish_run("r")
    return store


def test_per_question_files_are_written_while_the_store_is_read(tmp_path: Path) -> None:
    store = _store(tmp_path)
    reports = RunReports(tmp_path / "reports")
    seen: list[str] = []
    inner = reports.each

    def each(bench: str, tag: str):
        add = inner(bench, tag)
        assert add is not None

        def spy(it: QuestionResult) -> None:
            # predictions.jsonl is filled as the questions go by, not after the run was read
            seen.append(it.question.key)
            add(it)
        return spy

    results = collect(store, "r", iterations=10, each=each)
    assert seen == [str(k) for k in range(N)]
    [data] = results
    assert all(isinstance(it, QuestionOutcome) for it in data.items)
    folder = tmp_path / "reports" / "demo" / "t"
    assert not (folder / "predictions.jsonl").exists()  # in place only once the report is written
    [written] = reports.write(results)
    reports.discard()
    assert written == folder
    lines = [json.loads(x) for x in (folder / "predictions.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * N
    assert list(lines[0])[:8] == ["nodeid", "key", "types", "image_id", "question", "ground_truth", "arm", "status"]
    assert lines[1]["arm"] == "jpeg:quality=10" and lines[1]["correct"] is True and lines[3]["correct"] is False
    assert "secret" not in (folder / "predictions.jsonl").read_text()  # the server URL is redacted
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["questions"] == N and summary["regressed_questions"] == N // 2
    assert summary["gallery"] == [str(k) for k in range(1, N, 2)][:24]
    assert not list(folder.glob(".*.tmp"))


def test_a_failing_report_file_costs_the_report_not_the_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_satbench.report import files

    def broken(self: files.PredictionsWriter, it: QuestionResult) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(files.PredictionsWriter, "add", broken)
    store = _store(tmp_path)
    reports = RunReports(tmp_path / "reports")
    [data] = collect(store, "r", iterations=0, each=reports.each)  # the results are complete
    assert data.stats.overall.n == N
    assert isinstance(reports.failure, OSError)
    with pytest.raises(OSError, match="disk full"):
        reports.write([data])
    reports.discard()
    assert not list((tmp_path / "reports").rglob("*.tmp"))
    with pytest.raises(OSError, match="disk full"):  # the CLI's route raises it
        write_reports(store, "r", tmp_path / "cli", iterations=0)


def test_the_gallery_picker_holds_a_bounded_number_of_questions() -> None:
    picker = RegressedPicker(limit=3)
    keys = [str(k) for k in (50, 7, 300, 12, 9, 100, 8, 1, 64)]
    held = 0
    for key in keys:
        q = Question(benchmark="b", key=key, image=ImageRef(id="1", data=b""), text="?", answer="yes", types=("t",))
        picker.add(QuestionResult(f"t[{key}]", q, ("t",), {"orig": None, "jpeg": None}, {"orig": _correct()}, None))  # type: ignore[dict-item]  # only the rows' arm names are read
        held = max(held, len(picker._held))
    assert picker.total == len(keys)
    assert [it.question.key for it in picker.chosen()] == ["1", "7", "8"]  # natural order, not text order
    assert held <= 2 * 3


def _correct():
    from pytest_satbench.core.scoring import Score

    return Score(correct=True, parsed=True, extracted="yes")
