"""An unreadable record fails alone, as its own item, in a real run; the rest of the benchmark
runs, and the loader's notes are one line each."""

from __future__ import annotations

import json

import pytest
from datasets_fake import write_vrsbench
from servers import FakeVLM


def test_one_unreadable_record_fails_alone(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_bench='from pytest_satbench import benchmark_test\ntest_vrsbench_ref = benchmark_test("vrsbench_ref")\n')
    data = pytester.path / "data"
    write_vrsbench(data, n_images=2, vqa=False)
    path = data / "VRSBench" / "VRSBench_EVAL_referring.json"
    records = json.loads(path.read_text())
    records[1]["ground_truth"] = "no box here"  # unreadable
    del records[2]["unique"]  # readable: counts in All only, with a note
    path.write_text(json.dumps(records))
    with FakeVLM(["m"], answer=lambda p, h, i: "[0, 0, 1000, 1000]") as srv:
        result = pytester.runpytest("--servers", srv.url, "--data-root", str(data), "-q", "-p", "no:randomly", "-rf")
    out = result.stdout.str()
    failed = [line for line in out.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1 and "test_vrsbench_ref[record1]" in failed[0], failed
    assert "VRSBench_EVAL_referring.json" in out  # the failure names the file (and the record)
    assert "loading: no readable uniqueness flag" in out  # the readable oddity is a note, not a failure
    assert out.splitlines()[-1].startswith("1 failed") and f"{len(records) - 1} wrong" in out.splitlines()[-1]
