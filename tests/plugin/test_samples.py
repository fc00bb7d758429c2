"""--samples K through real pytest runs against a loopback server that answers by request
seed: each question is asked K times per arm with seeds --request-seed + k - 1, the reports
give mean-of-K, majority-vote and agreement per arm and the paired delta on mean-of-K, a rerun
with a larger K asks only the new samples, a smaller K asks nothing, and K = 1 leaves the
arms, the requests and summary.json's numbers as a run without the option."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from datasets_fake import _RSVQA_SAMPLES, write_rsvqa
from PIL import Image
from servers import JsonServer

WRONG = {"presence": "no", "comp": "yes", "count": "7", "rural_urban": "rural"}


class SeedServer:
    """An OpenAI-compatible chat server on 127.0.0.1 whose answer depends on the request's
    `seed`, the question's type (found by its text in the prompt) and the arm (the original's
    JPEG is large, the jpeg:quality=1 reconstruction's small: `threshold` bytes apart):

    - the original: right for every seed but 2, where presence and comp are wrong;
    - the reconstruction: right for seed 0; presence wrong for every other seed, comp wrong
      for seed 2.
    """

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.requests: Counter[tuple[str, int | None]] = Counter()  # (arm, seed)
        self.lock = threading.Lock()
        self._httpd = JsonServer(self.reply)  # (the client opens many connections at once)

    @property
    def url(self) -> str:
        return self._httpd.url

    def answer(self, prompt: str, image: bytes | None, seed: int | None) -> tuple[str, str]:
        qtype = next(t for t, (text, _) in _RSVQA_SAMPLES.items() if text in prompt)
        arm = "orig" if image is not None and len(image) > self.threshold else "recon"
        if arm == "orig":
            wrong = seed == 2 and qtype in ("presence", "comp")
        else:
            wrong = (seed != 0 and qtype == "presence") or (seed == 2 and qtype == "comp")
        return arm, WRONG[qtype] if wrong else _RSVQA_SAMPLES[qtype][1]

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        content = body["messages"][-1]["content"]
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
        prompt = "".join(p.get("text", "") for p in parts if p.get("type") == "text")
        image = next((base64.b64decode(p["image_url"]["url"].split(",", 1)[1])
                      for p in parts if p.get("type") == "image_url"), None)
        arm, text = self.answer(prompt, image, body.get("seed"))
        with self.lock:
            self.requests[arm, body.get("seed")] += 1
        return {"id": "x", "object": "chat.completion", "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}}

    def __enter__(self) -> SeedServer:
        self._httpd.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.stop()


N_IMAGES = 3  # 4 question types each: 12 questions, 3 of each type


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, int]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_b.py").write_text("from pytest_satbench import benchmark_test\n"
                                        "test_rsvqa_lr = benchmark_test('rsvqa_lr')\n")
    written = write_rsvqa(tmp_path / "data", "lr", n_images=N_IMAGES, per_type=1)
    smallest = min(Path(p).read_bytes() for p in written.images.values())  # type: ignore[arg-type]  # path: set for images written to files
    with Image.open(io.BytesIO(smallest)) as im:
        buf = io.BytesIO()
        im.convert("RGB").save(buf, format="JPEG", quality=95)
    return tmp_path, len(buf.getvalue()) // 2  # noise images: q1 compresses far better


def _run(root: Path, url: str, *args: str, store: str = "s.sqlite") -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "--servers", url,
           "--data-root", str(root / "data"), "--store", str(root / store), "--retries", "0",
           "--recon", "jpeg:quality=1", "--bootstrap", "200", *args]
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _summary(root: Path) -> dict[str, Any]:
    return json.loads((root / "reports" / "rsvqa_lr" / "default" / "summary.json").read_text())


def test_samples_are_asked_with_distinct_seeds_and_reported(project: tuple[Path, int]) -> None:
    root, threshold = project
    with SeedServer(threshold) as srv:
        done = _run(root, srv.url, "--samples", "3", "--request-seed", "0", "--temperature", "0.7")
        # 3 requests per arm per question, seeds 0, 1, 2
        assert srv.requests == {(arm, seed): 12 for arm in ("orig", "recon") for seed in (0, 1, 2)}
        summary = _summary(root)
        samples = summary["samples"]
        assert samples["k"] == 3
        orig, recon = samples["overall"]["arms"]["orig"], samples["overall"]["arms"]["jpeg:quality=1"]
        # orig: presence and comp [R, R, W] (6 questions), count and rural_urban right 3 times
        assert orig["mean"] == pytest.approx(10 / 12)
        assert orig["majority"] == pytest.approx(1.0)
        assert orig["agreement"] == pytest.approx(10 / 12)
        # recon: presence [R, W, W] (its majority is wrong), comp [R, R, W]
        assert recon["mean"] == pytest.approx(9 / 12)
        assert recon["majority"] == pytest.approx(9 / 12)
        assert recon["agreement"] == pytest.approx(10 / 12)
        assert orig["n"] == recon["n"] == orig["majority_n"] == 12 and orig["errors"] == 0
        assert orig["ci_low"] <= orig["mean"] <= orig["ci_high"]
        paired = samples["overall"]["paired"]["jpeg:quality=1"]
        assert paired["delta"] == pytest.approx(100 * (9 - 10) / 12)
        assert paired["ci_low"] <= paired["delta"] <= paired["ci_high"]
        presence = samples["by_type"]["presence"]["arms"]["jpeg:quality=1"]
        assert presence["mean"] == pytest.approx(1 / 3) and presence["majority"] == 0.0
        # the arms of the comparison are the arms themselves (sample 1: every answer right)
        assert summary["arms"] == ["orig", "jpeg:quality=1"]
        assert summary["statistics"]["overall"]["accuracy"]["orig"]["accuracy"] == 1.0
        # the headline is computed on mean-of-K and says so
        headline = summary["aggregate_views"][summary["headline"]]
        assert "mean of 3 samples per question" in headline["label"]
        assert headline["accuracy"]["orig"]["value"] == pytest.approx(10 / 12)
        protocol = json.loads((root / "reports" / "rsvqa_lr" / "default" / "protocol.json").read_text())
        assert protocol["samples"] == {"k": 3, "seeds": [0, 1, 2]}
        assert "mean-of-3" in done.stdout and "majority" in done.stdout
        report = (root / "reports" / "rsvqa_lr" / "default" / "report.md").read_text()
        assert "## Samples" in report

        # a 4th sample: only it is asked (seed 3: the original right, the reconstruction's
        # presence wrong)
        srv.requests.clear()
        _run(root, srv.url, "--samples", "4", "--request-seed", "0", "--temperature", "0.7")
        assert srv.requests == {("orig", 3): 12, ("recon", 3): 12}
        samples = _summary(root)["samples"]
        assert samples["overall"]["arms"]["orig"]["mean"] == pytest.approx((6 * 3 / 4 + 6) / 12)
        assert samples["overall"]["arms"]["jpeg:quality=1"]["mean"] == pytest.approx((3 / 4 + 3 * 3 / 4 + 6) / 12)

        # fewer samples: a subset of those stored, nothing asked
        srv.requests.clear()
        _run(root, srv.url, "--samples", "2", "--request-seed", "0", "--temperature", "0.7")
        assert not srv.requests
        assert _summary(root)["samples"]["overall"]["arms"]["orig"]["mean"] == 1.0


def test_one_sample_is_a_run_without_the_option(project: tuple[Path, int]) -> None:
    root, threshold = project
    with SeedServer(threshold) as srv:
        _run(root, srv.url, store="a.sqlite")
        before, proto_before = _summary(root), (root / "reports/rsvqa_lr/default/protocol.json").read_text()
        asked, first = sum(srv.requests.values()), set(srv.requests)
        srv.requests.clear()
        _run(root, srv.url, "--samples", "1", store="a.sqlite")
        after, proto_after = _summary(root), (root / "reports/rsvqa_lr/default/protocol.json").read_text()
    # the same arms and fingerprints: every answer of the run without the option is reused
    assert asked == 24 and first == {("orig", None), ("recon", None)} and not srv.requests
    assert "samples" not in after and "samples" not in json.loads(proto_after)
    drop = ("run_id", "generated", "coverage", "usage")
    assert {k: v for k, v in before.items() if k not in drop} == {k: v for k, v in after.items() if k not in drop}
    assert set(json.loads(proto_before)) == set(json.loads(proto_after))
