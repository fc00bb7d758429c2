"""The OpenAI chat-completions wire format: the request body out, and the gate every reply
passes on its way in.

The gate. A server's reply is bytes from outside: a proxy's HTML page, a truncated body, a
100,000-deep array (RecursionError in the parser), `Infinity` or `1e999` where a token count
goes (OverflowError in int()), escapes that decode to no character (a lone surrogate,
`"\\ud800"`, which no UTF-8 encoder takes: the store's writer would die on it). Each reply to
a chat request goes through `read_completion` and nothing else, and it gives exactly one of
three things, never an exception:

- a `Completion`: an answer, with text the store can hold (an answer whose text held lone
  surrogates is the model's answer all the same, a whole generation: they are replaced with
  U+FFFD and the answer is flagged `repaired`, never asked again);
- a transient `AttemptFailed`: this attempt got no answer (retried, then an error row);
- a permanent `AttemptFailed`: the same request would fail the same way (a 4xx).

What is an answer. A reply with a `content` string (or content parts with text), from the
model asked for (or an allowed alias), without an `error` object. An empty string is an
answer (the model said nothing). A reply that stopped for length (`finish_reason: "length"`)
is an answer whatever it holds: a reasoning model that spent the whole `--max-new` thinking
(vLLM with a reasoning parser sends `content: null` and the thinking in `reasoning_content`)
answered with the text it has, "", which is scored as any other text (unparseable, so wrong)
and flagged truncated; asking again at temperature 0 would only think the same way again.
Only a reply that says nothing and did not stop for length is a fault. The reasoning itself
is never scored: it is kept beside the answer (`reasoning`, with its length `reasoning_chars`
and the reasoning tokens the server reported, `usage.completion_tokens_details.reasoning_tokens`),
from `reasoning_content`/`reasoning` or, when a server leaves the thinking inline in the
content, from its `<think>...</think>` blocks (`core.scoring.inline_reasoning`; the content is
kept whole and scored as is: `final_answer` drops the thinking).

Usage figures are accounting, not the answer: a token count that is not a finite
non-negative integer (or a cost that is not a finite non-negative number) is dropped and
counted (`usage_dropped`), and the answer is kept.
"""

from __future__ import annotations

import email.utils
import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_satbench.core.scoring import inline_reasoning
from pytest_satbench.engine.failures import PROXY_AUTH_ADVICE, AttemptFailed, one_line
from pytest_satbench.engine.transport import Response

__all__ = ["OWNED_KEYS", "RETRY_AFTER_MAX_S", "Completion", "ModelCard", "chat_payload", "read_completion", "read_model_list"]

# A Retry-After beyond this is treated as this. Rate limiters sometimes answer with the length
# of a whole quota window (an hour); honouring that literally would look like a hung run, and
# a retry that is refused again simply waits again.
RETRY_AFTER_MAX_S = 120.0
# The largest token count taken as one: beyond 2**53 a count is nonsense (and past 2**63 the
# store's INTEGER column cannot hold it).
_MAX_COUNT = 2**53
_REASONING_KEYS = ("reasoning_content", "reasoning")  # vLLM's reasoning parsers; OpenRouter


@dataclass(frozen=True, slots=True)
class Completion:
    """What the gate read from one chat reply that holds an answer."""

    text: str  # the content; "" when the model stopped for length before answering
    finish_reason: str | None
    model: str | None  # the model id the reply named, None when it named none
    prompt_tokens: int | None
    completion_tokens: int | None
    cost: float | None  # usage.cost, when the server reports it (OpenRouter)
    reasoning_chars: int | None  # length of `reasoning`; None when absent
    reasoning: str | None = None  # reasoning_content/reasoning, then any thinking left inline
    reasoning_tokens: int | None = None  # usage.completion_tokens_details.reasoning_tokens
    usage_dropped: int = 0  # usage values dropped: not finite non-negative numbers
    repaired: bool = False  # lone surrogates in the text were replaced with U+FFFD


