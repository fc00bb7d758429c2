"""Stand-in for the seed's `satlink.eval.bench_score`, for performance/throughput.py.

The seed imports `final_answer`, `pick` and `iou_ok`. They are the plugin's own scorers
(`pytest_satbench.core.scoring`), so both clients of the benchmark spend the same CPU on
scoring an answer.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_satbench.core.scoring import final_answer, iou, parse_box, pick

__all__ = ["final_answer", "iou_ok", "pick"]


def iou_ok(pred: str, gt: str | Sequence[float], threshold: float = 0.5) -> bool:
    """The seed's grounding check: IoU of the predicted and the true box >= threshold."""
    a = parse_box(pred)
    b = parse_box(gt) if isinstance(gt, str) else tuple(gt)
    return a is not None and b is not None and iou(a, b) >= threshold
