"""Public fixtures, for users writing their own benchmark tests: the same servers,
reconstruction arms (with the single-flight per-image cache) and results store the
benchmark items use. The engine starts when one of them is first requested."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import pytest

if TYPE_CHECKING:
    from pytest_satbench.core.question import Question
    from pytest_satbench.engine.answering import ItemResult
    from pytest_satbench.engine.client import ServerPool
    from pytest_satbench.engine.images import ImagePipeline
    from pytest_satbench.engine.runtime import Runtime
    from pytest_satbench.plugin.run import RunController


def _runtime(request: pytest.FixtureRequest) -> Runtime:
    session = cast("RunController", request.config.pluginmanager.get_plugin("satbench-session"))  # registered at configure
    return session.runtime(request.session)


@pytest.fixture(scope="session")
def satbench_servers(request: pytest.FixtureRequest) -> ServerPool:
    """The health-checked server pool (`ask(model=, prompt=, image_jpeg=, max_tokens=)`)."""
    return _runtime(request).pool


@pytest.fixture(scope="session")
def satbench_model(request: pytest.FixtureRequest) -> str:
    """The model id every request asks for (--model, or the one the servers list)."""
    return _runtime(request).model


@pytest.fixture(scope="session")
def satbench_images(request: pytest.FixtureRequest) -> ImagePipeline:
    """The reconstruction arms: `get(ImageRef) -> Future[PreparedImage]` with JPEG bytes per arm."""
    return _runtime(request).images


@pytest.fixture
def satbench_ask(request: pytest.FixtureRequest) -> Callable[[Question], ItemResult]:
    """Ask a `Question` in every arm, through the store (answers are reused on reruns)."""
    runtime = _runtime(request)
    nodeid = request.node.nodeid

    def ask(question: Question, timeout: float | None = None) -> ItemResult:
        return runtime.ask(f"{nodeid}::{question.key}", question).result(timeout)

    return ask
