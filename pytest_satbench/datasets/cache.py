"""A cache of loaded questions, so a rerun does not parse a benchmark's JSON again.

Every pytest run collects every selected question: a resume, `--lf`, `-k`, each xdist
worker. For RSVQA-HR that is 134 MB of JSON (1.2M records) parsed each time, 2.5 s of
CPU and 150 MB of peak memory. A benchmark that names its source files
(`Benchmark.sources`) gets its loaded questions cached under the pytest cache, keyed by
those files' size and modification time (and the loader options), as plain tuples that
load in a fraction of that. A changed file, another `--limit`, or `--cache-clear` means
a fresh load.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path
from typing import Any  # a packed row: Question's fields in _pack's order

from pytest_satbench.core.question import ImageRef, Question
from pytest_satbench.datasets.registry import Benchmark, LoadRequest

CACHE_VERSION = "2"  # bump when Question's fields or the selection (--limit) change


def load_questions(bench: Benchmark, req: LoadRequest, cache_dir: Path | None) -> list[Question]:
    if bench.sources is None or cache_dir is None:
        return list(bench.load(req))
    stamp = [(str(p), *_stat(p)) for p in bench.sources(req.data_root)]
    key = hashlib.sha256(
        repr((CACHE_VERSION, bench.name, str(req.data_root), req.limit, req.seed, stamp)).encode()
    ).hexdigest()[:24]
    path = cache_dir / f"{bench.name}-{key}.pickle"
    try:
        with open(path, "rb") as fh:
            return _unpack(bench.name, pickle.load(fh))
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError):
        pass  # no cache yet, or a partial/foreign file: load and rewrite it
    questions = list(bench.load(req))
    _write(path, _pack(questions))
    for old in cache_dir.glob(f"{bench.name}-*.pickle"):
        if old != path:
            old.unlink(missing_ok=True)
    return questions


def _stat(path: Path) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return -1, -1  # absent: part of the key too (an image folder may appear later)
    return st.st_size, st.st_mtime_ns


def _pack(questions: list[Question]) -> tuple[list[tuple[str, str | None, bytes | None]], list[tuple[Any, ...]]]:
    index: dict[int, int] = {}
    images: list[tuple[str, str | None, bytes | None]] = []
    rows: list[tuple[Any, ...]] = []
    for q in questions:
        i = index.get(id(q.image))
        if i is None:
            i = index[id(q.image)] = len(images)
            images.append((q.image.id, q.image.path, q.image.data))
        rows.append((q.key, i, q.text, q.answer, q.types, q.kind, q.choices, q.extra))
    return images, rows


def _unpack(benchmark: str, packed: tuple[list[tuple[str, str | None, bytes | None]], list[tuple[Any, ...]]]) -> list[Question]:
    images_raw, rows = packed
    images = [ImageRef(id=i, path=p, data=d) for i, p, d in images_raw]
    return [
        Question(benchmark=benchmark, key=key, image=images[img], text=text, answer=answer, types=types,
                 kind=kind, choices=choices, extra=extra)
        for key, img, text, answer, types, kind, choices, extra in rows
    ]


def _write(path: Path, packed: object) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            pickle.dump(packed, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)  # readers see the old file or the whole new one
    except OSError:
        tmp.unlink(missing_ok=True)  # a read-only cache only costs speed
