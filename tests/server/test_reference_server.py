"""The bundled reference server over real loopback HTTP.

Accuracy is measured the way the plugin sends images: the original re-encoded as JPEG q95,
and a reconstruction (through the real codec) re-encoded as JPEG q95 at the same size.
"""

from __future__ import annotations

import base64
import io
import re
import socket
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
from PIL import Image

from pytest_satbench.codecs.base import ArmSpec
from pytest_satbench.codecs.simple import JpegCodec, ResizeCodec
from pytest_satbench.core.question import Question
from pytest_satbench.datasets.demo_scenes import write_demo_dataset
from pytest_satbench.datasets.rsvqa import load_rsvqa_split
from pytest_satbench.server import RunningServer, start_server
from pytest_satbench.server.__main__ import _bind_problem, main
from pytest_satbench.server.vision import count_components

TIMEOUT = 30
MODEL = "satbench-reference"  # the id start_server serves by default


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with start_server() as srv:
        yield srv


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> list[Question]:
    root = write_demo_dataset(tmp_path_factory.mktemp("demo") / "d")
    return load_rsvqa_split(root, benchmark="demo", prefix="LR", split="test",
                            image_dir="Images_LR")


def _jpeg95(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.convert("RGB").save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def _body(text: str, jpg: bytes | None, model: str = MODEL) -> dict:
    content: list[dict] = []
    if jpg is not None:
        url = "data:image/jpeg;base64," + base64.b64encode(jpg).decode()
        content.append({"type": "image_url", "image_url": {"url": url}})
    content.append({"type": "text", "text": text})
    return {"model": model, "temperature": 0.0, "max_tokens": 16,
            "messages": [{"role": "user", "content": content}]}


def _ask(session: requests.Session, url: str, text: str, jpg: bytes | None,
         model: str = MODEL) -> str:
    r = session.post(f"{url}/v1/chat/completions", json=_body(text, jpg, model),
                     timeout=TIMEOUT)
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]


def _accuracy(server: RunningServer, demo: list[Question],
              arm: Callable[[Image.Image], Image.Image]) -> dict[str, float]:
    sent: dict[str, bytes] = {}
    for q in demo:
        if q.image.id not in sent:
            with Image.open(q.image.path) as im:  # type: ignore[arg-type]  # path: set for images read from files
                sent[q.image.id] = _jpeg95(arm(im.convert("RGB")))
    hits: dict[str, list[bool]] = defaultdict(list)
    with requests.Session() as s:
        for q in demo:
            ok = _ask(s, server.url, q.text, sent[q.image.id]) == q.answer
            hits[q.type].append(ok)
            hits["overall"].append(ok)
    return {t: sum(v) / len(v) for t, v in hits.items()}


def _codec(cls: type, spec: ArmSpec) -> Callable[[Image.Image], Image.Image]:
    codec = cls(spec)
    return lambda im: codec.reconstruct(im)[0]


@pytest.fixture(scope="module")
def orig_accuracy(server: RunningServer, demo: list[Question]) -> dict[str, float]:
    return _accuracy(server, demo, lambda im: im)


def test_models_and_health(server: RunningServer) -> None:
    r = requests.get(f"{server.url}/v1/models", timeout=TIMEOUT)
    assert r.status_code == 200
    card = {"id": MODEL, "object": "model", "created": 0, "owned_by": "pytest-satbench",
            "root": MODEL, "parent": None, "max_model_len": 32768}
    assert r.json() == {"object": "list", "data": [card]}
    assert requests.get(f"{server.url}/v1/models/{MODEL}", timeout=TIMEOUT).json() == card
    assert requests.get(f"{server.url}/health", timeout=TIMEOUT).json() == {"status": "ok"}
    assert requests.get(f"{server.url}/nope", timeout=TIMEOUT).status_code == 404


def test_originals_are_answered_nearly_always(orig_accuracy: dict[str, float]) -> None:
    assert orig_accuracy["overall"] >= 0.95, orig_accuracy
    for t in ("presence", "comp", "count", "rural_urban"):
        assert orig_accuracy[t] >= 0.9, (t, orig_accuracy)


@pytest.mark.parametrize(
    ("codec", "spec", "min_count_drop"),
    [
        # Measured on the default demo (40 images, seed 0): count 1.000 -> 0.475 (q10) and
        # -> 0.658 (factor 0.25); the margins leave room for Pillow/libjpeg version drift.
        (JpegCodec, ArmSpec("jpeg", (("quality", "10"),)), 0.3),
        (ResizeCodec, ArmSpec("resize", (("factor", "0.25"),)), 0.2),
    ],
    ids=["jpeg-q10", "resize-0.25"],
)
def test_lossy_codecs_cost_accuracy_on_small_objects(
    server: RunningServer, demo: list[Question], orig_accuracy: dict[str, float],
    codec: type, spec: ArmSpec, min_count_drop: float,
) -> None:
    lossy = _accuracy(server, demo, _codec(codec, spec))
    assert orig_accuracy["count"] - lossy["count"] >= min_count_drop, (orig_accuracy, lossy)
    assert orig_accuracy["overall"] - lossy["overall"] >= 0.1, (orig_accuracy, lossy)


