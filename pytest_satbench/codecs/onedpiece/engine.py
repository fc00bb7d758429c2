"""Running the tokenizer on crops: batched, one encoder pass for any number of token
budgets, one thread owning the model, and at most one forward pass per device at a time.

Why a worker thread: `Codec.reconstruct` is called from several image-preparation threads
at once. Letting each of them run the model would allocate activations concurrently on a
GPU that a vLLM server already mostly fills (the seed ran out of memory that way), and
would give tiny batches. Instead callers enqueue their crops; the worker takes everything
queued (up to `batch` crops per forward), so crops of several images share a batch.
"""

from __future__ import annotations

import fcntl
import os
import queue
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from pytest_satbench.codecs.onedpiece.model import OneDPiece, autocast


class DeviceLock:
    """Exclusive use of one device for one forward pass.

    Within a process a threading lock; on a GPU also an advisory file lock, because
    pytest-xdist workers are separate processes that each hold a model on the same card,
    and their activations must not pile up beside a vLLM server either."""

    def __init__(self, device: torch.device) -> None:
        self._thread_lock = threading.Lock()
        self._path: Path | None = None
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            self._path = Path(tempfile.gettempdir()) / f"satbench-{os.getuid()}-cuda{index}.lock"
        self._fd: int | None = None

    def __enter__(self) -> None:
        self._thread_lock.acquire()
        if self._path is not None:
            try:
                self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            except OSError:  # no lockable temp dir: fall back to in-process exclusion
                self._release_file()

    def __exit__(self, *exc: object) -> None:
        self._release_file()
        self._thread_lock.release()

    def _release_file(self) -> None:
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None

    # The threading.Lock protocol, so callers (and tests) can hold the device explicitly.
    def acquire(self) -> bool:
        self.__enter__()
        return True

    def release(self) -> None:
        self.__exit__(None, None, None)


_device_locks: dict[str, DeviceLock] = {}
_device_locks_guard = threading.Lock()


def device_lock(device: torch.device) -> DeviceLock:
    """One lock per device for every model in the process (two codecs on cuda:0, say two
    checkpoints, never run forward passes at the same time), and across processes on GPUs."""
    key = str(device)
    with _device_locks_guard:
        if key not in _device_locks:
            _device_locks[key] = DeviceLock(device)
        return _device_locks[key]


@dataclass
class EngineStats:
    """Counters for tests and the speed script."""

    crops_encoded: int = 0
    crops_decoded: int = 0  # one per (crop, budget)
    forward_batches: int = 0  # encoder batches
    jobs: int = 0
    encode_seconds: float = 0.0
    decode_seconds: float = 0.0
    largest_batch: int = 0


@dataclass
class _Job:
    crops: np.ndarray
    future: Future[np.ndarray] = field(default_factory=Future)


