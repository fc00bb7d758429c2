"""Gates, the blind control arm, the noise floor and the protocol check, through real
pytest runs against loopback servers whose answers are controlled, so the expected
accuracies, deltas and verdicts are known in advance."""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path

import pytest
from datasets_fake import rsvqa_suite
from servers import FakeVLM

from pytest_satbench.core.gates import GATE_FAILED_EXIT, GateError, parse_gate

BENCH_MODULE = """
from pytest_satbench import benchmark_test
test_rsvqa_lr = benchmark_test("rsvqa_lr")
"""
N_IMAGES, PER_TYPE = 4, 2
N = N_IMAGES * 4 * PER_TYPE  # presence "yes", comp "no", count "403", rural_urban "urban"


@pytest.fixture
def data(pytester: pytest.Pytester) -> Path:
    return rsvqa_suite(pytester, BENCH_MODULE, n_images=N_IMAGES, per_type=PER_TYPE)


def by_arm(prompt: str, has_image: bool, image: bytes | None) -> str:
    """Right on everything with an image except that the recon arm (a smaller JPEG after
    quality-1 compression of noise) always answers 'no': presence regresses, comp stays."""
    if not has_image:
        return "no"  # the blind arm: right only on comp
    if "rural or an urban" in prompt:
        return "urban"
    if "number of roads" in prompt:
        return "403"
    if "more roads" in prompt:
        return "no"
    return "yes" if image and len(image) > 60_000 else "no"


def run(pytester: pytest.Pytester, url: str, data: Path, *args: str) -> pytest.RunResult:
    return pytester.runpytest("--servers", url, "--data-root", str(data), "-W",
                              "ignore::pytest.PytestAssertRewriteWarning", *args)


def test_gate_fails_with_its_own_exit_status_and_passes(pytester: pytest.Pytester, data: Path) -> None:
    with FakeVLM(models=["m"], answer=by_arm) as srv:
        failing = run(pytester, srv.url, data, "--recon", "jpeg:quality=1", "--gate", "rsvqa_lr:recon>=0.9",
                      "--gate", "rsvqa_lr/presence:delta>=-10", "--gate", "errors<=0")
        passing = run(pytester, srv.url, data, "--recon", "jpeg:quality=1", "--gate", "rsvqa_lr:recon>=0.7",
                      "--gate", "rsvqa_lr/count:delta==0", "--gate", "orig>=100%")
    # presence (1/4 of the questions) regresses: recon accuracy 0.75, presence delta -100 points
    assert failing.ret == GATE_FAILED_EXIT
    failing.stdout.fnmatch_lines([
        "rsvqa_lr:recon>=0.9 * FAIL * recon = 0.75 in rsvqa_lr, needs >= 0.9",
        "rsvqa_lr/presence:delta>=-10 * FAIL * delta = -100 in rsvqa_lr/presence, needs >= -10",
        "rsvqa_lr:errors<=0 * PASS *",
    ])
    assert passing.ret == 0
    passing.stdout.fnmatch_lines(["*rsvqa_lr:orig>=100% * PASS *"])


def test_a_bare_gate_reads_the_headline_the_terminal_prints(pytester: pytest.Pytester, data: Path) -> None:
    """RSVQA's headline counts a count answer in its class (0 / 1-10 / 11-100 / 101-1000 / >1000):
    '500' for 403 is right there and wrong by exact match. A bare gate reads the headline."""

    def in_class(prompt: str, has_image: bool, image: bytes | None) -> str:
        return "500" if "number of roads" in prompt else by_arm(prompt, has_image, image)

    with FakeVLM(models=["m"], answer=in_class) as srv:
        result = run(pytester, srv.url, data, "--gate", "rsvqa_lr:orig>=1.0", "--gate", "rsvqa_lr:exact:orig>=1.0",
                     "--gate", "rsvqa_lr/count:orig>=1.0", "--gate", "rsvqa_lr/count:exact:orig<=0",
                     "--gate", "rsvqa_lr:published:orig>=1.0")
    assert result.ret == GATE_FAILED_EXIT
    result.stdout.fnmatch_lines([
        "RSVQA overall accuracy (OA), original evaluation*", "*", "*", "  orig * 32 * 100.0 *",
        "rsvqa_lr:orig>=1.0 * PASS * overall_accuracy (headline) * orig = 1 in rsvqa_lr",
        "rsvqa_lr:exact:orig>=1.0 * FAIL * exact match * orig = 0.75 in rsvqa_lr, needs >= 1",
        "rsvqa_lr/count:orig>=1.0 * PASS * overall_accuracy (headline) * orig = 1 in rsvqa_lr/count",
        "rsvqa_lr/count:exact:orig<=0 * PASS * exact match * orig = 0 in rsvqa_lr/count",
        "rsvqa_lr:published:orig>=1.0 * PASS * published * orig = 1 in rsvqa_lr",
    ])
    summary = json.loads((pytester.path / "reports" / "rsvqa_lr" / "default" / "summary.json").read_text())
    assert summary["headline"] == "overall_accuracy"
    assert [g["figure"] for g in summary["gates"]] == [
        "overall_accuracy (headline)", "exact match", "overall_accuracy (headline)", "exact match", "published"]
    assert summary["aggregate_views"]["overall_accuracy"]["per_arm"]["orig"] == 1.0
    assert summary["statistics"]["overall"]["accuracy"]["orig"]["accuracy"] == 0.75
    assert "overall_accuracy" not in summary["statistics"]  # one key, one number


