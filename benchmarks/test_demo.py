"""The bundled demo: generated aerial-like scenes in the RSVQA-LR format, answered by the
reference server (`--servers builtin`)."""

from pytest_satbench import benchmark_test

test_demo = benchmark_test("demo")
