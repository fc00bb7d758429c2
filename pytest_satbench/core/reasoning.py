"""How much a reasoning model thought, per arm: `Usage.reasoning`, the reports' reasoning table.

A reasoning model's thinking (`reasoning_content` from vLLM's reasoning parsers, or the
`<think>...</think>` a server leaves inline: engine/wire.py) is stored beside the answer and
never scored. What is reported of it is its length, per arm, because whether a model thinks
longer about a worse reconstruction is a question users ask:

- reasoning tokens: `usage.completion_tokens_details.reasoning_tokens` where the server reports
  it (OpenAI's field; vLLM reports it for some reasoning parsers only). Otherwise an
  **estimate**: the reply's completion tokens times the reasoning's share of the reply's
  characters (reasoning characters / (reasoning + answer characters)), which assumes thinking
  and answer tokenise alike; reports label every figure that includes an estimate.
- truncated: answers that stopped for length (`finish_reason: "length"`); truncated while
  thinking: of those, the ones with reasoning and no final answer (content null, or a `<think>`
  never closed): the model spent `--max-new` thinking. They are answers, scored on what they
  contain (usually wrong, as the official rules score an empty answer), never retried.

Counted over the arm's answers ("ok" rows), its --repeat-orig and --samples asks included
(`arms.image_arm`: an arm's asks are one model looking at one image), the judge's replies left
out (they are not the model measured); the mean and median are over the answers that carry
reasoning. Clipping (`--max-answer-chars`) shortens the stored reasoning text, not its
length (`reasoning_chars` is the length before clipping).
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field

from pytest_satbench.core import arms as A
from pytest_satbench.core.records import AnswerRow
from pytest_satbench.core.scoring import final_answer

__all__ = ["ReasoningStats", "ReasoningTally", "estimated_tokens", "thinking_cut_off"]

_INLINE = re.compile(r"</?(?:think|reasoning)\s*>", re.IGNORECASE)


@dataclass(slots=True)
class ReasoningStats:
    """One arm's reasoning (module docstring)."""

    answers: int = 0  # the arm's answers
    with_reasoning: int = 0  # of those, answers that carried reasoning
    reported: int = 0  # of those, answers whose reasoning tokens the server reported
    estimated: int = 0  # of those, answers whose reasoning tokens are an estimate from characters
    tokens_mean: float | None = None  # reasoning tokens per answer with reasoning (reported or estimated)
    tokens_median: float | None = None
    chars_mean: float | None = None  # reasoning characters per answer with reasoning
    truncated: int = 0  # answers that stopped for length
    truncated_thinking: int = 0  # of those, cut off while thinking (no final answer)


def estimated_tokens(r: AnswerRow) -> float | None:
    """Reasoning tokens estimated from characters: completion tokens x the reasoning's share of
    the reply's characters; None without reasoning or completion tokens. Thinking left inline is
    part of the stored text, so the answer's characters are the text's less the reasoning's."""
    if r.reasoning_chars is None or r.completion_tokens is None:
        return None
    text = len(r.text or "")
    answer = max(0, text - r.reasoning_chars) if r.text and _INLINE.search(r.text) else text
    total = r.reasoning_chars + answer
    return r.completion_tokens * r.reasoning_chars / total if total else 0.0


def thinking_cut_off(r: AnswerRow) -> bool:
    """The reply stopped for length while the model was thinking: reasoning, and no final answer."""
    return (r.status == "ok" and r.finish_reason == "length" and r.reasoning_chars is not None
            and not final_answer(r.text or ""))


@dataclass(slots=True)
class _Arm:
    answers: int = 0
    reported: int = 0
    estimated: int = 0
    chars: int = 0
    truncated: int = 0
    cut_off: int = 0
    tokens: array[float] = field(default_factory=lambda: array("d"))  # 8 bytes per answer with reasoning


class ReasoningTally:
    """The rows' reasoning summed per arm as they go by (`usage.UsageTally` feeds it)."""

    def __init__(self) -> None:
        self._arms: dict[str, _Arm] = {}

    def add(self, rows: Mapping[str, AnswerRow]) -> None:
        for asked, r in rows.items():
            if r.status != "ok" or A.is_judge(asked):
                continue
            arm = A.image_arm(asked)
            a = self._arms.get(arm)
            if a is None:
                a = self._arms[arm] = _Arm()
            a.answers += 1
            if r.finish_reason == "length":
                a.truncated += 1
                a.cut_off += thinking_cut_off(r)
            if r.reasoning_chars is None:
                continue
            a.chars += r.reasoning_chars
            if r.reasoning_tokens is not None:
                a.reported += 1
                a.tokens.append(float(r.reasoning_tokens))
            else:
                est = estimated_tokens(r)
                if est is not None:
                    a.estimated += 1
                    a.tokens.append(est)
                else:
                    a.tokens.append(math.nan)  # reasoning without any token count: counted, not measured

    def stats(self) -> dict[str, ReasoningStats]:
        """Per arm whose answers carried reasoning or were cut off thinking; {} for a model that
        never reasons."""
        out: dict[str, ReasoningStats] = {}
        for arm, a in self._arms.items():
            n = len(a.tokens)
            if not n and not a.cut_off:
                continue
            measured = sorted(t for t in a.tokens if not math.isnan(t))
            out[arm] = ReasoningStats(
                answers=a.answers, with_reasoning=n, reported=a.reported, estimated=a.estimated,
                tokens_mean=math.fsum(measured) / len(measured) if measured else None,
                tokens_median=_median(measured), chars_mean=a.chars / n if n else None,
                truncated=a.truncated, truncated_thinking=a.cut_off,
            )
        return out


def _median(xs: list[float]) -> float | None:
    if not xs:
        return None
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2
