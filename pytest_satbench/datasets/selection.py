"""Which questions run, and in what order: `--limit`, `--shard`, image order, the noise-floor sample."""

from __future__ import annotations

import hashlib
import heapq
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from pytest_satbench.core.question import Question


def stratified_limit(
    questions: Iterable[Question], limit: int | None, seed: int = 0
) -> list[Question]:
    """Keep `limit` questions, each question type in proportion to its size.

    A limited run is meant to estimate the full run, so the sample keeps the file's mix of
    types: the overall (question-weighted) accuracy of a limited run estimates the full
    run's, and per-type figures rest on as many questions as the type's share allows.

    * Allocation: type `t` with `n_t` of the `N` questions gets `limit * n_t / N`, rounded
      by largest remainder (the floors first, then one more to the types with the largest
      fractional parts; ties go to the larger type, then to the type seen first), so the
      total is exactly `min(limit, N)`.
    * When `limit` is at least the number of types every type keeps at least one question;
      the seat a small type needs comes from the type furthest above its exact share. With
      fewer seats than types the largest types get them.
    * Which questions: within a type, those ranked first by a digest of
      `(seed, benchmark, key)` - a fixed pseudo-random order independent of file order,
      Python's hash seed and the other types, so a given file, limit and seed select the same
      questions on every run, and a larger limit keeps every question a smaller one chose.
    * A question with several types (LHRS-Bench) is stratified by its primary type
      (`Question.type`, the first one). `limit` of None or 0 keeps everything, as does a
      limit at or above the size. The kept questions stay in file order.
    """
    qs = list(questions)
    if not limit or limit >= len(qs):
        return qs
    if limit < 0:
        raise ValueError(f"--limit {limit} is negative")
    by_type: dict[str, list[int]] = defaultdict(list)  # type -> positions, first-seen order
    for i, q in enumerate(qs):
        by_type[q.type].append(i)
    sizes = {t: len(ix) for t, ix in by_type.items()}
    seats = allocate(sizes, limit)
    keep: list[int] = []
    for t, positions in by_type.items():
        ranked = sorted(positions, key=lambda i: _rank(seed, qs[i]))
        keep += ranked[: seats[t]]
    return [qs[i] for i in sorted(keep)]


def allocate(sizes: dict[str, int], n: int) -> dict[str, int]:
    """`n` seats over strata of the given sizes, proportionally (see `stratified_limit`).

    `sizes` is in a fixed order (first appearance); the result has the same keys, each value
    at most the stratum's size, summing to `min(n, sum(sizes))`.
    """
    total = sum(sizes.values())
    n = max(0, min(n, total))
    if not n:
        return dict.fromkeys(sizes, 0)
    order = {t: i for i, t in enumerate(sizes)}
    # Exact rational shares as numerator / total, to keep the rounding free of float error.
    seats = {t: n * s // total for t, s in sizes.items()}
    frac = {t: n * s % total for t, s in sizes.items()}
    left = n - sum(seats.values())
    for t in sorted(sizes, key=lambda t: (-frac[t], -sizes[t], order[t]))[:left]:
        seats[t] += 1
    if n >= len(sizes):
        for t in sizes:
            if seats[t] == 0:
                # The donor is the type most above its exact share (seats - n*s/total), that
                # can spare a seat; ties go to the larger type, then the later one.
                donor = max(
                    (d for d in sizes if seats[d] > 1),
                    key=lambda d: (seats[d] * total - n * sizes[d], sizes[d], order[d]),
                )
                seats[donor] -= 1
                seats[t] = 1
    return seats


def _rank(seed: int, q: Question) -> str:
    return hashlib.sha1(f"{seed}:{q.benchmark}:{q.key}".encode()).hexdigest()


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


def random_image_order(questions: Iterable[Question], seed: int) -> list[Question]:
    """--order random: the images in a seeded random order, each image's questions together
    and in their own order (one reconstruction per image, as in the dataset order).

    An image's place is the digest of `(seed, benchmark, image id)`, not a shuffle of the
    list: the order of any two images does not depend on which other images are selected
    (`--limit`, `-k`), on file order or on Python's hash seed, so the same seed asks the same
    images in the same order on every run, a rerun included. Any prefix of it is a uniform
    random sample of the images without replacement (the premise of `core.sequential`)."""
    by_image: dict[str, list[Question]] = {}
    for q in questions:
        by_image.setdefault(q.image.id, []).append(q)
    ranked = sorted(by_image.items(), key=lambda kv: image_rank(seed, kv[1][0].benchmark, kv[0]))
    return [q for _, qs in ranked for q in qs]


def image_rank(seed: int, benchmark: str, image_id: str) -> str:
    """An image's place in `--order random` (see `random_image_order`)."""
    return hashlib.sha256(f"order:{seed}:{benchmark}:{image_id}".encode()).hexdigest()


# protocol.json's "shard.scheme": a merge of shards must find the same split in all of them
SHARD_SCHEME = "image groups, largest first to the lightest shard (1)"


def split_images(sizes: Mapping[str, int], count: int, benchmark: str) -> dict[str, int]:
    """`--shard`: each image group's shard (0-based), from the groups' question counts alone.

    Greedy largest-group-first (LPT, Graham 1969, "Bounds on multiprocessing timing
    anomalies"): the groups by decreasing size, equal sizes by `shard_rank` (a digest of the
    benchmark and the image id: not file order, not Python's hash seed), each to the shard
    with the fewest questions so far (ties: the lowest shard number).

    Bound: every shard's question count exceeds the smallest shard's by at most the size of
    the smallest image group in it (so by at most the largest image group of the
    benchmark). When shard s received its last group g it was the lightest shard, and the
    other shards only grew after: load(s) = load_then(s) + |g| <= min_final + |g|; groups come
    largest first, so g is the smallest group in s. `tests/datasets/test_shard_split.py` checks it.

    The split reads nothing but `sizes`: which shard an image is in does not depend on the
    order the questions came in, on `-n`, or on `-k` (the caller splits the benchmark's
    question list before pytest applies `-k`)."""
    if count < 1:
        raise ValueError(f"--shard: {count} shards")
    order = sorted(sizes, key=lambda image: (-sizes[image], shard_rank(benchmark, image)))
    loads = [(0, s) for s in range(count)]  # (questions so far, shard): a heap, lightest first
    out: dict[str, int] = {}
    for image in order:
        load, s = heapq.heappop(loads)
        out[image] = s
        heapq.heappush(loads, (load + sizes[image], s))
    return out


def shard_rank(benchmark: str, image_id: str) -> str:
    """The order of equal-sized image groups in `split_images`."""
    return hashlib.sha256(f"shard:{benchmark}:{image_id}".encode()).hexdigest()


def take_shard(questions: Sequence[Question], index: int, count: int) -> list[Question]:
    """The questions of shard `index` (1-based) of `count`, in their own order: every question
    about an image in the same shard (`split_images`). `questions` are one benchmark's."""
    if not 1 <= index <= count:
        raise ValueError(f"--shard {index}/{count}: the shard number must be from 1 to {count}")
    sizes: dict[str, int] = defaultdict(int)
    for q in questions:
        sizes[q.image.id] += 1
    bench = questions[0].benchmark if questions else ""
    where = split_images(sizes, count, bench)
    return [q for q in questions if where[q.image.id] == index - 1]
