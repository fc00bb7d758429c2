"""A doomed run ends: when no server answers for --give-up-after while requests fail, the run
stops asking with one line naming each server and its last error, and exits 8; a server going
down is said the moment it happens."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

from datasets_fake import write_rsvqa
from servers import Fail, FakeVLM

SERVERS_GONE_EXIT = 8
SERVERS = Path(__file__).resolve().parents[1] / "servers.py"


def _setup(tmp_path: Path) -> Path:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_b.py").write_text("from pytest_satbench import benchmark_test\ntest_rsvqa_lr = benchmark_test('rsvqa_lr')\n")
    data = tmp_path / "data"
    write_rsvqa(data, "lr", n_images=25, per_type=10)  # 1,000 questions
    return data


def _cmd(url: str, data: Path, tmp_path: Path) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "--servers", url, "--data-root", str(data),
            "--store", str(tmp_path / "s.sqlite"), "--give-up-after", "2", "--retries", "1", "--concurrency", "4"]


def _wait_for_answers(store: Path, run: subprocess.Popen[str], n: int = 20, bound_s: float = 120.0) -> None:
    """Until the run has stored `n` answers (its workers are up and asking, however loaded the
    machine): the server is killed mid-run, not before the run started nor after it ended."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline and run.poll() is None:
        try:
            with closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=1)) as conn:
                if conn.execute("SELECT COUNT(*) FROM answers WHERE status='ok'").fetchone()[0] >= n:
                    return
        except sqlite3.Error:
            pass  # not created yet
        time.sleep(0.05)
    raise AssertionError(f"the run stored fewer than {n} answers within {bound_s} s (exit {run.poll()})")


def test_a_server_that_dies_mid_run_ends_the_run_in_bounded_time(tmp_path: Path) -> None:
    data = _setup(tmp_path)
    # the server in its own process, so killing it closes every kept-alive connection too
    server = subprocess.Popen([sys.executable, str(SERVERS), "--model", "m", "--answer", "yes", "--delay", "0.02"],
                              stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip()  # type: ignore[union-attr]  # stdout=PIPE: not None
        run = subprocess.Popen(_cmd(url, data, tmp_path), cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        _wait_for_answers(tmp_path / "s.sqlite", run)  # some answers first
        server.kill()
        t0 = time.monotonic()
        out, _ = run.communicate(timeout=180)
        took = time.monotonic() - t0
    finally:
        server.kill()
    assert run.returncode == SERVERS_GONE_EXIT, out[-3000:]
    print(f"stopped {took:.1f} s after the kill")
    assert took < 60, took  # not the hour a 1,000-question run of slow failures would take
    assert f"satbench: server {url} is DOWN" in out
    gone = [line for line in out.splitlines() if "no server has answered for" in line]
    assert gone and f"{url}:" in gone[-1] and "rerun the same command to resume" in gone[-1]
    answered = [line for line in out.splitlines() if line.startswith("answers: ")]
    assert answered and not answered[0].startswith("answers: 0 ")  # what came before the kill is kept


def test_a_server_answering_only_errors_is_given_up_on(tmp_path: Path) -> None:
    data = _setup(tmp_path)
    with FakeVLM(["m"], fail_always=Fail.http(500, "model crashed")) as srv:
        done = subprocess.run(_cmd(srv.url, data, tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=180)
        asked = srv.chat_requests
    assert done.returncode == SERVERS_GONE_EXIT, done.stdout[-3000:]
    assert "no server has answered since the run started while requests kept failing" in done.stdout
    assert "model crashed" in done.stdout
    assert asked < 2 * 1000  # it stopped asking long before every question failed twice


def test_under_xdist_the_controller_says_a_server_is_down(tmp_path: Path) -> None:
    data = _setup(tmp_path)
    server = subprocess.Popen([sys.executable, str(SERVERS), "--model", "m", "--answer", "yes", "--delay", "0.02"],
                              stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip()  # type: ignore[union-attr]  # stdout=PIPE: not None
        run = subprocess.Popen([*_cmd(url, data, tmp_path), "-n", "2"], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        _wait_for_answers(tmp_path / "s.sqlite", run)
        server.kill()
        out, _ = run.communicate(timeout=180)
    finally:
        server.kill()
    assert f"satbench: server {url} is DOWN" in out, out[-3000:]  # a worker's line, said by the controller
    assert run.returncode != 0
