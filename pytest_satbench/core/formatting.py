"""How numbers are written, the same in the terminal, report.md and report.html.

Accuracies are fractions in the statistics and percentages on the page; deltas are already
percentage points. An undefined value (NaN, None: too few images for an interval, an arm
with no answer) is written as `MISSING`, never as 0 or "nan".
"""

from __future__ import annotations

import math
import textwrap

MISSING = "-"


def defined(x: float | None) -> bool:
    return x is not None and not (isinstance(x, float) and (math.isnan(x) or math.isinf(x)))


def percent(x: float | None) -> str:
    """A fraction as a percentage with one decimal, without the sign: `0.8123` -> `81.2`."""
    return f"{100 * x:.1f}" if x is not None and defined(x) else MISSING


def points(x: float | None) -> str:
    """Percentage points with their sign: `-2.0`, `+0.4`."""
    return f"{x:+.1f}" if defined(x) else MISSING


def percent_interval(lo: float | None, hi: float | None) -> str:
    """An accuracy interval (fractions) as `78.1-84.0`."""
    if not (defined(lo) and defined(hi)):
        return MISSING
    return f"{percent(lo)}-{percent(hi)}"


def points_interval(lo: float | None, hi: float | None) -> str:
    """A delta interval (points) as `[-3.1,+0.9]`."""
    if not (defined(lo) and defined(hi)):
        return MISSING
    return f"[{lo:+.1f},{hi:+.1f}]"


def p_value(p: float | None) -> str:
    """Three decimals below 0.1 (where the digits matter), two above, `<1e-4` at the floor."""
    if not defined(p):
        return MISSING
    assert p is not None
    if p < 1e-4:
        return "<1e-4"
    return f"{p:.3f}" if p < 0.1 else f"{p:.2f}"


def number(x: float | None, spec: str = ".2f") -> str:
    return format(x, spec) if defined(x) else MISSING


def prose(text: str, width: int = 80) -> list[str]:
    """A sentence wrapped to the width the terminal tables keep to."""
    return textwrap.wrap(text, width, subsequent_indent="  ", break_on_hyphens=False) or [""]
