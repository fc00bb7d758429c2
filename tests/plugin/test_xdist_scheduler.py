"""The xdist image-group scheduler."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_satbench.plugin.xdist import ImageGroupScheduling


class FakeNode:
    def __init__(self, name: str) -> None:
        self.gateway = type("G", (), {"id": name})()
        self.sent: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def test_image_group_scheduler_keeps_groups_whole(tmp_path: Path, pytestconfig: pytest.Config) -> None:
    import json

    sizes = [3, 1, 4, 2, 5, 1, 1, 3]  # 20 items in 8 image groups
    (tmp_path / "gw0.json").write_text(json.dumps(sizes))
    sched = ImageGroupScheduling(pytestconfig, None, tmp_path, numnodes=2)
    sched.fill_to = 4  # small queues, so groups are handed out over many refills
    nodes = [FakeNode("gw0"), FakeNode("gw1")]
    ids = [f"t[{i}]" for i in range(20)]
    for n in nodes:
        sched.add_node(n)
        sched.add_node_collection(n, ids)
    sched.schedule()
    # run everything: each node completes its pending items in order
    while sched.has_pending:
        progressed = False
        for n in nodes:
            pending = sched.node2pending[n]
            if len(pending) >= 2 or (pending and n.shutting_down):
                sched.mark_test_complete(n, pending[0])
                progressed = True
        assert progressed
    owner: dict[int, str] = {}
    for n in nodes:
        for i in n.sent:
            assert i not in owner  # every item sent once
            owner[i] = n.gateway.id
    assert sorted(owner) == list(range(20))
    start = 0
    for size in sizes:
        assert len({owner[i] for i in range(start, start + size)}) == 1  # group on one worker
        start += size
    assert {owner[i] for i in owner} == {"gw0", "gw1"}  # and both workers got work