def test_response_shape_and_usage(server: RunningServer, demo: list[Question]) -> None:
    q = next(q for q in demo if q.type == "count")
    with Image.open(q.image.path) as im:  # type: ignore[arg-type]  # path: set for images read from files
        jpg = _jpeg95(im)
    r = requests.post(f"{server.url}/v1/chat/completions", json=_body(q.text, jpg),
                      timeout=TIMEOUT)
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/json"
    doc = r.json()
    assert doc["object"] == "chat.completion" and doc["model"] == "satbench-reference"
    assert doc["id"].startswith("chatcmpl-") and isinstance(doc["created"], int)
    choice = doc["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == q.answer
    usage = doc["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    blind = requests.post(f"{server.url}/v1/chat/completions", json=_body(q.text, None),
                          timeout=TIMEOUT).json()
    # 256x256 at 28 px per patch side is 10x10 image tokens on top of the words.
    assert usage["prompt_tokens"] - blind["usage"]["prompt_tokens"] == 100


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Is there a water area?", "yes"),
        ("How many buildings are there?", "unknown"),
        ("Is it a rural or an urban area", "yes"),
        ("Which is larger?\nA. a lake\nB. a river\nAnswer with the option's letter", "A"),
        ("What is it?\n['A. a port', 'B. a farm']", "A"),
        ("Is the USA. B. C. D. large?", "yes"),
        ("where is the ship at the bottom", "[0, 0, 1000, 1000]"),
        ("Describe the image.", "unknown"),
    ],
)
def test_blind_questions_get_the_documented_text_only_answers(
    server: RunningServer, text: str, expected: str
) -> None:
    with requests.Session() as s:
        assert _ask(s, server.url, text, None) == expected


def test_unknown_questions_with_an_image_fall_back_too(server: RunningServer) -> None:
    jpg = _jpeg95(Image.new("RGB", (64, 64), (200, 40, 40)))
    with requests.Session() as s:
        # Not a demo object: the fixed fallback, not a reading of the pixels.
        assert _ask(s, server.url, "Is there a commercial building?", jpg) == "yes"
        assert _ask(s, server.url, "How many ships are there?", jpg) == "unknown"
        # A prompt suffix does not hide a demo question; a 64 px all-red image is one roof.
        asked = "How many buildings are there?\nAnswer the question using a single word."
        assert _ask(s, server.url, asked, jpg) == "1"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b'{"model": "satbench-reference"}', "messages"),
        (b'{"messages": []}', "messages"),
        (b'{"messages": [{"role": "user", "content": [{"type": "audio"}]}]}', "unsupported"),
        (b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": '
         b'{"url": "data:image/jpeg;base64,!!!"}}]}]}', "invalid base64"),
        (b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": '
         b'{"url": "data:image/jpeg;base64,' + base64.b64encode(b"not an image")
         + b'"}}]}]}', "cannot be decoded"),
        (b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": '
         b'{"url": "http://example.com/a.jpg"}}]}]}', "data URL"),
    ],
    ids=["bad-json", "no-messages", "empty-messages", "bad-part", "bad-base64",
         "undecodable-image", "remote-url"],
)
def test_malformed_requests_get_a_400_json_error(
    server: RunningServer, body: bytes, needle: str
) -> None:
    with requests.Session() as s:
        r = s.post(f"{server.url}/v1/chat/completions", data=body,
                   headers={"Content-Type": "application/json"}, timeout=TIMEOUT)
        assert r.status_code == 400
        err = r.json()["error"]
        assert needle in err["message"] and err["type"] == "invalid_request_error"
        # The keep-alive connection is still usable after an error.
        assert s.get(f"{server.url}/health", timeout=TIMEOUT).status_code == 200


