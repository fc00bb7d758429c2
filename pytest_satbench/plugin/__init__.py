"""pytest entry point (`pytest11: satbench`): options and hooks only.

Installing the plugin must cost nothing in pytest runs that use no benchmark, so this
module imports pytest and the light option table only; the session object (registered
here as a plugin) imports the engine, numpy, PIL and SQLite where a benchmark runs.

Behaviour lives in modules named for one concern: `options` (the option table), `items`
(questions as items), `state` (what the plugin objects share for one run), `collection`
(benchmarks become items, -k before loading), `run` (the runtime while items run, one item's
outcome, stops), `finish` (gates, reports, the summary, --lf bookkeeping), `runtest`
(the lean per-item runtest), `outcomes` (letters and verdicts), `progress` (the live
progress line), `terminal` (the summary; how the progress line is written), `xdist` (hooks
and the image-group scheduler), `sequential` (--precision / --margin: stop asking a benchmark once
its answer is known), `signals` (SIGTERM stops a run as Ctrl-C does), `fixtures`
(public fixtures).
"""

from __future__ import annotations

import pytest

from pytest_satbench.plugin.fixtures import satbench_ask, satbench_images, satbench_model, satbench_servers
from pytest_satbench.plugin.options import add_options, parse_settings

__all__ = ["satbench_ask", "satbench_images", "satbench_model", "satbench_servers"]


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    from pytest_satbench.plugin.collection import COLLECTION_KEY, Collection
    from pytest_satbench.plugin.finish import Finish
    from pytest_satbench.plugin.items import SESSION_KEY
    from pytest_satbench.plugin.run import RunController
    from pytest_satbench.plugin.state import STATE_KEY, RunState

    settings = parse_settings(config)
    state = config.stash[STATE_KEY] = RunState(config, settings)
    collection = config.stash[COLLECTION_KEY] = Collection(state)
    run = RunController(state)
    config.stash[SESSION_KEY] = run
    pm = config.pluginmanager
    pm.register(collection, "satbench-collection")
    pm.register(run, "satbench-session")
    pm.register(Finish(state, collection, run), "satbench-finish")
    if settings.servers or settings.builtin_server:
        from pytest_satbench.plugin import progress

        progress.register(config)  # the live progress line (--progress-every)
        if settings.stopping_rule:  # --precision / --margin
            from pytest_satbench.plugin.sequential import NAME, SEQUENTIAL_KEY, Sequential

            seq = config.stash[SEQUENTIAL_KEY] = Sequential(state)
            pm.register(seq, NAME)
        # pytest's --nf plugin rewrites a file of every node id ever seen on every run
        # (9 MB at 222k ids) and re-reads it at every start; benchmark runs don't need it.
        nf = config.pluginmanager.get_plugin("nfplugin")
        if nf is not None and not config.getoption("newfirst", False):
            config.pluginmanager.unregister(nf)
    if config.pluginmanager.hasplugin("xdist"):
        from pytest_satbench.plugin.xdist import XdistHooks

        config.pluginmanager.register(XdistHooks(config), "satbench-xdist")
