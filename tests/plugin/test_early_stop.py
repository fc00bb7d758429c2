"""--precision / --margin end to end: real pytest runs against a loopback server whose
original and reconstruction accuracies are known in advance.

The benchmark: 200 images of 4 questions (2 presence, 2 comp). The original arm is always
right. The reconstruction (JPEG quality 1, told apart by its size: a smooth image is a small
JPEG) is wrong on both presence questions of even images and on one of odd images: each
image loses 1 or 2 of its 4 questions, so the complete run's delta is -37.5 points exactly,
and the sequence narrows fast (an image's delta varies little). With `--concurrency 2`
the look-ahead may run 2 images ahead of the rule (`core.early_stop.lag_images`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from datasets_fake import write_rsvqa_counts
from servers import FakeVLM

BENCH_MODULE = """
from pytest_satbench import benchmark_test
test_rsvqa_lr = benchmark_test("rsvqa_lr")
"""
N_IMAGES, PER_IMAGE = 200, 4
N = N_IMAGES * PER_IMAGE
TRUE_DELTA = -37.5
RECON = "jpeg:quality=1"
QUESTION = re.compile(r"(in the image|water areas) (\d+)\?")


def answer(prompt: str, has_image: bool, image: bytes | None) -> str:
    presence = "residential building" in prompt
    right = "yes" if presence else "no"
    wrong = "no" if presence else "yes"
    recon = image is not None and len(image) < 1200
    if not recon or not presence:
        return right
    k = int(QUESTION.search(prompt).group(2))  # presence question k is about image k % 200
    if (k % N_IMAGES) % 2 == 0 or k < N_IMAGES:
        return wrong
    return right


@pytest.fixture
def data(pytester: pytest.Pytester) -> Path:
    pytester.makepyfile(test_bench=BENCH_MODULE)
    root = pytester.path / "data"
    write_rsvqa_counts(root, {"presence": N // 2, "comp": N // 2},
                       n_images=N_IMAGES, image_size=32)
    return root


def run(pytester: pytest.Pytester, url: str, data: Path, *args: str, recon: tuple[str, ...] = ("--recon", RECON)
        ) -> pytest.RunResult:
    return pytester.runpytest("--servers", url, "--data-root", str(data), *recon, "--concurrency", "2",
                              "--bootstrap", "50", "-p", "no:randomly", "-rs", "-W",
                              "ignore::pytest.PytestAssertRewriteWarning", *args)


def summary(pytester: pytest.Pytester) -> dict:
    return json.loads((pytester.path / "reports" / "rsvqa_lr" / "default" / "summary.json").read_text())


def check_stopped_run(pytester: pytest.Pytester, result: pytest.RunResult, rule: str) -> dict:
    """A run stopped by the rule: exit 0, the questions not needed skipped with the reason,
    and summary.json's sequence contains the complete run's delta."""
    assert result.ret == 0, result.stdout.str()[-2000:]
    seq = summary(pytester)["sequential"]
    assert seq["stopped"] and seq["rule"] == rule
    assert seq["images_total"] == N_IMAGES and seq["questions_total"] == N
    assert 50 <= seq["images_answered"] < N_IMAGES and seq["questions_answered"] == PER_IMAGE * seq["images_answered"]
    lo, hi = seq["arms"][RECON]["cs"]
    assert lo <= TRUE_DELTA <= hi
    assert seq["order"] == {"kind": "random", "seed": 0}
    counts = result.parseoutcomes()
    asked = N - counts["skipped"]
    assert asked == seq["questions_answered"]  # every question asked is in the sequence
    result.stdout.fnmatch_lines([f"SKIPPED [[]{counts['skipped']}[]] *: not needed: {seq['reason']}"])
    assert re.match(rf"{rule.split(' or ')[0].split()[0]} .* after \d+ of {N_IMAGES} images", seq["reason"]) or "margin" in seq["reason"]
    return seq


def test_precision_stops_early_a_rerun_sends_nothing_and_the_run_without_it_completes(
        pytester: pytest.Pytester, data: Path) -> None:
    with FakeVLM(models=["m"], answer=answer) as srv:
        first = run(pytester, srv.url, data, "--precision", "10")
        seq = check_stopped_run(pytester, first, "precision 10.0")
        assert seq["reason"].startswith("precision 10.0 reached after ")
        asked = seq["questions_answered"]
        assert srv.chat_requests == 2 * asked  # nothing past what the rule and its lag needed
        # the terminal says it, with the sequence and the fixed-sample intervals' caveat
        lo, hi = seq["arms"][RECON]["cs"]
        first.stdout.fnmatch_lines([
            "*- satbench early stopping -*",
            f"rsvqa_lr: precision 10.0: stopped, {seq['reason']}; {seq['images_answered']}/200 images, "
            f"{asked}/{N} questions answered; jpeg:q1 delta {seq['arms'][RECON]['delta']:+.1f} [[]{lo:+.1f}, {hi:+.1f}[]]",
            "in brackets: 95% confidence sequences, valid at every look; the fixed-sample 95% CIs above are not "
            "valid after an early stop",
        ])

        # skips are not "last failed", nor items the run never reached
        lastfailed = pytester.path / ".pytest_cache" / "v" / "cache" / "lastfailed"
        assert not lastfailed.exists() or json.loads(lastfailed.read_text()) == {}
        assert "never reached" not in first.stdout.str()

        again = run(pytester, srv.url, data, "--precision", "10")
        assert again.ret == 0
        assert srv.chat_requests == 2 * asked  # the same command again sends nothing
        assert again.parseoutcomes()["skipped"] == N - asked
        assert summary(pytester)["sequential"] == {**seq}  # and reports the same sequence
        with_lf = run(pytester, srv.url, data, "--precision", "10", "--lf")
        assert with_lf.ret == 0 and srv.chat_requests == 2 * asked  # --lf: nothing failed, nothing to ask

        complete = run(pytester, srv.url, data)
        assert complete.ret == 0
        assert srv.chat_requests == 2 * N  # only the rest was asked
        assert "skipped" not in complete.parseoutcomes()
        full = summary(pytester)
        assert full["sequential"] is None
        assert full["statistics"]["overall"]["paired"][RECON]["delta"] == pytest.approx(TRUE_DELTA)
        assert full["questions"] == N and full["not_run"] == 0



def test_margin_decides_and_stops(pytester: pytest.Pytester, data: Path) -> None:
    """-37.5 is far below -20: the margin is decided "worse" long before the end."""
    with FakeVLM(models=["m"], answer=answer) as srv:
        result = run(pytester, srv.url, data, "--margin", "20")
        seq = check_stopped_run(pytester, result, "margin 20.0")
        assert seq["reason"].startswith("margin 20.0 decided after ")
        assert seq["arms"][RECON]["margin"] == "worse"
        result.stdout.fnmatch_lines(["rsvqa_lr: margin 20.0: stopped, margin 20.0 decided after * of 200 images; * jpeg:q1 delta -* (worse)"])
        assert srv.chat_requests == 2 * seq["questions_answered"]


def test_under_xdist_the_controller_decides_for_its_workers(pytester: pytest.Pytester, data: Path) -> None:
    """-n 2: each worker sees half the images; the controller applies the rule to all of them,
    the workers skip what it says is not needed, and the images asked are the same as
    without xdist (the rule and its lag decide them, not the timing)."""
    pytest.importorskip("xdist")
    with FakeVLM(models=["m"], answer=answer) as srv:
        single = run(pytester, srv.url, data, "--precision", "10", "--tag", "single")
        assert single.ret == 0
        asked_single = srv.chat_requests
        seq_single = json.loads((pytester.path / "reports" / "rsvqa_lr" / "single" / "summary.json").read_text())["sequential"]
        result = run(pytester, srv.url, data, "--precision", "10", "-n", "2", "--fresh")
        seq = check_stopped_run(pytester, result, "precision 10.0")
        assert srv.chat_requests - asked_single == asked_single
        assert seq["reason"] == seq_single["reason"] and seq["arms"] == seq_single["arms"]

        again = run(pytester, srv.url, data, "--precision", "10", "-n", "2")
        assert again.ret == 0
        assert srv.chat_requests - asked_single == asked_single  # a rerun sends nothing
        complete = run(pytester, srv.url, data, "-n", "2")
        assert complete.ret == 0
        assert srv.chat_requests - asked_single == 2 * N  # only the rest
        assert summary(pytester)["statistics"]["overall"]["paired"][RECON]["delta"] == pytest.approx(TRUE_DELTA)


def test_the_report_shows_the_sequences_and_labels_the_intervals(pytester: pytest.Pytester, data: Path) -> None:
    with FakeVLM(models=["m"], answer=answer) as srv:
        result = run(pytester, srv.url, data, "--margin", "20", "--precision", "10")
    seq = check_stopped_run(pytester, result, "precision 10.0 or margin 20.0")
    folder = pytester.path / "reports" / "rsvqa_lr" / "default"
    md = (folder / "report.md").read_text()
    html = (folder / "report.html").read_text()
    lo, hi = seq["arms"][RECON]["cs"]
    for text in (md, html):
        assert "Early stopping" in text and f"Stopped early: {seq['reason']}" in text
        assert f"[{lo:+.1f},{hi:+.1f}]" in text  # the sequence, next to the paired figure too
        assert "not valid after an early stop" in text
        assert "random order (seed 0)" in text
        assert "Images asked in random order (seed 0), each image" in text
    protocol = json.loads((folder / "protocol.json").read_text())
    assert protocol["order"] == {"kind": "random", "seed": 0}
    plan = protocol["sequential"]["rsvqa_lr"]
    assert len(plan["images"]) == N_IMAGES and plan["precision"] == 10.0 and plan["margin"] == 20.0


def test_the_progress_line_shows_the_running_delta_and_the_images_to_go(
        pytester: pytest.Pytester, data: Path) -> None:
    from pytest_satbench.plugin.progress import Progress, format_progress

    p = Progress(answered=120, total=800, elapsed_s=5, rate=24.0,
                 sequential="rsvqa_lr: jpeg:quality=1 delta -38.1 ±4.8; ~3 more of 200 images for precision 10.0")
    assert format_progress(p) == ("satbench: 120/800 answered (15.0%) · 24.0 q/s · 5s elapsed · ETA 29s · "
                                  "rsvqa_lr: jpeg:quality=1 delta -38.1 ±4.8; ~3 more of 200 images for precision 10.0")
    with FakeVLM(models=["m"], answer=answer, delay=0.01) as srv:
        result = run(pytester, srv.url, data, "--precision", "10", "--progress-every", "1")
    assert result.ret == 0
    lines = [line for line in result.outlines if line.startswith("satbench: ") and " answered " in line]
    assert lines, result.stdout.str()[-3000:]
    assert any(re.search(r"rsvqa_lr: jpeg:quality=1 delta [-+]\d+\.\d( ±\d+\.\d| \(sequence from 50 images\))", line)
               for line in lines), lines


def collected(pytester: pytest.Pytester, data: Path, *args: str) -> list[str]:
    result = pytester.runpytest("--data-root", str(data), "--collect-only", "-q", "-p", "no:randomly", *args)
    assert result.ret == 0
    return [line for line in result.outlines if "::test_rsvqa_lr[" in line]


def test_random_order_keeps_each_images_questions_together_and_is_seeded(pytester: pytest.Pytester, data: Path) -> None:
    dataset = collected(pytester, data)
    assert collected(pytester, data, "--order", "dataset") == dataset
    random0 = collected(pytester, data, "--order", "random")
    assert collected(pytester, data, "--order", "random", "--seed", "0") == random0  # the default seed
    random1 = collected(pytester, data, "--order", "random", "--seed", "1")
    assert sorted(random0) == sorted(dataset) == sorted(random1)
    assert len({random0[0], dataset[0], random1[0]}) == 3  # three orders

    def image_of(nodeid: str) -> int:
        qid = int(nodeid.rsplit("[", 1)[1].rstrip("]"))
        return (qid - 3) % N_IMAGES  # write_rsvqa_counts: 3 stubs, then round-robin over the images

    for order in (random0, random1):
        images = [image_of(n) for n in order]
        runs = [img for i, img in enumerate(images) if i == 0 or images[i - 1] != img]
        assert len(runs) == N_IMAGES  # every image's questions in one run
    # a stopping rule makes random the default; an explicit --order wins
    assert collected(pytester, data, "--precision", "4") == random0
    assert collected(pytester, data, "--precision", "4", "--order", "dataset") == dataset


def test_without_a_reconstruction_arm_the_accuracy_decides(pytester: pytest.Pytester, data: Path) -> None:
    """The original is always right: the accuracy's sequence is [100, 100] once 50 images are in."""
    with FakeVLM(models=["m"], answer=answer) as srv:
        result = run(pytester, srv.url, data, "--precision", "1", recon=())
    assert result.ret == 0
    seq = summary(pytester)["sequential"]
    assert seq["reason"] == "precision 1.0 reached after 50 of 200 images"
    assert seq["arms"] == {"orig": {"accuracy": 100.0, "cs": [100.0, 100.0]}}
    result.stdout.fnmatch_lines([f"rsvqa_lr: precision 1.0: stopped, {seq['reason']}; {seq['images_answered']}/200 "
                                 f"images, {seq['questions_answered']}/800 questions answered; orig accuracy 100.0 "
                                 "[[]100.0, 100.0[]]"])
    assert srv.chat_requests == seq["questions_answered"] == PER_IMAGE * seq["images_answered"]


def test_dataset_order_under_a_rule_is_allowed_with_a_warning(pytester: pytest.Pytester, data: Path) -> None:
    with FakeVLM(models=["m"], answer=answer) as srv:
        result = run(pytester, srv.url, data, "--precision", "10", "--order", "dataset")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["satbench: WARNING: --precision with --order dataset: *not a sample*"])
    assert summary(pytester)["sequential"]["order"] == {"kind": "dataset"}
