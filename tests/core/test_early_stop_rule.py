"""The stopping rule as a run applies it (core/early_stop.py): which images are asked, and
that questions arriving in any order give the same sequence and stop as in order."""

from __future__ import annotations

import random

from pytest_satbench.core.early_stop import ASK, SKIP, OrderedRule, decide, lag_images, replay

ARMS = ("orig", "jpeg:quality=1")


def test_an_image_is_asked_unless_the_rule_was_met_lag_images_before_it() -> None:
    assert decide(0, 0, None, 3) == ASK and decide(3, 0, None, 3) == ASK
    assert decide(4, 0, None, 3) is None  # not known until one image is in
    assert decide(4, 1, None, 3) == ASK
    assert decide(63, 61, 61, 2) == SKIP and decide(62, 61, 61, 2) == ASK
    assert decide(100, 61, 61, 2) == SKIP  # known at once, however far
    assert lag_images(2, 4, 2) == 2 and lag_images(1024, 100, 2) == 12


def images(n: int = 200, m: int = 4) -> list[tuple[int, dict[str, float]]]:
    rng = random.Random(5)
    return [(m, {"orig": m, "jpeg:quality=1": m - rng.choice((1, 2))}) for _ in range(n)]


def test_questions_in_any_order_give_the_stop_of_the_run_in_order() -> None:
    data = images()
    in_order = OrderedRule(200, 800, ARMS, precision=10.0, margin=None)
    for pos, (m, c) in enumerate(data):
        in_order.add_image(pos, m, c)
    shuffled = OrderedRule(200, 800, ARMS, precision=10.0, margin=None)
    questions = [(pos, k < c["jpeg:quality=1"]) for pos, (m, c) in enumerate(data) for k in range(m)]
    random.Random(1).shuffle(questions)
    for pos, recon_right in questions:
        shuffled.add_question(pos, 4, (True, recon_right))
    assert in_order.stopped_at == shuffled.stopped_at is not None
    assert in_order.to_dict({}) == shuffled.to_dict({})


def test_a_report_replays_the_images_stored_in_order_up_to_the_first_missing() -> None:
    data = images()
    plan = {"precision": 10.0, "margin": None, "order": {"kind": "random", "seed": 0}, "lag": 2,
            "images": [[f"img{i}", 4] for i in range(200)]}
    stored = {f"img{i}": data[i] for i in range(70) if i != 65}
    got = replay(plan, stored, ARMS)
    assert got["images_answered"] == 65 and got["questions_answered"] == 260 and got["questions_total"] == 800
    assert got["stopped"] and got["order"] == {"kind": "random", "seed": 0} and got["lag"] == 2
