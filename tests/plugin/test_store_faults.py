"""Faults of the results store, in real runs against a real loopback server: nothing is asked
that cannot be kept, what was committed stays, and each fault is one line with the remedy and
a documented exit status."""

from __future__ import annotations

import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest
from datasets_fake import rsvqa_suite
from filesystems import tmpfs
from servers import FakeVLM

from pytest_satbench.engine.store import network_store_warning

BENCH = """
from pytest_satbench import benchmark_test
test_rsvqa_lr = benchmark_test("rsvqa_lr")
"""
N_IMAGES, PER_TYPE = 10, 5
N = N_IMAGES * 4 * PER_TYPE  # 200 questions
STORE_FAILED_EXIT = 7


def _run(pytester: pytest.Pytester, url: str, data: Path, *args: str) -> pytest.RunResult:
    # An ini file fixes the rootdir, as a project's own does: without one pytest derives it from
    # the command line's existing paths, option values included (--store once the file exists).
    if not (pytester.path / "pytest.ini").exists():
        pytester.makeini("[pytest]\n")
    return pytester.runpytest_subprocess(
        "--servers", url, "--data-root", str(data), "--retries", "1", "-q", "-p", "no:randomly",
        "-W", "ignore::pytest.PytestAssertRewriteWarning", *args, timeout=120,
    )


def _answered(store: Path, *, read_only_disk: bool = False) -> int:
    # on a read-only disk SQLite cannot make its lock files: read the file as it is
    conn = sqlite3.connect(f"file:{store}?immutable=1", uri=True) if read_only_disk else sqlite3.connect(store)
    try:
        return conn.execute("SELECT COUNT(*) FROM answers WHERE status='ok'").fetchone()[0]
    finally:
        conn.close()


def test_disk_full_stops_asking_keeps_what_was_committed_and_a_rerun_completes(
    pytester: pytest.Pytester, tmp_path: Path,
) -> None:
    data = rsvqa_suite(pytester, BENCH, n_images=N_IMAGES, per_type=PER_TYPE)
    long = "yes " + "x" * 3000  # ~3 kB an answer: the small disk fills part-way
    with tmpfs(tmp_path / "small", "400k") as disk, FakeVLM(["m"], answer=lambda p, h, i: long) as srv:
        store = disk / "results.sqlite"
        first = _run(pytester, srv.url, data, "--store", str(store))
        asked_first = srv.chat_requests
        kept = _answered(store)
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        second = _run(pytester, srv.url, data, "--store", str(store))
        total, final = srv.chat_requests, _answered(store)
    assert first.ret == STORE_FAILED_EXIT
    first.stdout.fnmatch_lines([f"*results store {store}: the disk is full; free space*"])
    assert 0 < kept < N and asked_first < N  # it stopped asking instead of throwing answers away
    assert asked_first - kept <= 70  # at most about the requests in flight when it failed
    assert second.ret == 0 and final == N
    assert total - asked_first == N - kept  # the rerun asked exactly what was not kept


def test_a_store_deleted_mid_run_stops_the_run(pytester: pytest.Pytester, tmp_path: Path) -> None:
    data = rsvqa_suite(pytester, BENCH, n_images=N_IMAGES, per_type=PER_TYPE)
    store = tmp_path / "store" / "results.sqlite"

    def delete_soon() -> None:
        # mid-run: once the server has answered a few requests (not a fixed time after the file
        # appears, which a loaded machine can spend still starting the run)
        deadline = time.monotonic() + 60
        while srv.chat_requests < 8 and time.monotonic() < deadline:
            time.sleep(0.02)
        store.unlink()

    with FakeVLM(["m"], answer=lambda p, h, i: "yes", delay=0.05) as srv:
        killer = threading.Thread(target=delete_soon)
        killer.start()
        result = _run(pytester, srv.url, data, "--store", str(store), "--concurrency", "4")
        killer.join()
        assert srv.chat_requests < N
    assert result.ret == STORE_FAILED_EXIT
    result.stdout.fnmatch_lines(["*the file was deleted or replaced while this run wrote to it*"])


def test_a_corrupt_store_is_one_line_and_recovered_only_when_asked(pytester: pytest.Pytester, tmp_path: Path) -> None:
    data = rsvqa_suite(pytester, BENCH, n_images=2, per_type=1)
    store = tmp_path / "results.sqlite"
    store.write_bytes(b"this is not a database" * 100)
    with FakeVLM(["m"], answer=lambda p, h, i: "yes") as srv:
        refused = _run(pytester, srv.url, data, "--store", str(store))
        assert srv.chat_requests == 0
        assert store.read_bytes().startswith(b"this is not")  # never touched without asking
        recovered = _run(pytester, srv.url, data, "--store", str(store), "--store-recover")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    lines = [line for line in refused.errlines if line.strip()]
    assert len(lines) == 1 and "is corrupt; rerun with --store-recover" in lines[0], lines
    assert recovered.ret == 0
    recovered.stdout.fnmatch_lines(["*the results store was corrupt; moved aside to *.corrupt-*"])
    assert len(list(tmp_path.glob("results.sqlite.corrupt-*"))) == 1 and _answered(store) == 8


def test_a_read_only_store_is_one_line(pytester: pytest.Pytester, tmp_path: Path) -> None:
    data = rsvqa_suite(pytester, BENCH, n_images=2, per_type=1)
    with tmpfs(tmp_path / "ro", "4m") as disk, FakeVLM(["m"], answer=lambda p, h, i: "yes") as srv:
        store = disk / "results.sqlite"
        assert _run(pytester, srv.url, data, "--store", str(store)).ret == 0
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        before = srv.chat_requests
        result = _run(pytester, srv.url, data, "--store", str(store), "--fresh")
        assert srv.chat_requests == before
        assert _answered(store, read_only_disk=True) == 8  # what was there is still there
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = [line for line in result.errlines if line.strip()]
    assert len(lines) == 1 and f"results store {store}: it cannot be written" in lines[0], lines


