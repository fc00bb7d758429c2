"""Why was this answer asked again? `--why KEY` and the re-ask reasons of a run, from the store.

An answer is reused only when its fingerprint is the same (`engine/fingerprint.py`): the model,
the sampling settings, the prompt style and rendered prompt, the arm with its codec identity and
the image bytes sent. The fingerprint itself is a hash; its components are all kept in the store
already, so nothing new is recorded to name them:

- model, max tokens, temperature, top p, request seed, system prompt, extra body (the model
  settings, `sampling`), prompt style, the served root and the codec identity of the arm: the
  protocol of the run that asked the answer (`runs.protocol`; a run recorded before the model
  settings existed set none of them);
- the rendered prompt and the geometry the image was sent at: that run's record of the question
  (`run_items.question`: `prompt`, `sent_size`);
- the image bytes sent: the sha256 each answer row carries (`answers.image_sha256`; it changes
  with the source image's bytes, the geometry or the codec's output).

`--why KEY` prints every stored answer of one question (any node id, run and tag) with those
components side by side, per arm, and names the components in which the answers differ.

`--reasons` counts, per run, the answers it asked anew (its own rows) by the reason: the first
component, in this order, in which the question's newest earlier record (any earlier run, any
tag: the store shares answers across tags) differs: `new question` (no earlier run recorded
it), `new arm` (earlier runs recorded it, not in this arm), `model changed`, `sampling changed`
(max tokens, temperature, top p, request seed, system prompt or extra body), `prompt changed` (prompt style or rendered prompt), `image bytes changed` (the
sent bytes' sha256 or the geometry), `codec changed` (the arm's codec identity, e.g. another
checkpoint under the same path); with the same fingerprint as before: `--fresh` when the run's
command line carries it, else `asked again` (the earlier ask failed or never came back).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_satbench.core.records import AnswerRow
from pytest_satbench.engine.config import sampling_of
from pytest_satbench.engine.store import ResultStore

__all__ = ["COMPONENTS", "REASONS", "Component", "asked_anew", "reasons", "reasons_lines", "reasons_text", "why_lines"]

REASONS = ("new question", "new arm", "model changed", "sampling changed", "prompt changed", "image bytes changed",
           "codec changed", "--fresh", "asked again")


@dataclass(frozen=True, slots=True)
class Component:
    """One component of an answer's fingerprint (or what identifies the answer), as shown."""

    name: str
    in_fingerprint: bool


COMPONENTS = (
    Component("model", True), Component("served root", False), Component("max tokens", True),
    Component("temperature", True), Component("top p", True), Component("request seed", True),
    Component("system prompt", True), Component("extra body", True), Component("prompt style", True),
    Component("prompt", True),
    Component("sent size", True), Component("image bytes sent", True), Component("codec identity", True),
    Component("fingerprint", False),
)


def _sha(text: str | None) -> str:
    return "-" if text is None else hashlib.sha256(text.encode()).hexdigest()[:12]


def _components(row: AnswerRow, protocol: Mapping[str, Any], question: Mapping[str, Any] | None) -> dict[str, str]:
    sampling = sampling_of(protocol)
    system = sampling["system_prompt"]
    extra = sampling["extra_body"]
    served = protocol.get("served_model") or {}
    prompt = question.get("prompt") if question else None
    size = question.get("sent_size") if question else None
    return {
        "model": str(protocol.get("model", "-")),
        "served root": str(served.get("root") or "-"),
        "max tokens": str(sampling.get("max_tokens", "-")),
        "temperature": str(sampling.get("temperature", "-")),
        "top p": str(sampling["top_p"] if sampling["top_p"] is not None else "-"),
        "request seed": str(sampling["seed"] if sampling["seed"] is not None else "-"),
        "system prompt": f"{_sha(system)} {_snippet(system)}" if system is not None else "-",
        "extra body": json.dumps(extra, sort_keys=True, separators=(",", ":")) if extra is not None else "-",
        "prompt style": str(protocol.get("prompt_style", "-")),
        "prompt": f"{_sha(prompt)} {_snippet(prompt)}" if prompt is not None else "-",
        "sent size": "x".join(map(str, size)) if size else "-",
        "image bytes sent": (row.image_sha256 or "-")[:12],
        "codec identity": str((protocol.get("codec_identity") or {}).get(row.arm) or "-")[:16],
        "fingerprint": row.fingerprint[:12],
    }


