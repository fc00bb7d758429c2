"""What exists only while items run on this process: the server pool, the image pipeline
with its codecs, the results store, the question runner and the look-ahead feeding it.

Started by the session when there are question items to run (or a public fixture asks),
closed at the end of the run loop. On an xdist controller nothing is started: the
workers run the items.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from pytest_satbench.codecs.base import build_codecs
from pytest_satbench.core import prompts
from pytest_satbench.core.question import Question
from pytest_satbench.core.scoring import ScoreOptions
from pytest_satbench.engine.answering import ItemResult, Job, QuestionRunner
from pytest_satbench.engine.client import ModelMismatch, ServerPool, ServerUnavailable
from pytest_satbench.engine.fingerprint import AskSettings
from pytest_satbench.engine.images import ImagePipeline
from pytest_satbench.engine.lookahead import LookAhead, worker_upcoming
from pytest_satbench.engine.provenance import protocol_conflict, run_protocol
from pytest_satbench.engine.store import ResultStore
from pytest_satbench.plugin.items import QuestionItem

if TYPE_CHECKING:
    from pytest_satbench.plugin.session import SatbenchSession


class Runtime:
    """What exists only while items run on this process: servers, codecs, store."""

    def __init__(self) -> None:
        self.lookahead: LookAhead[QuestionItem, ItemResult]
        self.runner: QuestionRunner
        self.pool: Any
        self.images: ImagePipeline
        self.store: ResultStore

    @classmethod
    def start(cls, owner: SatbenchSession, session: pytest.Session, items: list[QuestionItem]) -> Runtime:

        s = owner.settings
        self = cls()
        self.stopped = threading.Event()
        urls = list(s.servers)
        if s.builtin_server:
            url = getattr(owner.config, "workerinput", {}).get("satbench_builtin_url")
            if url is None:
                from pytest_satbench.server import start_server

                owner._builtin = start_server()
                url = owner._builtin.url
            urls = [url]
        if not urls:
            raise pytest.UsageError(
                "satbench: benchmark items need servers: pass --servers http://HOST:PORT[,...] or --servers builtin"
            )
        # --concurrency is for the whole run: xdist workers share it
        workers = int(getattr(owner.config, "workerinput", {}).get("workercount", 1) or 1)
        concurrency = max(1, s.concurrency // workers)
        self.pool = ServerPool(
            urls, timeout=s.request_timeout, retries=s.retries, concurrency=concurrency, api_key=s.api_key
        )
        try:
            self.pool.health_check()
            model = self.pool.resolve_model(s.model)
        except (ServerUnavailable, ModelMismatch) as exc:
            self.pool.close()
            raise pytest.UsageError(f"satbench: {exc}") from None
        owner.summary.model = model
        self.store = ResultStore(owner._cache_dir("satbench") / "results.sqlite")
        disk_cache = None
        try:
            from pytest_satbench.engine.diskcache import DiskCache

            disk_cache = DiskCache(owner._cache_dir("satbench-recon"), max_bytes=int(os.environ.get("SATBENCH_RECON_CACHE_BYTES", 20 * 2**30)))
        except ImportError:
            pass
        try:
            codecs = build_codecs(s.arms)
        except Exception as exc:  # a bad checkpoint: one line naming the file
            self.pool.close()
            raise pytest.UsageError(f"satbench: {exc}") from None
        self.images = ImagePipeline(codecs, store=self.store, cache_images=s.cache_images, disk_cache=disk_cache)
        proto = run_protocol(owner, model, urls)
        proto["codec_identity"] = {a: self.images.codec_identity(a) for a in self.images.arms if self.images.codec_identity(a)}
        if not s.allow_protocol_change:
            problem = protocol_conflict(self.store, s.tag, owner.run_id, proto)
            if problem:
                self.pool.close()
                self.images.close()
                raise pytest.UsageError(f"satbench: {problem}")
        self.store.start_run(owner.run_id, s.tag, proto)
        settings = AskSettings(model=model, max_tokens=s.max_new, temperature=0.0, prompt_style=s.prompt_style)
        box_grid = s.box_grid or prompts.default_box_grid(s.prompt_style)

        def score_options(q: Question, size: tuple[int, int] | None) -> ScoreOptions:
            return ScoreOptions(box_grid=box_grid, iou=s.iou, image_size=size)

        self.runner = QuestionRunner(
            pool=self.pool, images=self.images, store=self.store, settings=settings,
            score_options=score_options, blind=s.blind, fresh=s.fresh, concurrency=concurrency,
        )
        style = s.prompt_style

        def job(item: QuestionItem) -> Job:
            q = item.question
            repeats = s.repeat_orig if (q.benchmark, q.key) in owner.repeat_keys else 0
            return Job(item.nodeid, q, prompts.render(q, style), repeats)

        upcoming: Any
        interactor = _xdist_interactor(owner.config)
        if interactor is not None:
            all_items = session.items
            wanted = {id(i) for i in items}

            def snapshot() -> list[Any] | None:
                try:
                    with interactor.torun.lock() as queue:
                        return list(queue)
                except Exception:
                    return None

            upcoming = (
                i for i in worker_upcoming(snapshot, all_items, self.stopped.is_set) if id(i) in wanted
            )
        else:
            upcoming = iter(items)
        self.lookahead = LookAhead(
            upcoming,
            submit=lambda item: self.runner.submit(job(item)),
            key=lambda item: item.nodeid,
            window=max(2 * concurrency, 8),
        )
        self.lookahead.start()
        self.started = time.monotonic()
        return self

    def close(self) -> None:
        self.stopped.set()
        self.lookahead.stop()
        self.runner.close()
        self.pool.close()
        self.images.close()
        self.store.close()


def _xdist_interactor(config: pytest.Config) -> Any:
    if not hasattr(config, "workerinput"):
        return None
    for plugin in config.pluginmanager.get_plugins():
        if type(plugin).__name__ == "WorkerInteractor" and hasattr(plugin, "torun"):
            return plugin
    return None
