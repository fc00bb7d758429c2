"""The demo benchmark's data: generated aerial-like scenes written in the RSVQA-LR format.

Each scene is a 256x256 uint8 RGB image of textured bare ground with axis-aligned grey roads,
blue water areas, dark-green forests, light-green grass areas and small red/orange buildings.
The answers come from what the generator drew, so they are exact; the bundled reference
server (`pytest_satbench.server`) answers from the pixels alone. About a third of the
buildings are 3x3 px, small enough that a strong lossy codec (JPEG quality 10, a 4x
downsampling) smears or drops them, which is what makes the demo show a codec's cost.

Files are written exactly as RSVQA-LR ships them (see `datasets/rsvqa.py`), so
the demo goes through the real RSVQA loader: `LR_split_test_questions.json` and
`LR_split_test_answers.json` with leading `{"id": i, "active": false}` stubs and one
inactive-but-complete record of "another split", `LR_split_test_images.json`, and
`Images_LR/<img_id>.tif`.
"""

from __future__ import annotations

import io
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

# Bump whenever the generated content changes: the marker check would otherwise keep stale
# files, and question keys (pytest node ids) are only stable within one version, which is
# why the data directory is named after it.
DEMO_VERSION = 1
SIZE = 256
N_STUBS = 5  # leading `{"id": i, "active": false}` records, as in the real split files
_MARKER = ".satbench-demo.json"
_DATE0 = 1569489630.7  # a fixed "date_added" so that every write is byte-identical

OBJECTS = ("building", "road", "water area", "forest", "grass area")
PLURAL = {o: o + "s" for o in OBJECTS}
URBAN_MIN_BUILDINGS = 10  # the ground truth's rural/urban rule

_GROUND = (166, 158, 112)
_WATER = (48, 88, 152)
_FOREST = (38, 96, 44)
_GRASS = (136, 178, 72)
_ROAD = (104, 104, 108)
_ROOFS = ((214, 52, 40), (222, 96, 40), (184, 36, 48))


@dataclass(frozen=True, slots=True)
class Scene:
    pixels: np.ndarray  # (256, 256, 3) uint8
    counts: dict[str, int]  # what was drawn, per object

    @property
    def area_type(self) -> str:
        return "urban" if self.counts["building"] >= URBAN_MIN_BUILDINGS else "rural"


def _dilate(mask: np.ndarray, r: int) -> np.ndarray:
    """Square dilation by `r` px, separable: OR of shifted copies along each axis."""
    h, w = mask.shape
    padded = np.pad(mask, r)
    rows = np.zeros((h + 2 * r, w), dtype=bool)
    for d in range(2 * r + 1):
        rows |= padded[:, d : d + w]
    out = np.zeros((h, w), dtype=bool)
    for d in range(2 * r + 1):
        out |= rows[d : d + h]
    return out


def _smooth_noise(rng: np.random.Generator, amp: float, cells: int = 8) -> np.ndarray:
    coarse = rng.uniform(-amp, amp, size=(cells, cells)).astype(np.float32)
    img = Image.fromarray(coarse, mode="F").resize((SIZE, SIZE), Image.Resampling.BILINEAR)
    return np.asarray(img, dtype=np.float32)


def _blob(rng: np.random.Generator, yy: np.ndarray, xx: np.ndarray) -> np.ndarray:
    """A connected irregular patch: a union of ellipses whose centres lie inside the first."""
    r = rng.uniform(12, 26)
    cy, cx = rng.uniform(r + 4, SIZE - r - 4, size=2)
    mask = np.zeros((SIZE, SIZE), dtype=bool)
    for k in range(int(rng.integers(2, 5))):
        oy, ox = (0.0, 0.0) if k == 0 else rng.uniform(-0.45 * r, 0.45 * r, size=2)
        ry, rx = rng.uniform(0.55 * r, r, size=2)
        mask |= ((yy - cy - oy) / ry) ** 2 + ((xx - cx - ox) / rx) ** 2 <= 1.0
    return mask


