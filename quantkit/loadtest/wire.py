"""What `quantkit bench` sends: the server's base URL, the OpenAI request bodies as TypedDicts
(chat or completions, streamed, greedy) and the optional fields some servers refuse. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypedDict
from urllib.parse import urlsplit

from quantkit.errors import BadInput
from quantkit.loadtest.prompts import Prompt

ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


class StreamOptions(TypedDict):
    include_usage: bool


class OptionalFields(TypedDict, total=False):
    """Fields that make the run comparable but that some servers refuse (transformers serve
    answers 422 to ignore_eos); the warm-up request drops the ones a server names in its refusal."""

    ignore_eos: bool
    stream_options: StreamOptions


OptionalName = Literal["ignore_eos", "stream_options"]
OPTIONAL_FIELDS: OptionalFields = {"ignore_eos": True, "stream_options": {"include_usage": True}}
OPTIONAL_NAMES: tuple[OptionalName, ...] = ("ignore_eos", "stream_options")


class _Body(OptionalFields):
    """What every streamed request sends (OpenAI's API), with the optional fields the server took."""

    model: str
    max_tokens: int
    temperature: int
    stream: bool


class ChatBody(_Body):
    """A /v1/chat/completions request: the prompt as one user message."""

    messages: list[dict[str, str]]


class CompletionBody(_Body):
    """A /v1/completions request."""

    prompt: str


@dataclass(frozen=True)
class Server:
    """Where and what to send: the endpoint URL, the model and the optional fields every body has."""

    url: str
    endpoint: str
    model: str
    extra: OptionalFields


def normalize_url(url: str) -> str:
    """The server's base URL (scheme://host:port[/prefix]) without a trailing / or /v1."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadInput(f"--url {url!r} is not an http(s) URL", "e.g. --url http://127.0.0.1:8000")
    base = url.strip().rstrip("/")
    return base.removesuffix("/v1")


def request_body(target: Server, prompt: Prompt, extra: OptionalFields | None = None
                 ) -> ChatBody | CompletionBody:
    fields = target.extra if extra is None else extra
    if target.endpoint == "chat":
        return {"model": target.model, "max_tokens": prompt.max_tokens, "temperature": 0,
                "stream": True, **fields, "messages": [{"role": "user", "content": prompt.text}]}
    return {"model": target.model, "max_tokens": prompt.max_tokens, "temperature": 0,
            "stream": True, **fields, "prompt": prompt.text}
