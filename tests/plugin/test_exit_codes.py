"""README's exit-status table, checked: every code it lists is the one a real run returns
(the store, servers-gone and model-swap codes by their own end-to-end tests, named here)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from datasets_fake import write_rsvqa
from servers import FakeVLM

from pytest_satbench.core.gates import GATE_FAILED_EXIT
from pytest_satbench.plugin.state import MODEL_SWAPPED_EXIT, SERVERS_GONE_EXIT, STORE_FAILED_EXIT

README = Path(__file__).resolve().parents[2] / "README.md"
BENCH = "from pytest_satbench import benchmark_test\ntest_rsvqa_lr = benchmark_test('rsvqa_lr')\n"


def readme_codes() -> dict[int, str]:
    text = README.read_text()
    start = text.index("## Exit status")
    end = text.find("\n#", start)  # the next heading
    table = text[start:end if end != -1 else None]
    return {int(code): meaning for code, meaning in re.findall(r"^\| (\d+) \| (.+) \|$", table, re.M)}


def test_the_table_lists_exactly_the_codes_a_run_can_end_with() -> None:
    codes = readme_codes()
    assert set(codes) == {0, 1, 2, 4, 5, 6, 7, 8, 9}
    assert (GATE_FAILED_EXIT, STORE_FAILED_EXIT, SERVERS_GONE_EXIT, MODEL_SWAPPED_EXIT) == (6, 7, 8, 9)
    assert "gate failed" in codes[6] and "store failed" in codes[7]
    assert "no server answered" in codes[8] and "another model" in codes[9]
    assert "Ctrl-C" in codes[2] and "`-x`" in codes[2] and "exits 1" in codes[2]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_bench.py").write_text(BENCH)
    write_rsvqa(tmp_path / "data", "lr", n_images=2, per_type=2)
    return tmp_path


def _run(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "--data-root",
                           str(project / "data"), "--no-reports", *args],
                          cwd=project, capture_output=True, text=True, timeout=120)


def test_each_code_is_what_a_run_returns(project: Path) -> None:
    codes = readme_codes()
    with FakeVLM(models=["m"], answer=lambda prompt, has_image, image: "yes") as srv:
        assert _run(project, "--servers", srv.url).returncode == 0, codes[0]
        assert _run(project, "--servers", srv.url, "--fresh", "--gate", "orig>=0.99").returncode == 6, codes[6]
        (project / "data" / "RSVQA-LR" / "Images_LR" / "10.tif").unlink()  # its items fail
        assert _run(project, "--servers", srv.url, "--fresh").returncode == 1, codes[1]
        assert _run(project, "--servers", srv.url, "--fresh", "-x").returncode == 1, codes[2]  # -x exits 1
        assert _run(project, "--servers", srv.url, "--concurrency", "many").returncode == 4, codes[4]
        assert _run(project, "--servers", srv.url, "-k", "nothing_matches").returncode == 5, codes[5]
    # 2 (Ctrl-C): tests/plugin/test_interrupt.py; 7: tests/plugin/test_store_faults.py;
    # 8: tests/plugin/test_servers_gone.py; 9: tests/plugin/test_model_swap.py
