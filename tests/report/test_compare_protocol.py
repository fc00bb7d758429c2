"""What a comparison says differs between its two runs, and answers to different data: refused
in one line, or with --allow-different-data paired over the questions both have. Real SQLite
stores written as runs write them."""

from __future__ import annotations

import json
from pathlib import Path

from pytest_satbench.core.records import AnswerRow
from pytest_satbench.engine.store import ResultStore
from pytest_satbench.report.__main__ import main as report_main

BENCH = "demo"
BASE = {"model": "m", "prompt_style": "geocot", "sampling": {"temperature": 0.0, "max_tokens": 64},
        "datasets": {BENCH: {"q.json": "aaa"}}, "limit": None, "served_model": {"root": "/models/m"}}


def _question(k: int, prompt: str = "?") -> dict[str, object]:
    return {"key": str(k), "text": "Is there a road?", "answer": "yes", "types": ["presence" if k % 2 else "comp"],
            "kind": "vqa", "choices": None, "extra": [], "image_id": f"img{k // 2}", "image_path": None,
            "prompt": prompt}


def write_run(store: ResultStore, run_id: str, started: float, keys: range | list[int], answers: dict[str, str],
              tag: str, *, prompt: str = "?", fp: str = "", node: str = "t", image_sha: str = "sha",
              **protocol: object) -> None:
    """A finished run that recorded `keys` and answered every arm of `answers` ({arm: text})."""
    arms = list(answers)
    store.start_run(run_id, tag, {**BASE, "arms": arms, **protocol, "planned": {BENCH: len(keys)}})
    store._write("UPDATE runs SET started=? WHERE run_id=?", (started, run_id), wait=True)
    for k in keys:
        nodeid = f"{node}::test_demo[{k}]"
        fps = {arm: f"{arm}-{k}{fp}" for arm in answers}
        store.record_item(run_id, nodeid, BENCH, _question(k, prompt), fps)
        for arm, text in answers.items():
            store.put(AnswerRow(nodeid=nodeid, arm=arm, fingerprint=fps[arm], status="ok", benchmark=BENCH,
                                question_key=str(k), image_id=f"img{k // 2}", text=text, run_id=run_id,
                                model=str(protocol.get("model", "m")), image_sha256=f"{image_sha}-{arm}-{k}"))
    store.finish_run(run_id)


def test_different_data_is_refused_in_one_line_unless_allowed(tmp_path: Path, capsys) -> None:
    path = tmp_path / "r.sqlite"
    store = ResultStore(path)
    write_run(store, "r1", 1.0, range(8), {"orig": "yes"}, "old")
    write_run(store, "r2", 2.0, range(4, 12), {"orig": "no"}, "new", node="u",
              datasets={BENCH: {"q.json": "bbb"}}, model="m2", served_model={"root": "/models/m2"})
    store.close()
    assert report_main(["--store", str(path), "--compare", "old", "new"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["satbench-report: demo: A (old) and B (new) were measured on different data (q.json differ by "
                   "sha256); pass --allow-different-data to pair only the questions both have"]
    out = tmp_path / "reports"
    assert report_main(["--store", str(path), "--compare", "old", "new", "--allow-different-data",
                        "--out", str(out), "--iterations", "100"]) == 0
    printed = capsys.readouterr().out
    assert "Left out: 4 questions only A has, 4 only B has" in printed
    s = json.loads((out / BENCH / "compare" / "old-vs-new" / "summary.json").read_text())
    assert s["pairs"] == 4 and (s["only_a"], s["only_b"]) == (4, 4)
    assert s["overall"]["b"] == 4 and s["overall"]["c"] == 0  # yes (right) -> no on the 4 shared questions
    assert s["different_data"].startswith("Different data: q.json differ by sha256")
    fields = {d["field"]: (d["a"], d["b"]) for d in s["differences"]}
    assert fields == {"model": ("m", "m2"), "served_model.root": ("/models/m", "/models/m2"),
                      "datasets.q.json (sha256)": ("aaa", "bbb")}
    assert "Different data: q.json differ by sha256" in (out / BENCH / "compare" / "old-vs-new" / "report.md").read_text()


def test_two_arms_of_one_sweep_name_the_arm_and_codec_identity(tmp_path: Path, capsys) -> None:
    path = tmp_path / "r.sqlite"
    store = ResultStore(path)
    a32 = "onedpiece:ckpt=/w/s.bin,nlatent=32"
    a64 = "onedpiece:ckpt=/w/s.bin,nlatent=64"
    write_run(store, "old", 1.0, range(6), {"orig": "yes"}, "other")
    write_run(store, "sweep", 2.0, range(6), {"orig": "yes", a32: "no", a64: "yes"}, "s256",
              codec_identity={a32: "ck-sha", a64: "ck-sha"}, prompt_style="qwen2vl")
    store.close()
    out = tmp_path / "reports"
    assert report_main(["--store", str(path), "--compare", ":tok32", ":tok64", "--out", str(out),
                        "--iterations", "0"]) == 0
    printed = " ".join(capsys.readouterr().out.split())  # the terminal wraps its lines
    assert f"What differs: arm: {a32} -> {a64}." in printed
    s = json.loads((out / BENCH / "compare" / "s256_tok32-vs-s256_tok64" / "summary.json").read_text())
    assert (s["overall"]["b"], s["overall"]["c"], s["overall"]["delta_pp"]) == (0, 6, 100.0)
    assert s["a"]["arm"] == a32 and s["b"]["label"] == "s256:tok64"
    # another tag: its orig arm, another prompt style; node ids equal, so the pairing is the same either way
    assert report_main(["--store", str(path), "--compare", "other", "s256:tok32", "--out", str(out),
                        "--iterations", "0"]) == 0
    s = json.loads((out / BENCH / "compare" / "other-vs-s256_tok32" / "summary.json").read_text())
    fields = {d["field"]: (d["a"], d["b"]) for d in s["differences"]}
    assert fields == {"prompt_style": ("geocot", "qwen2vl"), "arm": ("orig", a32), "codec identity": (None, "ck-sha")}



def test_sides_without_a_common_question_fail_in_one_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "r.sqlite"
    store = ResultStore(path)
    write_run(store, "r1", 1.0, range(4), {"orig": "yes"}, "a")
    write_run(store, "r2", 2.0, range(10, 14), {"orig": "yes"}, "b")
    store.close()
    assert report_main(["--store", str(path), "--compare", "a", "b"]) == 2
    assert capsys.readouterr().err.strip() == ("satbench-report: demo: no question has an answer on both sides "
                                              "(A a: 4, B b: 4)")
