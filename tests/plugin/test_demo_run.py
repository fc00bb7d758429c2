"""The demo as a user runs it: the bundled reference server (`--servers builtin`) and the
generated demo data, through the suite's own benchmark module."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_the_builtin_server_keeps_one_name_across_runs(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")
    shutil.copytree(BENCHMARKS, pytester.path / "benchmarks")
    args = ("benchmarks", "-k", "demo", "--servers", "builtin", "--recon", "jpeg:quality=10", "--limit", "20",
            "-p", "no:randomly", "-W", "ignore::pytest.PytestAssertRewriteWarning")
    first = pytester.runpytest_subprocess(*args)
    # the second run starts its own server on another port and re-asks everything
    second = pytester.runpytest_subprocess(*args, "--fresh")
    assert first.ret == second.ret == 0, second.stdout.str()
    header = [line for line in first.outlines if line.startswith("satbench: servers:")]
    assert header and "data root: not set (the demo needs none; the others: --data-root or " in header[0]
    usage = json.loads((pytester.path / "reports" / "demo" / "default" / "summary.json").read_text())["usage"]
    assert list(usage["by_server"]) == ["builtin reference server"]
    assert usage["by_server"]["builtin reference server"]["answers"] == 40  # 20 questions x 2 arms
