"""Option parsing: the option table, its settings, its errors, the seed's shorthands."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from datasets_fake import rsvqa_suite
from servers import FakeVLM

from pytest_satbench.plugin.items import SESSION_KEY
from pytest_satbench.plugin.options import OPTIONS, Settings, _field_defaults, markdown_rows


def test_seed_shorthands_expand_to_onedpiece_arms(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_satbench.plugin.options import _expand_onedpiece

    out = _expand_onedpiece(["onedpiece:ckpt=/w/s.bin", "jpeg:quality=10"], "16,64", "6", "cuda:7")
    assert out == [
        "jpeg:quality=10",
        "onedpiece:ckpt=/w/s.bin,max_tiles=6,device=cuda:7,nlatent=16",
        "onedpiece:ckpt=/w/s.bin,max_tiles=6,device=cuda:7,nlatent=64",
    ]
    monkeypatch.delenv("SATBENCH_ONEDPIECE_CKPT", raising=False)
    with pytest.raises(pytest.UsageError, match="need a One-D-Piece checkpoint"):
        _expand_onedpiece([], "16", None, None)
    monkeypatch.setenv("SATBENCH_ONEDPIECE_CKPT", "/w/s.bin")
    assert _expand_onedpiece([], "8", None, None) == ["onedpiece:nlatent=8"]


# ---------------------------------------------------------------------- the option table
# Real pytest runs (pytester, in-process) of the plugin: what `pytest --help` shows, what the
# settings become from an ini file and a command line, what a bad value reports.

class GrabSettings:
    """A plugin passed to the in-process run: keeps the Settings the satbench plugin parsed."""

    settings: Settings | None = None

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.settings = session.config.stash[SESSION_KEY].settings


def settings_of(pytester: pytest.Pytester, *args: str) -> Settings:
    grab = GrabSettings()
    result = pytester.runpytest("--collect-only", "-q", *args, plugins=[grab])
    assert grab.settings is not None, result.stderr.str()
    return grab.settings


def test_settings_defaults_are_the_tables() -> None:
    filled = Counter(name for opt in OPTIONS for name in opt.settings_fields)
    settings_fields = {f.name for f in dataclasses.fields(Settings)}
    assert set(filled) == settings_fields - {"api_key"}  # every field has its option
    assert max(filled.values()) == 1  # and only one
    assert len({opt.flag for opt in OPTIONS}) == len(OPTIONS)
    defaults = _field_defaults(OPTIONS)
    assert {name: getattr(Settings(), name) for name in defaults} == defaults


def test_no_options_give_the_defaults(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("SATBENCH_DATA_ROOT", "TOKLIP_ROOT", "SATBENCH_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    assert settings_of(pytester) == Settings()


def test_help_shows_every_option_and_ini_with_its_default(pytester: pytest.Pytester,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # one line per option, so each help is matched whole
    result = pytester.runpytest("--help")
    assert result.ret == 0
    lines = [line.strip() for line in result.outlines] + [""]

    def shown(head: str, text: str) -> bool:
        # the help follows the name on its line, or on the next one when the name is long
        return any(line.startswith(head) and (line.endswith(text) or lines[i + 1] == text)
                   for i, line in enumerate(lines[:-1]))

    for opt in OPTIONS:
        name = f"{opt.flag}={opt.shown_metavar}" if opt.shown_metavar else opt.flag
        assert shown(name, opt.full_help()), opt.flag
        if opt.shown_default() is not None and opt.kind != "flag":
            assert "(default" in opt.full_help()
        if opt.ini:
            kind = "linelist" if opt.kind == "list" else "string"
            assert shown(f"{opt.ini} ({kind}):", opt.ini_help()), opt.ini
    assert "(default: auto: no cap but 512 per server)" in opt_help("--concurrency")
    assert "(default 'geocot')" in opt_help("--prompt-style")


def opt_help(flag: str) -> str:
    return next(o for o in OPTIONS if o.flag == flag).full_help()


# per option with an ini name: ini value, command-line value, Settings value read back,
# expected from the ini, expected with both
IniCase = tuple[str, str, Callable[[Settings], Any], Any, Any]


def _touch(path: Path) -> Path:
    path.touch()
    return path


def ini_cases(d1: Path, d2: Path) -> dict[str, IniCase]:
    def arms(s: Settings) -> tuple[str, ...]:
        return tuple(a.canonical for a in s.arms)

    return {
        "--servers": ("http://a:1", "http://b:2/", lambda s: s.servers, ("http://a:1",), ("http://b:2",)),
        "--model": ("m-ini", "m-cli", lambda s: s.model, "m-ini", "m-cli"),
        "--data-root": (str(d1), str(d2), lambda s: (s.data_root, s.data_root_source),
                        (d1, "satbench_data_root"), (d2, "--data-root")),
        "--recon": ("jpeg:quality=10", "jpeg:quality=20", arms, ("jpeg:quality=10",), ("jpeg:quality=20",)),
        "--max-new": ("100", "200", lambda s: s.max_new, 100, 200),
        "--temperature": ("0.7", "0", lambda s: s.temperature, 0.7, 0.0),
        "--top-p": ("0.9", "1", lambda s: s.top_p, 0.9, 1.0),
        "--request-seed": ("7", "8", lambda s: s.request_seed, 7, 8),
        "--system-prompt": ("Be brief.", "Be careful.", lambda s: s.system_prompt, "Be brief.", "Be careful."),
        "--extra-body": ('{"b": 1, "a": [true]}', '{"top_k": 20}', lambda s: s.extra_body, '{"a":[true],"b":1}',
                         '{"top_k":20}'),
        "--concurrency": ("8", "total:3", lambda s: (s.concurrency.per_server, s.concurrency.total),
                          (8, None), (None, 3)),
        "--concurrency-control": ("fixed", "adaptive", lambda s: s.concurrency.adaptive, False, True),
        "--metrics": ("off", "auto", lambda s: s.concurrency.metrics, False, True),
        "--cache-images": ("10", "20", lambda s: s.cache_images, 10, 20),
        "--cache-mb": ("32", "128", lambda s: s.cache_mb, 32, 128),
        # an existing file (what it holds is checked when the run starts)
        "--lpips-weights": (str(_touch(d1 / "w.pth")), str(_touch(d2 / "w.pth")), lambda s: s.lpips_weights,
                            (d1 / "w.pth").resolve(), (d2 / "w.pth").resolve()),
        "--distortion": ("off", "on", lambda s: s.distortion, "off", "on"),
        "--request-timeout": ("30", "2.5", lambda s: s.request_timeout, 30.0, 2.5),
        "--retries": ("0", "2", lambda s: s.retries, 0, 2),
        "--give-up-after": ("30", "5", lambda s: s.give_up_after, 30.0, 5.0),
        "--prompt-style": ("geochat", "geocot", lambda s: s.prompt_style, "geochat", "geocot"),
        "--box-grid": ("100", "pixels", lambda s: s.box_grid, "100", "pixels"),
        "--store": (str(d1 / "a.sqlite"), str(d2 / "b.sqlite"), lambda s: s.store, (d1 / "a.sqlite").resolve(),
                    (d2 / "b.sqlite").resolve()),
        "--judge": ("http://j:1", "http://k:2,gpt-4o-mini", lambda s: (s.judge_url, s.judge_model),
                    ("http://j:1", None), ("http://k:2", "gpt-4o-mini")),
        "--log-to": ("wandb:lab/vqa", "mlflow:sqlite:///m.db", lambda s: tuple(t.text for t in s.log_to),
                     ("wandb:lab/vqa",), ("mlflow:sqlite:///m.db",)),
        # the ini's gates are added to the command line's, not replaced
        "--gate": ("delta>=-2.0", "recon>=0.5", lambda s: tuple(g.text for g in s.gates),
                   ("delta>=-2.0",), ("delta>=-2.0", "recon>=0.5")),
    }


def test_ini_values_apply_and_the_command_line_beats_them(pytester: pytest.Pytester) -> None:
    d1, d2 = pytester.mkdir("d1"), pytester.mkdir("d2")
    cases = ini_cases(d1, d2)
    with_ini = {o.flag: o for o in OPTIONS if o.ini}
    assert set(cases) == set(with_ini)  # a new ini option needs its case here
    pytester.makeini("[pytest]\n" + "".join(f"{with_ini[f].ini} = {c[0]}\n" for f, c in cases.items()))
    from_ini = settings_of(pytester)
    cli = [arg for flag, c in cases.items() for arg in (flag, c[1])]
    from_both = settings_of(pytester, *cli)
    for flag, (_, _, read, want_ini, want_both) in cases.items():
        assert read(from_ini) == want_ini, flag
        assert read(from_both) == want_both, flag


# per option with a parser: a bad value and the one line it gives
BAD_VALUES: dict[str, tuple[str, str]] = {
    "--servers": ("gpu1:8000", "--servers: 'gpu1:8000' is not a URL*"),
    "--data-root": ("/nonexistent/data", "--data-root: /nonexistent/data is not a folder*"),
    "--limit": ("x", "--limit: expected an integer, got 'x'"),
    "--shard": ("5/4", "--shard: I must be from 1 to N (parts are numbered from 1), got '5/4'"),
    "--recon": ("webp", "--recon 'webp': unknown codec 'webp'*"),
    "--nlatent": ("16,x", "--nlatent: expected an integer, got 'x'"),
    "--max-tiles": ("0", "--max-tiles: must be at least 1, got 0"),
    "--recon-gpu": ("cuda:1", "--recon-gpu: pass a GPU index (e.g. 7)*"),
    "--max-new": ("x", "--max-new: expected an integer, got 'x'"),
    "--temperature": ("hot", "--temperature: expected a number, got 'hot'"),
    "--top-p": ("0", "--top-p: expected a number above 0 up to 1, got '0'"),
    "--request-seed": ("-1", "--request-seed: must be at least 0, got -1"),
    "--system-prompt": (" ", "--system-prompt: pass the system prompt's text, or @FILE*"),
    "--extra-body": ("{enable_thinking: false}", "--extra-body: not valid JSON (*); pass an object, e.g. *"),
    "--concurrency": ("many", "--concurrency: expected auto, N (per server) or total:N, got 'many'"),
    "--concurrency-control": ("auto", "--concurrency-control: expected one of adaptive, fixed, got 'auto'"),
    "--metrics": ("on", "--metrics: expected one of auto, off, got 'on'"),
    "--distortion": ("no", "--distortion: expected one of on, off, got 'no'"),
    "--cache-images": ("0", "--cache-images: must be at least 1, got 0"),
    "--cache-mb": ("0", "--cache-mb: must be at least 1, got 0"),
    "--lpips-weights": ("/nonexistent/alex.pth", "--lpips-weights: /nonexistent/alex.pth is not a file; pass the *"),
    "--request-timeout": ("soon", "--request-timeout: expected a number of seconds, got 'soon'"),
    "--retries": ("-1", "--retries: must be at least 0, got -1"),
    "--give-up-after": ("never", "--give-up-after: expected a number of seconds, got 'never'"),
    "--max-reply-bytes": ("0", "--max-reply-bytes: must be at least 1, got 0"),
    "--max-answer-chars": ("x", "--max-answer-chars: expected an integer, got 'x'"),
    "--allow-model-alias": (",", "--allow-model-alias: pass a model id*"),
    "--tag": ("../x", "--tag: use letters, digits, '-', '_' or '.', got '../x'"),
    "--fail-on": ("x", "--fail-on: expected one of error, regression, got 'x'"),
    "--prompt-style": ("x", "--prompt-style: unknown prompt style 'x'; known: *"),
    "--box-grid": ("7", "--box-grid: expected one of 1000, 100, pixels, got '7'"),
    "--iou": ("x", "--iou: expected one of inclusive, continuous, got 'x'"),
    "--store": (".", "--store: * is a folder; pass the results file*"),
    "--judge": ("judge:8000", "--judge: 'judge:8000' is not URL*; pass one judge server*"),
    "--gate": ("x", "--gate 'x': expected *"),
    "--repeat-orig": ("1", "--repeat-orig: K is the number of asks in all*"),
    "--repeat-sample": ("x", "--repeat-sample: expected an integer, got 'x'"),
    "--samples": ("0", "--samples: must be at least 1, got 0"),
    "--bootstrap": ("x", "--bootstrap: expected an integer, got 'x'"),
    "--log-to": ("neptune", "--log-to: 'neptune' names no tracker; pass mlflow[:URI] or wandb[:PROJECT]"),
    "--progress-every": ("-1", "--progress-every: must be at least 0, got -1"),
    "--order": ("shuffled", "--order: expected one of dataset, random, got 'shuffled'"),
    "--seed": ("-3", "--seed: must be at least 0, got -3"),
    "--precision": ("0", "--precision: must be a positive number of points, got '0'"),
    "--margin": ("two", "--margin: expected a number of points, e.g. 4 or 2.5, got 'two'"),
}


def assert_one_line_usage_error(result: pytest.RunResult, message: str) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = [line for line in result.errlines if line.strip()]
    assert len(lines) == 1, lines
    result.stderr.fnmatch_lines([f"ERROR: {message}"])


def test_every_parsed_option_has_a_bad_value_case() -> None:
    parsed = {o.flag for o in OPTIONS if o.parser is not None or o.build is not None}
    assert set(BAD_VALUES) == parsed


@pytest.mark.parametrize("flag", list(BAD_VALUES))
def test_a_bad_value_is_one_line_naming_the_option(pytester: pytest.Pytester, flag: str) -> None:
    value, message = BAD_VALUES[flag]
    assert_one_line_usage_error(pytester.runpytest(flag, value), message)


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--extra-body", '{"max_tokens": 5}', "--extra-body: key 'max_tokens' is the plugin's to set (use --max-new)"),
    ("--extra-body", '{"messages": []}', "--extra-body: key 'messages' is the plugin's to set (*)"),
    ("--extra-body", "[1, 2]", "--extra-body: expected a JSON object, got list*"),
    ("--temperature", "nan", "--temperature: expected a number from 0 to 2, got 'nan'"),
    ("--top-p", "1.5", "--top-p: expected a number above 0 up to 1, got '1.5'"),
])
def test_a_model_setting_out_of_bounds_is_one_line(pytester: pytest.Pytester, flag: str, value: str,
                                                   message: str) -> None:
    assert_one_line_usage_error(pytester.runpytest(flag, value), message)


def test_the_system_prompt_reads_a_file(pytester: pytest.Pytester) -> None:
    path = pytester.path / "system.txt"
    path.write_text("You are a remote-sensing analyst.\nAnswer briefly.\n", encoding="utf-8")
    # with "=": a separate "@FILE" argument is pytest's own arguments file, read before any option
    assert settings_of(pytester, f"--system-prompt=@{path}").system_prompt == path.read_text(encoding="utf-8")
    assert settings_of(pytester, "--system-prompt", "plain text").system_prompt == "plain text"
    pytester.makeini(f"[pytest]\nsatbench_system_prompt = @{path}\n")
    assert settings_of(pytester).system_prompt == path.read_text(encoding="utf-8")
    path.write_bytes(b"\xff\xfe not utf-8")
    assert_one_line_usage_error(pytester.runpytest(f"--system-prompt=@{path}"),
                                f"--system-prompt: cannot read {path} (not UTF-8 text)*")
    assert_one_line_usage_error(pytester.runpytest(f"--system-prompt=@{path}.missing"),
                                f"--system-prompt: cannot read {path}.missing (No such file or directory)*")


def test_margin_without_a_reconstruction_arm_is_one_line(pytester: pytest.Pytester) -> None:
    assert_one_line_usage_error(pytester.runpytest("--margin", "2"), "--margin: it decides a reconstruction arm's*")
    assert_one_line_usage_error(pytester.runpytest("--precision", "inf"),
                                "--precision: must be a positive number of points, got 'inf'")


def test_a_bad_ini_value_is_one_line_naming_the_ini(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nsatbench_concurrency = many\nsatbench_request_timeout = nan\n")
    assert_one_line_usage_error(pytester.runpytest(),
                                "satbench_concurrency: expected auto, N (per server) or total:N, got 'many'")
    # a good command-line value means the ini's is not used, so not checked
    assert_one_line_usage_error(pytester.runpytest("--concurrency", "2"),
                                "satbench_request_timeout: must be a positive number of seconds, got 'nan'")


def test_the_docs_table_is_the_generated_one() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "options.md").read_text()
    start = page.index("| option | default | meaning |")
    end = page.find("\n\n", start)
    table = page[start:end if end != -1 else None].splitlines()
    assert table == markdown_rows(), (
        "regenerate docs/options.md's table from plugin/options.py: python -c 'from "
        "pytest_satbench.plugin.options import markdown_rows; print(*markdown_rows(), sep=chr(10))'")


def test_markdown_rows_cover_the_table() -> None:
    rows = markdown_rows()
    assert rows[0] == "| option | default | meaning |"
    assert len(rows) == 2 + len(OPTIONS)
    row = rows[2 + [o.flag for o in OPTIONS].index("--concurrency")]
    assert row.startswith("| `--concurrency auto\\|N\\|total:N` | auto: no cap but 512 per server | cap on requests"), row
    assert all(row.count(" | ") == 2 for row in rows[2:])  # no unescaped | inside a cell


# ---------------------------------------------------------------------- xdist

BENCH_MODULE = """
from pytest_satbench import benchmark_test
test_rsvqa_lr = benchmark_test("rsvqa_lr")
"""

# records what the satbench scheduler was built with, from the controller
FILL_TO_CONFTEST = """
import pytest

