"""The deterministic model of the fault suite: the answer depends only on the prompt and the
image bytes sent, so a clean run and a faulty run (any server, any process) agree answer by
answer. Kept free of imports beyond the standard library: `tests/servers.py --answer-from`
loads this file by path in a server process of its own."""

from __future__ import annotations

import hashlib

ANSWERS = ("yes", "no", "urban", "rural", "403", "0", "There is no road here.")


def answer(prompt: str, has_image: bool, image: bytes | None) -> str:
    h = hashlib.sha256(prompt.encode() + b"\0" + hashlib.sha256(image or b"").digest()).digest()
    return ANSWERS[h[0] % len(ANSWERS)]
