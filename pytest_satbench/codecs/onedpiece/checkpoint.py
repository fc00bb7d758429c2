"""Loading a released One-D-Piece `pytorch_model.bin`: configuration from the tensor shapes,
strict loading, one-line errors, and a cached content hash for fingerprints.

The released files carry no config.json, so the configuration is read off the shapes:
width and token counts from `latent_tokens`, depth from the block count, the pixel decoder
from its convs. The head count is not visible in any shape; the released variants all use
64-dim heads, so that rule is applied (and any non-S/B/L file loads the same way, which is
how tests use tiny random checkpoints).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from pytest_satbench.codecs.onedpiece.model import (
    VARIANTS,
    OneDPiece,
    OneDPieceConfig,
    build,
    head_count,
    variant_of,
)

# Bump when a change to model.py changes outputs: it is part of the codec identity, so
# cached reconstructions made by an older implementation are not reused.
IMPLEMENTATION_VERSION = "1"


class CheckpointError(ValueError):
    """The checkpoint is missing, unreadable, or not the expected One-D-Piece shape.
    The message is one line that names the file."""


@dataclass(frozen=True, slots=True)
class LoadedCheckpoint:
    path: Path
    config: OneDPieceConfig
    variant: str  # 'S', 'B', 'L' or 'custom'


Shapes = Mapping[str, tuple[int, ...]]


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The raw state dict, memory-mapped when the file format allows (cheap for shapes)."""
    if not path.is_file():
        raise CheckpointError(
            f"{path}: no such checkpoint file; download pytorch_model.bin from "
            "huggingface.co/turing-motors/One-D-Piece-{S,B,L}-256 and pass its path as ckpt=PATH"
        )
    try:
        try:
            sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:  # legacy (non-zip) files cannot be mapped
            if "mmap" not in str(exc):
                raise
            sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001  (any unpickling failure is one message)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}: not a loadable PyTorch state dict ({first[:200]})") from None
    if not isinstance(sd, Mapping) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"{path}: expected a plain state dict of tensors, got {type(sd).__name__}")
    return dict(sd)


def _count(shapes: Shapes, pattern: str) -> int:
    rx = re.compile(pattern)
    return len({m.group(1) for k in shapes if (m := rx.match(k))})


def _shape(path: Path, shapes: Shapes, key: str) -> tuple[int, ...]:
    if key not in shapes:
        raise CheckpointError(f"{path}: not a One-D-Piece checkpoint: key {key!r} is missing")
    return shapes[key]


def infer_config(path: Path, shapes: Shapes) -> OneDPieceConfig:
    """The configuration whose module shapes the checkpoint has; CheckpointError if the
    shapes do not describe a runnable One-D-Piece."""
    n_latent, width = _shape(path, shapes, "latent_tokens")
    patch = _shape(path, shapes, "encoder.patch_embed.weight")[-1]
    n_pos = _shape(path, shapes, "encoder.positional_embedding")[0]
    grid = round((n_pos - 1) ** 0.5)
    codebook, token_size = _shape(path, shapes, "quantize.embedding.weight")
    pixel_codebook, z_channels = _shape(path, shapes, "pixel_quantize.embedding.weight")
    hidden = _shape(path, shapes, "pixel_decoder.norm_out.weight")[0]
    levels = _count(shapes, r"pixel_decoder\.up\.(\d+)\.")
    mult = tuple(
        _shape(path, shapes, f"pixel_decoder.up.{i}.block.0.conv1.weight")[0] // hidden
        for i in range(levels)
    )
    config = OneDPieceConfig(
        width=width,
        depth=_count(shapes, r"encoder\.transformer\.(\d+)\."),
        heads=head_count(width),
        image_size=grid * patch,
        patch_size=patch,
        num_latent_tokens=n_latent,
        token_size=token_size,
        codebook_size=codebook,
        pixel_codebook_size=pixel_codebook,
        pixel_z_channels=z_channels,
        pixel_hidden=hidden,
        pixel_channel_mult=mult,
        pixel_res_blocks=_count(shapes, r"pixel_decoder\.up\.0\.block\.(\d+)\."),
        pixel_mid_blocks=_count(shapes, r"pixel_decoder\.mid\.(\d+)\."),
    )
    try:
        config.check()
    except ValueError as exc:
        raise CheckpointError(f"{path}: not a runnable One-D-Piece configuration: {exc}") from None
    return config


def _expected_shapes(config: OneDPieceConfig) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in build(config, "meta").state_dict().items()}


