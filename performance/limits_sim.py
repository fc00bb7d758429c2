"""The no-metrics limiter on a simulated clock (tests/limit_sim.py), this tree's against a baseline
tree's engine/limits.py, on the same deterministic servers: seconds of CPU, no sockets, no load
dependence, so the two controllers see exactly the same traffic.

    .venv/bin/python performance/limits_sim.py --baseline-tree /tmp/old

Servers (jitter 0.3: each service time or step scaled by a seeded uniform 0.7-1.3; drift 0.1:
the machine's speed redrawn within +-10% every second):
- flat W x S: W requests served at once for S each, the rest wait (a CPU-bound or fixed-rate
  server); its knee is W; "turnaround": the client refills a freed slot that much later (a
  loaded client against a fast server holds fewer in flight than its limit);
- batch: tests/fleet_sim.py's continuous batching (the controller tests' small engine, and
  performance/fleet.py's 64- and 256-sequence servers).

The limiter starts at the defaults (32; the small engine at 4, as its tests do), cap 512.
Reported over the second part of the run (flat: 15-40 s; batch: the last three quarters):
throughput / capacity, median latency / unloaded latency, the final limit.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "performance")]

from _measure import write_result  # noqa: E402 (after the sys.path setup above)
from fleet_sim import EngineParams  # noqa: E402 (after the sys.path setup above)
from limit_sim import BatchServer, FlatServer, drive  # noqa: E402 (after the sys.path setup above)

SEEDS = range(1, 11)
# (workers, service s, drift, the client's turnaround s between an answer and the next request)
FLAT = [(4, 0.02, 0.0, 0.0), (4, 0.02, 0.1, 0.0), (8, 0.05, 0.0, 0.0), (8, 0.05, 0.1, 0.0), (16, 0.01, 0.0, 0.0),
        (16, 0.01, 0.1, 0.0), (2, 0.004, 0.1, 0.002), (1, 0.002, 0.1, 0.001)]
BATCH = [("small (32 seqs)", EngineParams(max_num_seqs=32, base_ms=5.0, per_seq_ms=0.5, output_tokens=8), 4, 40.0),
         ("fleet 64", EngineParams(max_num_seqs=64), 32, 120.0),
         ("fleet 256", EngineParams(max_num_seqs=256), 32, 120.0)]


def load(tree: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, tree / "pytest_satbench" / "engine" / "limits.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # (dataclasses look their module up)
    spec.loader.exec_module(mod)
    return mod


def limiter(mod: ModuleType, initial: int) -> object:
    """The tree's limiter as the plugin builds it: trees that lower the start once no /metrics
    are found (engine/concurrency.py's INITIAL_WITHOUT_METRICS, 16) do so here too."""
    params = inspect.signature(mod.AdaptiveLimit).parameters
    extra = {"initial_without_metrics": 16} if "initial_without_metrics" in params else {}
    return mod.AdaptiveLimit(0.0, cap=512, initial=initial, **extra)


def scenarios(mod: ModuleType) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for workers, service, drift, turnaround in FLAT:
        met = 0
        for seed in SEEDS:
            srv = FlatServer(workers, service, jitter=0.3, seed=seed, drift=drift)
            lim = limiter(mod, 32)
            run = drive(lim, srv, 40.0, turnaround_s=turnaround)
            rate, median = run.window(15.0, 40.0)
            met += rate >= 0.9 * srv.capacity_rps and median <= 1.5 * srv.unloaded_s
            if seed == SEEDS[0]:
                whole_rate, whole_median = run.window(0.0, 40.0)
                row: dict[str, object] = {
                    "server": f"flat {workers} x {service * 1000:.0f} ms, drift {drift}"
                              + (f", turnaround {turnaround * 1000:.0f} ms" if turnaround else ""), "limit": lim.limit,
                    "throughput": rate / srv.capacity_rps, "median_over_unloaded": median / srv.unloaded_s,
                    "whole_throughput": whole_rate / srv.capacity_rps,
                    "whole_median_over_unloaded": whole_median / srv.unloaded_s}
        row["seeds_met"] = f"{met}/{len(SEEDS)}"
        out.append(row)
    for name, params, initial, seconds in BATCH:
        bsrv = BatchServer(params, jitter=0.3, seed=1)
        lim = limiter(mod, initial)
        run = drive(lim, bsrv, seconds)
        rate, median = run.window(seconds / 4, seconds)
        whole_rate, whole_median = run.window(0.0, seconds)
        out.append({"server": f"batch {name}", "limit": lim.limit, "throughput": rate / bsrv.capacity_rps,
                    "median_over_unloaded": median / bsrv.unloaded_s,
                    "whole_throughput": whole_rate / bsrv.capacity_rps,
                    "whole_median_over_unloaded": whole_median / bsrv.unloaded_s, "seeds_met": "-"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", type=Path, default=REPO)
    ap.add_argument("--baseline-tree", type=Path, required=True)
    a = ap.parse_args()
    mine, base = scenarios(load(a.tree, "limits_this")), scenarios(load(a.baseline_tree, "limits_base"))
    print("per side: final limit; late part: throughput, median/unloaded; whole run: the same; "
          "flat: seeds meeting >= 0.9 and <= 1.5x in the late part")
    for m, b in zip(mine, base, strict=True):
        print(f"{m['server']:46}", *(f"| {r['limit']:>3} {r['throughput']:4.2f} {r['median_over_unloaded']:5.2f}x "
                                     f"{r['whole_throughput']:4.2f} {r['whole_median_over_unloaded']:5.2f}x "
                                     f"{r['seeds_met']:>5}" for r in (b, m)))
    write_result(REPO / "performance" / "out" / "limits_sim.json", this_tree=mine, baseline=base)


if __name__ == "__main__":
    main()
