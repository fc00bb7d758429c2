"""What a reconstruction arm is, and how `--recon SPEC` strings become codecs.

An *arm* is one way of showing the model an image: `orig` (the original), or one
reconstruction per `--recon SPEC`. A *codec* produces the reconstructions of one or more
arms from one decoded image. Most codecs serve one arm; One-D-Piece serves several token
budgets from a single encoder pass, so it is one codec with several arms.

Spec grammar: `name[:key=value[,key=value...]]`, e.g. `jpeg:quality=10`,
`onedpiece:ckpt=/w/s.bin,nlatent=48`. The canonical spec (keys sorted, defaults filled in)
is the arm's name in tables, the store and the fingerprints.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from PIL import Image


class SpecError(ValueError):
    """A --recon spec is malformed; the message says what to pass instead."""


@dataclass(frozen=True, slots=True)
class ArmSpec:
    codec: str
    params: tuple[tuple[str, str], ...] = ()

    @property
    def canonical(self) -> str:
        if not self.params:
            return self.codec
        return self.codec + ":" + ",".join(f"{k}={v}" for k, v in self.params)

    def param(self, key: str, default: str | None = None) -> str | None:
        for k, v in self.params:
            if k == key:
                return v
        return default

    def __str__(self) -> str:
        return self.canonical


def parse_spec(text: str) -> tuple[str, dict[str, str]]:
    """Split `name:k=v,k=v` into the codec name and its raw parameters."""
    text = text.strip()
    if not text:
        raise SpecError("empty --recon spec; pass e.g. --recon jpeg:quality=10")
    name, _, rest = text.partition(":")
    params: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise SpecError(f"--recon {text!r}: {part!r} is not key=value")
        params[key.strip()] = value.strip()
    return name.strip(), params


class Codec(ABC):
    """Reconstructs images for one or more arms. Must be safe to call from several threads
    (a codec on an accelerator may batch concurrent calls internally)."""

    arms: tuple[ArmSpec, ...]

    # Whether reconstructions are worth caching on disk (expensive codecs only).
    disk_cacheable: bool = False

    def identity(self) -> str:
        """Extra identity beyond the spec that changes the output (e.g. a checkpoint hash).
        Part of every fingerprint of this codec's arms."""
        return ""

    def output_size(self, size: tuple[int, int]) -> tuple[int, int]:
        """The (width, height) of this codec's reconstructions of an image of `size`.

        A pure function of the size, so the original's geometry (and so its fingerprint)
        is known without decoding or reconstructing anything. Default: size-preserving.
        """
        return size

    @abstractmethod
    def reconstruct(self, image: Image.Image) -> list[Image.Image]:
        """One RGB reconstruction of `image` per arm, in `self.arms` order."""

    def close(self) -> None:
        """Release resources (model weights, worker threads)."""


@dataclass(frozen=True)
class CodecFactory:
    """How one codec name is parsed and built.

    `normalise` validates raw params and returns the canonical ArmSpec (defaults filled in),
    raising SpecError with a one-line message. `build` turns the arm specs of this codec
    name into codecs; it may group several arms into one codec (shared encoder).
    """

    name: str
    normalise: Callable[[dict[str, str]], ArmSpec]
    build: Callable[[Sequence[ArmSpec]], list[Codec]]
    help: str = ""


_FACTORIES: dict[str, CodecFactory] = {}


def register_codec(factory: CodecFactory) -> CodecFactory:
    _FACTORIES[factory.name] = factory
    return factory


def factories() -> dict[str, CodecFactory]:
    from pytest_satbench.codecs import simple  # noqa: F401  (registers identity, jpeg, resize)

    try:
        from pytest_satbench.codecs.onedpiece import codec as onedpiece  # noqa: F401  (registers onedpiece; imports torch lazily)
    except ImportError:
        pass
    return dict(_FACTORIES)


def normalise_spec(text: str) -> ArmSpec:
    name, params = parse_spec(text)
    known = factories()
    if name not in known:
        raise SpecError(
            f"--recon {text!r}: unknown codec {name!r}; known: {', '.join(sorted(known))}"
        )
    return known[name].normalise(params)


def build_codecs(specs: Sequence[ArmSpec]) -> list[Codec]:
    """Codecs for the given arms, arms of one codec name built together."""
    known = factories()
    by_name: dict[str, list[ArmSpec]] = {}
    for spec in specs:
        by_name.setdefault(spec.codec, []).append(spec)
    codecs: list[Codec] = []
    for name, group in by_name.items():
        codecs += known[name].build(group)
    return codecs


def expect_int(spec: str, key: str, value: str, lo: int, hi: int) -> int:
    try:
        v = int(value)
    except ValueError:
        raise SpecError(f"--recon {spec}: {key}={value!r} is not an integer") from None
    if not lo <= v <= hi:
        raise SpecError(f"--recon {spec}: {key}={v} is out of range {lo}..{hi}")
    return v


def expect_float(spec: str, key: str, value: str, lo: float, hi: float) -> float:
    try:
        v = float(value)
    except ValueError:
        raise SpecError(f"--recon {spec}: {key}={value!r} is not a number") from None
    if not lo < v <= hi:
        raise SpecError(f"--recon {spec}: {key}={v} must be in ({lo}, {hi}]")
    return v


def reject_unknown(spec: str, params: dict[str, str], allowed: set[str]) -> None:
    extra = sorted(set(params) - allowed)
    if extra:
        raise SpecError(
            f"--recon {spec}: unknown parameter {extra[0]!r}; allowed: {', '.join(sorted(allowed)) or 'none'}"
        )
