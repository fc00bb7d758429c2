"""A lean runtest for question items, and lean reports.

pytest's runtest wraps each of an item's three phases in output capture (two `dup2`
calls per phase), a logging handler, fixture setup and teardown, and three full reports.
A question item prints nothing, logs nothing and uses no fixture, and at 222k items that
machinery costs more CPU than asking the question does (0.4-0.6 ms per item, measured
with py-spy on pytest 9.2). This runtest keeps what other plugins and pytest users rely on:

- the same hooks in the same order: `pytest_runtest_logstart`, a setup, call and
  teardown report each through `pytest_runtest_logreport`, `pytest_runtest_logfinish`;
- the call report is made by `pytest_runtest_makereport`, so plugins decorate it as usual
  (this plugin attaches the item's outcome and its properties there; junitxml, json-report,
  --lf, -x, xdist read them); so are the setup and teardown reports when a plugin other than
  pytest's own implements that hook (a wrapper that keeps state from setup to teardown finds
  its setup: pytest-rerunfailures'), else they are built directly (~10 us less per item);
- pytest's SetupState is left as pytest's own teardown would leave it for `nextitem`.

What a question item does not get: fixtures (autouse ones included), output capture, and
the `pytest_runtest_setup` / `pytest_runtest_call` / `pytest_runtest_teardown` hooks. A
plugin that needs those (pytest-json-report, pytest-rerunfailures with --reruns, a
conftest.py implementing them) makes the whole run use pytest's standard runtest instead:
`plugin/compat.py` decides, once, and says so in one line. Items of other kinds in the same
run (your own tests) always run pytest's normal runtest.

Memory. pytest keeps every report to the end of the session (the terminal's `stats`, for the
final counts, -r and --durations): three per item, 3.3 KB per question item in all before
this module kept them small (performance/memory.py). So the reports of question items

- carry no keywords (pytest builds a dict of every keyword of the node chain for each call
  report; nothing reads it after the item: -k and -m select items, not reports), share the
  item's structured node id and location instead of parsing the node id again per report;
- are stored, once every plugin has seen them, as a `LeanReport`: the same attributes in
  slots, empty sections and user properties as shared empty tuples (`QuestionReports`). The
  kept copy drops the item's properties (its outcome and per-arm verdicts): junitxml,
  json-report and pytest-html read them from the report on its way through the hooks;
- leave nothing in the item's stash: pytest's tmp_path plugin records every phase's outcome
  there for its fixture's teardown, which a question item never runs.

A failed report (an errored question) is kept as pytest made it: its longrepr is the
failure section.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

import pytest
from _pytest.reports import TestReport
from _pytest.runner import CallInfo

try:  # the tmp_path plugin's per-item record (pytest >= 7.3); absent elsewhere: nothing to drop
    from _pytest.tmpdir import tmppath_result_key as _TMP_PATH_RESULT
except ImportError:  # pragma: no cover
    _TMP_PATH_RESULT = None  # type: ignore[assignment]  # older pytest: no such key, nothing to drop

# One empty keyword mapping for every lean report: read-only, so nothing can fill one
# report's keywords into all of them. (A report on its way through the hooks gets its own
# empty dict: xdist serialises reports, and a mapping proxy is not serialisable.)
NO_KEYWORDS: Mapping[str, Literal[1]] = MappingProxyType({})


def _node_id(item: pytest.Item) -> Any:
    # pytest >= 9.2 keeps the structured id on the item; a report given the string parses it
    # again (about 700 bytes and a few microseconds per report)
    return getattr(item, "id", None) or item.nodeid


def _passed(item: pytest.Item, when: str, duration: float, start: float, stop: float) -> TestReport:
    # A passed setup/teardown report carries nothing anyone reads but its outcome and the
    # item's properties; built directly, without walking the node's keywords as
    # TestReport.from_item_and_call does.
    return TestReport(
        nodeid=_node_id(item), location=item.location, keywords={}, outcome="passed", longrepr=None,
        when=when,  # type: ignore[arg-type]  # "setup", "call" or "teardown": an item's phases
        sections=_sections(item), duration=duration, start=start, stop=stop,
        user_properties=item.user_properties,
    )


def _sections(item: pytest.Item) -> list[tuple[str, str]]:
    # output captured in any phase so far (pytest's standard runtest captures; the lean one
    # does not, and this is empty)
    return [(f"Captured {key} {when}", content) for when, key, content in item._report_sections]


def drop_tmp_path_record(item: pytest.Item) -> None:
    """pytest's tmp_path plugin files each phase's outcome in the item's stash for its
    fixture's teardown; a question item has no fixture, and the record (a dict, and the
    stash's table) would stay to the end: 220 bytes per item."""
    stash = item.stash
    if _TMP_PATH_RESULT is None or _TMP_PATH_RESULT not in stash:
        return
    del stash[_TMP_PATH_RESULT]
    storage = getattr(stash, "_storage", None)
    if not len(stash) and isinstance(storage, dict):
        storage.clear()  # an emptied dict keeps its table until cleared


