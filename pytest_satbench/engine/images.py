"""Per-image preparation: decode once, reconstruct once per arm, encode what is sent.

Every question about an image needs the same bytes, so preparation is cached per image and
*single-flight*: concurrent questions about one image wait for one reconstruction instead
of each starting its own (the seed reconstructed an image 4-14 times on RSVQA-LR-sized data
and 32-42 times on RSVQA-HR-sized data that way).

All arms of an image are sent at the same geometry: the reconstruction's size (the first
codec's output size), with the original resized to it, each as JPEG quality 95, so the only
difference between the arms is the codec.

Each reconstruction's distortion against the original, both as sent (engine/distortion.py), is
measured here once per pair of images sent and kept in the store (`ResultStore.distortion`), so
a resumed run and every report reuse it. A question whose answers are all stored prepares its
image only when a pair it was sent as has no distortion stored (`lacks_distortion`), so a run
with `--distortion on` after one with `--distortion off` measures what is missing and asks
nothing. `--distortion off` (`measure_distortion=False`) measures nothing.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from PIL import Image, UnidentifiedImageError

from pytest_satbench.codecs.base import Codec
from pytest_satbench.core.arms import ORIG
from pytest_satbench.core.question import ImageRef
from pytest_satbench.core.records import Distortion
from pytest_satbench.engine.config import config_default
from pytest_satbench.engine.fingerprint import PIPELINE_VERSION
from pytest_satbench.engine.store import ImageInfo, ResultStore, StoreError

if TYPE_CHECKING:
    from pytest_satbench.engine.diskcache import DiskCache

SEND_QUALITY = 95


class ImageError(Exception):
    """An image cannot be read, decoded or reconstructed. One line, naming the file."""


@dataclass(frozen=True, slots=True)
class ArmImage:
    jpeg: bytes
    sha256: str  # of the bytes sent
    size: tuple[int, int]
    tokens: int | None = None  # image tokens the codec used (One-D-Piece: nlatent x crops)
    b64: bytes = field(default=b"", repr=False)  # base64 of jpeg, encoded once for all its questions
    # how far this reconstruction, as sent, is from the original as sent (None for the orig arm)
    distortion: Distortion | None = None

    def __post_init__(self) -> None:
        if not self.b64:
            object.__setattr__(self, "b64", base64.b64encode(self.jpeg))


@dataclass(frozen=True, slots=True)
class PreparedImage:
    arms: dict[str, ArmImage]


def encode_jpeg(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="JPEG", quality=SEND_QUALITY)
    return buf.getvalue()


class ImagePipeline:
    """Prepares the bytes of every arm for an image, with a bounded single-flight cache."""

    def __init__(
        self,
        codecs: list[Codec],
        *,
        store: ResultStore | None = None,
        cache_images: int = config_default("cache_images"),
        cache_mb: int = config_default("cache_mb"),
        workers: int = 2,
        disk_cache: DiskCache | None = None,
        lpips: object | None = None,
        say: Callable[[str], None] | None = None,
        measure_distortion: bool = True,
    ) -> None:
        """`measure_distortion`: False (--distortion off): no distortion is measured or looked up;
        `lpips`: an `engine.lpips.LPIPS` (--lpips-weights), None: LPIPS is not computed;
        `say`: where a distortion that could not be measured is said, one line (None: kept in
        `distortion_notes` only)."""
        self.codecs = codecs
        self.arms: list[str] = [ORIG] + [a.canonical for c in codecs for a in c.arms]
        self._codec_of = {a.canonical: c for c in codecs for a in c.arms}
        self.store = store
        # Bounded by a count and by bytes: at RSVQA-HR's 512x512 an image's two arms weigh
        # about 0.5-1.5 MB as JPEG plus base64, so 256 images could hold 400 MB. What must
        # stay is what the look-ahead window still asks about (items of one image are
        # consecutive: window / questions per image images, a few dozen; engine/lookahead.py):
        # an image evicted while its questions are still ahead is prepared again.
        self.capacity = max(1, cache_images)
        self.max_bytes = max(0, int(cache_mb * 2**20))
        self.cached_bytes = 0  # of the prepared images the cache holds
        self.disk_cache = disk_cache
        self._cache: OrderedDict[str, Future[PreparedImage]] = OrderedDict()
        self._sizes: dict[str, int] = {}  # bytes of each prepared image in the cache
        self._lock = threading.Lock()
        self._info: dict[str, ImageInfo] = {}
        self._info_lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="satbench-recon")
        self.reconstructions = 0  # codec runs (not disk-cache hits), for tests and stats
        self.decodes = 0
        self.full_check = os.environ.get("SATBENCH_IMAGE_CHECK", "").lower() == "full"
        self.lpips = lpips
        self.say = say
        self.distortions_computed = 0  # (orig, arm) pairs measured here, not found in the store
        self.distortion_notes: list[str] = []  # the first lines said about unmeasured distortion
        self.measure_distortion = measure_distortion
        # pairs known to have their distortion stored, or tried here: looked up once per run
        self._distortion_seen: set[tuple[str, str]] = set()

    # ------------------------------------------------------------------ identity
    def codec_identity(self, arm: str) -> str:
        codec = self._codec_of.get(arm)
        return codec.identity() if codec else ""

    def info(self, ref: ImageRef) -> ImageInfo:
        """sha256 and size of the source image, from a cache keyed by (path, size, mtime,
        content sample).

        Resuming a 222k-question run must not re-read 2,226 large images just to find out
        that nothing changed, so the hash is remembered in the store next to the results;
        the content sample (`content_sample`) catches a file rewritten in place whose size
        and mtime are the old ones. SATBENCH_IMAGE_CHECK=full hashes every image whole.
        """
        key = ref.cache_key
        with self._info_lock:
            hit = self._info.get(key)
        if hit is not None:
            return hit
        if ref.path is not None:
            try:
                st = os.stat(ref.path)
                sample = content_sample(ref.path, st.st_size)
            except OSError as exc:
                raise ImageError(f"cannot read image {ref.path}: {exc.strerror or exc}") from None
            info = None
            if self.store and not self.full_check:
                info = self.store.image_info(ref.path, st.st_size, st.st_mtime_ns, sample)
            if info is None:
                data = ref.read_bytes()
                info = _measure(ref, data)
                if self.store and len(data) == st.st_size:  # (else it changed while read: measure again next time)
                    self.store.put_image_info(ref.path, st.st_size, st.st_mtime_ns, sample_of(data), info)
        else:
            info = _measure(ref, ref.read_bytes())
        with self._info_lock:
            self._info[key] = info
        return info

    def target_size(self, info: ImageInfo) -> tuple[int, int]:
        """The geometry every arm of this image is sent at."""
        size = (info.width, info.height)
        return self.codecs[0].output_size(size) if self.codecs else size

    # ------------------------------------------------------------------ preparation
    def get(self, ref: ImageRef) -> Future[PreparedImage]:
        key = ref.cache_key
        with self._lock:
            fut = self._cache.get(key)
            if fut is not None:
                self._cache.move_to_end(key)
                return fut
            fut = Future()
            self._cache[key] = fut
            self._evict()
        self._executor.submit(self._fill, fut, ref)
        return fut

    def _evict(self) -> None:
        # Never evict an image still being prepared: a second caller would start a second
        # reconstruction of it, which is exactly what single-flight exists to prevent. The
        # newest image is kept whatever it weighs.
        excess = len(self._cache) - self.capacity
        if excess <= 0 and self.cached_bytes <= self.max_bytes:
            return
        for key in list(self._cache)[:-1]:
            if excess <= 0 and self.cached_bytes <= self.max_bytes:
                break
            if self._cache[key].done():
                del self._cache[key]
                self.cached_bytes -= self._sizes.pop(key, 0)
                excess -= 1

    def _account(self, key: str, prepared: PreparedImage) -> None:
        """Count a prepared image's bytes (JPEG and base64 of every arm) while it is cached."""
        size = sum(len(a.jpeg) + len(a.b64) for a in prepared.arms.values())
        with self._lock:
            if key in self._cache and key not in self._sizes:
                self._sizes[key] = size
                self.cached_bytes += size
                self._evict()

    def _fill(self, fut: Future[PreparedImage], ref: ImageRef) -> None:
        if not fut.set_running_or_notify_cancel():
            return
        try:
            prepared = self.prepare(ref)
            self._account(ref.cache_key, prepared)
            fut.set_result(prepared)
        except ImageError as exc:
            fut.set_exception(exc)
        except Exception as exc:  # a codec failure fails this image's items, not the run
            fut.set_exception(ImageError(f"preparing image {ref.describe()} failed: {type(exc).__name__}: {exc}"))

    def prepare(self, ref: ImageRef) -> PreparedImage:
        info = self.info(ref)
        target = self.target_size(info)
        arms: dict[str, ArmImage] = {}
        image: Image.Image | None = None
        for codec in self.codecs:
            cached = self._from_disk(codec, info, target)
            if cached is not None:
                arms.update(cached)
                continue
            if image is None:
                image = _decode(ref)
                self.decodes += 1
            try:
                outs = codec.reconstruct(image)
            except Exception as exc:
                names = ", ".join(a.canonical for a in codec.arms)
                raise ImageError(
                    f"reconstructing {ref.describe()} with {names} failed: {type(exc).__name__}: {exc}"
                ) from None
            self.reconstructions += 1
            tokens = _tokens(codec, info)
            for spec, out in zip(codec.arms, outs, strict=True):
                if out.size != target:
                    out = out.resize(target, Image.Resampling.BICUBIC)
                data = encode_jpeg(out)
                arm_image = ArmImage(data, hashlib.sha256(data).hexdigest(), target, tokens.get(spec.canonical))
                arms[spec.canonical] = arm_image
                self._to_disk(codec, spec.canonical, info, target, data)
        if image is None:
            image = _decode(ref)
            self.decodes += 1
        orig = image if image.size == target else image.resize(target, Image.Resampling.BICUBIC)
        data = encode_jpeg(orig)
        arms[ORIG] = ArmImage(data, hashlib.sha256(data).hexdigest(), target)
        self._measure_distortion(ref, arms)
        return PreparedImage({name: arms[name] for name in self.arms})

    # ------------------------------------------------------------------ distortion
    def _measure_distortion(self, ref: ImageRef, arms: dict[str, ArmImage]) -> None:
        """Fill each reconstruction arm's `distortion`: the store's, else measured here and kept.
        A pair that cannot be measured keeps None and is said once (its answers still count)."""
        if not self.measure_distortion:
            return
        orig = arms[ORIG]
        weights = getattr(self.lpips, "weights_sha256", None)
        with self._info_lock:
            self._distortion_seen.update((orig.sha256, a.sha256) for n, a in arms.items() if n != ORIG)
        orig_rgb = None
        for name, arm in arms.items():
            if name == ORIG:
                continue
            found = None
            if self.store is not None and self.store.failure is None:
                try:
                    found = self.store.distortion(orig.sha256, arm.sha256, lpips_weights=weights)
                except (StoreError, sqlite3.Error):  # a failing store fails the answers' writes, not
                    found = None  # the image: its distortion is measured here instead
            if found is not None and (self.lpips is None or found.lpips is not None):
                arms[name] = replace(arm, distortion=found)
                continue
            try:
                from pytest_satbench.engine import distortion as dist

                if orig_rgb is None:
                    orig_rgb = dist.decode_rgb(orig.jpeg)
                arm_rgb = dist.decode_rgb(arm.jpeg)
                if found is None:
                    s, ms = dist.ssim_and_msssim(orig_rgb, arm_rgb)
                    found = Distortion(dist.psnr(orig_rgb, arm_rgb), s, ms)
                if self.lpips is not None:
                    found = replace(found, lpips=self.lpips(orig_rgb, arm_rgb))  # type: ignore[operator]  # an engine.lpips.LPIPS, callable
            except Exception as exc:  # noqa: BLE001 - a measurement never fails the image's questions
                self._distortion_note(
                    f"distortion of arm {name} of image {ref.describe()} not measured "
                    f"({type(exc).__name__}: {exc}); its answers count, its distortion is left out")
                continue
            self.distortions_computed += 1
            if self.store is not None and self.store.failure is None:
                try:
                    self.store.put_distortion(orig.sha256, arm.sha256, found, weights)
                except StoreError:  # the store failed since: its answers' writes say so, one line
                    pass
            arms[name] = replace(arm, distortion=found)

    def lacks_distortion(self, pairs: list[tuple[str, str]]) -> bool:
        """Whether one of these (orig sha256, arm sha256) pairs of stored answers has no distortion
        stored (nor LPIPS, with --lpips-weights) and was not tried in this run: its image is then
        prepared to measure it. Each pair is looked up in the store once per run."""
        if not self.measure_distortion or self.store is None or self.store.failure is not None:
            return False
        weights = getattr(self.lpips, "weights_sha256", None)
        for pair in pairs:
            with self._info_lock:
                if pair in self._distortion_seen:
                    continue
            try:
                found = self.store.distortion(*pair, lpips_weights=weights)
            except (StoreError, sqlite3.Error):
                return False  # a failing store: its answers' writes say so
            if found is None or (self.lpips is not None and found.lpips is None):
                return True
            with self._info_lock:
                self._distortion_seen.add(pair)
        return False

    def _distortion_note(self, line: str) -> None:
        with self._info_lock:
            first = len(self.distortion_notes) < 20
            if first:
                self.distortion_notes.append(line)
        if first and self.say is not None:
            self.say(line)

    # ------------------------------------------------------------------ disk cache
    def _disk_key(self, codec: Codec, arm: str, info: ImageInfo, target: tuple[int, int]) -> str:
        return self.disk_cache.key_for(  # type: ignore[union-attr]  # called only with a disk cache set
            info.sha256, arm, codec.identity(), PIPELINE_VERSION, f"{target[0]}x{target[1]}"
        )

    def _from_disk(self, codec: Codec, info: ImageInfo, target: tuple[int, int]) -> dict[str, ArmImage] | None:
        if self.disk_cache is None or not codec.disk_cacheable:
            return None
        tokens = _tokens(codec, info)
        found: dict[str, ArmImage] = {}
        for spec in codec.arms:
            data = self.disk_cache.get(self._disk_key(codec, spec.canonical, info, target))
            if data is None:
                return None
            found[spec.canonical] = ArmImage(data, hashlib.sha256(data).hexdigest(), target, tokens.get(spec.canonical))
        return found

    def _to_disk(self, codec: Codec, arm: str, info: ImageInfo, target: tuple[int, int], data: bytes) -> None:
        if self.disk_cache is not None and codec.disk_cacheable:
            self.disk_cache.put(self._disk_key(codec, arm, info, target), data)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        for codec in self.codecs:
            codec.close()


