"""The question model: what a loader yields, one per benchmark question.

A `Question` never holds decoded pixels: a full benchmark is far too large to keep 222k
images in memory, and one image serves ~100 questions anyway. It holds an `ImageRef`
(a file path, or the encoded bytes for benchmarks that ship images inside a parquet file),
and the image is decoded once per image by the per-image cache (`images.py`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

# How a question is answered and scored:
#   vqa  free-form short answer, normalised exact match
#   mc   multiple choice, answer is an option letter
#   ref  referring expression / visual grounding, answer is a box
Kind = Literal["vqa", "mc", "ref"]


@dataclass(frozen=True, slots=True)
class ImageRef:
    """Where an image's encoded bytes come from: a file, or bytes carried in the dataset."""

    id: str  # stable within its benchmark; the clustering unit for statistics
    path: str | None = None
    data: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if (self.path is None) == (self.data is None):
            raise ValueError("ImageRef needs exactly one of path= or data=")

    def read_bytes(self) -> bytes:
        if self.data is not None:
            return self.data
        assert self.path is not None
        return Path(self.path).read_bytes()

    def describe(self) -> str:
        return self.path if self.path is not None else f"<embedded image {self.id}>"

    @property
    def cache_key(self) -> str:
        # Embedded images have no path; their id is unique within the benchmark, so
        # prefixing with a digest of the bytes keeps keys unique across benchmarks.
        if self.path is not None:
            return self.path
        return "bytes:" + hashlib.sha1(self.data or b"").hexdigest()


@dataclass(frozen=True, slots=True)
class Question:
    """One benchmark question, without pixels.

    `key` is the question's stable id within its benchmark; it is the parameter part of the
    pytest node id (`test_rsvqa_lr[<key>]`), so it must never change between releases of
    this plugin for the same dataset file.
    """

    benchmark: str
    key: str
    image: ImageRef
    text: str  # the question as the dataset states it; prompts.py renders the prompt
    answer: str  # ground truth, as stored (normalisation happens in scoring)
    types: tuple[str, ...]  # question type(s); LHRS-Bench questions can have several
    kind: Kind = "vqa"
    choices: tuple[str, ...] | None = None  # option texts in letter order (A, B, ...)
    extra: tuple[tuple[str, str], ...] = ()  # benchmark-specific metadata, e.g. uniqueness

    @property
    def type(self) -> str:
        """The primary type: the first one, used where one label is needed."""
        return self.types[0] if self.types else "all"

    def get(self, name: str, default: str | None = None) -> str | None:
        for k, v in self.extra:
            if k == name:
                return v
        return default


def chance(q: Question) -> float | None:
    """Probability that a uniformly random answer is right, where that is meaningful."""
    if q.kind == "mc" and q.choices:
        return 1.0 / len(q.choices)
    if q.kind == "vqa" and q.answer.strip().lower() in ("yes", "no"):
        return 0.5
    if q.kind == "vqa" and q.answer.strip().lower() in ("rural", "urban"):
        return 0.5
    return None
