"""The runtime alone, against a real loopback server: built from a `RuntimeConfig`, it
closes everything it opened on every path, including the ones that refuse to start."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from PIL import Image
from servers import FakeVLM

from pytest_satbench.codecs.base import ArmSpec
from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.engine.config import RuntimeConfig
from pytest_satbench.engine.runtime import Runtime, StartError
from pytest_satbench.engine.store import ResultStore


def _open_files(path: Path) -> list[str]:
    """This process's file descriptors on `path` or its WAL/SHM companions."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(path)):
            out.append(target)
    return out


def _satbench_threads(before: set[threading.Thread]) -> list[str]:
    """The plugin's threads started since `before` that are still alive (other tests' leftovers
    do not count); waits a little, as a stopped thread takes a moment to end."""
    deadline = time.monotonic() + 5
    while True:
        alive = [t.name for t in set(threading.enumerate()) - before if t.name.startswith("satbench-")]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _config(tmp_path: Path, url: str, **kw: object) -> RuntimeConfig:
    return RuntimeConfig(run_id=str(kw.pop("run_id", "r1")), tag="t", urls=(url,),
                         store_path=tmp_path / "results.sqlite", recon_cache_dir=tmp_path / "recon", **kw)  # type: ignore[arg-type]  # kw: RuntimeConfig fields by name


def _question(tmp_path: Path) -> Question:
    path = tmp_path / "img.png"
    Image.new("RGB", (40, 30), (10, 120, 200)).save(path)
    return Question(benchmark="b", key="1", image=ImageRef(id="img", path=str(path)), text="Is there water?",
                    answer="yes", types=("presence",))


def test_start_ask_close_leaves_nothing_open_and_records_traffic(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    with FakeVLM(models=["m"], answer=lambda prompt, has_image, image: "yes") as srv:
        rt = Runtime.start(_config(tmp_path, srv.url, arms=(ArmSpec("jpeg", (("quality", "50"),)),)))
        assert rt.model == "m"
        result = rt.ask("t::1", _question(tmp_path)).result(30)
        assert set(result.arms) == {"orig", "jpeg:quality=50"} and not result.errors
        assert result.sent_size == (40, 30)
        rt.close()
    assert _satbench_threads(before) == []
    assert _open_files(tmp_path / "results.sqlite") == []
    store = ResultStore(tmp_path / "results.sqlite")
    traffic = store.traffic("r1")
    store.close()
    assert [(t.requests, t.answered, t.failures) for t in traffic.values()] == [(2, 2, 0)]


@pytest.mark.parametrize("case", ["protocol conflict", "bad codec", "no model"])
def test_a_refused_start_closes_what_it_opened(tmp_path: Path, case: str) -> None:
    before = set(threading.enumerate())
    with FakeVLM(models=["m"]) as srv:
        if case == "protocol conflict":  # an earlier run under the tag asked another model
            Runtime.start(_config(tmp_path, srv.url, model="m", run_id="r0")).close()
            srv.models = ["other"]
            cfg = _config(tmp_path, srv.url)
            match = "was measured with model 'm'"
        elif case == "bad codec":
            cfg = _config(tmp_path, srv.url, arms=(ArmSpec("nosuchcodec"),))
            match = "nosuchcodec"
        else:
            cfg = _config(tmp_path, srv.url, model="absent")
            match = "absent"
        with pytest.raises(StartError, match=match):
            Runtime.start(cfg)
    assert _satbench_threads(before) == []
    assert _open_files(tmp_path / "results.sqlite") == []


def test_no_servers_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(StartError, match="pass --servers"):
        Runtime.start(RuntimeConfig(run_id="r", tag="t", urls=(), store_path=tmp_path / "s.sqlite"))