def _snippet(text: str | None, n: int = 24) -> str:
    if not text:
        return ""
    one = " ".join(text.split())
    return repr(one if len(one) <= n else one[: n - 3] + "...")


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(t))) if t else "-"


def why_lines(store: ResultStore, key: str, benchmark: str | None = None, width: int = 26) -> list[str]:
    """Every stored answer of question `key` (of `benchmark`, or of every benchmark that has
    such a key), per benchmark and arm, with its fingerprint's components side by side; the
    components in which an arm's answers differ are named. [] when the store has none."""
    rows = store.question_rows(key, benchmark)
    if not rows:
        return []
    runs: dict[str, dict[str, Any]] = {str(r["run_id"]): r for r in store.runs()}  # protocol: a dict
    records = list(store.records(key=key, benchmark=benchmark))
    out: list[str] = []
    for bench in sorted({r.benchmark for r in rows}):
        mine = [r for r in rows if r.benchmark == bench]
        recs = [x for x in records if x[2] == bench]
        out.append(f"satbench why {bench} {key}: {len(mine)} stored answer{'s' if len(mine) != 1 else ''} "
                   f"in {len({r.arm for r in mine})} arm(s)")
        for arm in dict.fromkeys(r.arm for r in mine):
            answers = [r for r in mine if r.arm == arm]
            cols: list[dict[str, str]] = []
            for r in answers:
                # the asking run's record of the question; else any run's that used this answer
                asker = next((x for x in recs if x[0] == r.run_id and x[1] == r.nodeid), None)
                users = [x for x in recs if x[1] == r.nodeid and x[4].get(arm) == r.fingerprint]
                rec = asker or (users[0] if users else None)
                proto = dict(runs.get(str(r.run_id), {}).get("protocol") or
                             (runs.get(rec[0], {}).get("protocol") if rec else None) or {})
                tags = sorted({str(runs[x[0]]["tag"]) for x in users if x[0] in runs})
                comp = _components(r, proto, rec[3] if rec else None)
                text = r.text if r.status == "ok" else f"(error: {r.error})"
                cols.append({"asked by run": str(r.run_id or "-"), "asked at": _when(r.created),
                             "used by tags": ",".join(tags) or "-", **comp, "node id": r.nodeid,
                             "status": r.status, "answer": _snippet(text, width - 2)})
            names = ["asked by run", "asked at", "used by tags", *(c.name for c in COMPONENTS), "node id", "status",
                     "answer"]
            out.append(f"  arm {arm}: {len(answers)} answer{'s' if len(answers) != 1 else ''}, oldest first")
            for name in names:
                cells = [c.get(name, "-") for c in cols]
                out.append(f"    {name:<18}" + "".join(f"{_fit(v, width):<{width}}" for v in cells).rstrip())
            differ = [c.name for c in COMPONENTS if c.in_fingerprint and len({col[c.name] for col in cols}) > 1]
            if len(cols) > 1:
                out.append("    differs: " + (", ".join(differ) if differ else
                                              "no recorded component (the same fingerprint asked again, or a "
                                              "component this store does not keep: the source image's bytes)"))
    return out


def _fit(v: str, width: int) -> str:
    return v if len(v) < width - 1 else v[: width - 4] + "..."


# --------------------------------------------------------------------------- reasons

@dataclass(frozen=True, slots=True)
class _Seen:
    """A run's record of one question in one arm, as a later run compares with it."""

    run_id: str
    fingerprint: str
    prompt: str | None
    size: Any
    image_sha256: str | None