def generate_scene(seed: int, index: int) -> Scene:
    """Scene `index` of the demo with `seed`; the same arguments give the same pixels."""
    rng = np.random.default_rng([seed, index, DEMO_VERSION])
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    img = np.empty((SIZE, SIZE, 3), dtype=np.float32)
    img[:] = _GROUND
    img += _smooth_noise(rng, 12.0)[..., None]
    occupied = np.zeros((SIZE, SIZE), dtype=bool)
    counts = dict.fromkeys(OBJECTS, 0)
    # Mostly alternating, so any 10+ images hold both area types; sometimes random.
    urban = index % 2 == 1 if rng.random() < 0.8 else bool(rng.random() < 0.5)

    # Roads: full-span, 3 px wide, at least 30 px apart so they never read as one.
    for axis in (0, 1):
        n = int(rng.integers(0, 3 if urban else 2))
        used: list[int] = []
        for _ in range(n):
            for _try in range(20):
                p = int(rng.integers(12, SIZE - 15))
                if all(abs(p - q) >= 30 for q in used):
                    used.append(p)
                    band = np.zeros((SIZE, SIZE), dtype=bool)
                    if axis == 0:
                        band[p : p + 3, :] = True
                    else:
                        band[:, p : p + 3] = True
                    img[band] = _ROAD
                    occupied |= band
                    counts["road"] += 1
                    break

    # Areas: separated by >= 6 px from everything, so each is exactly one patch.
    for name, colour, hi in (("water area", _WATER, 3), ("forest", _FOREST, 3),
                             ("grass area", _GRASS, 3)):
        for _ in range(int(rng.integers(0, hi))):
            for _try in range(30):
                m = _blob(rng, yy, xx)
                if not (m & _dilate(occupied, 6)).any():
                    img[m] = colour
                    occupied |= m
                    counts[name] += 1
                    break

    # Buildings: 3 px apart; a third are 3x3 px, the ones a lossy codec loses first
    # (3 px, not 2: a 2x2 roof can straddle JPEG 4:2:0 chroma cells and fade even at q95).
    n_buildings = int(rng.integers(14, 31) if urban else rng.integers(0, 7))
    forbidden = _dilate(occupied, 3)
    for _ in range(n_buildings):
        for _try in range(60):
            small = rng.random() < 0.35
            h, w = (np.array([3, 3]) if small else rng.integers(4, 8, size=2))
            y, x = int(rng.integers(2, SIZE - h - 2)), int(rng.integers(2, SIZE - w - 2))
            if forbidden[y : y + h, x : x + w].any():
                continue
            img[y : y + h, x : x + w] = _ROOFS[int(rng.integers(len(_ROOFS)))]
            rect = np.zeros((SIZE, SIZE), dtype=bool)
            rect[y : y + h, x : x + w] = True
            forbidden |= _dilate(rect, 3)
            counts["building"] += 1
            break

    img += rng.normal(0.0, 3.0, size=img.shape).astype(np.float32)
    pixels = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    return Scene(pixels=pixels, counts=counts)


def _questions_for(scene: Scene, rng: np.random.Generator) -> list[tuple[str, str, str]]:
    """(type, question, answer) for one scene, with RSVQA's templates."""

    def where(text: str) -> str:
        # ~10% of RSVQA questions say " in the image" before the "?"
        return text[:-1] + " in the image?" if rng.random() < 0.1 else text

    def pick(options: tuple[str, ...] | list[str]) -> str:
        return options[int(rng.integers(len(options)))]

    c = scene.counts
    out: list[tuple[str, str, str]] = [
        ("rural_urban", "Is it a rural or an urban area", scene.area_type)
    ]
    for obj in rng.permutation(OBJECTS)[:3]:
        obj = str(obj)
        tpl = pick(("Is there a {x}?", "Is a {x} present?"))
        out.append(("presence", where(tpl.format(x=obj)), "yes" if c[obj] else "no"))
    others = [str(o) for o in rng.permutation(OBJECTS[1:])[:2]]
    for obj in ["building", *others]:
        tpl = pick(("How many {xs} are there?", "What is the number of {xs}?",
                    "What is the amount of {xs}?"))
        out.append(("count", where(tpl.format(xs=PLURAL[obj])), str(c[obj])))
    for _ in range(3):
        a, b = (str(o) for o in rng.permutation(OBJECTS)[:2])
        rel = pick(("more", "less", "equal"))
        if rel == "equal":
            text = f"Is the number of {PLURAL[a]} equal to the number of {PLURAL[b]}?"
            truth = c[a] == c[b]
        else:
            text = f"Are there {rel} {PLURAL[a]} than {PLURAL[b]}?"
            truth = c[a] > c[b] if rel == "more" else c[a] < c[b]
        out.append(("comp", where(text), "yes" if truth else "no"))
    return out


