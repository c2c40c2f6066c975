"""Judges: the model that scores what rules cannot (τ²'s NL assertions, every VitaBench score).

A judge is a ``ChatNlJudge``: ``complete(messages)`` holds one greedy chat and returns the
reply's text, or None when it failed; τ²'s assertion verdicts (``__call__``) are built on it,
and a suite with its own judging protocol (VitaBench's rubric windows) calls ``complete``
directly (``environments.base.ChatJudge``). Two kinds:

* ``rollout.endpoints.NlJudge`` — an OpenAI-compatible endpoint (SGLang, vLLM, any server);
* ``SamplerJudge`` — any ``Sampler`` (the embedded model) with its own tokenizer. A prompt
  that does not fit the context is a failed call (the episode stays unscored): a judge that
  read half the conversation would score what it did not see.

A failed call is never a verdict: the episode is unscorable (reward None), never 0.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from envace_engine.rollout.prompts import Message
from envace_engine.rollout.tokens import ChatTokenizer
from envace_engine.samplers.base import Sampler, SamplingParams
from envace_engine.seeds import derive_seed

NL_SYSTEM = (
    "You judge a customer-service conversation against a list of expected outcomes. For each "
    "outcome, decide whether the conversation meets it. Reply with JSON only: "
    '{"results": [{"expectedOutcome": "...", "reasoning": "...", "metExpectation": true}, ...]}'
    " with one entry per outcome, in order."
)


def parse_nl_verdict(text: str, n: int) -> list[bool] | None:
    """Per-assertion verdicts from the judge's JSON, or None if it does not parse or count."""
    match = re.search(r"\{.*\}", text, flags=re.DOTALL)
    if match is None:
        return None
    try:
        results = json.loads(match.group(0)).get("results")
    except (json.JSONDecodeError, AttributeError):
        return None
    if not isinstance(results, list) or len(results) != n:
        return None
    met = [r.get("metExpectation") if isinstance(r, dict) else None for r in results]
    return met if all(isinstance(m, bool) for m in met) else None  # type: ignore[return-value]


class ChatNlJudge:
    """τ²'s NL-assertion verdicts over ``complete`` (which subclasses provide)."""

    def complete(self, messages: list[dict[str, str]]) -> str | None:
        """One greedy chat completion's text, or None when it failed."""
        raise NotImplementedError

    def __call__(self, conversation: str, assertions: Sequence[str]) -> list[bool] | None:
        """Whether each assertion holds for the conversation (None: no usable verdict)."""
        listed = "\n".join(f"{i + 1}. {a}" for i, a in enumerate(assertions))
        messages = [
            {"role": "system", "content": NL_SYSTEM},
            {
                "role": "user",
                "content": f"Conversation:\n{conversation}\n\nExpected outcomes:\n{listed}",
            },
        ]
        content = self.complete(messages)
        return None if content is None else parse_nl_verdict(content, len(assertions))


@dataclass
class SamplerJudge(ChatNlJudge):
    """A judge played by a ``Sampler`` and its tokenizer, greedily (as τ² and VitaBench ask).

    The judge is never trained, so its prompts are rendered fresh for every call. ``failures``
    counts the calls that returned None (with ``last_error``), for the run's log."""

    sampler: Sampler
    tokenizer: Any
    max_new_tokens: int = 1024
    context_limit: int = 8192
    seed: int = 0
    failures: int = field(default=0, init=False)
    last_error: str = field(default="", init=False)

    def __post_init__(self) -> None:
        self.chat = ChatTokenizer(self.tokenizer)
        self.calls = 0

    def complete(self, messages: list[dict[str, str]]) -> str | None:
        """The judge model's reply, or None (too long a prompt, or a failed generation)."""
        ids = self.chat.prompt_ids([Message(m["role"], m["content"]) for m in messages])
        if len(ids) + self.max_new_tokens > self.context_limit:
            self._failed(f"judge prompt of {len(ids)} tokens exceeds the context")
            return None
        params = SamplingParams(
            max_new_tokens=self.max_new_tokens,
            temperature=0.0,
            stop_token_ids=(self.chat.eos_id,),
            seed=derive_seed(self.seed, "judge", self.calls),
        )
        self.calls += 1
        (gen,) = self.sampler.generate([ids], params)
        if gen.finish_reason in ("abort", "error"):
            self._failed(f"judge sampler: {gen.error or gen.finish_reason}")
            return None
        out = list(gen.token_ids)
        if out and out[-1] == self.chat.eos_id:
            out = out[:-1]
        return str(self.tokenizer.decode(out, skip_special_tokens=True))

    def _failed(self, reason: str) -> None:
        self.failures += 1
        self.last_error = reason
        return None
