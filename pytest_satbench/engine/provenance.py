"""What exactly was measured, checked before a run is merged into earlier ones: the
protocol (`RuntimeConfig.protocol`) against the tag's earlier runs, and the dataset files'
sha256 (the frozen-benchmark check)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

from pytest_satbench.engine.store import ResultStore


def protocol_conflict(store: ResultStore, tag: str, run_id: str, proto: dict[str, Any]) -> str | None:
    """Why this run must not be merged into the earlier runs reported under the same tag."""
    for prev in store.runs(tag):
        if prev["run_id"] == run_id:
            continue
        old = prev["protocol"]
        assert isinstance(old, dict)
        if old.get("model") != proto["model"]:
            return (
                f"--tag {tag} was measured with model {old.get('model')!r}, this run asks {proto['model']!r}; "
                "pass another --tag, or --allow-protocol-change to mix them"
            )
        for bench, files in proto["datasets"].items():
            before = (old.get("datasets") or {}).get(bench)
            if before and before != files:
                return (
                    f"--tag {tag}: the {bench} dataset files changed since the earlier run (sha256 differs); "
                    "pass another --tag, or --allow-protocol-change to mix them"
                )
        return None  # the latest earlier run decides
    return None


def served_model_change(store: ResultStore, tag: str, run_id: str,
                        proto: dict[str, Any]) -> tuple[str | None, str | None]:
    """(why this run must not join the tag's earlier runs, a line to say) when the server
    says the model is served from other weights (`root`) or with another context length
    (`max_model_len`) than in the latest earlier run of the tag. Other weights under the same
    id would mix two models' answers (stored answers are keyed by the model id): refused.
    Another context length changes nothing for answers that fit: said, not refused."""
    now = proto.get("served_model") or {}
    for prev in store.runs(tag):
        if prev["run_id"] == run_id:
            continue
        old = cast("dict[str, Any]", prev["protocol"]).get("served_model") or {}  # runs() parses it to a dict
        model = proto["model"]
        if old.get("root") and now.get("root") and old["root"] != now["root"]:
            return (f"--tag {tag}: model {model!r} is now served from {now['root']!r}, the earlier run's "
                    f"server loaded it from {old['root']!r} (other weights under the same id); pass another "
                    "--tag, or --allow-protocol-change if they are the same model"), None
        if old.get("max_model_len") and now.get("max_model_len") and old["max_model_len"] != now["max_model_len"]:
            return None, (f"--tag {tag}: model {model!r} is now served with max_model_len {now['max_model_len']} "
                          f"(the earlier run: {old['max_model_len']}); stored answers are reused, and prompts "
                          "longer than the new length fail")
        return None, None
    return None, None


def dataset_hashes(requires: Iterable[str], root: Path) -> dict[str, str]:
    """sha256 of a benchmark's dataset files (`Benchmark.requires`, not images)."""
    out: dict[str, str] = {}
    for rel in requires:
        for path in sorted(root.glob(rel)) if any(c in rel for c in "*?[") else [root / rel]:
            if path.is_file():
                h = hashlib.sha256()
                with open(path, "rb") as fh:
                    for block in iter(lambda: fh.read(1 << 20), b""):
                        h.update(block)
                out[str(path.relative_to(root))] = h.hexdigest()
    return out