@dataclass(frozen=True, slots=True)
class ModelCard:
    """What a server says of a model it serves (vLLM's /v1/models): the same id can be served
    from other weights (`root`, the path or repository they were loaded from) or with another
    context length."""

    root: str | None
    max_model_len: int | None


# Request body keys the plugin writes itself: `--extra-body` may not set them (each has its own
# option, or the reply reader depends on it: one choice, not streamed).
OWNED_KEYS = {
    "model": "the model is --model", "messages": "the messages are the plugin's prompt",
    "max_tokens": "use --max-new", "max_completion_tokens": "use --max-new",
    "temperature": "use --temperature", "top_p": "use --top-p", "seed": "use --request-seed",
    "n": "the plugin reads one choice per request", "stream": "the plugin reads whole replies",
    "stream_options": "the plugin reads whole replies",
}


def chat_payload(model: str, prompt: str, image_b64: bytes | None, max_tokens: int,
                 temperature: float, *, top_p: float | None = None, seed: int | None = None,
                 system_prompt: str | None = None, extra_body: Mapping[str, Any] | None = None) -> bytes:
    """The request body, as `json.dumps` of the seed's message would give it.

    Built by joining pieces so the base64 image (tens of kB, pure ASCII, nothing to escape)
    is never scanned by the JSON encoder: questions about one image share its base64 bytes
    (`image_b64`, encoded once per image by the caller), and only the short parts are encoded.
    `top_p` and `seed` are sent only when given; `system_prompt` is a system message before
    the user's; `extra_body`'s keys (never one of `OWNED_KEYS`: the caller checks) are merged
    into the body's top level, as the OpenAI client's `extra_body` does.
    """
    head_doc: dict[str, Any] = {"model": model, "temperature": temperature}
    if top_p is not None:
        head_doc["top_p"] = top_p
    if seed is not None:
        head_doc["seed"] = seed
    head_doc["max_tokens"] = max_tokens
    if extra_body:
        head_doc.update(extra_body)
    head = json.dumps(head_doc)
    text = json.dumps({"type": "text", "text": prompt}).encode()
    if image_b64 is None:
        content = b"[" + text + b"]"
    else:
        content = (b'[{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,'
                   + image_b64 + b'"}}, ' + text + b"]")
    system = (b"" if system_prompt is None
              else b'{"role": "system", "content": ' + json.dumps(system_prompt).encode() + b"}, ")
    return (head[:-1].encode() + b', "messages": [' + system + b'{"role": "user", "content": '
            + content + b"}]}")


# ---------------------------------------------------------------------- the gate


def read_completion(r: Response, model: str, aliases: frozenset[str] = frozenset(), *,
                    proxied: bool = False) -> Completion:
    """The answer in the reply to a chat request, or AttemptFailed saying why there is none.
    Never raises anything else (see the module docstring). `proxied`: the request went
    through a forward proxy, which answers 407 itself."""
    try:
        return _read_completion(r, model, aliases, proxied)
    except AttemptFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - the gate's promise: a verdict, never an escape
        raise AttemptFailed.no_answer(f"an unreadable reply ({_what(exc)})", status=_status(r)) from None


