"""Unit tests of the core pieces, each alone: store, look-ahead, single-flight image cache,
-k pre-selection, the xdist image-group scheduler, option parsing."""

from __future__ import annotations

import multiprocessing
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from PIL import Image

from pytest_satbench.codecs.base import ArmSpec, Codec
from pytest_satbench.collection import keyword_could_match
from pytest_satbench.images import ORIG, ImageError, ImagePipeline
from pytest_satbench.question import ImageRef
from pytest_satbench.scheduling import LookAhead, worker_upcoming
from pytest_satbench.store import AnswerRow, ResultStore
from pytest_satbench.xdist_scheduling import ImageGroupScheduling


# ---------------------------------------------------------------------------- store
def _row(nodeid: str, status: str = "ok", text: str = "yes", arm: str = "orig", fp: str = "f1") -> AnswerRow:
    return AnswerRow(nodeid=nodeid, arm=arm, fingerprint=fp, status=status, benchmark="b",
                     question_key=nodeid, image_id="1", text=text, error=None if status == "ok" else "boom")


def test_store_answers_only_count_when_ok(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r.sqlite")
    store.put(_row("a", status="error"))
    assert store.get("a", "orig", "f1") is None  # an error is not an answer
    store.put(_row("a", text="no"))
    assert store.get("a", "orig", "f1").text == "no"
    store.put(_row("a", status="error"))  # a later error never replaces the answer
    assert store.get("a", "orig", "f1").text == "no"
    assert store.get("a", "orig", "other-fingerprint") is None
    assert store.count("ok") == 1


def test_store_export_jsonl(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r.sqlite")
    store.put(_row("a"))
    store.put(_row("b", status="error"))
    out = tmp_path / "reports" / "x.jsonl"
    assert store.export_jsonl(out) == 2
    lines = out.read_text().splitlines()
    assert len(lines) == 2 and '"status": "error"' in lines[1]


def _write_many(path: str, prefix: str, n: int) -> None:
    store = ResultStore(Path(path))
    for i in range(n):
        store.put(_row(f"{prefix}{i}"))
    store.close()


def test_store_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    ResultStore(path).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(str(path), f"p{k}-", 200)) for k in range(2)]
    for p in procs:
        p.start()
    store = ResultStore(path)
    with ThreadPoolExecutor(8) as ex:  # and threads of this process at the same time
        list(ex.map(lambda i: store.put(_row(f"t{i}")), range(400)))
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert store.count("ok") == 800


# ---------------------------------------------------------------------------- look-ahead
def test_lookahead_runs_ahead_within_window_and_returns_in_order() -> None:
    started: list[int] = []
    outstanding = [0]
    peak = [0]
    lock = threading.Lock()
    pool = ThreadPoolExecutor(16)

    def submit(i: int) -> Future[int]:
        with lock:
            started.append(i)
            outstanding[0] += 1
            peak[0] = max(peak[0], outstanding[0])

        def work() -> int:
            time.sleep(0.005)
            return i * 10

        return pool.submit(work)

    la: LookAhead[int, int] = LookAhead(iter(range(100)), submit, key=str, window=8)
    la.start()
    time.sleep(0.1)
    assert len(started) == 8  # ran ahead, but no further than the window
    results = []
    for i in range(100):
        results.append(la.result(i))
        with lock:
            outstanding[0] -= 1
    la.stop()
    assert results == [i * 10 for i in range(100)]
    assert peak[0] <= 9  # window + the one being consumed
    assert sorted(started) == list(range(100)) and len(started) == 100  # each submitted once


def test_lookahead_item_before_feeder_is_submitted_once() -> None:
    calls: list[int] = []

    def submit(i: int) -> Future[int]:
        calls.append(i)
        f: Future[int] = Future()
        f.set_result(i)
        return f

    gate = threading.Event()

    def slow_upcoming():
        gate.wait(2)
        yield from range(5)

    la: LookAhead[int, int] = LookAhead(slow_upcoming(), submit, key=str, window=4)
    la.start()
    assert la.result(0) == 0  # on demand, before the feeder got there
    gate.set()
    assert [la.result(i) for i in range(1, 5)] == [1, 2, 3, 4]
    la.stop()
    assert sorted(calls) == [0, 1, 2, 3, 4]  # item 0 was not submitted a second time


def test_worker_upcoming_reads_queue_until_shutdown() -> None:
    snaps = iter([[0, 1], [1, 2], ["SHUTDOWN"]])
    items = ["a", "b", "c"]
    got = list(worker_upcoming(lambda: next(snaps), items, lambda: False, poll=0))
    assert got == ["a", "b", "c"]


