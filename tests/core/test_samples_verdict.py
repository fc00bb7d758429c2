"""--samples K's rule (core/verdict.py `SampleVerdict`) and figures (core/stats.py
`summarize_samples`, `FigureInput.credit`): the arm names, mean-of-K, the majority vote and its
tie rule, agreement, a missing sample as an error, boxes without a majority, samples beyond K
left out, and the judge ruling on every sample (a real runtime against loopback servers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from servers import FakeVLM

from pytest_satbench.core import arms as A
from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.core.records import AnswerRow
from pytest_satbench.core.scoring import ScoreOptions
from pytest_satbench.core.stats import ArmOutcome, FigureInput, QuestionRecord, summarize_samples
from pytest_satbench.core.verdict import ERROR, score_question


def _q(answer: str = "yes", kind: str = "vqa", key: str = "q1", image: str = "img") -> Question:
    return Question(benchmark="b", key=key, image=ImageRef(image, data=b""), text="Is there a road?", answer=answer,
                    types=("presence",), kind=kind)  # type: ignore[arg-type]  # kind: one of Question's kinds


def _rows(q: Question, answers: dict[str, str | None]) -> dict[str, AnswerRow]:
    return {arm: AnswerRow(nodeid="n", arm=arm, fingerprint=arm, status="ok" if text is not None else "error",
                           benchmark="b", question_key=q.key, image_id=q.image.id, text=text,
                           error=None if text is not None else "boom")
            for arm, text in answers.items()}


def test_sample_arm_names() -> None:
    assert A.sample_arm("orig", 1) == "orig" and A.sample_arm("orig", 3) == "orig@3"
    assert A.sample_of("jpeg:quality=10@2") == ("jpeg:quality=10", 2) and A.sample_of("orig") == ("orig", 1)
    assert A.is_sample("blind@4") and not A.is_sample("orig") and not A.is_sample("judge:orig@2")
    assert not A.is_sample("x@1") and not A.is_sample("x@02") and not A.is_sample("@2")
    assert not A.is_recon("jpeg:quality=10@2") and A.image_arm("jpeg:quality=10@2") == "jpeg:quality=10"
    assert A.image_arm("orig~2") == "orig" and A.judged(A.judge_arm("orig@2")) == "orig@2"


def test_mean_majority_agreement_and_the_tie_rule() -> None:
    q = _q("yes")
    rows = _rows(q, {"orig": "yes", "r": "no", "orig@2": "no", "r@2": "yes", "orig@3": "yes", "r@3": "maybe",
                     "orig@4": "no", "r@4": "no"})
    got = score_question("n", q, rows, ScoreOptions(), samples=3)
    assert "orig@4" not in got.rows and "r@4" not in got.rows  # beyond K: left out
    orig, r = got.samples["orig"], got.samples["r"]
    assert (orig.mean, orig.majority, orig.majority_correct, orig.agreement) == (2 / 3, "yes", True, 2 / 3)
    # r: no, yes, maybe: a three-way tie goes to the earliest sample's answer
    assert (r.mean, r.majority, r.majority_correct, r.agreement) == (1 / 3, "no", False, 1 / 3)
    assert got.outcome == "regressed"  # sample 1 decides the outcome: orig right, r wrong
    assert set(got.views) <= {"orig", "r"}  # samples are no arms of their own


def test_a_missing_or_failed_sample_is_an_error_for_its_arm() -> None:
    q = _q("yes")
    got = score_question("n", q, _rows(q, {"orig": "yes", "orig@2": "yes"}), ScoreOptions(), samples=3)
    assert got.rows["orig@3"].status == "error" and "not asked" in (got.rows["orig@3"].error or "")
    assert got.outcome == ERROR and got.failed_arms == ["orig@3"]
    assert got.samples["orig"].error and got.samples["orig"].mean == 0.0 and got.samples["orig"].majority_correct is False
    failed = score_question("n", q, _rows(q, {"orig": "yes", "orig@2": None}), ScoreOptions(), samples=2)
    assert failed.outcome == ERROR and failed.samples["orig"].error
    # K = 1: the rows as given, no sample verdicts, samples of an earlier larger K left out
    one = score_question("n", q, _rows(q, {"orig": "yes", "orig@2": None}), ScoreOptions())
    assert one.samples == {} and list(one.rows) == ["orig"] and one.outcome == "correct"
    plain = _rows(q, {"orig": "yes"})
    assert score_question("n", q, plain, ScoreOptions()).rows is plain


def test_boxes_have_no_majority() -> None:
    q = _q("{<25><40><33><60>}", kind="ref")
    got = score_question("n", q, _rows(q, {"orig": "{<25><40><33><60>}", "orig@2": "{<27><42><35><62>}"}),
                         ScoreOptions(box_grid="100"), samples=2)
    s = got.samples["orig"]
    assert s.majority is None and s.majority_correct is None and s.agreement is None and s.mean == 1.0
    assert s.value("iou") == pytest.approx((1.0 + 0.543) / 2, abs=1e-3)  # mean-of-K of the view


def _record(key: str, image: str, orig: tuple[bool, ...], recon: tuple[bool, ...], kind: str = "vqa") -> QuestionRecord:
    q = _q("yes", kind=kind, key=key, image=image)
    answers: dict[str, str | None] = {}
    for arm, marks in (("orig", orig), ("r", recon)):
        for k, right in enumerate(marks, 1):
            answers[A.sample_arm(arm, k)] = "yes" if right else "no"
    it = score_question(key, q, _rows(q, answers), ScoreOptions(), samples=len(orig))
    arms = {a: ArmOutcome("ok", it.correct(a), True) for a in ("orig", "r")}
    return QuestionRecord(key, image, ("presence",), arms, samples=it.samples)


def test_sample_figures_are_fractional_ratios_clustered_by_image() -> None:
    records = [_record("1", "a", (True, True, False), (True, False, False)),
               _record("2", "a", (True, True, True), (True, True, True)),
               _record("3", "b", (False, False, True), (False, True, True)),
               _record("4", "c", (True, True, True), (False, False, False))]
    ss = summarize_samples(records, iterations=500, seed=1)
    assert ss is not None and ss.k == 3 and ss.arms == ("orig", "r")
    o, r = ss.overall.arms["orig"], ss.overall.arms["r"]
    assert o.mean == pytest.approx((2 + 3 + 1 + 3) / 12) and r.mean == pytest.approx((1 + 3 + 2 + 0) / 12)
    assert o.majority == pytest.approx(3 / 4) and r.majority == pytest.approx(2 / 4)
    assert o.agreement == pytest.approx((2 / 3 + 1 + 2 / 3 + 1) / 4)
    assert o.ci_low <= o.mean <= o.ci_high and o.ci_low < o.ci_high
    p = ss.overall.paired["r"]
    assert p.delta == pytest.approx(100 * (6 - 9) / 12) and p.n_pairs == 4 and p.ci_low <= p.delta <= p.ci_high
    # the benchmark's figures read the same per-question mean-of-K
    assert FigureInput(records).credit("orig", None) == pytest.approx(np.array([2 / 3, 1, 1 / 3, 1]))
    assert summarize_samples([QuestionRecord("1", "a", ("t",), {"orig": ArmOutcome("ok", True, True)})],
                             iterations=10) is None


def test_the_judge_rules_on_every_sample(tmp_path: Path) -> None:
    from pytest_satbench.datasets.vrsbench import VQA_VIEWS
    from pytest_satbench.engine.config import RuntimeConfig
    from pytest_satbench.engine.runtime import Runtime

    path = tmp_path / "img.png"
    Image.new("RGB", (32, 32), (30, 90, 160)).save(path)
    q = Question(benchmark="vrs", key="1", image=ImageRef(id="img", path=str(path)), text="What is football field?",
                 answer="football field", types=("object category",))
    with FakeVLM(["m"], answer=lambda p, h, i: "soccer pitch") as srv, \
            FakeVLM(["judge-m"], answer=lambda p, h, i: "1") as judge:
        cfg = RuntimeConfig(run_id="r", tag="t", urls=(srv.url,), store_path=tmp_path / "s.sqlite",
                            judge_url=judge.url, samples=3, temperature=0.7,
                            score_views={"vrs": VQA_VIEWS})
        rt = Runtime.start(cfg)
        assert any("--samples 3" in n for n in rt.notices) is False  # temperature above 0: no warning
        got = rt.ask("t::1", q).result(60)
        rt.close()
        assert srv.chat_requests == 3 and judge.chat_requests == 3
        assert [r.body.get("seed") for r in srv.recorded].count(None) == 1  # sample 1: the run's own (none)
        assert sorted(r.body.get("seed") or 0 for r in srv.recorded) == [0, 1, 2]
    assert {"judge:orig", "judge:orig@2", "judge:orig@3"} <= set(got.arms)
    assert got.record is not None and got.record.outcome == "wrong"  # exact match (the table's verdict)
    s = got.record.samples["orig"]
    assert s.mean == 0.0 and s.value("official") == 1.0  # exact match never, the judge every time


def test_samples_at_temperature_zero_say_so_in_one_line(tmp_path: Path) -> None:
    from pytest_satbench.engine.config import RuntimeConfig
    from pytest_satbench.engine.runtime import Runtime

    with FakeVLM(["m"]) as srv:
        rt = Runtime.start(RuntimeConfig(run_id="r", tag="t", urls=(srv.url,), store_path=tmp_path / "s.sqlite",
                                         samples=2))
        rt.close()
    assert [n for n in rt.notices if "--samples" in n] == [
        "--samples 2 at temperature 0: greedy decoding gives every sample the same answer (only a server that "
        "honours the request seed differs); pass --temperature, e.g. 0.7"]
