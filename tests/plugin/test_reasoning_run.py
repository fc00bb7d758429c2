"""A reasoning model through a real run: a loopback server that thinks the ways servers send
thinking (vLLM's `reasoning_content` beside the content, content null after running out of
tokens while thinking, `<think>` left inline, closed or cut off). Each reply is an answer:
scored by what its content holds, its thinking stored beside it, asked once (a reply cut off
while thinking is never retried), and the report counts the reasoning per arm."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from datasets_fake import write_rsvqa
from servers import JsonServer

# question text -> (content, reasoning_content, finish_reason, reasoning_tokens reported, completion tokens)
REPLIES: dict[str, tuple[str | None, str | None, str, int | None, int]] = {
    # vLLM with a reasoning parser: the thinking beside the answer, its tokens reported
    "residential building": ("yes", "I see roofs in rows.", "stop", 7, 9),
    # out of tokens while thinking: content null (vLLM), finish_reason length
    "more roads": (None, "Counting the roads one by one: 1, 2, 3, ...", "length", None, 64),
    # thinking left inline, closed: the answer after it is scored
    "number of roads": ("<think>Let me count them.</think>403", None, "stop", None, 12),
    # thinking left inline and cut off: no answer in it
    "rural or an urban": ("<think>Fields everywhere, but", None, "length", None, 64),
}


class ReasoningServer:
    """A purpose-built OpenAI-compatible server answering each demo question as REPLIES says."""

    def __init__(self) -> None:
        self.asked: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.httpd = JsonServer(self.reply, model="thinker").start()
        self.url = self.httpd.url

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        parts = body["messages"][-1]["content"]
        prompt = " ".join(p["text"] for p in parts if p["type"] == "text")
        key = next(k for k in REPLIES if k in prompt)
        with self.lock:
            self.asked[key] += 1
        content, reasoning, finish, r_tokens, c_tokens = REPLIES[key]
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        usage: dict[str, Any] = {"prompt_tokens": 100, "completion_tokens": c_tokens,
                                 "total_tokens": 100 + c_tokens}
        if r_tokens is not None:
            usage["completion_tokens_details"] = {"reasoning_tokens": r_tokens}
        return {"id": "x", "object": "chat.completion", "model": "thinker",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": usage}

    def close(self) -> None:
        self.httpd.stop()


@pytest.fixture
def thinker() -> Iterator[ReasoningServer]:
    srv = ReasoningServer()
    yield srv
    srv.close()


def test_a_reasoning_models_replies_are_answers_with_their_thinking_kept(tmp_path: Path,
                                                                         thinker: ReasoningServer) -> None:
    (tmp_path / "test_b.py").write_text("from pytest_satbench import benchmark_test\n"
                                        "test_rsvqa_lr = benchmark_test('rsvqa_lr')\n")
    write_rsvqa(tmp_path / "data", "lr", n_images=1, per_type=1)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "--servers", thinker.url,
           "--data-root", str(tmp_path / "data"), "--store", str(tmp_path / "s.sqlite"), "--retries", "3",
           "--max-answer-chars", "40"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:]
    assert thinker.asked == {k: 1 for k in REPLIES}  # every reply an answer: nothing asked twice

    conn = sqlite3.connect(tmp_path / "s.sqlite")
    rows = {q: (text, correct, finish, reasoning, chars, tokens) for q, text, correct, finish, reasoning, chars, tokens
            in conn.execute("SELECT question_key, text, correct, finish_reason, reasoning, reasoning_chars, "
                            "reasoning_tokens FROM answers WHERE arm='orig' AND status='ok'")}
    conn.close()
    by_text = {r[0]: r for r in rows.values()}
    thought = REPLIES["more roads"][1]
    assert by_text["yes"][1:] == (1, "stop", "I see roofs in rows.", 20, 7)
    # out of tokens thinking: "" is the answer (wrong), the thinking kept, clipped to --max-answer-chars
    assert by_text[""][1:] == (0, "length", thought[:40], len(thought), None)
    # inline and closed: the text kept whole, scored on what follows the thinking
    assert by_text["<think>Let me count them.</think>403"][1:] == (1, "stop", "Let me count them.", 18, None)
    # inline and cut off: nothing after the thinking, so wrong
    assert by_text["<think>Fields everywhere, but"][1:] == (0, "length", "Fields everywhere, but", 22, None)

    summary = json.loads((tmp_path / "reports" / "rsvqa_lr" / "default" / "summary.json").read_text())
    got = summary["usage"]["reasoning"]["orig"]
    assert {k: got[k] for k in ("answers", "with_reasoning", "reported", "estimated", "truncated",
                                "truncated_thinking")} == {"answers": 4, "with_reasoning": 4, "reported": 1,
                                                           "estimated": 3, "truncated": 2, "truncated_thinking": 2}
    # estimates: completion tokens x the reasoning's share of the reply's characters (inline
    # thinking is part of the text: the answer's characters are the rest)
    tokens = sorted([7.0, 64.0, 12 * 18 / 36, 64 * 22 / 29])
    assert got["tokens_median"] == pytest.approx((tokens[1] + tokens[2]) / 2)
    assert got["tokens_mean"] == pytest.approx(sum(tokens) / 4)
    md = (tmp_path / "reports" / "rsvqa_lr" / "default" / "report.md").read_text()
    assert "## Reasoning" in md and "(some estimated)" in md
