"""Faults that end a run: SIGTERM (how SLURM preempts and `scancel` and Kubernetes stop a job),
sequential and under `-n 2`, once or twice or followed by SIGKILL; a store that cannot be opened
(an immutable file or folder, a read-only mount, a corrupt header); a store deleted mid-run; a
store writer that fails; replies whose text the store cannot encode; an image rewritten in place
with its old mtime. Real pytest processes against loopback servers, real signals, real files.

The tests run as root, where permission bits stop nothing: a read-only file or folder is made
with `chattr +i` (immutable, which refuses root too) and a read-only disk with a tmpfs remounted
read-only; where neither is possible the case skips."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from datasets_fake import image_bytes
from faults_answer import answer
from faults_harness import (
    MODEL,
    N_ANSWERS,
    N_QUESTIONS,
    Project,
    Reference,
    check_one_line_messages,
    compare,
    group_alive,
    record,
    settle,
    wait_until,
)
from filesystems import tmpfs
from PIL import Image
from servers import FakeVLM

SEED = 20261201
TERM_LINE = "satbench: stopped by SIGTERM"
IN_FLIGHT = 6  # --concurrency 6 (faults_harness.COMMON): the most a stop can leave unanswered
STOP_BOUND_S = 10.0  # SIGTERM to exit, well inside SLURM's 30 s grace (the grace for in-flight requests is 5 s)


def _with_cache(cmd: list[str]) -> list[str]:
    """The harness's command with pytest's cache on (for the last-failed list, the default store)."""
    at = cmd.index("no:cacheprovider")
    return cmd[:at - 1] + cmd[at + 1:]


def _stopped_cleanly(result, rc: int = 2) -> None:  # noqa: ANN001 (result: a pytester or subprocess run)
    result.check_lines()
    assert result.rc == rc, result.out[-3000:]


# ---------------------------------------------------------------------- SIGTERM


def test_sigterm_at_random_moments_several_times(tmp_path: Path, reference: Reference, healthy: FakeVLM) -> None:
    """Three SIGTERMs, the first before any request: each ends the run with one line, keeping
    the answers in flight; reruns complete with the clean run's answers."""
    rng = random.Random(SEED)
    project = Project.make(tmp_path)
    stops, unkept = [], []
    with FakeVLM([MODEL], answer=answer, delay=0.05) as srv:
        for i in range(3):
            before = srv.chat_requests
            target = 0 if i == 0 else min(rng.randrange(10, N_ANSWERS // 3), max(1, (N_ANSWERS - before) // 2))
            running = project.start(srv.url)
            if target == 0:
                assert wait_until(lambda r=running: r.log.stat().st_size > 0, 60)  # pytest started
            else:
                assert wait_until(lambda b=before, t=target: srv.chat_requests - b >= t, 60)
            t0 = time.monotonic()
            running.signal(signal.SIGTERM)
            result = running.wait(60)
            stops.append(time.monotonic() - t0)
            _stopped_cleanly(result, rc=result.rc if result.rc == 0 else 2)
            if target:
                assert TERM_LINE in result.out, result.out[-2000:]
            unkept.append(srv.chat_requests - project.stored_ok())
        asked = srv.chat_requests
    final = settle(project, healthy.url)
    compare(project, reference, final)
    requests = asked + healthy.chat_requests
    record("SIGTERM x3", project, requests, reference, stop_s=max(stops), unkept_after_stop=max(unkept))
    assert max(stops) < STOP_BOUND_S, stops
    assert max(unkept) <= 1, unkept  # the answers in flight were waited for and kept
    assert requests <= N_ANSWERS + 3, requests


def _never_reached_count(out: str) -> int:
    line = next(ln for ln in out.splitlines() if ln.startswith("satbench: this run never reached "))
    return int(line.split("never reached ", 1)[1].split(" ", 1)[0])


def test_sigterm_keeps_what_is_in_flight_writes_last_failed_and_the_unfinished_report(
    tmp_path: Path, reference: Reference,
) -> None:
    project = Project.make(tmp_path)
    with FakeVLM([MODEL], answer=answer, delay=0.3) as srv:
        # pytest's cache on: the never-reached items go to its last-failed list
        cmd = _with_cache(project.cmd(srv.url))
        log = project.dir / "term.log"
        with log.open("w") as fh:
            proc = subprocess.Popen(cmd, cwd=project.dir, stdout=fh, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True)
        try:
            assert wait_until(lambda: project.stored_ok() >= 30, 60)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(STOP_BOUND_S * 3)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        sent, kept = srv.chat_requests, project.stored_ok()
    out = log.read_text()
    check_one_line_messages(out)
    assert rc == 2, out[-3000:]
    assert took < STOP_BOUND_S, took
    assert sum(TERM_LINE in ln for ln in out.splitlines()) == 1, out[-2000:]
    assert sent - kept <= 1, (sent, kept)  # each reply the server sent before the stop is stored
    joined = out.replace("\n  ", " ")
    assert "run unfinished (interrupted or stopped): " in joined
    lastfailed = json.loads((project.dir / ".pytest_cache" / "v" / "cache" / "lastfailed").read_text())
    assert len(lastfailed) == _never_reached_count(out) > 0
    finished, items = project.last_run()
    assert finished is None  # the run stays unfinished in the store
    assert (project.dir / "reports").is_dir()  # its report, marked unfinished, is written
    # --lf reruns exactly what was never reached; what was answered is not asked again
    with FakeVLM([MODEL], answer=answer) as srv2:
        lf = [srv2.url if c == srv.url else c for c in cmd]
        rerun = subprocess.run([*lf, "--lf"], cwd=project.dir, capture_output=True, text=True, timeout=120)
        assert rerun.returncode == 0, rerun.stdout[-3000:]
        assert srv2.chat_requests <= N_ANSWERS - kept + IN_FLIGHT
    assert project.stored_ok() == N_ANSWERS
    compare(project, reference)


@pytest.mark.parametrize("target", ["controller", "every process"])
def test_sigterm_under_xdist(target: str, tmp_path: Path, reference: Reference, healthy: FakeVLM) -> None:
    """Kubernetes signals the first process only (the controller passes it on to its workers);
    SLURM signals every process of the step. Either way: one line, exit 2, every process gone,
    the answers in flight kept."""
    project = Project.make(tmp_path)
    with FakeVLM([MODEL], answer=answer, delay=0.05) as srv:
        running = project.start(srv.url, "-n", "2")
        assert wait_until(lambda: project.stored_ok() >= 40, 60)
        t0 = time.monotonic()
        if target == "controller":
            running.proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(running.proc.pid, signal.SIGTERM)
        result = running.wait(60)
        took = time.monotonic() - t0
        gone = wait_until(lambda: not group_alive(running.proc.pid), 10, step=0.1)
        sent, kept = srv.chat_requests, project.stored_ok()
    _stopped_cleanly(result)
    assert TERM_LINE in result.out and "crashed" not in result.out, result.out[-3000:]
    assert gone, "workers outlived their controller"
    assert took < STOP_BOUND_S, took
    assert sent - kept <= 2, (sent, kept)
    final = settle(project, healthy.url, "-n", "2")
    compare(project, reference, final)
    record(f"-n 2, SIGTERM to {target}", project, sent + healthy.chat_requests, reference, stop_s=took,
           unkept_after_stop=sent - kept)


@pytest.mark.parametrize("second", ["SIGTERM", "SIGKILL"])
def test_a_second_signal_loses_nothing_committed(second: str, tmp_path: Path, reference: Reference,
                                                 healthy: FakeVLM) -> None:
    """Slow answers (4 s, then 25 s): the first SIGTERM waits for those in flight; a second
    SIGTERM gives up on them at once, a SIGKILL ends it; either way every committed answer stays."""
    project = Project.make(tmp_path)
    with FakeVLM([MODEL], answer=answer, delay=4.0) as srv:
        running = project.start(srv.url, "--request-timeout", "60", "--no-reports")
        assert wait_until(lambda: project.stored_ok() >= 6 and srv.chat_requests >= 12, 60)
        # every request in flight from now on needs 25 s: once 6 more were sent (--concurrency
        # 6), the grace of the first SIGTERM is 25 s long, so "at once" cannot be mistaken
        # for the rest of it on a loaded machine
        srv.delay = 25.0
        sent = srv.chat_requests
        assert wait_until(lambda: srv.chat_requests >= sent + IN_FLIGHT, 60)
        running.signal(signal.SIGTERM)
        time.sleep(1.2)  # inside the grace, past the 1 s a duplicate gets
        committed = project.stored_ok()
        t0 = time.monotonic()
        running.signal(getattr(signal, second))
        result = running.wait(30)
        took = time.monotonic() - t0
    assert took < 10.0, took  # not the rest of the grace (about 23 s)
    if second == "SIGKILL":
        assert result.rc == -signal.SIGKILL
    else:
        _stopped_cleanly(result)
        assert TERM_LINE in result.out
    assert project.stored_ok() >= committed
    final = settle(project, healthy.url)
    compare(project, reference, final)


# ---------------------------------------------------------------------- stores that cannot be opened


@contextmanager
def _immutable(path: Path) -> Iterator[None]:
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"chattr +i is not available here: {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=False)


@contextmanager
def _unopenable(kind: str, project: Project, url: str) -> Iterator[str]:
    """The store made unusable the way `kind` says; yields what its one line must say."""
    store = project.store
    if kind == "corrupt header":
        store.parent.mkdir(parents=True, exist_ok=True)
        store.write_bytes(b"SQLite format 2\x00" + os.urandom(4096))
        yield "it is corrupt; rerun with --store-recover"
        return
    assert project.run(url).rc == 0  # a store with every answer in it
    project.results.clear()
    if kind == "read-only file":
        with _immutable(store):
            yield "it cannot be written (the file is read-only"
    elif kind == "read-only folder":
        for extra in store.parent.glob(store.name + "-*"):
            extra.unlink()  # (SQLite's -wal and -shm are made at open)
        with _immutable(store.parent):
            yield "it cannot be written (its folder"
    else:  # a read-only mount
        with tmpfs(project.dir / "ro", "4m") as disk:
            shutil.copy(store, disk / store.name)
            project.store = disk / store.name
            subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
            yield "it cannot be written (its file system is mounted read-only)"


@pytest.mark.parametrize("xdist", [False, True], ids=["sequential", "-n 2"])
@pytest.mark.parametrize("kind", ["read-only file", "read-only folder", "read-only mount", "corrupt header"])
def test_a_store_that_cannot_be_opened_is_one_line_and_exit_4(kind: str, xdist: bool, tmp_path: Path) -> None:
    project = Project.make(tmp_path)
    with FakeVLM([MODEL], answer=answer) as srv, _unopenable(kind, project, srv.url) as says:
        before = srv.chat_requests
        result = project.run(srv.url, "--fresh", *(["-n", "2"] if xdist else []))
        asked = srv.chat_requests - before
    result.check_lines()
    assert result.rc == 4, result.out[-3000:]
    assert asked == 0
    lines = [ln for ln in result.out.splitlines() if ln.strip()]
    assert len(lines) == 1, lines  # nothing before it ("never reached ..."), nothing after
    assert lines[0].startswith(f"ERROR: satbench: results store {project.store}: {says}"), lines[0]


@pytest.mark.parametrize("xdist", [False, True], ids=["sequential", "-n 2"])
def test_pytest_cache_deleted_mid_run_is_one_line_and_no_thread_frames(xdist: bool, tmp_path: Path,
                                                                        healthy: FakeVLM) -> None:
    project = Project.make(tmp_path)
    cache = project.dir / ".pytest_cache"
    store = cache / "d" / "satbench" / "results.sqlite"
    project.store = store  # the default place: no --store
    with FakeVLM([MODEL], answer=answer, delay=0.05) as srv:
        cmd = project.cmd(srv.url, *(["-n", "2"] if xdist else []))
        at = cmd.index("--store")
        cmd = _with_cache(cmd[:at] + cmd[at + 2:])
        log = project.dir / "del.log"
        with log.open("w") as fh:
            proc = subprocess.Popen(cmd, cwd=project.dir, stdout=fh, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True)
        try:
            assert wait_until(lambda: project.stored_ok() >= 30, 60)
            shutil.rmtree(cache)
            rc = proc.wait(60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    out = log.read_text()
    check_one_line_messages(out)  # no "Exception in thread", no frames
    assert rc == 7, out[-3000:]
    said = [ln for ln in out.splitlines() if ln.startswith("satbench: results store") and "(exit status 7)" in ln]
    assert len(said) == 1 and "was .pytest_cache removed?" in said[0], out[-3000:]


# ---------------------------------------------------------------------- the writer


WRITER_FAILS = """
import sqlite3
from pytest_satbench.engine.store import ResultStore

_commit, _left = ResultStore._commit, [40]


def failing(self, conn, batch):
    # a fault that is neither SQLite's nor the file system's, after 40 commits
    if any("INSERT INTO answers" in w.sql for w in batch):
        if _left[0] <= 0:
            raise RuntimeError("simulated writer fault")
        _left[0] -= 1
    _commit(self, conn, batch)


ResultStore._commit = failing
"""


def test_a_writer_that_fails_stops_the_run_with_one_line_and_keeps_what_was_committed(
    tmp_path: Path, reference: Reference, healthy: FakeVLM,
) -> None:
    project = Project.make(tmp_path)
    (project.dir / "conftest.py").write_text(WRITER_FAILS)
    with FakeVLM([MODEL], answer=answer, delay=0.02) as srv:
        result = project.run(srv.url)
        sent = srv.chat_requests
    (project.dir / "conftest.py").unlink()
    result.check_lines()
    assert result.rc == 7, result.out[-3000:]
    said = [ln for ln in result.out.splitlines() if "writing failed (RuntimeError: simulated writer fault)" in ln
            and ln.startswith("satbench: ")]
    assert len(said) == 1, result.out[-3000:]
    kept = project.stored_ok()
    assert 0 < kept < N_ANSWERS and sent - kept <= 2 * IN_FLIGHT + 2  # it stopped asking
    final = settle(project, healthy.url)
    compare(project, reference, final)
    assert healthy.chat_requests == N_ANSWERS - kept  # the rerun asked exactly what was not kept


def _with_lone_surrogates(prompt: str, has_image: bool, image: bytes | None) -> str:
    text = answer(prompt, has_image, image)
    one_in_five = hashlib.sha256(prompt.encode() + (image or b"")).digest()[0] % 5 == 0
    return text + "\ud800" if one_in_five else text


def test_replies_with_lone_surrogates_never_hang_the_run(tmp_path: Path) -> None:
    """The run that hung forever (0 rows committed, 100+ threads blocked in the store): now it
    ends in bounded time, every (question, arm) has a row, and every stored text is UTF-8."""
    project = Project.make(tmp_path)
    with FakeVLM([MODEL], answer=_with_lone_surrogates) as srv:
        result = project.run(srv.url)  # bounded by the harness (killed and failed past RUN_BOUND_S)
    result.check_lines()
    assert result.rc in (0, 1), result.out[-3000:]
    rows = project.answers()
    assert len({(n, a) for n, a, *_ in rows}) == N_ANSWERS
    for *_, text in rows:
        assert text is None or "\ud800" not in text and text.encode("utf-8")
    assert project.stored_ok() > 0


# ---------------------------------------------------------------------- images


def test_an_image_rewritten_in_place_with_its_old_mtime_is_asked_again(tmp_path: Path) -> None:
    project = Project.make(tmp_path)
    with FakeVLM([MODEL], answer=answer) as srv:
        assert project.run(srv.url).rc == 0
        image = project.data / "RSVQA-LR" / "Images_LR" / "10.tif"
        st = os.stat(image)
        with Image.open(image) as im:
            other = image_bytes(SEED, im.width, "TIFF")  # other pixels, uncompressed: the same size
        assert len(other) == st.st_size and other != image.read_bytes()
        image.write_bytes(other)  # rewritten in place
        os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns))  # and its old mtime restored
        assert (os.stat(image).st_mtime_ns, os.stat(image).st_size) == (st.st_mtime_ns, st.st_size)
        before = srv.chat_requests
        rerun = project.run(srv.url)
        asked = srv.chat_requests - before
    assert rerun.rc == 0, rerun.out[-3000:]
    per_image = N_QUESTIONS // 6 * 2  # its questions (20), in both arms
    assert asked == per_image, asked  # that image's questions again, nothing else
    conn = sqlite3.connect(project.store)
    try:
        shas = conn.execute("SELECT COUNT(DISTINCT image_sha256) FROM answers WHERE image_id='10' AND arm='orig'").fetchone()
    finally:
        conn.close()
    assert shas[0] == 2  # the answers about the old pixels and those about the new ones


SLOW_FINISH = """
import os
import time


def pytest_sessionfinish(session):
    os.write(1, b"\\nSESSION FINISHING\\n")  # past the items: the summary and reports are written now
    time.sleep(60)
"""


def test_sigterm_after_the_last_item_lets_the_run_finish_and_a_second_one_exits_at_once(
    tmp_path: Path, reference: Reference,
) -> None:
    project = Project.make(tmp_path)
    (project.dir / "conftest.py").write_text(SLOW_FINISH)
    with FakeVLM([MODEL], answer=answer) as srv:
        running = project.start(srv.url)
        assert wait_until(lambda: "SESSION FINISHING" in running.log.read_text(), 60)
        running.signal(signal.SIGTERM)  # the items are over: nothing is raised, the finish goes on
        time.sleep(1.2)
        assert running.proc.poll() is None
        t0 = time.monotonic()
        running.signal(signal.SIGTERM)
        result = running.wait(30)
        took = time.monotonic() - t0
    assert took < 2.0, took
    assert result.rc == 2 and "satbench: second SIGTERM: exiting now" in result.out, result.out[-2000:]
    assert "Traceback" not in result.out
    compare(project, reference)  # every answer was committed before
