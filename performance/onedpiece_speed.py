"""One-D-Piece throughput: crops/s for encode and decode, and the cost of a token-budget sweep.

    .venv/bin/python performance/onedpiece_speed.py                      # CPU: S, fp32, batch 1/4/16
    .venv/bin/python performance/onedpiece_speed.py --device cuda:0      # GPU: S/B/L, fp32 and bf16
    .venv/bin/python performance/onedpiece_speed.py --ckpt /w/pytorch_model.bin

Without --ckpt the weights are random (speed does not depend on their values). Decode is
timed at --nlatent tokens (the ViT decoder's cost grows with k; the pixel decoder, which
dominates S and B, does not). The sweep line compares one Reconstructor pass over the same
crops with budgets (48) against (16, 32, 64, 128, 256): the encoder runs once in both.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_satbench.codecs.onedpiece.checkpoint import load_model
from pytest_satbench.codecs.onedpiece.engine import Reconstructor
from pytest_satbench.codecs.onedpiece.model import VARIANTS, OneDPiece, autocast, build


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, repeat: int) -> float:
    """Best-of-`repeat` seconds for fn(), after one warm-up call."""
    fn()
    sync(device)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def model_for(variant: str, ckpt: Path | None) -> OneDPiece:
    if ckpt is not None:
        model, info = load_model(ckpt)
        if info.variant != variant:
            raise SystemExit(f"{ckpt} is One-D-Piece-{info.variant}, not {variant}")
        return model
    torch.manual_seed(0)
    return build(VARIANTS[variant]).requires_grad_(False)


def throughput_row(
    model: OneDPiece, variant: str, dtype: str, b: int, device: torch.device, args: argparse.Namespace
) -> str:
    x = torch.rand(b, 3, 256, 256, device=device)
    with torch.inference_mode(), autocast(device, dtype):
        ids = model.encode(x)
        t_enc = timed(lambda: model.encode(x), device, args.repeat)
        t_dec = timed(lambda: model.decode(ids[:, : args.nlatent]), device, args.repeat)
    return f"| {variant} | {dtype} | {b} | {b / t_enc:.2f} | {b / t_dec:.2f} | {b / (t_enc + t_dec):.2f} |"


def sweep_row(
    model: OneDPiece, variant: str, dtype: str, sweep: list[int], device: torch.device, args: argparse.Namespace
) -> str:
    """Sweep cost, two ways: end to end through the Reconstructor (one pass each), and from
    best-of timings of the parts, which is steadier on a shared machine."""
    b = args.sweep_batch
    crops = np.random.default_rng(0).integers(0, 256, (b, 256, 256, 3), dtype=np.uint8)
    one = Reconstructor(model, [args.nlatent], device=device, dtype=dtype, batch=b)
    many = Reconstructor(model, sweep, device=device, dtype=dtype, batch=b)
    t_one = timed(lambda: one.run(crops), device, 1)
    t_many = timed(lambda: many.run(crops), device, 1)
    x = torch.rand(b, 3, 256, 256, device=device)
    with torch.inference_mode(), autocast(device, dtype):
        ids = model.encode(x)
        enc = timed(lambda: model.encode(x), device, args.repeat)
        dec = {
            k: timed(lambda k=k: model.decode(ids[:, :k]), device, args.repeat)
            for k in sorted({args.nlatent, *sweep})
        }
    parts = (enc + sum(dec[k] for k in sweep)) / (enc + dec[args.nlatent])
    naive = (len(sweep) * enc + sum(dec[k] for k in sweep)) / (enc + dec[args.nlatent])
    return (
        f"| {variant} | {dtype} | {b} crops | {t_one:.2f} s | {t_many:.2f} s | {t_many / t_one:.2f}x "
        f"| {parts:.2f}x | {naive:.2f}x |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--variants", default=None, help="comma list; default S on cpu, S,B,L on cuda")
    ap.add_argument("--dtypes", default=None, help="comma list; default fp32 on cpu, fp32,bf16 on cuda")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--nlatent", type=int, default=48)
    ap.add_argument("--sweep", default="16,32,64,128,256")
    ap.add_argument("--sweep-batch", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--ckpt", type=Path, default=None, help="a real checkpoint (its variant only)")
    args = ap.parse_args()

    device = torch.device(args.device)
    gpu = device.type == "cuda"
    variants = (args.variants or ("S,B,L" if gpu else "S")).split(",")
    dtypes = (args.dtypes or ("fp32,bf16" if gpu else "fp32")).split(",")
    batches = [int(b) for b in args.batches.split(",")]
    sweep = [int(k) for k in args.sweep.split(",")]

    where = torch.cuda.get_device_name(device) if gpu else f"{platform.processor() or 'cpu'}, {torch.get_num_threads()} threads"
    print(f"# One-D-Piece speed on {device} ({where}), torch {torch.__version__}, "
          f"{'checkpoint ' + str(args.ckpt) if args.ckpt else 'random weights'}")
    print()
    print(f"| variant | dtype | batch | encode crops/s | decode crops/s (k={args.nlatent}) | encode+decode crops/s |")
    print("|---|---|---|---|---|---|")
    sweep_rows: list[str] = []
    for variant in variants:
        model = model_for(variant, args.ckpt).to(device)
        for dtype in dtypes:
            for b in batches:
                print(throughput_row(model, variant, dtype, b, device, args), flush=True)
            sweep_rows.append(sweep_row(model, variant, dtype, sweep, device, args))
        del model
        if gpu:
            torch.cuda.empty_cache()
    print()
    print(f"Sweep: budgets {sweep} vs a single budget ({args.nlatent}); encoder once per crop in both.")
    print()
    print(f"| variant | dtype | work | 1 budget | {len(sweep)} budgets | ratio | ratio from parts "
          "| if re-encoding per budget |")
    print("|---|---|---|---|---|---|---|---|")
    for row in sweep_rows:
        print(row)


if __name__ == "__main__":
    main()
