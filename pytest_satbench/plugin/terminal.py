"""The terminal summary: per benchmark the tables of `core.text_summary`, then one line on
where the answers came from. Everything shown is computed from the store's rows by
`core.results`, the same records the gates and the report files use."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_satbench.core import formatting as F
from pytest_satbench.core import text_summary
from pytest_satbench.core.results import BenchmarkResult


def render(tr: Any, results: Sequence[BenchmarkResult], model: str | None) -> None:
    if not results:
        return
    for result in results:
        tr.write_sep("=", f"satbench: {result.benchmark}")
        for line in text_summary.render(result):
            tr.write_line(line)
    asked = sum(r.usage.asked for r in results)
    reused = sum(r.usage.reused for r in results)
    for line in F.prose(
        f"answers: {asked} asked this run, {reused} reused from the store" + (f"; model {model}" if model else "")
    ):
        tr.write_line(line)
