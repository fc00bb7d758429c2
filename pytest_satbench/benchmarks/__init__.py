"""The benchmark suite of an install without a checkout (a wheel): `pytest --pyargs
pytest_satbench.benchmarks ...` collects `test_benchmarks.py` here, as `pytest benchmarks ...`
collects the checkout's `benchmarks/` folder. A package, not a module, so that node ids read
`test_benchmarks.py::test_demo[70]` (pytest names them relative to the folder it was given)."""
