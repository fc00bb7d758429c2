"""Benchmarks are found through the entry-point group `pytest_satbench.benchmarks`, the
built-in ones as well as a third party's: a new benchmark is one module and one entry point,
and its own labels and views reach the terminal without any core module naming it.

The third-party case is a real distribution (a `.dist-info` folder) on the path of a real
pytest run in a subprocess, against a real loopback server.
"""

from __future__ import annotations

import os
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from servers import FakeVLM

from pytest_satbench.datasets import registry

ACME = '''
from __future__ import annotations

import io

from PIL import Image

from pytest_satbench.core.labels import Labels, ViewLabel
from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.core.scoring import View
from pytest_satbench.datasets.registry import Benchmark, register
from pytest_satbench.datasets.rsvqa import binned  # RSVQA's count classes: the rule the view runs


def _image(value: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (value, value, value)).save(buf, format="PNG")
    return buf.getvalue()


def load(req):
    for i in range(6):
        answer = str(5 * i)
        yield Question(benchmark="acme", key=str(i), image=ImageRef(id=str(i % 3), data=_image(40 * i)),
                       text="How many ships?", answer=answer, types=("count",))


register(Benchmark(
    name="acme", kind="vqa", title="Acme ship counts", requires=(), load=load,
    prepare=lambda cache: cache, score_views=frozenset({View("binned", binned)}),
    labels=Labels(overall="Acme OA", views=(ViewLabel("binned", "binned: Acme's count classes", "Acme binned"),)),
))
'''


def _site(root: Path) -> Path:
    root.mkdir()
    (root / "acme_bench.py").write_text(ACME)
    info = root / "acme_bench-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-bench\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[pytest_satbench.benchmarks]\nacme = acme_bench\n")
    return root


def test_builtin_benchmarks_come_from_the_entry_points() -> None:
    declared = {ep.value for ep in entry_points(group=registry.ENTRY_POINT_GROUP)}
    assert "pytest_satbench.datasets.rsvqa" in declared
    known = registry.all_benchmarks()
    assert {"demo", "rsvqa_lr", "rsvqa_hr", "lhrs", "vrsbench", "vrsbench_ref"} <= set(known)
    # what a benchmark's paper calls its numbers lives with the benchmark
    assert known["rsvqa_lr"].labels.overall.startswith("RSVQA overall accuracy")
    assert known["vrsbench"].score_views == frozenset({"official"})


def test_a_third_party_benchmark_needs_only_its_entry_point(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    site = _site(tmp_path / "site")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    pytester.makepyfile(test_acme=textwrap.dedent("""
        from pytest_satbench import benchmark_test
        test_acme = benchmark_test("acme")
    """))
    with FakeVLM(models=["m"], answer=lambda prompt, has_image, image: "12") as srv:
        result = pytester.runpytest_subprocess("--servers", srv.url, "-q", "-p", "no:cacheprovider")
    out = result.stdout.str()
    assert "satbench: acme" in out, out
    assert "view binned: Acme's count classes (%)" in out
    assert result.ret == 0
    # answers 0, 5, 10, 15, 20, 25 vs "12": none exact; binned class 11-100 holds 15, 20, 25
    result.stdout.fnmatch_lines(["overall *6 *0.0*", "overall *6 *50.0*"])
