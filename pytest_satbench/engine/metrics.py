"""Reading a vLLM server's Prometheus `/metrics`: the figures the concurrency limiter steers by.

vLLM publishes, per engine and labelled with `model_name`:
`vllm:num_requests_running` and `vllm:num_requests_waiting` (gauges),
`vllm:kv_cache_usage_perc` (a gauge holding a fraction despite its name; before vLLM's V1
engine it was `vllm:gpu_cache_usage_perc`) and `vllm:num_preemptions_total` (a counter).
Names and types as in vLLM's `vllm/v1/metrics/loggers.py` (PrometheusStatLogger).

Only the text exposition format is read (what vLLM serves), and only these samples: a
server with data-parallel engines exposes one sample per engine, and they are summed.
A page without `vllm:num_requests_running` is not a vLLM metrics page (a gateway's, or an
HTML error page): `parse` returns None and the limiter steers without metrics.
"""

from __future__ import annotations

import math

from pytest_satbench.engine.limits import EngineMetrics

__all__ = ["RUNNING", "WAITING", "parse"]

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
_KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_PREEMPTIONS = ("vllm:num_preemptions_total", "vllm:num_preemptions")
_WANTED = frozenset((RUNNING, WAITING, *_KV, *_PREEMPTIONS))


def parse(text: str, model: str | None = None) -> EngineMetrics | None:
    """The limiter's figures from a /metrics page; None when it is not vLLM's.

    `model`: when samples carry a `model_name` label, only that model's count (a server
    may serve several)."""
    sums: dict[str, float] = {}
    maxes: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue  # comments, other exporters' metrics
        name, labels, value = _sample(line)
        if name not in _WANTED or value is None:
            continue
        if model is not None and labels is not None:
            named = _label(labels, "model_name")
            if named is not None and named != model:
                continue
        sums[name] = sums.get(name, 0.0) + value
        maxes[name] = max(maxes.get(name, value), value)
    if RUNNING not in sums:
        return None
    kv_name = next((n for n in _KV if n in sums), None)
    pre_name = next((n for n in _PREEMPTIONS if n in sums), None)
    return EngineMetrics(
        running=sums[RUNNING],
        waiting=sums.get(WAITING, 0.0),
        # the fullest engine's cache is the one that preempts first: the mean would hide it
        kv_cache_usage=maxes[kv_name] if kv_name else None,
        preemptions=sums[pre_name] if pre_name else None,
    )


def _sample(line: str) -> tuple[str, str | None, float | None]:
    """(name, the label text or None, the value) of one sample line."""
    brace = line.find("{")
    if brace >= 0:
        close = line.rfind("}")
        if close < brace:
            return "", None, None
        name, labels, rest = line[:brace], line[brace + 1:close], line[close + 1:]
    else:
        name, _, rest = line.partition(" ")
        labels = None
    parts = rest.split()
    if not parts:
        return name, labels, None
    try:
        value = float(parts[0])
    except ValueError:
        return name, labels, None
    return name, labels, value if math.isfinite(value) else None


def _label(labels: str, key: str) -> str | None:
    """A label's value from `a="x",b="y"` (vLLM's values hold no escaped quotes we need)."""
    for part in labels.split(","):
        k, _, v = part.partition("=")
        if k.strip() == key:
            return v.strip().strip('"')
    return None
