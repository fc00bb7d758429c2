"""Benchmark questions as pytest items.

A benchmark test module is one line per benchmark:

    test_rsvqa_lr = benchmark_test("rsvqa_lr")

and each question becomes a `QuestionItem` named `test_rsvqa_lr[<question key>]`, a direct
child of the module, so node ids read `benchmarks/test_rsvqa.py::test_rsvqa_lr[61327]` and
`-k`, `--lf`, `--deselect`, `-x` and `--junitxml` behave as for any test.

Items are plain `pytest.Item`s, not parametrized functions: at 222k questions that halves
collection time and memory (no fixture closure, no `reorder_items`; docs/performance.md
has the measurements). The question type and image id are added as extra `-k`
keywords (`-k "rsvqa_lr and presence"`).

`-k` is applied by pytest after collection, so selecting one benchmark with `-k` would
still load every other benchmark's files (RSVQA-HR's 1M-record JSON). `keyword_could_match`
evaluates the `-k` expression per benchmark before loading: words that name a benchmark are
decided from the benchmark's own names, everything else is left open, and a benchmark is
loaded only when some assignment of the open words could select one of its items.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

import pytest
from _pytest.mark.expression import Expression

from pytest_satbench.core.question import Question
from pytest_satbench.plugin.options import Settings

if TYPE_CHECKING:
    from _pytest._code.code import TerminalRepr

    from pytest_satbench.server import RunningServer

_MARK = "__satbench_benchmark__"


class BenchmarkTest:
    """What `benchmark_test(name)` returns: a placeholder the plugin expands into items."""

    def __init__(self, name: str) -> None:
        setattr(self, _MARK, name)
        self.__name__ = f"test_{name}"
        self.__doc__ = f"Every question of the {name!r} benchmark, one item each."

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("benchmark tests are run by the pytest-satbench plugin, not called")


def benchmark_test(name: str) -> BenchmarkTest:
    """Declare, in a test module, that every question of benchmark `name` is a test."""
    return BenchmarkTest(name)


def benchmark_of(obj: object) -> str | None:
    try:
        value = obj.__dict__.get(_MARK) if hasattr(obj, "__dict__") else None
    except Exception:
        return None
    return value if isinstance(value, str) else None


class QuestionFailed(Exception):
    """The item failed (an arm errored, or a regression under --fail-on regression).
    Reported as one line, without a Python traceback."""


class DatasetErrorItem(pytest.Item):
    """Stands in for a benchmark whose files are malformed: one failed item with the
    one-line reason, so the other benchmarks still run."""

    def __init__(self, *, message: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.message = message

    def runtest(self) -> None:
        raise QuestionFailed(self.message)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        return str(excinfo.value)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, self.name


class _NoParams:
    """pytest's fixture reordering reads `item.callspec` of every item (three times each);
    an item without one costs an AttributeError per read, ~1 s at 222k items. Questions
    have no parameters to reorder by, and say so cheaply."""

    params: dict[str, object] = {}
    indices: dict[str, int] = {}
    _arg2scope: dict[str, object] = {}


class QuestionItem(pytest.Item):
    callspec = _NoParams()
    cls = None  # read next to callspec by the reordering; a question belongs to no class
    # per-arm verdicts, set by the run for the other plugins' properties (plugin/compat.py pops it)
    satbench_arms: tuple[tuple[str, str], ...]

    def __init__(self, *, question: Question, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.question = question

    # pytest gives every node its own empty set of extra -k words (216 bytes; 48 MB at
    # 222k items). Questions add theirs in listextrakeywords(), so the set is made only
    # if something writes to it.
    @property
    def extra_keyword_matches(self) -> set[str]:
        got = self.__dict__.get("_extra_keyword_matches")
        if got is None:
            got = self.__dict__["_extra_keyword_matches"] = set()
        return got

    @extra_keyword_matches.setter
    def extra_keyword_matches(self, value: set[str]) -> None:
        if value:
            self.__dict__["_extra_keyword_matches"] = value
        else:
            self.__dict__.pop("_extra_keyword_matches", None)

    def listextrakeywords(self) -> set[str]:
        # -k can select by question type and image id; computed when -k asks, instead of
        # a set filled for each of 222k items at collection
        extra = {*self.question.types, f"img{self.question.image.id}"}
        for node in self.listchain():
            words = node.__dict__.get("_extra_keyword_matches") if node is self else node.extra_keyword_matches
            if words:
                extra.update(words)
        return extra

    def runtest(self) -> None:
        settled = self.config.stash.get(RERUN_SETTLED, None)
        if settled is not None and self.nodeid in settled:
            # a rerun (pytest-rerunfailures) of an item whose answers are known and whose
            # failure they decide (a regression under --fail-on regression): nothing is asked
            raise QuestionFailed(settled[self.nodeid][0])
        self.config.stash[SESSION_KEY].run_item(self)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str | TerminalRepr:
        if isinstance(excinfo.value, QuestionFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo)  # a bug in the plugin: show the traceback

    def reportinfo(self) -> tuple[Any, int | None, str]:
        # the item's own name as the domain: the terminal shows the same line either way
        # (`test_x[key]` ends with `x[key]`), and it is a string every item has already
        # (a new one per item was 60 bytes kept to the end in the location tuple)
        return self.path, None, self.name


class ItemRunner(Protocol):
    """What an item needs of the plugin's run object (`run.RunController`)."""

    @property
    def settings(self) -> Settings: ...

    def builtin_server(self) -> RunningServer: ...

    def run_item(self, item: QuestionItem) -> None: ...


