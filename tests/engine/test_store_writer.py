"""The store's writer thread under faults: a text SQLite cannot encode is kept (repaired), and
a writer that fails, for any reason, releases every answer thread waiting on it with a
StoreError instead of leaving them blocked; what was committed before stays."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from pytest_satbench.engine.store import AnswerRow, ResultStore, StoreError

THREADS = 150  # more than the >100 answer threads a run had blocked in `_write`
BOUND_S = 30.0  # every put returns (or fails) well within this, on a loaded machine too


def _row(nodeid: str, text: str | None = "yes", status: str = "ok", error: str | None = None) -> AnswerRow:
    return AnswerRow(nodeid=nodeid, arm="orig", fingerprint="f1", status=status, benchmark="b",
                     question_key=nodeid, image_id="1", text=text, error=error)


def _put_from_threads(store: ResultStore, rows: list[AnswerRow]) -> dict[str, BaseException | None]:
    """Each row put from a thread of its own, all at once; the outcome of each, within BOUND_S."""
    outcome: dict[str, BaseException | None] = {}
    lock = threading.Lock()
    start = threading.Barrier(len(rows))

    def put(row: AnswerRow) -> None:
        start.wait()
        try:
            store.put(row)
            got: BaseException | None = None
        except BaseException as exc:  # noqa: BLE001 - recorded and checked by the test
            got = exc
        with lock:
            outcome[row.nodeid] = got

    threads = [threading.Thread(target=put, args=(r,), daemon=True) for r in rows]
    for t in threads:
        t.start()
    deadline = time.monotonic() + BOUND_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = sum(t.is_alive() for t in threads)
    assert not stuck, f"{stuck} answer threads still blocked in the store after {BOUND_S:.0f} s"
    return outcome


def _committed(path: Path) -> dict[str, tuple[str, str | None, str | None]]:
    conn = sqlite3.connect(path)
    try:
        return {n: (s, t, e) for n, s, t, e in conn.execute("SELECT nodeid, status, text, error FROM answers")}
    finally:
        conn.close()


def test_lone_surrogates_are_kept_repaired_and_never_wedge_the_writer(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r.sqlite")
    rows = []
    for i in range(THREADS):
        if i % 5 == 0:  # one in five, as the server that hung a run sent them
            rows.append(_row(f"q{i}", text=f"yes\ud800 {i}"))
        elif i % 5 == 1:
            rows.append(_row(f"q{i}", text=None, status="error", error=f"bad \udfff reply {i}"))
        elif i % 5 == 2:
            rows.append(_row(f"q{i}", text="\ud83d\ude00 written as two escapes"))
        else:
            rows.append(_row(f"q{i}"))
    outcome = _put_from_threads(store, rows)
    assert not [n for n, exc in outcome.items() if exc is not None]
    assert store.failure is None
    store.close()
    got = _committed(tmp_path / "r.sqlite")
    assert len(got) == THREADS
    assert got["q0"] == ("ok", "yes\ufffd 0", None)
    assert got["q1"] == ("error", None, "bad \ufffd reply 1")
    assert got["q2"][1] == "\U0001f600 written as two escapes"  # a pair written as two escapes is its character
    for _, text, error in got.values():
        for s in (text, error):
            assert s is None or s.encode("utf-8")  # every stored text is valid UTF-8


class _FailsAfter(ResultStore):
    """A writer whose commit fails with an error that is neither SQLite's nor the file system's,
    after `ok` batches."""

    ok = 5

    def _commit(self, conn: sqlite3.Connection, batch: list) -> None:  # type: ignore[override]  # a private method, overridden to fail
        if self.ok <= 0:
            raise RuntimeError("simulated writer bug")
        self.ok -= 1
        super()._commit(conn, batch)


def test_a_writer_that_fails_releases_every_waiting_answer_and_keeps_what_was_committed(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    store = _FailsAfter(path)
    committed = []
    for i in range(10):  # one commit each: the first five are kept, then the writer fails
        try:
            store.put(_row(f"s{i}"))
            committed.append(f"s{i}")
        except StoreError:
            break
    assert committed == [f"s{i}" for i in range(5)]
    outcome = _put_from_threads(store, [_row(f"q{i}") for i in range(THREADS)])
    assert all(isinstance(exc, StoreError) for exc in outcome.values())  # released, none left waiting
    message = str(store.failure)
    assert "\n" not in message and f"results store {path}: writing failed (RuntimeError: simulated writer bug)" in message
    store.close()
    assert set(_committed(path)) == set(committed)  # what was committed stays


class _WriterDies(ResultStore):
    """A writer thread that ends without releasing anything (as an uncaught error did)."""

    def _write_loop(self) -> None:
        return


def test_a_writer_thread_that_is_gone_fails_the_waiting_puts_instead_of_hanging(tmp_path: Path) -> None:
    store = _WriterDies(tmp_path / "r.sqlite")
    t0 = time.monotonic()
    outcome = _put_from_threads(store, [_row(f"q{i}") for i in range(20)])
    assert time.monotonic() - t0 < 10
    assert all(isinstance(exc, StoreError) for exc in outcome.values())
    assert "its writer stopped with writes still queued" in str(store.failure)
    store.close()


def test_a_read_only_store_file_is_found_by_a_real_write(tmp_path: Path) -> None:
    import subprocess

    path = tmp_path / "r.sqlite"
    ResultStore.check_writable(path)  # a new store: fine
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here")
    try:
        # root ignores permission bits; an immutable file refuses root too, and SQLite opens it
        # read-only without a word: only the write tells
        with pytest.raises(StoreError, match=r"it cannot be written \(the file is read-only"):
            ResultStore.check_writable(path)
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=False)