def _tokens(codec: Codec, info: ImageInfo) -> dict[str, int]:
    tokens_for = getattr(codec, "tokens_for", None)
    return dict(tokens_for((info.width, info.height))) if tokens_for else {}


def _decode(ref: ImageRef) -> Image.Image:
    try:
        with Image.open(io.BytesIO(ref.read_bytes())) as im:
            im.load()
            rgb: Image.Image = im.convert("RGB")
            return rgb
    except FileNotFoundError:
        raise ImageError(f"image not found: {ref.describe()}; check --data-root") from None
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise ImageError(
            f"cannot decode image {ref.describe()}: {exc}; the file is corrupt or not an image"
        ) from None


# ---------------------------------------------------------------------- the content sample
# What a resumed run reads of an image to trust its remembered sha256: the first and the last
# SAMPLE_EDGE bytes and SAMPLE_BLOCKS blocks of SAMPLE_BLOCK bytes evenly spaced between them
# (the whole file when it is not larger than that). A compressed image (PNG, JPEG, LZW/Deflate
# TIFF) rewritten with other pixels differs at its end (its checksums, the shifted stream); an
# uncompressed one differs in a sampled block unless every changed byte lies between blocks.
SAMPLE_EDGE = 64 * 1024
SAMPLE_BLOCK = 4096
SAMPLE_BLOCKS = 16