def test_a_store_on_a_network_file_system_is_warned_about(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/sda1 / ext4 rw 0 0\nnas:/home /home nfs4 rw 0 0\nfs /scratch lustre rw 0 0\n")
    assert "on a nfs4 file system" in (network_store_warning(Path("/home/u/p/.pytest_cache/x.sqlite"), mounts) or "")
    assert "lustre" in (network_store_warning(Path("/scratch/x.sqlite"), mounts) or "")
    assert network_store_warning(Path("/tmp/x.sqlite"), mounts) is None
    assert network_store_warning(Path("/homework/x.sqlite"), mounts) is None  # /home is not a prefix of it


# A codec whose build does to the store what a test says, once: the runtime builds the codecs
# after it opened the store and before the run's first write to it (engine/runtime.py:
# `Runtime._open`), so the fault lands exactly there, with no timing involved.
STORE_FAULT_CODEC = """
import os, shutil, subprocess
from pytest_satbench.codecs.base import ArmSpec, CodecFactory, register_codec
from pytest_satbench.codecs.simple import IdentityCodec

STORE, _done = {store!r}, []

def build(specs):
    if not _done:
        _done.append(True)
        {action}
    return [IdentityCodec(s) for s in specs]

register_codec(CodecFactory("storefault", lambda params: ArmSpec("storefault"), build))
"""
DELETED = "the file was deleted or replaced while this run wrote to it (was .pytest_cache removed?)"
BEFORE_FIRST_WRITE = {  # the fault: (what the codec does, what the one line says)
    "file deleted": ("os.unlink(STORE)", DELETED),
    "folder deleted": ("shutil.rmtree(os.path.dirname(STORE))", DELETED),
    "file made read-only": ("subprocess.run(['chattr', '+i', STORE], check=True)",
                            "it cannot be written (the file is read-only"),
}


@pytest.mark.parametrize(("fault", "xdist"), [*((f, False) for f in BEFORE_FIRST_WRITE), ("file deleted", True)],
                         ids=[*BEFORE_FIRST_WRITE, "file deleted, -n 2"])
def test_a_store_that_fails_before_the_first_write_stops_the_run(
    pytester: pytest.Pytester, tmp_path: Path, fault: str, xdist: bool,
) -> None:
    if fault == "file made read-only":
        probe = tmp_path / "probe"
        probe.touch()
        done = subprocess.run(["chattr", "+i", str(probe)], capture_output=True, text=True, check=False)
        subprocess.run(["chattr", "-i", str(probe)], capture_output=True, check=False)
        if done.returncode != 0:  # root ignores permission bits: only an immutable file refuses it
            pytest.skip(f"chattr +i is not available here: {done.stderr.strip()}")
    data = rsvqa_suite(pytester, BENCH, n_images=2, per_type=1)
    store = tmp_path / "store" / "results.sqlite"
    action, says = BEFORE_FIRST_WRITE[fault]
    args = ("--store", str(store), "--recon", "storefault", *(["-n", "2"] if xdist else []))
    with FakeVLM(["m"], answer=lambda p, h, i: "yes") as srv:
        pytester.makeconftest(STORE_FAULT_CODEC.format(store=str(store), action="pass"))
        assert _run(pytester, srv.url, data, *args).ret == 0
        kept = _answered(store)
        pytester.makeconftest(STORE_FAULT_CODEC.format(store=str(store), action=action))
        try:
            result = _run(pytester, srv.url, data, *args, "--fresh")
        finally:
            subprocess.run(["chattr", "-i", str(store)], capture_output=True, check=False)
        assert srv.chat_requests == kept  # the failed run asked nothing
    out = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in out and "Traceback" not in out, out
    assert result.ret == STORE_FAILED_EXIT, out
    said = [ln for ln in result.outlines if ln.startswith("satbench: results store") and "(exit status 7)" in ln]
    assert len(said) == 1 and said[0].startswith(f"satbench: results store {store}: {says}"), out
    result.stdout.fnmatch_lines(["satbench: this run never reached 8 of its 8 items*"])  # --lf reruns them
    if fault == "file made read-only":
        assert kept == 16 and _answered(store) == kept  # 8 questions in 2 arms: what was committed stays
    else:
        assert not store.exists()  # no empty store made in its place


def test_a_store_that_fails_before_the_first_write_stops_a_run_of_the_public_fixtures(
    pytester: pytest.Pytester, tmp_path: Path,
) -> None:
    store = tmp_path / "store" / "results.sqlite"
    pytester.makepyfile(test_mine="""
        def test_one(satbench_ask):
            pass

        def test_two(satbench_ask):
            pass
    """)
    pytester.makeconftest(STORE_FAULT_CODEC.format(store=str(store), action="os.unlink(STORE)"))
    with FakeVLM(["m"], answer=lambda p, h, i: "yes") as srv:
        result = _run(pytester, srv.url, tmp_path, "--store", str(store), "--recon", "storefault")
        assert srv.chat_requests == 0
    out = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in out and "satbench_ask" not in out, out  # the line, not the fixture's frames
    assert result.ret == STORE_FAILED_EXIT, out
    result.assert_outcomes(errors=1)  # the run stopped after the first test
    said = [ln for ln in result.outlines if ln.startswith("satbench: results store") and "(exit status 7)" in ln]
    assert len(said) == 1 and DELETED in said[0], out
