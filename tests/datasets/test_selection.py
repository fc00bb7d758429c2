"""`--limit`: stratified proportional sampling (datasets/selection.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.datasets.selection import allocate, stratified_limit

SIZES = {"presence": 600, "comp": 300, "count": 90, "area": 10}  # a skewed, RSVQA-like mix


def make(sizes: dict[str, int], benchmark: str = "b", extra_types: tuple[str, ...] = ()) -> list[Question]:
    """Questions of the given type sizes, interleaved as a real file would be."""
    out: list[Question] = []
    left = dict(sizes)
    k = 0
    while any(left.values()):
        for t in sizes:
            if left[t]:
                left[t] -= 1
                img = ImageRef(id=str(k // 7), path=f"/nonexistent/{k // 7}.png")
                out.append(Question(benchmark, str(k), img, f"q{k}?", "yes", (t, *extra_types)))
                k += 1
    return out


QS = make(SIZES)


@pytest.mark.parametrize("limit", [4, 5, 17, 50, 100, 333, 999])
def test_exact_total_and_proportions_within_rounding(limit: int) -> None:
    got = Counter(q.type for q in stratified_limit(QS, limit))
    assert sum(got.values()) == limit
    total = sum(SIZES.values())
    shares = {t: limit * size / total for t, size in SIZES.items()}
    floored = sum(1 for share in shares.values() if share < 1)  # seats the floor of one moves
    for t, share in shares.items():
        # Largest remainder is within one of the exact share; each type lifted to one seat
        # takes that seat from another type.
        assert abs(got[t] - share) < 1 + floored, (t, got[t], share)
        assert got[t] >= 1
    if not floored:
        assert all(abs(got[t] - share) < 1 for t, share in shares.items())


def test_allocation_examples() -> None:
    assert allocate(SIZES, 100) == {"presence": 60, "comp": 30, "count": 9, "area": 1}
    # 10 * (0.6, 0.3, 0.09, 0.01) = 6, 3, 0.9, 0.1 -> count takes the remainder seat, and the
    # area seat comes from the type furthest above its share (comp: 3 vs 3.0 ties presence
    # 6 vs 6.0 at zero; the larger type gives).
    assert allocate(SIZES, 10) == {"presence": 5, "comp": 3, "count": 1, "area": 1}
    assert allocate({"a": 1, "b": 1, "c": 1}, 2) == {"a": 1, "b": 1, "c": 0}  # fewer seats than types
    assert allocate({"a": 5, "b": 3}, 0) == {"a": 0, "b": 0}
    assert allocate({"a": 5, "b": 3}, 99) == {"a": 5, "b": 3}


def test_at_least_one_per_type_when_the_limit_allows() -> None:
    qs = make({"big": 1000, "tiny1": 1, "tiny2": 2, "tiny3": 1})
    got = Counter(q.type for q in stratified_limit(qs, 4))
    assert got == {"big": 1, "tiny1": 1, "tiny2": 1, "tiny3": 1}
    got = Counter(q.type for q in stratified_limit(qs, 20))
    assert sum(got.values()) == 20 and min(got.values()) == 1 and got["big"] == 17


def test_fewer_seats_than_types_keeps_the_exact_total() -> None:
    got = stratified_limit(QS, 2)
    assert len(got) == 2
    assert Counter(q.type for q in got) == {"presence": 1, "comp": 1}  # the largest types


def test_deterministic_and_independent_of_file_order() -> None:
    a = stratified_limit(QS, 50)
    assert [q.key for q in a] == [q.key for q in stratified_limit(list(QS), 50)]
    shuffled = QS[1::2] + QS[::2]
    assert {q.key for q in stratified_limit(shuffled, 50)} == {q.key for q in a}


def test_the_seed_drives_the_draw() -> None:
    base = {q.key for q in stratified_limit(QS, 50, seed=0)}
    assert base == {q.key for q in stratified_limit(QS, 50, seed=0)}
    assert all({q.key for q in stratified_limit(QS, 50, seed=s)} != base for s in range(1, 4))


def test_a_larger_limit_keeps_the_smaller_limits_questions() -> None:
    # Per-type allocations only grow with the limit here, so the samples nest: raising
    # --limit reuses every stored answer of the smaller run.
    small = {q.key for q in stratified_limit(QS, 100)}
    large = {q.key for q in stratified_limit(QS, 400)}
    assert small <= large


def test_kept_questions_stay_in_file_order() -> None:
    keys = [int(q.key) for q in stratified_limit(QS, 77)]
    assert keys == sorted(keys)


@pytest.mark.parametrize("limit", [None, 0, len(QS), len(QS) + 1, 10**9])
def test_no_limit_or_a_limit_above_the_size_keeps_all(limit: int | None) -> None:
    assert stratified_limit(QS, limit) == QS
    assert stratified_limit(iter(QS), limit) == QS  # any iterable


def test_multi_label_questions_are_stratified_by_their_primary_type() -> None:
    qs = make({"identity": 80, "color": 20}, extra_types=("quantity",))
    got = stratified_limit(qs, 10)
    assert Counter(q.type for q in got) == {"identity": 8, "color": 2}
    assert all(q.types[1] == "quantity" for q in got)


def test_an_empty_file_and_a_negative_limit() -> None:
    assert stratified_limit([], 10) == []
    with pytest.raises(ValueError, match="negative"):
        stratified_limit(QS, -1)
