"""What the user allows in flight: `--concurrency`'s caps and whether limits adapt under them.

The limits themselves, one per server, are `engine/limits.py`'s: this module is what the
plugin's options need at start-up, and stays light (no limiter is built before a pool is).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_satbench.engine.limits import Limiter

__all__ = ["DEFAULT_CEILING", "INITIAL_LIMIT", "LEGACY_TOTAL", "ConcurrencySpec"]

# The most requests one server gets when no cap is given: twice vLLM's default max_num_seqs
# (256), so a server with the default batch is found with room to spare. A server with a
# bigger batch needs --concurrency to allow more.
DEFAULT_CEILING = 512
# Fixed limits without a cap: the plugin's one global figure before adaptive limits.
LEGACY_TOTAL = 64
# Where adaptive limits start: a quarter of vLLM's default batch, enough to see how the
# server responds without flooding a small one.
INITIAL_LIMIT = 32


@dataclass(frozen=True, slots=True)
class ConcurrencySpec:
    """What the user allows: caps, and whether limits adapt under them.

    `per_server`: no server gets more in flight than this; `total`: the whole pool gets no
    more than this; None: no cap of that kind (adaptive limits stop at DEFAULT_CEILING per
    server). `adaptive=False` holds every server at its cap (a pool with only a total cap
    then shares it by fewest in flight, as the plugin did before adaptive limits).
    `metrics=False` never reads /metrics. `initial`: where adaptive limits start.
    """

    per_server: int | None = None
    total: int | None = None
    adaptive: bool = True
    metrics: bool = True
    initial: int = INITIAL_LIMIT

    def __post_init__(self) -> None:
        for name in ("per_server", "total"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"concurrency must be >= 1, got {v}")

    @property
    def server_cap(self) -> int:
        """The most one server can be given."""
        caps = [c for c in (self.per_server, self.total) if c is not None]
        if not caps:
            return DEFAULT_CEILING if self.adaptive else LEGACY_TOTAL
        return min(caps)

    @property
    def total_cap(self) -> int | None:
        """The most the whole pool can have in flight; None: no more than its servers'."""
        if self.total is None and not self.adaptive and self.per_server is None:
            return LEGACY_TOTAL
        return self.total

    def limiter(self, now: float) -> Limiter:
        # the limiters load with the first pool, not with the plugin's options
        from pytest_satbench.engine.limits import AdaptiveLimit, FixedLimit

        if not self.adaptive:
            return FixedLimit(self.server_cap, now)
        return AdaptiveLimit(now, cap=self.server_cap, initial=self.initial)

    def split(self, parts: int) -> ConcurrencySpec:
        """Each of `parts` processes' share (xdist workers: caps are for the whole run)."""
        parts = max(1, parts)

        def share(v: int | None) -> int | None:
            return None if v is None else max(1, v // parts)

        return ConcurrencySpec(share(self.per_server), share(self.total), self.adaptive, self.metrics,
                               self.initial)

    def describe(self) -> str:
        caps = []
        if self.per_server is not None:
            caps.append(f"at most {self.per_server} per server")
        if self.total is not None:
            caps.append(f"at most {self.total} in all")
        mode = "adaptive per server" if self.adaptive else "fixed"
        if not self.adaptive and not caps:
            caps.append(f"{LEGACY_TOTAL} in all")
        return mode + (f", {', '.join(caps)}" if caps else "")
