"""The demo benchmark: generated aerial-like scenes in the RSVQA-LR on-disk format.

It needs no download: `prepare` writes ~40 scenes and ~400 questions into the session's
cache directory (`pytest_satbench.datasets.demo_scenes`), and they are read back by the real RSVQA loader,
so the demo exercises the same code path as RSVQA-LR. The bundled reference server
(`--servers builtin`) answers it from the pixels.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pytest_satbench.core.labels import Labels
from pytest_satbench.core.question import Question
from pytest_satbench.datasets.demo_scenes import DEMO_VERSION, write_demo_dataset
from pytest_satbench.datasets.registry import Benchmark, LoadRequest, register
from pytest_satbench.datasets.rsvqa import BINNED, RSVQA_VIEWS, load_rsvqa_split


def _load(req: LoadRequest) -> Iterator[Question]:
    yield from load_rsvqa_split(
        req.data_root,
        benchmark="demo",
        prefix="LR",
        split="test",
        image_dir="Images_LR",
        limit=req.limit,
        seed=req.seed,
    )


def _prepare(cache_dir: Path) -> Path:
    return write_demo_dataset(Path(cache_dir) / f"demo-v{DEMO_VERSION}")


DEMO = register(
    Benchmark(
        name="demo",
        kind="vqa",
        title="Demo: generated scenes in RSVQA-LR format (no download)",
        requires=("LR_split_test_questions.json", "LR_split_test_answers.json"),
        load=_load,
        types=("presence", "comp", "count", "rural_urban"),
        metric="exact match; overall and average accuracy",
        prepare=_prepare,
        score_views=RSVQA_VIEWS,
        # not RSVQA: no RSVQA figure is claimed; the per-type table and its overall row are
        # exact match, the binned view shows the counts in the RSVQA classes beside them
        labels=Labels(views=(BINNED,), table="exact match per question type (%)"),
    )
)
