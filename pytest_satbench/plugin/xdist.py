"""pytest-xdist support: one image's questions stay on one worker.

xdist's `--dist loadgroup` would do this, but it silently stops grouping on pytest 9.2
with xdist 3.8 (xdist#1386) and its LoadScope bookkeeping is quadratic in the items per
worker (xdist#279, #1212), hopeless at 222k items. So the plugin ships its own scheduler,
used in place of `--dist load` (the default of `-n`):

- each worker writes, after collecting, the sizes of its runs of consecutive items that
  share an image (items are sorted by image) to a file the controller named for it
  (`workerinput["satbench_groups_dir"]`): a side channel, as pytest-cov uses, because
  xdist only ships node ids to the controller;
- the controller hands out whole groups, keeping each worker's queue filled to about
  4 x the requests the caps allow in flight (`queued_for`) so the worker's look-ahead
  sees enough work ahead; all
  bookkeeping is O(1) per completed item.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_satbench.engine.concurrency import ConcurrencySpec
from pytest_satbench.plugin.collection import COLLECTION_KEY
from pytest_satbench.plugin.items import SESSION_KEY, QuestionItem
from pytest_satbench.plugin.state import STATE_KEY

# The most requests `queued_for` counts on (x4 items queued per worker): enough for any
# limits adaptive control reaches on a few servers, few enough for an even end of the run.
MAX_QUEUED = 1024


def image_groups(items: Sequence[pytest.Item]) -> list[int]:
    """Sizes of runs of consecutive items about the same image, in collection order."""
    sizes: list[int] = []
    last: tuple[str, str] | None = None
    for item in items:
        key = (item.question.benchmark, item.question.image.id) if isinstance(item, QuestionItem) else None
        if key is not None and key == last:
            sizes[-1] += 1
        else:
            sizes.append(1)
        last = key
    return sizes


class XdistHooks:
    """Registered only when pytest-xdist is installed (the pytest-randomly pattern)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.groups_dir: Path | None = None

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        if self.groups_dir is None:
            self.groups_dir = Path(tempfile.mkdtemp(prefix="satbench-groups-"))
        node.workerinput["satbench_groups_dir"] = str(self.groups_dir)
        # one run: the workers' answers are the run's, asked of the controller's builtin server
        node.workerinput["satbench_run_id"] = self.config.stash[STATE_KEY].run_id
        if self.config.stash[STATE_KEY].settings.builtin_server:
            node.workerinput["satbench_builtin_url"] = self.config.stash[SESSION_KEY].builtin_server().url

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        output = getattr(node, "workeroutput", None) or {}
        stopped = output.get("satbench_stopped")  # a worker's stop (store, servers, model) is the run's
        if stopped:
            self.config.stash[STATE_KEY].stop(None, int(stopped[0]), str(stopped[1]))
        self.config.stash[COLLECTION_KEY].take_workers(output)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # tryfirst: the file must exist before xdist reports the collection to the controller
        workerinput = getattr(self.config, "workerinput", None)
        if not workerinput or "satbench_groups_dir" not in workerinput:
            return
        path = Path(workerinput["satbench_groups_dir"]) / f"{workerinput['workerid']}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(image_groups(session.items)))
        os.replace(tmp, path)

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if config.getvalue("dist") != "load":
            return None  # the user asked for another xdist mode explicitly
        return ImageGroupScheduling(config, log, self.groups_dir)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.groups_dir is not None:
            for f in self.groups_dir.glob("*"):
                f.unlink(missing_ok=True)
            self.groups_dir.rmdir()


def worker_upcoming_items(config: pytest.Config, session: pytest.Session, items: list[QuestionItem],
                          stopped: Callable[[], bool]) -> Iterator[QuestionItem] | None:
    """On an xdist worker, the question items the controller has sent it so far, in order, for
    the look-ahead (`engine.lookahead.worker_upcoming`); None when this is no worker."""
    interactor = _worker_interactor(config)
    if interactor is None:
        return None
    from pytest_satbench.engine.lookahead import worker_upcoming

    wanted = {id(i) for i in items}

    def snapshot() -> list[Any] | None:
        try:
            with interactor.torun.lock() as queue:
                return list(queue)
        except Exception:
            return None

    return (i for i in worker_upcoming(snapshot, session.items, stopped) if id(i) in wanted)  # type: ignore[misc]  # wanted: ids of QuestionItems


def _worker_interactor(config: pytest.Config) -> Any:
    if not hasattr(config, "workerinput"):
        return None
    for plugin in config.pluginmanager.get_plugins():
        if type(plugin).__name__ == "WorkerInteractor" and hasattr(plugin, "torun"):
            return plugin
    return None


def queued_for(spec: ConcurrencySpec, servers: int) -> int:
    """Requests the run may hold in flight at most, by its caps: what the workers' queues
    must feed (bounded, so the last groups are not all queued on one worker at the end)."""
    room = spec.server_cap * max(1, servers)
    if spec.total_cap is not None:
        room = min(room, spec.total_cap)
    return min(room, MAX_QUEUED)