def phase_report(item: pytest.Item, call: CallInfo[None]) -> TestReport | None:
    """A question item's report of a phase that passed, as `TestReport.from_item_and_call`
    makes it but without keywords; None when the phase raised (pytest's own report then,
    with the failure section)."""
    if call.excinfo is not None:
        return None
    return _passed(item, call.when, call.duration, call.start, call.stop)


def _instant(when: Literal["setup", "teardown"], at: float) -> CallInfo[None]:
    # a phase in which nothing runs (a question item sets nothing up), at one instant
    return CallInfo(None, None, start=at, stop=at, duration=0.0, when=when, _ispytest=True)


def run_question_item(item: pytest.Item, nextitem: pytest.Item | None, *, phases_made: bool = True) -> bool:
    """The lean runtest. `phases_made`: the setup and teardown reports are made through
    `pytest_runtest_makereport` too (a plugin's wrapper keeps state from setup to teardown);
    else, when no plugin but pytest and this one implements it (`compat.Compat.phases_made`),
    they are built directly, without the hook's wrappers (~10 us per item)."""
    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    setup = _instant("setup", time.time())
    ihook.pytest_runtest_logreport(report=ihook.pytest_runtest_makereport(item=item, call=setup) if phases_made
                                   else _passed(item, "setup", 0.0, setup.start, setup.stop))

    call = CallInfo.from_call(item.runtest, when="call", reraise=(pytest.exit.Exception, KeyboardInterrupt))
    ihook.pytest_runtest_logreport(report=ihook.pytest_runtest_makereport(item=item, call=call))

    if item.session.shouldfail or item.session.shouldstop:
        nextitem = None  # as pytest's own runtest: tear everything down when stopping
    setupstate = item.session._setupstate
    if not setupstate.stack:
        # nothing is set up (question items set nothing up; no test of pytest's own runtest
        # ran before, or its nodes are torn down): teardown has nothing to do, at the instant
        # the call ended
        teardown = _instant("teardown", call.stop)
    else:  # a finaliser of some earlier test may fail: it is reported as pytest would
        teardown = CallInfo.from_call(lambda: setupstate.teardown_exact(nextitem), when="teardown")
    if phases_made or teardown.excinfo is not None:
        report = ihook.pytest_runtest_makereport(item=item, call=teardown)
    else:
        report = _passed(item, "teardown", teardown.duration, teardown.start, teardown.stop)
    ihook.pytest_runtest_logreport(report=report)
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    _forget(item)
    return True


def _forget(item: pytest.Item) -> None:
    """What the phases left on the item that nothing reads after it: its properties (on its
    reports now), the tmp_path plugin's record, and the per-attempt state a wrapper of
    `pytest_runtest_makereport` keeps from setup to teardown (pytest-rerunfailures': five
    dicts, ~700 bytes, per item to the end)."""
    if item.user_properties:
        item.user_properties.clear()
    drop_tmp_path_record(item)
    attrs = item.__dict__
    for name in PER_ATTEMPT_STATE:
        attrs.pop(name, None)


