"""`--recon onedpiece:...`: One-D-Piece reconstruction at one or more token budgets.

    onedpiece:ckpt=PATH[,variant=S|B|L][,nlatent=48][,max_tiles=12][,dtype=fp32|bf16]
              [,device=cuda:0][,batch=16]

An image is tiled InternVL-style into at most `max_tiles` crops, each crop keeps the first
`nlatent` of its 256 tokens, and the decoded crops are stitched onto the grid canvas (the
image's size rounded to whole crops, as in the seed). Arms that differ only in `nlatent`
become one codec that encodes every crop once and decodes it once per budget.

The canonical spec holds what changes the pixels: ckpt (absolute path), dtype, max_tiles,
nlatent, variant; the checkpoint's sha256 enters through `Codec.identity()`. `device` and
`batch` only decide where and how fast, so they travel in `ArmSpec.runtime`, outside it:
results from a GPU run and a CPU run share store rows and disk-cache entries.

This module must import without torch (entry-point discovery imports it on every run that
names a codec); torch is imported when a spec is normalised (to read the checkpoint's
shapes) or built.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from PIL import Image

from pytest_satbench.codecs.base import (
    ArmSpec,
    Codec,
    CodecFactory,
    Params,
    SpecError,
    expect_int,
    parse_spec,
    register_codec,
    reject_unknown,
)
from pytest_satbench.codecs.onedpiece.tiling import TileLayout

if TYPE_CHECKING:
    from pytest_satbench.codecs.onedpiece.checkpoint import LoadedCheckpoint
    from pytest_satbench.codecs.onedpiece.engine import Reconstructor

NAME = "onedpiece"
ENV_CKPT = "SATBENCH_ONEDPIECE_CKPT"
_KEYS = {"ckpt", "variant", "nlatent", "max_tiles", "dtype", "device", "batch"}
_DEVICE_RX = re.compile(r"^(cpu|cuda(:\d+)?|mps|xpu(:\d+)?)$")


def _group_key(spec: ArmSpec) -> Params:
    return tuple((k, v) for k, v in spec.params if k != "nlatent")


def _need_torch(text: str) -> None:
    try:
        import torch  # noqa: F401 (imported only to check that it is installed)
    except ImportError:
        raise SpecError(
            f"--recon {text}: One-D-Piece needs torch; pip install 'pytest-satbench[onedpiece]'"
        ) from None


def normalise(params: dict[str, str]) -> ArmSpec:
    text = "onedpiece:" + ",".join(f"{k}={v}" for k, v in params.items())
    reject_unknown("onedpiece", params, _KEYS)
    ckpt = params.get("ckpt") or os.environ.get(ENV_CKPT)
    if not ckpt:
        raise SpecError(
            f"--recon {text}: ckpt=PATH is required (the One-D-Piece pytorch_model.bin), "
            f"or set {ENV_CKPT}"
        )
    variant = params.get("variant")
    if variant is not None and variant not in ("S", "B", "L", "custom"):
        raise SpecError(f"--recon {text}: variant={variant!r} must be S, B or L (or omitted to infer it)")
    nlatent = expect_int("onedpiece", "nlatent", params.get("nlatent", "48"), 1, 256)
    max_tiles = expect_int("onedpiece", "max_tiles", params.get("max_tiles", "12"), 1, 64)
    dtype = params.get("dtype", "fp32")
    if dtype not in ("fp32", "bf16"):
        raise SpecError(f"--recon {text}: dtype={dtype!r} must be fp32 or bf16")
    device = params.get("device")
    if device is not None and not _DEVICE_RX.match(device):
        raise SpecError(f"--recon {text}: device={device!r} is not a torch device like cpu or cuda:0")
    batch = expect_int("onedpiece", "batch", params["batch"], 1, 4096) if "batch" in params else None

    _need_torch(text)
    from pytest_satbench.codecs.onedpiece.checkpoint import CheckpointError

    path = Path(ckpt).expanduser().resolve()
    try:
        info = _describe(path, None if variant == "custom" else variant)
    except CheckpointError as exc:
        raise SpecError(f"--recon onedpiece: {exc}") from None
    if nlatent > info.config.num_latent_tokens:
        raise SpecError(
            f"--recon {text}: nlatent={nlatent} but {path} has {info.config.num_latent_tokens} tokens per crop"
        )
    if device is not None and device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise SpecError(f"--recon {text}: device={device} but torch sees no CUDA device; pass device=cpu")
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise SpecError(
                f"--recon {text}: device={device} but torch sees {torch.cuda.device_count()} CUDA device(s)"
            )
    runtime: list[tuple[str, str]] = []
    if batch is not None:
        runtime.append(("batch", str(batch)))
    if device is not None:
        runtime.append(("device", device))
    return ArmSpec(
        "onedpiece",
        (
            ("ckpt", str(path)),
            ("dtype", dtype),
            ("max_tiles", str(max_tiles)),
            ("nlatent", str(nlatent)),
            ("variant", info.variant),
        ),
        runtime=tuple(runtime),
    )


_describe_memo: dict[tuple[str, int, int, str | None], LoadedCheckpoint] = {}


def _describe(path: Path, variant: str | None) -> LoadedCheckpoint:
    """Checkpoint shapes, read once per (file version, variant) in this process."""
    from pytest_satbench.codecs.onedpiece.checkpoint import describe

    try:
        st = path.stat()
    except OSError:
        return describe(path, variant)  # raises the one-line missing-file error
    key = (str(path), st.st_size, st.st_mtime_ns, variant)
    if key not in _describe_memo:
        _describe_memo[key] = describe(path, variant)
    return _describe_memo[key]


def default_device() -> str:
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


class OneDPieceCodec(Codec):
    """Arms that share checkpoint, dtype and tiling and differ only in the token budget."""

    disk_cacheable = True

    def __init__(
        self,
        arms: Sequence[ArmSpec],
        *,
        device: str | None = None,
        batch: int | None = None,
    ) -> None:
        from pytest_satbench.codecs.onedpiece.checkpoint import load_model
        from pytest_satbench.codecs.onedpiece.engine import Reconstructor

        if not arms or len({_group_key(a) for a in arms}) != 1:
            raise ValueError("OneDPieceCodec: arms must differ only in nlatent")
        first = arms[0]
        self.arms = tuple(arms)
        self.ckpt = Path(first.param("ckpt") or "")
        self.max_tiles = int(first.param("max_tiles") or 12)
        self.dtype = first.param("dtype") or "fp32"
        self.budgets = tuple(int(a.param("nlatent") or 48) for a in arms)
        variant = first.param("variant")
        model, self.info = load_model(self.ckpt, None if variant == "custom" else variant)
        self.tile = self.info.config.image_size
        self.device = device or default_device()
        if batch is None:
            batch = 16 if self.device.startswith("cuda") else 4
        self.engine: Reconstructor = Reconstructor(
            model, self.budgets, device=self.device, dtype=self.dtype, batch=batch
        )
        self._identity: str | None = None

    def identity(self) -> str:
        if self._identity is None:
            from pytest_satbench.codecs.onedpiece.checkpoint import (
                IMPLEMENTATION_VERSION,
                file_sha256,
            )

            self._identity = f"ckpt-sha256={file_sha256(self.ckpt)};impl={IMPLEMENTATION_VERSION}"
        return self._identity

    def layout(self, size: tuple[int, int]) -> TileLayout:
        return TileLayout.for_size(size, self.max_tiles, self.tile)

    def output_size(self, size: tuple[int, int]) -> tuple[int, int]:
        """Reconstructions come back on the grid canvas (cols*256 x rows*256), as in the seed;
        the original arm is sent at the same geometry, so only the tokens differ."""
        return self.layout(size).canvas_size

    def tokens_for(self, size: tuple[int, int]) -> dict[str, int]:
        """Tokens one image of this (width, height) costs per arm: nlatent x crops."""
        crops = self.layout(size).count
        return {a.canonical: k * crops for a, k in zip(self.arms, self.budgets)}

    def reconstruct(self, image: Image.Image) -> list[Image.Image]:
        layout = self.layout(image.size)
        out = self.engine.submit(layout.crops(image)).result()
        return [layout.stitch(out[i]) for i in range(len(self.arms))]

    def close(self) -> None:
        self.engine.close()


def label(spec: ArmSpec) -> str:
    """`tok48`: the token budget is what tells the arms of a budget sweep apart (the
    checkpoint path is long and the same for every budget)."""
    return f"tok{spec.param('nlatent')}"


def budget(spec: ArmSpec) -> tuple[str, float] | None:
    """(the spec without `nlatent`, nlatent): the arms of one checkpoint's budget sweep."""
    nlatent = spec.param("nlatent")
    if nlatent is None:
        return None
    try:
        value = float(nlatent)
    except ValueError:
        return None
    return ArmSpec(spec.codec, _group_key(spec)).canonical, value


