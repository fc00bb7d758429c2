"""The model settings (--temperature, --top-p, --request-seed, --system-prompt, --extra-body)
through real runs against a loopback server: every request body carries them, protocol.json
records them, a changed value asks again on resume and an unchanged one does not, and a store
written before they existed resumes without asking anything."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

from datasets_fake import write_rsvqa
from servers import FakeVLM

from pytest_satbench.engine.fingerprint import AskSettings

SETTINGS = ("--temperature", "0.6", "--top-p", "0.95", "--request-seed", "17",
            "--system-prompt", "You are a careful remote-sensing analyst.",
            "--extra-body", '{"chat_template_kwargs": {"enable_thinking": false}, "top_k": 20}')


def _run(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_b.py").write_text("from pytest_satbench import benchmark_test\n"
                                        "test_rsvqa_lr = benchmark_test('rsvqa_lr')\n")
    data = tmp_path / "data"
    if not data.exists():
        write_rsvqa(data, "lr", n_images=2, per_type=1)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "--servers", url, "--data-root", str(data),
           "--store", str(tmp_path / "s.sqlite"), "--retries", "0", *args]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=180)


def _sampling(tmp_path: Path) -> dict[str, object]:
    return json.loads((tmp_path / "reports" / "rsvqa_lr" / "default" / "protocol.json").read_text())["sampling"]


def test_default_settings_keep_todays_digest() -> None:
    """Pinned: the digest every store written before the model settings existed keys its
    answers by. A run that sets none of them must find those answers."""
    assert AskSettings(model="m", max_tokens=1024, temperature=0.0, prompt_style="satbench").digest() \
        == "90aa01b2d199f04311888190eb5acd72"
    assert AskSettings(model="qwen", max_tokens=64, temperature=0.0, prompt_style="lmms-eval").digest() \
        == "acfd061fc43d6873458a67feb70b25ae"


def test_each_setting_changes_the_digest() -> None:
    base = AskSettings(model="m", max_tokens=1024, temperature=0.0, prompt_style="satbench")
    variants = [AskSettings(model="m", max_tokens=1024, temperature=0.7, prompt_style="satbench"),
                *(AskSettings(model="m", max_tokens=1024, temperature=0.0, prompt_style="satbench", **{k: v})
                  for k, v in (("top_p", 0.9), ("seed", 0), ("system_prompt", ""), ("extra_body", "{}")))]
    digests = {base.digest(), *(v.digest() for v in variants)}
    assert len(digests) == 1 + len(variants)


def test_the_settings_reach_every_request_protocol_records_them_and_a_change_asks_again(tmp_path: Path) -> None:
    with FakeVLM(["m"], answer=lambda p, h, i: "yes") as srv:
        done = _run(tmp_path, srv.url, *SETTINGS)
        assert done.returncode == 0, done.stdout[-2000:]
        n = srv.chat_requests
        for body in [r.body for r in srv.recorded]:
            assert body["temperature"] == 0.6 and body["top_p"] == 0.95 and body["seed"] == 17
            assert body["chat_template_kwargs"] == {"enable_thinking": False} and body["top_k"] == 20
            assert body["messages"][0] == {"role": "system", "content": "You are a careful remote-sensing analyst."}
            assert body["messages"][1]["role"] == "user"
        assert _sampling(tmp_path) == {
            "temperature": 0.6, "max_tokens": 1024, "top_p": 0.95, "seed": 17,
            "system_prompt": "You are a careful remote-sensing analyst.",
            "extra_body": {"chat_template_kwargs": {"enable_thinking": False}, "top_k": 20},
        }
        md = (tmp_path / "reports" / "rsvqa_lr" / "default" / "report.md").read_text()
        assert ('sampling: temperature 0.6, max_tokens 1024, top_p 0.95, seed 17, system_prompt "You are a careful '
                'remote-sensing analyst.", extra_body {"chat_template_kwargs": {"enable_thinking": false}, "top_k": 20}'
                in md)
        assert _run(tmp_path, srv.url, *SETTINGS).returncode == 0
        assert srv.chat_requests == n  # the same settings: every answer reused
        changed = [*SETTINGS[:5], "18", *SETTINGS[6:]]  # another request seed
        assert _run(tmp_path, srv.url, *changed).returncode == 0
        assert srv.chat_requests == 2 * n
        assert {r.body["seed"] for r in srv.recorded[n:]} == {18}
        assert _run(tmp_path, srv.url).returncode == 0  # none of them: the defaults, asked once more
        assert srv.chat_requests == 3 * n
        plain = srv.recorded[-1].body
    assert set(plain) == {"model", "temperature", "max_tokens", "messages"} and plain["temperature"] == 0.0
    assert [m["role"] for m in plain["messages"]] == ["user"]
    assert _sampling(tmp_path) == {"temperature": 0.0, "max_tokens": 1024, "top_p": None, "seed": None,
                                   "system_prompt": None, "extra_body": None}
    md = (tmp_path / "reports" / "rsvqa_lr" / "default" / "report.md").read_text()
    assert "sampling: temperature 0.0, max_tokens 1024, box grid" in md  # the settings not sent left out


def test_a_store_from_before_the_settings_resumes_without_asking(tmp_path: Path) -> None:
    """A run recorded before the model settings existed wrote sampling as temperature and
    max_tokens only, and keyed its answers by today's default digest: rewriting a run's
    protocol that way, a run with no setting asks nothing and its report covers both runs."""
    with FakeVLM(["m"], answer=lambda p, h, i: "yes") as srv:
        assert _run(tmp_path, srv.url).returncode == 0
        n = srv.chat_requests
        conn = sqlite3.connect(tmp_path / "s.sqlite")
        for run_id, proto in list(conn.execute("SELECT run_id, protocol FROM runs")):
            doc = json.loads(proto)
            doc["sampling"] = {"temperature": 0.0, "max_tokens": doc["sampling"]["max_tokens"]}
            conn.execute("UPDATE runs SET protocol = ? WHERE run_id = ?", (json.dumps(doc), run_id))
        conn.commit()
        conn.close()
        again = _run(tmp_path, srv.url)
        assert srv.chat_requests == n
    assert again.returncode == 0, again.stdout[-2000:]
    summary = json.loads((tmp_path / "reports" / "rsvqa_lr" / "default" / "summary.json").read_text())
    assert len(summary["coverage"]["runs"]) == 2  # the older run measured the same: its report merges both
