"""The results store alone: answers, errors, export, concurrent writers."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pytest_satbench.engine.store import AnswerRow, ResultStore


def _row(nodeid: str, status: str = "ok", text: str = "yes", arm: str = "orig", fp: str = "f1") -> AnswerRow:
    return AnswerRow(nodeid=nodeid, arm=arm, fingerprint=fp, status=status, benchmark="b",
                     question_key=nodeid, image_id="1", text=text, error=None if status == "ok" else "boom")


def test_store_answers_only_count_when_ok(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r.sqlite")
    store.put(_row("a", status="error"))
    assert store.get("a", "orig", "f1") is None  # an error is not an answer
    store.put(_row("a", text="no"))
    assert store.get("a", "orig", "f1").text == "no"
    store.put(_row("a", status="error"))  # a later error never replaces the answer
    assert store.get("a", "orig", "f1").text == "no"
    assert store.get("a", "orig", "other-fingerprint") is None
    assert store.count("ok") == 1


def test_store_export_jsonl(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r.sqlite")
    store.put(_row("a"))
    store.put(_row("b", status="error"))
    out = tmp_path / "reports" / "x.jsonl"
    assert store.export_jsonl(out) == 2
    lines = out.read_text().splitlines()
    assert len(lines) == 2 and '"status": "error"' in lines[1]


def _write_many(path: str, prefix: str, n: int) -> None:
    store = ResultStore(Path(path))
    for i in range(n):
        store.put(_row(f"{prefix}{i}"))
    store.close()


def test_store_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    ResultStore(path).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(str(path), f"p{k}-", 200)) for k in range(2)]
    for p in procs:
        p.start()
    store = ResultStore(path)
    with ThreadPoolExecutor(8) as ex:  # and threads of this process at the same time
        list(ex.map(lambda i: store.put(_row(f"t{i}")), range(400)))
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert store.count("ok") == 800
