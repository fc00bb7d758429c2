"""pytest-satbench: remote-sensing VQA benchmarks as pytest items.

Public surface: `benchmark_test` (declare a benchmark in a test module), `Question` and
`ImageRef` (what loaders yield), `Benchmark` and `register` (declare a benchmark).
"""

from .collection import benchmark_test
from .question import ImageRef, Question
from .registry import Benchmark, register

__version__ = "0.1.0"
__all__ = ["Benchmark", "ImageRef", "Question", "benchmark_test", "register", "__version__"]
