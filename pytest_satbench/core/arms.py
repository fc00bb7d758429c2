"""What an arm is: one way of showing the model an image, and its name everywhere.

Every question is asked once per arm:

- `orig`: the original image (the reference every delta is measured against);
- one reconstruction arm per `--recon SPEC`, named by its canonical spec
  (`jpeg:quality=10`, `onedpiece:ckpt=/w/s.bin,max_tiles=12,nlatent=48,...`);
- `blind`: no image at all (`--blind`, the language-prior control);
- `orig~2`, `orig~3`, ...: the original asked again (`--repeat-orig`), which measure the
  servers' noise floor and are never an arm of the comparison;
- `judge:orig`, `judge:<recon arm>`: an LLM judge's verdict on that arm's answer (`--judge`,
  VRSBench's official evaluation), never an arm of the comparison either;
- `orig@2`, `<recon arm>@2`, `blind@2`, ...: the k-th sample of that arm (`--samples K`, each
  sent with its own request seed); sample 1 is the arm itself, so raising K on a resumed run
  asks only the new samples and lowering it reuses a subset. A sample is never an arm of the
  comparison: the arm's figures read its samples (`core.verdict.SampleVerdict`). A judge
  rules on a sample's answer as on any arm's (`judge:orig@2`).

The same arm has the same short label in the terminal, report.md and report.html
(`arm_labels`), so a figure can be found again from one place to the other. A
reconstruction arm's label is its codec's (`jpeg:q10`, `tok48`): core never reads a spec, it
asks the labeller the codec registry installs (`use_labeller`, done by `pytest_satbench.codecs`
when it is imported); with none, an arm is labelled by its name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pytest_satbench.core.formatting import prose

ORIG = "orig"
BLIND = "blind"
REPEAT = "orig~"  # orig~2, orig~3...: the original asked again (--repeat-orig noise floor)
JUDGE = "judge:"  # judge:orig...: the judge's verdict on that arm's answer (--judge)
SAMPLE = "@"  # orig@2, <recon arm>@2...: the arm's k-th sample (--samples K), k >= 2
RESERVED = (ORIG, BLIND)

# A table column has about 8 characters; a One-D-Piece arm's checkpoint path is long and
# the same for every budget, so labels keep only what tells arms apart.
LABEL_WIDTH = 8


def is_repeat(arm: str) -> bool:
    return arm.startswith(REPEAT)


def repeat_arm(ask: int) -> str:
    """The arm name of the `ask`-th ask of the original (2, 3, ...)."""
    return f"{REPEAT}{ask}"


def is_judge(arm: str) -> bool:
    return arm.startswith(JUDGE)


def judge_arm(arm: str) -> str:
    """The arm that holds the judge's verdict on `arm`'s answer."""
    return JUDGE + arm


def judged(arm: str) -> str:
    """The arm a judge arm rules on."""
    return arm[len(JUDGE):]


def sample_arm(arm: str, k: int) -> str:
    """The arm name of `arm`'s `k`-th sample (--samples): the arm itself for k == 1."""
    return arm if k == 1 else f"{arm}{SAMPLE}{k}"


def _sample_split(arm: str) -> tuple[str, int] | None:
    base, sep, k = arm.rpartition(SAMPLE)
    if not sep or not base or not k.isdigit() or k[0] == "0" or int(k) < 2 or is_judge(arm):
        return None
    return base, int(k)


def is_sample(arm: str) -> bool:
    """A `--samples` sample 2..K of an arm (`orig@2`); not the arm itself, nor a judge arm."""
    return SAMPLE in arm and _sample_split(arm) is not None


def sample_of(arm: str) -> tuple[str, int]:
    """(the arm a sample belongs to, its number k); (arm, 1) for an arm that is no sample."""
    return _sample_split(arm) or (arm, 1)


def is_recon(arm: str) -> bool:
    """A reconstruction arm: compared with the original in the paired tables."""
    return arm not in RESERVED and not is_repeat(arm) and not is_judge(arm) and not is_sample(arm)


def image_arm(arm: str) -> str:
    """Which prepared image an arm sends: repeats send the original's bytes, a sample its
    arm's (blind's samples send none)."""
    if is_repeat(arm):
        return ORIG
    return sample_of(arm)[0]


_labeller: Callable[[str], str] | None = None


def use_labeller(labeller: Callable[[str], str]) -> None:
    """Where reconstruction arms get their short labels: the codec registry's `arm_label`
    (the codec that made the arm names it), installed when the registry is imported."""
    global _labeller
    _labeller = labeller


def short_label(arm: str) -> str:
    """The codec's label for a reconstruction arm (`tok48`, `jpeg:q10`), the judge's prefix
    before the judged arm's, a sample's arm's label with its number (`tok48@2`), the name
    itself for orig, blind and the repeats."""
    if is_judge(arm):
        return JUDGE + short_label(judged(arm))
    if is_sample(arm):
        base, k = sample_of(arm)
        return sample_arm(short_label(base), k)
    if not is_recon(arm) or _labeller is None:
        return arm
    return _labeller(arm)


def arm_labels(arms: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """Column labels of at most 8 characters, and the legend lines when they had to be
    numbered (`arm1 = jpeg:quality=10`)."""
    short = {a: short_label(a) for a in arms}
    if all(len(v) <= LABEL_WIDTH for v in short.values()) and len(set(short.values())) == len(short):
        return short, []
    numbered: dict[str, str] = {}
    legend: list[str] = []
    for i, a in enumerate(arms):
        if a in RESERVED:
            numbered[a] = a
        else:
            numbered[a] = f"arm{i}"
            legend += prose(f"  arm{i} = {a}")
    return numbered, legend
