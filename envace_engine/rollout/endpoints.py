"""OpenAI-compatible chat endpoints as a simulated user and as a judge (rollout/judges.py).

Both speak ``POST {url}/v1/chat/completions`` (SGLang, vLLM or any OpenAI-style server) over
httpx, retry a failed request a few times and turn every failure into data: a ``UserReply``
with ``error`` (the episode ends with ``user_error``) or a judge verdict of None (the episode
is unscorable, never silently 0). τ² samples both at temperature 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from envace_engine.rollout.judges import ChatNlJudge
from envace_engine.rollout.user import (
    UserReply,
    UserRequest,
    parse_user_text,
    user_messages,
    user_system_of,
)


@dataclass(frozen=True)
class Endpoint:
    """Where to ask: the server root, the model name, sampling and retry settings."""

    url: str
    model: str = "default"
    temperature: float = 0.0
    max_tokens: int = 256
    timeout_s: float = 60.0
    max_retries: int = 2


def parse_endpoint(spec: str) -> Endpoint:
    """``openai+http://HOST:PORT[?model=NAME]`` as an ``Endpoint``."""

    parts = urlsplit(spec.removeprefix("openai+"))
    if not spec.startswith("openai+") or parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"bad endpoint {spec!r}: expected openai+http://HOST:PORT[?model=NAME]")
    model = parse_qs(parts.query).get("model", ["default"])[0]
    return Endpoint(f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}", model)


def chat(endpoint: Endpoint, messages: list[dict[str, str]], client: httpx.Client) -> str | None:
    """The assistant content of one chat completion, or None after the retries failed."""
    body: dict[str, Any] = {
        "model": endpoint.model,
        "temperature": endpoint.temperature,
        "max_tokens": endpoint.max_tokens,
        "messages": messages,
    }
    for _ in range(endpoint.max_retries + 1):
        try:
            response = client.post(f"{endpoint.url}/v1/chat/completions", json=body)
        except httpx.HTTPError:
            continue
        if response.status_code >= 500:
            continue
        if response.status_code != 200:
            return None
        try:
            return str(response.json()["choices"][0]["message"]["content"] or "")
        except (ValueError, KeyError, IndexError, TypeError):
            return None
    return None


class EndpointUser:
    """A simulated user behind an OpenAI-compatible endpoint (implements ``UserSimulator``)."""

    def __init__(self, endpoint: Endpoint, client: httpx.Client | None = None) -> None:
        self.endpoint = endpoint
        self.client = client or httpx.Client(timeout=endpoint.timeout_s)

    def reply(self, requests: Sequence[UserRequest]) -> list[UserReply]:
        """Ask the endpoint once per waiting episode."""
        return [self._one(r) for r in requests]

    def _one(self, request: UserRequest) -> UserReply:
        system = user_system_of(request.task)
        if not system:
            return UserReply(error=f"task {request.task.id} has no simulated-user scenario")
        messages = [
            {"role": m.role, "content": m.content}
            for m in user_messages(system, request.conversation)
        ]
        content = chat(self.endpoint, messages, self.client)
        if content is None:
            return UserReply(error=f"user endpoint {self.endpoint.url} failed")
        return parse_user_text(content)


class NlJudge(ChatNlJudge):
    """The judge over an endpoint: ``environments.base.NlJudge`` (τ²'s NL assertions) and
    ``ChatJudge`` (``complete``: a suite's own judging chat, VitaBench's)."""

    def __init__(self, endpoint: Endpoint, client: httpx.Client | None = None) -> None:
        self.endpoint = endpoint
        self.client = client or httpx.Client(timeout=endpoint.timeout_s)

    def complete(self, messages: list[dict[str, str]]) -> str | None:
        """One greedy chat completion's text, or None after the retries failed."""
        return chat(self.endpoint, messages, self.client)
