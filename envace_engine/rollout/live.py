"""One running episode's mutable state, shared by the rollout loop (``loop._Runner``: act and
world micro-steps) and what happens between turns (``turns.Turns``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from envace_engine.environments.base import Environment, close_env
from envace_engine.rollout.prompts import Message, RehearseContext
from envace_engine.rollout.tokens import TokenSequence
from envace_engine.types import CallRecord, Rehearsal, Role, StopReason, Task, ToolCall, ToolResult


@dataclass
class Live:
    """Mutable state of one running episode (the rollout loop's and its turns' only)."""

    id: str
    group_id: str
    task: Task
    env: Environment | None  # real mode: the env; otherwise the shadow env (or None)
    ctx: RehearseContext
    seq: TokenSequence
    messages: list[Message]  # the agent chat so far, without the pending reply
    history_start: int  # index of the task's first user message (worked examples before it)
    turn: int = 0
    replies: int = 0  # agent replies in the current user turn
    step: int = 0  # agent replies in the episode
    sampled: int = 0  # policy tokens sampled (act + rehearse)
    reply: Message | None = None
    reply_stopped: bool = True
    pending: list[ToolCall] = field(default_factory=list)
    answered: list[tuple[ToolCall, ToolResult]] = field(default_factory=list)
    world_prompt: list[int] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)
    rehearsals: list[Rehearsal] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    drift: int = 0
    noncanonical: int = 0  # sampled replies whose ids are not their text's canonical ids
    empty_retries: int = 0  # empty replies sampled again (a simulated user's conversation)
    empty_streak: int = 0  # of those, for the reply being sampled now
    stop: StopReason | None = None
    detail: str = ""
    # Simulated user (rollout/turns.py): its messages, whether it speaks next, and the tool
    # messages of a turn that hit max_turns, appended together with its next message.
    user_texts: list[str] = field(default_factory=list)
    to_user: bool = False
    deferred: list[Message] = field(default_factory=list)
    deferred_role: Role | None = None

    def end(self, reason: StopReason, detail: str = "") -> None:
        """Stop the episode (only the first reason counts) and release its environment."""
        if self.stop is None:
            self.stop, self.detail = reason, detail
        close_env(self.env)

    @property
    def waiting_act(self) -> bool:
        """Running, with no pending tool call: the next generation is the agent's."""
        return self.stop is None and not self.pending and not self.to_user

    @property
    def waiting_user(self) -> bool:
        """Running, with the simulated user to speak next."""
        return self.stop is None and self.to_user

    @property
    def waiting_world(self) -> bool:
        """Running, with a tool call to rehearse or simulate."""
        return self.stop is None and bool(self.pending)
