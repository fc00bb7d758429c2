"""A server that starts answering as another model mid-run (the servers were swapped under
it) stops the run with one line and exit 9; nothing it said is stored as an answer; an alias
the user names is accepted."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from datasets_fake import write_rsvqa
from servers import FakeVLM

MODEL_SWAPPED_EXIT = 9


def _run(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_b.py").write_text("from pytest_satbench import benchmark_test\ntest_rsvqa_lr = benchmark_test('rsvqa_lr')\n")
    data = tmp_path / "data"
    if not data.exists():
        write_rsvqa(data, "lr", n_images=10, per_type=5)  # 200 questions
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "--servers", url, "--data-root", str(data),
           "--store", str(tmp_path / "s.sqlite"), "--retries", "1", "--concurrency", "4", *args]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=180)


def _swap_after(srv: FakeVLM, n: int, model: str) -> threading.Thread:
    def swap() -> None:
        while srv.chat_requests < n:
            time.sleep(0.01)
        srv.response_model = model

    t = threading.Thread(target=swap, daemon=True)
    t.start()
    return t


def test_a_model_swapped_under_the_run_stops_it(tmp_path: Path) -> None:
    with FakeVLM(["m"], answer=lambda p, h, i: "yes", delay=0.01) as srv:
        _swap_after(srv, 30, "m-distilled")
        done = _run(tmp_path, srv.url)
        asked = srv.chat_requests
    assert done.returncode == MODEL_SWAPPED_EXIT, done.stdout[-2000:]
    lines = [line for line in done.stdout.splitlines() if "answered as model 'm-distilled', not 'm'" in line]
    assert lines and "--allow-model-alias m-distilled" in lines[-1]
    assert asked < 200  # it stopped asking
    import sqlite3

    conn = sqlite3.connect(tmp_path / "s.sqlite")
    models = {m for (m,) in conn.execute("SELECT DISTINCT model FROM answers WHERE status='ok'")}
    conn.close()
    assert models == {"m"}  # nothing the swapped server said became an answer


def test_an_alias_the_user_names_is_accepted(tmp_path: Path) -> None:
    with FakeVLM(["m"], answer=lambda p, h, i: "yes") as srv:
        _swap_after(srv, 30, "m-2025-01-01")
        done = _run(tmp_path, srv.url, "--allow-model-alias", "m-2025-01-01")
    assert done.returncode == 0, done.stdout[-2000:]


def test_answers_of_an_alias_are_fingerprinted_with_it_and_reused(tmp_path: Path) -> None:
    import sqlite3

    with FakeVLM(["m"], answer=lambda p, h, i: "yes", response_model="m-2025-01-01") as srv:
        first = _run(tmp_path, srv.url, "--allow-model-alias", "m-2025-01-01")
        asked = srv.chat_requests
        second = _run(tmp_path, srv.url, "--allow-model-alias", "m-2025-01-01")
        assert srv.chat_requests == asked  # a resume finds the alias's answers
    assert first.returncode == second.returncode == 0
    conn = sqlite3.connect(tmp_path / "s.sqlite")
    fps = {fp for (fp,) in conn.execute("SELECT fingerprints FROM run_items")}
    stored = {fp for (fp,) in conn.execute("SELECT fingerprint FROM answers WHERE status='ok'")}
    conn.close()
    assert len(stored) == 200 and all(json.loads(f)["orig"] in stored for f in fps)  # items point at the alias rows
    # they are not the answers of "m" itself: without the alias allowed, "m" is asked again
    with FakeVLM(["m"], answer=lambda p, h, i: "yes") as plain:
        _run(tmp_path, plain.url)
        assert plain.chat_requests == 200


def test_other_weights_under_the_same_model_id_are_refused_and_a_new_length_is_said(tmp_path: Path) -> None:
    with FakeVLM(["m"], answer=lambda prompt, has_image, image: "yes") as srv:
        srv.model_card = {"root": "/w/rsthinker-v1", "max_model_len": 32768}
        first = _run(tmp_path, srv.url)
        asked = srv.chat_requests
        srv.model_card = {"root": "/w/rsthinker-v1", "max_model_len": 8192}
        longer = _run(tmp_path, srv.url)
        srv.model_card = {"root": "/w/rsthinker-v2", "max_model_len": 8192}
        other = _run(tmp_path, srv.url)
        assert srv.chat_requests == asked  # neither later run asked anything
    assert first.returncode == 0 and longer.returncode == 0, longer.stdout[-2000:]
    said = " ".join(longer.stdout.split())
    assert "model 'm' is now served with max_model_len 8192 (the earlier run: 32768); stored answers are reused" in said
    assert other.returncode == 4
    refused = " ".join(other.stderr.split())
    assert ("model 'm' is now served from '/w/rsthinker-v2', the earlier run's server loaded it from "
            "'/w/rsthinker-v1'") in refused, refused