@pytest.hookimpl(wrapper=True)
def pytest_xdist_make_scheduler(config, log):
    sched = yield
    (config.rootpath / "fill_to.txt").write_text(str(getattr(sched, "fill_to", None)))
    return sched
"""


def test_xdist_scheduler_honours_ini_concurrency(pytester: pytest.Pytester) -> None:
    data = rsvqa_suite(pytester, BENCH_MODULE, n_images=2, per_type=1)
    pytester.makeconftest(FILL_TO_CONFTEST)
    pytester.makeini("[pytest]\nsatbench_concurrency = 8\n")
    fill_to = pytester.path / "fill_to.txt"
    with FakeVLM(models=["m"], answer=lambda prompt, has_image, image: "yes") as srv:
        args = ("--servers", srv.url, "--data-root", str(data), "-n", "2", "-q",
                "-W", "ignore::pytest.PytestAssertRewriteWarning")
        from_ini = pytester.runpytest(*args)
        assert from_ini.ret == 0, from_ini.stdout.str()
        # the scheduler keeps 4 x the requests the caps allow queued: 8 per server, one server
        assert json.loads(fill_to.read_text()) == 4 * 8
        from_cli = pytester.runpytest(*args, "--concurrency", "total:3")
        assert from_cli.ret == 0, from_cli.stdout.str()
        assert json.loads(fill_to.read_text()) == 4 * 3