def _build(n_images: int, seed: int) -> tuple[dict[str, Any], list[tuple[int, np.ndarray]]]:
    questions: list[dict[str, Any]] = [{"id": i, "active": False} for i in range(N_STUBS)]
    answers: list[dict[str, Any]] = [{"id": i, "active": False} for i in range(N_STUBS)]
    images_meta: list[dict[str, Any]] = []
    images: list[tuple[int, np.ndarray]] = []
    rng = np.random.default_rng([seed, 7919, DEMO_VERSION])

    def add(img_id: int, qtype: str, text: str, answer: str, active: bool) -> int:
        qid = len(questions)
        date = round(_DATE0 + qid / 10, 1)
        questions.append({"id": qid, "date_added": date, "img_id": img_id, "people_id": 0,
                          "type": qtype, "question": text, "answers_ids": [qid],
                          "active": active})
        answers.append({"id": qid, "date_added": date, "question_id": qid, "people_id": 0,
                        "answer": answer, "active": active})
        return qid

    for img_id in range(n_images):
        scene = generate_scene(seed, img_id)
        images.append((img_id, scene.pixels))
        ids = [add(img_id, t, q, a, True) for t, q, a in _questions_for(scene, rng)]
        images_meta.append({"id": img_id, "date_added": _DATE0, "original_name": f"demo_{img_id}",
                            "people_id": 0, "questions_ids": ids, "active": True})
        if img_id == 0:
            # A complete record that belongs to "another split": proves that loaders filter
            # on `active` rather than on the presence of keys.
            add(img_id, "presence", "Is there a road?", "no", False)
    docs = {
        "LR_split_test_questions.json": {"questions": questions},
        "LR_split_test_answers.json": {"answers": answers},
        "LR_split_test_images.json": {"images": images_meta},
    }
    return docs, images


def _atomic_write(path: Path, data: bytes) -> None:
    # Unique temp name per process and thread: concurrent preparers (xdist workers) write
    # identical bytes, and os.replace makes each file appear whole or not at all.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_demo_dataset(root: Path, *, n_images: int = 40, seed: int = 0) -> Path:
    """Write the demo benchmark under `root` (if not already there) and return `root`.

    Idempotent: a marker file naming the version, image count and seed is written last, so
    a complete earlier write is kept and an interrupted one is redone.
    """
    root = Path(root)
    if n_images < 1:
        raise ValueError(f"write_demo_dataset: n_images must be >= 1, got {n_images}")
    want = {"version": DEMO_VERSION, "n_images": n_images, "seed": seed}
    marker = root / _MARKER
    try:
        if json.loads(marker.read_text()) == want:
            return root
    except (OSError, ValueError):
        pass
    (root / "Images_LR").mkdir(parents=True, exist_ok=True)
    docs, images = _build(n_images, seed)
    for img_id, pixels in images:
        buf = io.BytesIO()
        Image.fromarray(pixels, mode="RGB").save(buf, format="TIFF")
        _atomic_write(root / "Images_LR" / f"{img_id}.tif", buf.getvalue())
    for name, doc in docs.items():
        _atomic_write(root / name, json.dumps(doc).encode())
    _atomic_write(marker, json.dumps(want).encode())
    return root
