"""The compatibility matrix: third-party pytest plugins next to question items, each on the
demo (80 questions, 34 images) against the reference server, each run compared with a run
without them: no crash, the same figures and the same per-item outcomes (junit XML's
properties), and a second run (resume) sends nothing.

The plugins live in .compat-plugins/ (`make install-test`), never in the venv: see
tests/compat_matrix.py. Without that folder the matrix is skipped, saying so; CI has it.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from compat_matrix import (
    ALL,
    PLUGINS_DIR,
    Reference,
    Run,
    copy_store,
    image_switches,
    make_project,
    run,
)

# the matrix's tests need the plugins; the tests at the end of this module run without them
needs_plugins = pytest.mark.skipif(
    not (PLUGINS_DIR / "pytest_rerunfailures.py").exists(),
    reason=f"the third-party plugins of the compatibility matrix are not installed in {PLUGINS_DIR} "
           "(run `make install-test`)",
)

STANDARD = "question items run pytest's standard per-item runtest in this run"
RURAL_URBAN = "rural or an urban"


@pytest.fixture(scope="module")
def server() -> Iterator[Reference]:
    with Reference() as ref:
        yield ref


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_project(tmp_path_factory.mktemp("compat"))


@pytest.fixture(scope="module")
def reference(project: Path, server: Reference) -> Run:
    """The demo without any plugin of .compat-plugins: the figures every run must match."""
    done = run(project, server, "reference", plugins=())
    assert done.returncode == 0, done.output[-8000:]
    assert done.requests == 2 * 80
    assert done.outcomes() and done.per_type
    return done


def _clean(done: Run) -> None:
    assert "INTERNALERROR" not in done.output and "Traceback" not in done.output, done.output[-4000:]


def _same(done: Run, reference: Run) -> None:
    assert done.returncode == 0, done.output[-4000:]
    _clean(done)
    assert done.per_type == reference.per_type
    assert done.outcomes() == reference.outcomes()


def _json_report(done: Run, reference: Run) -> None:
    doc = json.loads((done.root / done.tag / "report.json").read_text())
    regressed = _regressed(reference)
    assert doc["summary"]["regressed"] == 23 and doc["summary"]["passed"] == 57
    tests = {t["nodeid"].split("::")[-1]: t for t in doc["tests"]}
    assert {n for n, t in tests.items() if t["outcome"] == "regressed"} == regressed
    assert tests[min(regressed)]["user_properties"] == [
        {"satbench_outcome": "REGRESSED"}, {"satbench_arm:orig": "correct"}, {"satbench_arm:jpeg:quality=10": "wrong"}]


def _html(done: Run, reference: Run) -> None:
    text = (done.root / done.tag / "report.html").read_text()
    blob = json.loads(html.unescape(text.split('data-jsonblob="', 1)[1].split('"', 1)[0]))
    rows = {node.split("::")[-1]: runs[-1] for node, runs in blob["tests"].items()}
    regressed = _regressed(reference)
    assert len(rows) == 80 and {n for n, r in rows.items() if r["satbench"] == "REGRESSED"} == regressed
    assert {r["satbench"] for n, r in rows.items() if n not in regressed} == {"SAME"}
    assert {r["result"] for r in rows.values()} == {"Passed"}  # pytest-html's own filters still apply
    assert "<p>satbench: 23 regressed</p>" in text


def _sugar(done: Run, reference: Run) -> None:
    assert done.lines("satbench: 23 regressed")  # sugar's own summary lists pytest's outcomes only
    assert "57 passed" in done.output and "80 passed" not in done.output


def _line(start: str) -> Callable[[Run, Run], None]:
    def check(done: Run, reference: Run) -> None:
        assert done.lines(start), done.output[-3000:]

    return check


def _coverage(done: Run, reference: Run) -> None:
    assert "pytest_satbench/core/scoring.py" in done.output and "TOTAL" in done.output


# name, the plugins loaded (ALL: everything installed, autoloaded), options ("{out}": the
# run's folder), why question items run the standard runtest (None: the lean one), a check
MATRIX: list[tuple[str, Sequence[str] | None, list[str], str | None, Callable[[Run, Run], None] | None]] = [
    ("installed", ALL, [], None, None),
    ("installed-n2", ALL, ["-n", "2"], None, None),
    ("rerunfailures", ["rerunfailures"], [], None, None),
    ("reruns", ["rerunfailures"], ["--reruns", "2"], "pytest-rerunfailures (--reruns 2)", None),
    ("json-report", ["metadata", "pytest_jsonreport"], ["--json-report", "--json-report-file={out}/report.json"],
     "pytest-json-report (--json-report)", _json_report),
    ("html", ["metadata", "html"], ["--html={out}/report.html"], None, _html),
    ("html-n2", ["metadata", "html"], ["--html={out}/report.html", "-n", "2"], None, _html),
    ("timeout", ["timeout"], ["--timeout", "60"], None,
     _line("satbench: --timeout 60 (pytest-timeout) does not apply to question items")),
    ("randomly", ["randomly"], [], None, None),
    ("sugar", ["sugar"], ["--force-sugar"], None, _sugar),
    ("cov", ["pytest_cov"], ["--cov=pytest_satbench.core", "--cov-report=term"], None, _coverage),
    ("cov-context", ["pytest_cov"], ["--cov=pytest_satbench.core", "--cov-report=", "--cov-context=test"],
     "pytest-cov (--cov-context=test)", None),
    ("repeat", ["repeat"], ["--count", "3"], None,
     _line("satbench: --count 3 (pytest-repeat) repeats test functions, not question items")),
]


@pytest.fixture(scope="module")
def matrix(project: Path, reference: Run) -> dict[str, tuple[Run, Run]]:
    """Every entry's run and its resumed run (the same store), two entries at a time, each
    against a server of its own (its requests are its own)."""

    def one(entry: tuple[Any, ...]) -> tuple[str, tuple[Run, Run]]:
        name, plugins, args = entry[:3]
        with Reference() as srv:
            first = run(project, srv, name, *args, plugins=plugins)
            resumed = run(project, srv, f"{name}-resumed", *args, plugins=plugins,
                          store=project / name / "results.sqlite")
        return name, (first, resumed)

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(one, MATRIX))


@needs_plugins
@pytest.mark.parametrize(("name", "plugins", "args", "standard", "check"), MATRIX, ids=[m[0] for m in MATRIX])
def test_the_matrix(matrix: dict[str, tuple[Run, Run]], reference: Run, name: str, plugins: Sequence[str] | None,
                    args: list[str], standard: str | None, check: Callable[[Run, Run], None] | None) -> None:
    first, resumed = matrix[name]
    _same(first, reference)
    assert first.requests == 2 * 80  # every question once per arm (--count, reruns: nothing more)
    said = first.lines("satbench: ")
    if standard is None:
        assert not [line for line in said if STANDARD in line], said
    else:
        assert [line for line in said if line.startswith(f"satbench: {standard}: {STANDARD}")], said
    assert image_switches(first.order()) == 33  # 34 images, each image's questions together
    _same(resumed, reference)
    assert resumed.requests == 0
    if check is not None:
        check(first, reference)
        check(resumed, reference)


def _regressed(reference: Run) -> set[str]:
    regressed = {node for node, props in reference.outcomes().items() if ("satbench_outcome", "REGRESSED") in props}
    assert len(regressed) == 23
    return regressed


@needs_plugins
def test_rerunfailures_merely_installed_keeps_the_lean_protocol(project: Path, server: Reference,
                                                                 reference: Run) -> None:
    """The issue's INTERNALERROR (`_terminal_errors`): the lean runtest's setup report now
    goes through pytest_runtest_makereport, as pytest-rerunfailures' wrapper expects."""
    done = run(project, server, "rerun-installed-n2", "-n", "2", plugins=["rerunfailures"],
               store=copy_store(reference.root / "reference" / "results.sqlite", project / "s-installed"))
    _same(done, reference)
    assert done.requests == 0
    assert not [line for line in done.lines("satbench: ") if "report written" not in line]