def _sample_spans(size: int) -> list[tuple[int, int]]:
    """(offset, length) of the sampled bytes of a file of `size` bytes, in file order."""
    if size <= 2 * SAMPLE_EDGE + SAMPLE_BLOCKS * SAMPLE_BLOCK:
        return [(0, size)]
    inner = size - 2 * SAMPLE_EDGE
    step = inner // (SAMPLE_BLOCKS + 1)
    middle = [(SAMPLE_EDGE + step * (i + 1) - SAMPLE_BLOCK // 2, SAMPLE_BLOCK) for i in range(SAMPLE_BLOCKS)]
    return [(0, SAMPLE_EDGE), *middle, (size - SAMPLE_EDGE, SAMPLE_EDGE)]


def _sample_digest(size: int, parts: list[bytes]) -> str:
    h = hashlib.sha256(str(size).encode())
    for part in parts:
        h.update(part)
    return h.hexdigest()[:32]


def content_sample(path: str, size: int) -> str:
    """The digest of the sampled bytes of the file at `path` (`size`: its size from stat)."""
    parts = []
    with open(path, "rb", buffering=0) as fh:  # unbuffered: only the sampled bytes are read
        for off, n in _sample_spans(size):
            fh.seek(off)
            parts.append(fh.read(n))
    return _sample_digest(size, parts)


def sample_of(data: bytes) -> str:
    """`content_sample` of a file holding `data`, from the bytes already read."""
    return _sample_digest(len(data), [data[off:off + n] for off, n in _sample_spans(len(data))])


def _measure(ref: ImageRef, data: bytes) -> ImageInfo:
    try:
        with Image.open(io.BytesIO(data)) as im:
            width, height = im.size
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise ImageError(
            f"cannot decode image {ref.describe()}: {exc}; the file is corrupt or not an image"
        ) from None
    return ImageInfo(hashlib.sha256(data).hexdigest(), width, height)
