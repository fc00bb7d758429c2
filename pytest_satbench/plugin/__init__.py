"""pytest entry point (`pytest11: satbench`): options and hooks only.

Behaviour lives in modules named for one concern: `options` (validation), `collection`
(questions as items), `session` (the per-run state object, registered here as a plugin),
`scheduling` (look-ahead), `answering`, `images`, `client`, `scoring`, `store`, `outcomes`,
`summary`, `xdist_scheduling`.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pytest_satbench.core import prompts
from pytest_satbench.core.question import Question
from pytest_satbench.engine.answering import ItemResult, Job
from pytest_satbench.engine.client import ServerPool
from pytest_satbench.engine.images import ImagePipeline
from pytest_satbench.plugin.items import SESSION_KEY
from pytest_satbench.plugin.options import add_options, parse_settings
from pytest_satbench.plugin.session import SatbenchSession


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
        from pytest_satbench.plugin.xdist import XdistHooks

        config.pluginmanager.register(XdistHooks(config), "satbench-xdist")


# ---------------------------------------------------------------------- public fixtures
# For users writing their own benchmark tests: the same servers, reconstruction arms (with
# the single-flight per-image cache) and results store the benchmark items use.


@pytest.fixture(scope="session")
def satbench_servers(request: pytest.FixtureRequest) -> ServerPool:
    """The health-checked server pool (`ask(model=, prompt=, image_jpeg=, max_tokens=)`)."""
    return request.config.stash[SESSION_KEY].runtime(request.session).pool


@pytest.fixture(scope="session")
def satbench_model(request: pytest.FixtureRequest) -> str:
    """The model id every request asks for (--model, or the one the servers list)."""
    return request.config.stash[SESSION_KEY].runtime(request.session).runner.settings.model


@pytest.fixture(scope="session")
def satbench_images(request: pytest.FixtureRequest) -> ImagePipeline:
    """The reconstruction arms: `get(ImageRef) -> Future[PreparedImage]` with JPEG bytes per arm."""
    return request.config.stash[SESSION_KEY].runtime(request.session).images


@pytest.fixture
def satbench_ask(request: pytest.FixtureRequest) -> Callable[[Question], ItemResult]:
    """Ask a `Question` in every arm, through the store (answers are reused on reruns)."""
    runtime = request.config.stash[SESSION_KEY].runtime(request.session)
    nodeid = request.node.nodeid

    def ask(question: Question, timeout: float | None = None) -> ItemResult:
        prompt = prompts.render(question, runtime.runner.settings.prompt_style)
        return runtime.runner.submit(Job(f"{nodeid}::{question.key}", question, prompt)).result(timeout)

    return ask
