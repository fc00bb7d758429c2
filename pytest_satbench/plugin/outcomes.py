"""How one item's answers become a pytest outcome and a progress letter.

Letters (`-q`) and words (`-v`):
  .  SAME        every reconstruction arm agrees with the original on correctness
  R  REGRESSED   the original was right and some reconstruction wrong
  I  IMPROVED    the original was wrong and some reconstruction right (none regressed)
  w  WRONG       no reconstruction arm ran and the original was wrong
  F  FAILED      an arm got no answer (transport or server failure after retries, or an
                 unreadable image); the one-line reason is in the failure section

An item fails only for errors, unless `--fail-on regression` also fails regressions; so
`--lf` reruns exactly the errored items (and the regressions under that option). Wrong
answers are results, not failures: they are never retried.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_satbench.core.verdict import CORRECT, ERROR, IMPROVED, REGRESSED, SAME, WRONG

if TYPE_CHECKING:
    from pytest_satbench.core.verdict import QuestionResult
    from pytest_satbench.engine.answering import ItemResult

__all__ = ["CORRECT", "ERROR", "IMPROVED", "REGRESSED", "SAME", "WRONG", "classify", "failure_message",
           "regression_message", "teststatus"]


def classify(result: ItemResult) -> str:
    """The item's outcome: its record's (`core.verdict.Verdicts.outcome`, the one rule)."""
    return result.record.outcome if result.record is not None else ERROR


def failure_message(result: ItemResult) -> str:
    """One line for the terminal and junit XML; a server may echo a credential in its error."""
    from pytest_satbench.core.redact import redact

    record = result.record
    if record is None:
        return redact(result.verdict_error or "no verdict")
    return redact("; ".join(f"{arm}: {record.rows[arm].error}" for arm in record.failed_arms))


def regression_message(record: QuestionResult) -> str:
    q = record.question
    bits = [f"expected {q.answer!r}", f"orig answered {_short(record, 'orig')}"]
    bits += [f"{arm} answered {_short(record, arm)}" for arm in record.regressed_arms]
    return "REGRESSED: " + ", ".join(bits)


def _short(record: QuestionResult, arm: str) -> str:
    sc = record.scores.get(arm)
    text = sc.extracted if sc is not None else (record.rows[arm].text or "")
    text = " ".join(str(text).split())
    return repr(text[:60] + ("..." if len(text) > 60 else ""))


_STATUS = {
    SAME: ("passed", ".", "SAME"),
    CORRECT: ("passed", ".", "CORRECT"),
    WRONG: ("wrong", "w", ("WRONG", {"yellow": True})),
    REGRESSED: ("regressed", "R", ("REGRESSED", {"red": True})),
    IMPROVED: ("improved", "I", ("IMPROVED", {"green": True})),
}


def teststatus(outcome: str, failed: bool) -> tuple[str, str, Any] | None:
    if failed:
        if outcome == REGRESSED:
            # counted as failed so it shows in FAILURES, -r and --lf
            return "failed", "R", ("REGRESSED", {"red": True})
        return None  # errors: pytest's own F / FAILED
    return _STATUS.get(outcome)
