"""The OpenAI wire shapes the reference server speaks, modelled on what vLLM sends.

Kept apart from the HTTP handler so the shapes (and their validation) read in one place:
the model card (`GET /v1/models[/{id}]`), the error body, the request fields that change
the reply's shape (`model`, `n`, `stream`, `stream_options`), and a finished completion
rendered either as one `chat.completion` or as the `chat.completion.chunk` events of a
stream.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

# OpenAI documents 128 as the most choices one request may ask for; a larger n is far more
# likely a typo than a wish, and each choice costs the (deterministic) answer again.
MAX_N = 128
# Reported in the model card as vLLM reports its context length. The reference server has no
# context window, so nothing is truncated or refused against it: it is there so clients that
# read the field (as they would on vLLM) find a plausible number.
MAX_MODEL_LEN = 32768
OWNED_BY = "pytest-satbench"


class ApiError(Exception):
    """A request the server refuses; becomes an OpenAI error body with `status`."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.kind = kind

    def body(self) -> dict[str, Any]:
        # The numeric code mirrors the status, as vLLM's ErrorInfo does.
        return {"error": {"message": str(self), "type": self.kind, "param": self.param,
                          "code": self.status}}


class RequestError(ApiError):
    """The request is malformed; the message is returned to the client with a 400."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(400, message, param)


def model_not_found(model: str) -> ApiError:
    # vLLM's wording and type for a model it does not serve (OpenAIModelRegistry.check_model),
    # so a client's handling of vLLM's 404 is exercised unchanged; vLLM names param "model".
    return ApiError(404, f"The model `{model}` does not exist.", "model", kind="NotFoundError")


@dataclass(frozen=True, slots=True)
class ModelCard:
    """One entry of `GET /v1/models`, and the body of `GET /v1/models/{id}` (vLLM's shape)."""

    id: str
    root: str  # vLLM: the path the weights came from; here, the id itself
    created: int = 0  # fixed, so the listing is byte-identical across calls and restarts
    max_model_len: int = MAX_MODEL_LEN
    object: str = "model"
    owned_by: str = OWNED_BY
    parent: str | None = None

    @classmethod
    def of(cls, model: str) -> ModelCard:
        return cls(id=model, root=model)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ReplyOptions:
    """The request fields that decide the reply's shape, validated up front."""

    model: str | None = None  # None: the request named none (vLLM: its one model)
    n: int = 1
    stream: bool = False
    include_usage: bool = False


def parse_reply_options(doc: dict[str, Any]) -> ReplyOptions:
    model = doc.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(f"'model' must be a string model id (got {type(model).__name__})",
                           "model")
    n = doc.get("n")
    if n is None:  # absent or null: one choice, as OpenAI and vLLM default
        n = 1
    # bool is an int in Python; `"n": true` is a client bug, not a count.
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise RequestError(f"'n' must be an integer from 1 to {MAX_N} (got {n!r})", "n")
    stream = doc.get("stream")
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise RequestError(f"'stream' must be true or false (got {stream!r})", "stream")
    opts = doc.get("stream_options")
    include_usage = False
    if opts is not None:
        # vLLM refuses stream_options on a non-streaming request; so does this server, so a
        # client that relies on it for usage finds out here rather than against vLLM.
        if not stream:
            raise RequestError("'stream_options' is only allowed with \"stream\": true",
                               "stream_options")
        if not isinstance(opts, dict):
            raise RequestError("'stream_options' must be an object, e.g. "
                               '{"include_usage": true}', "stream_options")
        raw = opts.get("include_usage", False)
        if raw is None:
            raw = False
        if not isinstance(raw, bool):
            raise RequestError(f"'stream_options.include_usage' must be true or false "
                               f"(got {raw!r})", "stream_options")
        include_usage = raw
    return ReplyOptions(model=model or None, n=n, stream=stream, include_usage=include_usage)


@dataclass(frozen=True, slots=True)
class Sampling:
    """The request fields that decide which answer is sampled (reference_answers.sampled)."""

    temperature: float = 0.0
    seed: int | None = None


def parse_sampling(doc: dict[str, Any]) -> Sampling:
    """`temperature` (a number >= 0; absent or null: 0, as this server has no other default)
    and `seed` (an integer or null); a value of another type is a 400, as on vLLM."""
    t = doc.get("temperature")
    if t is None:
        t = 0.0
    if isinstance(t, bool) or not isinstance(t, int | float) or not (t >= 0 and t < float("inf")):
        raise RequestError(f"'temperature' must be a number >= 0 (got {t!r})", "temperature")
    seed = doc.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError(f"'seed' must be an integer (got {seed!r})", "seed")
    return Sampling(float(t), seed)


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_json(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens}


_PIECE = re.compile(r"\S+\s*|\s+")


def pieces(content: str) -> list[str]:
    """The content as the stream sends it: one piece per word with its trailing space.

    Every character falls in exactly one piece, so the pieces joined are the content.
    """
    return _PIECE.findall(content)


def completion_tokens(content: str) -> int:
    # One "token" per streamed piece; an empty answer still costs its end-of-sequence token.
    return max(1, len(pieces(content)))


@dataclass(frozen=True, slots=True)
class Completion:
    """A finished answer to one request: `n` identical choices of `content`.

    The reference server answers deterministically (as at temperature 0), so every one of
    the n choices is the same text; n is honoured for the shape of the reply, not sampled.
    """

    id: str
    created: int
    model: str
    content: str
    n: int
    prompt_tokens: int

    @property
    def usage(self) -> Usage:
        # As vLLM counts it: the prompt once, the completion tokens of every choice.
        return Usage(self.prompt_tokens, self.n * completion_tokens(self.content))

    def response(self) -> dict[str, Any]:
        """The non-streaming `chat.completion` body."""
        return {
            "id": self.id, "object": "chat.completion", "created": self.created,
            "model": self.model,
            "choices": [{"index": i,
                         "message": {"role": "assistant", "content": self.content},
                         "logprobs": None, "finish_reason": "stop"}
                        for i in range(self.n)],
            "usage": self.usage.to_json(),
        }

    def _chunk(self, choices: list[dict[str, Any]], usage: Usage | None = None
               ) -> dict[str, Any]:
        doc: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk",
                               "created": self.created, "model": self.model,
                               "choices": choices}
        if usage is not None:
            doc["usage"] = usage.to_json()
        return doc

    def chunks(self, include_usage: bool) -> Iterator[dict[str, Any]]:
        """The `chat.completion.chunk` documents of a stream, in vLLM's order.

        Each chunk carries one choice: first a role delta per choice (`content` ""), then
        the content piece by piece, then a chunk per choice with its finish_reason, and,
        when asked for, a last chunk with `choices: []` and the usage of the whole request.
        The `data: [DONE]` sentinel is the transport's to add.
        """
        for i in range(self.n):
            yield self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                                "logprobs": None, "finish_reason": None}])
        for piece in pieces(self.content):
            for i in range(self.n):
                yield self._chunk([{"index": i, "delta": {"content": piece},
                                    "logprobs": None, "finish_reason": None}])
        for i in range(self.n):
            yield self._chunk([{"index": i, "delta": {"content": ""}, "logprobs": None,
                                "finish_reason": "stop", "stop_reason": None}])
        if include_usage:
            yield self._chunk([], self.usage)
