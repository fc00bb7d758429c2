"""`--log-to mlflow[:URI]` / `--log-to wandb[:PROJECT]` with the real libraries, offline.

MLflow writes to a SQLite tracking store in tmp and is read back with `MlflowClient`; W&B runs
with WANDB_MODE=offline under a tmp WANDB_DIR and is read back from the run's `.wandb` file
(wandb 0.31 has no Python reader of it: `records` below reads its LevelDB-log framing and parses
each record with wandb's own protobuf, `wandb.proto.wandb_internal_pb2.Record`). No traffic
leaves loopback: telemetry is off, and the only server is the reference server (or a closed
loopback port). Skipped where the extras are not installed.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_satbench.core.records import AnswerRow
from pytest_satbench.engine.store import ResultStore
from pytest_satbench.report.__main__ import main as report_main
from pytest_satbench.report.trackers import TrackerError, parse_log_to, run_key

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
NO_REWRITE_WARNING = ("-p", "no:randomly", "-W", "ignore::pytest.PytestAssertRewriteWarning")


@pytest.fixture(autouse=True)
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tracker stays on this machine, for this test and the pytest runs it starts."""
    for name, value in {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1", "WANDB_MODE": "offline",
                        "WANDB_DIR": str(tmp_path / "wandb"), "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
                        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"), "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
                        "WANDB_SILENT": "true", "WANDB_ERROR_REPORTING": "false",
                        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'default-mlflow.db'}"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)  # MLflow puts a SQLite store's artifacts in ./mlruns
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    (tmp_path / "wandb").mkdir()


def test_a_log_to_value_names_a_tracker_and_its_target() -> None:
    assert parse_log_to("mlflow") == parse_log_to(" MLflow ")
    assert parse_log_to("mlflow:sqlite:////tmp/x.db").target == "sqlite:////tmp/x.db"  # a URI keeps its colons
    assert parse_log_to("wandb:lab/vqa").target == "lab/vqa"
    for bad in ("neptune", "wandb:a b", ""):
        with pytest.raises(TrackerError):
            parse_log_to(bad)
    assert run_key("demo", "t", "r1") == run_key("demo", "t", "r1") != run_key("demo", "t2", "r1")


# ---------------------------------------------------------------------- MLflow, a real run


def _mlflow_runs(uri: str, tag: str) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("satbench")
    return client.search_runs([exp.experiment_id], filter_string=f"tags.`satbench.tag` = '{tag}'")


READ_BACK = """
import json, sys
from mlflow.tracking import MlflowClient
uri, tag, out = sys.argv[1:]
client = MlflowClient(uri)
exp = client.get_experiment_by_name("satbench")
runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`satbench.tag` = '{tag}'")
json.dump([{"run_id": r.info.run_id, "status": r.info.status, "params": r.data.params, "tags": r.data.tags,
            "metrics": r.data.metrics,
            "steps": [m.step for m in client.get_metric_history(r.info.run_id, "headline/orig/accuracy")],
            "artifacts": [a.path for a in client.list_artifacts(r.info.run_id, "report")],
            "summary": client.download_artifacts(r.info.run_id, "report/summary.json", out)} for r in runs],
          open(out + "/runs.json", "w"))
"""


def read_mlflow(uri: str, tag: str, out: Path) -> list[dict[str, Any]]:
    """The MLflow runs of `tag`, read back with MlflowClient in a child process (a pytester test
    restores sys.modules after it: mlflow imported in it would be half-removed for the next)."""
    out.mkdir()
    subprocess.run([sys.executable, "-c", READ_BACK, uri, tag, str(out)], check=True, timeout=300)
    return json.loads((out / "runs.json").read_text())