def _fails(key: tuple[str, str]) -> bool:
    # the rural/urban question (one per image) fails, in the arms whose image hashes to even
    text, image = key
    return RURAL_URBAN in text and int(image[:2] or "0", 16) % 2 == 0


@needs_plugins
@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["sequential", "n2"])
def test_reruns_reask_a_failed_arm_as_often_as_asked_and_an_answer_never(
        project: Path, reference: Run, xdist: list[str]) -> None:
    with Reference(fail=_fails) as srv:
        done = run(project, srv, "reruns-failing" + "".join(xdist), "--reruns", "2", "--retries", "0", *xdist,
                   plugins=["rerunfailures"])
        counts = dict(srv.counts)
    _clean(done)
    assert done.returncode == 1
    failing = {k for k in counts if _fails(k)}
    assert failing  # some arms of some rural/urban questions
    assert all(n == 3 for k, n in counts.items() if k in failing), counts  # asked once, rerun twice
    assert all(n == 1 for k, n in counts.items() if k not in failing), counts  # answers: never again
    assert done.lines("satbench: pytest-rerunfailures (--reruns 2)")

    # resume with the server well: only the failed arms are asked, once; then nothing
    with Reference() as srv:
        resumed = run(project, srv, "reruns-failing-resumed" + "".join(xdist), "--reruns", "2", *xdist,
                      plugins=["rerunfailures"], store=project / done.tag / "results.sqlite")
        assert resumed.returncode == 0, resumed.output[-3000:]
        assert sorted(srv.counts) == sorted(failing) and set(srv.counts.values()) == {1}
        again = run(project, srv, "reruns-failing-again" + "".join(xdist), *xdist, plugins=["rerunfailures"],
                    store=project / done.tag / "results.sqlite")
    _same(resumed, reference)
    _same(again, reference)
    assert again.requests == 0


