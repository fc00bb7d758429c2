"""`python -m pytest_satbench.data fetch|verify` against a loopback mirror (tests/data_fetch/
mirror.py: real HTTP with Range) serving small archives built here in the benchmarks' exact
formats (tests/datasets_fake.py), unpacked and then read by the real loaders (registry)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from pytest_satbench.data import __main__ as cli
from pytest_satbench.data.fetch import DOWNLOADS, MIRROR_ENV
from pytest_satbench.data.transfer import LOCK_NAME, FetchError, unpack
from pytest_satbench.datasets.registry import LoadRequest, get
from pytest_satbench.datasets.sources import by_name
from tests.data_fetch.mirror import Mirror, serve, tar_folder, zip_folder
from tests.datasets_fake import write_lhrs_qa_json, write_rsvqa, write_vrsbench

LR = "records/6344334/files/"
HR = "records/6344367/files/"
VRS_REV = by_name()["vrsbench"].revision
VRS = f"datasets/xiang709/VRSBench/resolve/{VRS_REV}/"
LHRS_SHA = "c60778e" + "0" * 33  # what the mirror says `main` resolves to
LHRS = f"datasets/PumpkinCat/LHRS_Data/resolve/{LHRS_SHA}/"


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def build_mirror(tmp: Path, *, zenodo_md5: bool = False) -> tuple[Mirror, dict[str, set[str]]]:
    """Every source's files under the relative paths of sources.py; returns the mirror and,
    per benchmark, the question keys a loader must yield."""
    m = Mirror()
    expected: dict[str, set[str]] = {}
    b = tmp / "build"
    lr = write_rsvqa(b / "lr", "lr")
    expected["rsvqa_lr"] = lr.keys
    for name in ("LR_split_test_questions.json", "LR_split_test_answers.json"):
        m.files[LR + name] = (b / "lr/RSVQA-LR" / name).read_bytes()
    m.files[LR + "Images_LR.zip"] = zip_folder(b / "lr/RSVQA-LR/Images_LR", "Images_LR")
    if zenodo_md5:  # the record API's shape: files[].key, files[].checksum = "md5:<hex>"
        m.add_json("api/records/6344334", {"files": [
            {"key": p[len(LR):], "checksum": "md5:" + _md5(m.files[p])} for p in m.files if p.startswith(LR)]})
    hr = write_rsvqa(b / "hr", "hr")
    phili = write_rsvqa(b / "hr", "hr_phili", first_img_id=40)
    expected["rsvqa_hr"], expected["rsvqa_hr_phili"] = hr.keys, phili.keys
    for split in ("test", "test_phili"):
        for kind in ("questions", "answers"):
            name = f"USGS_split_{split}_{kind}.json"
            m.files[HR + name] = (b / "hr/RSVQA-HR" / name).read_bytes()
    # the real tar holds .png copies beside the .tif files; only Data/*.tif is unpacked
    m.files[HR + "Images.tar"] = tar_folder(b / "hr/RSVQA-HR/Data", "Data", extra={"Data/10.png": b"png copy"})
    vrs = write_vrsbench(b / "vrs", vqa_name="RSBench_EVAL_vqa.json", ref_name="RSBench_EVAL_referring.json")
    expected["vrsbench"] = {e.key for e in vrs.extra["vqa"]}
    expected["vrsbench_ref"] = {e.key for e in vrs.extra["ref"]}
    for name in ("RSBench_EVAL_vqa.json", "RSBench_EVAL_referring.json"):
        m.files[VRS + name] = (b / "vrs/VRSBench" / name).read_bytes()
    m.files[VRS + "Images_val.zip"] = zip_folder(b / "vrs/VRSBench/Images_val", "")  # no folder inside
    zsha = hashlib.sha256(m.files[VRS + "Images_val.zip"]).hexdigest()
    m.add_json(f"api/datasets/xiang709/VRSBench/tree/{VRS_REV}", [
        {"type": "file", "path": "RSBench_EVAL_vqa.json", "size": 1},
        {"type": "file", "path": "Images_val.zip", "size": 1, "lfs": {"oid": zsha, "size": 1}},
    ])
    lh = write_lhrs_qa_json(b / "lhrs", image_format="jpg")
    expected["lhrs"] = lh.keys
    m.add_json("api/datasets/PumpkinCat/LHRS_Data/revision/main", {"sha": LHRS_SHA})
    m.files[LHRS + "LHRS-Bench/qa.json"] = (b / "lhrs/LHRS_Bench/qa.json").read_bytes()
    listing = []
    for img in sorted((b / "lhrs/LHRS_Bench/imgs_jpg").iterdir()):
        m.files[LHRS + f"LHRS-Bench/imgs_jpg/{img.name}"] = img.read_bytes()
        listing.append({"type": "file", "path": f"LHRS-Bench/imgs_jpg/{img.name}", "size": img.stat().st_size})
    m.add_json(f"api/datasets/PumpkinCat/LHRS_Data/tree/{LHRS_SHA}/LHRS-Bench", [
        {"type": "directory", "path": "LHRS-Bench/imgs_jpg"}, {"type": "file", "path": "LHRS-Bench/qa.json"}])
    m.add_json(f"api/datasets/PumpkinCat/LHRS_Data/tree/{LHRS_SHA}/LHRS-Bench/imgs_jpg", listing)
    return m, expected


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = cli.main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def lock(root: Path) -> dict:
    return json.loads((root / LOCK_NAME).read_text())["files"]


def test_fetch_every_benchmark_unpacks_the_layout_the_loaders_read(tmp_path, capsys):
    m, expected = build_mirror(tmp_path, zenodo_md5=True)
    root = tmp_path / "data"
    with serve(m):
        rc, out, err = run(capsys, "fetch", "rsvqa_lr", "rsvqa_hr", "vrsbench", "lhrs",
                           "--root", str(root), "--mirror", m.url)
    assert rc == 0, err
    assert out.splitlines()[-1].endswith(f"run pytest with: --data-root {root}")
    assert "%" in err and "[#" in err  # a progress bar per file, on stderr
    for name, keys in expected.items():
        questions = list(get(name).load(LoadRequest(root)))
        assert {q.key for q in questions} == keys, name
        assert all(Path(q.image.path).is_file() for q in questions if q.image.path), name
    assert not (root / "RSVQA-HR/Data/10.png").exists()  # only Data/*.tif, as the guides unpack it
    assert (root / "VRSBench/Images_val").is_dir() and (root / "LHRS_Bench/imgs_jpg").is_dir()
    files = lock(root)
    assert files["rsvqa_lr/Images_LR.zip"]["verified"] == "md5"  # Zenodo's published MD5
    assert files["vrsbench/Images_val.zip"]["verified"] == "sha256"  # the Hub's LFS SHA-256
    assert files["rsvqa_hr/Images.tar"]["verified"] == "first-seen"
    assert json.loads((root / LOCK_NAME).read_text())["revisions"] == {"lhrs": LHRS_SHA}
    assert all(rng is None for _, rng in m.log)  # nothing to resume: no range asked
    # a second fetch downloads nothing
    n = len(m.log)
    with serve(m):
        rc, out, err = run(capsys, "fetch", "rsvqa_lr", "--root", str(root), "--mirror", m.url)
    assert rc == 0 and "already here" in err
    assert [p for p, _ in m.log[n:] if not p.startswith("api/")] == []


def test_a_transfer_cut_short_is_resumed_with_a_range_request(tmp_path, capsys):
    m, expected = build_mirror(tmp_path)
    path = LR + "Images_LR.zip"
    m.truncate_once.add(path)
    root = tmp_path / "data"
    with serve(m):
        rc, _, err = run(capsys, "fetch", "rsvqa_lr", "--root", str(root), "--mirror", m.url)
    assert rc == 0, err
    size = len(m.files[path])
    assert m.requests(path) == [None, f"bytes={size // 2}-"]  # two requests: whole, then the rest
    assert (root / DOWNLOADS / "rsvqa_lr/Images_LR.zip").read_bytes() == m.files[path]
    assert {q.key for q in get("rsvqa_lr").load(LoadRequest(root))} == expected["rsvqa_lr"]


def test_a_part_file_left_by_an_earlier_fetch_is_continued_from_its_size(tmp_path, capsys):
    m, _ = build_mirror(tmp_path)
    path = HR + "Images.tar"
    root = tmp_path / "data"
    part = root / DOWNLOADS / "rsvqa_hr/Images.tar.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(m.files[path][:1000])  # a fetch stopped after 1000 bytes
    with serve(m):
        rc, _, err = run(capsys, "fetch", "rsvqa_hr", "--root", str(root), "--mirror", m.url)
    assert rc == 0, err
    assert m.requests(path) == ["bytes=1000-"]
    assert (root / DOWNLOADS / "rsvqa_hr/Images.tar").read_bytes() == m.files[path]
    assert not part.exists()


def test_a_server_that_ignores_range_restarts_the_part_file(tmp_path, capsys):
    m, _ = build_mirror(tmp_path)
    path = LR + "Images_LR.zip"
    m.ignore_range.add(path)
    root = tmp_path / "data"
    part = root / DOWNLOADS / "rsvqa_lr/Images_LR.zip.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"left by an earlier try, not a prefix of the file")
    with serve(m):
        rc, _, err = run(capsys, "fetch", "rsvqa_lr", "--root", str(root), "--mirror", m.url)
    assert rc == 0, err
    assert m.requests(path) == [f"bytes={len(b'left by an earlier try, not a prefix of the file')}-"]
    assert (root / DOWNLOADS / "rsvqa_lr/Images_LR.zip").read_bytes() == m.files[path]


def test_a_corrupted_file_is_refused_in_one_line_and_not_unpacked(tmp_path, capsys):
    m, _ = build_mirror(tmp_path, zenodo_md5=True)
    m.corrupt.add(LR + "Images_LR.zip")
    root = tmp_path / "data"
    with serve(m):
        rc, _, err = run(capsys, "fetch", "rsvqa_lr", "--root", str(root), "--mirror", m.url)
    assert rc == 2
    last = err.strip().splitlines()[-1]
    assert "rsvqa_lr/Images_LR.zip: MD5" in last and "Zenodo publishes" in last and "refused, not unpacked" in last
    assert not (root / "RSVQA-LR/Images_LR").exists()
    assert "rsvqa_lr/Images_LR.zip" not in lock(root)
    assert (root / DOWNLOADS / "rsvqa_lr/Images_LR.zip.rejected").is_file()


def test_without_a_published_checksum_the_first_seen_sha256_is_locked(tmp_path, capsys):
    m, _ = build_mirror(tmp_path)  # no record API: nothing published
    root = tmp_path / "data"
    with serve(m):
        assert run(capsys, "fetch", "rsvqa_lr", "--root", str(root), "--mirror", m.url)[0] == 0
    entry = lock(root)["rsvqa_lr/Images_LR.zip"]
    assert entry["verified"] == "first-seen"
    assert entry["sha256"] == hashlib.sha256(m.files[LR + "Images_LR.zip"]).hexdigest()
    # the archive and its folder are gone; the mirror now serves different bytes
    (root / DOWNLOADS / "rsvqa_lr/Images_LR.zip").unlink()
    for p in (root / "RSVQA-LR/Images_LR").iterdir():
        p.unlink()
    (root / "RSVQA-LR/Images_LR").rmdir()
    m.corrupt.add(LR + "Images_LR.zip")
    with serve(m):
        rc, _, err = run(capsys, "fetch", "rsvqa_lr", "--root", str(root), "--mirror", m.url)
    assert rc == 2
    line = err.strip().splitlines()[-1]
    assert "differs from the one first seen" in line and LOCK_NAME in line and "not unpacked" in line
    assert not (root / "RSVQA-LR/Images_LR").exists()


def test_verify_says_which_benchmark_is_in_which_state(tmp_path, capsys):
    m, _ = build_mirror(tmp_path, zenodo_md5=True)
    root = tmp_path / "data"
    with serve(m):
        assert run(capsys, "fetch", "rsvqa_lr", "rsvqa_hr", "--root", str(root), "--mirror", m.url)[0] == 0
    rc, out, _ = run(capsys, "verify", "--root", str(root))
    states = dict(line.split(": ", 1) for line in out.splitlines() if not line.startswith(" "))
    assert states["rsvqa_lr"] == "complete"
    assert states["rsvqa_hr"] == states["rsvqa_hr_phili"] == "unverified-first-seen"
    assert states["vrsbench"] == states["lhrs"] == "missing files"
    assert rc == 1
    (root / "RSVQA-HR/USGS_split_test_phili_answers.json").write_text('{"answers": []}')
    (root / "RSVQA-LR/LR_split_test_answers.json").unlink()
    rc, out, _ = run(capsys, "verify", "rsvqa_lr", "rsvqa_hr", "rsvqa_hr_phili", "--root", str(root))
    states = dict(line.split(": ", 1) for line in out.splitlines() if not line.startswith(" "))
    assert states == {"rsvqa_lr": "missing files", "rsvqa_hr": "unverified-first-seen",
                      "rsvqa_hr_phili": "changed files"}
    assert f"{root}/RSVQA-LR/LR_split_test_answers.json" in out and rc == 1  # (no server runs here)


def test_offline_says_what_to_fetch_where_and_a_copy_put_there_is_used(tmp_path, capsys, monkeypatch):
    m, expected = build_mirror(tmp_path)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/"
    monkeypatch.setenv(MIRROR_ENV, dead)  # the environment variable, not --mirror
    root = tmp_path / "data"
    rc, _, err = run(capsys, "fetch", "rsvqa_lr", "--root", str(root))
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert "cannot reach" in lines[0] and dead in lines[0]
    assert "https://zenodo.org/records/6344334/files/" in lines[0]
    assert "LR_split_test_questions.json LR_split_test_answers.json Images_LR.zip" in lines[0]
    assert str(root / DOWNLOADS / "rsvqa_lr") in lines[0]
    (root / DOWNLOADS / "rsvqa_lr").mkdir(parents=True, exist_ok=True)
    for p, body in m.files.items():  # the user copies the files there by hand
        if p.startswith(LR):
            (root / DOWNLOADS / "rsvqa_lr" / p[len(LR):]).write_bytes(body)
    rc, _, err = run(capsys, "fetch", "rsvqa_lr", "--root", str(root))
    assert rc == 0, err
    assert {q.key for q in get("rsvqa_lr").load(LoadRequest(root))} == expected["rsvqa_lr"]


def test_unpacking_refuses_members_outside_the_folder_and_skips_links(tmp_path):
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("Images_LR/1.tif", b"ok")
        zf.writestr("../outside.txt", b"no")
    with pytest.raises(FetchError, match="outside"):
        unpack(evil, "zip", tmp_path / "out", "Images_LR")
    assert not (tmp_path / "outside.txt").exists()
    tar = tmp_path / "links.tar"
    with tarfile.open(tar, "w") as tf:
        link = tarfile.TarInfo("Data/link.tif")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(link)
        info = tarfile.TarInfo("Data/1.tif")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"ok"))
    assert unpack(tar, "tar", tmp_path / "hr", "Data") == 1
    assert not (tmp_path / "hr/Data/link.tif").exists() and (tmp_path / "hr/Data/1.tif").read_bytes() == b"ok"


def test_with_huggingface_hub_installed_hub_files_come_through_it(tmp_path):
    """No mirror set: the Hub's files come through `huggingface_hub` (its HEAD, then GET),
    here pointed at the loopback server by the Hub's own $HF_ENDPOINT; checked and unpacked
    as any other download."""
    pytest.importorskip("huggingface_hub")
    m, expected = build_mirror(tmp_path)
    root = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if k not in (MIRROR_ENV, "HF_TOKEN")}
    with serve(m):
        env.update(HF_ENDPOINT=m.url.rstrip("/"), HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_TELEMETRY="1",
                   HF_HUB_OFFLINE="0")
        done = subprocess.run([sys.executable, "-m", "pytest_satbench.data", "fetch", "vrsbench", "--root", str(root)],
                              capture_output=True, text=True, timeout=120, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert ("datasets/xiang709/VRSBench/resolve/" + VRS_REV + "/Images_val.zip", "HEAD") in m.log
    assert f"api/datasets/xiang709/VRSBench/tree/{VRS_REV}" in [p for p, _ in m.log]
    assert lock(root)["vrsbench/Images_val.zip"]["verified"] == "sha256"
    for name in ("vrsbench", "vrsbench_ref"):
        assert {q.key for q in get(name).load(LoadRequest(root))} == expected[name]
