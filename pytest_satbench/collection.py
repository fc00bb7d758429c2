"""Benchmark questions as pytest items.

A benchmark test module is one line per benchmark:

    test_rsvqa_lr = benchmark_test("rsvqa_lr")

and each question becomes a `QuestionItem` named `test_rsvqa_lr[<question key>]`, a direct
child of the module, so node ids read `benchmarks/test_rsvqa.py::test_rsvqa_lr[61327]` and
`-k`, `--lf`, `--deselect`, `-x` and `--junitxml` behave as for any test.

Items are plain `pytest.Item`s, not parametrized functions: at 222k questions that halves
collection time and memory (no fixture closure, no `reorder_items`; see
shared/notes/pytest-at-scale.md). The question type and image id are added as extra `-k`
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
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pytest
from _pytest.mark.expression import Expression

from .question import Question

if TYPE_CHECKING:
    from .session import SatbenchSession

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


class QuestionItem(pytest.Item):
    def __init__(self, *, question: Question, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.question = question
        # -k can select by question type and image id
        self.extra_keyword_matches.update(question.types)
        self.extra_keyword_matches.add(f"img{question.image.id}")

    @property
    def satbench(self) -> SatbenchSession:
        return self.config.stash[SESSION_KEY]

    def runtest(self) -> None:
        self.satbench.run_item(self)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:  # type: ignore[override]
        if isinstance(excinfo.value, QuestionFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo)  # a bug in the plugin: show the traceback

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"{self.question.benchmark}[{self.question.key}]"


SESSION_KEY = pytest.StashKey["SatbenchSession"]()


def make_items(collector: pytest.Collector, name: str, questions: Iterable[Question]) -> list[QuestionItem]:
    # pytest >= 9.2 keeps node ids structured (path, names, params); an item whose id is
    # built from the name alone would never match the `[params]` that --lf parses back
    # from its cache file, so the id is given explicitly, as parametrized functions do.
    base = getattr(collector, "id", None)
    structured = base is not None and hasattr(base, "with_params")
    return [
        QuestionItem.from_parent(
            collector,
            name=f"{name}[{q.key}]",
            nodeid=base.child(name).with_params(q.key) if structured else None,
            question=q,
        )
        for q in questions
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

        def matcher(name: str, /, **kwargs: Any) -> bool:
            name = name.lower()
            if name in known:
                return known[name]
            return assignment.get(name, True)

        if expr.evaluate(matcher):
            return True
    return False
