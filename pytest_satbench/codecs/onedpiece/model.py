"""One-D-Piece image tokenizer (Turing Inc., arXiv 2501.10064), reimplemented in PyTorch.

Written from the paper's architecture description and the released checkpoint's shapes, not
from the upstream code (docs/onedpiece.md has the description). Module and parameter names follow the released `pytorch_model.bin`, so the
checkpoint loads with `load_state_dict(strict=True)` and no key mapping.

Pipeline for one 256x256 crop in [0, 1]:
  ViT encoder -> 256 latent vectors -> L2-normalised VQ (4096 codes of 12 dims) -> token ids;
  first k ids -> ViT decoder -> logits over the 1024 MaskGIT-VQGAN codes on a 16x16 grid ->
  soft code embedding -> MaskGIT-VQGAN pixel decoder -> RGB (not clamped here).

Two upstream quirks are reproduced because the weights were trained through them: the
encoder *reshapes* (B, N, W) to (B, W, N, 1) instead of permuting, and the pixel decoder's
channel-changing residual blocks apply the 1x1 shortcut to h, not to x.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True, slots=True)
class OneDPieceConfig:
    """Everything that fixes the module shapes. S, B and L differ only in the ViT size."""

    width: int
    depth: int
    heads: int
    image_size: int = 256
    patch_size: int = 16
    num_latent_tokens: int = 256
    token_size: int = 12
    codebook_size: int = 4096
    pixel_codebook_size: int = 1024
    pixel_z_channels: int = 256
    pixel_hidden: int = 128
    pixel_channel_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    pixel_res_blocks: int = 2
    pixel_mid_blocks: int = 2

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    def check(self) -> None:
        """Reject configurations the forward pass cannot run."""
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} is not a multiple of patch {self.patch_size}")
        if self.width % self.heads:
            raise ValueError(f"width {self.width} is not divisible by heads {self.heads}")
        if 2 ** (len(self.pixel_channel_mult) - 1) != self.patch_size:
            raise ValueError(
                f"pixel decoder upsamples x{2 ** (len(self.pixel_channel_mult) - 1)} "
                f"but the patch size is {self.patch_size}"
            )


# The released variants (configs/one-d-piece_{s,b,l}256.yaml); head dim is 64 in all three.
VARIANTS: dict[str, OneDPieceConfig] = {
    "S": OneDPieceConfig(width=512, depth=8, heads=8),
    "B": OneDPieceConfig(width=768, depth=12, heads=12),
    "L": OneDPieceConfig(width=1024, depth=24, heads=16),
}


def variant_of(config: OneDPieceConfig) -> str | None:
    """'S', 'B' or 'L' when `config` is a released variant, else None."""
    for name, cfg in VARIANTS.items():
        if cfg == config:
            return name
    return None


def tiny_config(**overrides: object) -> OneDPieceConfig:
    """A small configuration for tests and examples: 32-px crops, 16 tokens, millisecond
    forward passes. Loads through the same code as S/B/L (shapes are inferred)."""
    base = OneDPieceConfig(
        width=64,
        depth=1,
        heads=1,
        image_size=32,
        patch_size=8,
        num_latent_tokens=16,
        token_size=4,
        codebook_size=64,
        pixel_codebook_size=32,
        pixel_z_channels=32,
        pixel_hidden=32,
        pixel_channel_mult=(1, 1, 1, 1),
        pixel_res_blocks=1,
        pixel_mid_blocks=1,
    )
    return replace(base, **overrides)  # type: ignore[arg-type]  # overrides: config fields by name


# --------------------------------------------------------------------------- ViT parts


class SelfAttention(nn.Module):
    """Multi-head self-attention with nn.MultiheadAttention's parameter layout (stacked
    [q;k;v] in_proj, out_proj), run through scaled_dot_product_attention for speed."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * width, width))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * width))
        self.out_proj = nn.Linear(width, width)
        if not self.in_proj_weight.is_meta:
            nn.init.xavier_uniform_(self.in_proj_weight)
            nn.init.zeros_(self.in_proj_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, w = x.shape
        qkv = F.linear(x, self.in_proj_weight, self.in_proj_bias)
        q, k, v = qkv.view(b, n, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)  # scale 1/sqrt(head_dim), as MHA
        return self.out_proj(out.transpose(1, 2).reshape(b, n, w))


class ResidualAttentionBlock(nn.Module):
    """Pre-norm transformer block: x += attn(ln_1(x)); x += mlp(ln_2(x))."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = SelfAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            OrderedDict(
                c_fc=nn.Linear(width, 4 * width),
                gelu=nn.GELU(),  # exact erf form
                c_proj=nn.Linear(4 * width, width),
            )
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def _embedding(*shape: int) -> nn.Parameter:
    p = nn.Parameter(torch.empty(*shape))
    if not p.is_meta:
        nn.init.normal_(p, std=shape[-1] ** -0.5)
    return p


class Encoder(nn.Module):
    def __init__(self, cfg: OneDPieceConfig) -> None:
        super().__init__()
        w, g = cfg.width, cfg.grid
        self.cfg = cfg
        self.patch_embed = nn.Conv2d(3, w, cfg.patch_size, stride=cfg.patch_size)
        self.class_embedding = _embedding(1, w)
        self.positional_embedding = _embedding(g * g + 1, w)
        self.latent_token_positional_embedding = _embedding(cfg.num_latent_tokens, w)
        self.ln_pre = nn.LayerNorm(w)
        self.transformer = nn.ModuleList(ResidualAttentionBlock(w, cfg.heads) for _ in range(cfg.depth))
        self.ln_post = nn.LayerNorm(w)
        self.conv_out = nn.Conv2d(w, cfg.token_size, 1)

    def forward(self, x: torch.Tensor, latent_tokens: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) in [0, 1] -> continuous codes (B, token_size, 1, N)."""
        cfg = self.cfg
        b = x.shape[0]
        patches = self.patch_embed(x).flatten(2).transpose(1, 2)  # row-major patches
        cls = self.class_embedding.to(patches.dtype).expand(b, 1, -1)
        h = torch.cat([cls, patches], dim=1) + self.positional_embedding.to(patches.dtype)
        lat = (latent_tokens + self.latent_token_positional_embedding).to(h.dtype)
        h = torch.cat([h, lat.unsqueeze(0).expand(b, -1, -1)], dim=1)
        h = self.ln_pre(h)
        for block in self.transformer:
            h = block(h)
        lat = self.ln_post(h[:, 1 + cfg.grid * cfg.grid :])  # (B, N, W)
        # Upstream quirk: a raw reshape, NOT a permute; conv_out was trained on this layout.
        lat = lat.reshape(b, cfg.width, cfg.num_latent_tokens, 1)
        z = self.conv_out(lat)  # (B, token_size, N, 1)
        return z.reshape(b, cfg.token_size, 1, cfg.num_latent_tokens)


class VectorQuantizer(nn.Module):
    """Nearest code by cosine similarity: codes and inputs are both L2-normalised."""

    def __init__(self, codebook_size: int, dim: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(codebook_size, dim)

    def ids(self, z: torch.Tensor) -> torch.Tensor:
        """(B, C, 1, N) continuous codes -> (B, N) int64 token ids. Always fp32."""
        with _no_autocast(z.device):
            b, c, _, n = z.shape
            v = F.normalize(z.float().permute(0, 2, 3, 1).reshape(-1, c), dim=-1)
            book = F.normalize(self.embedding.weight.float(), dim=-1)
            # The squared-distance form upstream uses, so near-ties break the same way.
            d = v.pow(2).sum(1, keepdim=True) + book.pow(2).sum(1) - 2 * (v @ book.t())
            return d.argmin(dim=1).view(b, n)

    def codes(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, k) ids -> normalised codes (B, C, 1, k) for the decoder."""
        with _no_autocast(ids.device):
            rows = F.normalize(self.embedding.weight.float()[ids], dim=-1)  # (B, k, C)
            return rows.permute(0, 2, 1).unsqueeze(2)


class ViTDecoder(nn.Module):
    def __init__(self, cfg: OneDPieceConfig) -> None:
        super().__init__()
        w, g = cfg.width, cfg.grid
        self.cfg = cfg
        self.decoder_embed = nn.Linear(cfg.token_size, w)
        self.class_embedding = _embedding(1, w)
        self.positional_embedding = _embedding(g * g + 1, w)
        self.mask_token = _embedding(1, 1, w)
        self.latent_token_positional_embedding = _embedding(cfg.num_latent_tokens, w)
        self.ln_pre = nn.LayerNorm(w)
        self.transformer = nn.ModuleList(ResidualAttentionBlock(w, cfg.heads) for _ in range(cfg.depth))
        self.ln_post = nn.LayerNorm(w)
        self.ffn = nn.Sequential(
            nn.Conv2d(w, 2 * w, 1), nn.Tanh(), nn.Conv2d(2 * w, cfg.pixel_codebook_size, 1)
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """Codes (B, C, 1, k), any 1 <= k <= N -> proxy-code logits (B, 1024, g, g).

        Dropped tokens are simply absent: the sequence is [cls, g*g queries, k latents]."""
        cfg = self.cfg
        b, c, _, k = z.shape
        lat = self.decoder_embed(z.reshape(b, c, k).permute(0, 2, 1))
        lat = lat + self.latent_token_positional_embedding[:k].to(lat.dtype)
        queries = self.mask_token.to(lat.dtype).expand(b, cfg.grid * cfg.grid, -1)
        cls = self.class_embedding.to(lat.dtype).expand(b, 1, -1)
        queries = torch.cat([cls, queries], dim=1) + self.positional_embedding.to(lat.dtype)
        h = self.ln_pre(torch.cat([queries, lat], dim=1))
        for block in self.transformer:
            h = block(h)
        h = self.ln_post(h[:, 1 : 1 + cfg.grid * cfg.grid])
        h = h.permute(0, 2, 1).reshape(b, cfg.width, cfg.grid, cfg.grid)  # a real permute here
        return self.ffn(h)


# --------------------------------------------------------------------------- pixel decoder


def _group_norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(32, channels, eps=1e-6)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.norm1 = _group_norm(cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.norm2 = _group_norm(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.nin_shortcut = nn.Conv2d(cout, cout, 1, bias=False) if cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        if self.nin_shortcut is None:
            return x + h
        # Upstream quirk: the shortcut takes h, not x (x has the wrong channel count).
        return h + self.nin_shortcut(h)


class UpLevel(nn.Module):
    def __init__(self, cin: int, cout: int, blocks: int, upsample: bool) -> None:
        super().__init__()
        self.block = nn.ModuleList(ResnetBlock(cin if i == 0 else cout, cout) for i in range(blocks))
        self.upsample_conv = nn.Conv2d(cout, cout, 3, padding=1) if upsample else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.block:
            x = block(x)
        if self.upsample_conv is not None:
            x = self.upsample_conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))
        return x


class PixelDecoder(nn.Module):
    """MaskGIT-VQGAN decoder (open-muse port). Its TF-style 'same' padding equals k//2 for
    the stride-1 convs used here."""

    def __init__(self, cfg: OneDPieceConfig) -> None:
        super().__init__()
        mult = cfg.pixel_channel_mult
        block_in = cfg.pixel_hidden * mult[-1]
        self.conv_in = nn.Conv2d(cfg.pixel_z_channels, block_in, 3, padding=1)
        self.mid = nn.ModuleList(ResnetBlock(block_in, block_in) for _ in range(cfg.pixel_mid_blocks))
        levels: list[UpLevel] = []
        for i in reversed(range(len(mult))):
            block_out = cfg.pixel_hidden * mult[i]
            levels.append(UpLevel(block_in, block_out, cfg.pixel_res_blocks, upsample=i > 0))
            block_in = block_out
        # Stored as up.0 (finest) .. up.{n-1} (coarsest); run coarsest first.
        self.up = nn.ModuleList(reversed(levels))
        self.norm_out = _group_norm(block_in)
        self.conv_out = nn.Conv2d(block_in, 3, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        for block in self.mid:
            h = block(h)
        for level in reversed(self.up):
            h = level(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class _PixelCodebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(size, dim)


# --------------------------------------------------------------------------- the tokenizer


class OneDPiece(nn.Module):
    """The tokenizer. `encode` -> ids (B, N); `decode(ids[:, :k])` -> RGB (B, 3, H, W)."""

    def __init__(self, cfg: OneDPieceConfig) -> None:
        super().__init__()
        cfg.check()
        self.cfg = cfg
        self.latent_tokens = _embedding(cfg.num_latent_tokens, cfg.width)
        self.encoder = Encoder(cfg)
        self.quantize = VectorQuantizer(cfg.codebook_size, cfg.token_size)
        self.decoder = ViTDecoder(cfg)
        self.pixel_quantize = _PixelCodebook(cfg.pixel_codebook_size, cfg.pixel_z_channels)
        self.pixel_decoder = PixelDecoder(cfg)

    def encode_continuous(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) in [0, 1] -> pre-quantisation codes (B, token_size, 1, N)."""
        return self.encoder(x, self.latent_tokens)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) in [0, 1] -> token ids (B, N), int64."""
        return self.quantize.ids(self.encode_continuous(x))

    def decode_codes(self, z: torch.Tensor) -> torch.Tensor:
        """Normalised codes (B, C, 1, k) -> RGB (B, 3, H, W), unclamped."""
        logits = self.decoder(z.to(self.decoder.decoder_embed.weight.dtype))
        probs = logits.softmax(dim=1)
        book = self.pixel_quantize.embedding.weight
        pixel_z = torch.einsum("nchw,cd->ndhw", probs, book.to(probs.dtype))
        return self.pixel_decoder(pixel_z)

    def decode(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids (B, k), 1 <= k <= N: any prefix of `encode`'s output -> RGB, unclamped."""
        k = ids.shape[-1]
        if ids.dim() == 3:  # upstream's (B, 1, k)
            ids = ids[:, 0]
        if not 1 <= k <= self.cfg.num_latent_tokens:
            raise ValueError(f"decode: {k} tokens; this model takes 1..{self.cfg.num_latent_tokens}")
        return self.decode_codes(self.quantize.codes(ids))


def build(cfg: OneDPieceConfig, device: str | torch.device = "cpu") -> OneDPiece:
    """The model with random weights; on device 'meta' it allocates nothing."""
    with torch.device(device):
        return OneDPiece(cfg).eval()


def parameter_groups(model: nn.Module) -> dict[str, int]:
    """Parameter counts per top-level key group (`encoder`, `decoder`, `pixel_decoder`, ...)
    and in total, the way the notes tabulate them."""
    groups: dict[str, int] = {}
    for name, p in model.named_parameters():
        top = name.split(".", 1)[0]
        groups[top] = groups.get(top, 0) + p.numel()
    groups["total"] = sum(groups.values())
    return groups


@contextlib.contextmanager
def _no_autocast(device: torch.device) -> Iterator[None]:
    with torch.autocast(device_type=device.type, enabled=False):
        yield


def autocast(device: torch.device, dtype: str) -> contextlib.AbstractContextManager[None]:
    """bf16 autocast for the networks when dtype == 'bf16'; the quantizer opts out itself."""
    if dtype == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def head_count(width: int) -> int:
    """Heads for a width: the released variants all use 64-dim heads."""
    return max(1, width // 64) if width % 64 == 0 else 1


__all__ = [
    "VARIANTS",
    "OneDPiece",
    "OneDPieceConfig",
    "autocast",
    "build",
    "head_count",
    "parameter_groups",
    "tiny_config",
    "variant_of",
]
