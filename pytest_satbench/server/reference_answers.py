"""From a question (and maybe an image) to the reference server's answer.

Demo questions (RSVQA-LR templates about buildings, roads, water areas, forests and grass
areas) are answered from the pixels through `vision.read_scene`. Anything else gets a fixed,
documented answer that depends on the text only, which is also what every question gets
when no image is attached (the "blind" control arm, i.e. the language-prior baseline):

- a multiple-choice question (options "A." / "B." ... in the text) -> "A"
- a referring request (each prompt style's wording: "where is ...", "[refer] ...",
  Qwen's) -> "[0, 0, 1000, 1000]" (the whole image)
- a yes/no question (starts with is/are/does/do/can/...) -> "yes"
- anything else -> "unknown"

Templates are searched anywhere in the text, so a prompt style's prefix or suffix ("Answer
the question using a single word or phrase.") does not hide the question.

Sampling (`sampled`): at temperature 0 (the default) every answer is the one above. At a
temperature T > 0 the server stands in for a sampler: with probability min(T, 1) / 2 it gives
another answer (yes <-> no, a count plus one, the next option letter; other answers stay).
With a request `seed` the draw is a hash of (seed, question text), so the same seed gives the
same answer and another seed may not, as a seeded vLLM sampler would; without one it is random.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable

from pytest_satbench.server.vision import SceneReading

WHOLE_IMAGE_BOX = "[0, 0, 1000, 1000]"

_SINGULAR = {
    "building": "building", "buildings": "building",
    "road": "road", "roads": "road",
    "water area": "water area", "water areas": "water area",
    "forest": "forest", "forests": "forest",
    "grass area": "grass area", "grass areas": "grass area",
}
_OBJ = r"(?P<{}>[a-z]+(?: [a-z]+)?)"
_IN = r"(?: in the image)?\s*\?"

_RURAL_URBAN = re.compile(r"\bis it a rural or an urban area\b", re.I)
_PRESENCE = [
    re.compile(r"\bis there an? " + _OBJ.format("x") + _IN, re.I),
    re.compile(r"\bis an? " + _OBJ.format("x") + r" present" + _IN, re.I),
]
_COUNT = [
    re.compile(r"\bhow many " + _OBJ.format("x") + r" are there" + _IN, re.I),
    re.compile(r"\bwhat is the (?:number|amount) of " + _OBJ.format("x") + _IN, re.I),
]
_COMP = [
    re.compile(r"\bare there (?P<rel>more|less|fewer) " + _OBJ.format("x") + r" than "
               + _OBJ.format("y") + _IN, re.I),
    re.compile(r"\bis the number of " + _OBJ.format("x") + r" equal to the number of "
               + _OBJ.format("y") + _IN, re.I),
]
# Options "A." and "B." not glued to a word: "A. x; B. y", "(A) x (B) y", "['A. x', 'B. y']".
_MC = re.compile(r"(?<![A-Za-z0-9])\(?A[.):]\s.*?(?<![A-Za-z0-9])\(?B[.):]\s", re.S)
# Referring requests in each prompt style's wording: geocot "where is ...", GeoChat's
# "[refer] Give me the location of <p> ... </p>", Qwen2-VL's object-reference tokens and
# Qwen2.5-VL's "Locate ..., output its bbox coordinates".
_WHERE = re.compile(r"^\s*where is\b|\[refer\]|<\|object_ref_start\|>|^\s*locate\b.*\bbbox\b", re.I | re.M)
_YES_NO = re.compile(
    r"^\s*(?:is|are|does|do|did|can|could|was|were|has|have|will|would|should)\b", re.I | re.M
)

# A parsed demo question: a function of what the image shows.
Reader = Callable[[SceneReading], str]


def _obj(name: str) -> str | None:
    return _SINGULAR.get(name.lower())


def parse_demo_question(text: str) -> Reader | None:
    """The reading function for a demo question, or None when the text is not one."""
    if _RURAL_URBAN.search(text):
        return lambda s: s.area_type
    for pat in _PRESENCE:
        m = pat.search(text)
        if m and (x := _obj(m["x"])):
            return _presence(x)
    for pat in _COUNT:
        m = pat.search(text)
        if m and (x := _obj(m["x"])):
            return _count(x)
    for pat in _COMP:
        m = pat.search(text)
        if m and (x := _obj(m["x"])) and (y := _obj(m["y"])):
            return _comp(x, y, (m.groupdict().get("rel") or "equal").lower())
    return None


def _presence(x: str) -> Reader:
    def read(s: SceneReading) -> str:
        return "yes" if s.count(x) > 0 else "no"

    return read


def _count(x: str) -> Reader:
    def read(s: SceneReading) -> str:
        return str(s.count(x))

    return read


def _comp(x: str, y: str, rel: str) -> Reader:
    def read(s: SceneReading) -> str:
        a, b = s.count(x), s.count(y)
        holds = a > b if rel == "more" else a == b if rel == "equal" else a < b
        return "yes" if holds else "no"

    return read


def fallback_answer(text: str) -> str:
    """The fixed answer for a question the server cannot (or, blind, may not) look at."""
    if _MC.search(text):
        return "A"
    if _WHERE.search(text):
        return WHOLE_IMAGE_BOX
    if _YES_NO.search(text):
        return "yes"
    return "unknown"


def answer(text: str, scene: Callable[[], SceneReading] | None) -> str:
    """Answer `text`; `scene` reads the attached image lazily (None: no image attached)."""
    reader = parse_demo_question(text)
    if reader is None or scene is None:
        return fallback_answer(text)
    return reader(scene())


def sampled(content: str, text: str, temperature: float, seed: int | None) -> str:
    """`content` as a sampler at `temperature` with `seed` would answer it (module docstring)."""
    if not temperature > 0:
        return content
    if seed is None:
        u = random.random()
    else:
        digest = hashlib.sha256(f"{seed}\0{text}".encode()).digest()
        u = int.from_bytes(digest[:8], "big") / 2**64
    if u >= min(temperature, 1.0) / 2:
        return content
    return _other(content)


def _other(content: str) -> str:
    """Another plausible answer of the same kind, or `content` itself where there is none."""
    low = content.strip().lower()
    if low in ("yes", "no"):
        return "no" if low == "yes" else "yes"
    if low.isdigit():
        return str(int(low) + 1)
    if len(low) == 1 and "a" <= low <= "y":
        return chr(ord(content.strip()) + 1)
    return content
