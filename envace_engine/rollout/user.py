"""Simulated users: who answers the agent's messages when a task has no replayed user turns.

τ²-bench (docs/tasks.md, "τ²-bench") needs a user that talks back. The episode loop asks a
``UserSimulator`` for the next user message of every episode waiting for one, as one batch:

* the conversation opens with the agent's fixed greeting (``greeting_of``: the task's own, or
  τ²'s ``GREETING``), which the user answers;
* the user sees the conversation with roles flipped (the agent's texts as ``user``, its own turns
  as ``assistant``) and never the agent's tool calls or results;
* ``###STOP###``, ``###TRANSFER###`` or ``###OUT-OF-SCOPE###`` in its message ends the episode
  (``user_stop``); the agent's ``AGENT_STOP`` in a final answer ends it too (``done``); an
  empty message, a tool call or a failed generation is a protocol error
  (``user_error``). The user is never trained.

``SamplerUser`` plays the user with any ``Sampler`` (the embedded model, SGLang) and its own
tokenizer; ``EndpointUser`` (``rollout/user_endpoint.py``) with an OpenAI-compatible chat
endpoint; ``ScriptedUser`` replays canned messages, for tests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from envace_engine.rollout.prompts import Message
from envace_engine.rollout.tokens import ChatTokenizer
from envace_engine.samplers.base import Sampler, SamplingParams
from envace_engine.seeds import derive_seed
from envace_engine.types import Task, TaskKey

GREETING = "Hi! How can I help you today?"
STOP_TOKENS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")
# The agent ends a simulated-user conversation by writing this in a final answer (τ², VitaBench).
AGENT_STOP = "###STOP###"


@dataclass(frozen=True)
class UserRequest:
    """One episode waiting for its user: the task and the conversation so far, from the
    agent's side (``assistant`` = the agent's messages, ``user`` = the user's own)."""

    task: Task
    episode_id: str
    conversation: tuple[Message, ...]


@dataclass(frozen=True)
class UserReply:
    """The user's next message; ``stop`` is the stop token it holds, ``error`` a protocol
    failure (then the episode ends with ``user_error``)."""

    text: str = ""
    stop: str | None = None
    error: str = ""


@runtime_checkable
class UserSimulator(Protocol):
    """Writes the next user message of a batch of episodes."""

    def reply(self, requests: Sequence[UserRequest]) -> list[UserReply]:
        """One reply per request, in order. Failures are returned as ``UserReply.error``."""
        ...


def parse_user_text(text: str) -> UserReply:
    """A user message as a reply: its stop token, or a protocol error."""
    clean = text.strip()
    if not clean:
        return UserReply(error="the user wrote an empty message")
    if "<tool_call>" in clean or "<function_call>" in clean:
        return UserReply(clean, error="the user wrote a tool call (simulated users have no tools)")
    stop = next((t for t in STOP_TOKENS if t in clean), None)
    return UserReply(clean, stop)


def user_messages(system: str, conversation: Sequence[Message]) -> list[Message]:
    """The user model's chat: its system prompt, then the conversation with roles flipped."""
    flip = {"assistant": "user", "user": "assistant"}
    return [Message("system", system), *(Message(flip[m.role], m.content) for m in conversation)]


def greeting_of(task: Task) -> str:
    """The agent's fixed first message: the task's own (``TaskKey.GREETING``) or τ²'s."""
    return str(task.meta.get(TaskKey.GREETING) or GREETING)


def user_system_of(task: Task) -> str:
    """The simulated user's system prompt stored with the task (τ² suites), or ''."""
    return str(task.meta.get(TaskKey.USER_SYSTEM) or "")


class ScriptedUser:
    """Canned user messages (implements ``UserSimulator``), for tests and scripted runs.

    ``script(request)`` returns the next message text; the default is a per-task list of
    messages (``turns[task.id]``) replayed in order, then ``###STOP###``.
    """

    def __init__(
        self,
        turns: Mapping[str, Sequence[str]] | None = None,
        script: Callable[[UserRequest], str] | None = None,
    ) -> None:
        self.turns = {k: list(v) for k, v in (turns or {}).items()}
        self.script = script
        self.requests: list[UserRequest] = []

    def reply(self, requests: Sequence[UserRequest]) -> list[UserReply]:
        """Each request's next scripted message."""
        self.requests += requests
        return [parse_user_text(self._text(r)) for r in requests]

    def _text(self, request: UserRequest) -> str:
        if self.script is not None:
            return self.script(request)
        said = sum(m.role == "user" for m in request.conversation)
        turns = self.turns.get(request.task.id, [])
        return turns[said] if said < len(turns) else STOP_TOKENS[0]


@dataclass
class SamplerUser:
    """A user played by a ``Sampler`` with its own tokenizer (implements ``UserSimulator``).

    Prompts are rendered fresh every turn (the user is never trained, so its text may be
    re-tokenised); all waiting episodes go to the sampler as one batch. τ² samples its user
    at temperature 0.
    """

    sampler: Sampler
    tokenizer: Any
    max_new_tokens: int = 128
    temperature: float = 0.0
    context_limit: int = 8192
    seed: int = 0

    def __post_init__(self) -> None:
        self.chat = ChatTokenizer(self.tokenizer)
        self.calls = 0

    def reply(self, requests: Sequence[UserRequest]) -> list[UserReply]:
        """Generate every waiting user's next message in one sampler call."""
        out: list[UserReply | None] = [None] * len(requests)
        prompts, where = [], []
        for i, request in enumerate(requests):
            system = user_system_of(request.task)
            if not system:
                out[i] = UserReply(error=f"task {request.task.id} has no simulated-user scenario")
                continue
            ids = self.chat.prompt_ids(user_messages(system, request.conversation))
            if len(ids) + self.max_new_tokens > self.context_limit:
                out[i] = UserReply(error=f"user prompt of {len(ids)} tokens exceeds the context")
                continue
            prompts.append(ids)
            where.append(i)
        if prompts:
            for i, gen in zip(where, self._generate(prompts), strict=True):
                if gen.finish_reason in ("abort", "error"):
                    out[i] = UserReply(error=f"user sampler: {gen.error or gen.finish_reason}")
                    continue
                ids = list(gen.token_ids)
                if ids and ids[-1] == self.chat.eos_id:
                    ids = ids[:-1]
                # Special tokens dropped: user text must never inject chat-template markup.
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                out[i] = parse_user_text(text)
        return [r if r is not None else UserReply(error="no reply") for r in out]

    def _generate(self, prompts: list[list[int]]) -> list[Any]:
        params = SamplingParams(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            stop_token_ids=(self.chat.eos_id,),
            seed=derive_seed(self.seed, "user", self.calls),
        )
        self.calls += 1
        gens = self.sampler.generate(prompts, params)
        if len(gens) != len(prompts):
            raise RuntimeError(f"user sampler returned {len(gens)} generations for {len(prompts)}")
        return gens
