"""`--precision` / `--margin`: stop asking a benchmark once its answer is known (the stopping
concern of the plugin; `plugin/state.py` lists the others, `core/early_stop.py` has the rule
as a run applies it, `core/sequential.py` the confidence sequences).

What each process does:

- where items run (the only process, or each xdist worker): `start` numbers every selected
  benchmark's images in the run's order (`--order random`: collection put them in a seeded
  random order) and decides, per item, ask or skip (`skip_reason`); the look-ahead's feed of
  upcoming items is gated the same way (`gate`), so a question that is not needed is never
  sent. Each item's correctness per arm travels on its call report (`satbench_seq`).
- where reports arrive (the only process, or the xdist controller): the reports feed one
  `OrderedRule` per benchmark, image by image in the run's order.

Under xdist each worker sees only its own images, so no worker can apply the rule alone: the
controller applies it to every worker's reports and writes its state (per benchmark: images
entered, and after how many the rule was met) to a small file in the folder the controller
shares with its workers (`satbench_groups_dir`, where the image-group map already travels);
workers read it (at most every `POLL_S`) to decide. Which images are asked does not depend on
the timing (`core/early_stop.py`: the lag), so a worker that reaches an image whose decision
is not known yet waits for the other workers' earlier images to complete; the earliest
unfinished image is always runnable, so this cannot deadlock. When the run stops for another
reason (a worker's stop, a crash, Ctrl-C) the file says so and workers stop waiting.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_satbench.plugin.state import RunState

if TYPE_CHECKING:
    from pytest_satbench.core.early_stop import OrderedRule
    from pytest_satbench.plugin.items import QuestionItem

NAME = "satbench-sequential"
REPORT_ATTR = "satbench_seq"
STATUS_FILE = "sequential.json"
POLL_S = 0.02


class Sequential:
    """Registered as "satbench-sequential" in runs with servers and a stopping rule."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.settings = state.settings
        self.arms: tuple[str, ...] = ()
        # where items run: per benchmark, image id -> (position, questions), the order, the lag
        self.positions: dict[str, dict[str, tuple[int, int]]] = {}
        self.images: dict[str, list[list[Any]]] = {}
        self.lags: dict[str, int] = {}
        self.questions: dict[str, int] = {}
        # where reports arrive: the rule per benchmark
        self.rules: dict[str, OrderedRule] = {}
        self._said: set[str] = set()
        self._last: str | None = None  # the benchmark of the last report (the progress line's)
        self._cond = threading.Condition()
        self._halted = False
        workerinput: dict[str, Any] = getattr(state.config, "workerinput", {}) or {}
        folder = workerinput.get("satbench_groups_dir")
        self.status_path: Path | None = Path(folder) / STATUS_FILE if folder else None
        self._status: dict[str, Any] = {}
        self._status_read = 0.0

    # ------------------------------------------------------------------ where items run
    def start(self, items: Sequence[QuestionItem], in_flight_cap: int) -> None:
        """Numbers each benchmark's images in the order the items run (collection order)."""
        from pytest_satbench.core.arms import ORIG
        from pytest_satbench.core.early_stop import lag_images

        self.arms = (ORIG, *(a.canonical for a in self.settings.arms))
        for item in items:
            q = item.question
            pos = self.positions.setdefault(q.benchmark, {})
            got = pos.get(q.image.id)
            if got is None:
                pos[q.image.id] = (len(pos), 1)
                self.images.setdefault(q.benchmark, []).append([q.image.id, 1])
            else:
                pos[q.image.id] = (got[0], got[1] + 1)
                self.images[q.benchmark][got[0]][1] += 1
        for bench, images in self.images.items():
            self.questions[bench] = sum(m for _, m in images)
            self.lags[bench] = lag_images(in_flight_cap, self.questions[bench] / len(images), len(self.arms))

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        if self.settings.asking_order == "random":
            return []
        return [f"satbench: WARNING: --{self.rule_text().split()[0]} with --order dataset: the confidence sequences "
                "assume the images are asked in a random order, and a prefix of the dataset order is one region, "
                "not a sample of the benchmark"]

    def protocol(self) -> dict[str, Any]:
        """What the run's protocol records per benchmark, for a report to rebuild the
        sequences from the store (`core.early_stop.replay`)."""
        return {
            bench: {"rule": self.rule_text(), "precision": self.settings.precision, "margin": self.settings.margin,
                    "order": self.order(), "lag": self.lags[bench], "images": images}
            for bench, images in self.images.items()
        }

    def order(self) -> dict[str, Any]:
        order = self.settings.asking_order
        return {"kind": order, "seed": self.settings.seed} if order == "random" else {"kind": order}

    def rule_text(self) -> str:
        parts = []
        if self.settings.precision is not None:
            parts.append(f"precision {self.settings.precision:g}")
        if self.settings.margin is not None:
            parts.append(f"margin {self.settings.margin:g}")
        return " or ".join(parts)

    def where(self, item: QuestionItem) -> tuple[int, int] | None:
        """(position of the item's image, its question count); None: not a planned item."""
        return self.positions.get(item.question.benchmark, {}).get(item.question.image.id)

    def _decision(self, bench: str, position: int) -> tuple[str | None, str | None]:
        """(ASK | SKIP | None: not known yet, the rule's reason)."""
        from pytest_satbench.core.early_stop import ASK, decide

        if self.status_path is None:  # the only process: the rules are here
            with self._cond:  # (the feeder thread reads what pytest's thread writes)
                rule = self.rules.get(bench)
                if rule is None:  # no image of it complete yet
                    return decide(position, 0, None, self.lags[bench]), None
                return decide(position, rule.frontier, rule.stopped_at, self.lags[bench]), rule.rule.reason
        status = self._read_status()
        if status.get("halt"):
            return ASK, None
        got = status.get("benchmarks", {}).get(bench) or {}
        return decide(position, int(got.get("frontier", 0)), got.get("stopped_at"), self.lags[bench]), got.get("reason")

    def skip_reason(self, item: QuestionItem, stopped: Callable[[], bool]) -> str | None:
        """Why the item is not asked (the skip's reason), or None: ask it. On a worker, waits
        until the controller has seen enough earlier images to decide."""
        from pytest_satbench.core.early_stop import SKIP, skip_reason

        where = self.where(item)
        if where is None:
            return None
        while True:
            decision, reason = self._decision(item.question.benchmark, where[0])
            if decision == SKIP:
                return skip_reason(reason)
            if decision is not None or stopped() or self.status_path is None:
                return None  # (the only process always knows; see `OrderedRule`)
            time.sleep(POLL_S)

    def gate(self, upcoming: Iterable[QuestionItem], stopped: Callable[[], bool]) -> Iterator[QuestionItem]:
        """The look-ahead's feed: items of images not needed are left out, and an item is
        handed on only once it is known to be needed (at most the lag ahead of the rule)."""
        from pytest_satbench.core.early_stop import ASK, SKIP

        for item in upcoming:
            where = self.where(item)
            if where is None:
                yield item
                continue
            while True:
                decision, _ = self._decision(item.question.benchmark, where[0])
                if decision == ASK:
                    yield item
                    break
                if decision == SKIP:
                    break
                if stopped():
                    return
                with self._cond:
                    self._cond.wait(POLL_S)

    def _read_status(self) -> dict[str, Any]:
        now = time.monotonic()
        if now - self._status_read >= POLL_S and self.status_path is not None:
            self._status_read = now
            try:
                self._status = json.loads(self.status_path.read_text())
            except (OSError, ValueError):
                pass  # not written yet, or being replaced: the last one read stands
        return self._status

    # ------------------------------------------------------------------ where reports arrive
    def item_seq(self, item: QuestionItem, correct: Sequence[bool]) -> list[Any] | None:
        """What an item's call report carries for the rule: [benchmark, position, questions of
        its image, images, questions, correct per arm] (plain values: execnet sends them)."""
        where = self.where(item)
        if where is None:
            return None
        bench = item.question.benchmark
        return [bench, where[0], where[1], len(self.images[bench]), self.questions[bench], [bool(c) for c in correct]]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        seq = getattr(report, REPORT_ATTR, None)
        if report.when != "call" or seq is None or self.state.is_worker or report.outcome == "rerun":
            return  # (a try pytest-rerunfailures runs again counts once, as its last try)
        from pytest_satbench.core.arms import ORIG
        from pytest_satbench.core.early_stop import OrderedRule

        bench, position, m, n_images, n_questions, correct = seq
        rule = self.rules.get(bench)
        if rule is None:
            arms = (ORIG, *(a.canonical for a in self.settings.arms))
            rule = self.rules[bench] = OrderedRule(int(n_images), int(n_questions), arms,
                                                   precision=self.settings.precision, margin=self.settings.margin)
        self._last = bench
        before = rule.stopped_at
        with self._cond:
            entered = rule.add_question(int(position), int(m), correct)
        if entered:
            if before is None and rule.stopped_at is not None and bench not in self._said:
                self._said.add(bench)
                self.state.say(f"satbench: {bench}: {rule.rule.reason}; its other questions are not needed")
            self._write_status()
            with self._cond:
                self._cond.notify_all()

    def progress(self) -> str:
        """For the progress line: the benchmark last reported on, its first reconstruction
        arm's running delta with the sequence's half-width (or the accuracy's, with no
        reconstruction arm) and the images until the rule is met (`StoppingRule.progress`)."""
        if self._last is None:
            return ""
        rule = self.rules[self._last]
        return f"{self._last}: {rule.rule.progress()}"

    def halt(self) -> None:
        """The run is stopping for another reason: workers stop waiting for the rule."""
        self._halted = True
        self._write_status()

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        output = getattr(node, "workeroutput", None) or {}
        if error or output.get("satbench_stopped"):
            self.halt()

    def pytest_keyboard_interrupt(self, excinfo: Any) -> None:
        self.halt()

    def _write_status(self) -> None:
        """The controller's rules for its workers (an atomic replace of a small file)."""
        folder = self._controller_folder()
        if folder is None:
            return
        body = {"halt": self._halted, "benchmarks": {
            b: {"frontier": r.frontier, "stopped_at": r.stopped_at, "reason": r.rule.reason}
            for b, r in self.rules.items()}}
        path = folder / STATUS_FILE
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(body))
            os.replace(tmp, path)
        except OSError:
            pass  # workers then ask (they never skip without the controller's word)

    def _controller_folder(self) -> Path | None:
        if not self.state.is_controller():
            return None
        hooks = self.state.config.pluginmanager.get_plugin("satbench-xdist")
        folder = getattr(hooks, "groups_dir", None)
        return Path(folder) if folder is not None else None


SEQUENTIAL_KEY = pytest.StashKey[Sequential]()
