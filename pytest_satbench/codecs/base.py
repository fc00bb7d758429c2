"""What a reconstruction arm is, and how `--recon SPEC` strings become codecs.

An *arm* is one way of showing the model an image: `orig` (the original), or one
reconstruction per `--recon SPEC`. A *codec* produces the reconstructions of one or more
arms from one decoded image. Most codecs serve one arm; One-D-Piece serves several token
budgets from a single encoder pass, so it is one codec with several arms.

Spec grammar: `name[:key=value[,key=value...]]`, e.g. `jpeg:quality=10`,
`onedpiece:ckpt=/w/s.bin,nlatent=48`. The canonical spec (keys sorted, defaults filled in)
is the arm's name in tables, the store and the fingerprints. Parameters that only decide
where or how fast an arm runs (a device, a batch size) travel in `ArmSpec.runtime`, outside
the canonical spec, so a GPU run and a CPU run share store rows.

Codecs are found through the entry-point group `pytest_satbench.codecs`, the built-in ones
exactly as a third-party package's::

    [project.entry-points."pytest_satbench.codecs"]
    mycodec = "my_package.codec"            # a module that calls register_codec() on import
    # or: mycodec = "my_package.codec:FACTORY"  (a CodecFactory, or a list of them)

Name the entry point after the codec: when its module fails to import, a spec naming that
codec gets the import error and what to install; every other codec still works.

Everything the rest of the package knows of a codec it asks here, by the arm's name: its short
label in tables (`arm_label`: `jpeg:q10`, `tok48`), what protocol.json says of it
(`describe_arm`, from the identity the run recorded: a checkpoint is hashed once, by the
codec, when the run starts), whether its reconstructions are worth keeping on disk rather than
made again (`disk_cacheable`), and how shorthand options rewrite `--recon` texts
(`expand_shorthands`). Nothing outside `codecs/` reads a spec's parameters or names a codec.
"""

from __future__ import annotations

import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, overload

if TYPE_CHECKING:
    # Only for annotations: the plugin imports this module at pytest start-up, and most
    # pytest runs never touch an image.
    from PIL import Image

ENTRY_POINT_GROUP = "pytest_satbench.codecs"

Params = tuple[tuple[str, str], ...]


class SpecError(ValueError):
    """A --recon spec is malformed; the message says what to pass instead."""


@dataclass(frozen=True, slots=True)
class ArmSpec:
    codec: str
    params: Params = ()
    # Where/how fast the arm runs (e.g. device, batch). Excluded from equality, hashing and
    # `canonical`: an arm's identity is what changes its pixels, nothing else.
    runtime: Params = field(default=(), compare=False)

    @property
    def canonical(self) -> str:
        if not self.params:
            return self.codec
        return self.codec + ":" + ",".join(f"{k}={v}" for k, v in self.params)

    @overload
    def param(self, key: str) -> str | None: ...
    @overload
    def param(self, key: str, default: str) -> str: ...
    @overload
    def param(self, key: str, default: str | None) -> str | None: ...

    def param(self, key: str, default: str | None = None) -> str | None:
        return _lookup(self.params, key, default)

    def runtime_param(self, key: str, default: str | None = None) -> str | None:
        return _lookup(self.runtime, key, default)

    def __str__(self) -> str:
        return self.canonical


def _lookup(pairs: Params, key: str, default: str | None) -> str | None:
    for k, v in pairs:
        if k == key:
            return v
    return default


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

    # Whether reconstructions are worth caching on disk (expensive codecs only); its factory
    # says the same (`CodecFactory.disk_cacheable`) without building the codec.
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

    def close(self) -> None:  # noqa: B027 (optional: a codec without resources keeps the no-op)
        """Release resources (model weights, worker threads)."""