# ---------------------------------------------------------------------------- images
class CountingCodec(Codec):
    def __init__(self) -> None:
        self.arms = (ArmSpec("count"),)
        self.calls = 0
        self._lock = threading.Lock()

    def reconstruct(self, image: Image.Image) -> list[Image.Image]:
        with self._lock:
            self.calls += 1
        time.sleep(0.05)  # long enough for every thread to miss the cache at once
        return [image.resize((image.width // 2, image.height // 2))]

    def output_size(self, size: tuple[int, int]) -> tuple[int, int]:
        return (size[0] // 2, size[1] // 2)


def test_single_flight_one_reconstruction_per_image(tmp_path: Path) -> None:
    path = tmp_path / "a.png"
    Image.new("RGB", (64, 48), (10, 200, 30)).save(path)
    codec = CountingCodec()
    pipe = ImagePipeline([codec], cache_images=4, workers=4)
    ref = ImageRef(id="a", path=str(path))
    with ThreadPoolExecutor(32) as ex:
        prepared = list(ex.map(lambda _: pipe.get(ref).result(), range(64)))
    assert codec.calls == 1
    assert pipe.reconstructions == 1
    first = prepared[0]
    assert all(p is first for p in prepared)
    # both arms are sent at the reconstruction's geometry
    assert first.arms[ORIG].size == first.arms["count"].size == (32, 24)
    with Image.open(__import__("io").BytesIO(first.arms[ORIG].jpeg)) as im:
        assert im.size == (32, 24) and im.format == "JPEG"


def test_corrupt_image_is_one_line_error_naming_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tif"
    bad.write_bytes(b"not an image at all")
    pipe = ImagePipeline([], cache_images=2)
    with pytest.raises(ImageError) as exc:
        pipe.get(ImageRef(id="bad", path=str(bad))).result()
    assert str(bad) in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(ImageError, match="missing.tif"):
        pipe.get(ImageRef(id="m", path=str(tmp_path / "missing.tif"))).result()


# ---------------------------------------------------------------------------- -k before loading
@pytest.mark.parametrize(
    ("expr", "own", "expected"),
    [
        ("rsvqa_lr", "test_rsvqa_lr", True),
        ("rsvqa_lr", "test_rsvqa_hr", False),
        ("rsvqa", "test_rsvqa_hr", True),
        ("not rsvqa_hr", "test_rsvqa_hr", False),
        ("not rsvqa_hr", "test_rsvqa_hr_phili", False),  # substring, as pytest itself
        ("not rsvqa_hr", "test_rsvqa_lr", True),
        ("rsvqa_lr and presence", "test_rsvqa_hr", False),
        ("rsvqa_hr and presence", "test_rsvqa_hr", True),
        ("presence", "test_rsvqa_hr", True),  # a type: decided per item, so load
        ("rsvqa_lr or 123", "test_rsvqa_hr", True),  # a key fragment could match
        ("demo or vrsbench", "test_rsvqa_lr", False),
    ],
)
def test_keyword_could_match(expr: str, own: str, expected: bool) -> None:
    others = [n for n in ("test_rsvqa_lr", "test_rsvqa_hr", "test_rsvqa_hr_phili", "test_demo", "test_vrsbench") if n != own]
    assert keyword_could_match(expr, [own, "test_rsvqa.py", "benchmarks"], others) is expected


# ---------------------------------------------------------------------------- xdist scheduler
class FakeNode:
    def __init__(self, name: str) -> None:
        self.gateway = type("G", (), {"id": name})()
        self.sent: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def test_image_group_scheduler_keeps_groups_whole(tmp_path: Path, pytestconfig: pytest.Config) -> None:
    import json

    sizes = [3, 1, 4, 2, 5, 1, 1, 3]  # 20 items in 8 image groups
    (tmp_path / "gw0.json").write_text(json.dumps(sizes))
    sched = ImageGroupScheduling(pytestconfig, None, tmp_path, numnodes=2)
    sched.fill_to = 4  # small queues, so groups are handed out over many refills
    nodes = [FakeNode("gw0"), FakeNode("gw1")]
    ids = [f"t[{i}]" for i in range(20)]
    for n in nodes:
        sched.add_node(n)
        sched.add_node_collection(n, ids)
    sched.schedule()
    # run everything: each node completes its pending items in order
    while sched.has_pending:
        progressed = False
        for n in nodes:
            pending = sched.node2pending[n]
            if len(pending) >= 2 or (pending and n.shutting_down):
                sched.mark_test_complete(n, pending[0])
                progressed = True
        assert progressed
    owner: dict[int, str] = {}
    for n in nodes:
        for i in n.sent:
            assert i not in owner  # every item sent once
            owner[i] = n.gateway.id
    assert sorted(owner) == list(range(20))
    start = 0
    for size in sizes:
        assert len({owner[i] for i in range(start, start + size)}) == 1  # group on one worker
        start += size
    assert {owner[i] for i in owner} == {"gw0", "gw1"}  # and both workers got work


def test_seed_shorthands_expand_to_onedpiece_arms(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_satbench.options import _expand_onedpiece

    out = _expand_onedpiece(["onedpiece:ckpt=/w/s.bin", "jpeg:quality=10"], "16,64", "6", "cuda:7")
    assert out == [
        "jpeg:quality=10",
        "onedpiece:ckpt=/w/s.bin,max_tiles=6,device=cuda:7,nlatent=16",
        "onedpiece:ckpt=/w/s.bin,max_tiles=6,device=cuda:7,nlatent=64",
    ]
    monkeypatch.delenv("SATBENCH_ONEDPIECE_CKPT", raising=False)
    with pytest.raises(pytest.UsageError, match="need a One-D-Piece checkpoint"):
        _expand_onedpiece([], "16", None, None)
    monkeypatch.setenv("SATBENCH_ONEDPIECE_CKPT", "/w/s.bin")
    assert _expand_onedpiece([], "8", None, None) == ["onedpiece:nlatent=8"]