class ImageGroupScheduling:
    """Implements xdist's `Scheduling` protocol, handing out whole image groups."""

    def __init__(
        self, config: pytest.Config, log: Any = None, groups_dir: Path | None = None, *, numnodes: int | None = None
    ) -> None:
        from xdist.remote import Producer
        from xdist.workermanage import parse_tx_spec_config

        self.numnodes = numnodes if numnodes is not None else len(parse_tx_spec_config(config))
        self.config = config
        self.log = log.imagegroupsched if log is not None else Producer("imagegroupsched")
        self.groups_dir = groups_dir
        self.node2collection: dict[Any, Sequence[str]] = {}
        self.node2pending: dict[Any, deque[int]] = {}
        self.pending_groups: deque[range] = deque()
        self.collection: Sequence[str] | None = None
        # the parsed settings, so the ini's satbench_concurrency counts here as everywhere
        settings = config.stash[SESSION_KEY].settings
        self.fill_to = 4 * queued_for(settings.concurrency, 1 if settings.builtin_server else len(settings.servers))

    # ------------------------------------------------------------------ protocol state
    @property
    def nodes(self) -> list[Any]:
        return list(self.node2pending)

    @property
    def collection_is_completed(self) -> bool:
        return len(self.node2collection) >= self.numnodes

    @property
    def tests_finished(self) -> bool:
        if not self.collection_is_completed or self.pending_groups:
            return False
        return all(len(p) < 2 for p in self.node2pending.values())

    @property
    def has_pending(self) -> bool:
        return bool(self.pending_groups) or any(self.node2pending.values())

    def add_node(self, node: Any) -> None:
        assert node not in self.node2pending
        self.node2pending[node] = deque()

    def add_node_collection(self, node: Any, collection: Sequence[str]) -> None:
        assert node in self.node2pending
        self.node2collection[node] = list(collection)

    # ------------------------------------------------------------------ progress
    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        pending = self.node2pending[node]
        if pending and pending[0] == item_index:
            pending.popleft()  # the usual case: a worker runs its queue in order
        else:
            pending.remove(item_index)
        self._refill(node)

    def mark_test_pending(self, item: str) -> None:
        assert self.collection is not None
        self.pending_groups.appendleft(range(i := self.collection.index(item), i + 1))
        for node in self.nodes:
            self._refill(node)

    def remove_pending_tests_from_node(self, node: Any, indices: Sequence[int]) -> None:
        raise NotImplementedError("work stealing is not used by image-group scheduling")

    def remove_node(self, node: Any) -> str | None:
        pending = self.node2pending.pop(node)
        if not pending:
            return None
        assert self.collection is not None
        crashitem = self.collection[pending.popleft()]
        for idx in reversed(pending):
            self.pending_groups.appendleft(range(idx, idx + 1))
        for other in self.nodes:
            self._refill(other)
        return crashitem

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is not None:
            for node in self.nodes:
                self._refill(node)
            return
        if not self._same_collections():
            self.log("**Different tests collected, aborting run**")
            return
        self.collection = next(iter(self.node2collection.values()))
        total = len(self.collection)
        if not total:
            return
        start = 0
        for size in self._group_sizes(total):
            self.pending_groups.append(range(start, start + size))
            start += size
        # Share the work fairly when it is small, but never hand a worker less than 2
        # items while others starve (xdist needs 2 queued items to start one).
        self.fill_to = max(2, min(self.fill_to, math.ceil(total / max(1, len(self.nodes)))))
        for node in self.nodes:
            self._refill(node)

    # ------------------------------------------------------------------ internals
    def _group_sizes(self, total: int) -> list[int]:
        if self.groups_dir is not None:
            for node in self.node2collection:
                path = self.groups_dir / f"{node.gateway.id}.json"
                try:
                    sizes = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue
                if isinstance(sizes, list) and sum(sizes) == total:
                    return [int(s) for s in sizes]
        return [1] * total  # no map: plain per-item load balancing

    def _refill(self, node: Any) -> None:
        if getattr(node, "shutting_down", False):
            return
        pending = self.node2pending[node]
        send: list[int] = []
        while self.pending_groups and len(pending) + len(send) < self.fill_to:
            send.extend(self.pending_groups.popleft())
        if send:
            pending.extend(send)
            node.send_runtest_some(send)
        if not self.pending_groups:
            node.shutdown()

    def _same_collections(self) -> bool:
        from xdist.report import report_collection_diff

        pairs = list(self.node2collection.items())
        first_node, first = pairs[0]
        same = True
        for node, collection in pairs[1:]:
            msg = report_collection_diff(first, collection, first_node.gateway.id, node.gateway.id)
            if msg:
                same = False
                self.log(msg)
                rep = pytest.CollectReport(nodeid=node.gateway.id, outcome="failed", longrepr=msg, result=[])
                self.config.hook.pytest_collectreport(report=rep)
        return same
