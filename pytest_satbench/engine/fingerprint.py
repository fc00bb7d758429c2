"""What "the same question asked the same way" means.

One function decides it, and the results store, the disk cache and the protocol check all
use it. An answer is reused only when every input that can change it is the same: the
model, the sampling settings, the rendered prompt, the arm (codec spec and the codec's own
identity, e.g. its checkpoint hash) and the image bytes sent.

The image bytes sent are a deterministic function of the source image bytes, the arm and
the geometry they are sent at (JPEG quality 95, fixed resampling), so the fingerprint uses
the source bytes' sha256 and the target size instead of re-creating the bytes: resuming a
run then costs a stat per image, not a reconstruction. The actual sha256 of the bytes sent
is still recorded with every answer. Bump PIPELINE_VERSION whenever that pipeline changes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

PIPELINE_VERSION = "1"  # JPEG q95 at the reconstruction's geometry, PIL BICUBIC resize


@dataclass(frozen=True, slots=True)
class AskSettings:
    """Everything shared by every request of a run that changes an answer.

    The fields after `prompt_style` (--top-p, --request-seed, --system-prompt, --extra-body)
    enter the digest only when set: a run with none of them has the digest runs had before
    they existed, so every store written then resumes without asking anything again."""

    model: str
    max_tokens: int
    temperature: float
    prompt_style: str
    top_p: float | None = None
    seed: int | None = None  # the run's request seed (a repeated sample may send its own)
    system_prompt: str | None = None
    extra_body: str | None = None  # a JSON object, canonical (sorted keys, no spaces)

    def digest(self) -> str:
        fields = asdict(self)
        for name in _OPTIONAL:
            if fields[name] is None:
                del fields[name]
        return _digest({"pipeline": PIPELINE_VERSION, **fields})


_OPTIONAL = ("top_p", "seed", "system_prompt", "extra_body")


def arm_fingerprint(
    settings_digest: str,
    *,
    arm: str,
    codec_identity: str,
    prompt: str,
    image_sha256: str | None,
    size: tuple[int, int] | None,
) -> str:
    """The store key part for one question asked in one arm.

    `settings_digest` is `AskSettings.digest()` (computed once per run, not per question);
    `image_sha256` is the source image's hash (None for the blind arm, which sends no
    image); `size` is the geometry the image is sent at.
    """
    return _digest(
        {
            "settings": settings_digest,
            "arm": arm,
            "codec": codec_identity,
            "prompt": prompt,
            "image": image_sha256,
            "size": list(size) if size else None,
        }
    )


def _digest(obj: object) -> str:
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:32]
