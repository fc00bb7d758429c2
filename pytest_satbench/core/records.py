"""The records every layer passes around: one stored answer, one server's traffic, one arm's distortion.

`AnswerRow` is what the store keeps per (node id, arm, fingerprint) and what every number is
computed from (`results.benchmark_results`); `ServerTraffic` is what one process's client
counted per server, kept with the run so reports can show attempts, failures and retries.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class AnswerRow:
    nodeid: str
    arm: str
    fingerprint: str
    status: str  # "ok" | "error"
    benchmark: str
    question_key: str
    image_id: str
    text: str | None = None
    extracted: str | None = None
    correct: bool | None = None
    parsed: bool | None = None
    finish_reason: str | None = None
    latency_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost: float | None = None
    model: str | None = None
    server: str | None = None
    attempts: int | None = None
    image_sha256: str | None = None
    image_tokens: int | None = None
    error: str | None = None
    created: float = 0.0
    run_id: str | None = None  # the run that asked it (a later run reusing it keeps this)
    clipped: bool | None = None  # the text was longer than --max-answer-chars and was cut there
    # characters the model spent reasoning (reasoning_content), never scored; None when the reply
    # had none. With finish_reason "length" and an empty text: it ran out of tokens thinking.
    reasoning_chars: int | None = None
    # the reply's text held characters no encoder takes (lone surrogates): they were replaced
    # with U+FFFD, the rest is the model's answer (engine/wire.py)
    repaired: bool | None = None
    # the reasoning tokens the server reported (usage.completion_tokens_details.reasoning_tokens);
    # None when it reported none (reports then estimate them from characters, labelled so)
    reasoning_tokens: int | None = None
    # the reasoning itself (reasoning_content, or <think>...</think> left inline in the content),
    # clipped like the text; never scored. Last, and read only where asked for (engine/store.py)
    reasoning: str | None = None


@dataclass(frozen=True, slots=True)
class Distortion:
    """How far one arm's image, as sent, is from the original's, as sent (engine/distortion.py).

    Both images are the decoded JPEG q95 bytes the VLM receives, at the arms' common geometry,
    8-bit RGB, data range 255. `psnr` is math.inf when the two are identical (the store keeps
    IEEE infinity; reports show "inf"). `msssim` is None when the smaller side is under 161 px
    (five scales of an 11-px window do not fit); `lpips` is None unless --lpips-weights was given.
    """

    psnr: float  # dB (Huynh-Thu & Ghanbari 2008); math.inf for identical images
    ssim: float  # Wang et al. 2004, 11x11 Gaussian window (sigma 1.5), mean over channels
    msssim: float | None = None  # Wang, Simoncelli & Bovik 2003, 5 scales
    lpips: float | None = None  # Zhang et al. 2018, AlexNet, from the user's weights


@dataclass(frozen=True, slots=True)
class LimitTrace:
    """How one process's client limited one server: adaptive limits over the run."""

    server: str
    process: str  # "main", or the xdist worker ("gw0")
    steered_by: str  # "metrics" (vLLM /metrics), "latency" (what the client saw) or "fixed"
    final_limit: int
    peak_in_flight: int
    points: tuple[tuple[float, int], ...]  # (seconds since the client started, limit) per change


@dataclass(frozen=True, slots=True)
class ServerTraffic:
    """What one process's client counted of one server (xdist workers each keep their own):
    the one counters record per server. The client's live snapshot (`engine.client.ServerCounters`)
    is this with its limits; the store keeps it with the run (`run_traffic`)."""

    server: str
    requests: int  # attempts sent
    answered: int  # attempts that returned a usable chat completion
    failures: int  # attempts that failed, transient or not
    retries: int  # attempts that retried an earlier failed attempt
    usage_dropped: int = 0  # usage values the reply gate dropped (not finite non-negative numbers)
    resent: int = 0  # requests sent again because a reused connection was closed under them

    def __add__(self, other: ServerTraffic) -> ServerTraffic:
        return ServerTraffic(
            self.server, self.requests + other.requests, self.answered + other.answered,
            self.failures + other.failures, self.retries + other.retries,
            self.usage_dropped + other.usage_dropped, self.resent + other.resent,
        )
