"""Which questions run, and in what order: `--limit`, image order, the noise-floor sample."""

from __future__ import annotations

import hashlib
import random
from collections import defaultdict
from collections.abc import Iterable

from pytest_satbench.core.question import Question


def stratified_limit(
    questions: Iterable[Question], limit: int | None, seed: int = 0
) -> list[Question]:
    """Keep about `limit` questions, the same number from each question type.

    The seed script's rule: `per = max(1, limit // n_types)` questions drawn from each type
    with `random.Random(seed).sample`, types in order of first appearance, so a given file
    and limit always select the same questions.
    """
    qs = list(questions)
    if not limit:
        return qs
    by_type: dict[str, list[Question]] = defaultdict(list)
    for q in qs:
        by_type[q.type].append(q)
    rng = random.Random(seed)
    per = max(1, limit // len(by_type)) if by_type else 0
    chosen: list[Question] = []
    for group in by_type.values():
        chosen += rng.sample(group, min(per, len(group)))
    return chosen


def sort_by_image(questions: Iterable[Question]) -> list[Question]:
    """Order items by image so the per-image reconstruction cache stays hot.

    Sorted by (image id, key) with numeric-aware comparison, so the order is stable across
    runs and independent of file order.
    """

    def natural(s: str) -> tuple[int, int | str]:
        return (0, int(s)) if s.isdigit() else (1, s)

    by_image: dict[str, tuple[int, int | str]] = {}  # ~100 questions share each image

    def key(q: Question) -> tuple[tuple[int, int | str], tuple[int, int | str]]:
        image = by_image.get(q.image.id)
        if image is None:
            image = by_image[q.image.id] = natural(q.image.id)
        return image, natural(q.key)

    return sorted(questions, key=key)


def repeat_sample(questions: list[Question], n: int) -> set[tuple[str, str]]:
    """A fixed pseudo-random sample (by hash of benchmark and key), spread over images."""
    ranked = sorted(questions, key=lambda q: hashlib.sha1(f"{q.benchmark}:{q.key}".encode()).hexdigest())
    return {(q.benchmark, q.key) for q in ranked[:n]}