# Attributes pytest-rerunfailures sets on an item in each setup report and reads until the
# item's teardown (and, with --reruns, in its own runtest: a lean run has no reruns).
PER_ATTEMPT_STATE = ("_test_failed_statuses", "_terminal_errors", "_test_xfailed", "_rerun_condition_excinfos",
                     "_rerun_condition_results")


# ---------------------------------------------------------------------- lean reports
_EMPTY: tuple[()] = ()
# what every passed report of a question item has in common: class attributes of LeanReport,
# not stored per report (an attribute set on one report still goes to that report alone)
_COMMON: dict[str, Any] = {"outcome": "passed", "longrepr": None, "keywords": NO_KEYWORDS, "sections": _EMPTY,
                           "user_properties": _EMPTY}


# Attributes read by plugins as a report passes through the hooks and never after: the reporters'
# user properties, the stopping rule's per-arm correctness (plugin/sequential.py)
_TRANSIENT = frozenset({"user_properties", "satbench_seq"})


class LeanReport(TestReport):
    """A passed report of a question item as the terminal keeps it to the end: the same
    attributes, the ones that differ between items in slots, the ones all share (outcome,
    no longrepr, no keywords, sections or user properties) on the class. A TestReport's
    instance dict alone is ~300 bytes; this is ~100 in all. Attributes other plugins added
    (e.g. xdist's) still go to an instance dict, made only for them."""

    __slots__ = ("_id", "location", "when", "duration", "start", "stop", "satbench_outcome")
    outcome = "passed"
    longrepr = None
    keywords = NO_KEYWORDS
    sections = _EMPTY  # type: ignore[assignment]  # an immutable (), shared; read-only on a LeanReport
    user_properties = _EMPTY  # type: ignore[assignment]  # likewise

    @classmethod
    def of(cls, report: TestReport) -> LeanReport:
        lean = object.__new__(cls)
        for name, value in report.__dict__.items():
            if name in _TRANSIENT:
                continue  # read on the report's way through the hooks, not kept
            if name in _COMMON and (value == _COMMON[name] or (not value and name != "outcome")):
                continue  # the class has it
            setattr(lean, name, value)
        return lean


def is_lean_candidate(report: Any) -> bool:
    """A passed report of a question item: no failure and no keywords (pytest gives every
    other item's reports at least the item's name as a keyword)."""
    return (type(report) is TestReport and report.outcome == "passed" and report.longrepr is None
            and not report.keywords and not report.sections)


class QuestionReports:
    """Registered by the session once question items are collected. Keeps the terminal's
    copies of question items' passed reports lean (`LeanReport`).

    Runs after every other `pytest_runtest_logreport` implementation (trylast), when the
    terminal has filed the report under its category (`TerminalReporter.stats`, the last
    entry of one list): that entry is replaced by a lean copy. The report object the hooks
    saw is not changed, so a plugin that kept it keeps what it saw. Also makes the passed
    reports of question items (`phase_report`)."""

    NAME = "satbench-question-reports"

    def __init__(self, config: pytest.Config, is_question: Any) -> None:
        self.config = config
        self.is_question = is_question  # item -> bool

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: CallInfo[None]) -> TestReport | None:
        """A question item's passed setup, call or teardown report, without pytest's keyword
        dict (first result: pytest's own implementation is not called; every wrapper still
        wraps it), under the lean runtest and pytest's standard one alike."""
        if self.is_question(item):
            return phase_report(item, call)
        return None

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: TestReport) -> None:
        if not is_lean_candidate(report):
            return
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        stats: dict[str, list[Any]] | None = getattr(reporter, "stats", None)
        if not stats:
            return
        for reports in stats.values():
            if reports and reports[-1] is report:
                reports[-1] = LeanReport.of(report)
                return