def _reason(now: _Seen, before: _Seen | None, known: bool, mine: Mapping[str, Any], theirs: Mapping[str, Any],
            arm: str, fresh: bool) -> str:
    if before is None:
        return "new arm" if known else "new question"
    if before.fingerprint == now.fingerprint:
        return "--fresh" if fresh else "asked again"
    if mine.get("model") != theirs.get("model"):
        return "model changed"
    if sampling_of(mine) != sampling_of(theirs):
        return "sampling changed"
    if mine.get("prompt_style") != theirs.get("prompt_style") or now.prompt != before.prompt:
        return "prompt changed"
    if now.size != before.size or (now.image_sha256 and before.image_sha256 and now.image_sha256 != before.image_sha256):
        return "image bytes changed"
    if (mine.get("codec_identity") or {}).get(arm) != (theirs.get("codec_identity") or {}).get(arm):
        return "codec changed"
    return "image bytes changed"  # the one component not kept: the source image's bytes


def reasons(store: ResultStore, run_id: str) -> dict[str, Counter[str]]:
    """Per benchmark of `run_id`, its answers asked anew (its own rows, answers and errors)
    counted by reason (module docstring)."""
    all_runs = store.runs()
    at = next(i for i, r in enumerate(all_runs) if r["run_id"] == run_id)
    run = all_runs[at]
    proto: Mapping[str, Any] = run["protocol"]  # type: ignore[assignment]  # runs() parses it to a dict
    fresh = "--fresh" in (proto.get("command") or [])
    earlier = [r for r in all_runs[at + 1:]]  # started before it, newest first
    out: dict[str, Counter[str]] = {}
    for bench in store.run_benchmarks(run_id):
        # the newest earlier record per (key, arm), and which keys any earlier run recorded
        seen: dict[tuple[str, str], tuple[_Seen, Mapping[str, Any]]] = {}
        known: set[str] = set()
        for r in reversed(earlier):  # oldest first: newer records overwrite
            theirs: Mapping[str, Any] = r["protocol"]  # type: ignore[assignment]  # a dict, as above
            rows = {(nodeid, arm): row for nodeid, _, _, found in store.run_items(str(r["run_id"]), bench)
                    for arm, row in found.items()}
            for rid, nodeid, _, q, fps in store.records(str(r["run_id"]), benchmark=bench):
                k = str(q.get("key"))
                known.add(k)
                for arm, fp in fps.items():
                    row = rows.get((nodeid, arm))
                    sha = row.image_sha256 if row is not None and row.fingerprint == fp else None
                    seen[k, arm] = (_Seen(rid, fp, q.get("prompt"), q.get("sent_size"), sha), theirs)  # type: ignore[arg-type]  # stored str/int
        counts: Counter[str] = Counter()
        for _, _, q, found in store.run_items(run_id, bench):
            k = str(q.get("key"))
            for arm, row in found.items():
                if row.run_id != run_id:
                    continue  # reused from the store
                now = _Seen(run_id, row.fingerprint, q.get("prompt"), q.get("sent_size"), row.image_sha256)  # type: ignore[arg-type]  # stored str/int
                before, theirs = seen.get((k, arm), (None, {}))
                counts[_reason(now, before, k in known, proto, theirs, arm, fresh)] += 1
        out[bench] = counts
    return out


def asked_anew(counts: Mapping[str, int]) -> dict[str, int]:
    """One benchmark's `reasons` as a run's summary.json gives them: every reason, in `REASONS`
    order, with its count (0 included)."""
    return {k: int(counts.get(k, 0)) for k in REASONS}


def reasons_text(counts: Mapping[str, int]) -> str:
    """The non-zero counts, in `REASONS` order: `16 prompt changed, 2 new question` ("" for none)."""
    return ", ".join(f"{counts[k]} {k}" for k in REASONS if counts.get(k))


def reasons_lines(store: ResultStore, runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per run (and benchmark): its answers asked anew, by reason."""
    out = []
    for r in runs:
        per = reasons(store, str(r["run_id"]))
        total = sum(sum(c.values()) for c in per.values())
        out.append(f"{r['run_id']}  tag={r['tag']}  {_when(r['started'])}  asked anew: {total}")
        for bench, c in per.items():
            parts = reasons_text(c)
            out.append(f"    {bench}: {sum(c.values())}" + (f" ({parts})" if parts else ""))
    return out
