"""Codecs are found through the entry-point group `pytest_satbench.codecs`: a third-party
codec needs only its entry point, a broken one fails only the specs that name it, and
run-time parameters (device, batch) never enter an arm's identity.

Discovery runs once per process, so the third-party cases run in a fresh interpreter with
a real distribution (a `.dist-info` folder) on its path: importlib.metadata finds it exactly
as it finds an installed package.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_satbench.codecs import base
from pytest_satbench.codecs.base import ArmSpec, SpecError, build_codecs, normalise_spec

# A third-party package: `acme` registers itself on import, `posterize` is a CodecFactory
# object named by its entry point, `broken` needs a module that is not installed (an
# optional extra), `dup` tries to take the built-in name `jpeg`.
ACME = '''
from __future__ import annotations

from PIL import Image

from pytest_satbench.codecs.base import ArmSpec, Codec, CodecFactory, expect_int, register_codec, reject_unknown


class Acme(Codec):
    def __init__(self, specs, threads):
        self.arms = tuple(specs)
        self.threads = threads

    def reconstruct(self, image):
        return [image.convert("RGB") for _ in self.arms]


def normalise(params):
    reject_unknown("acme", params, {"level", "threads"})
    level = expect_int("acme", "level", params.get("level", "1"), 1, 9)
    runtime = (("threads", params["threads"]),) if "threads" in params else ()
    return ArmSpec("acme", (("level", str(level)),), runtime=runtime)


def build(specs):
    return [Acme(specs, int(specs[0].runtime_param("threads", "1")))]


register_codec(CodecFactory("acme", normalise, build, "acme:level=L"))

POSTERIZE = CodecFactory(
    "posterize",
    lambda params: ArmSpec("posterize"),
    lambda specs: [Acme(specs, 1)],
)
'''

METADATA = 'Metadata-Version: 2.1\nName: acme-codecs\nVersion: 1.0\nRequires-Dist: not-a-real-module-xyz ; extra == "fancy"\n'

ENTRY_POINTS = """\
[pytest_satbench.codecs]
acme = acme_codecs
posterize = acme_codecs:POSTERIZE
broken = acme_broken
dup = acme_dup
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("site")
    (root / "acme_codecs.py").write_text(ACME)
    (root / "acme_broken.py").write_text("import not_a_real_module_xyz\n")
    (root / "acme_dup.py").write_text(
        "from pytest_satbench.codecs.base import CodecFactory, register_codec\n"
        "register_codec(CodecFactory('jpeg', lambda p: None, lambda s: []))\n"
    )
    info = root / "acme_codecs-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(METADATA)
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return root


def run_with(site: Path, body: str) -> dict:
    """Run `body` in a fresh interpreter with `site` on its path; it sets `out` (a dict)."""
    code = "import json\nout = {}\n" + textwrap.dedent(body) + "\nprint(json.dumps(out))\n"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_third_party_codec_is_found_through_its_entry_point(site: Path) -> None:
    out = run_with(site, """
        from PIL import Image
        from pytest_satbench.codecs.base import build_codecs, factories, normalise_spec

        out["known"] = sorted(factories())
        spec = normalise_spec("acme:level=3")
        (codec,) = build_codecs([spec])
        out["canonical"] = spec.canonical
        out["size"] = codec.reconstruct(Image.new("RGB", (7, 5)))[0].size
        out["posterize"] = [c.arms[0].canonical for c in build_codecs([normalise_spec("posterize")])]
    """)
    assert {"acme", "posterize", "identity", "jpeg", "resize", "onedpiece"} <= set(out["known"])
    assert out["canonical"] == "acme:level=3"
    assert out["size"] == [7, 5]
    assert out["posterize"] == ["posterize"]