_IDENTITY = re.compile(r"ckpt-sha256=([0-9a-f]{64})")


def describe(spec: ArmSpec, identity: str) -> dict[str, object]:
    """The checkpoint and its sha256 as the run recorded it (`OneDPieceCodec.identity`,
    hashed once when the run started); None when the run recorded none."""
    m = _IDENTITY.search(identity)
    return {"checkpoint": spec.param("ckpt"), "checkpoint_sha256": m.group(1) if m else None}


def shorthands(raw: list[str], given: Mapping[str, str]) -> list[str]:
    """The seed's shorthands: --nlatent 16,32 --max-tiles 12 --recon-device cuda:0 (keys
    `nlatent`, `max_tiles`, `device`).

    They apply to the onedpiece arms given with --recon; with none given, they create them
    from the checkpoint in $SATBENCH_ONEDPIECE_CKPT.
    """
    budgets = [b.strip() for b in (given.get("nlatent") or "").split(",") if b.strip()]
    max_tiles, device = given.get("max_tiles"), given.get("device")
    base = [r for r in raw if parse_spec(r)[0] == NAME]
    out = [r for r in raw if r not in base]
    if not base:
        if not os.environ.get(ENV_CKPT):
            raise SpecError(
                "--nlatent/--max-tiles/--recon-device need a One-D-Piece checkpoint: pass "
                f"--recon {NAME}:ckpt=PATH or set {ENV_CKPT}"
            )
        base = [NAME]
    for spec in base:
        params = parse_spec(spec)[1]
        if max_tiles:
            params["max_tiles"] = max_tiles
        if device:
            params["device"] = device
        todo: Sequence[str | None] = budgets or [params.get("nlatent")]
        for budget in todo:
            if budget:
                params["nlatent"] = budget
            out.append(f"{NAME}:" + ",".join(f"{k}={v}" for k, v in params.items()))
    return out


def build(specs: Sequence[ArmSpec]) -> list[Codec]:
    # Budgets of one checkpoint share a codec (one encoder pass) unless they were asked to
    # run in different places: each spec's device/batch is honoured as given.
    groups: dict[tuple[Params, Params], list[ArmSpec]] = {}
    for spec in specs:
        groups.setdefault((_group_key(spec), spec.runtime), []).append(spec)
    codecs: list[Codec] = []
    for arms in groups.values():
        batch = arms[0].runtime_param("batch")
        codecs.append(
            OneDPieceCodec(arms, device=arms[0].runtime_param("device"), batch=None if batch is None else int(batch))
        )
    return codecs


register_codec(
    CodecFactory(
        NAME,
        normalise,
        build,
        "onedpiece:ckpt=PATH[,variant=S|B|L][,nlatent=48][,max_tiles=12][,dtype=fp32|bf16]"
        "[,device=cuda:0][,batch=N]: One-D-Piece, first nlatent of 256 tokens per 256-px crop",
        label=label,
        describe=describe,
        disk_cacheable=OneDPieceCodec.disk_cacheable,
        shorthand_keys=frozenset({"nlatent", "max_tiles", "device"}),
        shorthands=shorthands,
        budget=budget,
    )
)
