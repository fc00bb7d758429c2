"""VRSBench: VQA and referring expressions."""

from pytest_satbench import benchmark_test

test_vrsbench = benchmark_test("vrsbench")
test_vrsbench_ref = benchmark_test("vrsbench_ref")
