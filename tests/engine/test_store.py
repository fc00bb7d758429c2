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


def test_run_items_streams_in_run_order_with_the_runs_arm_order(tmp_path: Path) -> None:
    import inspect

    store = ResultStore(tmp_path / "r.sqlite")
    store.start_run("r1", "t", {})
    # recorded out of key order, arms listed recon first: both orders are the run's
    for nodeid, fps in (("n2", {"jpeg": "j2", "orig": "o2"}), ("n1", {"jpeg": "j1", "orig": "o1"}),
                        ("n3", {"orig": "o3", "jpeg": "j3"})):
        store.record_item("r1", nodeid, "b" if nodeid != "n3" else "c", {"key": nodeid}, fps)
        for arm, fp in fps.items():
            if (nodeid, arm) != ("n1", "jpeg"):  # never asked: absent, not an error
                store.put(_row(nodeid, arm=arm, fp=fp, text=f"{nodeid}-{arm}"))
    store.put(_row("n2", arm="orig", fp="stale-fingerprint", text="another run's answer"))
    got = store.run_items("r1")
    assert inspect.isgenerator(got)  # one cursor: rows are read as the caller reaches them
    items = list(got)
    assert [(nodeid, bench) for nodeid, bench, _, _ in items] == [("n2", "b"), ("n1", "b"), ("n3", "c")]
    assert [list(rows) for *_, rows in items] == [["jpeg", "orig"], ["orig"], ["orig", "jpeg"]]
    assert items[0][3]["orig"].text == "n2-orig" and items[0][2] == {"key": "n2"}
    assert [n for n, *_ in store.run_items("r1", "b")] == ["n2", "n1"]
    assert store.run_benchmarks("r1") == ["b", "c"]
    assert list(store.run_items("no-such-run")) == []


def test_run_items_reads_through_the_benchmark_index(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r.sqlite")
    conn = store._conn()
    plan = " ".join(str(r[-1]) for r in conn.execute(
        "EXPLAIN QUERY PLAN SELECT r.rowid FROM run_items r WHERE r.run_id=? AND r.benchmark=? ORDER BY r.rowid", ("r", "b")))
    assert "run_items_by_benchmark" in plan and "TEMP B-TREE" not in plan  # no sort of the run's rows


def test_get_many_takes_only_the_asked_fingerprints(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r.sqlite")
    store.put(_row("a", arm="orig", fp="o1", text="orig now"))
    store.put(_row("a", arm="orig", fp="o-old", text="orig with other settings"))
    store.put(_row("a", arm="jpeg", fp="j1", text="jpeg now"))
    store.put(_row("a", arm="blind", fp="b1", status="error"))  # an error is not an answer
    got = store.get_many("a", [("jpeg", "j1"), ("orig", "o1"), ("blind", "b1"), ("resize", "r1")])
    assert list(got) == ["jpeg", "orig"]  # the asked order
    assert got["orig"].text == "orig now" and got["jpeg"].text == "jpeg now"
    assert store.get_many("a", [("orig", "o-old")])["orig"].text == "orig with other settings"
    assert store.get_many("b", [("orig", "o1"), ("jpeg", "j1")]) == {}