def test_32_parallel_requests(server: RunningServer, demo: list[Question]) -> None:
    picked = demo[:32]
    jpgs: dict[str, bytes] = {}
    for q in picked:
        if q.image.id not in jpgs:
            with Image.open(q.image.path) as im:  # type: ignore[arg-type]  # path: set for images read from files
                jpgs[q.image.id] = _jpeg95(im)

    def one(q: Question) -> str:
        # A connection per request: 32 sockets open at once against the threaded server.
        r = requests.post(f"{server.url}/v1/chat/completions",
                          json=_body(q.text, jpgs[q.image.id]), timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    with ThreadPoolExecutor(max_workers=32) as pool:
        got = list(pool.map(one, picked))
    with requests.Session() as s:
        assert got == [_ask(s, server.url, q.text, jpgs[q.image.id]) for q in picked]


def test_close_frees_the_port() -> None:
    srv = start_server()
    port = int(srv.url.rsplit(":", 1)[1])
    srv.close()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # would raise if the server still held it


def test_cli_serves_on_a_free_port(demo: list[Question]) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_satbench.server", "--port", "0", "--model", "ref-cli"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.search(r"(http://\S+)", line)
        assert m, line
        url = m.group(1)
        models = requests.get(f"{url}/v1/models", timeout=TIMEOUT).json()
        assert [d["id"] for d in models["data"]] == ["ref-cli"]
        q = next(q for q in demo if q.type == "rural_urban")
        with Image.open(q.image.path) as im, requests.Session() as s:  # type: ignore[arg-type]  # path: set for images read from files
            assert _ask(s, url, q.text, _jpeg95(im), model="ref-cli") == q.answer
    finally:
        proc.terminate()
        proc.wait(timeout=TIMEOUT)


def test_cli_reports_a_busy_port(server: RunningServer,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    port = server.url.rsplit(":", 1)[1]
    assert main(["--port", port]) == 2
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port}" in err and "--port" in err


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_satbench.server", *args],
                          capture_output=True, text=True, timeout=TIMEOUT, check=False)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--port", "99999"], ["--port", "99999", "0-65535"]),
        (["--port", "-1"], ["--port", "-1", "0-65535"]),
        (["--port", "eighty"], ["--port", "'eighty'", "0-65535"]),
        # TEST-NET-1 (RFC 5737) is never an address of this machine; binding it sends nothing.
        (["--host", "192.0.2.1", "--port", "0"], ["--host 192.0.2.1", "127.0.0.1"]),
        (["--model", " "], ["--model", "empty"]),
        (["--prot", "8000"], ["unrecognized arguments: --prot", "--help"]),
    ],
    ids=["port-too-big", "port-negative", "port-not-a-number", "host-not-local", "empty-model",
         "unknown-option"],
)
def test_cli_bad_options_are_one_line_and_exit_2(args: list[str], needles: list[str]) -> None:
    proc = _cli(*args)
    assert proc.returncode == 2, proc
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("satbench-server: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_cli_port_in_use_is_one_line_and_exit_2(server: RunningServer) -> None:
    port = server.url.rsplit(":", 1)[1]
    proc = _cli("--port", port)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    expected = (f"satbench-server: --port {port} is already in use on 127.0.0.1:{port}; "
                "pick another --port (0: any free port)")
    assert proc.stderr.splitlines() == [expected]


def test_cli_names_the_host_that_does_not_resolve() -> None:
    # In-process with the resolver's own error: a real lookup of a bad name would ask DNS.
    err = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    line = _bind_problem(err, "gpu-box", 8000)
    assert line.startswith("--host 'gpu-box' does not resolve (Name or service not known)")
    assert "127.0.0.1" in line


@pytest.mark.parametrize("port", [65536, -1, True])
def test_start_server_refuses_an_out_of_range_port(port: int) -> None:
    with pytest.raises(ValueError, match="0 to 65535"):
        start_server(port=port)


def test_count_components_is_4_connected_with_min_area() -> None:
    m = np.zeros((8, 10), dtype=bool)
    m[1:4, 1:3] = True  # 6 px
    m[3, 3:6] = True  # shares an edge with the block: one component of 9 px
    m[5, 7] = True  # 1 px, touching nothing
    m[4, 6] = True  # diagonal to (5, 7) and to (3, 5): its own component under 4-connectivity
    m[7, 0:10] = True  # 10 px bar
    m[0, 8:10] = True  # 2 px
    assert count_components(m, 1) == 5
    assert count_components(m, 2) == 3
    assert count_components(m, 10) == 1
    u = np.zeros((5, 5), dtype=bool)
    u[0:5, 0] = u[0:5, 4] = u[4, 0:5] = True  # a U: two runs in upper rows join at the bottom
    assert count_components(u, 1) == 1


def test_sampling_answers_by_question_and_seed(server: RunningServer) -> None:
    """At temperature 0 the answer is the fixed one; above it the server samples: the same
    seed gives the same answer, and over seeds some answers differ (the seed arrived)."""
    questions = [f"Is there a road number {i}?" for i in range(40)]

    def ask(text: str, **fields: object) -> str:
        body = {**_body(text, None), **fields}
        r = requests.post(f"{server.url}/v1/chat/completions", json=body, timeout=TIMEOUT)
        r.raise_for_status()
        return r.json()["choices"][0]["message"]["content"]

    assert {ask(q) for q in questions} == {"yes"}
    assert {ask(q, seed=3) for q in questions} == {"yes"}  # a seed at temperature 0 changes nothing
    first = [ask(q, temperature=1.0, seed=3) for q in questions]
    assert first == [ask(q, temperature=1.0, seed=3) for q in questions]
    assert set(first) == {"yes", "no"}
    other = [ask(q, temperature=1.0, seed=4) for q in questions]
    assert other != first
    r = requests.post(f"{server.url}/v1/chat/completions", json={**_body("q?", None), "seed": "x"}, timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed"