def check_shapes(path: Path, shapes: Shapes, config: OneDPieceConfig, what: str) -> None:
    """CheckpointError naming the first missing, unexpected or mis-shaped key."""
    expected = _expected_shapes(config)
    for key, shape in expected.items():
        if key not in shapes:
            raise CheckpointError(f"{path}: not {what}: key {key!r} is missing")
        if tuple(shapes[key]) != shape:
            raise CheckpointError(
                f"{path}: not {what}: {key} has shape {tuple(shapes[key])}, {what} needs {shape}"
            )
    extra = sorted(set(shapes) - set(expected))
    if extra:
        raise CheckpointError(f"{path}: not {what}: unexpected key {extra[0]!r} ({len(extra)} in all)")


def describe(path: Path, variant: str | None = None) -> LoadedCheckpoint:
    """Read a checkpoint's shapes and settle its configuration.

    With `variant` ('S', 'B' or 'L') the file must be exactly that variant; without it the
    variant is inferred, and a consistent non-released shape loads as 'custom'."""
    path = Path(path).expanduser().resolve()
    shapes = {k: tuple(v.shape) for k, v in read_state_dict(path).items()}
    return describe_shapes(path, shapes, variant)


def describe_shapes(path: Path, shapes: Shapes, variant: str | None) -> LoadedCheckpoint:
    if variant is not None:
        if variant not in VARIANTS:
            raise CheckpointError(f"{path}: variant {variant!r} is not one of S, B, L")
        try:
            inferred = variant_of(infer_config(path, shapes))
        except CheckpointError:
            inferred = None
        hint = f" (its shapes are One-D-Piece-{inferred})" if inferred else ""
        try:
            check_shapes(path, shapes, VARIANTS[variant], f"One-D-Piece-{variant}")
        except CheckpointError as exc:
            raise CheckpointError(f"{exc}{hint}") from None
        return LoadedCheckpoint(path, VARIANTS[variant], variant)
    config = infer_config(path, shapes)
    check_shapes(path, shapes, config, "a consistent One-D-Piece checkpoint")
    return LoadedCheckpoint(path, config, variant_of(config) or "custom")


def load_model(path: Path, variant: str | None = None) -> tuple[OneDPiece, LoadedCheckpoint]:
    """The model with the checkpoint's weights (strict), in eval mode, on the CPU, fp32."""
    path = Path(path).expanduser().resolve()
    sd = read_state_dict(path)
    info = describe_shapes(path, {k: tuple(v.shape) for k, v in sd.items()}, variant)
    model = build(info.config, "meta")
    # assign=True adopts the loaded (possibly memory-mapped) tensors instead of copying.
    model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True, assign=True)
    return model.eval().requires_grad_(False), info


def save_random_checkpoint(path: Path, config: OneDPieceConfig, seed: int = 0) -> Path:
    """Write a randomly initialised checkpoint in the released format (a plain fp32 state
    dict). For tests and speed measurements; the outputs are noise."""
    torch.manual_seed(seed)
    model = build(config, "cpu")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)
    return path


# --------------------------------------------------------------------------- content hash

_hash_lock = threading.Lock()
_hash_memo: dict[tuple[str, int, int], str] = {}


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pytest-satbench"


def file_sha256(path: Path, cache_dir: Path | None = None) -> str:
    """sha256 of the file, remembered by (path, size, mtime) in memory and in a small JSON
    file under `cache_dir`, so a 2.5 GB checkpoint is hashed once, not every run."""
    path = Path(path).expanduser().resolve()
    st = path.stat()
    memo_key = (str(path), st.st_size, st.st_mtime_ns)
    with _hash_lock:
        if memo_key in _hash_memo:
            return _hash_memo[memo_key]
    index = (cache_dir or default_cache_dir()) / "file-sha256.json"
    disk_key = f"{path}|{st.st_size}|{st.st_mtime_ns}"
    table = _read_index(index)
    digest = table.get(disk_key)
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        h = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
        digest = h.hexdigest()
        table = _read_index(index)  # re-read: another process may have added entries
        table = {k: v for k, v in table.items() if not k.startswith(f"{path}|")}
        table[disk_key] = digest
        _write_index(index, table)
    with _hash_lock:
        _hash_memo[memo_key] = digest
    return digest


def _read_index(index: Path) -> dict[str, str]:
    try:
        data = json.loads(index.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_index(index: Path, table: dict[str, str]) -> None:
    # Best effort: a lost update only means hashing again next time.
    try:
        index.parent.mkdir(parents=True, exist_ok=True)
        tmp = index.with_name(f".{index.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(table, indent=0, sort_keys=True))
        os.replace(tmp, index)
    except OSError:
        pass