@dataclass(frozen=True)
class CodecFactory:
    """How one codec name is parsed and built.

    `normalise` validates raw params and returns the canonical ArmSpec (defaults filled in,
    run-time parameters in `runtime`), raising SpecError with a one-line message. `build`
    turns the arm specs of this codec name into codecs; it may group several arms into one
    codec (shared encoder), and reads run-time parameters from the specs it receives.
    """

    name: str
    normalise: Callable[[dict[str, str]], ArmSpec]
    build: Callable[[Sequence[ArmSpec]], list[Codec]]
    help: str = ""
    # The arm's short label in tables (at most ~8 characters tell a sweep's arms apart), from
    # its canonical spec; default: the canonical spec itself.
    label: Callable[[ArmSpec], str] | None = None
    # What protocol.json says of an arm beyond its spec and codec name, from its canonical spec
    # and the identity the run recorded (`Codec.identity()`, "" when none was recorded), e.g.
    # the checkpoint and its sha256. Never reads or hashes a file: the run did that once.
    describe: Callable[[ArmSpec, str], dict[str, object]] | None = None
    # Expensive codecs: reconstructions are cached on disk, and a report looks them up there
    # instead of making them again (the codec's own `Codec.disk_cacheable`).
    disk_cacheable: bool = False
    # Shorthand options that rewrite the --recon texts of this codec (the seed's --nlatent,
    # --max-tiles, --recon-device for One-D-Piece): the keys it takes, and the rewrite, given
    # every --recon text and the values of the keys that were given.
    shorthand_keys: frozenset[str] = frozenset()
    shorthands: Callable[[list[str], Mapping[str, str]], list[str]] | None = None
    # Codecs swept over a budget (One-D-Piece's tokens per crop): an arm's family (what its
    # spec says but the budget) and its budget; None for an arm outside any sweep.
    budget: Callable[[ArmSpec], tuple[str, float] | None] | None = None


_FACTORIES: dict[str, CodecFactory] = {}
# Entry points that failed to load, by entry-point name: the one-line reason and hint.
_BROKEN: dict[str, str] = {}
_discovered = False
_discovering = False
# Reentrant: an entry-point module may itself normalise a spec while being imported.
_discovery_lock = threading.RLock()


def register_codec(factory: CodecFactory) -> CodecFactory:
    """Make `factory` known under its name. Registering another factory under a taken name
    is an error: two implementations behind one arm name would share store rows."""
    with _discovery_lock:
        held = _FACTORIES.get(factory.name)
        if held is not None and held != factory:
            raise ValueError(
                f"codec {factory.name!r} is already registered (by {getattr(held.build, '__module__', '?')})"
            )
        _FACTORIES[factory.name] = factory
    return factory


def factories() -> dict[str, CodecFactory]:
    """Every usable codec; the entry points are loaded on the first call."""
    _discover()
    return dict(_FACTORIES)


def broken_codecs() -> dict[str, str]:
    """Entry points that failed to load: name -> one-line reason with what to install."""
    _discover()
    return dict(_BROKEN)


def _discover() -> None:
    global _discovered, _discovering
    if _discovered:
        return
    with _discovery_lock:
        # Only this thread can hold the lock: `_discovering` means a module being loaded
        # asked for codecs, and it gets those registered so far.
        if _discovered or _discovering:
            return
        _discovering = True
        try:
            # Built-ins first, then by name: on a name clash the built-in keeps it, whatever
            # the order of sys.path (the clashing entry point is reported as failed).
            for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=_load_order):
                try:
                    loaded = ep.load()
                    for factory in _factories_in(loaded):
                        register_codec(factory)
                except Exception as exc:  # a missing optional dependency must not hide the others
                    _BROKEN[ep.name] = f"{ep.value} failed to load ({_first_line(exc)}); {_install_hint(ep, exc)}"
        finally:
            _discovering = False
            _discovered = True


def _load_order(ep: EntryPoint) -> tuple[bool, str]:
    return (not ep.value.startswith("pytest_satbench."), ep.name)


def _factories_in(loaded: object) -> list[CodecFactory]:
    # A module registered its codecs while being imported; an object is registered here.
    if isinstance(loaded, CodecFactory):
        return [loaded]
    if isinstance(loaded, (list, tuple)) and all(isinstance(f, CodecFactory) for f in loaded):
        return list(loaded)
    return []


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


_REQUIREMENT_RX = re.compile(
    r"""^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)[^;]*(?:;.*\bextra\s*==\s*["'](?P<extra>[^"']+)["'])?"""
)


def _normalise_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _install_hint(ep: EntryPoint, exc: BaseException) -> str:
    """What to install: the distribution's extra that requires the missing module, if it
    declares one (e.g. `pip install 'pytest-satbench[onedpiece]'` for torch)."""
    dist = getattr(ep, "dist", None)
    dist_name = dist.metadata["Name"] if dist is not None else None
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    if missing:
        top = missing.partition(".")[0]
        for req in (dist.requires or []) if dist is not None else []:
            m = _REQUIREMENT_RX.match(req)
            if m and m["extra"] and _normalise_name(m["name"]) == _normalise_name(top):
                return f"pip install '{dist_name}[{m['extra']}]'"
        return f"pip install {top}"
    return f"fix or uninstall {dist_name}" if dist_name else f"fix {ep.value}"


