"""The one place benchmarks are registered.

A benchmark is declared by one small module in `pytest_satbench/datasets/` (or any installed
package that exposes the entry point group `pytest_satbench.benchmarks`): it builds a
`Benchmark` and calls `register()`. The plugin core never names a benchmark.
"""

from __future__ import annotations

import hashlib
import importlib
import pkgutil
import random
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path

from pytest_satbench.core.question import Kind, Question


class DatasetError(Exception):
    """A dataset file or record is malformed. The message names the file and the record."""


@dataclass(frozen=True, slots=True)
class LoadRequest:
    data_root: Path
    limit: int | None = None  # stratified by question type, fixed seed
    seed: int = 0


@dataclass(frozen=True)
class Benchmark:
    """A declarative benchmark: where its files are, how to read them, how to score them."""

    name: str  # node ids and -k use it: test_<name>[<key>]
    kind: Kind
    title: str  # one line for the header and the README table
    # Paths (relative to the data root) the benchmark needs; glob patterns allowed. When one
    # is missing the benchmark is left out with one line saying where it looked.
    requires: tuple[str, ...]
    load: Callable[[LoadRequest], Iterator[Question]]
    types: tuple[str, ...] = ()  # declared question types, in table order
    metric: str = "accuracy"
    # Optional grouping of raw types into reported types (VRSBench merges three into one).
    type_groups: tuple[tuple[str, str], ...] = ()
    # The files load() reads. When given, loaded questions are cached keyed by their size
    # and mtime (datacache.py), so reruns skip parsing large JSON files.
    sources: Callable[[Path], list[Path]] | None = None
    # Generated benchmarks (the demo) make their own files: given a writable cache
    # directory, prepare() writes them if needed and returns the data root to load from.
    prepare: Callable[[Path], Path] | None = None
    extra: dict[str, object] = field(default_factory=dict)
    # For benchmarks with alternative on-disk layouts (LHRS-Bench: parquet or the original
    # qa.json release), `requires` (all-of) cannot express "one of". When set, `locate`
    # replaces it: given the data root it returns the paths it looked for and did not find
    # (empty list: loadable).
    locate: Callable[[Path], list[Path]] | None = None

    def missing(self, data_root: Path) -> list[Path]:
        """Required paths that are absent under `data_root` (empty list: all present)."""
        if self.locate is not None:
            return self.locate(data_root)
        absent = []
        for rel in self.requires:
            if any(ch in rel for ch in "*?["):
                if not any(data_root.glob(rel)):
                    absent.append(data_root / rel)
            elif not (data_root / rel).exists():
                absent.append(data_root / rel)
        return absent

    def reported_type(self, raw: str) -> str:
        for src, dst in self.type_groups:
            if raw == src:
                return dst
        return raw


_REGISTRY: dict[str, Benchmark] = {}
_loaded = False


def register(benchmark: Benchmark) -> Benchmark:
    if benchmark.name in _REGISTRY and _REGISTRY[benchmark.name] is not benchmark:
        raise ValueError(f"benchmark {benchmark.name!r} is registered twice")
    _REGISTRY[benchmark.name] = benchmark
    return benchmark


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    from pytest_satbench import datasets

    for mod in pkgutil.iter_modules(datasets.__path__):
        importlib.import_module(f"{datasets.__name__}.{mod.name}")
    for ep in entry_points(group="pytest_satbench.benchmarks"):
        ep.load()


def get(name: str) -> Benchmark:
    _load_all()
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise KeyError(f"unknown benchmark {name!r}; known: {known}") from None


def all_benchmarks() -> dict[str, Benchmark]:
    _load_all()
    return dict(_REGISTRY)


def stratified_limit(
    questions: Iterable[Question], limit: int | None, seed: int = 0
) -> list[Question]:
    """Keep about `limit` questions, the same number from each question type.

    The seed script's rule: `per = max(1, limit // n_types)` questions drawn from each type
    with `random.Random(seed).sample`, types in order of first appearance, so a given file
    and limit always select the same questions.
    """
    qs = list(questions)
    if not limit:
        return qs
    by_type: dict[str, list[Question]] = defaultdict(list)
    for q in qs:
        by_type[q.type].append(q)
    rng = random.Random(seed)
    per = max(1, limit // len(by_type)) if by_type else 0
    chosen: list[Question] = []
    for group in by_type.values():
        chosen += rng.sample(group, min(per, len(group)))
    return chosen


def sort_by_image(questions: Iterable[Question]) -> list[Question]:
    """Order items by image so the per-image reconstruction cache stays hot.

    Sorted by (image id, key) with numeric-aware comparison, so the order is stable across
    runs and independent of file order.
    """

    def natural(s: str) -> tuple[int, int | str]:
        return (0, int(s)) if s.isdigit() else (1, s)

    by_image: dict[str, tuple[int, int | str]] = {}  # ~100 questions share each image

    def key(q: Question) -> tuple[tuple[int, int | str], tuple[int, int | str]]:
        image = by_image.get(q.image.id)
        if image is None:
            image = by_image[q.image.id] = natural(q.image.id)
        return image, natural(q.key)

    return sorted(questions, key=key)


def repeat_sample(questions: list[Question], n: int) -> set[tuple[str, str]]:
    """A fixed pseudo-random sample (by hash of benchmark and key), spread over images."""
    ranked = sorted(questions, key=lambda q: hashlib.sha1(f"{q.benchmark}:{q.key}".encode()).hexdigest())
    return {(q.benchmark, q.key) for q in ranked[:n]}
