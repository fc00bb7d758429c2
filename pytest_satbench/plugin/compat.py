"""Question items next to other pytest plugins.

Question items run a lean per-item runtest (`plugin/runtest.py`): the same hooks and the
same setup, call and teardown reports as any item, but no fixtures, no output capture and no
`pytest_runtest_setup` / `_call` / `_teardown` hooks. Most plugins need nothing more; for the
rest this module decides, once per process and before the first item, what a run does:

- **Standard runtest for the run** where a plugin needs pytest's own per-item runtest:
  pytest-rerunfailures with reruns asked for (its runtest re-runs an item), pytest-json-report
  (`--json-report`: its bookkeeping is filled in the runtest hooks), pytest-cov's
  `--cov-context=test`, and any plugin or conftest.py this module does not know that
  implements one of those three hooks. One line says so, naming each plugin
  (`Compat.standard`); everything else about the run stays as it is. The price, measured by
  performance/runtest.py (10,000 question items, a resumed run, 2 loaded cores): +0.17 ms of
  client CPU per item (368 -> 541 us), nothing per request.
- **Properties**: each question item's outcome and its arms' verdicts go on its call and
  teardown reports as `user_properties` (record_property style), so junit XML writes them
  as `<property>`, pytest-json-report as `user_properties`; pytest-html gets a `satbench`
  column (SAME, REGRESSED, IMPROVED, WRONG, ERROR) and a summary line; pytest-sugar's
  letters and a closing line count regressions as pytest's own terminal does.
- **Order**: after every reordering plugin (pytest-randomly's shuffle, --ff, --nf, --sw),
  the questions of one image are put back together, each image's group where its first
  question landed: the groups are shuffled as units (by pytest-randomly's seed, as its
  shuffle of the items is), the look-ahead and the per-image cache keep working.
- **Options that cannot apply** say so in one line: pytest-timeout's `--timeout` (question
  items are exempt: their answers are fetched ahead, in the look-ahead's time; the request
  deadline is --request-timeout), pytest-repeat's `--count` (each question is asked once),
  pytest-benchmark's `--benchmark-only` (question items are deselected: they are not
  pytest-benchmark benchmarks).
- **Reruns never re-ask a settled answer**: a regression failed under --fail-on regression
  is failed again by a rerun without asking anything (`settle`/`QuestionItem.runtest`); a
  failed request is asked again at most as often as the reruns allow.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_satbench.plugin.items import RERUN_SETTLED, QuestionItem
from pytest_satbench.plugin.outcomes import ERROR, IMPROVED, REGRESSED, WRONG
from pytest_satbench.plugin.runtest import QuestionReports, drop_tmp_path_record

if TYPE_CHECKING:
    from pytest_satbench.plugin.options import Settings

NAME = "satbench-compat"
COMPAT_KEY = pytest.StashKey["Compat"]()

# The hooks the lean runtest does not call; a plugin implementing one expects them.
RUNTEST_HOOKS = ("pytest_runtest_setup", "pytest_runtest_call", "pytest_runtest_teardown")

# Implementations of RUNTEST_HOOKS known to need nothing of a question item, by the
# "module.qualname" prefix of the function: what each does is in the comment.
LEAN_IS_FINE = (
    "_pytest.",  # pytest itself: capture, logging, fixtures, skip/xfail marks, SetupState
    "pytest_satbench.",
    "xdist.",
    "pytest_randomly.",  # reseeds `random` & co. before each phase: a question item draws nothing
    "pytest_timeout.",  # starts its timer (func_only): question items are exempt, see below
    "pytest_benchmark.",  # checks the arguments of @pytest.mark.benchmark
    "pytest_rerunfailures.",  # its teardown acts only in its own runtest (the reruns rule)
    "pytest_cov.plugin.CovPlugin.",  # pauses coverage for no_cover tests
    "_hypothesis_pytestplugin.",  # acts only on items with an `obj` (test functions): a question item has none
)
# ... and those known to need pytest's runtest, with the name the line gives them.
NEEDS_STANDARD = {
    "pytest_jsonreport.": "pytest-json-report (--json-report)",
    "pytest_cov.plugin.TestContextPlugin.": "pytest-cov (--cov-context=test)",
}

# Implementations of pytest_runtest_makereport known to need only the call report of a
# question item; with any other (pytest-rerunfailures' keeps state from setup to teardown),
# the lean runtest makes its setup and teardown reports through the hook too.
CALL_REPORT_IS_ENOUGH = ("_pytest.", "pytest_satbench.", "pytest_html.", "pytest_benchmark.", "pytest_jsonreport.")

OUTCOME_PROPERTY = "satbench_outcome"
ARM_PROPERTY = "satbench_arm:{}"  # value: correct | wrong | error


class Compat:
    """Registered as a plugin by the session at configure time (`register`)."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self.is_worker = hasattr(config, "workerinput")
        self._standard: tuple[str, ...] | None = None  # decided once, see `standard`
        self._phases_made: bool | None = None
        self._said = False
        self.counts: Counter[str] = Counter()  # outcomes of the call reports seen (html, sugar)
        self._sugar = False

    # ------------------------------------------------------------------ the runtest
    @property
    def standard(self) -> tuple[str, ...]:
        """Why question items run pytest's standard runtest in this run (empty: they run
        the lean one)."""
        if self._standard is None:
            self._standard = tuple(self._needs_standard())
            if reruns_asked(self.config):
                self.config.stash[RERUN_SETTLED] = {}  # what a rerun must not ask again (`call_outcome`)
        return self._standard

    @property
    def lean(self) -> bool:
        return not self.standard

    @property
    def phases_made(self) -> bool:
        """Whether the lean runtest makes setup and teardown reports through
        pytest_runtest_makereport: only where a plugin other than pytest's own wraps it."""
        if self._phases_made is None:
            impls = self.config.pluginmanager.hook.pytest_runtest_makereport.get_hookimpls()
            self._phases_made = any(not _qualname(i.function).startswith(CALL_REPORT_IS_ENOUGH) for i in impls)
        return self._phases_made

    def _needs_standard(self) -> list[str]:
        config = self.config
        pm = config.pluginmanager
        why: list[str] = []
        reruns = reruns_asked(config)
        if reruns:
            why.append(f"pytest-rerunfailures ({reruns})")
        # another plugin's own runtest (not a wrapper) must get its turn
        for impl in pm.hook.pytest_runtest_protocol.get_hookimpls():
            name = _qualname(impl.function)
            if impl.hookwrapper or impl.wrapper or name.startswith(("_pytest.", "pytest_satbench.", "pytest_rerunfailures.")):
                continue
            why.append(f"{self._plugin_name(impl)} (its own pytest_runtest_protocol)")
        for hook in RUNTEST_HOOKS:
            for impl in getattr(pm.hook, hook).get_hookimpls():
                name = _qualname(impl.function)
                if name.startswith(LEAN_IS_FINE):
                    continue
                known = next((label for prefix, label in NEEDS_STANDARD.items() if name.startswith(prefix)), None)
                why.append(known or f"{self._plugin_name(impl)} ({hook})")
        return list(dict.fromkeys(why))  # each once, in order

    def _plugin_name(self, impl: Any) -> str:
        name = str(impl.plugin_name)
        path = Path(name)
        if path.is_absolute():  # a conftest.py: its path under the rootdir
            try:
                return str(path.relative_to(self.config.rootpath))
            except ValueError:
                return name
        return name

    # ------------------------------------------------------------------ reports
    def call_outcome(self, item: pytest.Item, report: pytest.TestReport, outcome: str | None) -> str | None:
        """On a question item's call report: its outcome (from a settled rerun when the item
        asked nothing), the properties, and, under reruns, what a rerun must not ask again."""
        arms: tuple[tuple[str, str], ...] = item.__dict__.pop("satbench_arms", ())
        settled: dict[str, tuple[str, str, tuple[tuple[str, str], ...]]] | None = self.config.stash.get(RERUN_SETTLED, None)
        if settled is not None:
            if outcome is None and item.nodeid in settled:
                _, outcome, arms = settled[item.nodeid]
            elif outcome == REGRESSED and report.failed:
                settled[item.nodeid] = (str(report.longrepr), outcome, arms)
        if outcome is not None:
            props = properties(outcome, arms)
            report.user_properties.extend(props)
            item.user_properties.extend(props)  # for the teardown report, as record_property does
        return outcome

    def end_item(self, item: pytest.Item) -> None:
        """After a question item's teardown report (either runtest): its properties are on
        its reports, and pytest's tmp_path record is of no use (`runtest.drop_tmp_path_record`)."""
        if item.user_properties:
            item.user_properties.clear()
        drop_tmp_path_record(item)

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        outcome = getattr(report, "satbench_outcome", None)
        if outcome is not None and report.when == "call" and report.outcome != "rerun":
            self.counts[outcome] += 1

    # ------------------------------------------------------------------ order and selection
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config,
                                      items: list[pytest.Item]) -> Any:
        # a wrapper registered at configure time, after pytest's cache plugins: this runs after
        # pytest-randomly's shuffle (before its yield), every plain implementation (--sw) and
        # the --lf/--ff/--nf wrappers (after their yield)
        res = yield
        lines: list[str] = []
        if config.pluginmanager.hasplugin("benchmark") and config.getoption("benchmark_only", False):
            deselected = [i for i in items if isinstance(i, QuestionItem)]
            if deselected:
                items[:] = [i for i in items if not isinstance(i, QuestionItem)]
                config.hook.pytest_deselected(items=deselected)
                lines.append(f"satbench: --benchmark-only (pytest-benchmark) runs only pytest-benchmark's "
                             f"benchmarks: {len(deselected)} question items deselected")
        regroup(items)
        if any(isinstance(i, QuestionItem) for i in items):
            lines.extend(self.lines(collect_only=bool(config.option.collectonly)))
        if not self.is_worker:
            self._say(lines)
        return res

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: Sequence[str]) -> None:
        # the controller collects nothing itself: it says the lines once, for its workers
        if not self._said and (self.settings.servers or self.settings.builtin_server):
            self._said = True
            self._say(self.lines(collect_only=bool(self.config.option.collectonly)))

    def lines(self, *, collect_only: bool = False) -> list[str]:
        """One line for each thing about this run's plugins a user should know."""
        config = self.config
        pm = config.pluginmanager
        s = self.settings
        out: list[str] = []
        if self.standard and not collect_only:
            out.append(f"satbench: {', '.join(self.standard)}: question items run pytest's standard per-item runtest "
                       "in this run, not the lean one (capture, fixtures, every runtest hook: about 0.2 ms more CPU "
                       "per item)")
        timeout = getattr(config, "_env_timeout", None)
        if pm.hasplugin("timeout") and timeout:
            out.append(f"satbench: --timeout {timeout:g} (pytest-timeout) does not apply to question items, whose "
                       f"answers are fetched ahead: each request attempt has --request-timeout ({s.request_timeout:g} s) "
                       f"and --give-up-after ({s.give_up_after:g} s) ends a run whose servers stop answering")
        count = config.getoption("count", 1) if pm.hasplugin("repeat") else 1
        if isinstance(count, int) and count > 1:
            out.append(f"satbench: --count {count} (pytest-repeat) repeats test functions, not question items: each "
                       "question is asked once (--repeat-orig K asks the original K times, for a noise floor)")
        return out

    def _say(self, lines: Iterable[str]) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        for line in lines:
            if reporter is not None:
                reporter.write_line(line, yellow=True)

    # ------------------------------------------------------------------ pytest-timeout
    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_timeout_set_timer(self, item: pytest.Item, settings: Any) -> bool | None:
        # a question item's wait is the look-ahead's and the servers' time, bounded by
        # --request-timeout per attempt and --give-up-after per run: no per-item timer
        return True if isinstance(item, QuestionItem) else None

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_timeout_cancel_timer(self, item: pytest.Item) -> bool | None:
        return True if isinstance(item, QuestionItem) else None

    # ------------------------------------------------------------------ pytest-html
    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_table_header(self, cells: list[str]) -> None:
        cells.insert(1, '<th class="sortable" data-column-type="satbench">satbench</th>')

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_table_row(self, report: pytest.TestReport, cells: list[str]) -> None:
        outcome = getattr(report, "satbench_outcome", None)
        word = outcome.upper() if outcome is not None and report.when == "call" else ""
        cells.insert(1, f'<td class="col-satbench">{word}</td>')

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_summary(self, prefix: list[str], summary: list[str], postfix: list[str],
                                    session: pytest.Session) -> None:
        line = outcome_counts(self.counts)
        if line:
            prefix.append(f"<p>satbench: {line}</p>")

    # ------------------------------------------------------------------ pytest-sugar; xdist's reports
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self._sugar = teach_sugar()
        pm = self.config.pluginmanager
        if (not self.is_worker and pm.has_plugin("dsession") and not pm.has_plugin(QuestionReports.NAME)
                and (self.settings.servers or self.settings.builtin_server)):
            # an xdist controller keeps every report its workers send; question items' passed
            # ones (and their properties) are kept lean there too (it makes no report itself)
            pm.register(QuestionReports(self.config, lambda item: False), QuestionReports.NAME)

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        line = outcome_counts(self.counts)
        if self._sugar and line and not self.is_worker:
            # pytest-sugar's summary lists pytest's own outcomes only
            terminalreporter.write_line(f"satbench: {line}")


