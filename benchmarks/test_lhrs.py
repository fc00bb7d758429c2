"""LHRS-Bench: single-choice questions, answered with the option letter."""

from pytest_satbench import benchmark_test

test_lhrs = benchmark_test("lhrs")
