"""pytest entry point (`pytest11: satbench`): options and hooks only.

Behaviour lives in modules named for one concern: `options` (validation), `collection`
(questions as items), `session` (the per-run state object, registered here as a plugin),
`scheduling` (look-ahead), `answering`, `images`, `client`, `scoring`, `store`, `outcomes`,
`summary`, `xdist_scheduling`.
"""

from __future__ import annotations

from typing import Any

import pytest

from .collection import SESSION_KEY
from .options import add_options, parse_settings
from .session import SatbenchSession


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    settings = parse_settings(config)
    state = SatbenchSession(config, settings)
    config.stash[SESSION_KEY] = state
    config.pluginmanager.register(state, "satbench-session")
    if settings.servers or settings.builtin_server:
        # pytest's --nf plugin rewrites a file of every node id ever seen on every run
        # (9 MB at 222k ids) and re-reads it at every start; benchmark runs don't need it.
        nf = config.pluginmanager.get_plugin("nfplugin")
        if nf is not None and not config.getoption("newfirst", False):
            config.pluginmanager.unregister(nf)
    if config.pluginmanager.hasplugin("xdist"):
        from .xdist_scheduling import XdistHooks

        config.pluginmanager.register(XdistHooks(config), "satbench-xdist")


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(SESSION_KEY, None)
    if state is not None:
        config.pluginmanager.unregister(state)


@pytest.fixture(scope="session")
def satbench(pytestconfig: pytest.Config) -> Any:
    """The run's state: settings, and once items run, the server pool and image pipeline."""
    return pytestconfig.stash[SESSION_KEY]
