"""Benchmarks become items: the collection concern of the plugin (`plugin/state.py` lists the others).

A benchmark test module's `test_<name> = benchmark_test("<name>")` is expanded here into one
item per question (`plugin/items.py`), after `-k` is checked against the benchmark before its
files are read (RSVQA-HR's 1M-record JSON is never loaded for `-k rsvqa_lr`). A benchmark whose
data is missing is left out with one line; the loaders' notes are counted. Both are said
under pytest's "collected N items" (said during collection, pytest would capture and drop
them), and again in the summary (`summary_left_out`): an xdist controller, which collects
nothing, says its workers' there.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

from pytest_satbench.plugin.items import (
    DatasetErrorItem,
    QuestionItem,
    benchmark_of,
    keyword_could_match,
    make_items,
    record_error_items,
)
from pytest_satbench.plugin.state import RunState

# what sets the data root, as a left-out benchmark's line says it
SETS_DATA_ROOT = "--data-root DIR (ini satbench_data_root) or $SATBENCH_DATA_ROOT"


class Collection:
    def __init__(self, state: RunState) -> None:
        self.state = state
        self.settings = state.settings
        self.left_out: list[str] = []  # benchmarks the run could select whose data is missing, one line each
        self.not_loaded: list[str] = []  # benchmarks -k cannot select: never read
        # the loaders' notes, and `left_out`: said once collection is over (pytest captures and
        # drops what is said during it), and by an xdist controller in its summary
        self.notes: list[str] = []
        self.from_workers = False

    @pytest.hookimpl(tryfirst=True)
    def pytest_pycollect_makeitem(self, collector: pytest.Collector, name: str, obj: object) -> Any:
        bench_name = benchmark_of(obj)
        if bench_name is None:
            return None
        from pytest_satbench.datasets import registry

        try:
            bench = registry.get(bench_name)
        except KeyError as exc:
            return [DatasetErrorItem.from_parent(collector, name=name, message=str(exc.args[0]))]
        if not self._keyword_selects(collector, name):
            self.not_loaded.append(bench_name)
            return []
        if bench.prepare is not None:
            root = bench.prepare(self.state.cache_dir("satbench-data"))
        else:
            if self.settings.data_root is None:
                self.left_out.append(
                    f"{bench_name} left out: no data root is set, so {', '.join(bench.requires)} could not be looked "
                    f"for; point {SETS_DATA_ROOT} at the folder holding {_folders(bench.requires)}"
                    f"{_fetch_advice(bench_name, None)}")
                return []
            root = self.settings.data_root
        missing = bench.missing(root)
        if missing:
            self.left_out.append(
                f"{bench_name} left out, not found: {', '.join(str(p.absolute()) for p in missing)} "
                f"(data root {root.absolute()}, from {self.root_source()}; point {SETS_DATA_ROOT} at the folder "
                f"holding {_folders(bench.requires)}{_fetch_advice(bench_name, root)})")
            return []
        return self._load(collector, name, bench, root)

    def _load(self, collector: pytest.Collector, name: str, bench: Any, root: Path) -> list[pytest.Item]:
        from pytest_satbench.core.labels import notes
        from pytest_satbench.datasets.cache import load_questions
        from pytest_satbench.datasets.registry import DatasetError, LoadRequest, RecordErrors
        from pytest_satbench.datasets.selection import repeat_sample

        state = self.state
        # Loading and building 222k items allocates millions of objects that all live to the
        # end of the session; the cyclic GC would rescan the growing heap again and again
        # (a third of the collection time at RSVQA-HR scale). Nothing here makes cycles.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            unreadable: list[tuple[str, str]] = []
            try:
                questions = load_questions(bench, LoadRequest(root, self.settings.limit), state.cache_dir("satbench-data"))
            except RecordErrors as exc:  # some records cannot be read: each fails alone
                questions, unreadable = list(exc.questions), list(exc.failed)
            except DatasetError as exc:
                return [DatasetErrorItem.from_parent(collector, name=name, message=str(exc))]
            sampled = repeat_sample(questions, self.settings.repeat_sample) if self.settings.repeat_orig else set()
            if self.settings.shard is not None:  # --shard I/N: of the questions loaded (after --limit), before -k
                questions, unreadable = self._shard(bench.name, questions, unreadable)
            if self.settings.asking_order == "random":  # --order random: image groups in a seeded order
                from pytest_satbench.datasets.selection import random_image_order

                questions = random_image_order(questions, self.settings.seed)
            for line in notes(questions):
                self.notes.append(f"satbench: {bench.name}: {line}")  # said after collection
            if state.with_servers:
                from pytest_satbench.engine.provenance import dataset_hashes

                state.dataset_hashes[bench.name] = dataset_hashes(bench.requires, root)
            state.score_views[bench.name] = bench.score_views
            if sampled:  # the whole benchmark's sample: a shard asks the part of it among its questions
                state.repeat_keys |= sampled & {(q.benchmark, q.key) for q in questions}
            return [*make_items(collector, name, questions), *record_error_items(collector, name, unreadable)]
        finally:
            if gc_was_enabled:
                gc.enable()

    def _shard(self, bench: str, questions: list[Any], unreadable: list[tuple[str, str]]
               ) -> tuple[list[Any], list[tuple[str, str]]]:
        """--shard I/N: this run's part of the benchmark (`datasets.selection.take_shard`), and its
        counts for the protocol and the line under "collected N items". The records that cannot
        be read fail in shard 1 only: once in the N runs, as in the whole run."""
        from pytest_satbench.datasets.selection import take_shard

        assert self.settings.shard is not None
        index, count = self.settings.shard
        mine = take_shard(questions, index, count)
        counts = self.state.shards[bench] = {
            "questions": len(questions), "images": len({q.image.id for q in questions}),
            "shard_questions": len(mine), "shard_images": len({q.image.id for q in mine}),
        }
        self.notes.append(f"satbench: {bench}: shard {index}/{count}: {counts['shard_questions']:,} of "
                          f"{counts['questions']:,} questions ({counts['shard_images']:,} of {counts['images']:,} "
                          "images)")
        return mine, unreadable if index == 1 else []

    def _keyword_selects(self, collector: pytest.Collector, name: str) -> bool:
        from pytest_satbench.datasets import registry

        keyword = self.state.config.option.keyword
        if not keyword:
            return True
        own = [name]
        node: Any = collector
        while node is not None and not isinstance(node, pytest.Session):
            if not (isinstance(node, pytest.Directory) and isinstance(node.parent, pytest.Session)):
                own.append(node.name)
            node = node.parent
        others = [f"test_{b}" for b in registry.all_benchmarks() if f"test_{b}" != name]
        return keyword_could_match(keyword, own, others)

    def root_source(self) -> str:
        source = self.settings.data_root_source
        return f"ini {source}" if source and source[0] not in "-$" else source or "?"

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # 222k collected items are never freed before the end: keep the cyclic GC off them
        # (a full collect first would cost 0.2 s at that size and find almost nothing).
        if len(session.items) > 10_000:
            gc.freeze()
        # question items' reports stay small to the end of the session (plugin/runtest.py)
        from pytest_satbench.plugin.runtest import QuestionReports

        pm = self.state.config.pluginmanager
        if not pm.has_plugin(QuestionReports.NAME) and any(isinstance(i, QuestionItem) for i in session.items):
            pm.register(QuestionReports(self.state.config, lambda item: isinstance(item, QuestionItem)), QuestionReports.NAME)
        workeroutput = getattr(self.state.config, "workeroutput", None)
        if workeroutput is not None:  # an xdist worker: its controller says them in its summary
            workeroutput["satbench_collection"] = {"notes": self.notes, "left_out": self.left_out}

    def pytest_report_collectionfinish(self, config: pytest.Config, start_path: Path, items: list[pytest.Item]) -> list[str]:
        """Under pytest's "collected N items": the lines collection had to say (captured if said then)."""
        if self.state.is_worker:
            return []
        return [*self.notes, *(f"satbench: {line}" for line in self.left_out)]

    def take_workers(self, output: dict[str, Any]) -> None:
        """An xdist controller collects nothing: its workers' collection lines come with their output."""
        got = output.get("satbench_collection")
        if got and not self.from_workers:
            self.from_workers = True
            self.notes, self.left_out = list(got.get("notes") or ()), list(got.get("left_out") or ())

    def summary_left_out(self, tr: Any, exitstatus: int) -> None:
        """The benchmarks left out for missing data, again at the end (a long run's first lines are
        far above; an xdist controller says its workers' here only), and, when nothing ran
        because of them, that and what to do."""
        if self.from_workers:
            for line in self.notes:
                tr.write_line(line, yellow=True)
        if not self.left_out:
            return
        nothing = exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED
        if self.from_workers or not nothing:
            for line in self.left_out:
                tr.write_line(f"satbench: {line}", yellow=True)
        if nothing:
            names = [line.split(" ", 1)[0] for line in self.left_out]
            one = len(names) == 1
            root = self.settings.data_root
            why = (f"{'its' if one else 'their'} files are not under the data root {root.absolute()} (from "
                   f"{self.root_source()})" if root is not None else "no data root is set")
            tr.write_line(
                f"satbench: no items ran: {', '.join(names)} {'was' if one else 'were'} left out, as {why}; point "
                f"{SETS_DATA_ROOT} at the folder that holds the benchmarks{_fetch_advice(names, root)}", red=True)


COLLECTION_KEY = pytest.StashKey[Collection]()


def _fetch_advice(names: str | list[str], root: Path | None) -> str:
    """How to download left-out benchmarks' files, for those a public source is known for
    (docs/data.md)."""
    from pytest_satbench.datasets.sources import for_benchmark

    known = [n for n in ([names] if isinstance(names, str) else names) if for_benchmark(n) is not None]
    if not known:
        return ""
    return f"; or fetch them: python -m pytest_satbench.data fetch {' '.join(known)}" + (
        f" --root {root.absolute()}" if root is not None else "")


def _folders(requires: tuple[str, ...]) -> str:
    """The top folders of a benchmark's files under the data root: `RSVQA-LR/`."""
    tops = dict.fromkeys(rel.split("/", 1)[0] + ("/" if "/" in rel else "") for rel in requires)
    return " and ".join(tops) or "its files"