def test_a_run_and_its_resume_log_one_mlflow_run(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """The demo against the reference server, `--log-to mlflow:sqlite:///...`: the protocol as
    parameters, the figures as metrics, the report files as artifacts; the tag resumed with more
    questions, then its report rebuilt by the report CLI, update that one run."""
    if importlib.util.find_spec("mlflow") is None:  # not imported here: pytester drops what a test imports
        pytest.skip("mlflow is not installed (pip install 'pytest-satbench[mlflow]')")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    pytester.makeini("[pytest]\n")
    shutil.copytree(BENCHMARKS, pytester.path / "benchmarks")
    wandb = importlib.util.find_spec("wandb") is not None
    args = ["benchmarks", "-k", "demo", "--servers", "builtin", "--recon", "jpeg:quality=10", "--tag", "lab",
            "--bootstrap", "200", "--log-to", f"mlflow:{uri}", *(["--log-to", "wandb:runs"] if wandb else []),
            *NO_REWRITE_WARNING]
    first = pytester.runpytest_subprocess(*args, "--limit", "4")
    assert first.ret == 0, first.stdout.str()
    first.stdout.fnmatch_lines(["satbench: demo/lab: created MLflow run * (experiment 'satbench', sqlite:*)"])
    second = pytester.runpytest_subprocess(*args, "--limit", "8")
    assert second.ret == 0, second.stdout.str()
    second.stdout.fnmatch_lines(["satbench: demo/lab: updated MLflow run *"])
    if wandb:  # the plugin's end logs to W&B too: both runs' offline folders hold the one run id
        key = second.outlines[[i for i, x in enumerate(second.outlines) if "logged W&B run" in x][0]].split()[5]
        files = sorted((tmp_path / "wandb" / "wandb").glob("offline-run-*/run-*.wandb"))
        assert [f.name for f in files] == [f"run-{key}.wandb"] * 2

    [run] = read_mlflow(uri, "lab", tmp_path / "read1")
    folder = pytester.path / "reports" / "demo" / "lab"
    summary = json.loads((folder / "summary.json").read_text())
    assert run["tags"]["satbench.runs"] == ",".join(summary["coverage"]["runs"])
    assert len(summary["coverage"]["runs"]) == 2
    params = run["params"]
    assert params["model"] == "satbench-reference" and params["sampling.temperature"] == "0.0"
    assert params["limit"] == "4"  # MLflow never changes a parameter: the resume's value is a tag
    assert run["tags"]["protocol.limit"] == "8" and "limit" in run["tags"]["satbench.params_changed"].split(",")
    assert params["arm_labels.jpeg_quality_10"] == "jpeg:q10"  # a key part as MLflow takes it
    m = run["metrics"]
    head = summary["aggregate_views"][summary["headline"]]
    assert m["headline/orig/accuracy"] == head["accuracy"]["orig"]["value"]
    pair = head["paired"]["jpeg:quality=10"]
    assert (m["headline/jpeg_q10/delta_pp"], m["headline/jpeg_q10/delta_ci_low_pp"],
            m["headline/jpeg_q10/delta_ci_high_pp"]) == (pair["delta"], pair["ci_low"], pair["ci_high"])
    logged = 0
    for typ, g in summary["statistics"]["by_type"].items():  # per type: accuracy and interval, the delta
        a, p = g["accuracy"]["jpeg:quality=10"], g["paired"]["jpeg:quality=10"]
        for name, want in (("accuracy", a["accuracy"]), ("ci_low", a["ci_low"]), ("ci_high", a["ci_high"]),
                           ("delta_pp", p["delta"]), ("delta_ci_low_pp", p["ci_low"]),
                           ("delta_ci_high_pp", p["ci_high"])):
            key = f"exact_match/{typ}/jpeg_q10/{name}"
            assert m.get(key) == want, key  # an interval a type's few questions leave undefined is not logged
            logged += want is not None
    assert logged >= 2 * 4
    assert m["questions"] == 8

    # the report rebuilt from the store, logged again: still one run, a third point
    store = pytester.path / ".pytest_cache" / "d" / "satbench" / "results.sqlite"
    result = subprocess.run([sys.executable, "-m", "pytest_satbench.report", "--store", str(store), "--tag", "lab",
                             "--out", str(tmp_path / "rebuilt"), "--iterations", "200", "--log-to", f"mlflow:{uri}"],
                            capture_output=True, text=True, cwd=pytester.path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "satbench: demo/lab: updated MLflow run " + run["run_id"] in result.stdout
    [again] = read_mlflow(uri, "lab", tmp_path / "read2")
    assert again["run_id"] == run["run_id"] and again["status"] == "FINISHED"
    assert again["steps"] == [1, 2, 2]
    assert {f"report/{n}" for n in ("report.md", "report.html", "summary.json", "protocol.json", "per_type.csv",
                                    "per_image.csv")} <= set(again["artifacts"])
    assert "report/predictions.jsonl" not in again["artifacts"]
    assert json.loads(Path(again["summary"]).read_text())["coverage"] == json.loads(
        (tmp_path / "rebuilt" / "demo" / "lab" / "summary.json").read_text())["coverage"]


# ---------------------------------------------------------------------- a budget sweep, both trackers

SPEC = "onedpiece:ckpt=/w/s.bin,max_tiles=1,nlatent={}"


def write_sweep(path: Path, run_id: str = "sweep") -> None:
    """A store as a sweep of two budgets writes it: tok16 wrong on every image's first
    question, tok64 never."""
    store = ResultStore(path)
    arms = {"orig": None, SPEC.format(16): 16, SPEC.format(64): 64}
    store.start_run(run_id, "s", {"model": "m", "prompt_style": "geocot", "arms": list(arms),
                                  "sampling": {"temperature": 0.0, "max_tokens": 64}})
    for j in range(6):
        for i in range(3):
            k = j * 3 + i
            nodeid = f"t::test_demo[{k}]"
            q = {"key": str(k), "text": "Is there a road?", "answer": "yes", "types": ["presence" if i else "comp"],
                 "kind": "vqa", "choices": None, "extra": [], "image_id": f"img{j}", "image_path": None, "prompt": "?"}
            fps = {arm: f"{arm}-{k}" for arm in arms}
            store.record_item(run_id, nodeid, "demo", q, fps)
            for arm, budget in arms.items():
                store.put(AnswerRow(nodeid=nodeid, arm=arm, fingerprint=fps[arm], status="ok", benchmark="demo",
                                    question_key=str(k), image_id=f"img{j}", run_id=run_id, image_tokens=budget,
                                    text="no" if budget == 16 and i == 0 else "yes"))
    store.finish_run(run_id)
    store.close()


def records(path: Path) -> list[Any]:
    """The records of a W&B `.wandb` file: a 7-byte header (":W&B", magic, version), then
    LevelDB-log framing (32 KiB blocks; each chunk: crc32c, length, type 1 full / 2 first /
    3 middle / 4 last), each record one `wandb_internal_pb2.Record`."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    out, pos, buf = [], 7, b""
    while pos + 7 <= len(data):
        room = 32768 - pos % 32768
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if room >= 7 else (0, 0, 0)
        if room < 7 or (length == 0 and kind == 0):
            pos += room
            continue
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
            buf = b""
    return out


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def test_a_budget_sweep_logged_to_both_trackers_offline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The report CLI with --log-to twice: W&B (offline) gets the run id from the tag's identity,
    the protocol as config, the figures in its summary, the curve as a table and the files as an
    artifact; MLflow the curve as a table and as metrics stepped by tokens. Logged again: the
    same W&B run id, the same MLflow run."""
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    store = tmp_path / "r.sqlite"
    write_sweep(store)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = ["--store", str(store), "--tag", "s", "--out", str(tmp_path / "out"), "--iterations", "200",
            "--log-to", "wandb:satbench-test", "--log-to", f"mlflow:{uri}"]
    for _ in range(2):
        assert report_main(argv) == 0
    out = capsys.readouterr().out
    key = run_key("demo", "s", "sweep")
    assert out.count(f"satbench: demo/s: logged W&B run {key} (project 'satbench-test', ") == 2
    assert "demo/s: created MLflow run" in out and "demo/s: updated MLflow run" in out

    files = sorted((tmp_path / "wandb" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 2  # one offline fragment per logging, of the one run `wandb sync` resumes
    for f in files:
        recs = records(f)
        [run] = [r.run for r in recs if r.WhichOneof("record_type") == "run"]
        assert (run.run_id, run.project, run.display_name) == (key, "satbench-test", "demo/s")
    recs = records(files[-1])
    config = {_key(u): json.loads(u.value_json) for r in recs if r.WhichOneof("record_type") == "config"
              for u in r.config.update}
    assert config["model"] == "m" and config["satbench.first_run"] == "sweep" and config["satbench.key"] == key
    summary = {_key(u): json.loads(u.value_json) for r in recs if r.WhichOneof("record_type") == "summary"
               for u in r.summary.update}
    assert summary["headline/orig/accuracy"] == 1.0
    assert summary["exact_match/comp/tok16/delta_pp"] == -100.0
    assert summary["headline/tok64/delta_ci_low_pp"] == summary["headline/tok64/delta_ci_high_pp"] == 0.0
    history = {_key(u): json.loads(u.value_json) for r in recs if r.WhichOneof("record_type") == "history"
               for u in r.history.item}
    assert history["budget_curve/_type"] == "table-file" and history["budget_curve/nrows"] == 9  # 3 groups x 3 arms
    table = json.loads((files[-1].parent / "files" / history["budget_curve/path"]).read_text())
    rows = [dict(zip(table["columns"], r, strict=True)) for r in table["data"]]
    assert [(r["label"], r["tokens"], r["delta_pp"]) for r in rows if r["group"] == "overall"] == [
        ("orig", None, None), ("tok16", 16.0, -100 / 3), ("tok64", 64.0, 0.0)]
    [art] = [r.artifact for r in recs if r.WhichOneof("record_type") == "artifact" and r.artifact.type == "satbench-report"]
    assert {c.path for c in art.manifest.contents} >= {"report.md", "report.html", "summary.json", "protocol.json",
                                                       "per_type.csv"}

    client = MlflowClient(uri)
    [run] = _mlflow_runs(uri, "s")
    hist = client.get_metric_history(run.info.run_id, "budget/onedpiece/overall/accuracy")
    assert sorted({(h.step, h.value) for h in hist}) == [(16, 2 / 3), (64, 1.0)]
    table = json.loads(Path(client.download_artifacts(run.info.run_id, "budget_curve.json", str(tmp_path / "dl")))
                       .read_text())
    rows = [dict(zip(table["columns"], r, strict=True)) for r in table["data"]]
    overall = [(r["label"], r["tokens"], r["within_margin"]) for r in rows if r["group"] == "overall"]
    assert overall == [("orig", None, None), ("tok16", 16.0, False), ("tok64", 64.0, True)]


# ---------------------------------------------------------------------- failures are one line


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_tracker_that_fails_is_one_line_and_the_report_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """An MLflow server that does not answer, a tracking URI MLflow refuses (its file store,
    in maintenance since 3.x, unless MLFLOW_ALLOW_FILE_STORE) and a library that is not
    installed: one line each, exit status 0, every report file written."""
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    store = tmp_path / "r.sqlite"
    write_sweep(store)
    port = _closed_port()
    argv = ["--store", str(store), "--out", str(tmp_path / "out"), "--iterations", "50",
            "--log-to", f"mlflow:http://127.0.0.1:{port}", "--log-to", f"mlflow:file://{tmp_path / 'mlruns'}",
            "--log-to", "wandb"]
    assert report_main(argv) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("satbench: --log-to")]
    assert len(lines) == 3, lines
    assert lines[0].startswith(f"satbench: --log-to mlflow:http://127.0.0.1:{port}: demo/s not logged (")
    assert lines[1].startswith(f"satbench: --log-to mlflow:file://{tmp_path / 'mlruns'}: demo/s not logged (")
    assert "MLFLOW_ALLOW_FILE_STORE" in lines[1]
    assert lines[2] == "satbench: --log-to wandb: wandb is not installed: pip install 'pytest-satbench[wandb]'"
    assert all("--log-to mlflow:" in x for x in lines[:2])  # each says how to log it again
    folder = tmp_path / "out" / "demo" / "s"
    assert {p.name for p in folder.iterdir()} >= {"report.md", "report.html", "summary.json", "protocol.json",
                                                  "per_type.csv", "predictions.jsonl"}


def test_a_bad_log_to_is_a_usage_error_and_start_up_imports_no_tracker(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("--log-to", "neptune", "-p", "no:randomly")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --log-to: 'neptune' names no tracker; pass mlflow[:URI] or wandb[:PROJECT]"])
    result = pytester.runpytest_subprocess("--log-to", "wandb", "--no-reports", "-p", "no:randomly")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --log-to: it logs each benchmark's report files, which --no-reports *"])
    probe = ("import sys, pytest_satbench.plugin, pytest_satbench.plugin.options as o; "
             "bad = [m for m in sys.modules if m.split('.')[0] in ('mlflow', 'wandb') "
             "or m == 'pytest_satbench.report.trackers']; assert not bad, bad; "
             "assert o.Settings().log_to == ()")
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)
