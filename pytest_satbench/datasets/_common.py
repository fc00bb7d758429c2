"""Small helpers shared by the dataset loaders (keys, JSON files)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pytest_satbench.datasets.registry import DatasetError

# A key is the parameter part of a pytest node id (`test_vrsbench[<key>]`) and is typed
# after `-k`: no whitespace, brackets or `::`, which would break node ids or -k parsing.
_KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")


def check_key(key: str, where: str, benchmark_names: tuple[str, ...]) -> str:
    """Return `key` if it is usable in a node id, else raise a DatasetError naming `where`.

    A key must not contain a benchmark name either, or `-k <that name>` would select it.
    """
    if not _KEY_RE.fullmatch(key):
        raise DatasetError(
            f"{where}: question id {key!r} cannot be a pytest node id parameter "
            "(letters, digits, '_', '.', '-' only)"
        )
    if not key.isdigit():
        clash = next((n for n in benchmark_names if n in key), None)
        if clash:
            raise DatasetError(
                f"{where}: question id {key!r} contains the benchmark name {clash!r}, "
                f"so `-k {clash}` would select it"
            )
    return key


def read_json(path: Path, what: str) -> Any:
    try:
        with open(path, "rb") as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise DatasetError(f"{path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: not valid JSON ({exc}); re-download the {what}") from None
