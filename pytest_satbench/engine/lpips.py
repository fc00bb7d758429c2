"""LPIPS (Zhang, Isola, Efros, Shechtman & Wang, "The Unreasonable Effectiveness of Deep Features
as a Perceptual Metric", CVPR 2018), AlexNet variant, version 0.1, from weights the user gives
(--lpips-weights PATH): neither AlexNet's nor LPIPS' weights can be downloaded during a run.

The computation follows the authors' package (github.com/richzhang/PerceptualSimilarity,
lpips/lpips.py `LPIPS.forward` with lpips=True, spatial=False, version 0.1): both images as sent
(8-bit RGB) mapped to [-1, 1]; shifted by (-0.030, -0.088, -0.188) and divided by (0.458, 0.448,
0.450) per channel (its ScalingLayer); AlexNet's convolutional features (torchvision's
`alexnet().features`) after each of its five ReLUs; each feature map divided by its L2 norm over
channels (+1e-10); the squared difference weighted per channel by the layer's non-negative 1x1
linear weights, averaged over positions, summed over the five layers. 0 for identical images;
larger is more different.

The weights file: one `torch.save`d state dict holding
- AlexNet's features: `features.{0,3,6,8,10}.{weight,bias}` (torchvision's
  alexnet-owt-7be5be79.pth has them under these names; its `classifier.*` keys are ignored), or
  the same tensors under the lpips package's names `net.slice{1..5}.{0,3,6,8,10}.{weight,bias}`;
- LPIPS' linear layers: `lin{0..4}.model.1.weight`, shapes (1, C, 1, 1) for C = 64, 192, 384,
  256, 256 (the lpips package's weights/v0.1/alex.pth).
So `torch.save(lpips.LPIPS(net="alex").state_dict(), PATH)` on a machine that can download, or
the two files merged into one dict, both work. docs/distortion.md shows both.

Runs on the CPU in the image-preparation threads (torch releases the GIL in its kernels).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import numpy as np

# (features index, stride, padding, max-pool before it) of AlexNet's five convolutions
_CONVS = ((0, 4, 2, False), (3, 1, 2, True), (6, 1, 1, True), (8, 1, 1, False), (10, 1, 1, False))
_CHANNELS = (64, 192, 384, 256, 256)
_CONV_SHAPES = {0: (64, 3, 11, 11), 3: (192, 64, 5, 5), 6: (384, 192, 3, 3), 8: (256, 384, 3, 3),
                10: (256, 256, 3, 3)}
_SHIFT = (-0.030, -0.088, -0.188)
_SCALE = (0.458, 0.448, 0.450)
_SLICE_NAME = re.compile(r"^net\.slice\d+\.(\d+)\.(weight|bias)$")


class LpipsWeightsError(Exception):
    """The --lpips-weights file cannot be used: one line naming it and what is missing."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class LPIPS:
    """LPIPS-Alex v0.1 with the weights in `path`; `weights_sha256` names them in the store."""

    def __init__(self, path: Path) -> None:
        path = Path(path)
        where = f"--lpips-weights {path}"
        try:
            import torch
        except ImportError:
            raise LpipsWeightsError(
                f"{where}: LPIPS needs torch: pip install 'pytest-satbench[onedpiece]'") from None
        try:
            self.weights_sha256 = _sha256(path)
            state = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise LpipsWeightsError(f"{where}: no such file") from None
        except Exception as exc:  # noqa: BLE001 - torch raises many kinds on a file that is not its own
            raise LpipsWeightsError(
                f"{where}: not a torch state dict ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                "see docs/distortion.md for the file it needs") from None
        if not isinstance(state, dict):
            raise LpipsWeightsError(f"{where}: holds a {type(state).__name__}, not a state dict (a dict of tensors)")
        self._torch = torch
        self._conv: list[tuple[Any, Any, int, int, bool]] = []
        found = {}
        for key, value in state.items():
            m = _SLICE_NAME.match(str(key))
            found[f"features.{m.group(1)}.{m.group(2)}" if m else str(key)] = value
        problems = []
        for index, stride, padding, pool in _CONVS:
            w, b = found.get(f"features.{index}.weight"), found.get(f"features.{index}.bias")
            if w is None or b is None:
                problems.append(f"features.{index}.weight/bias missing")
                continue
            if tuple(w.shape) != _CONV_SHAPES[index] or tuple(b.shape) != (_CONV_SHAPES[index][0],):
                problems.append(f"features.{index} has shape {tuple(w.shape)}, AlexNet's is {_CONV_SHAPES[index]}")
                continue
            self._conv.append((w.float(), b.float(), stride, padding, pool))
        self._lin = []
        for k, chn in enumerate(_CHANNELS):
            w = found.get(f"lin{k}.model.1.weight")
            if w is None:
                problems.append(f"lin{k}.model.1.weight missing")
            elif tuple(w.shape) != (1, chn, 1, 1):
                problems.append(f"lin{k}.model.1.weight has shape {tuple(w.shape)}, not (1, {chn}, 1, 1)")
            else:
                self._lin.append(w.float())
        if problems:
            raise LpipsWeightsError(
                f"{where}: not LPIPS-Alex weights ({'; '.join(problems[:3])}{'; ...' if len(problems) > 3 else ''}); "
                "see docs/distortion.md for the file it needs")
        self._shift = torch.tensor(_SHIFT).view(1, 3, 1, 1)
        self._scale = torch.tensor(_SCALE).view(1, 3, 1, 1)

    def _features(self, x: Any) -> list[Any]:
        f = self._torch.nn.functional
        out = []
        h = (x - self._shift) / self._scale
        for w, b, stride, padding, pool in self._conv:
            if pool:
                h = f.max_pool2d(h, kernel_size=3, stride=2)
            h = f.relu(f.conv2d(h, w, b, stride=stride, padding=padding))
            out.append(h)
        return out

    def __call__(self, a: np.ndarray, b: np.ndarray) -> float:
        """LPIPS between two (height, width, 3) uint8 images of one geometry."""
        torch = self._torch
        x = torch.from_numpy(np.stack([a, b]).astype(np.float32)).permute(0, 3, 1, 2) / 127.5 - 1.0
        with torch.inference_mode():
            total = 0.0
            for feat, lin in zip(self._features(x), self._lin, strict=True):
                unit = feat / (torch.sqrt((feat * feat).sum(dim=1, keepdim=True)) + 1e-10)
                diff = (unit[0:1] - unit[1:2]) ** 2
                total += float(torch.nn.functional.conv2d(diff, lin).mean())
        return total
