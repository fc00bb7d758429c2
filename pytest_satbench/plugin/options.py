# Why one file of ~600 lines: every option is declared once here, in one table, with its parser
# and its Settings field; the parsers are small functions the table names, and the table
# generates pytest's options, the ini entries, the help, Settings and docs/options.md.
"""Command-line options, declared once in `OPTIONS`, and their validation into one `Settings`.

Each `Option` row carries the flag, its ini name, default, help and parser; `add_options`
(addoption and addini), the help's "(default ...)" suffixes, the `Settings` field defaults
and `parse_settings` are all generated from the table, so a default is written in one place.
A value comes from the command line, else the ini file, else the default.

Every option error is a `pytest.UsageError` with one line naming where the bad value came
from (the flag, or the ini name for an ini value) and what to pass: users see
`ERROR: --concurrency: expected an integer, got 'x'`, never a traceback.

This module is imported at every pytest start-up (the plugin's options are registered
before any test runs), so it stays light: the codec registry (PIL) and the gate parser are
imported by the functions that parse --recon and --gate.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest

from pytest_satbench.core.defaults import BOOTSTRAP
from pytest_satbench.engine.concurrency import ConcurrencySpec

if TYPE_CHECKING:
    from pytest_satbench.codecs.base import ArmSpec
    from pytest_satbench.core.gates import Gate
    from pytest_satbench.engine.fleetfile import ServerList
    from pytest_satbench.report.trackers import TrackerSpec

GROUP = "satbench"

# (where the value came from: "--flag" or the ini name, the value as given) -> parsed value
Parse = Callable[[str, Any], Any]


# ---------------------------------------------------------------------- value parsers
# Factories, so a table row reads `parse=integer(minimum=0)`.


def integer(*, minimum: int = 1) -> Parse:
    def parse(where: str, raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise pytest.UsageError(f"{where}: expected an integer, got {raw!r}") from None
        if value < minimum:
            raise pytest.UsageError(f"{where}: must be at least {minimum}, got {value}")
        return value

    return parse


def seconds() -> Parse:
    def parse(where: str, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise pytest.UsageError(f"{where}: expected a number of seconds, got {raw!r}") from None
        if not (value > 0 and math.isfinite(value)):  # nan and inf would disable the timeout
            raise pytest.UsageError(f"{where}: must be a positive number of seconds, got {raw!r}")
        return value

    return parse


def one_of(allowed: Sequence[str]) -> Parse:
    def parse(where: str, raw: str) -> str:
        if raw not in allowed:
            raise pytest.UsageError(f"{where}: expected one of {', '.join(allowed)}, got {raw!r}")
        return raw

    return parse


def _concurrency(where: str, raw: str) -> tuple[int | None, int | None]:
    """(cap per server, cap in all) from auto | N | total:N."""
    text = raw.strip().lower()
    if text == "auto":
        return None, None
    total = text.startswith("total:")
    number = text.removeprefix("total:").strip()
    try:
        value = int(number)
    except ValueError:
        raise pytest.UsageError(f"{where}: expected auto, N (per server) or total:N, got {raw!r}") from None
    if value < 1:
        raise pytest.UsageError(f"{where}: must be at least 1, got {value}")
    return (None, value) if total else (value, None)


def _concurrency_spec(values: Mapping[str, Any]) -> ConcurrencySpec:
    per_server, total = values["concurrency"]
    return ConcurrencySpec(per_server=per_server, total=total, adaptive=values["concurrency_control"] == "adaptive",
                           metrics=values["metrics"] == "auto")


def _servers(where: str, raw: str) -> tuple[tuple[str, ...], bool, ServerList | None]:
    """(base URLs, builtin server wanted, the server file's first reading for @FILE)."""
    if raw.strip().startswith("@"):
        return _server_file(where, raw.strip()[1:])
    urls = [u.strip().rstrip("/") for u in raw.split(",") if u.strip()]
    if urls == ["builtin"]:
        return (), True, None
    for u in urls:
        if u == "builtin":
            raise pytest.UsageError(f"{where}: 'builtin' cannot be mixed with URLs; pass one or the other")
        if not u.startswith(("http://", "https://")):
            raise pytest.UsageError(
                f"{where}: {u!r} is not a URL; pass base URLs like http://gpu1:8000 (comma-separated) or 'builtin'"
            )
        if u.endswith("/v1"):
            raise pytest.UsageError(f"{where}: pass the base URL without /v1, e.g. {u[:-3]}")
    return tuple(dict.fromkeys(urls)), False, None


def _server_file(where: str, raw: str) -> tuple[tuple[str, ...], bool, ServerList]:
    """--servers @FILE: one URL per line, followed during the run (engine/fleetfile.py)."""
    from pytest_satbench.engine.fleetfile import read_server_file

    path = Path(raw).expanduser().resolve()
    try:
        got = read_server_file(path)
    except FileNotFoundError:
        raise pytest.UsageError(f"{where}: @{path}: no such file; write the servers' base URLs in it, one per "
                                "line, or pass them comma-separated") from None
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or ("not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else exc)
        raise pytest.UsageError(f"{where}: @{path} cannot be read ({why}); pass a readable text file of base "
                                "URLs, one per line") from None
    if not got.urls:
        bad = f" ({got.problems[0]}{' ...' if len(got.problems) > 1 else ''})" if got.problems else ""
        raise pytest.UsageError(f"{where}: @{path} lists no server{bad}; write base URLs like "
                                "http://gpu1:8000, one per line")
    return got.urls, False, got


def _judge(where: str, raw: str) -> tuple[str, str | None]:
    """(judge base URL, judge model or None: the one model it lists)."""
    url, _, model = (part.strip() for part in raw.partition(","))
    if not url.startswith(("http://", "https://")) or "," in model:
        raise pytest.UsageError(
            f"{where}: {raw!r} is not URL[,MODEL]; pass one judge server, e.g. http://judge:8000,gpt-4o-mini"
        )
    urls = _servers(where, url)[0]  # the same checks as --servers (no /v1)
    return urls[0], model or None


def _store(where: str, raw: str) -> Path:
    path = Path(raw).expanduser()
    if path.is_dir():
        raise pytest.UsageError(f"{where}: {path} is a folder; pass the results file, e.g. {path / 'results.sqlite'}")
    return path.resolve()


def _lpips_weights(where: str, raw: str) -> Path:
    """--lpips-weights PATH: a file (what it holds is checked when the run starts, with torch)."""
    path = Path(raw).expanduser().resolve()
    if not path.is_file():
        raise pytest.UsageError(f"{where}: {path} is not a file; pass the LPIPS-Alex weights file "
                                "(a torch state dict, docs/distortion.md), or leave the option out")
    return path


def _aliases(where: str, texts: Sequence[str]) -> tuple[str, ...]:
    ids = tuple(dict.fromkeys(a.strip() for text in texts for a in text.split(",") if a.strip()))
    if texts and not ids:
        raise pytest.UsageError(f"{where}: pass a model id, e.g. openai/gpt-4o-mini-2024-07-18")
    return ids


def _data_root(where: str, raw: str) -> tuple[Path, str]:
    """(folder, where it came from). Only an explicit option is checked for being a folder:
    an environment variable reaches every pytest run, and a stale one must not break runs
    that use no benchmark."""
    root = Path(raw).expanduser()
    if not root.is_dir():
        raise pytest.UsageError(f"{where}: {root} is not a folder; point it at the folder holding the benchmarks")
    return root, where


def _data_root_from_env() -> tuple[Path | None, str]:
    env = os.environ.get("SATBENCH_DATA_ROOT")
    if env:
        return Path(env).expanduser(), "$SATBENCH_DATA_ROOT"
    toklip = os.environ.get("TOKLIP_ROOT")
    if toklip:
        return Path(toklip).expanduser() / "data", "$TOKLIP_ROOT/data"
    return None, ""


def _limit(where: str, raw: str) -> int | None:
    return integer(minimum=0)(where, raw) or None  # 0 is "no limit", as an absent --limit


def _shard(where: str, raw: str) -> tuple[int, int]:
    """(I, N): part I of N, numbered from 1."""
    index, _, count = raw.strip().partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        raise pytest.UsageError(f"{where}: expected I/N, part I of N numbered from 1 (e.g. 2/4), got {raw!r}") from None
    if not 1 <= i <= n:
        raise pytest.UsageError(f"{where}: I must be from 1 to N (parts are numbered from 1), got {raw!r}")
    return i, n


def _points(where: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise pytest.UsageError(f"{where}: expected a number of points, e.g. 4 or 2.5, got {raw!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise pytest.UsageError(f"{where}: must be a positive number of points, got {raw!r}")
    return value


def _repeat_orig(where: str, raw: str) -> int:
    k = integer(minimum=0)(where, raw)
    if k == 1:
        raise pytest.UsageError(f"{where}: K is the number of asks in all; pass 2 or more (or 0 to turn it off)")
    return k


def _tag(where: str, raw: str) -> str:
    if not all(ch.isalnum() or ch in "-_." for ch in raw) or raw.startswith("."):
        raise pytest.UsageError(f"{where}: use letters, digits, '-', '_' or '.', got {raw!r}")
    return raw


def _prompt_style(where: str, raw: str) -> str:
    from pytest_satbench.core import prompts

    try:
        prompts.get_style(raw)
    except ValueError as exc:
        raise pytest.UsageError(f"{where}: {exc}") from None
    return raw


def _number(where: str, raw: str, low: float, high: float, *, low_open: bool = False) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise pytest.UsageError(f"{where}: expected a number, got {raw!r}") from None
    if not (math.isfinite(value) and (value > low if low_open else value >= low) and value <= high):
        span = f"{'above' if low_open else 'from'} {low:g} {'up ' if low_open else ''}to {high:g}"
        raise pytest.UsageError(f"{where}: expected a number {span}, got {raw!r}")
    return value


def _temperature(where: str, raw: str) -> float:
    return _number(where, raw, 0.0, 2.0)  # OpenAI's range; vLLM takes the same values


def _top_p(where: str, raw: str) -> float:
    return _number(where, raw, 0.0, 1.0, low_open=True)


def _system_prompt(where: str, raw: str) -> str:
    """The text, or @FILE: the file's text (UTF-8), as is. (On the command line write
    --system-prompt=@FILE: a separate "@FILE" argument is pytest's own arguments file.)"""
    if not raw.strip():
        raise pytest.UsageError(f"{where}: pass the system prompt's text, or @FILE of a file holding it")
    if not raw.startswith("@"):
        return raw
    path = Path(raw[1:]).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else (exc.strerror or type(exc).__name__)
        raise pytest.UsageError(f"{where}: cannot read {path} ({why}); pass the prompt's text or @FILE of a "
                                "readable UTF-8 file") from None
    if not text.strip():
        raise pytest.UsageError(f"{where}: {path} is empty; pass a file holding the system prompt")
    return text


def _extra_body(where: str, raw: str) -> str:
    """A JSON object, in canonical form (sorted keys): merged into every request body."""
    import json

    from pytest_satbench.engine.wire import OWNED_KEYS

    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise pytest.UsageError(f"{where}: not valid JSON ({exc}); pass an object, e.g. "
                                """'{"chat_template_kwargs": {"enable_thinking": false}}'""") from None
    if not isinstance(doc, dict):
        raise pytest.UsageError(f"{where}: expected a JSON object, got {type(doc).__name__}; pass an object, e.g. "
                                """'{"chat_template_kwargs": {"enable_thinking": false}}'""")
    for key in doc:
        if key in OWNED_KEYS:
            raise pytest.UsageError(f"{where}: key {key!r} is the plugin's to set ({OWNED_KEYS[key]})")
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _nlatent(where: str, raw: str) -> str | None:
    budgets = [b.strip() for b in raw.split(",") if b.strip()]
    for b in budgets:
        integer()(where, b)
    return ",".join(budgets) or None


def _gpu_index(where: str, raw: str) -> int:
    if not raw.isdigit():
        raise pytest.UsageError(f"{where}: pass a GPU index (e.g. 7), and not together with --recon-device")
    return int(raw)


def _log_to(where: str, texts: Sequence[str]) -> tuple[TrackerSpec, ...]:
    from pytest_satbench.report.trackers import TrackerError, parse_log_to

    out: list[TrackerSpec] = []
    for text in texts:
        try:
            spec = parse_log_to(text)
        except TrackerError as exc:
            raise pytest.UsageError(f"{where}: {exc}") from None
        if spec not in out:
            out.append(spec)
    return tuple(out)


def _gates(where: str, texts: Sequence[str]) -> tuple[Gate, ...]:
    from pytest_satbench.core.gates import GateError, parse_gate

    out = []
    for text in texts:
        try:
            out.append(parse_gate(text))
        except GateError as exc:
            raise pytest.UsageError(str(exc)) from None
    return tuple(out)


def _arms(values: Mapping[str, Any]) -> tuple[ArmSpec, ...]:
    """--recon specs, expanded by the seed's shorthands (--nlatent, --max-tiles, --recon-device, --recon-gpu)."""
    from pytest_satbench.codecs.base import SpecError, normalise_spec

    raw: list[str] = list(values["recon"])
    device: str | None = values["recon_device"]
    if values["recon_gpu"] is not None:
        if device:
            raise pytest.UsageError("--recon-gpu: pass a GPU index (e.g. 7), and not together with --recon-device")
        device = f"cuda:{values['recon_gpu']}"
    nlatent: str | None = values["nlatent"]
    max_tiles = None if values["max_tiles"] is None else str(values["max_tiles"])
    if nlatent or max_tiles or device:
        raw = _expand_onedpiece(raw, nlatent, max_tiles, device)
    arms: list[ArmSpec] = []
    for text in raw:
        try:
            spec = normalise_spec(text)
        except SpecError as exc:
            raise pytest.UsageError(str(exc)) from None
        if spec.canonical in ("orig", "blind"):
            raise pytest.UsageError(f"--recon {text!r}: '{spec.canonical}' is reserved")
        if spec not in arms:
            arms.append(spec)
    return tuple(arms)


def _expand_onedpiece(raw: list[str], nlatent: str | None, max_tiles: str | None, device: str | None) -> list[str]:
    """The seed's One-D-Piece shorthands (--nlatent 16,32 --max-tiles 12 --recon-device cuda:0),
    handed to the codecs as they are: the codec that takes them rewrites its own --recon texts
    (`codecs.expand_shorthands`)."""
    from pytest_satbench.codecs import SpecError, expand_shorthands

    try:
        return expand_shorthands(raw, {"nlatent": nlatent, "max_tiles": max_tiles, "device": device})
    except SpecError as exc:
        raise pytest.UsageError(str(exc)) from None


# ---------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Option:
    """One command-line option: everything pytest and `Settings` need to know about it."""

    flag: str  # "--concurrency"
    help: str  # what it does; the default is appended from `default`/`default_doc`
    default: Any = None  # the Settings value(s) when neither command line nor ini gives one
    # "value": --flag VALUE; "flag": --flag alone, giving `not default`; "list": repeatable,
    # parsed as the tuple of all its values
    kind: Literal["value", "flag", "list"] = "value"
    parse: Parse | None = None  # None: the value as given (a tuple for "list")
    choices: tuple[str, ...] = ()  # shorthand for parse=one_of(choices); also the metavar
    ini: str | None = None
    ini_adds: bool = False  # "list" only: the ini's lines come first, the command line adds to them
    metavar: str | None = None
    # the default in words where it isn't a value to print ("the one model the servers list")
    default_doc: str | None = None
    # the Settings fields it fills; None: the one named like the flag; (): none, the value is
    # read by another option's `build`; several: `default` and the parsed value are tuples
    fields: tuple[str, ...] | None = None
    # when it is not given: computed at parse time (environment variables), instead of `default`
    fallback: Callable[[], Any] | None = None
    # the Settings value from every option's parsed value (by `dest`): options that combine
    build: Callable[[Mapping[str, Any]], Any] | None = None
    # with `build`: the Settings value it makes from the defaults, where that is not `default`
    built_default: Any = None
    # the `RuntimeConfig` field it fills (engine/config.py); its default is that field's, written
    # there only (`default` stays unset)
    config: str | None = None

    def __post_init__(self) -> None:
        if self.config is not None:
            from pytest_satbench.engine.config import config_default

            if self.default is not None:
                raise ValueError(f"{self.flag}: the default of an engine setting is RuntimeConfig.{self.config}'s")
            object.__setattr__(self, "default", config_default(self.config))

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def settings_fields(self) -> tuple[str, ...]:
        return (self.dest,) if self.fields is None else self.fields

    @property
    def parser(self) -> Parse | None:
        return one_of(self.choices) if self.choices and self.parse is None else self.parse

    @property
    def shown_metavar(self) -> str | None:
        if self.kind == "flag":
            return None
        return self.metavar or ("|".join(self.choices) if self.choices else None)

    def shown_default(self) -> str | None:
        """The default as help and README show it; None where there is none to show."""
        if self.default_doc is not None:
            return self.default_doc
        if self.kind == "flag" or self.default in (None, ()):
            return None
        if isinstance(self.default, float):
            return f"{self.default:g}"
        if isinstance(self.default, str):
            return repr(self.default)
        return str(self.default)

    def full_help(self) -> str:
        shown = self.shown_default()
        if shown is None:
            return self.help
        return f"{self.help} (default{':' if self.default_doc is not None else ''} {shown})"

    def ini_help(self) -> str:
        if self.ini_adds:
            return f"added to {self.flag}, one per line"
        return f"default for {self.flag}" + (", one per line" if self.kind == "list" else "")


OPTIONS: tuple[Option, ...] = (
    Option("--servers", "comma-separated OpenAI-compatible base URLs, 'builtin' for the bundled reference server, "
           "or @FILE: one URL per line, read again when it changes, so servers join and leave during the run "
           "(write --servers=@FILE: pytest reads a separate @FILE argument as its own arguments file)",
           default=((), False, None), parse=_servers, fields=("servers", "builtin_server", "servers_file"),
           ini="satbench_servers", metavar="URLS|@FILE", default_doc="none"),
    Option("--model", "model id to request", ini="satbench_model", metavar="ID", config="model",
           default_doc="the one model the servers list at /v1/models"),
    Option("--data-root", "folder holding the benchmarks", default=(None, ""), parse=_data_root,
           fields=("data_root", "data_root_source"), fallback=_data_root_from_env, ini="satbench_data_root",
           metavar="DIR", default_doc="$SATBENCH_DATA_ROOT, else $TOKLIP_ROOT/data"),
    Option("--limit", "N questions per benchmark, each question type in proportion to its size (at least one "
           "per type), fixed seed",
           parse=_limit, metavar="N", default_doc="all", config="limit"),
    Option("--order", "the order images are asked in, each image's questions together: dataset (sorted by image "
           "id) or random (a seeded random order of the images, so a run stopped at any point is a random sample "
           "of the benchmark)", choices=("dataset", "random"), metavar="dataset|random",
           default_doc="random with --precision or --margin, else dataset"),
    Option("--seed", "seed of --order random (the same seed asks the images in the same order)", default=0,
           parse=integer(minimum=0), metavar="N"),
    Option("--shard", "run part I of N of every benchmark: its images split into N parts whose question counts "
           "differ by at most one image's questions, all questions of an image in one part; the split depends on the "
           "benchmark's questions (after --limit) alone, not on -k, -n or the order, so the N runs I = 1..N ask "
           "every question once (docs/running.md, Sharding)", parse=_shard, metavar="I/N",
           default_doc="the whole benchmark"),
    Option("--precision", "stop asking a benchmark once every reconstruction arm's confidence sequence of the "
           "paired delta (with no --recon: of the accuracy) is at most POINTS wide; the questions not needed are "
           "skipped (docs/statistics.md)", parse=_points, metavar="POINTS", default_doc="off"),
    Option("--margin", "stop asking a benchmark once every reconstruction arm's paired delta is decided against "
           "-M points: its confidence sequence lies entirely above -M (within M points of the original) or "
           "entirely below; needs --recon; with --precision, whichever comes first", parse=_points, metavar="M",
           default_doc="off"),
    Option("--recon", "reconstruction arm, repeatable: identity | jpeg:quality=Q | resize:factor=F | "
           "onedpiece:ckpt=PATH,...", kind="list", default=(), fields=("arms",), build=_arms,
           ini="satbench_recon", metavar="SPEC", default_doc="none, the original only"),
    Option("--nlatent", "One-D-Piece token budgets per 256-px crop, e.g. 16,32,64 (one arm each)",
           parse=_nlatent, fields=(), metavar="N,N,..."),
    Option("--max-tiles", "One-D-Piece: cap on 256-px crops per image", parse=integer(), fields=(),
           metavar="N", default_doc="the onedpiece spec's max_tiles"),
    Option("--recon-device", "One-D-Piece: torch device, e.g. cuda:0 or cpu", fields=(), metavar="DEV",
           default_doc="cuda:0 if torch sees a GPU, else cpu"),
    Option("--recon-gpu", "the seed's spelling: --recon-gpu 7 is --recon-device cuda:7", parse=_gpu_index,
           fields=(), metavar="N"),
    Option("--max-new", "max_tokens per answer", parse=integer(), ini="satbench_max_new", metavar="N",
           config="max_new"),
    Option("--temperature", "sampling temperature of every request (0: greedy)", parse=_temperature,
           ini="satbench_temperature", metavar="T", config="temperature"),
    Option("--top-p", "nucleus sampling: top_p of every request", parse=_top_p, ini="satbench_top_p", metavar="P",
           config="top_p", default_doc="not sent (the server's default)"),
    Option("--request-seed", "seed sent with every request: with --temperature above 0, servers that honour it "
           "(vLLM) sample the same answer again", parse=integer(minimum=0), ini="satbench_request_seed",
           metavar="N", config="request_seed", default_doc="not sent"),
    Option("--system-prompt", "system message sent before every question: the text, or @FILE for a file's",
           parse=_system_prompt, ini="satbench_system_prompt", metavar="TEXT|@FILE", config="system_prompt",
           default_doc="none"),
    Option("--extra-body", "JSON object merged into every request body, e.g. "
           """'{"chat_template_kwargs": {"enable_thinking": false}}' (not the judge's requests)""",
           parse=_extra_body, ini="satbench_extra_body", metavar="JSON", config="extra_body", default_doc="none"),
    Option("--concurrency", "cap on requests in flight: N per server, or total:N across all servers; under the "
           "cap each server's limit adapts to what it can take (caps are for the whole run: xdist workers share "
           "them)", default=(None, None), parse=_concurrency, ini="satbench_concurrency", metavar="auto|N|total:N",
           fields=(), default_doc="auto: no cap but 512 per server"),
    Option("--concurrency-control", "adaptive: each server's limit is found and followed; fixed: every server "
           "is held at the cap (--concurrency total:64 --concurrency-control fixed is the behaviour before "
           "adaptive limits)", default="adaptive", choices=("adaptive", "fixed"), ini="satbench_concurrency_control",
           fields=()),
    Option("--metrics", "auto: steer limits by a server's vLLM /metrics when it serves them; off: by latency and "
           "throughput alone", default="auto", choices=("auto", "off"), ini="satbench_metrics",
           fields=("concurrency",), build=_concurrency_spec, built_default=ConcurrencySpec()),
    Option("--lpips-weights", "LPIPS (AlexNet, v0.1) of each reconstruction against the original, both as sent, "
           "from this file: a torch state dict of AlexNet's features and LPIPS' linear layers (docs/distortion.md; "
           "needs torch)", parse=_lpips_weights, ini="satbench_lpips_weights", metavar="PATH",
           config="lpips_weights", default_doc="not computed (PSNR, SSIM and MS-SSIM are)"),
    Option("--distortion", "on: PSNR, SSIM, MS-SSIM (and LPIPS) of each reconstruction against the original, "
           "measured once per image and arm (about 64 ms CPU at 512x512) and kept in the store; off: not measured, "
           "the reports say so; answers are reused either way (docs/distortion.md)", choices=("on", "off"),
           ini="satbench_distortion", config="distortion"),
    Option("--cache-images", "prepared images kept in memory", parse=integer(),
           ini="satbench_cache_images", metavar="N", config="cache_images"),
    Option("--cache-mb", "MB of prepared images kept in memory (at 512x512 about 1 MB an image with two arms; "
           "the look-ahead needs a few dozen)", parse=integer(), ini="satbench_cache_mb", metavar="MB",
           config="cache_mb"),
    Option("--request-timeout", "deadline of one request attempt, whole (connect, send, receive), in seconds",
           parse=seconds(), ini="satbench_request_timeout", metavar="S", config="request_timeout"),
    Option("--retries", "retries of a transient failure: connection, timeout, 429, 5xx, a 200 without an answer, "
           "a reply from another model", parse=integer(minimum=0), ini="satbench_retries", metavar="N",
           config="retries"),
    Option("--give-up-after", "stop asking when no server has answered for this many seconds while requests "
           "fail (a rerun resumes)", default=120.0, parse=seconds(), ini="satbench_give_up_after", metavar="S"),
    Option("--max-reply-bytes", "a reply body larger than this is a failure (a runaway answer)",
           parse=integer(), metavar="N", config="max_reply_bytes"),
    Option("--max-answer-chars", "the stored answer text is clipped to this many characters (flagged clipped)",
           parse=integer(), metavar="N", config="max_answer_chars"),
    Option("--allow-model-alias", "a model id the servers may answer with instead of --model, repeatable or "
           "comma-separated (OpenRouter's dated ids)", kind="list", parse=_aliases,
           fields=("model_aliases",), metavar="ID", config="model_aliases"),
    Option("--tag", "name of this run's report folder under reports/<benchmark>/", default="default",
           parse=_tag, metavar="NAME"),
    Option("--store", "the results store (SQLite); put it on local disk, not NFS/Lustre/GPFS", parse=_store,
           ini="satbench_store", metavar="PATH", default_doc=".pytest_cache/d/satbench/results.sqlite"),
    Option("--store-recover", "move a corrupt results store aside (renamed .corrupt-<time>) and start a new one",
           kind="flag", default=False),
    Option("--fresh", "ignore stored answers and ask again", kind="flag", config="fresh"),
    Option("--fail-on", "what fails an item: 'error' (transport/server failures) or 'regression' "
           "(also orig right, recon wrong)", default="error", choices=("error", "regression")),
    Option("--prompt-style", "prompt convention: geocot, geochat, qwen2vl or qwen25vl", parse=_prompt_style,
           ini="satbench_prompt_style", metavar="STYLE", config="prompt_style"),
    Option("--box-grid", "grid of the model's boxes", choices=("1000", "100", "pixels"), ini="satbench_box_grid",
           default_doc="from the prompt style", config="box_grid"),
    Option("--iou", "IoU convention for grounding: inclusive (VRSBench's +1) or continuous",
           choices=("inclusive", "continuous"), config="iou"),
    Option("--judge", "LLM judge for the VRSBench answers its official rules leave undecided: an "
           "OpenAI-compatible server and optionally its model", default=(None, None), parse=_judge,
           fields=("judge_url", "judge_model"), ini="satbench_judge", metavar="URL[,MODEL]",
           default_doc="none: VRSBench's official view is rules only, a lower bound"),
    Option("--blind", "also ask every question with no image (language-prior control)", kind="flag", config="blind"),
    Option("--gate", "accuracy gate, repeatable: [BENCHMARK[/TYPE]:][FIGURE:]METRIC OP NUMBER; without FIGURE "
           "it reads the benchmark's headline (RSVQA: the original evaluation's OA), 'exact:' exact match, e.g. "
           "'rsvqa_lr:recon>=0.80', 'rsvqa_lr:published:orig>=0.92', 'delta>=-2.0'", kind="list", default=(), parse=_gates, fields=("gates",),
           ini="satbench_gates", ini_adds=True, metavar="EXPR", default_doc="none"),
    Option("--repeat-orig", "noise floor: ask the original K times in all on a sample of questions and report "
           "how often the verdict flips", parse=_repeat_orig, metavar="K", default_doc="off", config="repeat_orig"),
    Option("--repeat-sample", "questions per benchmark in the --repeat-orig sample", default=200, parse=integer(),
           metavar="N"),
    Option("--samples", "ask every question K times per arm, sample k with request seed --request-seed + k - 1 "
           "(sample 1 is the arm itself); reports mean-of-K accuracy, majority-vote accuracy and the agreement "
           "rate, and the figures and paired delta on mean-of-K (use with --temperature > 0)",
           parse=integer(minimum=1), metavar="K", config="samples"),
    Option("--bootstrap", "bootstrap resamples for the intervals", default=BOOTSTRAP, parse=integer(minimum=0),
           metavar="N"),
    Option("--no-reports", "do not write reports/<benchmark>/<tag>/", kind="flag", default=True, fields=("reports",)),
    Option("--allow-protocol-change", "allow a run to be reported under a --tag measured with another model or "
           "dataset version", kind="flag", config="allow_protocol_change"),
    Option("--export-jsonl", "write every stored row to reports/results.jsonl at the end", kind="flag",
           default=False),
    Option("--log-to", "log each report to an experiment tracker, repeatable: mlflow[:TRACKING_URI] or "
           "wandb[:PROJECT]; one tracker run per benchmark and tag, updated when the tag is resumed; needs the "
           "extra (pytest-satbench[mlflow] or [wandb]); a tracker's failure is one line (docs/trackers.md)",
           kind="list", default=(), parse=_log_to, ini="satbench_log_to",
           metavar="mlflow[:URI]|wandb[:PROJECT]", default_doc="none"),
    Option("--asked-anew", "the report counts this run's answers asked anew by reason (new question, model, "
           "prompt, image bytes, --fresh, ...); reads every earlier run's records of the benchmark (about 1.6 s "
           "per 100,000 stored answers)", kind="flag", default=False),
    Option("--progress-every", "the progress line (answered/total, q/s over the last minute, elapsed, ETA, "
           "in flight per server, errors, retries): on a terminal it is rewritten in place once a second; "
           "otherwise (CI logs, SLURM) a plain line is printed every S seconds; 0 turns it off",
           default=60, parse=integer(minimum=0), fields=(), metavar="S"),
)


def add_options(parser: pytest.Parser) -> None:
    g = parser.getgroup(GROUP, "satbench: remote-sensing VQA benchmarks")
    for opt in OPTIONS:
        if opt.kind == "flag":
            g.addoption(opt.flag, action="store_true", default=False, help=opt.full_help())
        else:
            # no argparse `choices`/`type`: its errors are a usage block, ours one line
            g.addoption(opt.flag, action="append" if opt.kind == "list" else "store", default=None,
                        metavar=opt.shown_metavar, help=opt.full_help())
        if opt.ini:
            ini_type: Literal["linelist", "string"] = "linelist" if opt.kind == "list" else "string"
            parser.addini(opt.ini, opt.ini_help(), type=ini_type)


def _field_defaults(options: Sequence[Option]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for opt in options:
        names = opt.settings_fields
        if len(names) == 1:
            out[names[0]] = opt.default if opt.built_default is None else opt.built_default
        elif names:
            out.update(zip(names, opt.default, strict=True))
    return out


_D = _field_defaults(OPTIONS)


@dataclass(frozen=True)
class Settings:
    """The validated options; field defaults come from `OPTIONS`."""

    servers: tuple[str, ...] = _D["servers"]
    builtin_server: bool = _D["builtin_server"]
    servers_file: ServerList | None = _D["servers_file"]  # --servers @FILE
    model: str | None = _D["model"]
    data_root: Path | None = _D["data_root"]
    data_root_source: str = _D["data_root_source"]
    limit: int | None = _D["limit"]
    order: str | None = _D["order"]
    seed: int = _D["seed"]
    shard: tuple[int, int] | None = _D["shard"]
    precision: float | None = _D["precision"]
    margin: float | None = _D["margin"]
    arms: tuple[ArmSpec, ...] = _D["arms"]
    max_new: int = _D["max_new"]
    temperature: float = _D["temperature"]
    top_p: float | None = _D["top_p"]
    request_seed: int | None = _D["request_seed"]
    system_prompt: str | None = _D["system_prompt"]
    extra_body: str | None = _D["extra_body"]
    concurrency: ConcurrencySpec = _D["concurrency"]
    cache_images: int = _D["cache_images"]
    cache_mb: int = _D["cache_mb"]
    lpips_weights: Path | None = _D["lpips_weights"]
    distortion: str = _D["distortion"]
    request_timeout: float = _D["request_timeout"]
    retries: int = _D["retries"]
    give_up_after: float = _D["give_up_after"]
    max_reply_bytes: int = _D["max_reply_bytes"]
    max_answer_chars: int = _D["max_answer_chars"]
    model_aliases: tuple[str, ...] = _D["model_aliases"]
    tag: str = _D["tag"]
    store: Path | None = _D["store"]
    store_recover: bool = _D["store_recover"]
    fresh: bool = _D["fresh"]
    fail_on: str = _D["fail_on"]
    prompt_style: str = _D["prompt_style"]
    box_grid: str | None = _D["box_grid"]
    iou: str = _D["iou"]
    blind: bool = _D["blind"]
    judge_url: str | None = _D["judge_url"]
    judge_model: str | None = _D["judge_model"]
    export_jsonl: bool = _D["export_jsonl"]
    asked_anew: bool = _D["asked_anew"]
    log_to: tuple[TrackerSpec, ...] = _D["log_to"]  # --log-to
    allow_protocol_change: bool = _D["allow_protocol_change"]
    gates: tuple[Gate, ...] = _D["gates"]
    bootstrap: int = _D["bootstrap"]
    repeat_orig: int = _D["repeat_orig"]
    repeat_sample: int = _D["repeat_sample"]
    samples: int = _D["samples"]
    reports: bool = _D["reports"]
    # not an option: a secret belongs in the environment, not on a command line or in an ini file
    api_key: str | None = field(default=None, repr=False)

    @property
    def stopping_rule(self) -> bool:
        """--precision or --margin: a benchmark may stop being asked before its end."""
        return self.precision is not None or self.margin is not None

    @property
    def asking_order(self) -> str:
        """The order images are asked in: --order, else random under a stopping rule (a prefix
        of the dataset order is one region, not a sample of the benchmark), else dataset."""
        return self.order or ("random" if self.stopping_rule else "dataset")


def _given(config: pytest.Config, opt: Option) -> tuple[Any, str] | None:
    """(the value as given, where: the flag or the ini name), or None when not given."""
    cli = config.getoption(opt.dest)
    if opt.kind == "flag":
        return (True, opt.flag) if cli else None
    ini = config.getini(opt.ini) if opt.ini else None
    if opt.kind == "list":
        cli_list, ini_list = list(cli or []), list(ini or [])
        if opt.ini_adds and ini_list:
            return tuple(ini_list + cli_list), str(opt.ini) if not cli_list else opt.flag
        if cli_list:
            return tuple(cli_list), opt.flag
        return (tuple(ini_list), str(opt.ini)) if ini_list else None
    if cli:  # an empty --flag= counts as not given, as an unset ini does
        return cli, opt.flag
    return (str(ini), str(opt.ini)) if ini else None


def _value(config: pytest.Config, opt: Option) -> Any:
    given = _given(config, opt)
    if given is None:
        return opt.fallback() if opt.fallback is not None else opt.default
    raw, where = given
    if opt.kind == "flag":
        return not opt.default
    parse = opt.parser
    return parse(where, raw) if parse is not None else raw


def parse_settings(config: pytest.Config) -> Settings:
    args = list(config.invocation_params.args)
    if any(a == "--servers" and b.startswith("@") for a, b in zip(args, args[1:])):
        raise pytest.UsageError("--servers @FILE: pytest reads a separate @FILE argument as its own arguments file; "
                                "write --servers=@FILE")
    values = {opt.dest: _value(config, opt) for opt in OPTIONS}
    kwargs: dict[str, Any] = {}
    for opt in OPTIONS:
        value = opt.build(values) if opt.build is not None else values[opt.dest]
        names = opt.settings_fields
        if len(names) == 1:
            kwargs[names[0]] = value
        elif names:
            kwargs.update(zip(names, value, strict=True))
    if kwargs["margin"] is not None and not kwargs["arms"]:
        raise pytest.UsageError("--margin: it decides a reconstruction arm's paired delta; pass --recon too, or "
                                "use --precision for the accuracy alone")
    if kwargs["log_to"] and not kwargs["reports"]:
        raise pytest.UsageError("--log-to: it logs each benchmark's report files, which --no-reports turns off; "
                                "drop one of them")
    api_key = os.environ.get("SATBENCH_API_KEY") or os.environ.get("OPENAI_API_KEY")
    return Settings(**kwargs, api_key=api_key)


def markdown_rows(options: Sequence[Option] = OPTIONS) -> list[str]:
    """docs/options.md's options table, `| option | default | meaning |`, from the table."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = ["| option | default | meaning |", "|---|---|---|"]
    for opt in options:
        metavar = opt.shown_metavar
        name = f"`{opt.flag} {metavar}`" if metavar else f"`{opt.flag}`"
        shown = opt.shown_default()
        if opt.kind == "flag":
            shown = "off"
        elif shown is None:
            shown = ""
        elif opt.default_doc is None:
            shown = f"`{opt.default}`" if isinstance(opt.default, str) else shown
        meaning = opt.help
        if opt.ini:
            how = ", one per line, added to these" if opt.ini_adds else ", one per line" if opt.kind == "list" else ""
            meaning += f" (ini `{opt.ini}`{how})"
        rows.append(f"| {cell(name)} | {cell(shown)} | {cell(meaning)} |")
    return rows
