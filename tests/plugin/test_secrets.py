"""Credentials are never written anywhere: a real run whose server URL carries user:password@
and whose command line carries a key leaves neither in the store, the reports, junit XML or
the terminal."""

from __future__ import annotations

from pathlib import Path

import pytest
from datasets_fake import rsvqa_suite
from servers import FakeVLM

from pytest_satbench.core.redact import redact, redact_url

BENCH = """
from pytest_satbench import benchmark_test
test_rsvqa_lr = benchmark_test("rsvqa_lr")
"""
PASSWORD = "s3cretPassw0rd"


def test_redaction_rules() -> None:
    assert redact_url("http://alice:pw@h:1,http://bob:pw2@g:2") == "http://h:1,http://g:2"
    assert redact_url("https://h/v1?api_key=abc123&x=1") == "https://h/v1?api_key=<redacted>&x=1"
    for header in ("Bearer abcdef123", "Basic YWxpY2U6cHc=", "Token deadbeef99"):
        assert redact(f"server said: Authorization {header} is invalid") == "server said: Authorization <redacted> is invalid"
    assert redact(["--api-key", "sk-live-123456", "--api-key=xyz"]) == ["--api-key", "<redacted>", "--api-key=<redacted>"]


def test_a_runs_files_never_hold_a_password(pytester: pytest.Pytester, tmp_path: Path) -> None:
    data = rsvqa_suite(pytester, BENCH, n_images=2, per_type=1)
    store = tmp_path / "results.sqlite"
    with FakeVLM(["m"], answer=lambda p, h, i: "yes") as srv:
        url = srv.url.replace("http://", f"http://alice:{PASSWORD}@")
        result = pytester.runpytest_subprocess(
            "--servers", url, "--data-root", str(data), "--store", str(store), "-q", "--export-jsonl",
            "--junitxml", str(tmp_path / "junit.xml"), "-p", "no:randomly",
        )
    assert result.ret == 0, result.stdout.str()
    assert PASSWORD not in result.stdout.str() + result.stderr.str()
    written = [store, *store.parent.glob("results.sqlite*"), tmp_path / "junit.xml",
               *(pytester.path / "reports").rglob("*")]
    leaks = [str(f) for f in written if f.is_file() and PASSWORD.encode() in f.read_bytes()]
    assert leaks == []


def test_a_server_echoing_a_token_has_it_in_no_message_or_file(pytester: pytest.Pytester, tmp_path: Path) -> None:
    from servers import Fail

    data = rsvqa_suite(pytester, BENCH, n_images=1, per_type=1)
    token = "Basic YWxpY2U6czNjcmV0UGFzc3cwcmQ="  # alice:s3cretPassw0rd
    with FakeVLM(["m"], fail_always=Fail.http(401, f"bad credentials in Authorization: {token}")) as srv:
        result = pytester.runpytest_subprocess(
            "--servers", srv.url, "--data-root", str(data), "--store", str(tmp_path / "s.sqlite"), "-q",
            "--junitxml", str(tmp_path / "junit.xml"), "-p", "no:randomly",
        )
    assert result.ret == 1  # every item failed, with the server's one-line reason
    secret = token.split()[1]
    assert secret not in result.stdout.str() + result.stderr.str()
    for f in (tmp_path / "s.sqlite", tmp_path / "junit.xml"):
        assert secret.encode() not in f.read_bytes(), f