def register(config: pytest.Config, settings: Settings) -> Compat:
    compat = Compat(config, settings)
    config.stash[COMPAT_KEY] = compat
    config.pluginmanager.register(compat, NAME)
    return compat


def reruns_asked(config: pytest.Config) -> str | None:
    """pytest-rerunfailures' reruns for this run, as its options name them; None when none."""
    if not config.pluginmanager.hasplugin("rerunfailures"):
        return None
    force = config.getoption("force_reruns", None)
    if force:
        return f"--force-reruns {force}"
    reruns = config.getoption("reruns", None)
    if reruns is None:
        try:
            reruns = int(config.getini("reruns"))
        except (TypeError, ValueError):
            reruns = None
        if reruns:
            return f"reruns = {reruns} in the ini file"
    return f"--reruns {reruns}" if reruns else None


def properties(outcome: str, arms: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """A question item's properties: its outcome (SAME, CORRECT, WRONG, REGRESSED, IMPROVED,
    ERROR) and each arm's verdict (correct, wrong, error)."""
    return [(OUTCOME_PROPERTY, outcome.upper()), *((ARM_PROPERTY.format(arm), v) for arm, v in arms)]


def outcome_counts(counts: Counter[str]) -> str:
    """`113 regressed, 2 improved, 3 errors` (the outcomes pytest's summary has no word for)."""
    parts = [f"{counts[o]} {o}" for o in (REGRESSED, IMPROVED, WRONG) if counts[o]]
    if counts[ERROR]:
        parts.append(f"{counts[ERROR]} error{'s' if counts[ERROR] != 1 else ''}")
    return ", ".join(parts)


def regroup(items: list[pytest.Item]) -> int:
    """Put each image's questions back next to each other, every group where its first
    question is, the order within a group kept; other items keep their place among the
    groups. -> image switches (between consecutive question items) after it."""
    groups: dict[Any, list[pytest.Item]] = {}
    runs = 0
    last: Any = None
    for item in items:
        key: Any = (item.question.benchmark, item.question.image.id) if isinstance(item, QuestionItem) else item
        got = groups.get(key)
        if got is None:
            groups[key] = [item]
            runs += 1
        else:
            got.append(item)
            if key != last:
                runs += 1
        last = key
    if runs != len(groups):
        items[:] = [item for group in groups.values() for item in group]
    return image_switches(items)


def image_switches(items: Iterable[pytest.Item]) -> int:
    switches = 0
    last: Any = None
    for item in items:
        if isinstance(item, QuestionItem):
            key = (item.question.benchmark, item.question.image.id)
            if last is not None and key != last:
                switches += 1
            last = key
    return switches


def teach_sugar() -> bool:
    """pytest-sugar's terminal reporter asks its own `pytest_report_teststatus` function for
    each report's category and letter, not the hook: question items then show as plain
    passes (`R` regressions vanish). When sugar is on, its function asks this plugin's
    verdict first. -> whether sugar is on."""
    sugar = sys.modules.get("pytest_sugar")
    if sugar is None or not getattr(sugar, "IS_SUGAR_ENABLED", False):
        return False
    own: Callable[..., Any] = sugar.pytest_report_teststatus
    if getattr(own, "satbench", False):
        return True
    from pytest_satbench.plugin.outcomes import teststatus

    def report_teststatus(report: Any) -> Any:
        outcome = getattr(report, "satbench_outcome", None)
        if outcome is not None and report.when == "call" and report.outcome != "rerun":
            got = teststatus(outcome, report.failed)
            if got is not None:
                return got
        return own(report)

    report_teststatus.satbench = True  # type: ignore[attr-defined]  # a mark: sugar's hook is ours now
    sugar.pytest_report_teststatus = report_teststatus  # type: ignore[attr-defined]  # a module found at run time
    return True


def _qualname(function: Any) -> str:
    return f"{getattr(function, '__module__', '')}.{getattr(function, '__qualname__', '')}"