def test_broken_entry_point_fails_only_the_specs_naming_it(site: Path) -> None:
    out = run_with(site, """
        from pytest_satbench.codecs.base import SpecError, broken_codecs, normalise_spec, build_codecs

        # The others work, and nothing is said about the broken ones until they are named.
        out["jpeg"] = normalise_spec("jpeg:quality=5").canonical
        out["jpeg_module"] = type(build_codecs([normalise_spec("jpeg:quality=75")])[0]).__module__
        out["broken"] = sorted(broken_codecs())
        for text in ("broken:x=1", "nosuch", "dup"):
            try:
                normalise_spec(text)
            except SpecError as exc:
                out[text] = str(exc)
    """)
    assert out["jpeg"] == "jpeg:quality=5"
    assert out["jpeg_module"] == "pytest_satbench.codecs.simple"  # a clash never replaces a built-in
    assert out["broken"] == ["broken", "dup"]
    msg = out["broken:x=1"]
    assert msg.startswith("--recon 'broken:x=1': codec 'broken' is unavailable: acme_broken failed to load")
    assert "No module named 'not_a_real_module_xyz'" in msg
    assert msg.endswith("pip install 'acme-codecs[fancy]'")
    assert "codec 'jpeg' is already registered" in out["dup"]
    assert "unknown codec 'nosuch'" in out["nosuch"] and out["nosuch"].endswith("failed to load: broken, dup")
    assert all("\n" not in out[k] for k in ("broken:x=1", "nosuch", "dup"))


def test_runtime_params_travel_on_the_spec_without_changing_its_name(site: Path) -> None:
    out = run_with(site, """
        from pytest_satbench.codecs.base import build_codecs, normalise_spec

        fast = normalise_spec("acme:level=3,threads=8")
        plain = normalise_spec("acme:level=3")
        out["names"] = [fast.canonical, str(fast), plain.canonical]
        out["same"] = [fast == plain, hash(fast) == hash(plain), len({fast, plain})]
        out["threads"] = [build_codecs([s])[0].threads for s in (fast, plain)]
    """)
    assert out["names"] == ["acme:level=3"] * 3
    assert out["same"] == [True, True, 1]
    assert out["threads"] == [8, 1]


def test_arm_identity_ignores_runtime() -> None:
    gpu = ArmSpec("x", (("a", "1"),), runtime=(("batch", "16"), ("device", "cuda:0")))
    cpu = ArmSpec("x", (("a", "1"),))
    assert gpu == cpu and hash(gpu) == hash(cpu) and gpu.canonical == cpu.canonical == "x:a=1"
    assert gpu.runtime_param("device") == "cuda:0" and cpu.runtime_param("device", "cpu") == "cpu"
    assert gpu.param("device") is None  # run-time parameters are not pixel parameters


def test_builtin_codecs_come_from_the_entry_points() -> None:
    known = base.factories()
    assert {"identity", "jpeg", "resize", "onedpiece"} <= set(known)
    assert base.broken_codecs() == {}
    assert type(build_codecs([normalise_spec("resize:factor=0.25")])[0]).__module__ == "pytest_satbench.codecs.simple"
    with pytest.raises(SpecError, match="unknown codec 'nosuch'; known: .*identity, jpeg"):
        normalise_spec("nosuch")


