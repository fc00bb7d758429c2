"""What a run's answers cost and who served them: `BenchmarkResult.usage`.

The usage is a concern of its own beside the scores: it reads a row's server, tokens, cost,
latency and model, never its verdict, and what the clients counted (`ServerTraffic`,
`LimitTrace`), never the questions. `UsageTally` sums the stored rows as
`results.benchmark_results` streams them, question by question, so nothing per answer is
kept but its latency (8 bytes, for the percentiles), and gives one `Usage`: per server and
in all. A server is shown by its URL without credentials (`redact.redact_url`): the reports
that print it are shared.

Visual tokens (`VisualTokens`, per arm): what the server says each arm's prompt cost
(`usage.prompt_tokens`), the same question's difference from the original's prompt (every arm
is sent at the same geometry with the same text, so a difference is the server tokenising the
two images differently: a resize of its own) and from the blind arm's (no image: the difference
is the image's own visual tokens as the server counts them). Paired per question, over the
questions where both rows reported prompt tokens.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field

from pytest_satbench.core import arms as A
from pytest_satbench.core.reasoning import ReasoningStats, ReasoningTally
from pytest_satbench.core.records import AnswerRow, LimitTrace, ServerTraffic
from pytest_satbench.core.redact import redact_url

__all__ = ["ServerUsage", "Usage", "UsageTally", "VisualTokens", "percentile", "per_thousand", "resized_line"]


@dataclass(slots=True)
class ServerUsage:
    """One server's share of the run: answers and their usage from the stored rows, attempts
    from what the clients counted (`traffic`)."""

    answers: int = 0  # "ok" rows
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0  # sum of what the server reported
    rows_with_cost: int = 0  # answers whose response carried a cost
    latency_mean_s: float | None = None
    latency_p50_s: float | None = None
    latency_p95_s: float | None = None
    models: dict[str, int] = field(default_factory=dict)  # model id as returned -> answers
    requests: int | None = None  # HTTP attempts; None: the run did not record its traffic
    failures: int | None = None  # attempts that failed (a retry may have answered later)
    retries: int | None = None  # attempts that were retries
    usage_dropped: int | None = None  # usage values the reply gate dropped (not finite non-negative numbers)
    resent: int | None = None  # requests sent again because a reused connection was closed under them
    # the client's in-flight limit for this server, summed over the run's processes
    limit: int | None = None  # at the end; None: the run did not record its limits
    peak_in_flight: int | None = None  # the most in flight at once (per process, summed)
    steered_by: str = ""  # metrics, latency or fixed (see engine/limits.py)


@dataclass(slots=True)
class Usage:
    total: ServerUsage
    by_server: dict[str, ServerUsage]
    errors: int  # error rows (no answer after retries); they have no usage
    errors_by_arm: dict[str, int]
    image_tokens: dict[str, float | None]  # arm -> mean image tokens per answer (None: not reported)
    asked: int  # answers asked by this run
    reused: int  # answers this run took from the store (asked by an earlier run)
    limits: tuple[LimitTrace, ...] = ()  # each server's limits over the run, per process
    # answers this run did not record, of questions or arms it did not select (a report of several
    # runs of a tag, `Coverage`): its tag's earlier runs recorded them
    earlier: int = 0
    # per arm whose answers carried reasoning: its length in tokens, truncations (core/reasoning.py)
    reasoning: dict[str, ReasoningStats] = field(default_factory=dict)
    # per arm (orig, reconstructions, blind): the prompt tokens the server reported, paired
    visual_tokens: dict[str, VisualTokens] = field(default_factory=dict)


@dataclass(slots=True)
class VisualTokens:
    """One arm's prompt tokens as the server reported them (module docstring)."""

    answers: int = 0  # answers that reported prompt tokens
    prompt_tokens_mean: float | None = None
    paired_orig: int = 0  # questions where this arm and orig both reported prompt tokens
    delta_orig_mean: float | None = None  # mean of (this arm - orig) over those
    differ_orig: int = 0  # of those, questions where the two counts differ
    paired_blind: int = 0  # questions where this arm and blind both reported prompt tokens
    image_tokens_mean: float | None = None  # mean of (this arm - blind): the server's visual tokens


def per_thousand(accuracy: float | None, tokens: float | None) -> float | None:
    """Accuracy per 1,000 visual tokens: accuracy / (tokens / 1000), with `tokens` the mean
    tokens per question of the arm (docs/reports.md says which); None when either is missing
    or the tokens are not positive."""
    if accuracy is None or tokens is None or math.isnan(accuracy) or not tokens > 0:
        return None
    return 1000.0 * accuracy / tokens


