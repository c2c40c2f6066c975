"""What happens between the agent's turns: the next user message, replayed or simulated.

A collaborator of the rollout loop's runner (``loop._Runner``), kept apart so that the loop
reads as act / world micro-steps and this file as the conversation protocol around them:

* **replayed turns** (toy, BFCL): the task's next user turn; on a suite with ``TurnTools``
  (BFCL ``miss_func``) the schemas of tools offered from this turn on lead its text, as BFCL's
  prompting format does ("{functions}\\nI have updated some more functions...") — only that
  suffix is tokenised, so the earlier prompt and the sampled ids are untouched;
* **a simulated user** (``RolloutConfig.user``; τ², VitaBench): the conversation opens with the
  agent's greeting (the task's own, or τ²'s) and the user speaks first; the agent's
  ``###STOP###`` in a final answer ends the episode (``done``); after each other final answer
  of the agent, and after ``max_turns`` replies without one (the turn ends, not the episode),
  the user writes the next message (``Role.SIMULATED_USER``). Its stop tokens end the episode
  (``user_stop``), a broken reply ends it with ``user_error``; ``max_steps`` messages
  (``max_steps``) and ``max_tool_errors`` error results (``too_many_errors``) end a
  conversation that never stops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

from envace_engine.environments.base import Environment, Suite, TurnTools
from envace_engine.rollout.live import Live
from envace_engine.rollout.prompts import (
    Message,
    act_messages,
    conversation_head,
    render,
    tools_text,
)
from envace_engine.rollout.tokens import ChatTokenizer
from envace_engine.rollout.user import UserReply, UserRequest, UserSimulator, greeting_of
from envace_engine.types import CallRecord, Role, StopReason, Task


class TurnSettings(Protocol):
    """What the turn protocol reads of ``loop.RolloutConfig``."""

    @property
    def user(self) -> UserSimulator | None:
        """The simulated user, or None for replayed turns."""
        ...

    @property
    def max_turns(self) -> int:
        """Agent replies per user turn."""
        ...

    @property
    def max_steps(self) -> int:
        """Messages per simulated-user conversation."""
        ...

    @property
    def max_tool_errors(self) -> int:
        """Error results per simulated-user conversation."""
        ...

    @property
    def check_drift(self) -> bool:
        """Compare every next prompt with a full re-render."""
        ...


def _name(tool: dict[str, Any]) -> str:
    return str(tool.get("function", tool).get("name"))


def _shown_error(record: CallRecord) -> bool:
    result = record.seen()
    return result is not None and not result.ok


class Turns:
    """Turn-to-turn behaviour of ``loop._Runner`` (see the module docstring).
    ``check_act_limits`` is the runner's: after a user message the agent's next prompt may
    already be past its limits."""

    def __init__(
        self,
        config: TurnSettings,
        chat: ChatTokenizer,
        suite: Suite,
        check_act_limits: Callable[[Live], None],
    ) -> None:
        self.config, self.chat, self.suite = config, chat, suite
        self._check_act_limits = check_act_limits

    def first_tools(self, task: Task, env: Environment | None) -> tuple[dict[str, Any], ...]:
        """The tools offered in the first user turn."""
        if isinstance(self.suite, TurnTools):
            return tuple(self.suite.tools_at(task, 0))
        return tuple(task.tools or (env.tools() if env is not None else ()))

    def opening(
        self, task: Task, tools: Sequence[dict[str, Any]], examples: Sequence[Task]
    ) -> tuple[list[Message], list[int]]:
        """The agent's opening messages and their prompt ids. With a simulated user the prompt
        ends after the greeting (no generation prompt): the user's first message comes next."""
        if self.config.user is None:
            messages = act_messages(task, tools, examples)
            return messages, self.chat.prompt_ids(messages)
        messages = conversation_head(task, tools, greeting_of(task), examples)
        text = render(self.chat.tokenizer, messages, add_generation_prompt=False)
        return messages, self.chat.encode(text)

    def turn_text(self, live: Live) -> str:
        """The replayed user turn now due, led by the schemas of tools it newly offers."""
        text = live.task.user_turns[live.turn]
        if not isinstance(self.suite, TurnTools):
            return text
        offered = {_name(t) for t in live.ctx.tools}
        now = self.suite.tools_at(live.task, live.turn)
        new = [t for t in now if _name(t) not in offered]
        if not new:
            return text
        live.ctx = replace(live.ctx, tools=tuple(now))  # the world role may simulate them now
        return f"{tools_text(new)}\n{text}"

    def defer_to_user(self, live: Live, results: list[Message], role: Role) -> bool:
        """With a simulated user, ``max_turns`` replies end the *turn*: the tool messages wait
        to be appended with the user's next message. True when deferred."""
        if self.config.user is None or live.replies < self.config.max_turns:
            return False
        live.deferred, live.deferred_role = results, role
        live.answers.append("")  # the turn ended without a final answer
        live.to_user = True
        return True

    def conversation_over(self, live: Live) -> bool:
        """End a simulated-user conversation at its message or error cap; True if ended."""
        cfg = self.config
        if cfg.user is None:
            return False
        steps = live.step + len(live.calls) + len(live.user_texts)
        if steps >= cfg.max_steps:
            live.end(StopReason.MAX_STEPS, f"{steps} messages")
            return True
        errors = sum(_shown_error(c) for c in live.calls)
        if errors >= cfg.max_tool_errors:
            live.end(StopReason.TOO_MANY_ERRORS, f"{errors} tool errors")
            return True
        return False

    def _user_view(self, live: Live) -> tuple[Message, ...]:
        """The conversation as the user sees it (agent texts only, no tool traffic)."""
        view = [Message("assistant", greeting_of(live.task))]
        for i, text in enumerate(live.user_texts):
            view.append(Message("user", text))
            if i < len(live.answers):
                view.append(Message("assistant", live.answers[i]))
        return tuple(view)

    def ask_users(self, lives: list[Live]) -> None:
        """One user-simulator call for every episode waiting for its user."""
        user = self.config.user
        assert user is not None  # only episodes of a simulated-user rollout wait for one
        requests = [UserRequest(live.task, live.id, self._user_view(live)) for live in lives]
        try:
            replies = list(user.reply(requests))
        except Exception as err:  # a broken simulator ends its episodes; it never crashes a batch
            replies = [UserReply(error=f"user simulator: {type(err).__name__}: {err}")] * len(lives)
        if len(replies) != len(lives):
            replies = [UserReply(error=f"user simulator gave {len(replies)} replies")] * len(lives)
        for live, reply in zip(lives, replies, strict=True):
            self._on_user(live, reply)

    def _on_user(self, live: Live, reply: UserReply) -> None:
        """Append the user's message (and any deferred tool messages); a stop token ends it."""
        live.to_user = False
        if reply.error:
            live.end(StopReason.USER_ERROR, reply.error)
            return
        if live.user_texts:  # not the opening message: a new user turn starts
            live.turn += 1
            live.replies = 0
            if live.env is not None:
                live.env.start_turn(live.turn)
        live.user_texts.append(reply.text)
        if reply.stop is not None:
            live.end(StopReason.USER_STOP, reply.stop)
        groups: list[list[Message]] = [[Message("user", reply.text)]]
        roles = [Role.SIMULATED_USER]
        if live.deferred:
            groups.insert(0, live.deferred)
            roles.insert(0, live.deferred_role or Role.REAL)
        pieces = self.chat.pieces(live.messages, live.reply, live.reply_stopped, groups)
        for piece, role in zip(pieces, roles, strict=True):
            live.seq.append(role, self.chat.encode(piece), piece)
        head = [live.reply] if live.reply is not None else []
        live.messages += head + [m for group in groups for m in group]
        live.reply, live.deferred, live.deferred_role = None, [], None
        if self.config.check_drift and self.chat.drifted(live.seq.segments, live.messages):
            live.drift += 1
        self._check_act_limits(live)
