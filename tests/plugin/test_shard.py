"""`--shard I/N` end to end: real pytest runs (pytester) on a fake RSVQA-LR whose images hold 5
or 6 questions.

- The N shards' items are the unsharded run's, each once, with `-k`, `--limit` and `--order
  random` too: a question's shard does not depend on which others `-k` selects.
- Real runs under `-n 2` against a loopback server: the union of the shard runs' node ids is
  the unsharded run's, the `--repeat-orig` sample is the unsharded run's split between the
  shards, and each shard's protocol.json and summary say which part it is.
- A bad value is one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from datasets_fake import write_rsvqa_counts, write_vrsbench
from servers import FakeVLM

BENCH_MODULE = """
from pytest_satbench import benchmark_test
test_rsvqa_lr = benchmark_test("rsvqa_lr")
"""
COUNTS = {"presence": 30, "comp": 20, "count": 13}  # 63 questions round-robin over 11 images: 6 or 5 each
N_QUESTIONS, N_IMAGES = 63, 11
NODE = re.compile(r"test_bench\.py::test_rsvqa_lr\[\d+\]")
OUTCOME = re.compile(r"\b(CORRECT|WRONG)\b")


@pytest.fixture
def data(pytester: pytest.Pytester) -> Path:
    pytester.makepyfile(test_bench=BENCH_MODULE)
    root = pytester.path / "data"
    write_rsvqa_counts(root, COUNTS, n_images=N_IMAGES, image_size=8)
    return root


def collected(pytester: pytest.Pytester, data: Path, *args: str) -> list[str]:
    result = pytester.runpytest("--data-root", str(data), "--collect-only", "-q", "-p", "no:randomly", *args)
    assert result.ret == 0, result.stdout.str()[-2000:]
    return [line for line in result.outlines if NODE.fullmatch(line)]


@pytest.mark.parametrize("extra", [(), ("-k", "presence or img13"), ("--limit", "40"), ("--order", "random")],
                         ids=["all", "k", "limit", "random"])
def test_the_shards_hold_every_selected_item_once(pytester: pytest.Pytester, data: Path,
                                                  extra: tuple[str, ...]) -> None:
    whole = collected(pytester, data, *extra)
    everything = collected(pytester, data, *[a for a in extra if a not in ("-k", "presence or img13")])
    assert len(whole) > 10
    shards = [collected(pytester, data, "--shard", f"{i}/3", *extra) for i in (1, 2, 3)]
    flat = [node for shard in shards for node in shard]
    assert sorted(flat) == sorted(whole) and len(set(flat)) == len(flat)  # each once
    for shard in shards:
        assert shard == [node for node in whole if node in shard]  # in the unsharded run's order
    if "-k" in extra:
        # -k after the split: each shard's -k items are its own items that -k selects
        plain = [collected(pytester, data, "--shard", f"{i}/3") for i in (1, 2, 3)]
        for shard, own in zip(shards, plain):
            assert shard == [node for node in own if node in whole]
    else:
        # balanced within one image's questions (6), of the questions before -k
        sizes = [len(s) for s in shards]
        assert max(sizes) - min(sizes) <= 6 and sum(sizes) == len(everything)


def test_unreadable_records_fail_in_shard_1_and_extra_shards_are_empty(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_bench='from pytest_satbench import benchmark_test\n'
                                   'test_vrsbench_ref = benchmark_test("vrsbench_ref")\n')
    data = pytester.path / "data"
    write_vrsbench(data, n_images=3, vqa=False, image_size=8)
    path = data / "VRSBench" / "VRSBench_EVAL_referring.json"
    records = json.loads(path.read_text())
    records[1]["ground_truth"] = "no box here"  # unreadable: one failed item, test_vrsbench_ref[record1]
    path.write_text(json.dumps(records))

    def nodes(*args: str) -> list[str]:
        result = pytester.runpytest("--data-root", str(data), "--collect-only", "-q", "-p", "no:randomly", *args)
        return [line for line in result.outlines if "::test_vrsbench_ref[" in line]

    whole = nodes()
    assert "test_bench.py::test_vrsbench_ref[record1]" in whole
    parts = [nodes("--shard", f"{i}/2") for i in (1, 2)]
    assert "test_bench.py::test_vrsbench_ref[record1]" in parts[0]
    assert sorted(parts[0] + parts[1]) == sorted(whole)
    # more parts than images: the last parts hold none of its questions (3 images, 5 parts)
    five = [nodes("--shard", f"{i}/5") for i in range(1, 6)]
    assert sorted(n for part in five for n in part) == sorted(whole)
    assert sum(1 for part in five if part) == 3 and five[4] == []


@pytest.mark.parametrize(("value", "line"), [
    ("0/4", "ERROR: --shard: I must be from 1 to N (parts are numbered from 1), got '0/4'"),
    ("5/4", "ERROR: --shard: I must be from 1 to N (parts are numbered from 1), got '5/4'"),
    ("x/y", "ERROR: --shard: expected I/N, part I of N numbered from 1 (e.g. 2/4), got 'x/y'"),
    ("2", "ERROR: --shard: expected I/N, part I of N numbered from 1 (e.g. 2/4), got '2'"),
])
def test_a_bad_shard_is_one_line(pytester: pytest.Pytester, data: Path, value: str, line: str) -> None:
    result = pytester.runpytest("--data-root", str(data), "--collect-only", "-q", "--shard", value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert [x for x in result.errlines if x.strip()] == [line]


def answer(prompt: str, has_image: bool, image: bytes | None) -> str:
    return "yes"


def run(pytester: pytest.Pytester, url: str, data: Path, store: Path, *args: str) -> pytest.RunResult:
    result = pytester.runpytest(
        "--servers", url, "--data-root", str(data), "--store", str(store), "--bootstrap", "20", "-p", "no:randomly",
        "-v", "-k", "not count", "--repeat-orig", "2", "--repeat-sample", "12",
        "-W", "ignore::pytest.PytestAssertRewriteWarning", *args)
    assert result.ret == 0, result.stdout.str()[-3000:]
    return result


def ran(result: pytest.RunResult) -> list[str]:
    """The node ids of the items that ran (CORRECT or WRONG), from -v's lines."""
    return [m.group(0) for line in result.outlines if OUTCOME.search(line) and (m := NODE.search(line))]


