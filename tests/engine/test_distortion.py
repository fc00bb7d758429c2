"""Distortion between the images as sent: PSNR by hand on exact noise patterns, SSIM equal to
scikit-image's and MS-SSIM to pytorch-msssim's on generated aerial scenes, and the image
pipeline measuring each pair once (the store's row reused, disk-cache hits measured too, an
image that cannot be measured said in one line)."""

from __future__ import annotations

import functools
import io
import math
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pytest_satbench.codecs.base import ArmSpec, Codec
from pytest_satbench.core.arms import ORIG
from pytest_satbench.core.question import ImageRef
from pytest_satbench.datasets.demo_scenes import generate_scene
from pytest_satbench.engine import distortion as dist
from pytest_satbench.engine.diskcache import DiskCache
from pytest_satbench.engine.images import ImagePipeline
from pytest_satbench.engine.store import ResultStore

skimage_metrics = pytest.importorskip("skimage.metrics")


@functools.cache
def _scene(index: int) -> np.ndarray:
    pixels = generate_scene(7, index).pixels
    pixels.flags.writeable = False  # shared between tests: each copies what it changes
    return pixels


def _jpeg_round_trip(a: np.ndarray, quality: int) -> np.ndarray:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="JPEG", quality=quality)
    return dist.decode_rgb(buf.getvalue())


# ---------------------------------------------------------------------- PSNR
def test_psnr_of_an_exact_noise_pattern_is_the_hand_computed_one() -> None:
    flat = np.full((64, 48, 3), 128, dtype=np.uint8)
    noisy = flat.copy()
    noisy[0::2, :, 0] += 3  # every second row of the red channel +3: 1/6 of the values
    noisy[1::4, :, 2] -= 5  # every fourth row of the blue channel -5: 1/12 of the values
    mse = (9 * (1 / 6) + 25 * (1 / 12))  # exactly
    assert dist.psnr(flat, noisy) == pytest.approx(10 * math.log10(255**2 / mse), abs=1e-12)
    # on a real scene (kept off 0 and 255 so that nothing clips): the same pattern, the same PSNR
    scene = np.clip(_scene(0), 10, 245).astype(np.uint8)[:64, :48]
    noisy = scene.astype(np.int16)
    noisy[0::2, :, 0] += 3
    noisy[1::4, :, 2] -= 5
    assert dist.psnr(scene, noisy.astype(np.uint8)) == pytest.approx(10 * math.log10(255**2 / mse), abs=1e-12)
    assert dist.psnr(scene, scene) == math.inf
    assert dist.psnr(flat, np.zeros_like(flat)) == pytest.approx(10 * math.log10(255**2 / 128**2), abs=1e-12)


# ---------------------------------------------------------------------- SSIM
@pytest.mark.parametrize(("size", "quality"), [((256, 256), 10), ((256, 256), 60), ((67, 45), 20), ((161, 200), 5)])
def test_ssim_equals_scikit_image(size: tuple[int, int], quality: int) -> None:
    h, w = size
    a = _scene(1)[:h, :w].copy()
    b = _jpeg_round_trip(a, quality)
    ref = skimage_metrics.structural_similarity(
        a, b, gaussian_weights=True, sigma=1.5, use_sample_covariance=False, data_range=255, channel_axis=-1)
    assert ref < 0.999  # the pair really differs
    assert dist.ssim(a, b) == pytest.approx(ref, abs=1e-6)
    assert dist.ssim_and_msssim(a, b)[0] == pytest.approx(ref, abs=1e-6)
    assert dist.ssim(a, a) == 1.0


def _skimage_ssim(a: np.ndarray, b: np.ndarray) -> float:
    return skimage_metrics.structural_similarity(
        a, b, gaussian_weights=True, sigma=1.5, use_sample_covariance=False, data_range=255, channel_axis=-1)


