"""pytest-satbench: remote-sensing VQA benchmarks as pytest items.

Public surface: `benchmark_test` (declare a benchmark in a test module), `Question` and
`ImageRef` (what loaders yield), `Benchmark` and `register` (declare a benchmark).

The names are imported on first use: the package is imported whenever pytest loads the
plugin, and importing it must pull in no layer (the layers' import rules hold for it too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_satbench._version import __version__

__all__ = ["Benchmark", "ImageRef", "Question", "benchmark_test", "register", "__version__"]

_PUBLIC = {
    "Benchmark": "pytest_satbench.datasets.registry",
    "register": "pytest_satbench.datasets.registry",
    "ImageRef": "pytest_satbench.core.question",
    "Question": "pytest_satbench.core.question",
    "benchmark_test": "pytest_satbench.plugin.items",
}

if TYPE_CHECKING:
    from pytest_satbench.core.question import ImageRef, Question
    from pytest_satbench.datasets.registry import Benchmark, register
    from pytest_satbench.plugin.items import benchmark_test


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_satbench' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
