"""Run reports: built from a hand-made store with known answers, so every number is known."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from pytest_satbench.engine.store import AnswerRow, ResultStore
from pytest_satbench.report import write_reports
from pytest_satbench.report.plots import ORIG_COLOUR, PALETTE

BENCH = "demo"
TAG = "nightly"
JPEG = "jpeg:quality=10"
OD16 = "onedpiece:ckpt=/nonexistent/onedpiece.bin,dtype=fp32,max_tiles=12,nlatent=16,variant=S"
OD64 = "onedpiece:ckpt=/nonexistent/onedpiece.bin,dtype=fp32,max_tiles=12,nlatent=64,variant=S"
ARMS = ["orig", JPEG, OD16, OD64, "blind"]
TYPES = ["presence", "comp", "count", "rural_urban"]
ANSWERS = ["yes", "no", "3", "rural"]
SECRET = "sk-secretvalue1234567890"
SERVER_A = "http://127.0.0.1:8001"
SERVER_B = f"http://user:{SECRET}@127.0.0.1:8002"
N_IMAGES = 3
TOKENS = {OD16: 16 * 4, OD64: 64 * 4}
MAGIC = b"SATBC1\n"


def _answer(arm: str, i: int, j: int) -> tuple[str, str]:
    """(text, finish_reason) of arm on image i, question j; see the expectations below."""
    right = ANSWERS[j]
    if arm == "orig":
        return right, "stop"
    if arm == JPEG:
        return ("no" if j == 0 else right), "stop"
    if arm == OD16:
        if j == 0:
            return "no", "stop"
        if j == 2:
            return [("2", "stop"), ("2", "length"), ("", "stop")][i]
        return right, "stop"
    if arm == OD64:
        return ("no" if (i, j) == (0, 0) else right), "stop"
    return "yes", "stop"  # blind: right on presence only


def _fake_jpeg(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (40, 40), (seed * 40 % 256, 90, 160)).save(buf, format="JPEG")
    return buf.getvalue()


def build_store(root: Path, protocol: dict) -> tuple[ResultStore, str, Path]:
    """3 images x 4 questions x 5 arms; jpeg errors on image 2 question 1."""
    store = ResultStore(root / "cache" / "d" / "satbench" / "results.sqlite")
    recon_cache = root / "cache" / "d" / "satbench-recon"
    run_id = "run0001"
    store.start_run(run_id, TAG, protocol)
    latency = 0.1
    for i in range(N_IMAGES):
        img = root / f"img{i}.png"
        Image.new("RGB", (96, 64), ((60 * i) % 256, 120, 200 - 50 * i)).save(img)
        for j in range(4):
            key = f"{i}_{j}"
            nodeid = f"tests/test_bench.py::test_demo[{key}]"
            q = {"key": key, "text": f"question {j} about image {i}?", "answer": ANSWERS[j], "types": [TYPES[j]],
                 "kind": "vqa", "choices": None, "extra": [], "image_id": f"img{i}", "image_path": str(img),
                 "prompt": f"question {j} about image {i}?"}
            fps = {arm: f"fp-{arm}-{key}" for arm in ARMS}
            store.record_item(run_id, nodeid, BENCH, q, fps)
            for arm in ARMS:
                base = {"nodeid": nodeid, "arm": arm, "fingerprint": fps[arm], "benchmark": BENCH,
                        "question_key": key, "image_id": f"img{i}"}
                if arm == JPEG and (i, j) == (2, 1):
                    store.put(AnswerRow(status="error", error="HTTP 503 after 3 attempts", **base))
                    continue
                text, finish = _answer(arm, i, j)
                server = SERVER_A if j % 2 == 0 else SERVER_B
                sent = None if arm == "blind" else hashlib.sha256(f"{arm}{i}".encode()).hexdigest()
                if arm == OD16 and i == 0:
                    payload = _fake_jpeg(7)
                    sent = hashlib.sha256(payload).hexdigest()
                    entry = recon_cache / sent[:2] / ("k" * 62)
                    entry.parent.mkdir(parents=True, exist_ok=True)
                    entry.write_bytes(MAGIC + hashlib.sha256(payload).digest() + payload)
                store.put(AnswerRow(
                    status="ok", text=text, extracted=text, correct=True,  # stored verdicts are ignored
                    parsed=True, finish_reason=finish, latency_s=latency, prompt_tokens=100,
                    completion_tokens=5, cost=0.001 if server == SERVER_A else None,
                    model="served-model", server=server, attempts=1, image_sha256=sent,
                    image_tokens=TOKENS.get(arm), **base,
                ))
                latency += 0.1
    store.finish_run(run_id)
    return store, run_id, recon_cache


PROTOCOL = {
    "plugin_version": "0.1.0",
    "command": ["pytest", "--servers", SERVER_B, "--api-key", SECRET, f"--api-key={SECRET}"],
    "model": "served-model",
    "servers": [SERVER_A, SERVER_B],
    "sampling": {"temperature": 0.0, "max_tokens": 64},
    "prompt_style": "geocot", "box_grid": None, "iou": "inclusive",
    "arms": ARMS, "limit": None,
    "datasets": {BENCH: {"LR_split_test_questions.json": "ab" * 32}},
    "date": "2026-11-29T12:00:00+0000", "tag": TAG,
}
GATES = [
    {"expr": f"delta[{JPEG}] > -5", "passed": False, "value": -33.3, "reason": "jpeg costs too much"},
    {"expr": "accuracy[orig] >= 0.9", "passed": True, "value": 1.0, "reason": ""},
]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ResultStore, str, Path]:
    root = tmp_path_factory.mktemp("report")
    store, run_id, _ = build_store(root, PROTOCOL)
    folders = write_reports(store, run_id, root / "reports", gates=GATES, iterations=200)
    assert folders == [root / "reports" / BENCH / TAG]
    return folders[0], store, run_id, root


def test_summary_numbers(report) -> None:
    folder, *_ = report
    s = json.loads((folder / "summary.json").read_text())
    st = s["statistics"]
    assert s["questions"] == 12 and st["overall"]["n_images"] == N_IMAGES
    assert st["arms"] == ["orig", JPEG, OD16, OD64, "blind"]
    acc = st["overall"]["accuracy"]
    assert acc["orig"]["correct"] == 12 and acc["orig"]["accuracy"] == 1.0
    # jpeg: wrong on 3 presence questions and one API error (wrong, in the denominator)
    assert (acc[JPEG]["correct"], acc[JPEG]["n"], acc[JPEG]["errors"]) == (8, 12, 1)
    assert acc[OD16]["correct"] == 6 and acc[OD16]["truncated"] == 1 and acc[OD16]["unparseable"] == 1
    assert acc[OD16]["coverage"] == pytest.approx(11 / 12)
    assert acc[OD64]["correct"] == 11 and acc["blind"]["correct"] == 3
    p = st["overall"]["paired"][JPEG]
    assert (p["regressed"], p["improved"], p["n_errors"]) == (4, 0, 1)
    assert p["delta"] == pytest.approx(-100 * 4 / 12)
    assert p["mcnemar_p"] == pytest.approx(2 * 0.5**4)
    assert p["delta_both_ok"] == pytest.approx(-100 * 3 / 11)
    assert p["ci_low"] <= p["delta"] <= p["ci_high"]
    lo, hi = acc[JPEG]["ci_low"], acc[JPEG]["ci_high"]
    assert lo <= 8 / 12 <= hi and lo < hi
    # per type: presence regressed everywhere on jpeg; count only on OD16
    bt = st["by_type"]
    assert bt["presence"]["accuracy"][JPEG]["correct"] == 0
    assert bt["count"]["accuracy"][OD16]["correct"] == 0 and bt["count"]["chance"]["n_defined"] == 0
    assert st["overall"]["chance"]["accuracy"] == pytest.approx(0.5)
    assert s["aggregate_views"]["average_accuracy"]["per_arm"][JPEG] == pytest.approx((0 + 2 / 3 + 1 + 1) / 4)
    assert s["regressed_questions"] == 7  # 3 presence + 1 error + 3 count (OD16)
    assert s["gallery"] == ["0_0", "0_2", "1_0", "1_2", "2_0", "2_1", "2_2"]
    assert [g["passed"] for g in s["gates"]] == [False, True] and s["gates_note"] is None


def test_usage(report) -> None:
    folder, *_ = report
    u = json.loads((folder / "summary.json").read_text())["usage"]
    ok = 12 * 5 - 1
    assert u["total"]["answers"] == ok and u["errors"] == 1 and u["errors_by_arm"] == {JPEG: 1}
    assert u["total"]["prompt_tokens"] == 100 * ok and u["total"]["completion_tokens"] == 5 * ok
    a = u["by_server"][SERVER_A]
    assert a["answers"] == 30 and a["rows_with_cost"] == 30 and a["cost"] == pytest.approx(0.03)
    b = u["by_server"]["http://127.0.0.1:8002"]  # user:token@ removed
    assert b["answers"] == 29 and b["rows_with_cost"] == 0
    lat = [0.1 * (k + 1) for k in range(ok)]
    assert u["total"]["latency_mean_s"] == pytest.approx(sum(lat) / ok)
    assert u["total"]["latency_p50_s"] == pytest.approx(sorted(lat)[ok // 2])
    assert a["latency_p95_s"] > a["latency_p50_s"]
    assert u["total"]["models"] == {"served-model": ok}
    assert u["image_tokens"] == {"orig": None, JPEG: None, OD16: 64.0, OD64: 256.0, "blind": None}


def test_csv_and_predictions(report) -> None:
    folder, *_ = report
    rows = list(csv.DictReader((folder / "per_type.csv").open()))
    assert len(rows) == (4 + 1) * 5
    overall_jpeg = next(r for r in rows if r["type"] == "overall" and r["arm"] == JPEG)
    assert int(overall_jpeg["correct"]) == 8 and int(overall_jpeg["regressed"]) == 4
    assert float(overall_jpeg["delta_pp"]) == pytest.approx(-100 * 4 / 12)
    od16 = next(r for r in rows if r["type"] == "overall" and r["arm"] == OD16)
    assert float(od16["mean_image_tokens"]) == 64.0
    preds = [json.loads(line) for line in (folder / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 12 * 5
    # re-scored: the store said correct=True for everything
    assert sum(p["correct"] for p in preds if p["arm"] == JPEG) == 8
    err = next(p for p in preds if p["status"] == "error")
    assert (err["key"], err["arm"], err["correct"], err["answer"]) == ("2_1", JPEG, False, None)
    trunc = next(p for p in preds if p["finish_reason"] == "length")
    assert trunc["arm"] == OD16 and trunc["key"] == "1_2" and trunc["latency_s"] > 0
    assert all(set(p) >= {"extracted", "image_sha256", "prompt_tokens", "completion_tokens", "latency_s"} for p in preds)


def test_protocol_has_no_key(report) -> None:
    folder, *_ = report
    proto = json.loads((folder / "protocol.json").read_text())
    assert proto["model"] == "served-model" and proto["models_returned"] == {"served-model": 59}
    assert proto["dataset_sha256"] == {"LR_split_test_questions.json": "ab" * 32}
    assert proto["servers"] == [SERVER_A, "http://127.0.0.1:8002"]
    assert proto["command"][3:] == ["--api-key", "<redacted>", "--api-key=<redacted>"]
    assert proto["codecs"][1] == {"arm": OD16, "codec": "onedpiece", "checkpoint": "/nonexistent/onedpiece.bin", "checkpoint_sha256": None}
    for f in folder.iterdir():
        text = f.read_text(encoding="utf-8")
        assert SECRET not in text, f"{f.name} leaks the API key"
        assert "secretvalue" not in text, f.name


def test_run_protocol_has_no_key_field() -> None:
    """The plugin's protocol never takes the key, whatever the settings hold."""
    from pathlib import Path

    from pytest_satbench.engine.config import RuntimeConfig

    cfg = RuntimeConfig(run_id="r", tag="t", urls=(SERVER_A,), store_path=Path("/nonexistent"),
                        max_new=64, blind=True, api_key=SECRET, command=("pytest", "-q"))
    proto = cfg.protocol("m")
    assert SECRET not in json.dumps(proto)
    assert not {k for k in proto if "key" in k.lower() or "token" in k.lower()}


