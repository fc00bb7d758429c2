"""Benchmark runs keep their own pytest cache (results store, demo data, reconstruction
cache) under benchmarks/, apart from the project's unit tests."""
