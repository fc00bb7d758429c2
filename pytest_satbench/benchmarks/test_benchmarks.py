"""Every installed benchmark as a test, for an install without a checkout (a wheel):

    pytest --pyargs pytest_satbench.benchmarks -k demo --servers builtin --recon jpeg:quality=10

does what `pytest benchmarks -k demo ...` does in a checkout. One `test_<name>` per benchmark
the registry knows (the built-in ones and any a third-party package declares through the
`pytest_satbench.benchmarks` entry points), each `benchmark_test(name)` as in the checkout's
`benchmarks/test_*.py`. pytest's rootdir is then the folder pytest runs in, so the results
store and the demo's data live in its `.pytest_cache/` and the reports in its `reports/`."""

from __future__ import annotations

from pytest_satbench.datasets import registry
from pytest_satbench.plugin.items import BenchmarkTest, benchmark_test


def _declared() -> dict[str, BenchmarkTest]:
    return {f"test_{name}": benchmark_test(name) for name in registry.all_benchmarks()}


globals().update(_declared())
