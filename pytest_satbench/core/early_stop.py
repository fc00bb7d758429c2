"""`--precision` / `--margin` as a run applies them: images enter the confidence sequences in
the run's order, the rule is checked at every look, and which questions are asked is a
function of the answers alone. The live run (`plugin/sequential.py`) and every report
(`report/build.py`, rebuilding from the store's rows) use the same code, so they agree on
when the rule was met and what the sequences are.

Errors. An item whose arm got no answer counts that arm as wrong: it stays in the
denominator, as in every figure of the project (`core/stats.py`). A run with errors is
not made to stop sooner or later by leaving them out.

The look-ahead and determinism. Requests are sent ahead of the item pytest is running
(`engine/lookahead.py`), so when the rule is met some later images are already asked. If
what was asked ahead depended on timing, a rerun of the same command would ask again what
the first run happened not to reach, and the set of asked images would depend on server
speed. So the rule is given a fixed lag of `lag` images (`lag_images`, from the caps and the
benchmark's questions per image): the image at position ``p`` of the order is asked if and
only if the rule was not met after the first ``p - lag`` images. The images asked are then
exactly the first ``stopped_at + lag`` ones, whatever the timing; the look-ahead may run at
most ``lag`` images ahead of the last complete one, which is what keeps every server busy.
Images asked after the rule was met enter the sequences too (they are valid at every look,
so also at a later one) and are in every figure; the report says how many images each
number rests on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pytest_satbench.core.arms import ORIG, is_recon
from pytest_satbench.core.sequential import StoppingRule

__all__ = ["ASK", "SKIP", "OrderedRule", "decide", "lag_images", "replay", "skip_reason"]

ASK, SKIP = "ask", "skip"


def lag_images(in_flight_cap: int, questions_per_image: float, arms: int) -> int:
    """How many images the look-ahead may be ahead of the rule: enough to hold twice the
    requests the caps allow in flight (the look-ahead's own window), plus one."""
    per_image = max(1.0, questions_per_image) * max(1, arms)
    return int(math.ceil(2 * max(1, in_flight_cap) / per_image)) + 1


def decide(position: int, frontier: int, stopped_at: int | None, lag: int) -> str | None:
    """Whether the image at `position` (0-based) is asked: ASK unless the rule was met after
    at most ``position - lag`` images (SKIP); None while that is not known yet (fewer than
    ``position - lag`` images have entered the sequences and the rule is not met)."""
    if stopped_at is not None and stopped_at <= position - lag:
        return SKIP
    if stopped_at is not None or frontier >= position - lag:
        return ASK
    return None


def skip_reason(reason: str | None) -> str:
    return f"not needed: {reason}"


class OrderedRule:
    """A `StoppingRule` fed one complete image at a time, in the run's order, checked after
    every image. Questions may arrive in any order (xdist workers, answers that complete
    early): `add_question` counts them per image, and an image enters only when it is
    complete and every earlier image has entered (`StoppingRule.add`'s ``position``)."""

    def __init__(self, n_images: int, questions_total: int, arms: Sequence[str], *,
                 precision: float | None, margin: float | None) -> None:
        self.arms = tuple(arms)
        self.recon = tuple(a for a in self.arms if is_recon(a))
        self.rule = StoppingRule(n_images, self.recon, precision=precision, margin=margin,
                                 other_arms=tuple(a for a in self.arms if a != ORIG and a not in self.recon),
                                 questions_total=questions_total)
        self._parts: dict[int, list[float]] = {}  # position -> [questions seen, correct per arm...]
        self._complete: dict[int, tuple[int, dict[str, float]]] = {}
        self.stopped_at: int | None = None

    @property
    def frontier(self) -> int:
        """Images in the sequences: the first `frontier` images of the order."""
        return self.rule.images

    def add_question(self, position: int, questions_of_image: int, correct: Sequence[bool | int]) -> int:
        """One question of the image at `position` (which has `questions_of_image` questions)
        with its correctness per arm (in `arms`' order). Returns how many images entered."""
        part = self._parts.setdefault(position, [0.0] * (1 + len(self.arms)))
        part[0] += 1
        for i, c in enumerate(correct):
            part[1 + i] += 1 if c else 0
        if part[0] < questions_of_image:
            return 0
        del self._parts[position]
        return self.add_image(position, questions_of_image, dict(zip(self.arms, part[1:])))

    def add_image(self, position: int, questions: int, correct: Mapping[str, float]) -> int:
        self._complete[position] = (questions, dict(correct))
        entered = 0
        while self.rule.images in self._complete:
            m, c = self._complete.pop(self.rule.images)
            self.rule.add(m, c, position=self.rule.images)
            entered += 1
            if self.stopped_at is None and self.rule.check():
                self.stopped_at = self.rule.stopped_at
        return entered

    def to_dict(self, order: Mapping[str, Any]) -> dict[str, Any]:
        """summary.json's "sequential" block, with the order the run used."""
        out = self.rule.to_dict()
        out["order"] = dict(order)
        return out


def replay(plan: Mapping[str, Any], per_image: Mapping[str, tuple[int, Mapping[str, float]]],
           arms: Iterable[str]) -> dict[str, Any]:
    """The run's sequences rebuilt from stored answers: `plan` is what the run recorded in its
    protocol for the benchmark (`images`: ``[image id, questions]`` in the order asked, the
    rule, the order), `per_image` the stored questions and correct answers per arm of each
    image. Images enter in the order until the first one not completely stored."""
    images = [(str(i), int(m)) for i, m in plan["images"]]
    total = sum(m for _, m in images)
    wanted = [a for a in arms if a == ORIG or is_recon(a)]
    ordered = OrderedRule(len(images), total, wanted, precision=plan.get("precision"), margin=plan.get("margin"))
    for position, (image, m) in enumerate(images):
        got = per_image.get(image)
        if got is None or got[0] < m:
            break
        ordered.add_image(position, m, {a: min(float(got[1].get(a, 0)), m) for a in wanted})
    out = ordered.to_dict(plan.get("order") or {})
    out["lag"] = plan.get("lag")
    return out


def summary_line(benchmark: str, seq: Mapping[str, Any]) -> str:
    """The terminal's line for one benchmark's "sequential" block (summary.json's): the rule,
    stopped or not, images and questions answered of the total, and each arm's figure with
    its 95% confidence sequence in brackets."""
    from pytest_satbench.core.arms import short_label

    if seq.get("stopped"):
        state = f"stopped, {seq['reason']}"
    else:
        state = "not met, every image asked" if seq.get("images_answered") == seq.get("images_total") else "not met"
    arms = []
    for arm, got in (seq.get("arms") or {}).items():
        what = "delta" if "delta" in got else "accuracy"
        value = got[what]
        lo, hi = got["cs"]
        if value is None or lo is None or hi is None:
            arms.append(f"{short_label(arm)} {what}: no image yet")
            continue
        sign = "+" if what == "delta" else ""
        decided = f" ({got['margin']})" if got.get("margin") else ""
        arms.append(f"{short_label(arm)} {what} {value:{sign}.1f} [{lo:{sign}.1f}, {hi:{sign}.1f}]{decided}")
    return (f"{benchmark}: {seq['rule']}: {state}; {seq['images_answered']}/{seq['images_total']} images, "
            f"{seq['questions_answered']}/{seq['questions_total']} questions answered; " + "; ".join(arms))


SUMMARY_NOTE = ("in brackets: 95% confidence sequences, valid at every look; the fixed-sample 95% CIs above are "
                "not valid after an early stop")
