"""One verdict: the verdict an item gets while the run goes on is the verdict every report of
the run reads, for any reply and any scoring protocol (prompt style, box grid, IoU, image
size). The live side is the real runtime asking a real loopback server; the report side is
`report.build.collect` over the store those answers went into, as `make demo` does at its end.
A Qwen2.5-VL box on the pixel grid once scored against the 504x504 image the model saw on the
item and against the 512x512 one sent in the report."""

from __future__ import annotations

import itertools
import threading
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from servers import FakeVLM

from pytest_satbench.codecs.base import ArmSpec
from pytest_satbench.core.prompts import STYLES
from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.core.verdict import question_record
from pytest_satbench.datasets import registry
from pytest_satbench.engine.config import RuntimeConfig
from pytest_satbench.engine.runtime import Runtime
from pytest_satbench.engine.store import ResultStore
from pytest_satbench.report.build import collect

ARMS = (ArmSpec("jpeg", (("quality", "30"),)), ArmSpec("resize", (("factor", "2"),)))
SIZES = [(512, 512), (300, 200), (1000, 700), (64, 64)]
_runs = itertools.count()


class Replies:
    """What the loopback server answers: for each question prompt, one of its candidate replies
    picked by the image's bytes, so the arms of one question get different replies."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_prompt: dict[str, list[str]] = {}

    def __call__(self, prompt: str, has_image: bool, image: bytes | None) -> str:
        with self.lock:
            options = self.by_prompt.get(prompt, ["?"])
        return options[zlib.crc32(image or b"") % len(options)]


@pytest.fixture(scope="module")
def server():
    replies = Replies()
    with FakeVLM(models=["m"], answer=replies) as srv:
        yield srv, replies


def _box_replies(gt: tuple[int, int, int, int], size: tuple[int, int]) -> st.SearchStrategy[str]:
    """Boxes as a model may give them: the truth on the 0-1000 or 0-100 grid, in the pixels of
    the image sent or of the one a resizing model saw (Qwen2.5-VL: multiples of 28), nudged."""
    w, h = size
    seen = ((w + 14) // 28 * 28, (h + 14) // 28 * 28)

    def scaled(sx: float, sy: float, d: int) -> str:
        x1, y1, x2, y2 = (round(gt[0] * sx) + d, round(gt[1] * sy), round(gt[2] * sx), round(gt[3] * sy) - d)
        return f"<answer>[{x1}, {y1}, {x2}, {y2}]</answer>"

    nudge = st.integers(-3, 3)
    return st.one_of(
        nudge.map(lambda d: scaled(10, 10, d)),
        nudge.map(lambda d: scaled(1, 1, d)),
        nudge.map(lambda d: scaled(w / 100, h / 100, d)),
        nudge.map(lambda d: scaled(seen[0] / 100, seen[1] / 100, d)),
        st.text(max_size=20),
    )


@st.composite
def cases(draw: st.DrawFn) -> dict[str, object]:
    kind = draw(st.sampled_from(["ref", "ref", "vqa", "mc"]))  # boxes are where the protocols differ
    size = draw(st.sampled_from(SIZES))
    if kind == "ref":
        x1, y1 = draw(st.integers(0, 80)), draw(st.integers(0, 80))
        gt = (x1, y1, x1 + draw(st.integers(1, 19)), y1 + draw(st.integers(1, 19)))
        answer = "{" + "".join(f"<{v}>" for v in gt) + "}"
        replies = draw(st.lists(_box_replies(gt, size), min_size=1, max_size=3))
        bench, text = "vrsbench_ref", "the small car near the bottom"
    elif kind == "vqa":
        answer = draw(st.sampled_from(["yes", "no", "3", "white"]))
        replies = draw(st.lists(st.one_of(st.sampled_from(["Yes", "no.", "3", "three", "A white one", ""]),
                                          st.text(max_size=12)), min_size=1, max_size=3))
        bench, text = "vrsbench", "Is there a car?"
    else:
        answer = draw(st.sampled_from("ABCD"))
        replies = draw(st.lists(st.one_of(st.sampled_from(["A", "(B)", "The answer is C.", "D. Forest", "E"]),
                                          st.text(max_size=12)), min_size=1, max_size=3))
        bench, text = "lhrs", "What is this?"
    return {
        "kind": kind, "bench": bench, "text": text, "answer": answer, "size": size, "replies": replies,
        "style": draw(st.sampled_from([*sorted(STYLES), "qwen25vl"])),  # the resizing model twice
        "box_grid": draw(st.sampled_from([None, "pixels", "1000", "100"])),
        "iou": draw(st.sampled_from(["inclusive", "continuous"])),
    }


def _question(case: dict[str, object], image: Path, n: int) -> Question:
    kind = str(case["kind"])
    choices = ("Factory", "Park", "Farm", "Forest") if kind == "mc" else None
    qtype = {"ref": "unique", "vqa": "object presence", "mc": "identity"}[kind]
    return Question(benchmark=str(case["bench"]), key=f"q{n}", image=ImageRef(id=image.stem, path=str(image)),
                    text=f"{case['text']} ({n})", answer=str(case["answer"]), types=(qtype,), kind=kind,  # type: ignore[arg-type]  # kind: one of Question's kinds, from the case
                    choices=choices)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_the_live_verdict_is_the_reports(server, tmp_path_factory: pytest.TempPathFactory, case: dict[str, object]) -> None:
    srv, replies = server
    n = next(_runs)
    tmp = tmp_path_factory.mktemp("verdict")
    image = tmp / f"img{n}.png"
    Image.new("RGB", case["size"], (40 + n % 200, 90, 160)).save(image)  # type: ignore[arg-type]  # size: the case's (w, h)
    bench = str(case["bench"])
    cfg = RuntimeConfig(
        run_id=f"r{n}", tag="t", urls=(srv.url,), store_path=tmp / "results.sqlite", arms=ARMS,
        prompt_style=str(case["style"]), box_grid=case["box_grid"], iou=str(case["iou"]),  # type: ignore[arg-type]  # box_grid: the case's int
        score_views={bench: registry.get(bench).score_views},
    )
    q = _question(case, image, n)
    rt = Runtime.start(cfg)
    try:
        job = rt.job(type("Item", (), {"nodeid": f"t::{q.key}", "question": q})())
        with replies.lock:
            replies.by_prompt[job.prompt] = list(case["replies"])  # type: ignore[call-overload]  # replies: the case's list of str
        live = rt.ask(f"t::{q.key}", q).result(60)
        rt.store.record_item(cfg.run_id, f"t::{q.key}", bench, question_record(q, live.prompt, live.sent_size),
                             live.fingerprints)
    finally:
        rt.close()
    assert live.record is not None and not live.record.failed_arms
    reported = []
    store = ResultStore(cfg.store_path)
    try:
        [result] = collect(store, cfg.run_id, iterations=0, each=lambda b, t: reported.append)
    finally:
        store.close()
    [report] = reported
    assert report.arm_verdicts() == live.record.arm_verdicts()
    assert report.outcome == live.record.outcome == result.items[0].outcome
    assert report.views == live.record.views  # IoU, Acc@0.5, the official rules: the same numbers
    assert report.options == live.record.options
    # and the item's own view of it (satbench_ask's documented shape) says the same
    assert {a: live.arms[a].correct for a in live.arms} == {a: report.correct(a) for a in report.rows}


def test_a_qwen25vl_box_is_scored_in_the_image_the_model_saw(server, tmp_path: Path) -> None:
    """The regression itself: a 512x512 image is seen at 504x504 by Qwen2.5-VL; a right box in
    that space has IoU 1 on the item and in the report alike."""
    srv, replies = server
    image = tmp_path / "img.png"
    Image.new("RGB", (512, 512), (30, 90, 160)).save(image)
    gt = "{<50><50><51><51>}"  # 0-100 grid: (252..257.04) in the 504-pixel space the model saw
    q = Question(benchmark="vrsbench_ref", key="k", image=ImageRef(id="img", path=str(image)), text="a car",
                 answer=gt, types=("unique",), kind="ref")
    cfg = RuntimeConfig(run_id="q25", tag="t", urls=(srv.url,), store_path=tmp_path / "r.sqlite",
                        prompt_style="qwen25vl", score_views={"vrsbench_ref": registry.get("vrsbench_ref").score_views})
    rt = Runtime.start(cfg)
    try:
        job = rt.job(type("Item", (), {"nodeid": "t::k", "question": q})())
        with replies.lock:
            replies.by_prompt[job.prompt] = ["[252, 252, 257, 257]"]
        live = rt.ask("t::k", q).result(60)
        rt.store.record_item("q25", "t::k", "vrsbench_ref", question_record(q, live.prompt, live.sent_size),
                             live.fingerprints)
    finally:
        rt.close()
    store = ResultStore(cfg.store_path)
    reported = []
    try:
        collect(store, "q25", iterations=0, each=lambda b, t: reported.append)
    finally:
        store.close()
    assert live.record is not None and live.record.options.image_size == (504, 504)
    assert live.record.views["orig"]["acc@0.5"] == 1.0 == reported[0].views["orig"]["acc@0.5"]
    assert live.record.views["orig"]["iou"] == pytest.approx(0.99208, abs=1e-5) == reported[0].views["orig"]["iou"]
