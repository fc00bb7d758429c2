"""Benchmark declarations, one small module per family. Each module registers its
benchmarks with `pytest_satbench.datasets.registry.register` on import."""
