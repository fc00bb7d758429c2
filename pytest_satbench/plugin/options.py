"""Command-line options and their validation into one `Settings` object.

Every option error is a `pytest.UsageError` with one line saying what to pass: users see
`ERROR: --concurrency: expected a positive integer, got 'x'`, never a traceback.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pytest_satbench.codecs.base import ArmSpec, SpecError, normalise_spec, parse_spec
from pytest_satbench.core.gates import Gate, GateError, parse_gate

GROUP = "satbench"


def add_options(parser: pytest.Parser) -> None:
    g = parser.getgroup(GROUP, "satbench: remote-sensing VQA benchmarks")
    g.addoption("--servers", help="comma-separated OpenAI-compatible base URLs, or 'builtin' for the bundled reference server")
    g.addoption("--model", help="model id to request (default: the one model the servers list at /v1/models)")
    g.addoption("--data-root", help="folder holding the benchmarks (default: $SATBENCH_DATA_ROOT, else $TOKLIP_ROOT/data)")
    g.addoption("--limit", help="about N questions per benchmark, stratified by question type with a fixed seed")
    g.addoption("--recon", action="append", default=[], metavar="SPEC",
                help="reconstruction arm, repeatable: identity | jpeg:quality=Q | resize:factor=F | onedpiece:ckpt=PATH,...")
    g.addoption("--nlatent", help="One-D-Piece token budgets per 256-px crop, e.g. 16,32,64 (one arm each)")
    g.addoption("--max-tiles", help="One-D-Piece: cap on 256-px crops per image (default 12)")
    g.addoption("--recon-device", help="One-D-Piece: torch device, e.g. cuda:0 or cpu")
    g.addoption("--recon-gpu", help="the seed's spelling: --recon-gpu 7 is --recon-device cuda:7")
    g.addoption("--max-new", help="max_tokens per answer (default 1024)")
    g.addoption("--concurrency", help="requests in flight across all servers (default 64)")
    g.addoption("--cache-images", help="prepared images kept in memory (default 256)")
    g.addoption("--request-timeout", help="seconds per request attempt (default 600)")
    g.addoption("--retries", help="retries of a transient failure: connection, timeout, 429, 5xx (default 4)")
    g.addoption("--tag", help="name of this run's report folder under reports/<benchmark>/ (default 'default')")
    g.addoption("--fresh", action="store_true", default=False, help="ignore stored answers and ask again")
    g.addoption("--fail-on", choices=("error", "regression"), default=None,
                help="what fails an item: 'error' (default: transport/server failures) or 'regression' (also orig right, recon wrong)")
    g.addoption("--prompt-style", help="prompt convention: geocot (default) or geochat")
    g.addoption("--box-grid", help="grid of the model's boxes: 1000 | 100 | pixels (default: from the prompt style)")
    g.addoption("--iou", help="IoU convention for grounding: inclusive (VRSBench +1, default) | continuous")
    g.addoption("--blind", action="store_true", default=False,
                help="also ask every question with no image (language-prior control)")
    g.addoption("--gate", action="append", default=[], metavar="EXPR",
                help="accuracy gate, repeatable: [BENCHMARK[/TYPE]:]METRIC OP NUMBER, e.g. 'rsvqa_lr:recon>=0.80', 'delta>=-2.0'")
    g.addoption("--repeat-orig", metavar="K",
                help="noise floor: ask the original K times in all on a sample of questions and report how often the verdict flips")
    g.addoption("--repeat-sample", metavar="N", help="questions per benchmark in the --repeat-orig sample (default 200)")
    g.addoption("--bootstrap", help="bootstrap resamples for the intervals (default 1000)")
    g.addoption("--no-reports", action="store_true", default=False, help="do not write reports/<benchmark>/<tag>/")
    g.addoption("--allow-protocol-change", action="store_true", default=False,
                help="allow a run to be reported under a --tag measured with another model or dataset version")
    g.addoption("--export-jsonl", action="store_true", default=False,
                help="write every stored row to reports/results.jsonl at the end")

    parser.addini("satbench_servers", "default for --servers")
    parser.addini("satbench_model", "default for --model")
    parser.addini("satbench_data_root", "default for --data-root")
    parser.addini("satbench_concurrency", "default for --concurrency")
    parser.addini("satbench_recon", "default --recon specs", type="linelist")
    parser.addini("satbench_prompt_style", "default for --prompt-style")
    parser.addini("satbench_gates", "accuracy gates, one per line (added to --gate)", type="linelist")


@dataclass(frozen=True)
class Settings:
    servers: tuple[str, ...] = ()
    builtin_server: bool = False
    model: str | None = None
    data_root: Path | None = None
    data_root_source: str = ""
    limit: int | None = None
    arms: tuple[ArmSpec, ...] = ()
    max_new: int = 1024
    concurrency: int = 64
    cache_images: int = 256
    request_timeout: float = 600.0
    retries: int = 4
    tag: str = "default"
    fresh: bool = False
    fail_on: str = "error"
    prompt_style: str = "geocot"
    box_grid: str | None = None
    iou: str = "inclusive"
    blind: bool = False
    export_jsonl: bool = False
    allow_protocol_change: bool = False
    gates: tuple[Gate, ...] = ()
    bootstrap: int = 1000
    repeat_orig: int = 0
    repeat_sample: int = 200
    reports: bool = True
    api_key: str | None = field(default=None, repr=False)


def _ini(config: pytest.Config, name: str) -> str | None:
    try:
        value = config.getini(name)
    except ValueError:
        return None
    if isinstance(value, list):
        return None
    return str(value) if value else None


def _int(option: str, raw: str | None, default: int, *, minimum: int = 1) -> int:
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise pytest.UsageError(f"{option}: expected an integer, got {raw!r}") from None
    if value < minimum:
        raise pytest.UsageError(f"{option}: must be at least {minimum}, got {value}")
    return value


def _float(option: str, raw: str | None, default: float) -> float:
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise pytest.UsageError(f"{option}: expected a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise pytest.UsageError(f"{option}: must be positive, got {value}")
    return value


def _choice(option: str, raw: str | None, allowed: tuple[str, ...], default: str | None) -> str | None:
    if raw is None or raw == "":
        return default
    if raw not in allowed:
        raise pytest.UsageError(f"{option}: expected one of {', '.join(allowed)}, got {raw!r}")
    return raw


def _data_root() -> tuple[Path | None, str]:
    env = os.environ.get("SATBENCH_DATA_ROOT")
    if env:
        return Path(env).expanduser(), "$SATBENCH_DATA_ROOT"
    toklip = os.environ.get("TOKLIP_ROOT")
    if toklip:
        return Path(toklip).expanduser() / "data", "$TOKLIP_ROOT/data"
    return None, ""


def _servers(raw: str | None) -> tuple[tuple[str, ...], bool]:
    if not raw:
        return (), False
    urls = [u.strip().rstrip("/") for u in raw.split(",") if u.strip()]
    if urls == ["builtin"]:
        return (), True
    for u in urls:
        if u == "builtin":
            raise pytest.UsageError("--servers: 'builtin' cannot be mixed with URLs; pass one or the other")
        if not (u.startswith("http://") or u.startswith("https://")):
            raise pytest.UsageError(
                f"--servers: {u!r} is not a URL; pass base URLs like http://gpu1:8000 (comma-separated) or 'builtin'"
            )
        if u.endswith("/v1"):
            raise pytest.UsageError(f"--servers: pass the base URL without /v1, e.g. {u[:-3]}")
    return tuple(dict.fromkeys(urls)), False


def _arms(config: pytest.Config) -> tuple[ArmSpec, ...]:
    raw: list[str] = list(config.getoption("recon") or [])
    if not raw:
        try:
            raw = list(config.getini("satbench_recon") or [])
        except ValueError:
            raw = []
    nlatent = config.getoption("nlatent")
    max_tiles = config.getoption("max_tiles")
    device = config.getoption("recon_device")
    gpu = config.getoption("recon_gpu")
    if gpu is not None:
        if device or not gpu.isdigit():
            raise pytest.UsageError("--recon-gpu: pass a GPU index (e.g. 7), and not together with --recon-device")
        device = f"cuda:{gpu}"
    if nlatent or max_tiles or device:
        try:
            raw = _expand_onedpiece(raw, nlatent, max_tiles, device)
        except SpecError as exc:
            raise pytest.UsageError(str(exc)) from None
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
    """The seed's shorthands: --nlatent 16,32 --max-tiles 12 --recon-device cuda:0.

    They apply to the onedpiece arms given with --recon; with none given, they create them
    from the checkpoint in $SATBENCH_ONEDPIECE_CKPT.
    """
    budgets = [b.strip() for b in (nlatent or "").split(",") if b.strip()]
    base = [r for r in raw if parse_spec(r)[0] == "onedpiece"]
    out = [r for r in raw if r not in base]
    if not base:
        if not os.environ.get("SATBENCH_ONEDPIECE_CKPT"):
            raise pytest.UsageError(
                "--nlatent/--max-tiles/--recon-device need a One-D-Piece checkpoint: pass "
                "--recon onedpiece:ckpt=PATH or set SATBENCH_ONEDPIECE_CKPT"
            )
        base = ["onedpiece"]
    for spec in base:
        params = parse_spec(spec)[1]
        if max_tiles:
            params["max_tiles"] = max_tiles
        if device:
            params["device"] = device
        for budget in budgets or [params.get("nlatent")]:
            if budget:
                params["nlatent"] = budget
            out.append("onedpiece:" + ",".join(f"{k}={v}" for k, v in params.items()))
    return out


def parse_settings(config: pytest.Config) -> Settings:
    opt = config.getoption
    servers, builtin = _servers(opt("servers") or _ini(config, "satbench_servers"))
    data_root_raw = opt("data_root") or _ini(config, "satbench_data_root")
    if data_root_raw:
        data_root, source = Path(data_root_raw).expanduser(), "--data-root"
    else:
        data_root, source = _data_root()
    # only an explicit option is checked here: an environment variable reaches every pytest
    # run, and a stale one must not break runs that use no benchmark
    if data_root_raw and data_root is not None and not data_root.is_dir():
        raise pytest.UsageError(f"{source}: {data_root} is not a folder; point it at the folder holding the benchmarks")
    limit_raw = opt("limit")
    limit = _int("--limit", limit_raw, 0, minimum=0) or None
    prompt_style = opt("prompt_style") or _ini(config, "satbench_prompt_style") or "geocot"
    try:
        from pytest_satbench.core import prompts

        prompts.describe(prompt_style)
    except (ImportError, AttributeError):
        pass
    except (KeyError, ValueError) as exc:
        raise pytest.UsageError(f"--prompt-style: {exc.args[0] if exc.args else exc}") from None
    return _check_repeat(Settings(
        servers=servers,
        builtin_server=builtin,
        model=opt("model") or _ini(config, "satbench_model"),
        data_root=data_root,
        data_root_source=source,
        limit=limit,
        arms=_arms(config),
        max_new=_int("--max-new", opt("max_new"), 1024),
        concurrency=_int("--concurrency", opt("concurrency") or _ini(config, "satbench_concurrency"), 64),
        cache_images=_int("--cache-images", opt("cache_images"), 256),
        request_timeout=_float("--request-timeout", opt("request_timeout"), 600.0),
        retries=_int("--retries", opt("retries"), 4, minimum=0),
        tag=_tag(opt("tag")),
        fresh=bool(opt("fresh")),
        fail_on=opt("fail_on") or "error",
        prompt_style=prompt_style,
        box_grid=_choice("--box-grid", opt("box_grid"), ("1000", "100", "pixels"), None),
        iou=_choice("--iou", opt("iou"), ("inclusive", "continuous"), "inclusive") or "inclusive",
        blind=bool(opt("blind")),
        export_jsonl=bool(opt("export_jsonl")),
        allow_protocol_change=bool(opt("allow_protocol_change")),
        gates=_gates(config),
        bootstrap=_int("--bootstrap", opt("bootstrap"), 1000, minimum=0),
        repeat_orig=_int("--repeat-orig", opt("repeat_orig"), 0, minimum=0),
        repeat_sample=_int("--repeat-sample", opt("repeat_sample"), 200),
        reports=not opt("no_reports"),
        api_key=os.environ.get("SATBENCH_API_KEY") or os.environ.get("OPENAI_API_KEY"),
    ))


def _check_repeat(settings: Settings) -> Settings:
    if settings.repeat_orig == 1:
        raise pytest.UsageError("--repeat-orig: K is the number of asks in all; pass 2 or more (or 0 to turn it off)")
    return settings


def _gates(config: pytest.Config) -> tuple[Gate, ...]:
    try:
        from_ini = list(config.getini("satbench_gates") or [])
    except ValueError:
        from_ini = []
    out = []
    for text in from_ini + list(config.getoption("gate") or []):
        try:
            out.append(parse_gate(text))
        except GateError as exc:
            raise pytest.UsageError(str(exc)) from None
    return tuple(out)


def _tag(raw: str | None) -> str:
    if not raw:
        return "default"
    if not all(ch.isalnum() or ch in "-_." for ch in raw) or raw.startswith("."):
        raise pytest.UsageError(f"--tag: use letters, digits, '-', '_' or '.', got {raw!r}")
    return raw
