"""The fault suite's harness (issue 10, item 9).

One deterministic dataset (RSVQA-LR, exact on-disk format), one deterministic model
(`faults_answer.answer`), one reconstruction arm. A clean run gives the reference answers;
every fault case runs the faulty run(s) as real `python -m pytest` subprocesses on a project
of its own (a `pytest.ini` fixes the rootdir, hence the node ids that key the store), reruns
against a healthy server until the run completes (a bounded number of times), and compares
the final store with the clean one answer by answer:

- nothing lost: the same (nodeid, arm) pairs have an ok answer, with the same fingerprint;
- nothing counted twice: one ok row per (nodeid, arm), and the final run's verdict line is the
  clean run's;
- no fault ever scored: every ok answer text is the clean one (no fault's body text);
- bounded time: every run ends within its bound (the subprocess is killed otherwise);
- every message one line: no tracebacks, no INTERNALERROR, no thread frames.

The measured figures (chat requests over all runs of a case / those of a clean run, time to
stop) are collected in `FIGURES` and printed in the terminal summary (conftest.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datasets_fake import write_rsvqa
from servers import interruptible

HERE = Path(__file__).resolve().parent
SERVERS_PY = HERE.parent / "servers.py"
ANSWER_FN = f"{HERE / 'faults_answer.py'}:answer"
MODEL = "m"

BENCH_MODULE = "from pytest_satbench import benchmark_test\ntest_rsvqa_lr = benchmark_test('rsvqa_lr')\n"
N_IMAGES, PER_TYPE = 6, 5
N_QUESTIONS = N_IMAGES * 4 * PER_TYPE  # 120 questions
ARMS = ("orig", "jpeg:quality=50")
N_ANSWERS = N_QUESTIONS * len(ARMS)  # 240 answers, one request each in a clean run
# short deadlines so that every fault costs little; the same options in every run of a case
COMMON = ("--recon", "jpeg:quality=50", "--retries", "2", "--request-timeout", "1.5",
          "--give-up-after", "4", "--concurrency", "6", "--max-reply-bytes", "100000")
RUN_BOUND_S = 90.0  # no run of this suite may take longer (it is killed, and the case fails)
MAX_RERUNS = 4
# texts a fault's body carries: none may ever be stored as an answer
FAULT_TEXTS = ("trickled", "never whole", "FAULT")

FIGURES: list[dict[str, Any]] = []


@dataclass
class Result:
    rc: int
    out: str
    took: float
    killed: bool = False

    def check_lines(self) -> None:
        check_one_line_messages(self.out)


def check_one_line_messages(out: str) -> None:
    """No traceback of any kind reaches the user: every fault is reported in one line."""
    for bad in ("Traceback (most recent call last)", "INTERNALERROR", "threading.py", "KeyboardInterrupt",
                "Exception in thread", "During handling of the above exception"):
        assert bad not in out, f"{bad!r} in the output:\n{out[-4000:]}"
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(("satbench: ", "ERROR: ")) and i + 1 < len(lines):
            nxt = lines[i + 1]
            # a message continued on the next line would be a frame or a bare continuation
            assert not nxt.startswith(("  File ", "    ")), f"a message on more than one line:\n{line}\n{nxt}"


@dataclass
class Project:
    """A pytest project (ini + benchmark module + data) with a store of its own."""

    dir: Path
    data: Path
    store: Path
    pristine: Path  # an untouched copy of the data, to repair what a case breaks
    module: str = BENCH_MODULE
    image_of: dict[str, str] = field(default_factory=dict)  # question key -> image id
    results: list[Result] = field(default_factory=list)

    @classmethod
    def make(cls, root: Path, module: str = BENCH_MODULE, store: Path | None = None) -> Project:
        root.mkdir(parents=True, exist_ok=True)
        (root / "pytest.ini").write_text("[pytest]\n")
        (root / "test_b.py").write_text(module)
        data = root / "data"
        written = write_rsvqa(data, "lr", n_images=N_IMAGES, per_type=PER_TYPE)
        pristine = root / "pristine"
        shutil.copytree(data, pristine)
        return cls(root, data, store or root / "store" / "results.sqlite", pristine, module,
                   {e.key: e.image_id for e in written.expected})

    def repair(self) -> None:
        shutil.rmtree(self.data)
        shutil.copytree(self.pristine, self.data)

    def cmd(self, urls: str | Sequence[str], *extra: str) -> list[str]:
        url = urls if isinstance(urls, str) else ",".join(urls)
        return [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                "-W", "ignore::pytest.PytestAssertRewriteWarning", "--servers", url, "--data-root",
                str(self.data), "--store", str(self.store), *COMMON, *extra]

    def start(self, urls: str | Sequence[str], *extra: str, name: str = "run",
              preexec: Any = None) -> Running:
        log = self.dir / f"{name}-{len(self.results)}-{time.monotonic_ns()}.log"
        fh = log.open("w")
        proc = subprocess.Popen(self.cmd(urls, *extra), cwd=self.dir, stdout=fh, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True, preexec_fn=_preexec(preexec))  # noqa: PLW1509 (SIGINT's default, and RLIMIT_FSIZE where asked)
        fh.close()
        return Running(self, proc, log, time.monotonic())

    def run(self, urls: str | Sequence[str], *extra: str, bound: float = RUN_BOUND_S) -> Result:
        return self.start(urls, *extra).wait(bound)

    # ------------------------------------------------------------------ the store
    def stored_ok(self) -> int:
        if not self.store.exists():
            return 0
        try:
            with sqlite3.connect(f"file:{self.store}?mode=ro", uri=True, timeout=1) as conn:
                return conn.execute("SELECT COUNT(*) FROM answers WHERE status='ok'").fetchone()[0]
        except sqlite3.Error:
            return 0

    def answers(self) -> list[tuple[str, str, str, str, str | None]]:
        conn = sqlite3.connect(self.store)
        try:
            return conn.execute("SELECT nodeid, arm, fingerprint, status, text FROM answers").fetchall()
        finally:
            conn.close()

    def last_run(self) -> tuple[Any, set[str]]:
        conn = sqlite3.connect(self.store)
        try:
            run_id, finished = conn.execute("SELECT run_id, finished FROM runs ORDER BY started DESC LIMIT 1").fetchone()
            items = {r[0] for r in conn.execute("SELECT nodeid FROM run_items WHERE run_id=?", (run_id,))}
        finally:
            conn.close()
        return finished, items


def _preexec(extra: Any) -> Any:
    """Every run starts with SIGINT at its default (`servers.interruptible`: a run started from a
    background CI script would otherwise ignore Ctrl-C), then `extra` where a test gives one."""

    def run() -> None:
        interruptible()
        if extra is not None:
            extra()

    return run


@dataclass
class Running:
    project: Project
    proc: subprocess.Popen[str]
    log: Path
    started: float

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, bound: float = RUN_BOUND_S) -> Result:
        killed = False
        try:
            self.proc.wait(max(0.1, bound - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            killed = True
        took = time.monotonic() - self.started
        kill_group(self.proc)
        result = Result(self.proc.returncode if not killed else -9, self.log.read_text(), took, killed)
        self.project.results.append(result)
        assert not killed, f"the run did not end within {bound:.0f} s:\n{result.out[-4000:]}"
        return result


def kill_group(proc: subprocess.Popen[Any]) -> None:
    """End what this test started: the run and any worker it left behind (its own session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    # zombies count as gone: look for a live member of the group
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields_ = stat.rsplit(")", 1)[1].split()
        if int(fields_[2]) == pgid and fields_[0] != "Z":
            return True
    return False


def wait_until(cond: Any, timeout: float, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


class ServerProcess:
    """A deterministic FakeVLM in a process of its own (killing it closes its connections)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVERS_PY), "--model", MODEL, "--answer-from", ANSWER_FN, "--delay", str(delay)],
            stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.url = self.proc.stdout.readline().strip()  # type: ignore[union-attr]  # stdout=PIPE: not None
        assert self.url.startswith("http://"), self.url

    def kill(self) -> None:
        kill_group(self.proc)

    def __enter__(self) -> ServerProcess:  # noqa: PYI034 (no subclass: Self would add nothing)
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


# ---------------------------------------------------------------------- the reference


@dataclass(frozen=True)
class Reference:
    answers: dict[tuple[str, str], tuple[str, str]]  # (nodeid, arm) -> (fingerprint, text)
    verdict: str  # the final line, without its time
    requests: int


def verdict_line(out: str) -> str:
    lines = [ln for ln in out.splitlines() if " in " in ln and ("passed" in ln or "failed" in ln or "wrong" in ln)]
    assert lines, out[-3000:]
    return lines[-1].rsplit(" in ", 1)[0]


def ok_answers(project: Project) -> dict[tuple[str, str], tuple[str, str]]:
    ok: dict[tuple[str, str], tuple[str, str]] = {}
    for nodeid, arm, fp, status, text in project.answers():
        if status == "ok":
            assert (nodeid, arm) not in ok, f"two ok answers for {nodeid} {arm}"
            ok[(nodeid, arm)] = (fp, text or "")
    return ok


def settle(project: Project, url: str, *extra: str, reruns: int = MAX_RERUNS) -> Result:
    """Rerun against a healthy server until the run completes (exit 0), a bounded number of times."""
    last = project.results[-1] if project.results else None
    for _ in range(reruns):
        if last is not None and last.rc == 0:
            return last
        last = project.run(url, *extra)
        last.check_lines()
    assert last is not None and last.rc == 0, f"not complete after {reruns} reruns (exit {last and last.rc}):\n{last and last.out[-4000:]}"
    return last


def compare(project: Project, ref: Reference, final: Result | None = None,
            keys: set[tuple[str, str]] | None = None) -> None:
    """The final store against the clean run's, answer by answer."""
    rows = project.answers()
    triples = [(n, a, fp) for n, a, fp, _, _ in rows]
    assert len(triples) == len(set(triples)), "an answer stored twice"
    got = ok_answers(project)
    want = ref.answers if keys is None else {k: v for k, v in ref.answers.items() if k in keys}
    if keys is not None:
        got = {k: v for k, v in got.items() if k in keys}
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    assert not missing, f"{len(missing)} answers lost, e.g. {missing[:3]}"
    assert not extra, f"{len(extra)} answers the clean run does not have, e.g. {extra[:3]}"
    for n, a, _, status, text in rows:
        if status == "ok":
            assert not any(t in (text or "") for t in FAULT_TEXTS) and not (text or "").startswith("xxxx"), \
                f"a fault's text stored as an answer: {n} {a} {text!r:.80}"
    differ = [k for k in want if got[k] != want[k]]
    assert not differ, f"{len(differ)} answers differ from the clean run's, e.g. {differ[0]}: {got[differ[0]]} vs {want[differ[0]]}"
    if final is not None and keys is None:
        assert verdict_line(final.out) == ref.verdict, "the final counts are not the clean run's"
        finished, items = project.last_run()
        assert finished is not None, "the final run is not marked finished"
        assert items == {n for n, _ in ref.answers}, "the final run's items are not the clean run's"


def record(case: str, project: Project, requests: int, ref: Reference, **extra: Any) -> None:
    FIGURES.append({"case": case, "runs": len(project.results), "requests": requests,
                    "ratio": requests / ref.requests, "max_run_s": max(r.took for r in project.results),
                    **extra})
