"""A lean run protocol for question items.

pytest's protocol wraps each of an item's three phases in output capture (two `dup2`
calls per phase), a logging handler, fixture setup and teardown, and three full reports.
A question item prints nothing, logs nothing and uses no fixture, and at 222k items that
machinery costs more CPU than asking the question does (0.4-0.6 ms per item, measured
with py-spy on pytest 9.2). This protocol keeps what other plugins and pytest users rely on:

- the same hooks in the same order: `pytest_runtest_logstart`, a setup, call and
  teardown report each through `pytest_runtest_logreport`, `pytest_runtest_logfinish`;
- the call report is made by `pytest_runtest_makereport`, so plugins decorate it as
  usual (this plugin attaches the item's outcome there; junitxml, --lf, -x, xdist read it);
- pytest's SetupState is left as pytest's own teardown would leave it for `nextitem`.

What a question item does not get: fixtures (autouse ones included) and output capture.
Items of other kinds in the same run (your own tests) run pytest's normal protocol.
"""

from __future__ import annotations

import pytest
from _pytest.reports import TestReport
from _pytest.runner import CallInfo


def _passed(item: pytest.Item, when: str, call: CallInfo[None]) -> TestReport:
    # A passed setup/teardown report carries nothing anyone reads but its outcome; built
    # directly, without walking the node's keywords as TestReport.from_item_and_call does.
    return TestReport(
        nodeid=item.nodeid, location=item.location, keywords={}, outcome="passed", longrepr=None,
        when=when, sections=(), duration=call.duration, start=call.start, stop=call.stop,
    )


def run_question_item(item: pytest.Item, nextitem: pytest.Item | None) -> bool:
    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    setup = CallInfo.from_call(lambda: None, when="setup")
    ihook.pytest_runtest_logreport(report=_passed(item, "setup", setup))

    call = CallInfo.from_call(item.runtest, when="call", reraise=(pytest.exit.Exception, KeyboardInterrupt))
    report = ihook.pytest_runtest_makereport(item=item, call=call)
    ihook.pytest_runtest_logreport(report=report)

    if item.session.shouldfail or item.session.shouldstop:
        nextitem = None  # as pytest's own protocol: tear everything down when stopping
    teardown = CallInfo.from_call(lambda: item.session._setupstate.teardown_exact(nextitem), when="teardown")
    if teardown.excinfo is None:
        ihook.pytest_runtest_logreport(report=_passed(item, "teardown", teardown))
    else:  # a finaliser of some earlier test failed: report it as pytest would
        ihook.pytest_runtest_logreport(report=ihook.pytest_runtest_makereport(item=item, call=teardown))
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True