def test_codecs_base_imports_no_plugin_and_no_pil() -> None:
    """The plugin imports `codecs.base` at pytest start-up: it must load without PIL and
    without importing any codec (load the file on its own, with PIL made unimportable)."""
    code = (
        "import importlib.util, sys\n"
        "sys.modules['PIL'] = None\n"
        f"spec = importlib.util.spec_from_file_location('standalone_codecs_base', {str(Path(base.__file__))!r})\n"
        "mod = importlib.util.module_from_spec(spec); sys.modules[spec.name] = mod; spec.loader.exec_module(mod)\n"
        "assert not [m for m in sys.modules if m.startswith('pytest_satbench')], sorted(sys.modules)\n"
        "print('ok', mod.ArmSpec('jpeg', (('quality', '5'),)).canonical)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["ok", "jpeg:quality=5"]
    assert importlib.util.find_spec("PIL") is not None  # the check above blocked a real module


@pytest.mark.parametrize("spec,message", [
    ("jpeg", "--recon jpeg: give its quality, e.g. --recon jpeg:quality=75"),
    ("resize", "--recon resize: give its factor, e.g. --recon resize:factor=0.5"),
])
def test_a_parameter_the_pixels_depend_on_is_never_a_silent_default(spec: str, message: str) -> None:
    from pytest_satbench.codecs.base import SpecError, normalise_spec

    with pytest.raises(SpecError) as ei:
        normalise_spec(spec)
    assert str(ei.value) == message


# ---------------------------------------------------------------------- what a codec says of itself

def test_a_codec_labels_its_arms_as_the_tables_always_did() -> None:
    from pytest_satbench.core import arms as A

    labels = {
        "jpeg:quality=10": "jpeg:q10",
        "resize:factor=0.5": "rsz:0.5",
        "identity": "identity",
        "onedpiece:ckpt=/w/s.bin,dtype=fp32,max_tiles=12,nlatent=48,variant=S": "tok48",
        "nosuch:level=3": "nosuch:level=3",  # a codec not installed here: its spec
    }
    assert {arm: base.arm_label(arm) for arm in labels} == labels
    # core asks the codecs (the labeller `pytest_satbench.codecs` installs), never a spec
    assert {arm: A.short_label(arm) for arm in labels} == labels
    assert [A.short_label(a) for a in ("orig", "blind", "orig~2", "judge:jpeg:quality=10")] == [
        "orig", "blind", "orig~2", "judge:jpeg:q10"]
    assert A.arm_labels(["orig", "jpeg:quality=10", "jpeg:quality=30"]) == (
        {"orig": "orig", "jpeg:quality=10": "jpeg:q10", "jpeg:quality=30": "jpeg:q30"}, [])


def test_a_codec_describes_its_arm_from_the_recorded_identity_without_hashing(tmp_path: Path) -> None:
    ckpt = tmp_path / "s.bin"
    ckpt.write_bytes(b"weights")  # on this machine, yet never hashed by a description
    arm = f"onedpiece:ckpt={ckpt},dtype=fp32,max_tiles=12,nlatent=48,variant=S"
    digest = "ab" * 32
    assert base.describe_arm(arm, f"ckpt-sha256={digest};impl=2") == {
        "arm": arm, "codec": "onedpiece", "checkpoint": str(ckpt), "checkpoint_sha256": digest}
    assert base.describe_arm(arm) == {"arm": arm, "codec": "onedpiece", "checkpoint": str(ckpt),
                                      "checkpoint_sha256": None}
    assert base.describe_arm("jpeg:quality=10") == {"arm": "jpeg:quality=10", "codec": "jpeg"}


def test_whether_a_codec_is_cached_on_disk_is_the_codecs_answer() -> None:
    assert not any(base.disk_cacheable(a) for a in ("identity", "jpeg:quality=10", "resize:factor=0.5"))
    assert base.disk_cacheable("onedpiece:ckpt=/w/s.bin,nlatent=48")
    assert base.disk_cacheable("nosuch:level=3")  # not installed: it can only be looked up


def test_shorthands_are_applied_by_the_codec_that_takes_them(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = ["onedpiece:ckpt=/w/s.bin", "jpeg:quality=10"]
    assert base.expand_shorthands(raw, {"nlatent": None, "max_tiles": None, "device": None}) == raw
    assert base.expand_shorthands(raw, {"nlatent": "16,64", "max_tiles": "6", "device": "cuda:7"}) == [
        "jpeg:quality=10",
        "onedpiece:ckpt=/w/s.bin,max_tiles=6,device=cuda:7,nlatent=16",
        "onedpiece:ckpt=/w/s.bin,max_tiles=6,device=cuda:7,nlatent=64",
    ]
    monkeypatch.delenv("SATBENCH_ONEDPIECE_CKPT", raising=False)
    with pytest.raises(SpecError, match="need a One-D-Piece checkpoint"):
        base.expand_shorthands([], {"nlatent": "16"})
    with pytest.raises(SpecError, match="no installed codec takes the shorthand 'colour'"):
        base.expand_shorthands(raw, {"colour": "red"})


def test_a_budget_sweep_is_the_codecs_to_say() -> None:
    arm = "onedpiece:ckpt=/w/s.bin,dtype=fp32,max_tiles=12,nlatent=48,variant=S"
    assert base.budget_of(arm) == ("onedpiece:ckpt=/w/s.bin,dtype=fp32,max_tiles=12,variant=S", 48.0)
    assert [base.budget_of(a) for a in ("jpeg:quality=10", "orig", "nosuch:nlatent=4")] == [None, None, None]
