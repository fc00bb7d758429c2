"""The regressed-questions gallery: original and reconstruction side by side, as thumbnails.

Reconstructions are not kept by a run (only their sha256 is), so they are made again:
cheap codecs are simply rerun through the same `ImagePipeline` the plugin uses; expensive
ones (those whose codec caches its reconstructions on disk, `codecs.disk_cacheable`: One-D-Piece,
torch) are looked up in the plugin's disk cache of reconstructions by the sha256 of the bytes
that were sent (`engine.diskcache.PayloadLookup`). What cannot be found is said so instead of
being faked.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from pytest_satbench.codecs import build_codecs, disk_cacheable, normalise_spec
from pytest_satbench.core.arms import ORIG
from pytest_satbench.core.results import QuestionResult
from pytest_satbench.engine.diskcache import PayloadLookup
from pytest_satbench.engine.images import ImagePipeline

MAX_GALLERY = 24
THUMB = 320  # longest side, pixels


@dataclass(slots=True)
class Panel:
    arm: str
    answer: str  # the answer as interpreted
    correct: bool
    thumb_b64: str | None  # JPEG, base64; None when the image could not be produced
    note: str = ""  # e.g. "regenerated; bytes differ from what was sent"


@dataclass(slots=True)
class Entry:
    key: str
    nodeid: str
    text: str
    answer: str
    types: tuple[str, ...]
    panels: list[Panel] = field(default_factory=list)


class RegressedPicker:
    """The first `limit` regressed questions in question-key order, and how many there are,
    picked as the questions go by: at most 2 x `limit` full results are held, not the run."""

    def __init__(self, limit: int = MAX_GALLERY) -> None:
        self.limit = max(0, limit)
        self.total = 0
        self._held: list[tuple[tuple[int, int | str], int, QuestionResult]] = []

    def add(self, it: QuestionResult) -> None:
        if not it.regressed_arms:
            return
        self.total += 1
        if not self.limit:
            return
        self._held.append((_natural(it.question.key), self.total, it))  # the count breaks ties: run order
        if len(self._held) >= 2 * self.limit:
            self._held.sort(key=lambda held: held[:2])
            del self._held[self.limit:]

    def chosen(self) -> list[QuestionResult]:
        return [it for *_, it in sorted(self._held, key=lambda held: held[:2])[: self.limit]]


def _natural(s: str) -> tuple[int, int | str]:
    return (0, int(s)) if s.isdigit() else (1, s)


def thumbnail(jpeg_or_image: bytes | Image.Image) -> str:
    im = Image.open(io.BytesIO(jpeg_or_image)) if isinstance(jpeg_or_image, bytes) else jpeg_or_image
    im = im.convert("RGB")
    im.thumbnail((THUMB, THUMB), Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=82)
    return base64.b64encode(buf.getvalue()).decode("ascii")


class _Recon:
    """Reconstructions by (image path, arm), made or found once per report."""

    def __init__(self, recon_cache: Path | None) -> None:
        self._pipes: dict[str, ImagePipeline | None] = {}
        self._disk = PayloadLookup(recon_cache)

    def pipeline(self, arm: str) -> ImagePipeline | None:
        """A pipeline that makes the arm again; None for a codec whose reconstructions are
        looked up in the disk cache instead (an expensive one)."""
        if arm not in self._pipes:
            pipe = None
            if not disk_cacheable(arm):
                pipe = ImagePipeline(build_codecs([normalise_spec(arm)]), workers=1)
            self._pipes[arm] = pipe
        return self._pipes[arm]

    def from_disk(self, sha256: str) -> bytes | None:
        return self._disk.get(sha256)

    def close(self) -> None:
        for pipe in self._pipes.values():
            if pipe is not None:
                pipe.close()


def build_gallery(chosen: list[QuestionResult], recon_cache: Path | None) -> list[Entry]:
    """The gallery of the questions a `RegressedPicker` chose."""
    recon = _Recon(recon_cache)
    entries: list[Entry] = []
    try:
        for it in chosen:
            q = it.question
            e = Entry(q.key, it.nodeid, q.text, q.answer, it.types)
            for arm in [ORIG, *it.regressed_arms]:
                e.panels.append(_panel(it, arm, recon))
            entries.append(e)
    finally:
        recon.close()
    return entries


def _panel(it: QuestionResult, arm: str, recon: _Recon) -> Panel:
    sc = it.scores.get(arm)
    row = it.rows.get(arm)
    if sc is not None:
        answer = sc.extracted
    else:
        answer = f"(no answer: {row.error})" if row is not None and row.error else "(no answer)"
    panel = Panel(arm, answer, bool(sc and sc.correct), None)
    sent = row.image_sha256 if row is not None else None
    ref = it.question.image
    try:
        if arm == ORIG:
            if ref.path is None:
                panel.note = "image embedded in the dataset; not kept by the run"
            else:
                with Image.open(ref.path) as im:
                    panel.thumb_b64 = thumbnail(im)
            return panel
        pipe = recon.pipeline(arm)
        if pipe is None:  # expensive codec: only what the reconstruction cache still holds
            data = recon.from_disk(sent) if sent else None
            if data is None:
                panel.note = "reconstruction not kept (not in the reconstruction cache)"
            else:
                panel.thumb_b64 = thumbnail(data)
            return panel
        if ref.path is None:
            panel.note = "image embedded in the dataset; not kept by the run"
            return panel
        made = pipe.prepare(ref).arms[arm]
        panel.thumb_b64 = thumbnail(made.jpeg)
        if sent and made.sha256 != sent:
            panel.note = "regenerated; not byte-identical to what was sent (other geometry)"
    except Exception as exc:  # noqa: BLE001  (a missing or unreadable image must not cost the whole report)
        panel.note = f"image unavailable: {type(exc).__name__}: {exc}"[:200]
    return panel
