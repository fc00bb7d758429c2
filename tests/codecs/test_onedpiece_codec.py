"""`--recon onedpiece:...`: spec normalisation, grouping of token budgets into one codec,
reconstruction through tiling, one encoder pass per crop, thread safety, identity hash."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from PIL import Image

from pytest_satbench.codecs.base import SpecError, build_codecs, normalise_spec
from pytest_satbench.codecs.onedpiece import checkpoint as ckpt_mod
from pytest_satbench.codecs.onedpiece import codec as opd
from pytest_satbench.codecs.onedpiece.checkpoint import (
    load_model,
    save_random_checkpoint,
)
from pytest_satbench.codecs.onedpiece.engine import Reconstructor, device_lock
from pytest_satbench.codecs.onedpiece.model import tiny_config
from pytest_satbench.codecs.onedpiece.tiling import TileLayout


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny.bin", tiny_config(), seed=1)


@pytest.fixture(autouse=True)
def _hash_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    ckpt_mod._hash_memo.clear()


def picture(w: int, h: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


def test_canonical_spec(tiny_ckpt: Path) -> None:
    spec = normalise_spec(f"onedpiece:nlatent=8,ckpt={tiny_ckpt},device=cpu,batch=2")
    assert spec.canonical == (
        f"onedpiece:ckpt={tiny_ckpt.resolve()},dtype=fp32,max_tiles=12,nlatent=8,variant=custom"
    )
    # device and batch decide where/how fast, not the pixels.
    assert normalise_spec(f"onedpiece:ckpt={tiny_ckpt},nlatent=8") == spec
    assert normalise_spec(f"onedpiece:ckpt={tiny_ckpt},nlatent=8,dtype=bf16") != spec


def test_device_and_batch_travel_on_the_spec(tiny_ckpt: Path) -> None:
    """No module-level state: what `build` gets is what the spec says, per spec."""
    fast = normalise_spec(f"onedpiece:ckpt={tiny_ckpt},nlatent=4,device=cpu,batch=3")
    plain = normalise_spec(f"onedpiece:ckpt={tiny_ckpt},nlatent=8")
    assert fast.runtime == (("batch", "3"), ("device", "cpu")) and plain.runtime == ()
    assert "device" not in fast.canonical and "batch" not in fast.canonical
    # Normalising another spec of the same checkpoint later does not change the first.
    normalise_spec(f"onedpiece:ckpt={tiny_ckpt},nlatent=4,batch=7")
    default = opd.default_device()
    codecs = build_codecs([fast, plain])
    try:
        assert [(c.device, c.engine.batch) for c in codecs] == [
            ("cpu", 3),
            (default, 16 if default.startswith("cuda") else 4),
        ]
    finally:
        for c in codecs:
            c.close()
    # Budgets asked to run in one place still share one codec.
    (both,) = build_codecs([fast, normalise_spec(f"onedpiece:ckpt={tiny_ckpt},nlatent=8,device=cpu,batch=3")])
    both.close()
    assert len(both.arms) == 2


def test_ckpt_from_environment(tiny_ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(opd.ENV_CKPT, str(tiny_ckpt))
    assert normalise_spec("onedpiece:nlatent=4").param("ckpt") == str(tiny_ckpt.resolve())
    monkeypatch.delenv(opd.ENV_CKPT)
    with pytest.raises(SpecError, match=f"ckpt=PATH is required.*{opd.ENV_CKPT}"):
        normalise_spec("onedpiece:nlatent=4")


@pytest.mark.parametrize(
    ("extra", "pattern"),
    [
        ("nlatent=0", "nlatent=0 is out of range 1..256"),
        ("nlatent=17", "nlatent=17 but .* has 16 tokens per crop"),
        ("nlatent=abc", "not an integer"),
        ("dtype=fp16", "dtype='fp16' must be fp32 or bf16"),
        ("variant=XL", "variant='XL' must be S, B or L"),
        ("variant=S", r"not One-D-Piece-S: latent_tokens has shape \(16, 64\)"),
        ("device=gpu0", "device='gpu0' is not a torch device"),
        ("colour=red", "unknown parameter 'colour'"),
    ],
)
def test_bad_specs_are_one_line(tiny_ckpt: Path, extra: str, pattern: str) -> None:
    with pytest.raises(SpecError, match=pattern) as err:
        normalise_spec(f"onedpiece:ckpt={tiny_ckpt},{extra}")
    assert "\n" not in str(err.value)


def test_missing_checkpoint_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such checkpoint file") as err:
        normalise_spec(f"onedpiece:ckpt={tmp_path}/absent.bin")
    assert str(tmp_path / "absent.bin") in str(err.value) and "\n" not in str(err.value)


def test_budgets_share_one_codec_and_one_encoder_pass(tiny_ckpt: Path) -> None:
    specs = [normalise_spec(f"onedpiece:ckpt={tiny_ckpt},nlatent={k}") for k in (4, 8, 16)]
    bf16 = normalise_spec(f"onedpiece:ckpt={tiny_ckpt},nlatent=4,dtype=bf16")
    codecs = build_codecs(specs + [bf16])
    try:
        assert [len(c.arms) for c in codecs] == [3, 1]
        sweep = codecs[0]
        assert isinstance(sweep, opd.OneDPieceCodec) and sweep.disk_cacheable
        image = picture(90, 50)  # 9:5 -> 2x1 grid of 32-px crops
        outs = sweep.reconstruct(image)
        layout = TileLayout.for_size(image.size, 12, 32)
        assert [o.size for o in outs] == [layout.canvas_size] * 3 == [sweep.output_size(image.size)] * 3
        assert all(o.mode == "RGB" for o in outs)
        assert sweep.engine.stats.crops_encoded == layout.count  # once, not once per budget
        assert sweep.engine.stats.crops_decoded == 3 * layout.count
        assert sweep.tokens_for(image.size) == {s.canonical: k * layout.count for s, k in zip(specs, (4, 8, 16))}
        # Each arm equals what a single-budget codec makes, and budgets differ.
        single = build_codecs([specs[1]])[0]
        try:
            assert np.array_equal(np.asarray(single.reconstruct(image)[0]), np.asarray(outs[1]))
        finally:
            single.close()
        assert not np.array_equal(np.asarray(outs[0]), np.asarray(outs[2]))
    finally:
        for c in codecs:
            c.close()


def test_reconstruction_equals_the_model_on_each_crop(tiny_ckpt: Path) -> None:
    spec = normalise_spec(f"onedpiece:ckpt={tiny_ckpt},nlatent=5,max_tiles=4")
    (codec,) = build_codecs([spec])
    model, _ = load_model(tiny_ckpt)
    image = picture(70, 130, seed=2)
    try:
        out = np.asarray(codec.reconstruct(image)[0])
    finally:
        codec.close()
    layout = TileLayout.for_size(image.size, 4, 32)
    assert layout.count <= 4
    crops = torch.from_numpy(layout.crops(image)).permute(0, 3, 1, 2).float() / 255
    with torch.inference_mode():
        rgb = model.decode(model.encode(crops)[:, :5]).clamp(0, 1)
    expected = (rgb * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    assert np.array_equal(out, np.asarray(layout.stitch(expected)))


def test_concurrent_callers_are_batched_and_serialised(tiny_ckpt: Path) -> None:
    specs = [normalise_spec(f"onedpiece:ckpt={tiny_ckpt},nlatent={k},batch=64") for k in (2, 16)]
    (codec,) = build_codecs(specs)
    assert isinstance(codec, opd.OneDPieceCodec)
    images = [picture(64 + 8 * i, 64, seed=i) for i in range(8)]
    expected = [[np.asarray(o) for o in codec.reconstruct(im)] for im in images]

    active, peak = [0], [0]
    guard = threading.Lock()
    model = codec.engine.model
    real_encode, real_decode = model.encode, model.decode

    def counting(fn):
        def wrapper(*a, **k):
            with guard:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            try:
                return fn(*a, **k)
            finally:
                with guard:
                    active[0] -= 1
        return wrapper

    model.encode, model.decode = counting(real_encode), counting(real_decode)
    before = codec.engine.stats.forward_batches
    # Hold the device while the callers queue up, so the worker must batch them together.
    lock = device_lock(codec.engine.device)
    with ThreadPoolExecutor(8) as pool:
        with lock:
            futures = [pool.submit(codec.reconstruct, im) for im in images]
            threading.Event().wait(0.3)  # all 8 submitted and queued behind the lock
        results = [f.result(timeout=60) for f in futures]
    codec.close()
    for got, want in zip(results, expected):
        assert all(np.array_equal(np.asarray(g), w) for g, w in zip(got, want))
    assert peak[0] == 1
    crops_per_image = [TileLayout.for_size(im.size, 12, 32).count for im in images]
    assert codec.engine.stats.largest_batch > max(crops_per_image)
    assert codec.engine.stats.forward_batches - before < len(images)


def test_closed_codec_refuses_work(tiny_ckpt: Path) -> None:
    (codec,) = build_codecs([normalise_spec(f"onedpiece:ckpt={tiny_ckpt},nlatent=3")])
    codec.close()
    with pytest.raises(RuntimeError, match="closed"):
        codec.reconstruct(picture(32, 32))


def test_engine_errors_reach_the_caller(tiny_ckpt: Path) -> None:
    model, _ = load_model(tiny_ckpt)
    engine = Reconstructor(model, [4], device="cpu")
    try:
        with pytest.raises(ValueError, match="crops must be uint8"):
            engine.submit(np.zeros((1, 31, 31, 3), np.uint8)).result(timeout=30)
        assert engine.submit(np.zeros((1, 32, 32, 3), np.uint8)).result(timeout=30).shape == (1, 1, 32, 32, 3)
    finally:
        engine.close()


def test_identity_is_checkpoint_sha256_cached_by_size_and_mtime(tiny_ckpt: Path, tmp_path: Path) -> None:
    digest = hashlib.sha256(tiny_ckpt.read_bytes()).hexdigest()
    (codec,) = build_codecs([normalise_spec(f"onedpiece:ckpt={tiny_ckpt},nlatent=3")])
    codec.close()
    assert codec.identity() == f"ckpt-sha256={digest};impl={ckpt_mod.IMPLEMENTATION_VERSION}"
    index = tmp_path / "xdg" / "pytest-satbench" / "file-sha256.json"
    table = json.loads(index.read_text())
    assert list(table.values()) == [digest]
    # A later run reads the index instead of hashing: prove it with a planted value.
    (key,) = table
    index.write_text(json.dumps({key: "0" * 64}))
    ckpt_mod._hash_memo.clear()
    assert ckpt_mod.file_sha256(tiny_ckpt) == "0" * 64
    # A touched file (new mtime) is hashed again.
    st = tiny_ckpt.stat()
    os.utime(tiny_ckpt, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert ckpt_mod.file_sha256(tiny_ckpt) == digest


def test_gpu_device_lock_excludes_other_processes() -> None:
    """xdist workers are processes: a GPU forward pass also takes a file lock, so two
    workers never run the tokenizer on one card at once. (No GPU is needed to check it.)"""
    import subprocess
    import sys

    from pytest_satbench.codecs.onedpiece.engine import DeviceLock

    lock = DeviceLock(torch.device("cuda:7"))
    probe = (
        "import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
        "try:\n"
        "    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('free')\n"
        "except BlockingIOError:\n"
        "    print('held')\n"
    )

    def other_process_sees() -> str:
        out = subprocess.run([sys.executable, "-c", probe, str(lock._path)], check=False, capture_output=True, text=True, timeout=30)
        return out.stdout.strip()

    with lock:
        assert other_process_sees() == "held"
    assert other_process_sees() == "free"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_cuda_device_without_a_gpu_is_a_spec_error(tiny_ckpt: Path) -> None:
    with pytest.raises(SpecError, match="device=cuda:0 but torch sees no CUDA device; pass device=cpu"):
        normalise_spec(f"onedpiece:ckpt={tiny_ckpt},nlatent=8,device=cuda:0")