@needs_plugins
def test_reruns_under_fresh_reask_only_the_failed_arms(project: Path) -> None:
    """--fresh asks every question once; a rerun of an item in the same run reuses the
    answers this run already got and asks only what failed."""
    with Reference(fail=_fails) as srv:
        done = run(project, srv, "reruns-fresh", "--reruns", "2", "--retries", "0", "--fresh",
                   plugins=["rerunfailures"])
        counts = dict(srv.counts)
    _clean(done)
    failing = {k for k in counts if _fails(k)}
    assert failing and all(n == 3 for k, n in counts.items() if k in failing), counts
    assert all(n == 1 for k, n in counts.items() if k not in failing), counts


@needs_plugins
@pytest.mark.parametrize("fresh", [[], ["--fresh"]], ids=["stored", "fresh"])
def test_a_rerun_of_a_regression_asks_nothing(project: Path, server: Reference, reference: Run,
                                              fresh: list[str]) -> None:
    """--fail-on regression fails regressions; a rerun fails them again from the answers it
    has: no request, even under --fresh (which asks everything once)."""
    store = copy_store(reference.root / "reference" / "results.sqlite", project / f"s-regression{len(fresh)}")
    done = run(project, server, f"fail-on-regression{len(fresh)}", "--reruns", "2", "--fail-on", "regression",
               *fresh, plugins=["rerunfailures"], store=store)
    _clean(done)
    assert done.returncode == 1
    assert done.requests == (2 * 80 if fresh else 0)
    assert "23 failed, 57 passed, 46 rerun" in done.output.splitlines()[-1], done.output[-2000:]
    assert done.per_type == reference.per_type


@needs_plugins
def test_timeout_does_not_fail_items_waiting_for_their_answers(project: Path, reference: Run) -> None:
    """pytest-timeout's per-test timer would fire while an item waits for the answer the
    look-ahead fetches (and dump every thread's stack): question items are exempt, one line
    says so; the request deadline is --request-timeout."""
    with Reference(delay=0.3) as slow:  # every item waits longer than the timeout
        for method in ("signal", "thread"):
            done = run(project, slow, f"timeout-{method}", "--timeout", "0.2", "--timeout-method", method,
                       plugins=["timeout"])
            _same(done, reference)
            assert "Timeout" not in done.output and "Stack of" not in done.output
            assert done.lines("satbench: --timeout 0.2 (pytest-timeout) does not apply to question items")


@needs_plugins
def test_randomly_shuffles_whole_image_groups_by_its_seed(project: Path, reference: Run) -> None:
    seeds = {}
    with Reference() as srv:
        for seed in ("1", "2"):
            done = run(project, srv, f"randomly-{seed}", "--collect-only", f"--randomly-seed={seed}",
                       plugins=["randomly"])
            assert done.returncode == 0, done.output[-2000:]
            order = done.order()
            assert len(order) == 80 and image_switches(order) == 33
            seeds[seed] = [image for _, image in order]
        reference_images = [image for _, image in reference.order()]
        assert seeds["1"] != seeds["2"] != reference_images  # shuffled, by the seed
        assert sorted(seeds["1"]) == sorted(reference_images)
        again = run(project, srv, "randomly-1-again", "--collect-only", "--randomly-seed=1", plugins=["randomly"])
        assert [image for _, image in again.order()] == seeds["1"]  # the same seed, the same order
        # xdist workers collect the same shuffled groups (else xdist aborts the run)
        n2 = run(project, srv, "randomly-n2", "-n", "2", "--randomly-seed=3", plugins=["randomly"])
        _same(n2, reference)
        assert image_switches(n2.order("gw0")) == 33 and n2.order("gw0") == n2.order("gw1")


def test_ff_moves_whole_image_groups_first(tmp_path: Path) -> None:
    """--ff puts the failed items first; their images' other questions follow them (stored:
    nothing is asked for them), the image groups stay whole."""
    project = make_project(tmp_path / "ff")
    with Reference(fail=lambda key: RURAL_URBAN in key[0]) as failing:
        first = run(project, failing, "ff-first", "--retries", "0", plugins=(), cache=True)
    assert first.returncode == 1 and "8 failed" in first.output.splitlines()[-1], first.output[-2000:]
    with Reference() as srv:
        ff = run(project, srv, "ff", "--ff", plugins=(), cache=True, store=project / "ff-first" / "results.sqlite")
    assert ff.returncode == 0, ff.output[-2000:]
    order = ff.order()
    assert image_switches(order) == 33
    failed_images = {image for node, image in first.order() if node.split("::")[-1] in _failed(first)}
    assert len(failed_images) == 8
    assert {image for _, image in order[: sum(1 for _, i in order if i in failed_images)]} == failed_images
    assert ff.requests == 8 * 2  # the failed ones, once each


