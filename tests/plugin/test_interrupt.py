"""Ctrl-C in a real run: one line, no thread frames; the run stays unfinished in the store and
a rerun asks only what was not answered."""

from __future__ import annotations

import itertools
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

from datasets_fake import write_rsvqa
from servers import FakeVLM, interruptible


def test_ctrl_c_is_one_line_and_a_rerun_resumes(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_b.py").write_text("from pytest_satbench import benchmark_test\ntest_rsvqa_lr = benchmark_test('rsvqa_lr')\n")
    data = tmp_path / "data"
    write_rsvqa(data, "lr", n_images=10, per_type=5)  # 200 questions
    store = tmp_path / "results.sqlite"
    # answers after the 20th wait until Ctrl-C is sent: the run cannot end before it, however
    # slowly this process gets to send it on a loaded machine
    gate, answered = threading.Event(), itertools.count(1)

    def answer(prompt: str, has_image: bool, image: bytes | None) -> str:
        if next(answered) > 20:
            gate.wait(60)
        return "yes"

    with FakeVLM(["m"], answer=answer, delay=0.05) as srv:
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "--servers", srv.url, "--data-root",
               str(data), "--store", str(store), "--concurrency", "4"]
        run = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               preexec_fn=interruptible)  # noqa: PLW1509 (only resets SIGINT)
        deadline = time.monotonic() + 120
        while srv.chat_requests < 21 and time.monotonic() < deadline and run.poll() is None:
            time.sleep(0.05)
        run.send_signal(signal.SIGINT)
        gate.set()
        out, _ = run.communicate(timeout=60)
        asked = srv.chat_requests
        rerun = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        total = srv.chat_requests
    assert run.returncode == 2, out
    assert "satbench: interrupted; every answer received so far is stored" in out
    joined = out.replace("\n  ", " ")  # wrapped sentences of the summary
    assert "run unfinished (interrupted or stopped): " in joined and " of the 200 questions selected never ran" in joined
    assert "Traceback" not in out and "threading.py" not in out and "KeyboardInterrupt" not in out, out
    conn = sqlite3.connect(store)
    runs = conn.execute("SELECT finished FROM runs ORDER BY started").fetchall()
    answered = conn.execute("SELECT COUNT(*) FROM answers WHERE status='ok'").fetchone()[0]
    conn.close()
    assert runs[0] == (None,) and runs[1][0] is not None  # the interrupted run is not marked finished
    assert rerun.returncode == 0 and answered == 200
    assert asked >= 20 and total <= 200 + 4  # over both runs: nothing asked twice but what was in flight