def _read_completion(r: Response, model: str, aliases: frozenset[str], proxied: bool) -> Completion:
    status = r.status
    doc, problem = _document(r.body)
    if status == 407 and proxied:
        # A forward proxy answers 407 itself; it would answer every retry the same way.
        raise AttemptFailed(f"HTTP 407 from the proxy: {_snippet(doc, r.body)}", transient=False,
                            status=407, advice=PROXY_AUTH_ADVICE)
    if status in (408, 429) or status >= 500:
        raise AttemptFailed(f"HTTP {status}: {_snippet(doc, r.body)}", transient=True, status=status,
                            retry_after=_retry_after(r), overload=status in (429, 503, 504))
    if not 200 <= status < 300:
        raise AttemptFailed(f"HTTP {status}: {_snippet(doc, r.body)}", transient=False, status=status)

    def fault(what: str) -> AttemptFailed:
        return AttemptFailed.no_answer(what, status=status)

    if problem is not None:
        raise fault(f"not a chat completion ({problem}): {_snippet(None, r.body)}")
    if not isinstance(doc, dict):
        raise fault(f"not a chat completion: {_snippet(doc, r.body)}")
    if doc.get("error"):
        raise fault(f"an error object: {_snippet(doc, r.body)}")
    choices = doc.get("choices")
    if not isinstance(choices, list):
        raise fault(f"no choices: {_snippet(doc, r.body)}")
    if not choices:
        raise fault("an empty choices list")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise fault("no message in choices[0]")
    finish = choice.get("finish_reason")
    if finish is not None and not (isinstance(finish, str) and _is_text(finish)):
        finish = one_line(repr(finish), 60)  # odd, but it says nothing against the answer
    raw = content = message.get("content")
    if isinstance(content, list):  # some servers return content parts
        texts = [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        content = "".join(texts) if texts else None
    if content is None and finish == "length":
        content = ""  # it stopped for length before answering: it answered nothing, truncated
    if not isinstance(content, str):
        state = ("missing" if "content" not in message else "null" if raw is None
                 else "parts without text" if isinstance(raw, list) else f"not text ({type(raw).__name__})")
        raise fault(f"no answer: content {state}, finish_reason {finish!r}")
    repaired = not _is_text(content)
    if repaired:  # the model answered: kept, its unencodable characters replaced, and flagged
        content = _repaired(content)
    returned = doc.get("model")
    if returned is not None and not isinstance(returned, str):
        raise fault(f"a model id that is not text ({one_line(repr(returned), 60)})")
    if returned and returned != model and returned not in aliases:
        shown = one_line(returned, 80)
        raise AttemptFailed.no_answer(
            f"the reply is from model {shown!r}, not {model!r}", status=status, other_model=shown,
            advice=f"check --servers; if {shown!r} is another name of the same model, pass "
                   "--allow-model-alias with it")
    reasoning = next((message[k] for k in _REASONING_KEYS if isinstance(message.get(k), str)), None)
    inline = inline_reasoning(content)
    if inline is not None:
        reasoning = inline if reasoning is None else f"{reasoning}\n\n{inline}"
    if reasoning is not None and not _is_text(reasoning):
        reasoning = _repaired(reasoning)  # never scored: repaired without a flag
    usage = doc.get("usage")
    dropped = 0
    if usage is not None and not isinstance(usage, dict):
        usage, dropped = {}, 1
    usage = usage or {}
    prompt_tokens, bad_p = _count(usage.get("prompt_tokens"))
    completion_tokens, bad_c = _count(usage.get("completion_tokens"))
    cost, bad_cost = _amount(usage.get("cost"))
    details = usage.get("completion_tokens_details")
    reasoning_tokens, bad_r = _count(details.get("reasoning_tokens")) if isinstance(details, dict) else (None, 0)
    return Completion(
        text=content, finish_reason=finish, model=returned or None,
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, cost=cost,
        reasoning_chars=len(reasoning) if reasoning is not None else None,
        reasoning=reasoning, reasoning_tokens=reasoning_tokens,
        usage_dropped=dropped + bad_p + bad_c + bad_cost + bad_r, repaired=repaired,
    )


def read_model_list(r: Response, *, proxied: bool = False) -> dict[str, ModelCard]:
    """The models a /v1/models reply lists, in its order, with what it says of each; raises
    AttemptFailed (permanent: a server that lists its models wrongly will list them wrongly
    again) otherwise. Never raises anything else."""
    try:
        return _read_model_list(r, proxied)
    except AttemptFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - as read_completion
        raise AttemptFailed(f"answered HTTP {_status(r)} but an unreadable model list ({_what(exc)})",
                            transient=False) from None


def _read_model_list(r: Response, proxied: bool) -> dict[str, ModelCard]:
    doc, problem = _document(r.body)
    if r.status == 407 and proxied:
        raise AttemptFailed(f"HTTP 407 from the proxy: {_snippet(doc, r.body)}", transient=False,
                            status=407, advice=PROXY_AUTH_ADVICE)
    if r.status != 200:
        raise AttemptFailed(f"HTTP {r.status}: {_snippet(doc, r.body)}", transient=False, status=r.status)
    data = doc.get("data") if isinstance(doc, dict) else None
    entries = [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []
    ids = [m.get("id") for m in entries]
    if problem is not None or not isinstance(data, list) or len(entries) != len(data) \
            or not all(isinstance(i, str | int) and not isinstance(i, bool) and _is_text(str(i)) for i in ids):
        raise AttemptFailed(f"answered HTTP 200 but not an OpenAI model list: {_snippet(doc, r.body)}",
                            transient=False)
    if not ids:
        raise AttemptFailed("serves no model (empty /v1/models list)", transient=False)
    cards: dict[str, ModelCard] = {}
    for m in entries:
        root = m.get("root")
        cards[str(m["id"])] = ModelCard(root if isinstance(root, str) and _is_text(root) else None,
                                        _count(m.get("max_model_len"))[0])
    return cards


# ---------------------------------------------------------------------- pieces


def _document(body: bytes) -> tuple[Any, str | None]:
    """(the JSON document, None) or (None, what is wrong with it)."""
    try:
        return json.loads(body), None
    except RecursionError:
        return None, "JSON nested too deep"
    except UnicodeDecodeError:
        return None, "bytes that are not UTF-8 text"
    except ValueError as exc:
        return None, f"invalid JSON: {one_line(exc, 80)}"
    except Exception as exc:  # noqa: BLE001 - see read_completion
        return None, _what(exc)


def _snippet(doc: Any, body: bytes) -> str:
    """The server's own error message, from the usual JSON shapes, or the raw body."""
    msg: Any = None
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict):
            msg = err.get("message")
        elif isinstance(err, str):
            msg = err
        msg = msg or doc.get("message") or doc.get("detail")
    if not isinstance(msg, str) or not msg:
        msg = body[: 4 * 1024].decode("utf-8", "replace")
    return one_line(msg) if msg.strip() else "(empty body)"


def _retry_after(r: Response) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP-date), capped."""
    raw = r.headers.get("Retry-After")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        secs = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        secs = when.timestamp() - time.time()
    if not math.isfinite(secs):
        return None
    return min(max(secs, 0.0), RETRY_AFTER_MAX_S)


def _count(v: Any) -> tuple[int | None, int]:
    """(a token count, 0), (None, 0) when absent, or (None, 1): present but not a finite
    non-negative integer (a bool, a fraction, Infinity, NaN, a negative or absurd number)."""
    if v is None:
        return None, 0
    if isinstance(v, str) and v.isascii() and v.isdigit() and len(v) <= 16:
        v = int(v)
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        v = int(v)
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _MAX_COUNT:
        return v, 0
    return None, 1


def _amount(v: Any) -> tuple[float | None, int]:
    """As _count, for a cost: a finite non-negative number."""
    if v is None:
        return None, 0
    if isinstance(v, int | float) and not isinstance(v, bool):
        f = float(v) if abs(v) < 1e300 else math.inf
        if math.isfinite(f) and f >= 0:
            return f, 0
    return None, 1


def _repaired(s: str) -> str:
    """`s` with each lone surrogate (an escape such as "\\ud800" that decodes to no character)
    replaced by U+FFFD; a pair written as two escapes becomes its character."""
    return s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _is_text(s: str) -> bool:
    """Whether `s` can be encoded (stored, printed): no lone surrogate."""
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _status(r: Any) -> int:
    status = getattr(r, "status", 200)
    return status if isinstance(status, int) else 200


def _what(exc: BaseException) -> str:
    text = one_line(exc, 120)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
