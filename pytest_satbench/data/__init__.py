"""The benchmarks' official data: `python -m pytest_satbench.data fetch|list|verify`
(docs/data.md). `datasets/sources.py` is the table, `transfer.py` the downloader, lock file and
unpacking, `fetch.py` the two commands."""