def test_ssim_in_float32_near_the_ends_of_the_range_and_its_worst_case() -> None:
    rng = np.random.default_rng(1)
    for level, spread in ((250, 0.6), (5, 2.0), (128, 100.0)):  # near-flat bright, near-flat dark, noise
        a = np.clip(level + rng.normal(0, spread, (96, 96, 3)), 0, 255).astype(np.uint8)
        b = np.clip(a.astype(np.int16) + rng.integers(-1, 2, a.shape), 0, 255).astype(np.uint8)
        assert dist.ssim(a, b) == pytest.approx(_skimage_ssim(a, b), abs=1e-6)
    # the documented worst case of float32: flat areas far from the image's mean level (3 and 252)
    # differing by one grey level in a sixth of the pixels
    a = np.zeros((96, 96, 3), np.uint8)
    a[:, :48], a[:, 48:] = 3, 252
    b = a.copy()
    b[::2, ::3] += 1
    assert dist.ssim(a, b) == pytest.approx(_skimage_ssim(a, b), abs=3e-5)


def test_ssim_of_images_too_small_or_of_two_geometries_is_one_line() -> None:
    with pytest.raises(dist.DistortionError, match="11 px"):
        dist.ssim(np.zeros((10, 40, 3), np.uint8), np.zeros((10, 40, 3), np.uint8))
    with pytest.raises(dist.DistortionError, match="different geometry"):
        dist.psnr(np.zeros((12, 40, 3), np.uint8), np.zeros((40, 12, 3), np.uint8))


# ---------------------------------------------------------------------- MS-SSIM
def _pytorch_msssim(a: np.ndarray, b: np.ndarray) -> float:
    torch = pytest.importorskip("torch")
    pm = pytest.importorskip("pytorch_msssim")
    torch.set_num_threads(1)  # two small images: threads only contend with the other tests
    x = torch.from_numpy(np.array(a)).permute(2, 0, 1)[None].double()
    y = torch.from_numpy(np.array(b)).permute(2, 0, 1)[None].double()
    coords = torch.arange(11, dtype=torch.float64) - 5  # its own window, in float64 (its default is float32)
    g = torch.exp(-(coords**2) / (2 * 1.5**2))
    win = (g / g.sum()).reshape(1, 1, 11).repeat(3, 1, 1)
    return float(pm.ms_ssim(x, y, data_range=255, win=win[:, None]))


@pytest.mark.parametrize(("size", "quality"), [((256, 256), 10), ((176, 208), 40)])
def test_msssim_equals_pytorch_msssim_where_every_scale_is_even(size: tuple[int, int], quality: int) -> None:
    h, w = size
    a = _scene(2)[:h, :w].copy()
    b = _jpeg_round_trip(a, quality)
    _, ms = dist.ssim_and_msssim(a, b)
    assert ms is not None and ms < 0.9999
    assert ms == pytest.approx(_pytorch_msssim(a, b), abs=1e-6)


def test_msssim_needs_161_px_and_odd_sides_repeat_their_edge() -> None:
    a = _scene(3)
    b = _jpeg_round_trip(a, 10)
    assert dist.ssim_and_msssim(a[:160], b[:160])[1] is None  # 11 px would not fit at scale 5
    ms = dist.ssim_and_msssim(a[:161, :175], b[:161, :175])[1]
    assert ms is not None
    # pytorch-msssim zero-pads odd sides: close on a 161x175 image, not equal
    assert ms == pytest.approx(_pytorch_msssim(a[:161, :175].copy(), b[:161, :175].copy()), abs=0.02)
    odd = np.arange(3 * 5 * 1, dtype=np.float64).reshape(3, 5, 1)
    down = dist.downsample(odd)
    assert down.shape == (2, 3, 1)
    assert down[0, 0, 0] == (0 + 1 + 5 + 6) / 4
    assert down[1, 2, 0] == odd[2, 4, 0]  # the corner: the last row and column repeated
    assert down[1, 0, 0] == (10 + 11) / 2


