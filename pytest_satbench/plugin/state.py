"""What the plugin's objects share for one pytest run, kept in `config.stash[STATE_KEY]`.

The plugin is a few objects with one concern each, registered by `plugin/__init__.py` (the
pytest-xdist pattern: a thin entry point, a controller object per concern):

  collection.Collection  benchmarks become items; what collection has to say (`-k` before loading)
  run.RunController      the engine's runtime while items run; one item's outcome; stops
  finish.Finish          the end of the run: --lf bookkeeping, gates, reports, the summary
  xdist.XdistHooks       the controller/worker plumbing (pytest-xdist installed only)
  sequential.Sequential  --precision / --margin: which items are asked, the rule (with a rule only)

They share this state: the settings, the run's id, where its store and caches are, whether
and why the run stopped asking, and what collection learnt that the runtime records. Nothing
lives in module globals.

This module is imported at every pytest start-up where the plugin is installed: it imports
pytest and the standard library only.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_satbench.plugin.options import Settings

if TYPE_CHECKING:
    from pytest_satbench.plugin.signals import StopSignals

STORE_FAILED_EXIT = 7  # the results store failed: the run stopped asking (gates: 6)
SERVERS_GONE_EXIT = 8  # no server answered for --give-up-after while requests failed
MODEL_SWAPPED_EXIT = 9  # a server answered as another model: the servers changed under the run


class RunState:
    """One pytest process's share of the run (an xdist worker's and its controller's differ)."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        workerinput: dict[str, Any] = getattr(config, "workerinput", {})
        self.is_worker = bool(workerinput)
        self.run_id: str = workerinput.get("satbench_run_id") or uuid.uuid4().hex[:16]
        # why this run stopped asking before the end (the store failed, no server answers, the
        # model changed): the first reason wins, with its exit status
        self.stopped: tuple[int, str] | None = None
        self.interrupted = False  # Ctrl-C or SIGTERM
        self.signals: StopSignals | None = None  # plugin/signals.py: SIGTERM as Ctrl-C, in runs with servers
        self.planned: dict[str, int] = {}  # questions this process set out to answer, per benchmark
        self.start_failed = False  # the runtime could not start: nothing was attempted
        # what collection learnt of each benchmark and the runtime records with the run
        self.dataset_hashes: dict[str, dict[str, str]] = {}
        self.score_views: dict[str, frozenset[str]] = {}
        self.repeat_keys: set[tuple[str, str]] = set()
        # --shard: per benchmark, its questions and images in all and in this run's shard (before -k)
        self.shards: dict[str, dict[str, int]] = {}

    @property
    def with_servers(self) -> bool:
        """Whether this run asks questions (question items run only against servers)."""
        return bool(self.settings.servers or self.settings.builtin_server)

    def is_controller(self) -> bool:
        """An xdist controller: it runs no item; its workers do."""
        return self.config.pluginmanager.get_plugin("dsession") is not None and not self.is_worker

    def say(self, line: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and not self.is_worker:
            reporter.write_line(line, yellow=True)

    def cache_dir(self, name: str) -> Path:
        cache = getattr(self.config, "cache", None)
        if cache is not None:
            return Path(cache.mkdir(name))
        path = Path(self.config.rootpath) / ".satbench" / name  # -p no:cacheprovider
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def store_path(self) -> Path:
        if self.settings.store is not None:
            return self.settings.store
        return self.cache_dir("satbench") / "results.sqlite"

    def stop(self, session: pytest.Session | None, exit_status: int, line: str) -> None:
        """Stop asking: pytest ends the run after this item; the first reason is kept."""
        if self.stopped is None:
            self.stopped = (exit_status, line)
            if session is not None:
                session.shouldstop = f"satbench: {line}"


STATE_KEY = pytest.StashKey[RunState]()
