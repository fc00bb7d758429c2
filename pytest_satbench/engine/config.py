"""What the engine needs to run a benchmark, as one explicit object.

The plugin builds it from the command line, the ini file and pytest's cache folders; the
engine never sees pytest's config or session, so it can be driven from a script too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_satbench.core.prompts import DEFAULT_STYLE
from pytest_satbench.engine.concurrency import ConcurrencySpec

if TYPE_CHECKING:  # (the codecs' registry loads entry points: not at every pytest start-up)
    from pytest_satbench.codecs.base import ArmSpec
    from pytest_satbench.engine.fleetfile import ServerList


@dataclass(frozen=True)
class RuntimeConfig:
    """Every engine setting, with its default: the one place an engine default is written.
    The option table (`plugin/options.py`, `Option(config=...)`) and the engine's
    constructors read a default here (`config_default`); no other place repeats it."""

    run_id: str
    tag: str
    urls: tuple[str, ...]  # OpenAI-compatible base URLs (the builtin server's, once started)
    store_path: Path
    recon_cache_dir: Path | None = None  # disk cache of expensive reconstructions
    recon_cache_bytes: int = 20 * 2**30
    arms: tuple[ArmSpec, ...] = ()
    model: str | None = None  # None: the one model the servers list
    max_new: int = 1024
    # the model settings every request carries (engine/wire.py chat_payload); None: not sent
    temperature: float = 0.0
    top_p: float | None = None
    request_seed: int | None = None
    system_prompt: str | None = None
    extra_body: str | None = None  # a JSON object, canonical: merged into every request body
    prompt_style: str = DEFAULT_STYLE
    box_grid: str | None = None  # None: the prompt style's grid
    iou: str = "inclusive"
    blind: bool = False
    fresh: bool = False
    # requests in flight from this process: caps, and adaptive limits under them
    concurrency: ConcurrencySpec = field(default_factory=ConcurrencySpec)
    cache_images: int = 256
    # and at most this many MB of them (JPEG and base64 of every arm; engine/images.py)
    cache_mb: int = 64
    lpips_weights: Path | None = None  # --lpips-weights: LPIPS measured with these (engine/lpips.py)
    distortion: str = "on"  # --distortion: "off" measures no distortion (engine/images.py)
    request_timeout: float = 600.0
    retries: int = 4
    max_reply_bytes: int = 8 * 2**20  # a longer reply body is a failure
    max_answer_chars: int = 64 * 1024  # the stored answer text is clipped to this
    model_aliases: tuple[str, ...] = ()  # ids a server may answer with instead of the model
    # called with (server, up?, reason) once per down/up transition of a server
    on_server_state: Callable[[str, bool, str], None] | None = field(default=None, compare=False, repr=False)
    api_key: str | None = field(default=None, repr=False)
    judge_url: str | None = None  # VRSBench's official judge (--judge); None: rules only
    judge_model: str | None = None  # None: the one model the judge server lists
    allow_protocol_change: bool = False
    repeat_orig: int = 0  # asks of the original in all for the sampled questions; 0: once
    repeat_keys: frozenset[tuple[str, str]] = frozenset()  # (benchmark, key) sampled
    samples: int = 1  # --samples K: each question asked K times per arm (core/arms.py sample_arm)
    score_views: Mapping[str, frozenset[str]] = field(default_factory=dict)  # per benchmark
    process: str = "main"  # names this process's traffic in the store (xdist: gw0, gw1, ...)
    # Recorded in protocol.json as given: how the run was invoked and what it read.
    command: tuple[str, ...] = ()
    servers_shown: tuple[str, ...] = ()  # how the servers are named in protocol.json
    # --servers @FILE: its first reading (engine/fleetfile.py), `urls` its servers; the pool
    # follows the file, and says each change of the fleet with `say_midrun(line)`
    servers_file: ServerList | None = field(default=None, compare=False)
    # a line said to the terminal mid-run, from any thread (a change of the fleet, a distortion
    # that could not be measured); the plugin queues it for pytest's thread. None: not said
    say_midrun: Callable[[str], None] | None = field(default=None, compare=False, repr=False)
    dataset_hashes: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    limit: int | None = None
    planned: Mapping[str, int] = field(default_factory=dict)  # questions selected per benchmark
    # the order images are asked in: {"kind": "dataset"} or {"kind": "random", "seed": N}
    order: Mapping[str, Any] = field(default_factory=lambda: {"kind": "dataset"})
    # --precision / --margin, per benchmark: the rule, the lag and the images in the order
    # asked with their question counts (a report rebuilds the sequences from them)
    sequential: Mapping[str, Any] = field(default_factory=dict)
    # --shard I/N: {"index", "count", "scheme", "benchmarks": {name: {"questions", "images",
    # "shard_questions", "shard_images", "planned"}}} (plugin/run.py); None: the whole benchmark
    shard: Mapping[str, Any] | None = None

    @property
    def arm_names(self) -> list[str]:
        from pytest_satbench.core.arms import BLIND, ORIG

        return [ORIG, *[a.canonical for a in self.arms], *([BLIND] if self.blind else [])]

    def protocol(self, model: str, judge_model: str | None = None) -> dict[str, Any]:
        """What exactly was measured (never an API key): protocol.json of every report."""
        import time

        from pytest_satbench._version import __version__
        from pytest_satbench.core.redact import redact

        # redacted before it is stored: a command line can carry user:password@ in a URL
        protocol: dict[str, Any] = redact({
            "plugin_version": __version__,
            "command": list(self.command),
            "model": model,
            "servers": list(self.servers_shown or self.urls),
            # the list at the start, read from this file and followed as it changed
            **({"servers_file": str(self.servers_file.path)} if self.servers_file is not None else {}),
            "sampling": self.sampling(),
            "prompt_style": self.prompt_style,
            "box_grid": self.box_grid,
            "iou": self.iou,
            "arms": self.arm_names,
            "limit": self.limit,
            # what the run set out to answer: a report counts what it never reached as not run
            "planned": dict(self.planned),
            "datasets": {k: dict(v) for k, v in self.dataset_hashes.items()},
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "tag": self.tag,
            "judge": {"server": self.judge_url, "model": judge_model} if self.judge_url else None,
            "order": dict(self.order),
            **({"sequential": {k: dict(v) for k, v in self.sequential.items()}} if self.sequential else {}),
            **({"samples": self.samples_record()} if self.samples > 1 else {}),
            **({"shard": dict(self.shard)} if self.shard else {}),
        })
        return protocol


    def samples_record(self) -> dict[str, Any]:
        """protocol.json's "samples" (--samples K > 1): K and the request seed of each sample,
        sample 1 (the arm itself) with the run's own (None: not sent), sample k base + k - 1
        (base: --request-seed, or 0; `QuestionRunner.seed_for`)."""
        base = self.request_seed or 0
        return {"k": self.samples, "seeds": [self.request_seed] + [base + k - 1 for k in range(2, self.samples + 1)]}

    def sampling(self) -> dict[str, Any]:
        """protocol.json's "sampling": every model setting the requests carry (None: not sent)."""
        import json

        return {"temperature": self.temperature, "max_tokens": self.max_new, "top_p": self.top_p,
                "seed": self.request_seed, "system_prompt": self.system_prompt,
                "extra_body": json.loads(self.extra_body) if self.extra_body else None}


# protocol.json's "sampling" of a run that set none of the model settings; runs recorded before
# they existed wrote only temperature and max_tokens, and measured exactly this
SAMPLING_UNSET = {"top_p": None, "seed": None, "system_prompt": None, "extra_body": None}


def sampling_of(protocol: Mapping[str, Any]) -> dict[str, Any]:
    """A run's recorded sampling settings with every setting present: older runs' records
    compare equal to a run that set nothing new."""
    return {**SAMPLING_UNSET, **(protocol.get("sampling") or {})}


def config_default(name: str) -> Any:
    """`RuntimeConfig`'s default for one field (KeyError: no such field, or none given)."""
    f = RuntimeConfig.__dataclass_fields__[name]
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    raise KeyError(f"RuntimeConfig.{name} has no default")
