"""A real pytest run (pytester, in-process) of the demo benchmark through the plugin with a
tiny random One-D-Piece checkpoint: token-budget arms, one encoder pass per crop, and the
disk cache sparing the tokenizer on a second run."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from pytest_satbench.codecs.onedpiece import engine as engine_mod
from pytest_satbench.codecs.onedpiece.checkpoint import save_random_checkpoint
from pytest_satbench.codecs.onedpiece.model import tiny_config

BENCH_MODULE = """
from pytest_satbench import benchmark_test
test_demo = benchmark_test("demo")
"""


def test_demo_through_the_plugin_with_onedpiece(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    ckpt = save_random_checkpoint(tmp_path / "tiny.bin", tiny_config(), seed=0)
    pytester.makepyfile(test_bench=BENCH_MODULE)

    runs: list[tuple[int, int]] = []  # (crops encoded, crops decoded) per Reconstructor.run
    real_run = engine_mod.Reconstructor.run

    def counting_run(self: engine_mod.Reconstructor, crops):  # type: ignore[no-untyped-def]  # a stand-in with the method's signature
        out = real_run(self, crops)
        runs.append((len(crops), len(crops) * len(self.budgets)))
        return out

    monkeypatch.setattr(engine_mod.Reconstructor, "run", counting_run)
    args = (
        "-q", "--servers", "builtin", "--limit", "12",
        "--recon", f"onedpiece:ckpt={ckpt}", "--nlatent", "4,16", "--recon-device", "cpu",
        "-W", "ignore::pytest.PytestAssertRewriteWarning",
    )
    first = pytester.runpytest(*args)
    assert first.ret == 0, first.stdout.str()
    out = first.stdout.str()
    for k in (4, 16):
        assert f"nlatent={k},variant=custom vs orig" in out
    assert runs, "the tokenizer never ran"
    encoded = sum(e for e, _ in runs)
    assert sum(d for _, d in runs) == 2 * encoded  # two budgets, one encoder pass

    # Asking again (--fresh) needs every reconstruction again: all from the disk cache.
    runs.clear()
    second = pytester.runpytest(*args, "--fresh")
    assert second.ret == 0, second.stdout.str()
    assert runs == []