def test_gate_on_something_that_did_not_run_fails(pytester: pytest.Pytester, data: Path) -> None:
    pytester.makeini("[pytest]\nsatbench_gates =\n    vrsbench:orig>=0.5\n    rsvqa_lr/area:orig>=0.5\n    delta>=-5\n")
    with FakeVLM(models=["m"], answer=by_arm) as srv:
        result = run(pytester, srv.url, data)
    assert result.ret == GATE_FAILED_EXIT
    result.stdout.fnmatch_lines([
        "vrsbench:orig>=0.5 * FAIL * benchmark 'vrsbench' did not run",
        "rsvqa_lr/area:orig>=0.5 * FAIL * type 'area' did not run in rsvqa_lr",
        "rsvqa_lr:delta>=-5 * FAIL * no reconstruction arm ran in rsvqa_lr",
    ])


def test_failed_items_keep_exit_status_1_even_with_a_failed_gate(pytester: pytest.Pytester, data: Path) -> None:
    (data / "RSVQA-LR" / "Images_LR" / "10.tif").unlink()
    with FakeVLM(models=["m"], answer=by_arm) as srv:
        result = run(pytester, srv.url, data, "--gate", "orig>=1.0")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*FAIL*", "*gate(s) failed*"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("recon>>0.8", "expected *METRIC OP NUMBER, e.g.*"),
        ("accuracy>=0.8", "unknown metric 'accuracy'*"),
        ("delta>=-2%", "'%' only applies to accuracies*"),
    ],
)
def test_malformed_gates_are_usage_errors(pytester: pytest.Pytester, data: Path, text: str, message: str) -> None:
    with pytest.raises(GateError):
        parse_gate(text)
    result = pytester.runpytest("--gate", text)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --gate {text!r}: {message}"])


def test_blind_arm_measures_the_language_prior(pytester: pytest.Pytester, data: Path) -> None:
    with FakeVLM(models=["m"], answer=by_arm) as srv:
        result = run(pytester, srv.url, data, "--blind")
        assert sum(not r.has_image for r in srv.recorded) == N  # each question once without image
    assert result.ret == 0
    # blind answers "no": right only on the comp questions (a quarter)
    result.stdout.fnmatch_lines(["type * n * orig * blind *", "overall * 32 * 100.0 * 25.0 *"])


def test_repeat_orig_reports_the_noise_floor(pytester: pytest.Pytester, data: Path) -> None:
    asks: Counter[tuple[str, bytes | None]] = Counter()
    lock = threading.Lock()

    def flaky(prompt: str, has_image: bool, image: bytes | None) -> str:
        if "rural or an urban" in prompt:  # the second ask of each such question flips its answer
            with lock:  # (counted per question, so the order the asks arrive in does not matter)
                asks[prompt, image] += 1
                return "urban" if asks[prompt, image] % 2 == 1 else "rural"
        return by_arm(prompt, has_image, image)

    with FakeVLM(models=["m"], answer=flaky) as srv:
        result = run(pytester, srv.url, data, "--repeat-orig", "2", "--repeat-sample", str(N), "--concurrency", "1")
        assert srv.chat_requests == 2 * N
    n_rural = N_IMAGES * PER_TYPE
    result.stdout.fnmatch_lines([f"noise floor: the original asked 2x on {N} questions changed its verdict on {n_rural}*"])
    assert "(25.0%)" in result.stdout.str()
    summary = json.loads((pytester.path / "reports" / "rsvqa_lr" / "default" / "summary.json").read_text())
    assert summary["noise_floor"] == {"asks": 2, "questions": N, "flipped": n_rural, "flip_rate": 0.25}
    assert summary["arms"] == ["orig"]  # the repeats are not an arm of the comparison


def test_resume_under_a_tag_refuses_another_model(pytester: pytest.Pytester, data: Path) -> None:
    with FakeVLM(models=["model-a"], answer=by_arm) as a:
        assert run(pytester, a.url, data, "--tag", "base").ret == 0
    with FakeVLM(models=["model-b"], answer=by_arm) as b:
        refused = run(pytester, b.url, data, "--tag", "base")
        assert b.chat_requests == 0
        allowed = run(pytester, b.url, data, "--tag", "base", "--allow-protocol-change")
        other_tag = run(pytester, b.url, data, "--tag", "model-b")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["ERROR: satbench: --tag base was measured with model 'model-a', this run asks 'model-b'*"])
    assert allowed.ret == 0 and other_tag.ret == 0


def test_terminal_summary_fits_80_columns_with_many_arms(pytester: pytest.Pytester, data: Path) -> None:
    arms = ["jpeg:quality=10", "jpeg:quality=20", "jpeg:quality=30", "resize:factor=0.5", "identity"]
    with FakeVLM(models=["m"], answer=by_arm) as srv:
        result = run(pytester, srv.url, data, "--blind", "--repeat-orig", "2", "--repeat-sample", "4",
                     *[x for a in arms for x in ("--recon", a)])
    assert result.ret == 0
    lines = result.outlines
    start = next(i for i, line in enumerate(lines) if "satbench: rsvqa_lr" in line)
    summary = lines[start:-1]
    assert len(summary) > 30  # the tables, the paired blocks, the views, the noise floor
    too_wide = [line for line in summary if len(line) > 80 and not line.startswith("satbench: report written to")]
    assert not too_wide, too_wide
    # every arm is shown: the accuracy table is split into blocks rather than cut
    table = "\n".join(summary)
    for label in ("jpeg:q10", "jpeg:q20", "jpeg:q30", "rsz:0.5", "identity", "blind"):
        assert label in table
