"""RSVQA: low resolution (Sentinel-2) and high resolution (USGS, test sets 1 and 2)."""

from pytest_satbench import benchmark_test

test_rsvqa_lr = benchmark_test("rsvqa_lr")
test_rsvqa_hr = benchmark_test("rsvqa_hr")
test_rsvqa_hr_phili = benchmark_test("rsvqa_hr_phili")