def test_markdown_and_html(report) -> None:
    folder, *_ = report
    md = (folder / "report.md").read_text()
    assert "| FAIL |" in md and "| PASS |" in md
    assert "7 questions regressed" in md and "## Accuracy versus image tokens" in md
    assert "RSVQA overall accuracy" not in md  # demo is not labelled as RSVQA
    assert "binned accuracy (count/area answers in the RSVQA bins), count | 100.0% | 100.0% | 66.7%" in md
    assert "binned accuracy (count/area answers in the RSVQA bins), comp" not in md
    html = (folder / "report.html").read_text()
    assert html.count("<svg") == 2  # accuracy bars + tokens curve
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "").replace(SERVER_A, "").replace("http://127.0.0.1:8002", "")
    assert "<script" not in html and "<link" not in html
    # gallery, 7 questions: 7 originals; jpeg regenerated on 4 (0_0, 1_0, 2_0, 2_1); OD16 of
    # image 0 found in the disk cache (0_0, 0_2); every other One-D-Piece panel (OD64 on 0_0,
    # OD16 on 1_0, 1_2, 2_0, 2_2) is said to be missing, never faked
    assert html.count("data:image/jpeg;base64,") == 7 + 4 + 2
    assert html.count("reconstruction not kept") == 5
    # the stored sha256 of the jpeg bytes is made up here, so the regenerated ones differ
    assert html.count("not byte-identical to what was sent") == 3
    assert "(no answer: HTTP 503 after 3 attempts)" in html


