"""How far a reconstruction, as sent, is from the original, as sent: PSNR, SSIM, MS-SSIM, LPIPS.

Both images are what the VLM receives: the decoded JPEG q95 bytes of the original at the arms'
geometry and of the arm's reconstruction (engine/images.py), as 8-bit RGB, data range 255. The
numbers therefore include the JPEG step, which the VLM sees too.

- PSNR: 10 log10(255^2 / MSE), the MSE over every pixel and channel; math.inf when identical.
- SSIM: Wang, Bovik, Sheikh & Simoncelli, "Image quality assessment: from error visibility to
  structural similarity", IEEE TIP 13(4), 2004: an 11x11 Gaussian window (sigma 1.5), K1 0.01,
  K2 0.03, population (co)variances, the map's mean over the positions where the window fits
  inside the image, averaged over the three channels. These are the settings of scikit-image's
  `structural_similarity(gaussian_weights=True, sigma=1.5, use_sample_covariance=False,
  data_range=255, channel_axis=-1)`, which crops the filtered map by the window's radius so that
  its border handling drops out; tests/engine/test_distortion.py checks the two agree to 1e-6
  (computed in float32: see `_ssim_cs` for the one kind of image where they differ by ~1e-5).
- MS-SSIM: Wang, Simoncelli & Bovik, "Multiscale structural similarity for image quality
  assessment", Asilomar 2003: five scales, the paper's weights (0.0448, 0.2856, 0.3001, 0.2363,
  0.1333), the contrast-structure term at scales 1-4 and the full SSIM at scale 5, per channel,
  each term clipped at 0 before its power (as pytorch-msssim does, so a negative correlation gives
  0, not NaN), then averaged over channels. Between scales a 2x2 mean, an odd side extended by
  its last row/column as the authors' msssim.m does (imfilter 'symmetric' then 1:2:end);
  pytorch-msssim zero-pads odd sides instead, so the two agree (to 1e-6) where every scale's sides
  are even (a side divisible by 16). Needs the smaller side >= 161 px (11 px at scale 5), else
  None.
- LPIPS: engine/lpips.py, only with the user's weights (--lpips-weights).

Cost (performance/distortion.py, docs/performance.md): the Gaussian filters are separable and run
as shifted slices over the five moments of a strip of rows at once, the symmetric window halving
the multiplications, in float32. SSIM and MS-SSIM of a 512x512 pair: 64 ms CPU, against 128 ms
for the same code in float64 and 193 ms in float64 on the whole image at once (scikit-image's SSIM
alone: 117 ms; medians of one side-by-side run on a loaded 2-core machine).
"""

from __future__ import annotations

import io
import math

import numpy as np

WINDOW = 11
SIGMA = 1.5
K1, K2 = 0.01, 0.03
DATA_RANGE = 255.0
MS_WEIGHTS = (0.0448, 0.2856, 0.3001, 0.2363, 0.1333)  # Wang et al. 2003, section 3.2
MS_MIN_SIDE = (WINDOW - 1) * 2 ** (len(MS_WEIGHTS) - 1) + 1  # 161: the window still fits at scale 5


class DistortionError(Exception):
    """The two images cannot be compared (one does not decode, their sizes differ)."""


