"""Distortion in real runs of the demo against the bundled reference server: every reconstruction
answer's pair of images sent has its row in the store, a second run that prepares the images
again measures only the pairs it has not seen (counted by the rows it writes), a weights file
that is not LPIPS' stops the start with one line, and a run with --distortion off measures
nothing and says so, after which a run with it on measures every pair and asks nothing."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
ARGS = ("benchmarks", "-k", "demo", "--servers", "builtin", "--limit", "12", "-p", "no:randomly",
        "-W", "ignore::pytest.PytestAssertRewriteWarning", "--recon", "jpeg:quality=10")


def _store(pytester: pytest.Pytester) -> Path:
    [path] = (pytester.path / ".pytest_cache").rglob("results.sqlite")
    return path


def _distortion_rows(path: Path) -> dict[tuple[str, str], tuple[float, float, float | None, float]]:
    with sqlite3.connect(path) as conn:
        return {(o, a): (p, s, m, c) for o, a, p, s, m, c in conn.execute(
            "SELECT orig_sha256, arm_sha256, psnr, ssim, msssim, created FROM distortion")}


def _answer_pairs(path: Path, arm: str) -> set[tuple[str, str]]:
    """(orig's, arm's sha256 of the bytes sent) of every question the arm answered."""
    with sqlite3.connect(path) as conn:
        return set(conn.execute(
            "SELECT o.image_sha256, r.image_sha256 FROM answers o JOIN answers r ON r.nodeid = o.nodeid "
            "WHERE o.arm = 'orig' AND r.arm = ? AND o.status = 'ok' AND r.status = 'ok'", (arm,)))


def test_distortion_is_measured_once_per_pair_and_reused_by_the_next_run(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")
    shutil.copytree(BENCHMARKS, pytester.path / "benchmarks")
    first = pytester.runpytest_subprocess(*ARGS)
    assert first.ret == 0, first.stdout.str()
    store = _store(pytester)
    rows = _distortion_rows(store)
    pairs = _answer_pairs(store, "jpeg:quality=10")
    assert pairs and set(rows) == pairs  # one row per image of the run, each answer's pair has one
    for psnr, ssim, msssim, _ in rows.values():
        assert 15 < psnr < 40 and 0.2 < ssim < 0.99 and msssim is not None  # 256 px: MS-SSIM fits
    # the next run asks everything again (its images are prepared again) and adds an arm:
    # only the new arm's pairs are measured, the stored ones are not written again
    second = pytester.runpytest_subprocess(*ARGS, "--recon", "jpeg:quality=50", "--fresh")
    assert second.ret == 0, second.stdout.str()
    after = _distortion_rows(store)
    assert {k: after[k] for k in rows} == rows  # same values, same `created`: not measured again
    new = _answer_pairs(store, "jpeg:quality=50")
    assert set(after) - set(rows) == new and len(new) == len(pairs)
    assert all(after[k][0] > max(after[p][0] for p in pairs if p[0] == k[0]) for k in new)  # q50 beats q10


def test_a_weights_file_that_is_not_lpips_is_one_line(pytester: pytest.Pytester) -> None:
    pytest.importorskip("torch")
    pytester.makeini("[pytest]\n")
    shutil.copytree(BENCHMARKS, pytester.path / "benchmarks")
    weights = pytester.path / "alex.pth"
    weights.write_text("not a torch file")
    result = pytester.runpytest_subprocess(*ARGS, "--lpips-weights", str(weights))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = [line for line in result.errlines if line.strip()]
    assert len(lines) == 1, lines
    result.stderr.fnmatch_lines([f"ERROR: satbench: --lpips-weights {weights}: not a torch state dict (*"])


def _requests(path: Path) -> list[int]:
    """Chat requests each run sent, oldest run first."""
    with sqlite3.connect(path) as conn:
        return [n for (n,) in conn.execute(
            "SELECT COALESCE(SUM(t.requests), 0) FROM runs r LEFT JOIN run_traffic t ON t.run_id = r.run_id "
            "GROUP BY r.run_id ORDER BY r.started")]


def test_distortion_off_measures_nothing_and_a_later_run_measures_it_asking_nothing(pytester: pytest.Pytester) -> None:
    import json

    pytester.makeini("[pytest]\n")
    shutil.copytree(BENCHMARKS, pytester.path / "benchmarks")
    report = pytester.path / "reports" / "demo" / "default"
    off = pytester.runpytest_subprocess(*ARGS, "--distortion", "off")
    assert off.ret == 0, off.stdout.str()
    store = _store(pytester)
    assert _distortion_rows(store) == {}
    pairs = _answer_pairs(store, "jpeg:quality=10")
    assert pairs
    assert json.loads((report / "protocol.json").read_text())["distortion"] == {
        "measured": False, "lpips_weights_sha256": None}
    assert "Distortion: not measured (--distortion off)" in (report / "report.md").read_text()
    summary = json.loads((report / "summary.json").read_text())
    assert summary["distortion_flips"] == {"absent": "not measured (--distortion off)"}
    assert all(not row["psnr"] for row in _csv(report / "per_image.csv"))
    assert not any("psnr" in json.loads(line) for line in (report / "predictions.jsonl").read_text().splitlines())

    on = pytester.runpytest_subprocess(*ARGS)  # the default: on
    assert on.ret == 0, on.stdout.str()
    first, second = _requests(store)
    assert first > 0 and second == 0  # every answer reused
    assert set(_distortion_rows(store)) == pairs  # and every pair measured
    assert json.loads((report / "protocol.json").read_text())["distortion"]["measured"] is True
    assert "Distortion: not measured" not in (report / "report.md").read_text()
    assert all(float(row["psnr"]) > 15 for row in _csv(report / "per_image.csv"))


def _csv(path: Path) -> list[dict[str, str]]:
    import csv

    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_distortion_off_does_not_read_the_lpips_weights_and_says_so(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")
    shutil.copytree(BENCHMARKS, pytester.path / "benchmarks")
    weights = pytester.path / "alex.pth"
    weights.write_text("not a torch file")  # read, this would stop the start (the test above)
    result = pytester.runpytest_subprocess(*ARGS, "--distortion", "off", "--lpips-weights", str(weights))
    assert result.ret == 0, result.stdout.str()
    said = result.stdout.str() + result.stderr.str()
    assert f"--lpips-weights {weights}: not read, --distortion off measures no distortion" in said
    assert _distortion_rows(_store(pytester)) == {}
