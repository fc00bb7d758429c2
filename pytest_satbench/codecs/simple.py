"""Cheap reference codecs: identity, JPEG at a quality, and down-then-up resizing.

They need no accelerator and bound what a tokenizer is compared with: `identity` measures
the server's own noise, `jpeg:quality=Q` and `resize:factor=F` are classic lossy baselines
that blur small objects the way a low token budget does.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

from PIL import Image

from pytest_satbench.codecs.base import (
    ArmSpec,
    Codec,
    CodecFactory,
    SpecError,
    expect_float,
    expect_int,
    register_codec,
    reject_unknown,
)


class IdentityCodec(Codec):
    def __init__(self, spec: ArmSpec) -> None:
        self.arms = (spec,)

    def reconstruct(self, image: Image.Image) -> list[Image.Image]:
        return [image.convert("RGB")]


class JpegCodec(Codec):
    def __init__(self, spec: ArmSpec) -> None:
        self.arms = (spec,)
        self.quality = int(spec.param("quality", ""))

    def reconstruct(self, image: Image.Image) -> list[Image.Image]:
        buf = io.BytesIO()
        image.convert("RGB").save(buf, format="JPEG", quality=self.quality)
        buf.seek(0)
        out = Image.open(buf)
        out.load()
        return [out.convert("RGB")]


class ResizeCodec(Codec):
    """Downsample by `factor`, then upsample back: the output keeps the input's geometry."""

    def __init__(self, spec: ArmSpec) -> None:
        self.arms = (spec,)
        self.factor = float(spec.param("factor", ""))

    def reconstruct(self, image: Image.Image) -> list[Image.Image]:
        rgb = image.convert("RGB")
        w, h = rgb.size
        small = rgb.resize(
            (max(1, round(w * self.factor)), max(1, round(h * self.factor))),
            Image.Resampling.BICUBIC,
        )
        return [small.resize((w, h), Image.Resampling.BICUBIC)]


def _identity(params: dict[str, str]) -> ArmSpec:
    reject_unknown("identity", params, set())
    return ArmSpec("identity")


def _required(codec: str, params: dict[str, str], key: str, example: str) -> str:
    """A parameter the arm's pixels depend on: never a silent default, the report must say it."""
    if key not in params:
        raise SpecError(f"--recon {codec}: give its {key}, e.g. --recon {codec}:{key}={example}")
    return params[key]


def _jpeg(params: dict[str, str]) -> ArmSpec:
    reject_unknown("jpeg", params, {"quality"})
    q = expect_int("jpeg", "quality", _required("jpeg", params, "quality", "75"), 1, 100)
    return ArmSpec("jpeg", (("quality", str(q)),))


def _resize(params: dict[str, str]) -> ArmSpec:
    reject_unknown("resize", params, {"factor"})
    f = expect_float("resize", "factor", _required("resize", params, "factor", "0.5"), 0.0, 1.0)
    return ArmSpec("resize", (("factor", f"{f:g}"),))


def _one_each(cls: type[Codec]):
    def build(specs: Sequence[ArmSpec]) -> list[Codec]:
        return [cls(s) for s in specs]  # type: ignore[call-arg]  # these codecs take their ArmSpec

    return build


# Labels in tables: `jpeg:q10`, `rsz:0.5`, `identity`.
register_codec(
    CodecFactory("identity", _identity, _one_each(IdentityCodec), "the original pixels")
)
register_codec(
    CodecFactory("jpeg", _jpeg, _one_each(JpegCodec), "jpeg:quality=Q (1-100)",
                 label=lambda spec: f"jpeg:q{spec.param('quality')}")
)
register_codec(
    CodecFactory(
        "resize",
        _resize,
        _one_each(ResizeCodec),
        "resize:factor=F (0<F<=1): down by F, back up to the original size",
        label=lambda spec: f"rsz:{spec.param('factor')}",
    )
)
