"""The package as users install it: built into an sdist and a wheel (`make dist` does the same),
both checked by twine, and the wheel installed into a clean virtual environment (no editable
install, the checkout nowhere on sys.path, its dependencies from the package index as pip finds
them for a user), then used from a folder of its own:

- the demo, as a wheel user runs it: `pytest --pyargs pytest_satbench.benchmarks -k demo
  --servers builtin ...` (the checkout's `benchmarks/` folder is not in the wheel);
- `satbench-server --help` and a real start on a free loopback port, asked over HTTP;
- `python -m pytest_satbench.report --help`, `--list`, and a report of the demo's store;
- `python -m pytest_satbench.data --help`.

The sdist must hold what it takes to run the tests and build the docs; the wheel only the
package, with every file under pytest_satbench/ (a data file read at run time included).
Where the package index cannot be reached the test skips and says so; it takes ~40 s, most of
it pip installing the dependencies (from pip's cache after the first time)."""

from __future__ import annotations

import email
import json
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
import zipfile
from pathlib import Path

import pytest

from pytest_satbench._version import __version__

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _run(args: list[str | Path], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _user_env(venv: Path) -> dict[str, str]:
    """The environment a user's shell gives: the venv's bin first; nothing of this test run
    (PYTHONPATH, pytest's and the plugin's variables) leaks into it."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "SATBENCH_", "PYTHON", "COV_", "VIRTUAL_ENV")) and k != "TOKLIP_ROOT"}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _package_files(source: Path) -> set[str]:
    return {p.relative_to(source).as_posix() for p in (source / "pytest_satbench").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")}


def _not_source(folder: str, names: list[str]) -> set[str]:
    """What the copy of the checkout leaves out: caches, virtual environments, build and run
    outputs (the sdist's own choice is MANIFEST.in's; this only keeps the copy small)."""
    at_root = Path(folder) == ROOT
    return {n for n in names if n == "__pycache__" or n.endswith((".pyc", ".egg-info"))
            or (at_root and (n.startswith(".") or n in {"build", "dist", "reports", "mlruns", "wandb"}))}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the checkout to build from: building writes its egg-info beside the sources, and
    the checkout is not the test's to write to (another test run may be building it too)."""
    copy = tmp_path_factory.mktemp("source") / "pytest-satbench"
    shutil.copytree(ROOT, copy, ignore=_not_source)
    return copy


@pytest.fixture(scope="module")
def dists(source: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The sdist, and the wheel built from it (python -m build's default route), with this
    environment's setuptools (no build isolation: nothing to fetch for the build itself)."""
    pytest.importorskip("build", reason="the dist extra builds the release files: pip install -e '.[dist]'")
    out = tmp_path_factory.mktemp("dist")
    built = _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, source], source, dict(os.environ))
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return sdist, wheel


def test_twine_checks_both_files(dists: tuple[Path, Path]) -> None:
    pytest.importorskip("twine", reason="the dist extra checks the release files: pip install -e '.[dist]'")
    checked = _run([sys.executable, "-m", "twine", "check", "--strict", *dists], ROOT, dict(os.environ))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_sdist_holds_the_project(dists: tuple[Path, Path], source: Path) -> None:
    sdist, _ = dists
    with tarfile.open(sdist) as tar:
        top = f"pytest_satbench-{__version__}/"
        names = {n.removeprefix(top) for n in tar.getnames()}
    for needed in ("LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "Makefile", "mkdocs.yml",
                   "benchmarks/test_demo.py", "docs/index.md", "docs/hooks.py", "tests/test_wheel.py",
                   "tests/servers.py"):
        assert needed in names, f"the sdist lacks {needed}"
    assert _package_files(source) <= names, sorted(_package_files(source) - names)
    assert not [n for n in names if n.startswith((".venv", ".pytest_cache", ".ci", "reports/", "performance/out"))
                or "__pycache__" in n or n.endswith(".pyc")]


def test_the_wheel_holds_the_package_and_its_metadata(dists: tuple[Path, Path], source: Path) -> None:
    _, wheel = dists
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        info = f"pytest_satbench-{__version__}.dist-info"
        meta = email.message_from_bytes(zf.read(f"{info}/METADATA"))
        entry_points = zf.read(f"{info}/entry_points.txt").decode()
    assert {n.split("/")[0] for n in names} == {"pytest_satbench", info}
    assert _package_files(source) <= names, sorted(_package_files(source) - names)  # data files too
    assert f"{info}/licenses/LICENSE" in names
    assert meta["Name"] == "pytest-satbench" and meta["Version"] == __version__
    assert meta["License-Expression"] == "MIT" and meta["Requires-Python"] == ">=3.10"
    assert "Framework :: Pytest" in meta.get_all("Classifier")
    assert meta["Description-Content-Type"] == "text/markdown" and "# pytest-satbench" in meta.get_payload()
    assert "satbench = pytest_satbench.plugin" in entry_points
    assert "satbench-server = pytest_satbench.server.__main__:main" in entry_points


def test_the_wheel_works_from_a_clean_venv(dists: tuple[Path, Path], tmp_path: Path) -> None:
    _, wheel = dists
    venv = tmp_path / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path, dict(os.environ))
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    env = _user_env(venv)
    # the checkout's pip installs into the venv (pip --python): what `venv/bin/pip install`
    # does, without ensurepip's seconds
    pip = [sys.executable, "-m", "pip", "--python", python]
    installed = _run([*pip, "install", "--quiet", wheel], tmp_path, env, timeout=600)
    if installed.returncode != 0:
        probe = _run([*pip, "download", "--quiet", "--no-deps", "--dest", tmp_path / "probe", "pytest"], tmp_path, env)
        if probe.returncode != 0:
            pytest.skip(f"the package index cannot be reached to install the wheel's dependencies: "
                        f"{(probe.stderr.strip().splitlines() or ['?'])[-1]}")
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    checked = _run([*pip, "check"], tmp_path, env)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    home = tmp_path / "user"  # a folder of the user's own: no checkout, no conftest, no ini file
    home.mkdir()
    where = _run([python, "-c", "import sys, pytest_satbench; print(pytest_satbench.__file__); print(sys.path)"], home, env)
    assert where.returncode == 0, where.stderr
    module_file, path = where.stdout.splitlines()
    assert Path(module_file).is_relative_to(venv), module_file
    assert str(ROOT) not in path, path

    demo = _run([venv / "bin" / "pytest", "--pyargs", "pytest_satbench.benchmarks", "-k", "demo", "--servers", "builtin",
                 "--recon", "jpeg:quality=10", "--limit", "40", "-q", "-p", "no:randomly"], home, env)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "satbench: demo" in demo.stdout and " passed" in demo.stdout, demo.stdout[-3000:]
    summary = json.loads((home / "reports" / "demo" / "default" / "summary.json").read_text())
    assert summary["questions"] == 40 and summary["statistics"]["arms"] == ["orig", "jpeg:quality=10"]

    helped = _run([venv / "bin" / "satbench-server", "--help"], home, env)
    assert helped.returncode == 0 and "usage: satbench-server" in helped.stdout, helped.stdout + helped.stderr
    _server_answers(venv, home, env)

    report = [python, "-m", "pytest_satbench.report"]
    helped = _run([*report, "--help"], home, env)
    assert helped.returncode == 0 and "usage: python -m pytest_satbench.report" in helped.stdout, helped.stderr
    listed = _run([*report, "--list"], home, env)
    assert listed.returncode == 0 and "questions=40 answered=40 errors=0" in listed.stdout, listed.stdout + listed.stderr
    again = _run([*report, "--out", home / "again"], home, env)
    assert again.returncode == 0, again.stdout + again.stderr
    rewritten = json.loads((home / "again" / "demo" / "default" / "summary.json").read_text())
    assert rewritten["questions"] == summary["questions"] and rewritten["statistics"] == summary["statistics"]
    assert (home / "again" / "demo" / "default" / "report.html").is_file()

    helped = _run([python, "-m", "pytest_satbench.data", "--help"], home, env)
    assert helped.returncode == 0 and "fetch" in helped.stdout, helped.stdout + helped.stderr


def _server_answers(venv: Path, home: Path, env: dict[str, str]) -> None:
    """`satbench-server --port 0` starts, says where it serves, and lists its model there."""
    server = subprocess.Popen([venv / "bin" / "satbench-server", "--port", "0"], cwd=home, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("satbench-server: serving model 'satbench-reference' on http://127.0.0.1:"), line
        url = line.rsplit(" ", 1)[1].strip()
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy
        with direct.open(f"{url}/v1/models", timeout=30) as reply:
            models = json.load(reply)
        assert [m["id"] for m in models["data"]] == ["satbench-reference"]
    finally:
        server.terminate()
        server.wait(timeout=30)