def visual_summary(usage: Usage, accuracy: Mapping[str, float | None]) -> dict[str, dict[str, float | int | None]]:
    """Per arm with prompt tokens or codec tokens: its prompt tokens, their paired differences,
    the server's visual tokens (vs blind), the codec's tokens per image, its accuracy (`accuracy`,
    exact match over every question) and the accuracy per 1,000 of either kind of visual token
    (summary.json's `visual_tokens`, the reports' table)."""
    out: dict[str, dict[str, float | int | None]] = {}
    for arm in dict.fromkeys([*usage.visual_tokens, *(a for a, t in usage.image_tokens.items() if t is not None)]):
        v = usage.visual_tokens.get(arm, VisualTokens())
        codec = usage.image_tokens.get(arm)
        acc = accuracy.get(arm)
        out[arm] = {
            "answers_with_prompt_tokens": v.answers, "prompt_tokens_mean": v.prompt_tokens_mean,
            "paired_orig": v.paired_orig, "delta_orig_mean": v.delta_orig_mean, "differ_orig": v.differ_orig,
            "paired_blind": v.paired_blind, "server_visual_tokens_mean": v.image_tokens_mean,
            "codec_tokens_per_image": codec, "accuracy": acc,
            "accuracy_per_1k_server_visual_tokens": per_thousand(acc, v.image_tokens_mean),
            "accuracy_per_1k_codec_tokens": per_thousand(acc, codec),
        }
    return out


def resized_line(usage: Usage, labels: Mapping[str, str] | None = None) -> str | None:
    """One sentence when the server's prompt tokens say it tokenised some arm's image
    differently from the original's (None when no paired count differs)."""
    parts = [f"{(labels or {}).get(arm, arm)} on {v.differ_orig} of {v.paired_orig} questions"
             for arm, v in usage.visual_tokens.items() if arm not in (A.ORIG, A.BLIND) and v.differ_orig]
    if not parts:
        return None
    return ("visual tokens: the server's prompt tokens differ from the original's for " + "; ".join(parts)
            + " (every arm is sent at the same geometry with the same text: the server resized or "
            "tokenised those images differently)")


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile by linear interpolation between closest ranks (numpy's default
    method), without numpy: the engine's live counters use it too. None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(slots=True)
class _ServerTally:
    """One server's answers, summed as they go by."""

    answers: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    rows_with_cost: int = 0
    latencies: array[float] = field(default_factory=lambda: array("d"))  # 8 bytes per answer
    models: Counter[str] = field(default_factory=Counter)
    _model: dict[str | None, str] = field(default_factory=dict)  # str(model) once per model

    def add(self, r: AnswerRow) -> None:
        self.answers += 1
        if r.latency_s is not None:
            self.latencies.append(r.latency_s)
        self.prompt_tokens += r.prompt_tokens or 0
        self.completion_tokens += r.completion_tokens or 0
        if r.cost is not None:
            self.cost += r.cost
            self.rows_with_cost += 1
        model = self._model.get(r.model)
        if model is None:
            model = self._model[r.model] = str(r.model)
        self.models[model] += 1

    def usage(self, traffic: ServerTraffic | None) -> ServerUsage:
        u = ServerUsage(answers=self.answers, prompt_tokens=self.prompt_tokens,
                        completion_tokens=self.completion_tokens, cost=self.cost, rows_with_cost=self.rows_with_cost)
        if self.latencies:
            lat = sorted(self.latencies)
            u.latency_mean_s = math.fsum(lat) / len(lat)  # statistics.fmean, without a list
            u.latency_p50_s = percentile(lat, 50)
            u.latency_p95_s = percentile(lat, 95)
        u.models = dict(sorted(self.models.items()))
        if traffic is not None:
            u.requests, u.failures, u.retries = traffic.requests, traffic.failures, traffic.retries
            u.usage_dropped, u.resent = traffic.usage_dropped, traffic.resent
        return u


