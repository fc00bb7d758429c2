"""What measuring distortion adds to preparing an image, per reconstruction arm.

    .venv/bin/python performance/distortion.py                 # 256 and 512 px, 15 repetitions
    .venv/bin/python performance/distortion.py --sizes 512 --reps 31 --json performance/out/distortion.json

Side by side in one process, alternating, the order rotating every repetition; medians of wall and
thread CPU time per call, on a generated aerial scene (datasets/demo_scenes.py, tiled to the size)
and its JPEG q10 reconstruction:
- "distortion (plugin)": what `ImagePipeline` runs per arm: decode both images sent, PSNR, SSIM and
  MS-SSIM (engine/distortion.py; the original's decode is shared by an image's arms, counted here);
- "SSIM + MS-SSIM" alone, as the plugin computes it (float32, strips of rows) and as it could
  (float64 and/or the whole image at once: the alternatives engine/distortion.py's docstring
  compares against; the float64 variants do not centre, as scikit-image does not);
- "scikit-image SSIM" and "pytorch-msssim MS-SSIM" (CPU, one thread): the references the tests
  check against, where installed;
- "reconstruct jpeg:quality=10 + send": the cheapest codec's work per arm (reconstruct, encode the
  JPEG q95 sent), the cost distortion is added to; One-D-Piece's is in performance/onedpiece_speed.py.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import write_result  # noqa: E402 (after the sys.path setup above)

from pytest_satbench.datasets.demo_scenes import generate_scene  # noqa: E402 (after the sys.path setup above)
from pytest_satbench.engine import distortion as dist  # noqa: E402 (after the sys.path setup above)
from pytest_satbench.engine.images import encode_jpeg  # noqa: E402 (after the sys.path setup above)


def _scene(size: int) -> np.ndarray:
    tiles = [generate_scene(3, i).pixels for i in range(4)]
    big = np.concatenate([np.concatenate(tiles[:2], axis=1), np.concatenate(tiles[2:], axis=1)], axis=0)
    return np.array(Image.fromarray(big).resize((size, size), Image.Resampling.BICUBIC))


def _jpeg(a: np.ndarray, quality: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _variant(dtype: type, strip: int | None) -> Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """engine/distortion.py's `_ssim_cs` arithmetic in `dtype`, by strips of `strip` rows or on
    the whole image at once (None): the alternatives the plugin's choice is measured against."""

    def ssim_cs(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        w = dist.gaussian_window().astype(dtype)
        c1, c2 = (dist.K1 * 255) ** 2, (dist.K2 * 255) ** 2
        rows = x.shape[0] - dist.WINDOW + 1
        step = strip or rows
        s_out, cs_out = [], []
        for c in range(x.shape[2]):
            xc, yc = x[:, :, c].astype(dtype), y[:, :, c].astype(dtype)
            s_sum = cs_sum = 0.0
            for r0 in range(0, rows, step):
                r1 = min(rows, r0 + step) + dist.WINDOW - 1
                xs, ys = xc[r0:r1], yc[r0:r1]
                f = dist._valid_filter(dist._valid_filter(np.stack([xs, ys, xs * xs, ys * ys, xs * ys]), w, 1), w, 2)
                ux, uy, uxx, uyy, uxy = f
                cs = (2 * (uxy - ux * uy) + c2) / ((uxx - ux * ux) + (uyy - uy * uy) + c2)
                lum = (2 * ux * uy + c1) / (ux * ux + uy * uy + c1)
                cs_sum += float(cs.sum())
                s_sum += float((lum * cs).sum())
            n = rows * (x.shape[1] - dist.WINDOW + 1)
            s_out.append(s_sum / n)
            cs_out.append(cs_sum / n)
        return np.array(s_out), np.array(cs_out)

    return ssim_cs


def _with(ssim_cs: Callable[..., tuple[np.ndarray, np.ndarray]], a: np.ndarray, b: np.ndarray) -> object:
    plugin = dist._ssim_cs
    dist._ssim_cs = ssim_cs  # type: ignore[assignment]  # the variant measured, in the function's place
    try:
        return dist.ssim_and_msssim(a, b)
    finally:
        dist._ssim_cs = plugin  # type: ignore[assignment]  # the plugin's own, back


def _cases(size: int) -> dict[str, Callable[[], object]]:
    orig = _scene(size)
    sent_orig = encode_jpeg(Image.fromarray(orig))
    recon = dist.decode_rgb(_jpeg(orig, 10))
    sent_recon = encode_jpeg(Image.fromarray(recon))
    a, b = dist.decode_rgb(sent_orig), dist.decode_rgb(sent_recon)

    def plugin() -> object:
        x, y = dist.decode_rgb(sent_orig), dist.decode_rgb(sent_recon)
        return dist.psnr(x, y), dist.ssim_and_msssim(x, y)


    def codec() -> object:
        image = Image.fromarray(orig)
        out = Image.open(io.BytesIO(_jpeg(np.asarray(image), 10))).convert("RGB")
        return encode_jpeg(out)

    cases: dict[str, Callable[[], object]] = {
        "distortion (plugin): decode + PSNR + SSIM + MS-SSIM": plugin,
        "SSIM + MS-SSIM (plugin: float32, strips)": lambda: dist.ssim_and_msssim(a, b),
        "SSIM + MS-SSIM in float64, strips": lambda: _with(_variant(np.float64, dist.STRIP), a, b),
        "SSIM + MS-SSIM in float64, whole image": lambda: _with(_variant(np.float64, None), a, b),
        "SSIM + MS-SSIM in float32, whole image": lambda: _with(_variant(np.float32, None), a, b),
        "reconstruct jpeg:quality=10 + send": codec,
    }
    try:
        from skimage.metrics import structural_similarity

        cases["scikit-image SSIM"] = lambda: structural_similarity(
            a, b, gaussian_weights=True, sigma=1.5, use_sample_covariance=False, data_range=255, channel_axis=-1)
    except ImportError:
        pass
    try:
        import torch
        from pytorch_msssim import ms_ssim

        torch.set_num_threads(1)
        ta = torch.from_numpy(np.array(a)).permute(2, 0, 1)[None].float()
        tb = torch.from_numpy(np.array(b)).permute(2, 0, 1)[None].float()
        if size >= dist.MS_MIN_SIDE:
            cases["pytorch-msssim MS-SSIM (float32)"] = lambda: float(ms_ssim(ta, tb, data_range=255))
    except ImportError:
        pass
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="256,512")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "out" / "distortion.json")
    args = ap.parse_args()
    results: dict[str, dict[str, dict[str, float]]] = {}
    for size in (int(s) for s in args.sizes.split(",")):
        cases = _cases(size)
        names = list(cases)
        for fn in cases.values():
            fn()  # warm-up
        wall: dict[str, list[float]] = {n: [] for n in names}
        cpu: dict[str, list[float]] = {n: [] for n in names}
        for rep in range(args.reps):
            order = names[rep % len(names):] + names[:rep % len(names)]
            for name in order:
                t0, c0 = time.perf_counter(), time.thread_time()
                cases[name]()
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(time.thread_time() - c0)
        results[str(size)] = {n: {"wall_ms": 1000 * statistics.median(wall[n]),
                                  "cpu_ms": 1000 * statistics.median(cpu[n])} for n in names}
        print(f"\n{size}x{size} px, medians of {args.reps}")
        print(f"{'what':58} {'wall ms':>9} {'CPU ms':>9}")
        for n in names:
            print(f"{n:58} {results[str(size)][n]['wall_ms']:9.1f} {results[str(size)][n]['cpu_ms']:9.1f}")
    write_result(args.json, sizes=args.sizes, reps=args.reps, results=results)


if __name__ == "__main__":
    main()
