"""The no-metrics limiter on a simulated clock (tests/limit_sim.py), this tree's against a baseline
tree's engine/limits.py, on the same deterministic servers: seconds of CPU, no sockets, no load
dependence, so the two controllers see exactly the same traffic.

    .venv/bin/python performance/limits_sim.py --baseline-tree /tmp/old

Servers (jitter 0.3: each service time or step scaled by a seeded uniform 0.7-1.3; drift 0.1:
the machine's speed redrawn within +-10% every second):
- flat W x S: W requests served at once for S each, the rest wait (a CPU-bound or fixed-rate
  server); its knee is W;
- batch: tests/fleet_sim.py's continuous batching (the controller tests' small engine, and
  performance/fleet.py's 64- and 256-sequence servers).

The limiter starts at the defaults (32; the small engine at 4, as its tests do), cap 512.
Reported over the second part of the run (flat: 15-40 s; batch: the last three quarters):
throughput / capacity, median latency / unloaded latency, the final limit.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "performance")]

from _measure import write_result  # noqa: E402 (after the sys.path setup above)
from fleet_sim import EngineParams  # noqa: E402 (after the sys.path setup above)
from limit_sim import BatchServer, FlatServer, drive  # noqa: E402 (after the sys.path setup above)

FLAT = [(4, 0.02, 0.0), (4, 0.02, 0.1), (8, 0.05, 0.0), (8, 0.05, 0.1), (16, 0.01, 0.0), (16, 0.01, 0.1)]
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


def scenarios(mod: ModuleType) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for workers, service, drift in FLAT:
        srv = FlatServer(workers, service, jitter=0.3, seed=1, drift=drift)
        lim = mod.AdaptiveLimit(0.0, cap=512, initial=32)
        rate, median = drive(lim, srv, 40.0).window(15.0, 40.0)
        out.append({"server": f"flat {workers} x {service * 1000:.0f} ms, drift {drift}", "limit": lim.limit,
                    "throughput": rate / srv.capacity_rps, "median_over_unloaded": median / srv.unloaded_s})
    for name, params, initial, seconds in BATCH:
        bsrv = BatchServer(params, jitter=0.3, seed=1)
        lim = mod.AdaptiveLimit(0.0, cap=512, initial=initial)
        rate, median = drive(lim, bsrv, seconds).window(seconds / 4, seconds)
        out.append({"server": f"batch {name}", "limit": lim.limit, "throughput": rate / bsrv.capacity_rps,
                    "median_over_unloaded": median / bsrv.unloaded_s})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", type=Path, default=REPO)
    ap.add_argument("--baseline-tree", type=Path, required=True)
    a = ap.parse_args()
    mine, base = scenarios(load(a.tree, "limits_this")), scenarios(load(a.baseline_tree, "limits_base"))
    print(f"{'server':32} {'baseline: limit  thr  median':>30} {'this tree: limit  thr  median':>32}")
    for m, b in zip(mine, base, strict=True):
        print(f"{m['server']:32} {b['limit']:>14} {b['throughput']:5.2f} {b['median_over_unloaded']:6.2f}x"
              f" {m['limit']:>16} {m['throughput']:5.2f} {m['median_over_unloaded']:6.2f}x")
    write_result(REPO / "performance" / "out" / "limits_sim.json", this_tree=mine, baseline=base)


if __name__ == "__main__":
    main()
