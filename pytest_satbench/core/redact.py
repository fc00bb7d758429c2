"""Credentials are never written anywhere: the store, reports, the terminal, junit XML and\nerror messages are shared, keys are not."""

from __future__ import annotations

import math
import re
from typing import Any

# What an API key looks like in the wild: OpenAI/OpenRouter "sk-...", HF "hf_...", and the
# value of an Authorization header of any scheme (a server may echo it in an error).
_KEYLIKE = re.compile(
    r"\b(?:sk-[A-Za-z0-9_\-]{6,}|sk_[A-Za-z0-9_\-]{6,}|hf_[A-Za-z0-9]{10,}"
    r"|(?:Bearer|Basic|Token|Digest|ApiKey)\s+[A-Za-z0-9._~+/=\-]{4,})",
    re.IGNORECASE,
)
_KEY_OPTIONS = ("--api-key", "--openai-api-key", "--token")
# user:password@ in any URL of a text (a --servers list has several, comma-separated)
_USERINFO = re.compile(r"\b([a-z][a-z0-9+.\-]*://)[^/@\s,]+@", re.IGNORECASE)
# credentials as URL query parameters (?api_key=..., &token=...)
_QUERY_KEY = re.compile(r"([?&](?:api[_-]?key|key|token|access_token|auth)=)[^&\s#,]+", re.IGNORECASE)
REDACTED = "<redacted>"


def redact_url(url: str) -> str:
    """A server URL without user:password@ or a key in its query (never written anywhere)."""
    return _QUERY_KEY.sub(rf"\1{REDACTED}", _USERINFO.sub(r"\1", url))


def redact(value: Any) -> Any:
    """`value` with anything that looks like a credential replaced, recursively.

    The protocol is written by the plugin without a key, but a command line may carry
    `--api-key ...` and a URL may carry `user:token@`: reports are shared, keys are not."""
    if isinstance(value, dict):
        return {k: (REDACTED if _secret_name(str(k)) and v else redact(v)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        out: list[Any] = []
        hide_next = False
        for v in value:
            if hide_next:
                out.append(REDACTED)
                hide_next = False
                continue
            if isinstance(v, str):
                opt, eq, _ = v.partition("=")
                if opt in _KEY_OPTIONS:
                    if eq:
                        out.append(f"{opt}={REDACTED}")
                    else:
                        out.append(v)
                        hide_next = True
                    continue
            out.append(redact(v))
        return out
    if isinstance(value, str):
        return _KEYLIKE.sub(REDACTED, redact_url(value))
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _secret_name(name: str) -> bool:
    n = name.lower().replace("-", "_")
    return n in ("api_key", "apikey", "openai_api_key", "authorization", "password", "secret", "bearer_token")
