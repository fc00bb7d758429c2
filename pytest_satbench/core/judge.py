"""VRSBench's official VQA protocol: deterministic rules first, an LLM judge for the rest.

The official evaluation (lx709/VRSBench, `eval_fianl/eval_vqa_gpt.ipynb`) lower-cases the
ground truth `gt` and the model's answer `pred`, then decides:

1. `gt` is a substring of `pred`: a match;
2. else, when `gt` is `yes`, `no` or a number 0-99: a match only when `gt == pred`;
3. else it asks GPT-4o-mini whether `pred` matches `gt` "by semantic meaning", with the prompt
   `JUDGE_PROMPT` reproduces (its wording is part of the protocol: a judge asked otherwise
   would be a different measurement), and counts the question right only when the judge's
   reply is exactly `1`.

`official_rules` returns the verdict of rules 1-2, or None where rule 3 (the judge) decides.
Deviations, each for reproducibility: the judge is asked at temperature 0 (the notebook uses
the API's default), through `--judge URL[,MODEL]` (any OpenAI-compatible server, so the judge
model is the user's choice and is recorded in protocol.json), and its reply is stripped of
surrounding white space before the comparison with `1`.
"""

from __future__ import annotations

JUDGED_VIEW = "official"  # the benchmarks whose score views include it are judged
JUDGE_MAX_TOKENS = 100  # as the official notebook
JUDGE_STYLE = "vrsbench-judge"  # the judge's prompt convention, part of its fingerprint
_EXACT = frozenset(["yes", "no", *map(str, range(100))])

# The official notebook's prompt, word for word (see the module docstring for why).
JUDGE_PROMPT = (
    "Question: {question}\nGround Truth Answer: {ground_truth}\nPredicted Answer: {predicted}\n"
    "Does the predicted answer match the ground truth? Answer 1 for match and 0 for not match. "
    "Use semantic meaning not exact match. Synonyms are also treated as a match, e.g., football and "
    "soccer, playground and ground track field, building and rooftop, pond and swimming pool. "
    "Do not explain the reason.\n"
)


def official_rules(ground_truth: str, predicted: str) -> bool | None:
    """Rules 1-2 of the official evaluation on the lower-cased texts; None: the judge decides."""
    g, p = ground_truth.strip().lower(), predicted.strip().lower()
    if not g:
        return False
    if g in p:
        return True
    if g in _EXACT:
        return g == p
    return None


def judge_prompt(question: str, ground_truth: str, predicted: str) -> str:
    return JUDGE_PROMPT.format(question=question, ground_truth=ground_truth.lower(), predicted=predicted.lower())


def judge_verdict(reply: str) -> bool:
    """The official reading of the judge's reply: a match only when it is `1`."""
    return reply.strip() == "1"
