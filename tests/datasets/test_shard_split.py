"""`--shard I/N`: the split of a benchmark into N parts by whole images (datasets/selection.py).

Coverage on the fake datasets as the real loaders read them (every question in exactly one
shard, every image's questions together), the balance bound `split_images` proves, and that
the split depends on nothing but the questions (not their order, not which others are there
besides: the callers split before `-k`)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from datasets_fake import (
    DEFAULT_LHRS_ROWS,
    LhrsRow,
    write_lhrs_parquet,
    write_rsvqa,
    write_rsvqa_counts,
    write_vrsbench,
)

from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.datasets.registry import LoadRequest, get
from pytest_satbench.datasets.selection import split_images, stratified_limit, take_shard


def _rsvqa_uneven(root: Path) -> str:
    # 97 questions round-robin over 13 images: groups of 8 and 7
    write_rsvqa_counts(root, {"presence": 40, "comp": 30, "count": 20, "rural_urban": 7}, n_images=13, image_size=8)
    return "rsvqa_lr"


def _rsvqa_hr(root: Path) -> str:
    write_rsvqa(root, "hr", n_images=9, per_type=2, image_size=8)
    return "rsvqa_hr"


def _lhrs(root: Path) -> str:
    # the default rows, and images of 1 to 5 questions
    rows = list(DEFAULT_LHRS_ROWS)
    for n in range(1, 6):
        rows += [LhrsRow(f"q{n}-{k}?", ("a", "b"), "A", "A", ("1",), f"extra_{n}.png") for k in range(n)]
    write_lhrs_parquet(root, tuple(rows))
    return "lhrs"


def _vrsbench(root: Path) -> str:
    write_vrsbench(root, n_images=5, ref=False, image_size=8)
    return "vrsbench"


DATASETS: dict[str, Callable[[Path], str]] = {
    "rsvqa_lr": _rsvqa_uneven, "rsvqa_hr": _rsvqa_hr, "lhrs": _lhrs, "vrsbench": _vrsbench}


@pytest.fixture(scope="module", params=sorted(DATASETS))
def loaded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[Question]:
    root = tmp_path_factory.mktemp(request.param)
    name = DATASETS[request.param](root)
    questions = list(get(name).load(LoadRequest(root)))
    assert len({q.image.id for q in questions}) >= 3
    return questions


@pytest.mark.parametrize("count", range(1, 8))
def test_every_question_is_in_exactly_one_shard(loaded: list[Question], count: int) -> None:
    shards = [take_shard(loaded, i, count) for i in range(1, count + 1)]
    keys = [q.key for shard in shards for q in shard]
    assert Counter(keys) == Counter(q.key for q in loaded)  # each once, none missing
    assert len(keys) == len(set(keys))
    image_shard: dict[str, int] = {}
    for i, shard in enumerate(shards):
        for q in shard:
            assert image_shard.setdefault(q.image.id, i) == i  # an image's questions in one shard
        # each shard keeps the questions in their own order
        assert shard == [q for q in loaded if q in set(shard)]
    # within the bound of `split_images`: no shard more than one image group above the lightest
    sizes = Counter(q.image.id for q in loaded)
    loads = [len(s) for s in shards]
    assert max(loads) - min(loads) <= max(sizes.values())


def _check_bound(sizes: dict[str, int], count: int) -> None:
    where = split_images(sizes, count, "b")
    assert set(where) == set(sizes) and set(where.values()) <= set(range(count))
    loads = [0] * count
    smallest = [None] * count  # the smallest group in each shard
    for image, s in where.items():
        loads[s] += sizes[image]
        smallest[s] = sizes[image] if smallest[s] is None else min(smallest[s], sizes[image])
    lightest = min(loads)
    for s in range(count):
        # the proved bound: a shard is at most its own smallest group above the lightest shard
        assert loads[s] - lightest <= (smallest[s] or 0), (s, loads, smallest)
    assert max(loads) - lightest <= max(sizes.values(), default=0)


@pytest.mark.parametrize("count", range(1, 8))
def test_balance_bound_on_random_group_sizes(count: int) -> None:
    rng = random.Random(count)
    for trial in range(200):
        n = rng.randint(0, 60)
        # heavy-tailed sizes, as images of 1 to 300 questions
        sizes = {f"img{trial}-{i}": max(1, int(rng.paretovariate(1.2))) % 300 + 1 for i in range(n)}
        _check_bound(sizes, count)


def test_balance_bound_is_tight_enough_to_mean_something() -> None:
    # two big images and many small ones: the small ones fill the gap the big ones leave
    sizes = {"big1": 50, "big2": 40, **{f"s{i}": 1 for i in range(30)}}
    where = split_images(sizes, 2, "b")
    loads = Counter()
    for image, s in where.items():
        loads[s] += sizes[image]
    assert sorted(loads.values()) == [60, 60]
    # fewer images than shards: the extra shards are empty, every image alone
    assert sorted(split_images({"a": 5, "b": 3}, 4, "b").values()) == [0, 1]


def test_the_split_ignores_the_order_and_the_hash_seed_of_the_questions() -> None:
    qs = _questions({f"{i}": 1 + (i * 7) % 5 for i in range(40)})
    base = [{q.key for q in take_shard(qs, i, 3)} for i in (1, 2, 3)]
    for seed in range(5):
        shuffled = qs[:]
        random.Random(seed).shuffle(shuffled)
        assert [{q.key for q in take_shard(shuffled, i, 3)} for i in (1, 2, 3)] == base
    # equal-sized groups go by a digest of benchmark and image id, not by first appearance:
    # another benchmark's same images may split otherwise, the same benchmark's never
    assert split_images({"a": 2, "b": 2, "c": 2}, 2, "x") == split_images({"c": 2, "a": 2, "b": 2}, 2, "x")


def test_a_question_keeps_its_shard_whatever_else_is_selected() -> None:
    """What `-k` stability rests on: the split is of the benchmark's question list, and a
    question selected afterwards (by -k) is in the shard the whole list gave it. A split of
    the selection instead would move questions between shards."""
    qs = _questions({f"{i}": 1 + i % 4 for i in range(30)})
    whole = {q.key: i for i in (1, 2, 3) for q in take_shard(qs, i, 3)}
    subset = [q for q in qs if int(q.image.id) % 3 == 0]  # a -k selection, made after the split
    after = {q.key: i for i in (1, 2, 3) for q in take_shard(qs, i, 3) if q in subset}
    assert after == {q.key: whole[q.key] for q in subset}
    # (splitting the selection itself would not keep them: the reason the plugin splits first)
    resplit = {q.key: i for i in (1, 2, 3) for q in take_shard(subset, i, 3)}
    assert resplit != {q.key: whole[q.key] for q in subset}


def test_limit_then_shard_is_the_limited_run_split() -> None:
    qs = _questions({f"{i}": 1 + i % 6 for i in range(50)})
    limited = stratified_limit(qs, 60)
    union = sorted((q.key for i in (1, 2, 3, 4) for q in take_shard(limited, i, 4)), key=int)
    assert union == sorted((q.key for q in limited), key=int)


@pytest.mark.parametrize(("index", "count"), [(0, 4), (5, 4), (1, 0)])
def test_a_shard_out_of_range_is_refused(index: int, count: int) -> None:
    with pytest.raises(ValueError, match="--shard"):
        take_shard(_questions({"a": 1}), index, count)


def _questions(sizes: dict[str, int]) -> list[Question]:
    out: list[Question] = []
    for image, n in sizes.items():
        ref = ImageRef(id=image, path=f"/nonexistent/{image}.png")
        for _ in range(n):
            out.append(Question("b", str(len(out)), ref, f"q{len(out)}?", "yes", ("presence",)))
    return out