def _failed(done: Run) -> set[str]:
    import xml.etree.ElementTree as ET

    root = ET.parse(done.root / done.tag / "junit.xml").getroot()
    return {c.get("name", "") for c in root.iter("testcase") if c.find("failure") is not None}


@needs_plugins
def test_benchmark_only_deselects_question_items_in_one_line(project: Path, server: Reference) -> None:
    done = run(project, server, "benchmark-only", "--benchmark-only", plugins=["benchmark"])
    _clean(done)
    assert done.returncode == 5  # no item selected
    assert done.requests == 0
    assert done.lines("satbench: --benchmark-only (pytest-benchmark) runs only pytest-benchmark's benchmarks: "
                      "80 question items deselected")
    assert "80 deselected" in done.output.splitlines()[-1]


# ---------------------------------------------------------------------- without third-party plugins
RECORD_PHASES = """
import pytest

@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    with open("phases.txt", "a") as f:
        f.write(f"{item.name} {call.when} {report.outcome}\\n")
    return report
"""

RUNTEST_SETUP = """
def pytest_runtest_setup(item):
    with open("setup.txt", "a") as f:
        f.write(item.name + "\\n")
"""


@pytest.mark.parametrize(("conftest", "standard"), [(RECORD_PHASES, False), (RUNTEST_SETUP, True)],
                         ids=["makereport-wrapper", "runtest-hook"])
def test_a_conftest_gets_every_phase_of_question_items(tmp_path: Path, conftest: str, standard: bool) -> None:
    """A makereport wrapper sees setup, call and teardown of each question item under the lean
    protocol; a conftest implementing pytest_runtest_setup makes the run use pytest's standard
    protocol, named in one line, and its hook is called for every question item."""
    project = make_project(tmp_path / "p")
    (project / "conftest.py").write_text((project / "conftest.py").read_text() + conftest)
    with Reference() as srv:
        done = run(project, srv, "run", plugins=(), limit=20)
    assert done.returncode == 0, done.output[-3000:]
    _clean(done)
    line = [x for x in done.lines("satbench: ") if STANDARD in x]
    if standard:
        assert line == [(f"satbench: conftest.py (pytest_runtest_setup): {STANDARD}, not the lean one (capture, "
                         "fixtures, every runtest hook: about 0.2 ms more CPU per item)")]
        assert len((project / "setup.txt").read_text().split()) == 20
    else:
        assert not line
        seen = (project / "phases.txt").read_text().split("\n")
        assert len([x for x in seen if x]) == 3 * 20
        assert {x.split()[1] for x in seen if x} == {"setup", "call", "teardown"}


def _question(key: str, image: str) -> Any:
    from pytest_satbench.core.question import ImageRef, Question

    return Question(benchmark="b", key=key, image=ImageRef(id=image, path=f"{image}.png"), text="?", answer="yes",
                    types=("presence",))


class _Item:  # stands in for a QuestionItem in `regroup`
    def __init__(self, key: str, image: str) -> None:
        self.question = _question(key, image)
        self.key = key


def test_regroup_puts_each_images_questions_together_where_its_first_one_is(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_satbench.plugin import compat

    monkeypatch.setattr(compat, "QuestionItem", _Item)
    other = object()  # an item of another kind keeps its place among the groups
    items: list[Any] = [_Item("1", "b"), _Item("2", "a"), other, _Item("3", "b"), _Item("4", "c"), _Item("5", "a")]
    assert compat.regroup(items) == 2  # b b | a a | c
    assert [getattr(i, "key", "other") for i in items] == ["1", "3", "2", "5", "other", "4"]
    ordered = list(items)
    assert compat.regroup(items) == 2 and items == ordered  # grouped already: left as it is


def test_properties_and_counts() -> None:
    from collections import Counter

    from pytest_satbench.plugin.compat import outcome_counts, properties

    assert properties("regressed", [("orig", "correct"), ("jpeg:quality=10", "wrong")]) == [
        ("satbench_outcome", "REGRESSED"), ("satbench_arm:orig", "correct"), ("satbench_arm:jpeg:quality=10", "wrong")]
    assert outcome_counts(Counter({"same": 5, "regressed": 2, "error": 1})) == "2 regressed, 1 error"
    assert outcome_counts(Counter({"same": 5})) == ""
