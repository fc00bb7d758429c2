"""VRSBench's official judge (`--judge`), against real loopback servers: only answers the
official rules leave undecided reach it, its verdicts are stored and reused, and a judge that
fails gives an error, never a verdict."""

from __future__ import annotations

from pathlib import Path

from PIL import Image
from servers import Fail, FakeVLM

from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.engine.config import RuntimeConfig
from pytest_satbench.engine.runtime import Runtime
from pytest_satbench.engine.store import ResultStore

# ground truth -> what the model answers
CASES = {
    "ship": "a ship.",  # rule 1: the ground truth is in the answer
    "2": "3",  # rule 2: numbers are exact
    "football field": "soccer pitch",  # the judge decides: a match
    "pond": "a river",  # the judge decides: no match
}


def _questions(tmp_path: Path) -> list[Question]:
    path = tmp_path / "img.png"
    Image.new("RGB", (32, 32), (30, 90, 160)).save(path)
    return [Question(benchmark="vrs", key=str(i), image=ImageRef(id="img", path=str(path)), text=f"What is {gt}?",
                     answer=gt, types=("object category",)) for i, gt in enumerate(CASES)]


def _model(prompt: str, has_image: bool, image: bytes | None) -> str:
    return next(ans for gt, ans in CASES.items() if f"What is {gt}?" in prompt)


def _judge(prompt: str, has_image: bool, image: bytes | None) -> str:
    return "1" if "soccer pitch" in prompt else "0"


def _config(tmp_path: Path, url: str, judge: str, run_id: str) -> RuntimeConfig:
    return RuntimeConfig(run_id=run_id, tag="t", urls=(url,), store_path=tmp_path / "s.sqlite", judge_url=judge,
                         score_views={"vrs": frozenset({"official"})})


def test_only_undecided_answers_reach_the_judge_and_its_verdicts_are_reused(tmp_path: Path) -> None:
    qs = _questions(tmp_path)
    with FakeVLM(["m"], answer=_model) as srv, FakeVLM(["judge-m"], answer=_judge) as judge:
        for run in ("r1", "r2"):
            rt = Runtime.start(_config(tmp_path, srv.url, judge.url, run))
            results = [rt.ask(f"t::{q.key}", q).result(30) for q in qs]
            rt.close()
            assert judge.chat_requests == 2  # two undecided answers, asked once over both runs
        assert srv.chat_requests == 4
        prompts = [r.prompt for r in judge.recorded if "Ground Truth Answer" in r.prompt]
    assert len(prompts) == 2 and all("Do not explain the reason." in p for p in prompts)
    assert "Ground Truth Answer: football field\nPredicted Answer: soccer pitch\n" in prompts[0] + prompts[1]
    verdicts = {q.answer: r.arms.get("judge:orig") for q, r in zip(qs, results, strict=True)}
    assert verdicts["ship"] is None and verdicts["2"] is None  # the rules decided
    assert verdicts["football field"].text == "1" and verdicts["football field"].from_store
    assert verdicts["pond"].text == "0"
    store = ResultStore(tmp_path / "s.sqlite")
    proto = store.runs()[0]["protocol"]
    rows = [r for r in store.rows() if r.arm == "judge:orig"]
    store.close()
    assert proto["judge"] == {"server": judge.url, "model": "judge-m"}  # type: ignore[index]  # runs() parses the protocol to a dict
    assert sorted((r.text, r.correct, r.model) for r in rows) == [("0", False, "judge-m"), ("1", True, "judge-m")]


def test_a_judge_that_fails_is_an_error_never_a_verdict(tmp_path: Path) -> None:
    qs = _questions(tmp_path)
    with FakeVLM(["m"], answer=_model) as srv, FakeVLM(["judge-m"], answer=_judge,
                                                      fail_always=Fail.http(500)) as judge:
        cfg = RuntimeConfig(run_id="r", tag="t", urls=(srv.url,), store_path=tmp_path / "s.sqlite",
                            judge_url=judge.url, retries=1, score_views={"vrs": frozenset({"official"})})
        rt = Runtime.start(cfg)
        results = [rt.ask(f"t::{q.key}", q).result(60) for q in qs]
        rt.close()
    undecided = [r for q, r in zip(qs, results, strict=True) if q.answer in ("football field", "pond")]
    assert all(r.arms["judge:orig"].status == "error" and "judge:" in (r.arms["judge:orig"].error or "")
               for r in undecided)
    assert all(r.errors for r in undecided)  # the item fails, as for any error
    decided = [r for q, r in zip(qs, results, strict=True) if q.answer in ("ship", "2")]
    assert not any(r.errors for r in decided)
