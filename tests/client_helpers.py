"""What the client's fault tests share: short backoffs and deadlines, no proxy from the
environment (a developer's HTTP_PROXY must not route loopback tests), one question asked."""

from __future__ import annotations

import pytest

from pytest_satbench.engine.client import Answer, ServerPool

FAST = {"backoff_base": 0.01, "backoff_max": 0.05, "timeout": 5.0, "connect_timeout": 2.0}


@pytest.fixture(autouse=True)
def no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "no_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


def ask(pool: ServerPool, prompt: str = "q") -> Answer:
    return pool.ask(model="m", prompt=prompt, image_jpeg=b"\xff\xd8jpeg", max_tokens=16)
