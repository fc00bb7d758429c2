"""pytest-satbench: remote-sensing VQA benchmarks as pytest items.

Public surface: `benchmark_test` (declare a benchmark in a test module), `Question` and
`ImageRef` (what loaders yield), `Benchmark` and `register` (declare a benchmark).
"""

from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.datasets.registry import Benchmark, register
from pytest_satbench.plugin.items import benchmark_test

__version__ = "0.1.0"
__all__ = ["Benchmark", "ImageRef", "Question", "benchmark_test", "register", "__version__"]
