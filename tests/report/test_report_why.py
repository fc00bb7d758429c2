"""Why a reconstruction hurts, in the reports of a real run: flips against distortion and the
visual tokens each arm costs.

A real pytest run (pytester, the plugin in a subprocess) asks a loopback server about ten RSVQA-LR
images of known texture, sent as the original and as `jpeg:quality=10`, and with `--blind`: eight
smooth gradients that JPEG q10 barely touches (about 33 dB) and two with grayscale noise that it
destroys (about 22 dB). The server compares each image it receives with the ten image files and
answers wrong exactly when what it sees is far from every file (PSNR < 28 dB against the nearest:
the two noisy reconstructions), so every regression sits on the two most distorted images. It
reports prompt tokens = the prompt's characters + 256 for an image it sees as undamaged and 196
for a damaged one (as if it had resized it): known counts per arm.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from datasets_fake import rsvqa_suite
from PIL import Image
from servers import FakeVLM

from pytest_satbench.engine.store import ResultStore
from pytest_satbench.report import write_reports

BENCH_MODULE = """
from pytest_satbench import benchmark_test
test_rsvqa_lr = benchmark_test("rsvqa_lr")
"""
N_IMAGES, FIRST_ID, SIZE = 10, 10, 256
NOISY = (FIRST_ID + 3, FIRST_ID + 7)
N = N_IMAGES * 4  # RSVQA-LR: presence, comp, count, rural_urban, one each per image
THRESHOLD_DB = 28.0
SEEN, DAMAGED = 256, 196  # visual tokens the server reports for an undamaged / damaged image
# what the fake dataset asks (tests/datasets_fake.py) and a wrong answer to each
ANSWERS = {"residential building": ("yes", "no"), "more roads than water": ("no", "yes"),
           "number of roads": ("403", "7"), "rural or an urban": ("urban", "rural")}


def _pixels(i: int) -> np.ndarray:
    """Image `i`: a colour gradient of its own direction; the NOISY ones with grayscale noise
    (grayscale: JPEG's chroma subsampling at the sending quality keeps it, q10 does not)."""
    y, x = np.mgrid[0:SIZE, 0:SIZE] / SIZE
    g = np.cos(i * 0.6) * x + np.sin(i * 0.6) * y
    a = np.stack([g * 80 + 80 + 3 * i, 170 - g * 70, np.full_like(g, 90 + 6 * i)], -1)
    if i in NOISY:
        a = a + np.random.default_rng(i).normal(0, 22, (SIZE, SIZE))[..., None]
    return np.clip(a, 0, 255).astype(np.uint8)


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def _decode(raw: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(raw)) as im:
        return np.asarray(im.convert("RGB"))


class _Seer:
    """What the server makes of an image: its PSNR against the nearest of the image files."""

    def __init__(self, files: dict[int, np.ndarray]) -> None:
        self.files = files

    def psnr(self, raw: bytes) -> float:
        got = _decode(raw)
        return max(_psnr(got, f) for f in self.files.values() if f.shape == got.shape)

    def answer(self, prompt: str, has_image: bool, image: bytes | None) -> str:
        right, wrong = next(v for k, v in ANSWERS.items() if k in prompt)
        return right if image is not None and self.psnr(image) >= THRESHOLD_DB else wrong

    def usage(self, prompt: str, has_image: bool, image: bytes | None) -> dict[str, Any]:
        seen = 0 if image is None else SEEN if self.psnr(image) >= THRESHOLD_DB else DAMAGED
        return {"prompt_tokens": len(prompt) + seen, "completion_tokens": 1, "total_tokens": len(prompt) + seen + 1}


class _MeasuredStore(ResultStore):
    """The run's store with the distortion of each pair of images sent, measured here from the
    bytes the server received (the PSNR a store keeps is of the same bytes)."""

    def __init__(self, path: Path, sent: dict[str, bytes], keep: bool = True) -> None:
        super().__init__(path)
        self.sent, self.keep, self.asked = sent, keep, []

    def distortions(self, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], Any]:
        self.asked.append(len(pairs))
        if not self.keep:
            return {}
        return {(o, r): SimpleNamespace(psnr=_psnr(_decode(self.sent[o]), _decode(self.sent[r])), ssim=0.5,
                                        msssim=None, lpips=None)
                for o, r in pairs if o in self.sent and r in self.sent}


