"""What exactly was measured: the protocol of a run, checked on resume and written with
every report (protocol.json), and the record of each question kept with the run so reports
can be rebuilt from the store alone."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_satbench.core.question import Question
from pytest_satbench.datasets.registry import Benchmark
from pytest_satbench.engine.store import ResultStore

if TYPE_CHECKING:
    from pytest_satbench.plugin.session import SatbenchSession


def run_protocol(owner: SatbenchSession, model: str, urls: list[str]) -> dict[str, Any]:
    """What exactly was measured (never an API key): protocol.json of every report."""
    from pytest_satbench import __version__

    s = owner.settings
    return {
        "plugin_version": __version__,
        "command": ["pytest", *owner.config.invocation_params.args],
        "model": model,
        "servers": ["builtin reference server"] if s.builtin_server else list(urls),
        "sampling": {"temperature": 0.0, "max_tokens": s.max_new},
        "prompt_style": s.prompt_style,
        "box_grid": s.box_grid,
        "iou": s.iou,
        "arms": ["orig", *[a.canonical for a in s.arms], *(["blind"] if s.blind else [])],
        "limit": s.limit,
        "datasets": owner.dataset_hashes,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "tag": s.tag,
    }


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


def question_record(q: Question, prompt: str) -> dict[str, Any]:
    """What reports need of a question, as plain JSON (kept with the run in the store)."""
    return {
        "key": q.key, "text": q.text, "answer": q.answer, "types": list(q.types), "kind": q.kind,
        "choices": list(q.choices) if q.choices else None, "extra": [list(kv) for kv in q.extra],
        "image_id": q.image.id, "image_path": q.image.path, "prompt": prompt,
    }


def dataset_hashes(bench: Benchmark, root: Path) -> dict[str, str]:
    """sha256 of the benchmark's dataset files (not images): the frozen-benchmark check."""
    out: dict[str, str] = {}
    for rel in bench.requires:
        for path in sorted(root.glob(rel)) if any(c in rel for c in "*?[") else [root / rel]:
            if path.is_file():
                h = hashlib.sha256()
                with open(path, "rb") as fh:
                    for block in iter(lambda: fh.read(1 << 20), b""):
                        h.update(block)
                out[str(path.relative_to(root))] = h.hexdigest()
    return out
