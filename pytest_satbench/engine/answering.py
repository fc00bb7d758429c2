"""Answering one question in every arm: image, requests, scoring, storing.

`QuestionRunner.submit` returns a future that completes when every arm has an answer or
an error. It never blocks on the network itself: the image is prepared on the image
pipeline's threads, each arm's request runs on the request threads, and each answer is
scored and committed to the store the moment it arrives, so a killed run keeps it.
A stored answer is reused when its fingerprint matches; wrong answers are never retried.

(Just over 500 lines: the judge's asks and the request threads (`DaemonWorkers`) live here with
the one path that completes an item, which they both end on.)
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field, replace

from pytest_satbench.core import judge as J
from pytest_satbench.core.arms import (
    BLIND,
    ORIG,
    image_arm,
    is_recon,
    is_repeat,
    judge_arm,
    repeat_arm,
    sample_arm,
    sample_of,
)
from pytest_satbench.core.question import Question
from pytest_satbench.core.records import AnswerRow
from pytest_satbench.core.redact import redact
from pytest_satbench.core.scoring import Score, ScoreOptions, final_answer, score
from pytest_satbench.core.verdict import QuestionResult, score_question
from pytest_satbench.engine.client import Answer, ServerPool
from pytest_satbench.engine.failures import RequestFailed
from pytest_satbench.engine.fingerprint import AskSettings, arm_fingerprint
from pytest_satbench.engine.images import ImageError, ImagePipeline, PreparedImage
from pytest_satbench.engine.store import ResultStore, StoreError


@dataclass(slots=True)
class ArmResult:
    arm: str
    status: str  # "ok" | "error"
    text: str | None = None
    score: Score | None = None
    finish_reason: str | None = None
    error: str | None = None
    from_store: bool = False
    latency_s: float | None = None
    image_tokens: int | None = None
    fingerprint: str | None = None  # the store key it was kept under, when a fresh answer
    row: AnswerRow | None = field(default=None, repr=False)  # the row it is (stored, unless the store failed)

    @property
    def correct(self) -> bool:
        return self.status == "ok" and self.score is not None and self.score.correct

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


@dataclass(slots=True)
class ItemResult:
    question: Question
    arms: dict[str, ArmResult] = field(default_factory=dict)
    fingerprints: dict[str, str] = field(default_factory=dict)  # store key per arm
    prompt: str = ""
    sent_size: tuple[int, int] | None = None  # the geometry every image arm was sent at
    # the question's verdict, the same record its reports build from the stored rows (set when
    # the item completes; `core.verdict`): the item's letter, properties and messages read it
    record: QuestionResult | None = field(default=None, repr=False)
    verdict_error: str | None = None  # why there is no record (a scorer bug; one line for the item)

    @property
    def errors(self) -> list[ArmResult]:
        return [a for a in self.arms.values() if a.status != "ok"]


@dataclass(frozen=True, slots=True)
class Job:
    """A question as the runner needs it: the node id is the store key."""

    nodeid: str
    question: Question
    prompt: str
    repeats: int = 0  # ask the original this many times in all (--repeat-orig), 0: once


@dataclass(frozen=True)
class Judge:
    """The LLM judge of VRSBench's official evaluation (`--judge`): its own server pool and
    model; its verdicts are stored and fingerprinted like answers. It is asked at temperature
    0 without the run's model settings (--temperature, --top-p, --request-seed,
    --system-prompt, --extra-body): they describe the model measured, not its judge."""

    pool: ServerPool
    model: str

    @property
    def digest(self) -> str:
        return AskSettings(model=self.model, max_tokens=J.JUDGE_MAX_TOKENS, temperature=0.0,
                           prompt_style=J.JUDGE_STYLE).digest()


# Request threads beyond what the limits allow in flight: they wait for a slot, so a raised
# limit is filled at once, and 4 bound the threads by the limits (engine/limits.py).
SPARE_THREADS = 4


def _sent_pairs(stored: dict[str, AnswerRow]) -> list[tuple[str, str]]:
    """(orig's, arm's sha256 of the bytes sent) of each reconstruction arm's stored answer: the
    keys of their distortion (`ResultStore.distortion`)."""
    o = stored.get(ORIG)
    if o is None or not o.image_sha256:
        return []
    return [(o.image_sha256, r.image_sha256) for a, r in stored.items() if is_recon(a) and r.image_sha256]


class QuestionRunner:
    def __init__(
        self,
        *,
        run_id: str,
        pool: ServerPool,
        images: ImagePipeline,
        store: ResultStore,
        settings: AskSettings,
        score_options: Callable[[Question, tuple[int, int] | None], ScoreOptions],
        blind: bool = False,
        fresh: bool = False,
        threads: int | None = None,
        judge: Judge | None = None,
        samples: int = 1,
    ) -> None:
        self.run_id = run_id
        self.pool = pool
        self.images = images
        self.store = store
        self.settings = settings
        self._settings_digest = settings.digest()
        self._extra_body = json.loads(settings.extra_body) if settings.extra_body else None
        self.score_options = score_options
        self.arms: list[str] = list(images.arms) + ([BLIND] if blind else [])
        self.fresh = fresh
        self.samples = samples  # --samples K: each arm asked K times (samples 2..K: `orig@2`, ...)
        self.judge = judge
        self._judge_digest = judge.digest if judge is not None else ""
        # A request holds its thread while in flight, and waits for a slot on one: as many
        # threads as the pools' limits allow in flight now, plus a few that wait, started only
        # as they are needed and ended when a limit falls (a limit at 16 under a cap of 512
        # ran 512 threads, all but 16 of them waiting for a slot).
        def by_limits() -> int:
            return pool.max_in_flight() + (judge.pool.max_in_flight() if judge else 0) + SPARE_THREADS

        self._requests = DaemonWorkers(by_limits if threads is None else threads, "satbench-ask")
        self._lock = threading.Lock()

    def _stored(self, nodeid: str, keys: list[tuple[str, str]]) -> dict[str, AnswerRow]:
        """The stored answers to reuse: every one, or under --fresh only this run's own (an
        item run again in the same session, by pytest-rerunfailures, asks only what failed)."""
        got = self.store.get_many(nodeid, keys)
        if self.fresh:
            return {arm: row for arm, row in got.items() if row.run_id == self.run_id and row.status == "ok"}
        return got

    # ------------------------------------------------------------------ planning
    def arms_for(self, job: Job) -> list[str]:
        """The arms asked for one question: every arm, the --repeat-orig asks, then each arm's
        --samples 2..K (`core.arms.sample_arm`; sample 1 is the arm itself)."""
        return (self.arms + [repeat_arm(i) for i in range(2, job.repeats + 1)]
                + [sample_arm(a, k) for k in range(2, self.samples + 1) for a in self.arms])

    def seed_for(self, arm: str) -> int | None:
        """The request seed an arm is sent with: the run's (--request-seed, None: not sent) for
        an arm itself, base + k - 1 for its k-th sample (base: --request-seed, or 0), so every
        sample of a question is a distinct request."""
        k = sample_of(arm)[1]
        if k == 1:
            return self.settings.seed
        return (self.settings.seed or 0) + k - 1

    def fingerprints(self, job: Job, model: str | None = None) -> tuple[dict[str, str], tuple[int, int] | None]:
        """Fingerprint per arm for answers from `model` (default: the one asked for), and the
        geometry the image is sent at."""
        info = self.images.info(job.question.image)
        size = self.images.target_size(info)
        digest = self._digest(model)
        fps = {}
        for arm in self.arms_for(job):
            blind = image_arm(arm) == BLIND
            fps[arm] = arm_fingerprint(
                digest,
                arm=arm,
                codec_identity=self.images.codec_identity(image_arm(arm)),
                prompt=job.prompt,
                image_sha256=None if blind else info.sha256,
                size=None if blind else size,
            )
        return fps, size

    def _digest(self, model: str | None) -> str:
        # An answer is fingerprinted with the model id the server returned: under an allowed
        # alias (--allow-model-alias) that is the alias, so answers of the two ids never mix.
        if model is None or model == self.settings.model:
            return self._settings_digest
        return replace(self.settings, model=model).digest()

    def submit(self, job: Job) -> Future[ItemResult]:
        done: Future[ItemResult] = Future()
        result = ItemResult(job.question, prompt=job.prompt)
        if self.store.failure is not None:
            # nothing is asked that could not be kept
            for arm in self.arms_for(job):
                err = str(self.store.failure)
                result.arms[arm] = ArmResult(arm, "error", error=err, row=self._error_row(job, arm, "", err))
            self._complete(job, result, None, done)
            return done
        try:
            fps, size = self.fingerprints(job)
            result.fingerprints, result.sent_size = fps, size
        except ImageError as exc:
            # An unreadable image has no sha256 to fingerprint by; its error rows are kept
            # under a fingerprint that no answer can have, so the question stays in every
            # denominator of this run and is asked afresh once the file is readable.
            for arm in self.arms_for(job):
                fp = f"unreadable-image:{arm}"
                result.fingerprints[arm] = fp
                row = self._error_row(job, arm, fp, str(exc))
                self.store.put(row)
                result.arms[arm] = ArmResult(arm, "error", error=str(exc), row=row)
            self._complete(job, result, None, done)
            return done

        stored = self._stored(job.nodeid, list(fps.items()))
        for alias in [] if self.fresh else self.pool.model_aliases:
            lacking = [a for a in fps if a not in stored]
            if not lacking:
                break
            alias_fps, _ = self.fingerprints(job, alias)
            for arm, row in self.store.get_many(job.nodeid, [(a, alias_fps[a]) for a in lacking]).items():
                stored[arm] = row
                result.fingerprints[arm] = alias_fps[arm]  # the run's item points at the row it used
        for arm, row in stored.items():
            result.arms[arm] = self._from_row(job, row, size)
        arms = self.arms_for(job)
        missing = [a for a in arms if a not in stored]
        if not missing:
            if self.images.lacks_distortion(_sent_pairs(stored)):
                # every answer is stored, a pair's distortion is not (measured off, or before it
                # existed): the image is prepared to measure it, nothing is asked
                self.images.get(job.question.image).add_done_callback(
                    lambda _f: self._finish(job, result, size, done))
                return done
            self._finish(job, result, size, done)
            return done

        pending = [len(missing)]

        def finish_one(arm_result: ArmResult) -> None:
            with self._lock:
                result.arms[arm_result.arm] = arm_result
                if arm_result.fingerprint:  # stored under the returned model's (an alias's)
                    result.fingerprints[arm_result.arm] = arm_result.fingerprint
                pending[0] -= 1
                last = pending[0] == 0
            if last:
                result.arms = {a: result.arms[a] for a in arms}
                self._finish(job, result, size, done)

        def ask(arm: str, prepared: PreparedImage | None) -> None:
            if self.store.failure is not None:  # the store failed while this waited its turn
                err = str(self.store.failure)
                finish_one(ArmResult(arm, "error", error=err, row=self._error_row(job, arm, fps[arm], err)))
                return
            try:
                finish_one(self._ask(job, arm, fps[arm], prepared, size))
            except BaseException as exc:  # never leave an item waiting forever
                err = f"{type(exc).__name__}: {exc}"
                finish_one(ArmResult(arm, "error", error=err, row=self._error_row(job, arm, fps[arm], err)))

        image_arms = [a for a in missing if image_arm(a) != BLIND]
        for arm in missing:
            if image_arm(arm) == BLIND:  # blind and its samples: no image to wait for
                self._requests.submit(ask, arm, None)
        if image_arms:
            image_future = self.images.get(job.question.image)

            def on_image(f: Future[PreparedImage]) -> None:
                exc = f.exception()
                for arm in image_arms:
                    if exc is not None:
                        err = str(exc) if isinstance(exc, ImageError) else f"{type(exc).__name__}: {exc}"
                        row = self._error_row(job, arm, fps[arm], err)
                        if self.store.failure is None:  # (a failed store takes nothing more: its item says so)
                            try:
                                self.store.put(row)
                            except StoreError:
                                pass  # it failed meanwhile: `store.failure` ends the run with its one line
                        finish_one(ArmResult(arm, "error", error=err, row=row))
                    else:
                        self._requests.submit(ask, arm, f.result())

            image_future.add_done_callback(on_image)
        return done

    # ------------------------------------------------------------------ the judge
    def _finish(self, job: Job, result: ItemResult, size: tuple[int, int] | None, done: Future[ItemResult]) -> None:
        """Every arm has its answer: ask the judge where the benchmark's official rules leave
        an answer undecided, then complete the item."""
        try:
            asks = self._judge_asks(job, result, size)
        except BaseException as exc:  # never leave an item waiting forever
            arm, err = judge_arm("*"), f"{type(exc).__name__}: {exc}"
            result.arms[arm] = ArmResult(arm, "error", error=err, row=self._error_row(job, arm, "", err))
            asks = []
        if not asks:
            self._complete(job, result, size, done)
            return
        stored = self._stored(job.nodeid, [(arm, fp) for arm, _, fp in asks])
        for arm, row in stored.items():
            result.arms[arm] = ArmResult(arm, "ok", text=row.text, from_store=True, latency_s=row.latency_s, row=row)
        missing = [a for a in asks if a[0] not in stored]
        if not missing:
            self._complete(job, result, size, done)
            return
        pending = [len(missing)]

        def one(arm: str, prompt: str, fp: str) -> None:
            try:
                got = self._ask_judge(job, arm, prompt, fp)
            except BaseException as exc:
                err = f"{type(exc).__name__}: {exc}"
                got = ArmResult(arm, "error", error=err, row=self._error_row(job, arm, fp, err))
            with self._lock:
                result.arms[arm] = got
                pending[0] -= 1
                last = pending[0] == 0
            if last:
                self._complete(job, result, size, done)

        for arm, prompt, fp in missing:
            self._requests.submit(one, arm, prompt, fp)

    def _judge_asks(self, job: Job, result: ItemResult, size: tuple[int, int] | None) -> list[tuple[str, str, str]]:
        """(judge arm, judge prompt, fingerprint) for each answer the rules do not decide."""
        q = job.question
        if self.judge is None or q.kind != "vqa" or J.JUDGED_VIEW not in self.score_options(q, size).views:
            return []
        asks = []
        for arm, a in list(result.arms.items()):
            if a.status != "ok" or is_repeat(arm):
                continue
            predicted = final_answer(a.text or "")
            if J.official_rules(q.answer, predicted) is not None:
                continue  # decided by the rules: the judge never sees it
            prompt = J.judge_prompt(q.text, q.answer, predicted)
            ja = judge_arm(arm)
            fp = arm_fingerprint(self._judge_digest, arm=ja, codec_identity="", prompt=prompt,
                                 image_sha256=None, size=None)
            result.fingerprints[ja] = fp
            asks.append((ja, prompt, fp))
        return asks

    def _ask_judge(self, job: Job, arm: str, prompt: str, fp: str) -> ArmResult:
        assert self.judge is not None
        try:
            answer = self.judge.pool.ask(model=self.judge.model, prompt=prompt, image_jpeg=None,
                                         max_tokens=J.JUDGE_MAX_TOKENS, temperature=0.0)
        except RequestFailed as exc:
            row = self._error_row(job, arm, fp, f"judge: {exc}")
            self.store.put(row)
            return ArmResult(arm, "error", error=f"judge: {exc}", row=row)
        verdict = J.judge_verdict(answer.text)
        row = self._answer_row(job, arm, fp, answer, extracted=answer.text.strip()[:32], correct=verdict, parsed=True)
        self.store.put(row)
        return ArmResult(arm, "ok", text=answer.text, finish_reason=answer.finish_reason, latency_s=answer.latency_s,
                         row=row)

    # ------------------------------------------------------------------ one request
    def _ask(self, job: Job, arm: str, fp: str, prepared: PreparedImage | None, size: tuple[int, int] | None) -> ArmResult:
        arm_image = prepared.arms[image_arm(arm)] if prepared is not None else None
        try:
            answer: Answer = self.pool.ask(
                model=self.settings.model,
                prompt=job.prompt,
                image_jpeg=None,
                image_b64=arm_image.b64 if arm_image else None,
                max_tokens=self.settings.max_tokens,
                temperature=self.settings.temperature,
                top_p=self.settings.top_p,
                seed=self.seed_for(arm),
                system_prompt=self.settings.system_prompt,
                extra_body=self._extra_body,
            )
        except RequestFailed as exc:
            row = self._error_row(job, arm, fp, str(exc))
            self.store.put(row)
            return ArmResult(arm, "error", error=str(exc), row=row)
        sc = score(job.question, answer.text, self.score_options(job.question, size))
        if answer.model and answer.model != self.settings.model:  # an allowed alias answered
            fp = self.fingerprints(job, answer.model)[0][arm]
        row = self._answer_row(job, arm, fp, answer, extracted=sc.extracted, correct=sc.correct, parsed=sc.parsed,
                               image_sha256=arm_image.sha256 if arm_image else None,
                               image_tokens=arm_image.tokens if arm_image else None)
        self.store.put(row)
        return ArmResult(
            arm, "ok", text=answer.text, score=sc, finish_reason=answer.finish_reason,
            latency_s=answer.latency_s, image_tokens=arm_image.tokens if arm_image else None, fingerprint=fp,
            row=row,
        )

    def _from_row(self, job: Job, row: AnswerRow, size: tuple[int, int] | None) -> ArmResult:
        # Re-score the stored raw answer: a scorer fix then applies to stored answers too.
        sc = score(job.question, row.text or "", self.score_options(job.question, size))
        return ArmResult(
            row.arm, "ok", text=row.text, score=sc, finish_reason=row.finish_reason,
            from_store=True, latency_s=row.latency_s, image_tokens=row.image_tokens, row=row,
        )

    def _answer_row(self, job: Job, arm: str, fp: str, answer: Answer, *, extracted: str, correct: bool,
                    parsed: bool, image_sha256: str | None = None, image_tokens: int | None = None) -> AnswerRow:
        """The stored row of an answer (a model's, or a judge's verdict), as the server gave it."""
        return AnswerRow(
            nodeid=job.nodeid, arm=arm, fingerprint=fp, status="ok", benchmark=job.question.benchmark,
            question_key=job.question.key, image_id=job.question.image.id, text=answer.text,
            extracted=extracted, correct=correct, parsed=parsed, finish_reason=answer.finish_reason,
            latency_s=answer.latency_s, prompt_tokens=answer.prompt_tokens, completion_tokens=answer.completion_tokens,
            cost=answer.cost, model=answer.model, server=answer.server, attempts=answer.attempts,
            image_sha256=image_sha256, image_tokens=image_tokens, run_id=self.run_id, clipped=answer.clipped,
            reasoning_chars=answer.reasoning_chars, repaired=answer.repaired or None,
            reasoning_tokens=answer.reasoning_tokens, reasoning=answer.reasoning,
        )

    def _error_row(self, job: Job, arm: str, fp: str, error: str) -> AnswerRow:
        return AnswerRow(
            nodeid=job.nodeid, arm=arm, fingerprint=fp, status="error",
            benchmark=job.question.benchmark, question_key=job.question.key,
            image_id=job.question.image.id, error=redact(error), run_id=self.run_id,
        )

    def _complete(self, job: Job, result: ItemResult, size: tuple[int, int] | None, done: Future[ItemResult]) -> None:
        """Complete the item with its verdict: the record its reports build from the same rows
        (`core.verdict.score_question`), with the scores each answer got as it arrived."""
        try:
            rows = {arm: a.row for arm, a in result.arms.items() if a.row is not None}
            scores = {arm: a.score for arm, a in result.arms.items() if a.score is not None}
            result.record = score_question(job.nodeid, job.question, rows, self.score_options(job.question, size),
                                           scores=scores, samples=self.samples)
        except BaseException as exc:  # a bug here must not leave the item waiting forever
            result.record, result.verdict_error = None, f"scoring failed: {type(exc).__name__}: {exc}"
        _complete(done, result)

    def close(self) -> None:
        self._requests.shutdown()


def _complete(done: Future[ItemResult], result: ItemResult) -> None:
    """Complete an item's future, unless the look-ahead cancelled it meanwhile (a run that
    stopped): a late answer is stored all the same, and no one waits for the future."""
    try:
        done.set_result(result)
    except InvalidStateError:
        pass


class DaemonWorkers:
    """Threads that run submitted calls, and never hold up the interpreter's exit.

    A ThreadPoolExecutor's threads are joined at exit, so after `-x` or Ctrl-C a request
    still waiting on a slow server (up to --request-timeout) would keep pytest from exiting.
    Nothing is lost by abandoning it: its answer was not stored, so a rerun asks it again.
    Threads start when a call finds none idle, up to `n` (a number, or read at each call:
    the pools' limits now), and one that finishes a call while more than `n` run ends.
    """

    def __init__(self, n: int | Callable[[], int], name: str) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[..., None], tuple[object, ...]] | None] = queue.SimpleQueue()
        self._max: Callable[[], int] = (lambda: max(1, n)) if isinstance(n, int) else (lambda: max(1, n()))
        self._name = name
        self._threads: list[threading.Thread] = []
        self._started = 0
        self._idle = 0
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., None], *args: object) -> None:
        if self._closed:
            return
        with self._lock:
            if self._idle > 0:
                self._idle -= 1  # this call is that idle thread's
            elif len(self._threads) < self._max():
                self._start()
            # else every thread is busy and none may be added: the call waits its turn
        self._queue.put((fn, args))

    def _start(self) -> None:
        self._started += 1
        t = threading.Thread(target=self._work, name=f"{self._name}-{self._started}", daemon=True)
        self._threads.append(t)
        t.start()

    def _work(self) -> None:
        while True:
            task = self._queue.get()
            if task is None or self._closed:
                return
            fn, args = task
            fn(*args)
            with self._lock:
                if len(self._threads) > self._max():  # a limit fell: one thread fewer
                    self._threads.remove(threading.current_thread())
                    return
                # a limit rose while calls wait: threads for them, up to the bound
                for _ in range(min(self._max() - len(self._threads), self._queue.qsize() - self._idle - 1)):
                    self._start()
                self._idle += 1

    def shutdown(self) -> None:
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)

