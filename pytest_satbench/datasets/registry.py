"""The one place benchmarks are registered.

A benchmark is declared by one small module that builds a `Benchmark` and calls `register()`,
named in the entry point group `pytest_satbench.benchmarks` (this package declares its own
modules there too). Nothing outside the benchmark's module names it: its labels, the views
its official evaluation adds and its type grouping are fields of its `Benchmark`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path

from pytest_satbench.core.labels import Labels
from pytest_satbench.core.question import Kind, Question


class DatasetError(Exception):
    """A dataset file or record is malformed. The message names the file and the record."""


class RecordErrors(DatasetError):
    """Some records of a file cannot be read at all; the rest can. Raised once the whole
    file is read: `questions` are the readable records' questions, `failed` one (item key,
    one-line message) per unreadable record, so each can fail alone. Its message is the
    first failure's (and how many more), which is what a caller that treats any
    `DatasetError` as "the benchmark fails" shows."""

    def __init__(self, questions: list[Question], failed: list[tuple[str, str]]) -> None:
        more = f" (and {len(failed) - 1} more unreadable record{'s' if len(failed) > 2 else ''})" if len(failed) > 1 else ""
        super().__init__(failed[0][1] + more)
        self.questions = questions
        self.failed = failed



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
    title: str  # one line for the header and the benchmarks table (docs/datasets.md)
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
    # The per-question views its official evaluation adds: `core.scoring.View`s, each its
    # name with its rule, a pure function of (question, reply, options) declared in the
    # benchmark's module (they reach the scorer as `ScoreOptions.views`); and the names its
    # paper gives the headline numbers and those views.
    score_views: frozenset[str] = frozenset()
    labels: Labels = Labels()
    # the labels of a run that asked an LLM judge (`--judge`), where its evaluation has one
    judged_labels: Labels | None = None

    def __post_init__(self) -> None:
        # a `core.scoring.View` carries its rule (not imported here: the registry stays light)
        bare = sorted(v for v in self.score_views if not callable(getattr(v, "rule", None)))
        if bare:
            raise TypeError(
                f"benchmark {self.name!r}: score view {bare[0]!r} is a bare name; declare it with its rule, "
                f"View({bare[0]!r}, rule) (core.scoring.View), in the benchmark's module")

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


ENTRY_POINT_GROUP = "pytest_satbench.benchmarks"
_REGISTRY: dict[str, Benchmark] = {}
_loaded = False


def register(benchmark: Benchmark) -> Benchmark:
    if benchmark.name in _REGISTRY and _REGISTRY[benchmark.name] is not benchmark:
        raise ValueError(f"benchmark {benchmark.name!r} is registered twice")
    _REGISTRY[benchmark.name] = benchmark
    return benchmark


def _load_all() -> None:
    # The built-in benchmark modules are declared in this package's own entry points, as a
    # third-party package declares its own: each module registers on import.
    global _loaded
    if _loaded:
        return
    _loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
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