class UsageTally:
    """A run's rows summed into its `Usage` as they go by: usage per server and in all,
    errors, image tokens, and the answers `run_id` asked, reused or left to earlier runs."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._servers: dict[str | None, _ServerTally] = {}  # server as stored -> its tally (by shown name)
        self.by_server: dict[str, _ServerTally] = {}
        self.total_cost = 0.0
        self.errors = 0
        self.errors_by_arm: Counter[str] = Counter()
        self.tokens: dict[str, list[int]] = {}  # arm -> [sum, count]
        self.asked = 0
        self.earlier = 0  # answers the run did not record (its tag's earlier runs recorded them)
        self.reasoning = ReasoningTally()
        # arm -> [answers, prompt tokens, paired with orig, sum of differences, differing,
        #         paired with blind, sum of differences]
        self.visual: dict[str, list[int]] = {}

    def add(self, rows: Mapping[str, AnswerRow], own: Container[str] | None = None) -> None:
        """One question's rows by arm; `own`: the arms the run recorded for it (None: all)."""
        for arm, r in rows.items():
            if r.image_tokens is not None:
                t = self.tokens.setdefault(arm, [0, 0])
                t[0] += r.image_tokens
                t[1] += 1
            if r.status != "ok":
                self.errors += 1
                self.errors_by_arm[r.arm] += 1
                continue
            server = self._servers.get(r.server)
            if server is None:
                name = redact_url(str(r.server)) if r.server else "unknown"
                server = self._servers[r.server] = self.by_server.setdefault(name, _ServerTally())
            server.add(r)
            if r.cost is not None:
                self.total_cost += r.cost  # in row order, as a sum over all rows would add them
            if r.run_id == self.run_id:
                self.asked += 1
            elif own is not None and arm not in own:
                self.earlier += 1
        self.reasoning.add(rows)
        self._visual(rows)

    def _visual(self, rows: Mapping[str, AnswerRow]) -> None:
        """One question's prompt tokens per arm, and their differences from orig's and blind's."""
        orig, blind = rows.get(A.ORIG), rows.get(A.BLIND)
        o = orig.prompt_tokens if orig is not None and orig.status == "ok" else None
        b = blind.prompt_tokens if blind is not None and blind.status == "ok" else None
        for arm, r in rows.items():
            if r.status != "ok" or r.prompt_tokens is None or not (arm in (A.ORIG, A.BLIND) or A.is_recon(arm)):
                continue
            v = self.visual.get(arm)
            if v is None:
                v = self.visual[arm] = [0] * 7
            p = r.prompt_tokens
            v[0] += 1
            v[1] += p
            if o is not None:
                v[2] += 1
                v[3] += p - o
                v[4] += p != o
            if b is not None:
                v[5] += 1
                v[6] += p - b

    def _total(self) -> _ServerTally:
        """Every server's answers together (the sums are exact, the latencies sorted anyway)."""
        total = _ServerTally(cost=self.total_cost)
        for t in self.by_server.values():
            total.answers += t.answers
            total.prompt_tokens += t.prompt_tokens
            total.completion_tokens += t.completion_tokens
            total.rows_with_cost += t.rows_with_cost
            total.latencies.extend(t.latencies)
            total.models.update(t.models)
        return total

    def usage(self, arms: list[str], traffic: Mapping[str, ServerTraffic],
              limits: Sequence[LimitTrace] = ()) -> Usage:
        shown_traffic = {redact_url(name): t for name, t in traffic.items()}
        for name in shown_traffic:
            self.by_server.setdefault(name, _ServerTally())  # a server that only failed still shows
        tokens: dict[str, float | None] = {}
        for arm in arms:
            got = self.tokens.get(arm)
            tokens[arm] = got[0] / got[1] if got else None
        total_traffic = None
        if shown_traffic:
            parts = list(shown_traffic.values())
            total_traffic = sum(parts[1:], parts[0])
        total = self._total()
        by_server = {s: t.usage(shown_traffic.get(s)) for s, t in sorted(self.by_server.items())}
        for trace in limits:
            u = by_server.get(redact_url(trace.server))
            if u is None:
                continue
            u.limit = (u.limit or 0) + trace.final_limit
            u.peak_in_flight = (u.peak_in_flight or 0) + trace.peak_in_flight
            u.steered_by = trace.steered_by if u.steered_by in ("", trace.steered_by) else "mixed"
        return Usage(
            total=total.usage(total_traffic),
            by_server=by_server,
            errors=self.errors,
            errors_by_arm=dict(sorted(self.errors_by_arm.items())),
            image_tokens=tokens,
            asked=self.asked,
            reused=total.answers - self.asked - self.earlier,
            limits=tuple(limits),
            earlier=self.earlier,
            reasoning=self.reasoning.stats(),
            visual_tokens={arm: self._visual_tokens(arm) for arm in arms if arm in self.visual},
        )

    def _visual_tokens(self, arm: str) -> VisualTokens:
        n, total, po, do, differ, pb, db = self.visual[arm]
        return VisualTokens(
            answers=n, prompt_tokens_mean=total / n if n else None,
            paired_orig=po, delta_orig_mean=do / po if po else None, differ_orig=differ,
            paired_blind=pb, image_tokens_mean=db / pb if pb and arm != A.BLIND else None,
        )
