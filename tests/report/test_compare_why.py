"""`--why KEY` and `--reasons`: real runs against a loopback server, each changing one thing
(more questions, the prompt style, --fresh, the model), and what the store then says about
why each answer was asked."""

from __future__ import annotations

from pathlib import Path

import pytest
from datasets_fake import write_rsvqa
from servers import FakeVLM

from pytest_satbench.engine.store import ResultStore
from pytest_satbench.report.__main__ import main as report_main
from pytest_satbench.report.why import reasons


def _run(pytester: pytest.Pytester, url: str, data: Path, *args: str) -> None:
    result = pytester.runpytest("--servers", url, "--data-root", str(data), "-p", "no:randomly",
                                "-W", "ignore::pytest.PytestAssertRewriteWarning", *args)
    assert result.ret == 0, result.stdout.str()


def test_why_names_a_changed_prompt_and_runs_count_their_reasons(pytester: pytest.Pytester, capsys) -> None:
    pytester.makepyfile(test_bench="from pytest_satbench import benchmark_test\n"
                                   "test_rsvqa_lr = benchmark_test('rsvqa_lr')\n")
    data = pytester.path / "data"
    written = write_rsvqa(data, "lr", n_images=2, per_type=2)  # 16 questions
    with FakeVLM(models=["m"], answer=lambda p, i, b: "yes") as srv:
        _run(pytester, srv.url, data, "--tag", "g", "--limit", "8")
        _run(pytester, srv.url, data, "--tag", "g")  # 8 more questions
        _run(pytester, srv.url, data, "--tag", "q", "--prompt-style", "qwen2vl")
        _run(pytester, srv.url, data, "--tag", "q", "--prompt-style", "qwen2vl", "--fresh")
    with FakeVLM(models=["m2"], answer=lambda p, i, b: "yes") as srv:
        _run(pytester, srv.url, data, "--tag", "m2")
    path = pytester.path / ".pytest_cache" / "d" / "satbench" / "results.sqlite"
    store = ResultStore(path)
    runs = [str(r["run_id"]) for r in store.runs()][::-1]  # oldest first
    got = [dict(reasons(store, r)["rsvqa_lr"]) for r in runs]
    store.close()
    # the store keeps one row per fingerprint: what the qwen2vl run asked, --fresh asked again,
    # and those rows are the --fresh run's now
    assert got == [{"new question": 8}, {"new question": 8}, {}, {"--fresh": 16}, {"model changed": 16}]
    store = ResultStore(path)
    # as if --fresh had not asked them again: the qwen2vl run's own reasons
    store._write("UPDATE answers SET run_id=? WHERE run_id=?", (runs[2], runs[3]), wait=True)
    assert dict(reasons(store, runs[2])["rsvqa_lr"]) == {"prompt changed": 16}
    store._write("UPDATE answers SET run_id=? WHERE run_id=?", (runs[3], runs[2]), wait=True)
    store.close()

    capsys.readouterr()
    assert report_main(["--store", str(path), "--reasons", "--tag", "q"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{runs[3]}  tag=q ") and lines[0].endswith("asked anew: 16")
    assert lines[1] == "    rsvqa_lr: 16 (16 --fresh)" and lines[2].endswith("asked anew: 0")

    key = written.expected[0].key
    assert report_main(["--store", str(path), "--why", key]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"satbench why rsvqa_lr {key}: 3 stored answers in 1 arm(s)"
    row = {line.split()[0]: line for line in out if line.startswith("    ")}
    assert row["differs:"].strip() == "differs: model, prompt style, prompt"
    # side by side, oldest first: geocot (tag g), qwen2vl (tag q, asked again by --fresh), model m2
    cells = [row["prompt"][22 + 26 * i: 22 + 26 * (i + 1)].split()[0] for i in range(3)]  # each prompt's sha256
    assert cells[0] == cells[2] != cells[1]
    style = out[[i for i, x in enumerate(out) if x.strip().startswith("prompt style")][0]].split()
    assert style[2:] == ["geocot", "qwen2vl", "geocot"]
    tags = next(x for x in out if x.strip().startswith("used by tags")).split()
    assert tags[3:] == ["g", "q", "m2"]
    assert report_main(["--store", str(path), "--why", "no-such-key"]) == 1
    assert "no stored answer of question 'no-such-key'" in capsys.readouterr().err
