"""The source table (pytest_satbench/datasets/sources.py) is checked for completeness, not by
downloading: the real hosts cannot be reached from CI."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import PurePosixPath

from pytest_satbench.data.fetch import source_rows
from pytest_satbench.datasets.registry import all_benchmarks
from pytest_satbench.datasets.sources import HUB, SOURCES, ZENODO, for_benchmark


def test_every_benchmark_with_public_data_has_a_source():
    # the package's own benchmarks (a third-party one declares its sources itself)
    public = [name for name, b in all_benchmarks().items()
              if b.prepare is None and b.load.__module__.startswith("pytest_satbench.")]
    assert public, "the registry lists no benchmark with public data"
    assert [n for n in public if for_benchmark(n) is None] == []
    # and no source names a benchmark the registry does not know
    assert {b for s in SOURCES for b in s.benchmarks} <= set(all_benchmarks())


def test_every_entry_has_a_url_a_checksum_policy_and_a_place_the_loader_reads():
    benchmarks = all_benchmarks()
    for s in SOURCES:
        assert s.host in ("zenodo", "hub") and s.record and s.licence and s.homepage.startswith("https://")
        if s.host == "zenodo":
            assert s.record.isdigit() and s.revision == ""
        else:  # a pinned commit, or a revision pinned at first use with the reason said
            assert re.fullmatch(r"[0-9a-f]{40}", s.revision) or s.pin, s.name
        # the folders the loaders read (their `requires`) are where the files go
        tops = {PurePosixPath(r).parts[0] for b in s.benchmarks for r in benchmarks[b].requires}
        for f in s.files:
            assert f.path and f.kind in ("file", "zip", "tar"), (s.name, f)
            assert PurePosixPath(f.dest).parts[0] in tops, (s.name, f.dest, tops)
            assert f.kind == "file" or f.top, (s.name, f)  # an archive names the folder it must give
            # a checksum is a value found (cited in sources.py) or none: never a placeholder
            assert f.checksum is None or re.fullmatch(r"md5:[0-9a-f]{32}|sha256:[0-9a-f]{64}", f.checksum)
            assert set(f.only) <= set(s.benchmarks)
        for lst in s.listings:
            assert s.host == "hub" and PurePosixPath(lst.dest).parts[0] in tops
    for row in source_rows():
        assert row["url"].startswith((ZENODO, HUB)) and row["dest"] and row["checksum"]


def test_list_prints_the_table_from_an_installed_module():
    done = subprocess.run([sys.executable, "-m", "pytest_satbench.data", "list"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "https://zenodo.org/records/6344334/files/Images_LR.zip -> RSVQA-LR/Images_LR" in done.stdout
    assert f"revision {next(s for s in SOURCES if s.name == 'vrsbench').revision}" in done.stdout