# ---------------------------------------------------------------------- the pipeline
class HalfJpeg(Codec):
    """JPEG q10 at half the size, counting its runs; disk-cacheable like an expensive codec."""

    disk_cacheable = True

    def __init__(self) -> None:
        self.arms = (ArmSpec("halfjpeg"),)
        self.calls = 0
        self._lock = threading.Lock()

    def reconstruct(self, image: Image.Image) -> list[Image.Image]:
        with self._lock:
            self.calls += 1
        buf = io.BytesIO()
        image.resize((image.width // 2, image.height // 2)).save(buf, format="JPEG", quality=10)
        return [Image.open(io.BytesIO(buf.getvalue())).convert("RGB")]

    def output_size(self, size: tuple[int, int]) -> tuple[int, int]:
        return (size[0] // 2, size[1] // 2)

    def identity(self) -> str:
        return "halfjpeg-v1"


def _image(tmp_path: Path, index: int = 4) -> ImageRef:
    path = tmp_path / f"scene{index}.png"
    Image.fromarray(np.concatenate([_scene(index), _scene(index + 1)], axis=1)).save(path)  # 512x256
    return ImageRef(id=f"s{index}", path=str(path))


def _sent(jpeg: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(jpeg)) as im:
        return np.asarray(im.convert("RGB"))


def test_the_pipeline_measures_the_images_sent_once_and_the_store_keeps_it(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r.sqlite")
    ref = _image(tmp_path)
    pipe = ImagePipeline([HalfJpeg()], store=store)
    arms = pipe.get(ref).result().arms
    d = arms["halfjpeg"].distortion
    assert arms[ORIG].distortion is None and pipe.distortions_computed == 1
    # measured on what is sent: both JPEG q95 files at the arms' geometry (256x128)
    o, r = _sent(arms[ORIG].jpeg), _sent(arms["halfjpeg"].jpeg)
    assert o.shape == (128, 256, 3)
    assert d.psnr == pytest.approx(skimage_metrics.peak_signal_noise_ratio(o, r, data_range=255), abs=1e-9)
    assert d.ssim == pytest.approx(skimage_metrics.structural_similarity(
        o, r, gaussian_weights=True, sigma=1.5, use_sample_covariance=False, data_range=255, channel_axis=-1), abs=1e-6)
    assert d.msssim is None and d.lpips is None  # 128 px < 161; no --lpips-weights
    store.flush()
    assert store.distortion(arms[ORIG].sha256, arms["halfjpeg"].sha256) == d
    pipe.close()
    # a later run (a resume) reconstructs again (no disk cache here) but measures nothing
    again = ImagePipeline([HalfJpeg()], store=store)
    assert again.get(ref).result().arms["halfjpeg"].distortion == d
    assert again.distortions_computed == 0 and again.reconstructions == 1
    again.close()
    store.close()


def test_disk_cache_hits_get_their_distortion_and_a_broken_entry_is_one_line(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path / "cache", max_bytes=1 << 26)
    ref = _image(tmp_path)
    first = ImagePipeline([HalfJpeg()], disk_cache=cache)
    made = first.get(ref).result().arms["halfjpeg"]
    first.close()
    # a new store: the reconstruction comes from the disk cache, the distortion is measured on it
    store = ResultStore(tmp_path / "r.sqlite")
    codec = HalfJpeg()
    hit = ImagePipeline([codec], store=store, disk_cache=cache)
    arm = hit.get(ref).result().arms["halfjpeg"]
    assert codec.calls == 0 and hit.reconstructions == 0 and hit.distortions_computed == 1
    assert arm.sha256 == made.sha256 and arm.distortion == made.distortion and arm.distortion is not None
    hit.close()
    # an entry that holds bytes no decoder reads: the answers go on, the distortion is said absent
    other = _image(tmp_path, 9)
    info = ImagePipeline([]).info(other)
    key = DiskCache.key_for(info.sha256, "halfjpeg", "halfjpeg-v1", __import__(
        "pytest_satbench.engine.fingerprint", fromlist=["PIPELINE_VERSION"]).PIPELINE_VERSION, "256x128")
    cache.put(key, b"not a jpeg")
    said: list[str] = []
    broken = ImagePipeline([HalfJpeg()], store=store, disk_cache=cache, say=said.append)
    arms = broken.get(other).result().arms
    assert arms["halfjpeg"].distortion is None and broken.distortions_computed == 0
    assert len(said) == 1 and "\n" not in said[0]
    assert said[0].startswith(f"distortion of arm halfjpeg of image {other.describe()} not measured")
    broken.close()
    store.close()
