"""A run's report counts its answers asked anew by reason (summary.json `asked_anew`, one
sentence in report.md), from the store the report is built from, with `report.why.reasons`:
real runs against a loopback server, the second with another prompt style, the third --fresh."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from datasets_fake import write_rsvqa
from servers import FakeVLM

from pytest_satbench.engine.store import ResultStore
from pytest_satbench.report import write_reports
from pytest_satbench.report.why import REASONS


def _run(pytester: pytest.Pytester, url: str, data: Path, *args: str) -> None:
    result = pytester.runpytest("--servers", url, "--data-root", str(data), "-p", "no:randomly",
                                "-W", "ignore::pytest.PytestAssertRewriteWarning", *args)
    assert result.ret == 0, result.stdout.str()


def _counts(**nonzero: int) -> dict[str, int]:
    named = {k.replace("_", " "): v for k, v in nonzero.items()}
    return {k: named.get(k, 0) for k in REASONS}


def test_each_runs_summary_counts_its_answers_asked_anew_by_reason(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_bench="from pytest_satbench import benchmark_test\n"
                                   "test_rsvqa_lr = benchmark_test('rsvqa_lr')\n")
    data = pytester.path / "data"
    write_rsvqa(data, "lr", n_images=2, per_type=2)  # 16 questions
    with FakeVLM(models=["m"], answer=lambda p, i, b: "yes") as srv:
        _run(pytester, srv.url, data, "--tag", "g", "--limit", "8")
        _run(pytester, srv.url, data, "--tag", "q", "--prompt-style", "qwen2vl")
        _run(pytester, srv.url, data, "--tag", "q", "--prompt-style", "qwen2vl", "--fresh")
    store = ResultStore(pytester.path / ".pytest_cache" / "d" / "satbench" / "results.sqlite")
    first, second, fresh = [str(r["run_id"]) for r in store.runs()][::-1]  # oldest first
    out = pytester.path / "again"

    def summary(run_id: str, tag: str, **kw: bool) -> tuple[dict, str]:
        [folder] = write_reports(store, run_id, out / run_id, iterations=0, **kw)
        assert folder == out / run_id / "rsvqa_lr" / tag
        return json.loads((folder / "summary.json").read_text()), (folder / "report.md").read_text()

    # opt-in: the plugin's own reports and a plain write_reports leave it out
    plain = json.loads((pytester.path / "reports" / "rsvqa_lr" / "q" / "summary.json").read_text())
    assert plain["asked_anew"] is None
    got, md = summary(first, "g", asked_anew=True)
    assert got["asked_anew"] == _counts(new_question=8) and list(got["asked_anew"]) == list(REASONS)
    assert f"Run {first} asked 8 answers anew (8 new question); every other answer here came from the store" in md
    # another prompt style: every question asked anew; 8 of them had a record with another prompt
    # (the --limit run), the other 8 none. The --fresh run then asked all 16 again, and the store
    # keeps one row per fingerprint: the rows the qwen2vl run asked are the --fresh run's now
    got, md = summary(second, "q", asked_anew=True)
    assert got["asked_anew"] == _counts() and f"Run {second} asked 0 answers anew;" in md
    got, md = summary(fresh, "q", asked_anew=True)
    assert got["asked_anew"] == _counts(**{"--fresh": 16})
    assert f"Run {fresh} asked 16 answers anew (16 --fresh)" in md
    # as if --fresh had not asked them again: the qwen2vl run's own reasons
    store._write("UPDATE answers SET run_id=? WHERE run_id=?", (second, fresh), wait=True)
    got, md = summary(second, "q", asked_anew=True)
    assert got["asked_anew"] == _counts(prompt_changed=8, new_question=8)
    assert "asked 16 answers anew (8 new question, 8 prompt changed)" in md
    got, _ = summary(second, "q")  # not asked for: null, no sentence
    assert got["asked_anew"] is None
    store.close()