def _pngs_colours(png: Path) -> dict[tuple[int, int, int], int]:
    with Image.open(png) as im:
        return {c: n for n, c in im.convert("RGB").getcolors(maxcolors=1 << 22) or []}


def _hex(c: str) -> tuple[int, int, int]:
    return (int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16))


def test_html_screenshot(report, tmp_path: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium); the HTML screenshot is not checked")
    folder, *_ = report
    png = tmp_path / "shot.png"
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={png}", "--window-size=1200,2400",
           (folder / "report.html").as_uri()]
    subprocess.run(cmd, capture_output=True, timeout=60, check=False)
    assert png.is_file() and png.stat().st_size > 20_000, "chromium wrote no screenshot"
    colours = _pngs_colours(png)
    # the bars: orig and the three reconstruction arms in their palette colours
    # (solid areas, so hundreds of exact pixels; a JPEG thumbnail never has that many)
    for c in (ORIG_COLOUR, *PALETTE[1:4]):
        assert colours.get(_hex(c), 0) >= 300, f"bar colour {c} not in the screenshot"


def test_cli(report, tmp_path: Path) -> None:
    _, store, run_id, _ = report
    db = str(store.path)
    env_cmd = [sys.executable, "-m", "pytest_satbench.report"]
    got = subprocess.run(env_cmd + ["--store", db, "--list"], capture_output=True, text=True, timeout=60, check=False)
    assert got.returncode == 0 and run_id in got.stdout and f"tag={TAG}" in got.stdout
    bad = subprocess.run(env_cmd + ["--store", db, "--run", "nope"], capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "'nope'" in bad.stderr
    missing = subprocess.run(env_cmd + ["--store", str(tmp_path / "none.sqlite")], capture_output=True, text=True, timeout=60, check=False)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "none.sqlite" in missing.stderr
    ok = subprocess.run(env_cmd + ["--store", db, "--tag", TAG, "--out", str(tmp_path / "out"), "--iterations", "50"],
                        capture_output=True, text=True, timeout=120, check=False)
    assert ok.returncode == 0, ok.stderr
    assert json.loads((tmp_path / "out" / BENCH / TAG / "summary.json").read_text())["run_id"] == run_id


def test_grounding_views_by_uniqueness(tmp_path: Path) -> None:
    """vrsbench_ref: Acc@0.5 / Acc@0.7 per uniqueness, an error counted as IoU 0."""
    store = ResultStore(tmp_path / "results.sqlite")
    store.start_run("r", "t", {**PROTOCOL, "arms": ["orig", JPEG], "command": ["pytest"]})
    full, half = "[100,100,500,500]", "[100,100,300,500]"  # IoU 1 and 861/1681 = 0.51 with {<10><10><50><50>}
    plan = [("unique", full, half), ("non-unique", half, "no"), ("unique", full, None), ("non-unique", full, full)]
    for k, (kind, orig, recon) in enumerate(plan):
        key = str(k)
        q = {"key": key, "text": "the car", "answer": "{<10><10><50><50>}", "types": [kind], "kind": "ref",
             "choices": None, "extra": [["is_unique", str(kind == "unique")]], "image_id": f"img{k // 2}",
             "image_path": None, "prompt": "where is the car"}
        store.record_item("r", f"t::test_vrsbench_ref[{key}]", "vrsbench_ref", q, {"orig": "o" + key, JPEG: "j" + key})
        for arm, fp, text in (("orig", "o" + key, orig), (JPEG, "j" + key, recon)):
            base = {"nodeid": f"t::test_vrsbench_ref[{key}]", "arm": arm, "fingerprint": fp,
                    "benchmark": "vrsbench_ref", "question_key": key, "image_id": f"img{k // 2}"}
            if text is None:
                store.put(AnswerRow(status="error", error="timeout", **base))
            else:
                store.put(AnswerRow(status="ok", text=text, finish_reason="stop", latency_s=1.0, **base))
    [folder] = write_reports(store, "r", tmp_path / "out", iterations=0)
    s = json.loads((folder / "summary.json").read_text())
    agg = s["aggregate_views"]
    assert agg["view:acc@0.5"]["label"] == "Acc@0.5 (IoU >= 0.5), by uniqueness"
    a5, a7 = agg["view:acc@0.5"]["by_type"], agg["view:acc@0.7"]["by_type"]
    assert (a5["unique"]["orig"]["mean"], a5["unique"][JPEG]["mean"]) == (1.0, 0.5)
    assert (a5["non-unique"]["orig"]["mean"], a5["non-unique"][JPEG]["mean"]) == (1.0, 0.5)
    assert (a7["unique"]["orig"]["mean"], a7["unique"][JPEG]["mean"]) == (1.0, 0.0)
    assert (a7["non-unique"]["orig"]["mean"], a7["non-unique"][JPEG]["mean"]) == (0.5, 0.5)
    assert agg["view:iou"]["overall"][JPEG]["mean"] == pytest.approx((861 / 1681 + 0 + 0 + 1) / 4)
    assert agg["view:acc@0.5"]["overall"]["orig"]["ci_low"] is None  # iterations=0: no interval
    # embedded images (no path): the gallery says so instead of showing a picture
    html = (folder / "report.html").read_text()
    assert "image embedded in the dataset; not kept by the run" in html


def test_reports_use_the_terminals_arm_labels(report) -> None:
    """One label per arm everywhere (core.arms.arm_labels), the full spec in a legend."""
    folder, *_ = report
    md = (folder / "report.md").read_text()
    assert "| type | n | `orig` | `jpeg:q10` | `tok16` | `tok64` | `blind` | random |" in md
    assert f"`tok16` = `{OD16}`; `tok64` = `{OD64}`" in md and f"`jpeg:q10` = `{JPEG}`" in md
    assert "## `tok16` minus `orig` (paired, percentage points)" in md
    assert "onedpiece n=" not in md
    terminal = md.split("## Terminal summary", 1)[1]
    assert "jpeg:q10    tok16    tok64" in terminal  # the same labels in the embedded terminal table
    # traffic was not recorded by this hand-made store: the columns say so
    assert "| http://127.0.0.1:8001 | - | 30 | - | - | 3,000 | 150 | $0.030000 | 30/30 |" in md
    html = (folder / "report.html").read_text()
    assert '<th class="num"><code>tok16</code></th>' in html and "onedpiece n=" not in html
    assert '<td class="fail">FAIL</td>' in html and '<td class="pass">PASS</td>' in html
    assert '<td class="num">-33.3</td>' in html
