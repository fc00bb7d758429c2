"""Merging results stores (`engine/merge.py`, `python -m pytest_satbench.report --merge`): real
SQLite files written through `ResultStore`, merged, and read back.

The report of a merged store against the report of one run over the whole benchmark is in
tests/report/test_cluster_array.py (real runs against reference servers)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_satbench.core.records import AnswerRow
from pytest_satbench.engine.merge import MergeError, merge_stores, protocol_conflict
from pytest_satbench.engine.store import ResultStore
from pytest_satbench.report.__main__ import main as report_main

PROTOCOL = {"model": "m", "sampling": {"temperature": 0.0, "max_tokens": 64}, "prompt_style": "rsvqa",
            "arms": ["orig", "jpeg:q50"], "codec_identity": {}, "datasets": {"demo": {"a.json": "aa"}},
            "command": ["pytest"], "date": "d", "servers": ["http://a"], "planned": {"demo": 2}}


def _store(path: Path, run_id: str, tag: str = "t", questions: tuple[str, ...] = ("q1", "q2"), *,
           protocol: dict | None = None, status: str = "ok", created: float | None = None) -> Path:
    """A store with one run of `tag` that recorded and answered `questions` in two arms."""
    store = ResultStore(path)
    try:
        store.start_run(run_id, tag, {**PROTOCOL, **(protocol or {})})
        for key in questions:
            nodeid = f"b/test_demo.py::test_demo[{key}]"
            store.record_item(run_id, nodeid, "demo", {"key": key, "image": "i"}, {"orig": "f1", "jpeg:q50": "f2"})
            for arm, fp in (("orig", "f1"), ("jpeg:q50", "f2")):
                store.put(AnswerRow(nodeid, arm, fp, status, "demo", key, f"img-{key}",
                                    text=f"{key}-{arm}-{run_id}" if status == "ok" else None,
                                    error=None if status == "ok" else "timeout",
                                    created=created or time.time(), run_id=run_id))
        store.put_traffic(run_id, "main", [])
        store.finish_run(run_id)
    finally:
        store.close()
    return path


def _rows(path: Path, table: str) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return sorted(conn.execute(f"SELECT * FROM {table}").fetchall(), key=repr)
    finally:
        conn.close()


def test_two_shards_merge_into_one_store_and_merging_again_adds_nothing(tmp_path: Path) -> None:
    a = _store(tmp_path / "a.sqlite", "ra", questions=("q1", "q2"))
    b = _store(tmp_path / "b.sqlite", "rb", questions=("q3",))
    target = tmp_path / "merged" / "all.sqlite"
    got = merge_stores([a, b], target)
    assert got.total("runs") == 2 and got.total("answers") == 6 and got.total("run_items") == 3
    assert {r[0] for r in _rows(target, "runs")} == {"ra", "rb"}
    before = {t: _rows(target, t) for t in ("runs", "answers", "run_items", "run_traffic", "image_info")}
    again = merge_stores([a, b, a], target)  # twice, and a store named twice
    assert all(n == 0 for per in again.added.values() for n in per.values()), again.added
    assert {t: _rows(target, t) for t in before} == before
    # the merged store reads as the two runs of one tag: every question once
    store = ResultStore(target)
    try:
        keys = [q["key"] for _, q, rows, _ in store.tag_items(["rb", "ra"], "demo")]
    finally:
        store.close()
    assert sorted(keys) == ["q1", "q2", "q3"]


def test_the_sources_are_left_as_they_were(tmp_path: Path) -> None:
    a = _store(tmp_path / "a.sqlite", "ra")
    content = a.read_bytes()
    merge_stores([a], tmp_path / "t.sqlite")
    assert a.read_bytes() == content


def test_an_error_never_replaces_an_answer_and_an_answer_replaces_an_error(tmp_path: Path) -> None:
    ok = _store(tmp_path / "ok.sqlite", "r1", questions=("q1",), created=100.0)
    err = _store(tmp_path / "err.sqlite", "r2", questions=("q1",), status="error", created=200.0)
    for order in ([ok, err], [err, ok]):
        target = tmp_path / f"t{len(list(tmp_path.iterdir()))}.sqlite"
        merge_stores(order, target)
        statuses = {(r[1], r[3]) for r in _rows(target, "answers")}
        assert statuses == {("orig", "ok"), ("jpeg:q50", "ok")}, order
    # of two answers with one key, the later is kept, whichever store comes first
    old = _store(tmp_path / "old.sqlite", "r3", questions=("q1",), created=100.0)
    new = _store(tmp_path / "new.sqlite", "r4", questions=("q1",), created=300.0)
    for i, order in enumerate(([old, new], [new, old])):
        target = tmp_path / f"later{i}.sqlite"
        merge_stores(order, target)
        assert {r[7] for r in _rows(target, "answers")} == {"q1-orig-r4", "q1-jpeg:q50-r4"}


def test_a_table_the_code_does_not_know_is_merged_and_an_old_store_lacks_columns(tmp_path: Path) -> None:
    a = _store(tmp_path / "a.sqlite", "ra")
    conn = sqlite3.connect(a)
    # a table of a later version, with a surrogate key (two stores number their rows alike)
    conn.execute("CREATE TABLE future (id INTEGER PRIMARY KEY, image TEXT NOT NULL, psnr REAL)")
    conn.executemany("INSERT INTO future (image, psnr) VALUES (?, ?)", [("i1", 30.5), ("i2", None)])
    conn.execute("CREATE TABLE keyed (k TEXT PRIMARY KEY, v TEXT)")
    conn.execute("INSERT INTO keyed VALUES ('x', 'from a')")
    conn.commit()
    conn.close()
    b = tmp_path / "b.sqlite"
    conn = sqlite3.connect(b)  # an old store: answers without the later columns, no traffic table
    conn.executescript(
        "CREATE TABLE answers (nodeid TEXT NOT NULL, arm TEXT NOT NULL, fingerprint TEXT NOT NULL, status TEXT NOT NULL,"
        " benchmark TEXT NOT NULL, question_key TEXT NOT NULL, image_id TEXT NOT NULL, text TEXT, created REAL NOT NULL,"
        " PRIMARY KEY (nodeid, arm, fingerprint));"
        "CREATE TABLE runs (run_id TEXT PRIMARY KEY, tag TEXT NOT NULL, started REAL NOT NULL, finished REAL,"
        " protocol TEXT NOT NULL);"
        "CREATE TABLE run_items (run_id TEXT NOT NULL, nodeid TEXT NOT NULL, benchmark TEXT NOT NULL,"
        " question TEXT NOT NULL, fingerprints TEXT NOT NULL, PRIMARY KEY (run_id, nodeid));"
        "CREATE TABLE future (id INTEGER PRIMARY KEY, image TEXT NOT NULL, psnr REAL);"
        "CREATE TABLE keyed (k TEXT PRIMARY KEY, v TEXT);")
    conn.execute("INSERT INTO answers VALUES ('n9', 'orig', 'f1', 'ok', 'demo', 'q9', 'i9', 'yes', 1.0)")
    conn.execute("INSERT INTO runs VALUES ('rold', 't', 1.0, 2.0, ?)", (json.dumps(PROTOCOL),))
    conn.executemany("INSERT INTO future (image, psnr) VALUES (?, ?)", [("i1", 30.5), ("i3", 20.0)])
    conn.execute("INSERT INTO keyed VALUES ('x', 'from b')")
    conn.commit()
    conn.close()
    target = tmp_path / "t.sqlite"
    merge_stores([a, b], target)
    merge_stores([b, a], target)
    # every distinct row once: ids renumbered, equal rows not repeated
    assert sorted(r[1:] for r in _rows(target, "future")) == [("i1", 30.5), ("i2", None), ("i3", 20.0)]
    assert _rows(target, "keyed") == [("x", "from a")]  # a keyed row already there is kept
    old = ResultStore(target)
    try:
        row = next(r for r in old.rows() if r.nodeid == "n9")
    finally:
        old.close()
    assert row.text == "yes" and row.run_id is None and row.clipped is None  # columns it lacked: NULL


def test_a_conflicting_protocol_is_refused_in_one_line_and_nothing_is_merged(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    target = _store(tmp_path / "t.sqlite", "r0")
    before = _rows(target, "answers")
    fine = _store(tmp_path / "fine.sqlite", "r1", questions=("q3",),
                  protocol={"command": ["pytest", "--shard", "2/2"], "servers": ["http://b"], "date": "e",
                            "planned": {"demo": 1}, "served_model": {"root": None, "max_model_len": 9}})
    other = _store(tmp_path / "other.sqlite", "r2", questions=("q4",),
                   protocol={"sampling": {"temperature": 0.0, "max_tokens": 128}})
    with pytest.raises(MergeError) as err:
        merge_stores([fine, other], target)
    assert err.value.lines == [
        f"{other}: run r2 of tag 't' measured with sampling {{'max_tokens': 128, 'temperature': 0.0}}, the target's "
        "runs of that tag (run r1, merged just before) with {'max_tokens': 64, 'temperature': 0.0}; merge it --into "
        "another store"]
    assert _rows(target, "answers") == before and {r[0] for r in _rows(target, "runs")} == {"r0"}
    # from the command line: one line per bad input, then the verdict; exit 2
    assert report_main(["--merge", str(fine), str(other), str(tmp_path / "gone.sqlite"), "--into", str(target)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and "sampling" in lines[0] and "gone.sqlite: no such file" in lines[1], lines
    assert lines[2] == f"satbench-report: nothing merged into {target} (2 bad inputs)"
    # the store that agrees merges alone
    assert report_main(["--merge", str(fine), "--into", str(target)]) == 0
    assert {r[0] for r in _rows(target, "runs")} == {"r0", "r1"}


@pytest.mark.parametrize(("field", "value"), [
    ("model", "other"), ("prompt_style", "plain"), ("arms", ["orig"]), ("codec_identity", {"jpeg:q50": "x"}),
    ("datasets", {"demo": {"a.json": "bb"}}), ("box_grid", "pixels"), ("judge", {"model": "j", "server": "s"}),
    ("served_model", {"root": "/w/other"}), ("system_prompt", "be brief"),
])
def test_what_the_answers_measure_must_agree(field: str, value: object) -> None:
    base = {**PROTOCOL, "served_model": {"root": "/w/m", "max_model_len": 4096}}
    got = protocol_conflict({**base, field: value}, base)
    assert got is not None and got[0].split(".")[0] == field


def test_what_a_shard_changes_may_differ() -> None:
    base = {**PROTOCOL, "served_model": {"root": "/w/m", "max_model_len": 4096}, "judge": {"model": "j", "server": "a"}}
    shard = {**base, "command": ["x"], "date": "z", "servers": ["http://n7:8000"], "planned": {"demo": 9},
             "servers_file": "/scratch/n7/fleet.txt",
             "shard": {"index": 2, "count": 4}, "limit": 5, "plugin_version": "9", "order": {"kind": "random"},
             "served_model": {"root": "/w/m", "max_model_len": 8192}, "judge": {"model": "j", "server": "b"},
             "datasets": {"other": {"b.json": "cc"}}, "sampling": {**base["sampling"], "top_p": None}}
    assert protocol_conflict(shard, base) is None


def test_bad_inputs_are_one_line_each(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _store(tmp_path / "good.sqlite", "r1")
    text = tmp_path / "notes.sqlite"
    text.write_text("not a database\n")
    foreign = tmp_path / "foreign.sqlite"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE x (a)")
    conn.commit()
    conn.close()
    target = tmp_path / "t.sqlite"
    code = report_main(["--merge", str(good), str(tmp_path / "missing.sqlite"), str(text), str(foreign), str(tmp_path),
                        "--into", str(target)])
    lines = capsys.readouterr().err.splitlines()
    assert code == 2 and len(lines) == 5, lines
    assert "missing.sqlite: no such file" in lines[0] and "notes.sqlite: not a satbench results store" in lines[1]
    assert "foreign.sqlite: not a satbench results store (no answers, run_items, runs table)" in lines[2]
    assert f"{tmp_path}: not a file" in lines[3]
    assert not target.exists()  # nothing merged, and no empty store left behind
    assert report_main(["--merge", str(good), "--into", str(good)]) == 2
    assert "is the target of --into" in capsys.readouterr().err


def test_a_store_another_process_has_open_is_refused(tmp_path: Path) -> None:
    src = _store(tmp_path / "busy.sqlite", "r1")
    # another process holds a connection, as a run does from its start to its end
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3, sys\nc = sqlite3.connect(sys.argv[1])\n"
         "c.execute('PRAGMA journal_mode=WAL'); c.execute('SELECT COUNT(*) FROM answers').fetchall()\n"
         "print('open', flush=True); sys.stdin.readline()", str(src)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        if not sys.platform.startswith("linux"):
            pytest.skip("the open-elsewhere check reads Linux's lock layout")
        with pytest.raises(MergeError) as err:
            merge_stores([src], tmp_path / "t.sqlite")
        assert err.value.lines == [
            f"{src}: open in another process (pid {holder.pid}) (a run still writing it?); wait until it ends, then "
            "merge (a store is merged whole, never half-written)"]
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(10)
    assert merge_stores([src], tmp_path / "t.sqlite").total("runs") == 1  # closed: merged


def test_a_failure_mid_merge_leaves_the_target_as_it_was(tmp_path: Path) -> None:
    target = _store(tmp_path / "t.sqlite", "r0")
    before = {t: _rows(target, t) for t in ("runs", "answers", "run_items")}
    a = _store(tmp_path / "a.sqlite", "ra", questions=("q7",))
    b = _store(tmp_path / "b.sqlite", "rb", questions=("q8",))
    conn = sqlite3.connect(b)  # a row the target's schema refuses (NOT NULL), after a's rows went in
    conn.execute("DROP TABLE run_limits")
    conn.execute("CREATE TABLE run_limits (run_id TEXT, process TEXT, server TEXT, steered_by TEXT, final_limit INTEGER,"
                 " peak_in_flight INTEGER, points TEXT)")
    conn.execute("INSERT INTO run_limits VALUES ('rb', 'main', 's', 'x', NULL, 1, '[]')")
    conn.commit()
    conn.close()
    with pytest.raises(MergeError) as err:
        merge_stores([a, b], target)
    assert err.value.lines == [f"{b}: a row of its run_limits table does not fit the target's (NOT NULL constraint "
                               "failed: run_limits.final_limit); was it written by another program?"]
    assert {t: _rows(target, t) for t in before} == before
