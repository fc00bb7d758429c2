"""File systems for fault tests: a real, small tmpfs (a disk that can fill up, or be made
read-only), mounted where the test wants it. The tests run as root; elsewhere they skip."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (e.g. "400k") mounted at `path`, unmounted afterwards."""
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