class Reconstructor:
    """Encode crops once, decode each token budget, return uint8 RGB.

    `run(crops)` works synchronously on the caller's thread; `submit(crops)` hands the
    crops to the worker thread and returns a future, which is what concurrent callers use.
    Results have shape (len(budgets), n, tile, tile, 3).
    """

    def __init__(
        self,
        model: OneDPiece,
        budgets: Sequence[int],
        *,
        device: str | torch.device = "cpu",
        dtype: str = "fp32",
        batch: int = 16,
    ) -> None:
        if dtype not in ("fp32", "bf16"):
            raise ValueError(f"dtype {dtype!r}: use fp32 or bf16")
        n_latent = model.cfg.num_latent_tokens
        bad = [k for k in budgets if not 1 <= k <= n_latent]
        if not budgets or bad:
            raise ValueError(f"token budgets {list(budgets)}: each must be in 1..{n_latent}")
        self.device = torch.device(device)
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.budgets = tuple(int(k) for k in budgets)
        self.dtype = dtype
        self.batch = max(1, int(batch))
        self.tile = model.cfg.image_size
        self.stats = EngineStats()
        self._lock = device_lock(self.device)
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closed = False

    # ----------------------------------------------------------------- synchronous path

    def run(self, crops: np.ndarray) -> np.ndarray:
        """(n, tile, tile, 3) uint8 -> (len(budgets), n, tile, tile, 3) uint8."""
        n, t = len(crops), self.tile
        if crops.ndim != 4 or crops.shape[1:] != (t, t, 3) or crops.dtype != np.uint8:
            raise ValueError(f"crops must be uint8 of shape (n, {t}, {t}, 3), got {crops.shape} {crops.dtype}")
        unique = sorted(set(self.budgets))
        out = np.empty((len(self.budgets), n, t, t, 3), dtype=np.uint8)
        ids = self._encode(crops)
        for k in unique:
            decoded = self._decode(ids, k)
            for i, budget in enumerate(self.budgets):
                if budget == k:
                    out[i] = decoded
        return out

    @torch.inference_mode()
    def _encode(self, crops: np.ndarray) -> torch.Tensor:
        parts: list[torch.Tensor] = []
        for s in range(0, len(crops), self.batch):
            chunk = torch.from_numpy(crops[s : s + self.batch]).to(self.device)
            x = chunk.permute(0, 3, 1, 2).float().div_(255.0)
            t0 = time.perf_counter()
            with self._lock, autocast(self.device, self.dtype):
                ids = self.model.encode(x)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
            self.stats.encode_seconds += time.perf_counter() - t0
            self.stats.forward_batches += 1
            self.stats.crops_encoded += len(chunk)
            self.stats.largest_batch = max(self.stats.largest_batch, len(chunk))
            parts.append(ids)
        return torch.cat(parts)

    @torch.inference_mode()
    def _decode(self, ids: torch.Tensor, k: int) -> np.ndarray:
        parts: list[np.ndarray] = []
        for s in range(0, len(ids), self.batch):
            t0 = time.perf_counter()
            with self._lock, autocast(self.device, self.dtype):
                rgb = self.model.decode(ids[s : s + self.batch, :k])
                # The callers clamp (upstream's model output is not clamped); round, not
                # truncate, to the nearest 8-bit level.
                u8 = rgb.float().clamp_(0.0, 1.0).mul_(255.0).round_().to(torch.uint8)
                arr = u8.permute(0, 2, 3, 1).contiguous().cpu().numpy()
            self.stats.decode_seconds += time.perf_counter() - t0
            self.stats.crops_decoded += len(arr)
            parts.append(arr)
        return np.concatenate(parts)

    # ----------------------------------------------------------------- concurrent path

    def submit(self, crops: np.ndarray) -> Future[np.ndarray]:
        if self._closed:
            raise RuntimeError("Reconstructor is closed")
        self._ensure_worker()
        job = _Job(np.ascontiguousarray(crops))
        self._queue.put(job)
        return job.future

    def _ensure_worker(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="onedpiece-worker", daemon=True)
                self._thread.start()

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            jobs, stop = [job], False
            size = len(job.crops)
            # Take whatever else is already waiting, so concurrent images share batches.
            while size < self.batch:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                jobs.append(more)
                size += len(more.crops)
            jobs = [j for j in jobs if j.future.set_running_or_notify_cancel()]
            if jobs:
                self._run_jobs(jobs)
            if stop:
                return

    def _run_jobs(self, jobs: list[_Job]) -> None:
        self.stats.jobs += len(jobs)
        try:
            out = self.run(np.concatenate([j.crops for j in jobs]))
        except BaseException as exc:  # noqa: BLE001  (every caller must hear about it)
            for j in jobs:
                j.future.set_exception(exc)
            return
        start = 0
        for j in jobs:
            j.future.set_result(out[:, start : start + len(j.crops)])
            start += len(j.crops)

    def close(self) -> None:
        self._closed = True
        with self._start_lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()
        # Drop the weights so a closed codec frees device memory.
        self.model = self.model.to("meta")
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