def _table(md: str, header_start: str) -> list[list[str]]:
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start)) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


def test_flips_sit_on_the_most_distorted_images_and_tokens_are_paired(pytester: pytest.Pytester,
                                                                      tmp_path: Path) -> None:
    data = rsvqa_suite(pytester, BENCH_MODULE, n_images=N_IMAGES, per_type=1)
    files = {}
    for n in range(N_IMAGES):
        i = FIRST_ID + n
        files[i] = _pixels(i)
        Image.fromarray(files[i]).save(data / "RSVQA-LR" / "Images_LR" / f"{i}.tif", format="TIFF")
    seer = _Seer(files)
    with FakeVLM(models=["m"], answer=seer.answer, usage=seer.usage) as srv:
        result = pytester.runpytest("--servers", srv.url, "--data-root", str(data), "--recon", "jpeg:quality=10",
                                    "--blind", "-q", "-W", "ignore::pytest.PytestAssertRewriteWarning")
        sent = {hashlib.sha256(r.image_bytes).hexdigest(): r.image_bytes for r in srv.recorded if r.image_bytes}
    out = result.stdout.str()
    assert result.ret == 0, out
    # 10 originals and 10 reconstructions, each sent once per question
    assert len(sent) == 2 * N_IMAGES

    # the terminal says the server tokenised the reconstruction differently, and on how many questions
    assert re.search(r"visual tokens: the server's prompt tokens differ from the original's for\s+jpeg:q10 on 8"
                     r"\s+of 40 questions", out), out

    folder = pytester.path / "reports" / "rsvqa_lr" / "default"
    summary = json.loads((folder / "summary.json").read_text())
    arm = "jpeg:quality=10"
    vt = summary["visual_tokens"]
    assert vt["orig"]["server_visual_tokens_mean"] == SEEN and vt["orig"]["differ_orig"] == 0
    assert vt[arm]["server_visual_tokens_mean"] == (32 * SEEN + 8 * DAMAGED) / N
    assert vt[arm]["delta_orig_mean"] == 8 * (DAMAGED - SEEN) / N and vt[arm]["paired_orig"] == N
    assert vt[arm]["differ_orig"] == 8 and vt[arm]["paired_blind"] == N
    assert vt["orig"]["accuracy"] == 1.0 and vt[arm]["accuracy"] == 0.8
    assert vt["orig"]["accuracy_per_1k_server_visual_tokens"] == pytest.approx(1000 / SEEN)
    assert vt[arm]["accuracy_per_1k_server_visual_tokens"] == pytest.approx(800 / ((32 * SEEN + 8 * DAMAGED) / N))
    assert vt["blind"]["server_visual_tokens_mean"] is None
    md = (folder / "report.md").read_text()
    rows = {r[0]: r for r in _table(md, "| arm | answers with prompt tokens |")}
    assert rows["`orig`"][4] == "256.0" and rows["`jpeg:q10`"][3] == "-12.0 (8 of 40 differ)"
    assert "on 8 of 40 questions (every arm is sent at the same geometry" in md

    # the run's own report: a store that keeps no distortion says so instead of a figure
    if not hasattr(ResultStore, "distortions"):
        assert summary["distortion_flips"]["absent"].startswith("the store these answers were read from keeps no")
        assert "## Flips against distortion" in md and "No figure: the store these answers" in md
    else:  # the store measures distortion as it prepares the images: the same figures as below
        assert summary["distortion_flips"]["by_arm"][arm]["by_type"]["all types"]["bins"][0]["regression"]["rate"] == 1.0
        assert summary["distortion_flips"]["lpips_weights"] == []
        assert "LPIPS (not measured: `--lpips-weights` was not given)" in md

    # the report from a store that measured each pair's distortion
    store_path = pytester.path / ".pytest_cache" / "d" / "satbench" / "results.sqlite"
    store = _MeasuredStore(store_path, sent)
    try:
        [run_id] = [str(r["run_id"]) for r in store.runs()]
        [written] = write_reports(store, run_id, tmp_path / "measured", iterations=200)
    finally:
        store.close()
    assert store.asked == [N_IMAGES]  # one query for the benchmark, one pair per image
    fl = json.loads((written / "summary.json").read_text())["distortion_flips"]["by_arm"][arm]
    assert (fl["questions"], fl["without_distortion"], fl["images"]) == (N, 0, N_IMAGES)
    for group in ("all types", "presence", "comp", "count", "rural_urban"):
        bins = fl["by_type"][group]["bins"]
        per_image_q = 4 if group == "all types" else 1
        assert [b["images"] for b in bins] == [2] * 5
        assert [b["regression"]["rate"] for b in bins] == [1.0, 0.0, 0.0, 0.0, 0.0], group
        assert [b["regression"]["n"] for b in bins] == [2 * per_image_q] * 5
        assert all(b["improvement"]["n"] == 0 and b["improvement"]["rate"] is None for b in bins)
        assert bins[0]["psnr_high"] < 25 < 30 < bins[1]["psnr_low"]
        # every regression on the most distorted images: PSNR separates them, the slope is -infinite
        slope = fl["by_type"][group]["slope"]
        assert slope["slope_per_db"] is None and slope["separated_sign"] == -1 and slope["regressed"] == 2 * per_image_q
    md = (written / "report.md").read_text()
    rows = _table(md, "| type | bin | PSNR (dB) |")
    assert [r[5] for r in rows if r[0] == "all types"] == [
        "100.0% [100.0-100.0] (8/8)", "0.0% [0.0-0.0] (0/8)", "0.0% [0.0-0.0] (0/8)", "0.0% [0.0-0.0] (0/8)",
        "0.0% [0.0-0.0] (0/8)"]
    assert "none: PSNR separates regressed from kept answers completely" in md
    page = (written / "report.html").read_text()
    assert "regression rate by PSNR bin" in page and "<script" not in page
    with open(written / "per_image.csv", newline="") as fh:
        per_image = list(csv.DictReader(fh))
    assert len(per_image) == N_IMAGES and {r["arm"] for r in per_image} == {arm}
    by_image = {r["image_id"]: r for r in per_image}
    for n in range(N_IMAGES):
        r = by_image[str(FIRST_ID + n)]
        noisy = FIRST_ID + n in NOISY
        assert (r["questions"], r["orig_correct"], r["arm_correct"], r["regressed"], r["improved"]) == (
            "4", "4", "0" if noisy else "4", "4" if noisy else "0", "0")
        assert (float(r["psnr"]) < 25) is noisy and r["ssim"] == "0.5" and r["msssim"] == "" and r["lpips"] == ""
    lines = [json.loads(line) for line in (written / "predictions.jsonl").read_text().splitlines()]
    assert len(lines) == 3 * N
    for line in lines:
        if line["arm"] == arm:
            assert line["ssim"] == 0.5 and line["lpips"] is None and (line["psnr"] < 25) is (int(line["image_id"]) in NOISY)
        else:
            assert "psnr" not in line

    # a store that keeps distortion, but none for these images: the section says why
    store = _MeasuredStore(store_path, sent, keep=False)
    try:
        [written] = write_reports(store, run_id, tmp_path / "none", iterations=0)
    finally:
        store.close()
    assert json.loads((written / "summary.json").read_text())["distortion_flips"]["absent"].startswith(
        "no distortion is stored for the images")
    assert "psnr" not in (written / "predictions.jsonl").read_text()
    with open(written / "per_image.csv", newline="") as fh:
        assert all(r["psnr"] == "" for r in csv.DictReader(fh))
