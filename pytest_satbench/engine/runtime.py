"""What exists only while questions are asked in this process: the server pool, the image
pipeline with its codecs, the results store, the question runner and the look-ahead feeding
it.

Built from a `RuntimeConfig` (never from pytest's objects) and closed with everything it
opened, on every path: what `start` opens goes on an `ExitStack` at once, so a failure
half-way (a server down, a bad checkpoint, a protocol conflict) closes what was already open.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from pytest_satbench.codecs.base import build_codecs
from pytest_satbench.core import prompts, verdict
from pytest_satbench.core.question import Question
from pytest_satbench.core.records import LimitTrace, ServerTraffic
from pytest_satbench.core.scoring import ScoreOptions
from pytest_satbench.engine.answering import ItemResult, Job, Judge, QuestionRunner
from pytest_satbench.engine.client import ServerPool
from pytest_satbench.engine.config import RuntimeConfig
from pytest_satbench.engine.failures import ModelMismatch, ServerUnavailable
from pytest_satbench.engine.fingerprint import AskSettings
from pytest_satbench.engine.images import ImagePipeline
from pytest_satbench.engine.lookahead import LookAhead
from pytest_satbench.engine.provenance import protocol_conflict, served_model_change
from pytest_satbench.engine.store import ResultStore, StoreError

if TYPE_CHECKING:
    from pytest_satbench.engine.diskcache import DiskCache


class Askable(Protocol):
    """What the runtime needs of an item: its store key and its question."""

    @property
    def nodeid(self) -> str: ...

    question: Question


# The most items submitted ahead of the one running (their answers are held until it is
# their turn): enough for seven servers at vLLM's default batch, bounded in memory.
MAX_WINDOW = 8192


class StartError(Exception):
    """The run cannot start; one line saying what to do (the plugin shows it as a usage error)."""


class GaveUp(Exception):
    """No server has answered for the give-up window while requests fail: one line why."""


class Runtime:
    """Servers, codecs, store and look-ahead for one process; use `start`, then `close`."""

    def __init__(self, cfg: RuntimeConfig, stack: contextlib.ExitStack) -> None:
        self.cfg = cfg
        self._stack = stack
        self.model: str = ""
        self.pool: ServerPool
        self.store: ResultStore
        self.images: ImagePipeline
        self.runner: QuestionRunner
        self.lookahead: LookAhead[Askable, ItemResult] | None = None
        self.judge: Judge | None = None
        self._started = time.monotonic()
        self.notices: list[str] = []  # one line each, for the user, from the start

    @classmethod
    def start(cls, cfg: RuntimeConfig, upcoming: Iterable[Askable] | None = None) -> Runtime:
        """Open everything; `upcoming`: the items this process will run, in order, for the
        look-ahead (None: questions are only asked on demand, as the public fixtures do)."""
        if not cfg.urls:
            raise StartError(
                "benchmark items need servers: pass --servers http://HOST:PORT[,...] or --servers builtin"
            )
        with contextlib.ExitStack() as stack:
            self = cls(cfg, stack)
            self._open(upcoming)
            self._stack = stack.pop_all()  # success: closing is now `close`'s job
        return self

    def _open(self, upcoming: Iterable[Askable] | None) -> None:
        cfg, stack = self.cfg, self._stack
        self.pool = self._pool(list(cfg.urls), fleet=True)
        stack.callback(self.pool.close)
        try:
            self.pool.health_check()
            self.model = self.pool.resolve_model(cfg.model)
        except (ServerUnavailable, ModelMismatch) as exc:
            raise StartError(str(exc)) from None
        judge = self.judge = self._open_judge()
        try:
            self.store = ResultStore(cfg.store_path)
        except StoreError as exc:
            raise StartError(str(exc)) from None
        stack.callback(self.store.close)
        try:
            codecs = build_codecs(cfg.arms)
        except Exception as exc:  # a bad checkpoint: one line naming the file
            raise StartError(str(exc)) from None
        self.images = ImagePipeline(
            codecs, store=self.store, cache_images=cfg.cache_images, cache_mb=cfg.cache_mb, disk_cache=self._disk_cache(),
            lpips=self._lpips(), say=cfg.say_midrun,  # (the plugin's line to the terminal mid-run)
            measure_distortion=cfg.distortion != "off",
        )
        stack.callback(self.images.close)
        proto = cfg.protocol(self.model, judge.model if judge else None)
        card = self.pool.model_card(self.model)
        # the same model id can be other weights: what the server says of it is kept with the run
        proto["served_model"] = {"root": card.root, "max_model_len": card.max_model_len} if card else None
        # whether distortion was measured (not part of any answer's fingerprint: merge.MAY_DIFFER)
        proto["distortion"] = {"measured": self.images.measure_distortion,
                               "lpips_weights_sha256": getattr(self.images.lpips, "weights_sha256", None)}
        proto["codec_identity"] = {
            a: self.images.codec_identity(a) for a in self.images.arms if self.images.codec_identity(a)
        }
        if not cfg.allow_protocol_change:
            problem = protocol_conflict(self.store, cfg.tag, cfg.run_id, proto)
            if problem is None:
                problem, notice = served_model_change(self.store, cfg.tag, cfg.run_id, proto)
                if notice:
                    self.notices.append(notice)
            if problem:
                raise StartError(problem)
        self.store.start_run(cfg.run_id, cfg.tag, proto)
        # Whatever the client sent is kept with the run (reports show attempts, failures and
        # retries per server); written before the store closes, on every path.
        stack.callback(self._record_traffic)
        settings = AskSettings(model=self.model, max_tokens=cfg.max_new, temperature=cfg.temperature,
                               prompt_style=cfg.prompt_style, top_p=cfg.top_p, seed=cfg.request_seed,
                               system_prompt=cfg.system_prompt, extra_body=cfg.extra_body)
        bases: dict[str, ScoreOptions] = {}

        def score_options(q: Question, size: tuple[int, int] | None) -> ScoreOptions:
            # from the protocol this run records, as every report of it rebuilds them
            base = bases.get(q.benchmark)
            if base is None:
                base = bases[q.benchmark] = verdict.score_options(proto, cfg.score_views.get(q.benchmark, frozenset()))
            return verdict.question_options(base, q, size)

        self.runner = QuestionRunner(
            run_id=cfg.run_id, pool=self.pool, images=self.images, store=self.store, settings=settings,
            score_options=score_options, blind=cfg.blind, fresh=cfg.fresh,
            judge=judge, samples=cfg.samples,
        )
        if cfg.samples > 1 and not cfg.temperature:
            self.notices.append(
                f"--samples {cfg.samples} at temperature 0: greedy decoding gives every sample the same answer "
                "(only a server that honours the request seed differs); pass --temperature, e.g. 0.7")
        stack.callback(self.runner.close)
        if upcoming is not None:
            self.lookahead = LookAhead(
                upcoming, submit=lambda item: self.runner.submit(self.job(item)),
                # Twice what the caps allow in flight, not what the limits allow now: items are
                # consumed in order, so answers that came back early wait for the slowest one
                # ahead of them and hold their places; a window sized by the limits would
                # starve the servers, and limits that see no demand would never rise. Read before
                # each submission: servers still in their start-up check, or joining from a
                # --servers @FILE, count once they serve (read once at the start, the window was
                # sized for the servers that had passed their check by then, and a server that
                # joined later could be left with nothing to do).
                key=lambda item: item.nodeid,
                window=lambda: min(max(2 * self.pool.max_possible_in_flight(), 8), MAX_WINDOW),
            )
            stack.callback(self.lookahead.stop)
            self.lookahead.start()

    def _pool(self, urls: list[str], fleet: bool = False) -> ServerPool:
        cfg = self.cfg
        return ServerPool(
            urls, timeout=cfg.request_timeout, retries=cfg.retries, concurrency=cfg.concurrency,
            api_key=cfg.api_key, max_reply_bytes=cfg.max_reply_bytes, max_text_chars=cfg.max_answer_chars,
            model_aliases=frozenset(cfg.model_aliases), on_state_change=cfg.on_server_state,
            # the builtin server's port changes every run: one name keeps its usage in one row
            names=list(cfg.servers_shown) if urls == list(cfg.urls) and len(cfg.servers_shown) == len(urls) else None,
            **(self._fleet() if fleet else {}),
        )

    def _fleet(self) -> dict[str, Any]:
        """The server file the fleet's pool follows (--servers @FILE; never the judge's pool)."""
        cfg = self.cfg
        if cfg.servers_file is None:
            return {}
        from pytest_satbench.engine.fleetfile import FileFleet

        return {"fleet": FileFleet(cfg.servers_file, say=cfg.say_midrun), "on_notice": cfg.say_midrun}

    def _open_judge(self) -> Judge | None:
        cfg = self.cfg
        if cfg.judge_url is None:
            return None
        pool = self._pool([cfg.judge_url])
        self._stack.callback(pool.close)
        try:
            pool.health_check()
            model = pool.resolve_model(cfg.judge_model)
        except (ServerUnavailable, ModelMismatch) as exc:
            raise StartError(f"--judge: {exc}") from None
        return Judge(pool, model)

    def _lpips(self) -> object | None:
        """LPIPS with --lpips-weights (None without): a file that is not LPIPS-Alex weights stops the
        start with one line naming it."""
        if self.cfg.lpips_weights is None:
            return None
        if self.cfg.distortion == "off":
            self.notices.append(f"--lpips-weights {self.cfg.lpips_weights}: not read, --distortion off measures no "
                                "distortion (LPIPS included)")
            return None
        from pytest_satbench.engine.lpips import LPIPS, LpipsWeightsError

        try:
            return LPIPS(self.cfg.lpips_weights)
        except LpipsWeightsError as exc:
            raise StartError(str(exc)) from None

    def _disk_cache(self) -> DiskCache | None:
        if self.cfg.recon_cache_dir is None:
            return None
        from pytest_satbench.engine.diskcache import DiskCache

        return DiskCache(self.cfg.recon_cache_dir, max_bytes=self.cfg.recon_cache_bytes)

    def _record_traffic(self) -> None:
        pools = [self.pool] + ([self.judge.pool] if self.judge is not None else [])
        traffic = [
            ServerTraffic(u.server, u.requests, u.answered, u.failures, u.retries, u.usage_dropped, u.resent)
            for pool in pools for u in pool.usage().values()
        ]
        usage = self.pool.usage().values()  # the judge's pool is not the fleet being measured
        limits = [
            LimitTrace(u.server, self.cfg.process, u.steered_by, u.limit or 0, u.max_in_flight,
                       tuple((p.t, p.limit) for p in u.limit_history))
            for u in usage
        ]
        try:
            self.store.put_traffic(self.cfg.run_id, self.cfg.process, traffic)
            self.store.put_limits(self.cfg.run_id, limits)
        except StoreError:
            pass  # the store failed during the run: that is reported already, traffic is bookkeeping

    def doomed(self, window_s: float) -> str | None:
        """Why the run should stop asking: no server has answered for `window_s` seconds while
        requests keep failing (every server down, or answering only errors). None otherwise."""
        now = time.monotonic()
        last = self.pool.last_answer_at()
        if now - (last if last is not None else self._started) < window_s:
            return None
        states = self.pool.server_states()
        if not any(s.failures_in_a_row for s in states.values()):
            return None  # quiet, not failing: slow answers are not a doomed run
        since = "since the run started" if last is None else f"for {now - last:.0f} s"
        servers = "; ".join(f"{name}: {s.last_error or 'no answer'}" for name, s in states.items())
        return (f"no server has answered {since} while requests kept failing ({servers}); stopped asking: "
                "rerun the same command to resume once a server answers")

    def job(self, item: Askable) -> Job:
        q = item.question
        repeats = self.cfg.repeat_orig if (q.benchmark, q.key) in self.cfg.repeat_keys else 0
        return Job(item.nodeid, q, prompts.render(q, self.cfg.prompt_style), repeats)

    def result(self, item: Askable, give_up_after: float | None = None) -> ItemResult:
        """The item's answers in every arm: ready if the look-ahead got there first. With
        `give_up_after`, raises GaveUp while waiting once `doomed(give_up_after)` says so."""

        def poll() -> None:
            if give_up_after is not None:
                reason = self.doomed(give_up_after)
                if reason is not None:
                    raise GaveUp(reason)

        if self.lookahead is None:
            return self.runner.submit(self.job(item)).result()
        return self.lookahead.result(item, poll=poll)

    def ask(self, nodeid: str, question: Question) -> Future[ItemResult]:
        """Ask one question in every arm, through the store (the public fixture's route)."""
        return self.runner.submit(Job(nodeid, question, prompts.render(question, self.cfg.prompt_style)))

    def close(self) -> None:
        self._stack.close()