SESSION_KEY = pytest.StashKey[ItemRunner]()
# Under reruns (pytest-rerunfailures): node id -> (failure, outcome, per-arm verdicts) of the
# items whose failure is settled by their stored answers, so a rerun asks nothing again
# (`compat.Compat.call_outcome` fills it).
RERUN_SETTLED = pytest.StashKey[dict[str, tuple[str, str, tuple[tuple[str, str], ...]]]]()


def _node_ids(collector: pytest.Collector, name: str) -> Callable[[str], dict[str, Any]]:
    """How each item's node id is given: pytest >= 9.2 keeps node ids structured (path, names,
    params), and an item whose id is built from the name alone would never match the
    `[params]` that --lf parses back from its cache file, so the id is given explicitly, as
    parametrized functions do. Worked out once per benchmark, not per question."""
    base = getattr(collector, "id", None)
    if base is not None and hasattr(base, "with_params"):
        node_id, path, names = type(base), base.path, (*base.names, name)
        return lambda key: {"nodeid": node_id(path=path, names=names, params=key)}
    return lambda key: {}


def make_items(collector: pytest.Collector, name: str, questions: Iterable[Question]) -> list[QuestionItem]:
    ids = _node_ids(collector, name)
    return [QuestionItem.from_parent(collector, name=f"{name}[{q.key}]", question=q, **ids(q.key)) for q in questions]


def record_error_items(collector: pytest.Collector, name: str, failed: Iterable[tuple[str, str]]) -> list[DatasetErrorItem]:
    """One failed item per unreadable record (`RecordErrors`), named like its question would be."""
    ids = _node_ids(collector, name)
    return [
        DatasetErrorItem.from_parent(collector, name=f"{name}[{key}]", message=message, **ids(key))
        for key, message in failed
    ]


# ---------------------------------------------------------------------- -k before loading
_IDENT = re.compile(r"(:?\w|:|\+|-|\.|\[|\]|\\|/)+")
_RESERVED = {"and", "or", "not", "true", "false"}
_MAX_OPEN_WORDS = 10


def keyword_could_match(
    expression: str,
    own_names: Iterable[str],
    other_benchmark_names: Iterable[str],
) -> bool:
    """Could `-k expression` select any item of a benchmark, before its questions load?

    `own_names`: names every item of this benchmark matches (test function name, module
    file name, folder names). A word that is a substring of one of them is true for all
    items. A word that names another benchmark (and not this one) is false for all items:
    question keys never contain benchmark names. Any other word may match some item (a
    question type, an image id, part of a key), so it is tried both ways.
    """
    try:
        expr = Expression.compile(expression)
    except Exception:  # SyntaxError in pytest 9, ParseError before: pytest reports it
        return True  # let pytest report the syntax error itself
    own = [n.lower() for n in own_names]
    others = [n.lower() for n in other_benchmark_names]
    known: dict[str, bool] = {}
    open_words: list[str] = []
    for match in _IDENT.finditer(expression):
        word = match.group(0).lower()
        if word in _RESERVED or word in known or word in open_words:
            continue
        if any(word in n for n in own):
            known[word] = True
        elif any(word in n for n in others):
            known[word] = False
        else:
            open_words.append(word)
    if len(open_words) > _MAX_OPEN_WORDS:
        return True
    for values in itertools.product((False, True), repeat=len(open_words)):
        assignment = dict(zip(open_words, values))

        def matcher(name: str, /, assignment: dict[str, bool] = assignment, **kwargs: Any) -> bool:
            name = name.lower()
            if name in known:
                return known[name]
            return assignment.get(name, True)

        if expr.evaluate(matcher):  # type: ignore[arg-type]  # `assignment`: this iteration's, bound as a default
            return True
    return False
