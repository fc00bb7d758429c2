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

from pytest_satbench.core.arms import ORIG, is_recon

if TYPE_CHECKING:
    from pytest_satbench.engine.answering import ItemResult

SAME, REGRESSED, IMPROVED, WRONG, CORRECT, ERROR = "same", "regressed", "improved", "wrong", "correct", "error"


def classify(result: ItemResult) -> str:
    if result.errors:
        return ERROR
    orig = result.arms[ORIG].correct
    recon = [a for name, a in result.arms.items() if is_recon(name)]
    if not recon:
        return CORRECT if orig else WRONG
    if orig and any(not a.correct for a in recon):
        return REGRESSED
    if not orig and any(a.correct for a in recon):
        return IMPROVED
    return SAME


def failure_message(result: ItemResult) -> str:
    """One line for the terminal and junit XML; a server may echo a credential in its error."""
    from pytest_satbench.core.redact import redact

    return redact("; ".join(f"{a.arm}: {a.error}" for a in result.errors))


def regression_message(result: ItemResult) -> str:
    q = result.question
    orig = result.arms[ORIG]
    bits = [f"expected {q.answer!r}", f"orig answered {_short(orig)}"]
    for name, a in result.arms.items():
        if is_recon(name) and not a.correct:
            bits.append(f"{name} answered {_short(a)}")
    return "REGRESSED: " + ", ".join(bits)


def _short(a: Any) -> str:
    text = a.score.extracted if a.score is not None else (a.text or "")
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