def test_shard_runs_under_xdist_add_up_to_the_whole_run(pytester: pytest.Pytester, data: Path) -> None:
    pytest.importorskip("xdist")
    with FakeVLM(models=["m"], answer=answer) as srv:
        whole = run(pytester, srv.url, data, pytester.path / "whole.sqlite", "--tag", "whole")
        asked_whole = srv.chat_requests
        shards = []
        for i in (1, 2):
            shards.append(run(pytester, srv.url, data, pytester.path / "shards.sqlite", "--shard", f"{i}/2",
                              "--tag", f"s{i}", "-n", "2"))
        asked_shards = srv.chat_requests - asked_whole
    selected = ran(whole)
    assert len(selected) == N_QUESTIONS - COUNTS["count"]
    nodes = [ran(r) for r in shards]
    assert all(nodes) and sorted(n for ns in nodes for n in ns) == sorted(selected)
    # the noise-floor sample is the whole run's, split between the shards: as many repeats in all
    assert asked_whole > len(selected) and asked_shards == asked_whole

    protocols = [json.loads((pytester.path / "reports" / "rsvqa_lr" / f"s{i}" / "protocol.json").read_text())
                 for i in (1, 2)]
    whole_protocol = json.loads((pytester.path / "reports" / "rsvqa_lr" / "whole" / "protocol.json").read_text())
    assert "shard" not in whole_protocol
    shard_questions = 0
    for i, (proto, result, mine) in enumerate(zip(protocols, shards, nodes), start=1):
        shard = proto["shard"]
        assert (shard["index"], shard["count"]) == (i, 2) and shard["scheme"]
        counts = shard["benchmarks"]["rsvqa_lr"]
        assert counts["questions"] == N_QUESTIONS and counts["images"] == N_IMAGES
        assert counts["planned"] == proto["planned"]["rsvqa_lr"] == len(mine)  # after -k
        shard_questions += counts["shard_questions"]
        assert counts["shard_questions"] >= counts["planned"]
        line = f"shard {i}/2: {counts['shard_questions']} of {N_QUESTIONS} questions (this run selected {len(mine)} of them)"
        result.stdout.fnmatch_lines([line])  # the terminal summary
        for name in ("report.md", "report.html"):  # the top of the reports
            report = (pytester.path / "reports" / "rsvqa_lr" / f"s{i}" / name).read_text()
            assert line[:1].upper() + line[1:] in report, name
        # under "collected N items" (an xdist controller says its workers' line in its summary)
        result.stdout.fnmatch_lines([f"satbench: rsvqa_lr: shard {i}/2: {counts['shard_questions']} of {N_QUESTIONS} "
                                     f"questions ({counts['shard_images']} of {N_IMAGES} images)"])
    # the shards' planned counts add up to the whole run's, their questions to the benchmark's
    assert sum(p["planned"]["rsvqa_lr"] for p in protocols) == whole_protocol["planned"]["rsvqa_lr"]
    assert shard_questions == N_QUESTIONS
    assert sum(p["shard"]["benchmarks"]["rsvqa_lr"]["shard_images"] for p in protocols) == N_IMAGES


def test_a_stopping_rule_applies_within_the_shard(pytester: pytest.Pytester, data: Path) -> None:
    """--precision with --shard: the rule's images are the shard's (split first, then the rule)."""
    with FakeVLM(models=["m"], answer=answer) as srv:
        result = pytester.runpytest("--servers", srv.url, "--data-root", str(data), "--bootstrap", "20", "-p",
                                    "no:randomly", "--shard", "2/3", "--precision", "90",
                                    "-W", "ignore::pytest.PytestAssertRewriteWarning")
    assert result.ret == 0, result.stdout.str()[-3000:]
    proto = json.loads((pytester.path / "reports" / "rsvqa_lr" / "default" / "protocol.json").read_text())
    counts = proto["shard"]["benchmarks"]["rsvqa_lr"]
    images = proto["sequential"]["rsvqa_lr"]["images"]
    assert len(images) == counts["shard_images"] < N_IMAGES
    assert sum(n for _, n in images) == counts["shard_questions"] == proto["planned"]["rsvqa_lr"]