def decode_rgb(jpeg: bytes) -> np.ndarray:
    """The image as sent, decoded to (height, width, 3) uint8."""
    from PIL import Image

    with Image.open(io.BytesIO(jpeg)) as im:
        return np.asarray(im.convert("RGB"), dtype=np.uint8)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of two uint8 images over all pixels and channels; math.inf when identical."""
    _same_shape(a, b)
    diff = (a.astype(np.int64) - b.astype(np.int64)).ravel()
    sse = int(np.dot(diff, diff))  # exact: integers
    if sse == 0:
        return math.inf
    mse = sse / diff.size
    return 10.0 * math.log10(DATA_RANGE * DATA_RANGE / mse)


def gaussian_window() -> np.ndarray:
    """The normalised 1-D window: exp(-x^2 / 2 sigma^2) for x in -5..5 (scipy's gaussian_filter
    with truncate 3.5 at sigma 1.5 uses the same 11 taps, which scikit-image relies on)."""
    x = np.arange(WINDOW, dtype=np.float64) - WINDOW // 2
    w = np.exp(-(x * x) / (2.0 * SIGMA * SIGMA))
    window: np.ndarray = w / w.sum()
    return window


def _valid_filter(a: np.ndarray, w: np.ndarray, axis: int) -> np.ndarray:
    """Correlation of `a` with the symmetric window `w` along `axis`, where it fits ("valid")."""
    n = a.shape[axis] - len(w) + 1
    half = len(w) // 2

    def part(k: int) -> np.ndarray:
        index = [slice(None)] * a.ndim
        index[axis] = slice(k, k + n)
        return a[tuple(index)]

    out: np.ndarray = part(half) * w[half]
    tmp = np.empty_like(out)
    for k in range(half):  # w[k] == w[-1-k]: one multiplication for both taps
        np.add(part(k), part(len(w) - 1 - k), out=tmp)
        tmp *= w[k]
        out += tmp
    return out


STRIP = 48  # output rows per block: a block's moments (5 x 58 rows x 512 x 4 bytes) stay in cache


def _ssim_cs(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per channel: (mean SSIM, mean contrast-structure) over the valid window positions, for
    two (height, width, channels) images of values in 0..255.

    In float32 on values centred on the channel's mean level (the variances and covariance do
    not depend on the centre; the means get it back for the luminance term), at half float64's
    memory traffic: on the scenes and near-flat images tested the mean SSIM is within 1e-8 to
    1e-6 of scikit-image's float64. The exception: large flat areas far from the mean level
    (dark water beside bright roofs, the test's halves at 3 and 252) that differ by a grey level,
    where E[x^2] - E[x]^2 loses float32 digits and the mean moves by up to ~1.5e-5 (tested),
    far below the third decimal reports show. Computed per channel in strips of STRIP output rows
    (with the window's 10 rows of overlap) so that a block's moments stay in cache. Both choices
    are measured by performance/distortion.py (docs/performance.md)."""
    w = gaussian_window().astype(np.float32)
    c1 = np.float32((K1 * DATA_RANGE) ** 2)
    c2 = np.float32((K2 * DATA_RANGE) ** 2)
    height, width, channels = x.shape
    rows = height - WINDOW + 1
    count = rows * (width - WINDOW + 1)
    s_mean = np.empty(channels)
    cs_mean = np.empty(channels)
    for c in range(channels):
        center = np.float32(round(float(x[:, :, c].mean() + y[:, :, c].mean()) / 2))
        xc = x[:, :, c].astype(np.float32) - center
        yc = y[:, :, c].astype(np.float32) - center
        s_sum = cs_sum = 0.0
        for r0 in range(0, rows, STRIP):
            r1 = min(rows, r0 + STRIP) + WINDOW - 1
            xs, ys = xc[r0:r1], yc[r0:r1]
            moments = np.empty((5, *xs.shape), dtype=np.float32)
            moments[0], moments[1] = xs, ys
            np.multiply(xs, xs, out=moments[2])
            np.multiply(ys, ys, out=moments[3])
            np.multiply(xs, ys, out=moments[4])
            ux, uy, uxx, uyy, uxy = _valid_filter(_valid_filter(moments, w, 1), w, 2)
            vx = uxx - ux * ux
            vy = uyy - uy * uy
            vxy = uxy - ux * uy
            ux += center
            uy += center
            cs = (2.0 * vxy + c2) / (vx + vy + c2)
            lum = (2.0 * ux * uy + c1) / (ux * ux + uy * uy + c1)
            cs_sum += float(cs.sum(dtype=np.float64))
            s_sum += float((lum * cs).sum(dtype=np.float64))
        s_mean[c] = s_sum / count
        cs_mean[c] = cs_sum / count
    return s_mean, cs_mean


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """Mean SSIM of two uint8 RGB images (Wang et al. 2004), averaged over channels."""
    _same_shape(a, b)
    if min(a.shape[:2]) < WINDOW:
        raise DistortionError(f"SSIM needs both sides >= {WINDOW} px, got {a.shape[1]}x{a.shape[0]}")
    s, _ = _ssim_cs(a, b)
    return float(s.mean())


def downsample(a: np.ndarray) -> np.ndarray:
    """2x2 mean of a (height, width, channels) float image; an odd side is first extended by its
    last row/column (Wang's msssim.m: imfilter 'symmetric', then every second pixel)."""
    h, w = a.shape[:2]
    if h % 2 or w % 2:
        a = np.pad(a, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
    mean: np.ndarray = 0.25 * (a[0::2, 0::2] + a[1::2, 0::2] + a[0::2, 1::2] + a[1::2, 1::2])
    return mean


def ssim_and_msssim(a: np.ndarray, b: np.ndarray) -> tuple[float, float | None]:
    """(SSIM, MS-SSIM) of two uint8 RGB images; MS-SSIM is None when the smaller side is under
    161 px. Scale 1's SSIM is the SSIM: one pass of the filters serves both."""
    _same_shape(a, b)
    if min(a.shape[:2]) < WINDOW:
        raise DistortionError(f"SSIM needs both sides >= {WINDOW} px, got {a.shape[1]}x{a.shape[0]}")
    x, y = a.astype(np.float32), b.astype(np.float32)
    s, cs = _ssim_cs(x, y)
    if min(a.shape[:2]) < MS_MIN_SIDE:
        return float(s.mean()), None
    product = np.ones_like(s)
    for scale, weight in enumerate(MS_WEIGHTS):
        if scale:
            x, y = downsample(x), downsample(y)
            s, cs = _ssim_cs(x, y)
        term = s if scale == len(MS_WEIGHTS) - 1 else cs
        product *= np.maximum(term, 0.0) ** weight
        if scale == 0:
            first = float(s.mean())
    return first, float(product.mean())


def _same_shape(a: np.ndarray, b: np.ndarray) -> None:
    if a.shape != b.shape or a.ndim != 3:
        raise DistortionError(f"images of different geometry: {a.shape} and {b.shape}")