def normalise_spec(text: str) -> ArmSpec:
    name, params = parse_spec(text)
    known = factories()
    if name not in known:
        if name in _BROKEN:
            raise SpecError(f"--recon {text!r}: codec {name!r} is unavailable: {_BROKEN[name]}")
        broken = f"; failed to load: {', '.join(sorted(_BROKEN))}" if _BROKEN else ""
        raise SpecError(
            f"--recon {text!r}: unknown codec {name!r}; known: {', '.join(sorted(known))}{broken}"
        )
    return known[name].normalise(params)


def _spec_of(arm: str) -> tuple[ArmSpec, CodecFactory | None]:
    """The ArmSpec of a canonical arm name (as stored), and its codec's factory if installed."""
    name, params = parse_spec(arm)
    return ArmSpec(name, tuple(params.items())), factories().get(name)


def arm_label(arm: str) -> str:
    """The short label of a reconstruction arm, named by its canonical spec: what its codec's
    factory calls it (`jpeg:q10`, `rsz:0.5`, `tok48`), else the spec itself."""
    try:
        spec, factory = _spec_of(arm)
    except SpecError:
        return arm
    if factory is None or factory.label is None:
        return arm
    return factory.label(spec)


def describe_arm(arm: str, identity: str = "") -> dict[str, object]:
    """What protocol.json says of a reconstruction arm: its spec, its codec's name and what the
    codec describes of it from the `identity` the run recorded (its checkpoint and the
    checkpoint's sha256, for One-D-Piece). Reads and hashes nothing."""
    try:
        spec, factory = _spec_of(arm)
    except SpecError:
        return {"arm": arm, "codec": None}
    entry: dict[str, object] = {"arm": arm, "codec": spec.codec}
    if factory is not None and factory.describe is not None:
        entry.update(factory.describe(spec, identity or ""))
    return entry


def disk_cacheable(arm: str) -> bool:
    """Whether the arm's reconstructions are cached on disk (an expensive codec: a report looks
    them up there rather than making them again). A codec that is not installed here counts as
    one: it cannot be run, only looked up."""
    try:
        _, factory = _spec_of(arm)
    except SpecError:
        return True
    return factory is None or factory.disk_cacheable


def budget_of(arm: str) -> tuple[str, float] | None:
    """(the arm's family: its spec without the budget, its budget) for an arm of a codec swept
    over a budget (`--nlatent 16,32,64`: one family, three budgets); None for any other arm."""
    try:
        spec, factory = _spec_of(arm)
    except SpecError:
        return None
    if factory is None or factory.budget is None:
        return None
    return factory.budget(spec)


def expand_shorthands(raw: Sequence[str], given: Mapping[str, str | None]) -> list[str]:
    """The --recon texts with shorthand options applied: each codec that takes one of the
    given keys (`CodecFactory.shorthand_keys`) rewrites the texts (e.g. One-D-Piece's
    `nlatent=16,32` gives one arm per budget). Raises SpecError for a key no codec takes, or
    what the codec raises (e.g. no checkpoint to apply them to)."""
    values = {k: v for k, v in given.items() if v}
    out = list(raw)
    if not values:
        return out
    taken: set[str] = set()
    for factory in factories().values():
        keys = factory.shorthand_keys & values.keys()
        if keys and factory.shorthands is not None:
            out = factory.shorthands(out, {k: values[k] for k in sorted(keys)})
            taken |= keys
    left = sorted(values.keys() - taken)
    if left:
        raise SpecError(f"no installed codec takes the shorthand {left[0]!r}")
    return out


def build_codecs(specs: Sequence[ArmSpec]) -> list[Codec]:
    """Codecs for the given arms, arms of one codec name built together."""
    known = factories()
    by_name: dict[str, list[ArmSpec]] = {}
    for spec in specs:
        by_name.setdefault(spec.codec, []).append(spec)
    codecs: list[Codec] = []
    for name, group in by_name.items():
        if name not in known:
            reason = _BROKEN.get(name, "no installed package provides it")
            raise SpecError(f"codec {name!r} is unavailable: {reason}")
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
