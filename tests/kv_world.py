"""A tiny key-value world and a scripted sampler, for rollout tests.

``KVSuite``/``KVEnv`` implement the ``Suite``/``Environment`` protocols for real (tools run and
change state). ``ScriptedSampler`` implements the ``Sampler`` protocol: it decodes each prompt,
asks a script function for the reply text, and returns that text's token ids plus the end
token, with log-probs — the same contract a real sampler keeps.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from envace_engine.samplers.base import Generation, SamplingParams
from envace_engine.types import Task, ToolCall, ToolError, ToolResult

TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "set",
            "description": "Store an integer under a key.",
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string"}, "value": {"type": "integer"}},
                "required": ["key", "value"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get",
            "description": "Read the integer stored under a key.",
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string"}},
                "required": ["key"],
            },
        },
    },
)


def kv_task(key: str, value: int) -> Task:
    """Two user turns: store ``value`` under ``key``, then read it back."""
    return Task(
        id=f"kv-{key}",
        suite="kv",
        user_turns=(f"Set {key} to {value}.", f"What is {key}?"),
        tools=TOOLS,
        initial_state={},
        reference_calls=(
            (ToolCall("set", {"key": key, "value": value}),),
            (ToolCall("get", {"key": key}),),
        ),
        reference_results=(({"ok": True},), ({"value": value},)),
        meta={"answers": ("", str(value))},
    )


class KVEnv:
    """A live key-value store (implements ``Environment``)."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.store: dict[str, int] = dict(task.initial_state)

    def tools(self) -> list[dict[str, Any]]:
        return list(TOOLS)

    def execute(self, call: ToolCall) -> ToolResult:
        key = call.arguments.get("key")
        if call.name not in ("set", "get"):
            return ToolResult(error=ToolError("TOOL_NOT_AVAILABLE", f"no tool {call.name}"))
        if not isinstance(key, str):
            return ToolResult(error=ToolError("INVALID_PARAMETERS", "key must be a string"))
        if call.name == "get":
            if key not in self.store:
                return ToolResult(error=ToolError("TOOL_EXECUTION_ERROR", f"no key {key}"))
            return ToolResult(value={"value": self.store[key]})
        value = call.arguments.get("value")
        if not isinstance(value, int):
            return ToolResult(error=ToolError("INVALID_PARAMETERS", "value must be an integer"))
        self.store[key] = value
        return ToolResult(value={"ok": True})

    def state(self) -> dict[str, Any]:
        return dict(self.store)

    def start_turn(self, turn: int) -> None:
        """The KV world's tools never change between turns."""


class KVSuite:
    """Tasks ``kv-a``, ``kv-b``, ``kv-c`` (implements ``Suite``)."""

    name = "kv"

    def tasks(self, split: str = "train") -> list[Task]:
        return [kv_task("a", 1), kv_task("b", 2), kv_task("c", 3)]

    def make_env(self, task: Task) -> KVEnv:
        return KVEnv(task)

    def score(self, task: Task, calls_per_turn: list[list[ToolCall]], answers: list[str]) -> float:
        """Half for the final state, half for answering the value in the last turn."""
        env, truth = KVEnv(task), KVEnv(task)
        for calls in calls_per_turn:
            for call in calls:
                env.execute(call)
        for calls in task.reference_calls:
            for call in calls:
                truth.execute(call)
        value = str(truth.store[task.reference_calls[0][0].arguments["key"]])
        return 0.5 * (env.store == truth.store) + 0.5 * (value in answers[-1])


@dataclass(frozen=True)
class Scripted:
    """A scripted reply: its text, and how the generation ends (``stop`` adds the end token)."""

    text: str
    finish: str = "stop"


@dataclass
class ScriptedSampler:
    """Replies chosen by ``script(prompt_text)``; records every batch it was sent."""

    tokenizer: Any
    script: Callable[[str], str | Scripted]
    batches: list[list[list[int]]] = field(default_factory=list)
    params: list[SamplingParams] = field(default_factory=list)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        self.batches.append([list(p) for p in prompts])
        self.params.append(params)
        return [self._one(p) for p in prompts]

    def _one(self, prompt: list[int]) -> Generation:
        text = self.tokenizer.decode(prompt, skip_special_tokens=False)
        reply = self.script(text)
        reply = reply if isinstance(reply, Scripted) else Scripted(reply)
        if reply.finish in ("error", "abort"):
            return Generation((), (), reply.finish, error=reply.text)
        ids = list(self.tokenizer(reply.text, add_special_tokens=False)["input_ids"])
        if reply.finish == "stop":
            ids.append(self.tokenizer.eos_token_id)
        logprobs = tuple(-0.01 * (i + 1) for i in range(len(ids)))
        return Generation(tuple(ids), logprobs, reply.finish, text=reply.text)


def last_message(prompt_text: str) -> tuple[str, str]:
    """The (role, content) of the last complete ChatML message in a prompt."""
    blocks = [b for b in prompt_text.split("<|im_start|>") if b.endswith("<|im_end|>\n")]
    role, _, content = blocks[-1].removesuffix("<|im_end|>\n").partition("\n")
    return role, content


def is_rehearse_prompt(prompt_text: str) -> bool:
    """World-role prompts open with the simulator's system message."""
    return "You are a precise tool simulator" in prompt_text.split("<|im_end|>")[0]


def call_text(name: str, **args: Any) -> str:
    """One tool call in the act reply format."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def good_agent(prompt: str) -> str:
    """Calls the right tool for the current user turn, then answers from the tool result."""
    role, content = last_message(prompt)
    if role == "tool":
        value = re.search(r'"value": (\d+)', content)
        return f"It is {value.group(1)}." if value else "Stored."
    key = re.search(r"(Set|What is) (\w)", content)
    assert key is not None, content
    if key.group(1) == "Set":
        value = re.search(r"to (\d+)", content).group(1)
        return call_text("set", key=key.group(2), value=int(value))
    return call_text("get", key=key.group(2))


def both(agent: Callable[[str], Any], world_fn: Callable[[str], Any]) -> Callable[[str], Any]:
    """One script for both roles (the same policy plays them)."""
    return lambda prompt: world_fn(prompt) if is_rehearse_prompt(prompt) else agent(prompt)
