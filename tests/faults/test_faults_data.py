"""Faults of the data and of the store: corrupt, zero-byte and missing images, a truncated
dataset JSON, a parquet file with a missing column, the store's disk full (a small tmpfs) and a
store whose writes fail (RLIMIT_FSIZE). Each fails what it must, in one line, keeps the rest,
and after the repair a rerun ends with the clean run's answers."""

from __future__ import annotations

import errno
import resource
import time
from pathlib import Path

import pyarrow.parquet as pq
from datasets_fake import DEFAULT_LHRS_ROWS, write_lhrs_parquet
from faults_answer import answer
from faults_harness import (
    ARMS,
    BENCH_MODULE,
    MODEL,
    N_ANSWERS,
    Project,
    Reference,
    compare,
    record,
    settle,
    wait_until,
)
from filesystems import tmpfs
from servers import FakeVLM

STORE_FAILED_EXIT = 7
def _keys_of(project: Project, images: set[str]) -> set[tuple[str, str]]:
    return {(f"test_b.py::test_rsvqa_lr[{k}]", arm) for k, img in project.image_of.items() if img in images
            for arm in ARMS}


def test_corrupt_zero_byte_and_missing_images(tmp_path: Path, reference: Reference, healthy: FakeVLM) -> None:
    project = Project.make(tmp_path)
    images = project.data / "RSVQA-LR" / "Images_LR"
    (images / "10.tif").write_bytes(b"garbage, not a TIFF" * 10)
    (images / "11.tif").write_bytes(b"")
    (images / "12.tif").unlink()
    broken = _keys_of(project, {"10", "11", "12"})
    with FakeVLM([MODEL], answer=answer) as srv:
        first = project.run(srv.url, "-rf")
        asked = srv.chat_requests
    first.check_lines()
    assert first.rc == 1, first.out[-3000:]
    assert asked == N_ANSWERS - len(broken)  # a broken image costs no request
    for name in ("10.tif", "11.tif", "12.tif"):
        failed = [ln for ln in first.out.splitlines() if ln.startswith("orig: ") and f"Images_LR/{name}" in ln]
        assert failed, f"no one-line failure naming {name}"
    # the rest is the clean run's, and nothing of a broken image is an answer
    compare(project, reference, keys=set(reference.answers) - broken)
    assert not broken & {(n, a) for n, a, _, st, _ in project.answers() if st == "ok"}
    project.repair()
    final = settle(project, healthy.url)
    compare(project, reference, final)
    record("corrupt/zero-byte/missing images", project, asked + healthy.chat_requests, reference)


def test_truncated_dataset_json(tmp_path: Path, reference: Reference, healthy: FakeVLM) -> None:
    project = Project.make(tmp_path)
    qfile = project.data / "RSVQA-LR" / "LR_split_test_questions.json"
    raw = qfile.read_bytes()
    qfile.write_bytes(raw[: len(raw) // 2])
    with FakeVLM([MODEL], answer=answer) as srv:
        first = project.run(srv.url, "-rf")
        assert srv.chat_requests == 0
    first.check_lines()
    assert first.rc == 1, first.out[-3000:]
    assert f"{qfile}: not valid JSON" in first.out
    project.repair()
    final = settle(project, healthy.url)
    compare(project, reference, final)
    record("truncated dataset JSON", project, healthy.chat_requests, reference)


def test_parquet_with_a_missing_column(tmp_path: Path, reference: Reference, healthy: FakeVLM) -> None:
    module = BENCH_MODULE + "test_lhrs = benchmark_test('lhrs')\n"
    project = Project.make(tmp_path, module=module)
    written = write_lhrs_parquet(project.data)
    parquet = written.files[0]
    pq.write_table(pq.read_table(parquet).drop(["answer"]), parquet)
    with FakeVLM([MODEL], answer=answer) as srv:
        first = project.run(srv.url, "-rf")
        asked = srv.chat_requests
    first.check_lines()
    assert first.rc == 1, first.out[-3000:]
    assert asked == N_ANSWERS  # the other benchmark ran whole
    failed = [ln for ln in first.out.splitlines() if "no column 'answer'" in ln]
    assert failed and all(str(parquet) in ln for ln in failed), first.out[-3000:]
    rsvqa = set(reference.answers)
    compare(project, reference, keys=rsvqa)
    write_lhrs_parquet(project.data)  # repaired
    final = settle(project, healthy.url)
    compare(project, reference, keys=rsvqa)
    lhrs_ok = [r for r in project.answers() if r[3] == "ok" and "test_lhrs[" in r[0]]
    assert len(lhrs_ok) == len(DEFAULT_LHRS_ROWS) * len(ARMS)
    assert healthy.chat_requests == len(lhrs_ok)  # the rerun asked only the repaired benchmark
    record("parquet missing a column", project, asked + healthy.chat_requests, reference,
           final_exit=final.rc)


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    with filler.open("wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return filler


def test_disk_full_on_a_smalltmpfs(tmp_path: Path, reference: Reference, healthy: FakeVLM) -> None:
    with tmpfs(tmp_path / "disk", "16m") as disk:
        project = Project.make(tmp_path / "p", store=disk / "results.sqlite")
        with FakeVLM([MODEL], answer=answer, delay=0.02) as srv:
            running = project.start(srv.url)
            assert wait_until(lambda: project.stored_ok() >= 30, 60)
            filler = _fill(disk)
            t0 = time.monotonic()
            first = running.wait()
            stop_s = time.monotonic() - t0
            asked = srv.chat_requests
        first.check_lines()  # one line: no thread traceback besides it
        assert first.rc == STORE_FAILED_EXIT, first.out[-3000:]
        assert "the disk is full" in first.out
        filler.unlink()
        final = settle(project, healthy.url)
        compare(project, reference, final)
        record("disk full (tmpfs)", project, asked + healthy.chat_requests, reference, stop_after_full_s=stop_s)


def test_store_writes_fail(tmp_path: Path, reference: Reference, healthy: FakeVLM) -> None:
    """Where no tmpfs can be mounted: RLIMIT_FSIZE makes every write past 256 kB fail (EFBIG)."""
    project = Project.make(tmp_path)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))

    with FakeVLM([MODEL], answer=answer) as srv:
        first = project.start(srv.url, preexec=limit).wait()
        asked = srv.chat_requests
    first.check_lines()  # one line: no thread traceback besides it
    assert first.rc == STORE_FAILED_EXIT, first.out[-3000:]
    assert f"results store {project.store}" in first.out
    kept = project.stored_ok()
    assert 0 < kept < N_ANSWERS
    final = settle(project, healthy.url)
    compare(project, reference, final)
    assert asked + healthy.chat_requests <= N_ANSWERS + 12
    record("store writes fail (RLIMIT_FSIZE)", project, asked + healthy.chat_requests, reference, kept_first=kept)
