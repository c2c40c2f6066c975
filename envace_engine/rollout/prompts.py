"""Prompts for both roles: the act prompt (agent) and the rehearse prompt (world, method.md §2).

Chat format choices (docs/masking.md explains the token side):

* Tools are rendered into the system message as text (SmolLM2's ChatML template ignores
  ``tools=``), and assistant tool calls are rendered as text, one ``<tool_call>`` block per call
  (the template fails on ``tool_calls`` without content).
* Tool results go back as ChatML messages with role ``tool``, one per call, holding the result's
  JSON (``{"error": {"code", "message"}}`` for an error). The act prompt, the rollout's token
  sequences and the SFT data built from ``reference_messages``/``act_samples`` all use this.
* We always send our own system message, so the template never injects its default one. It is
  the same for every task of a world (instructions, tools); the task's own system text (its
  world state) opens the first user message, so prompts in a batch share long prefixes.
* Worked examples (``n_examples``) come from *other* tasks' reference trajectories (preferably
  ones using the same tools) and are rendered as earlier chat turns in the exact reply format:
  the untrained 135M model emits tool calls and ``<execution_result>`` only after seeing itself
  write them (docs/platform.md §2: with examples in the system message as a transcript it
  writes prose, as chat turns it writes valid calls).
* The rehearse prompt is a fresh two-message chat: system (the simulator's rules) and user
  (tools, optional world state, optional reference calls and results, optional history, the
  agent's latest reply, the call to simulate). The switches are recorded by the caller with
  every rehearsal (``Rehearsal.grounded``, ``Rehearsal.stated``). The world state is what the
  environment holds at the start of the task in its own words (``TaskKey.WORLD_STATE``), not
  the agent's instructions: a real tool answers from its state, so a world role that is shown
  it can be right where the agent's prompt says nothing (note texts, a shared catalogue).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from envace_engine.rollout.parsing import parse_tool_calls, result_to_json
from envace_engine.types import Task, TaskKey, ToolCall, ToolResult

ACT_INSTRUCTIONS = """\
You can call tools. To call a tool, write one block per call, each holding a JSON object with \
"name" and "arguments":
<tool_call>
{"name": "TOOL_NAME", "arguments": {"ARG": "VALUE"}}
</tool_call>
Each result comes back in a message with role tool. Use the results. When the request is done, \
reply with a short final answer and no tool call."""

REHEARSE_SYSTEM = """\
You are a precise tool simulator. An assistant called a tool; you answer exactly as the real \
tool would. Check, in order:
1. the call is a JSON object with "name" and "arguments", else error INVALID_TOOL_CALL_FORMAT;
2. the name is one of the candidate tools, else error TOOL_NOT_AVAILABLE;
3. the arguments match the tool's JSON schema (required fields, types, enums), else error \
INVALID_PARAMETERS.
Only if all checks pass, produce the tool's result: consistent with the schema, with earlier \
results in the conversation, and with any reference results given. If the tool itself would \
fail, use error TOOL_EXECUTION_ERROR.
Reply with only a JSON value inside <execution_result></execution_result>. An error is \
{"error": {"code": "CODE", "message": "why"}}."""

DEFAULT_FINAL_ANSWER = "Done."


@dataclass(frozen=True)
class Message:
    """One chat message (``role`` is a ChatML role: system, user, assistant, tool)."""

    role: str
    content: str


@dataclass(frozen=True)
class ChatSample:
    """An SFT example: the chat before the target, and the target text of one role."""

    prompt: tuple[Message, ...]
    target: str
    role: str  # "act" | "rehearse" | "memory"
    group: str = ""  # examples of one group share their prompt's head (a role, a tool set)
    source: str = ""  # the task it was rendered from (SFT packs a task's nested act turns)


def to_chat(messages: Sequence[Message]) -> list[dict[str, str]]:
    """Messages as the dicts ``tokenizer.apply_chat_template`` takes."""
    return [{"role": m.role, "content": m.content} for m in messages]


def render(tokenizer: Any, messages: Sequence[Message], add_generation_prompt: bool) -> str:
    """Render messages to text with the model's own chat template."""
    return tokenizer.apply_chat_template(
        to_chat(messages), tokenize=False, add_generation_prompt=add_generation_prompt
    )


def dumps(value: Any) -> str:
    """Compact, stable JSON for prompts (non-ASCII kept as is)."""
    return json.dumps(value, ensure_ascii=False, sort_keys=False)


def tools_text(tools: Sequence[dict[str, Any]]) -> str:
    """Tool schemas, one JSON object per line inside ``<tools>``."""
    return "<tools>\n" + "\n".join(dumps(t) for t in tools) + "\n</tools>"


def _call_json(call: ToolCall) -> str:
    return dumps({"name": call.name, "arguments": call.arguments})


def call_text(call: ToolCall) -> str:
    """One call as the agent writes it."""
    return f"<tool_call>\n{_call_json(call)}\n</tool_call>"


def assistant_text(calls: Sequence[ToolCall], content: str = "") -> str:
    """An assistant reply holding ``calls`` as text (after optional leading content)."""
    parts = [content.strip()] if content.strip() else []
    return "\n".join(parts + [call_text(c) for c in calls])


def tool_message(result: ToolResult) -> Message:
    """The tool message the agent sees for one result."""
    return Message("tool", dumps(result_to_json(result)))


def reference_answer(task: Task, turn: int) -> str:
    """A reference trajectory's final answer: the suite's expected answer for the turn
    (``meta["answers"][turn]``, as the toy and generated suites store it), else "Done."."""
    answers = task.meta.get("answers") or ()
    answer = str(answers[turn]).strip() if turn < len(answers) else ""
    return answer or DEFAULT_FINAL_ANSWER


def pick_examples(task: Task, pool: Sequence[Task], k: int) -> tuple[Task, ...]:
    """``k`` other tasks with reference calls, in a stable order per tool set (never ``task``).

    Tasks whose reference calls use only this task's tools come first: an example calling
    tools the agent does not have would teach it to call them. Tasks with the same tools get
    the same examples (bar themselves), so their prompts share a prefix.
    """
    if k <= 0:
        return ()
    names = {t.get("function", t).get("name") for t in task.tools}
    world = "|".join(sorted(str(n) for n in names))

    def key(other: Task) -> tuple[bool, int, str]:
        fits = all(c.name in names for calls in other.reference_calls for c in calls)
        # hashed with the tool set, not the task id: tasks of one world share their examples
        return (not fits, zlib.crc32(f"{world}|{other.id}".encode()), other.id)

    others = [t for t in pool if t.id != task.id and any(t.reference_calls)]
    return tuple(sorted(others, key=key)[:k])


def trajectory_messages(task: Task) -> list[Message]:
    """A task's reference trajectory as chat turns: each user turn, one assistant message per
    reference call followed by its tool message, then the final answer."""
    messages: list[Message] = []
    for turn, user in enumerate(task.user_turns):
        messages.append(Message("user", first_user_text(task) if turn == 0 else user))
        calls = task.reference_calls[turn] if turn < len(task.reference_calls) else ()
        results = task.reference_results[turn] if turn < len(task.reference_results) else ()
        for i, call in enumerate(calls):
            messages.append(Message("assistant", assistant_text([call])))
            if i < len(results):
                messages.append(tool_message(ToolResult(value=results[i])))
        messages.append(Message("assistant", reference_answer(task, turn)))
    return messages


def act_system(tools: Sequence[dict[str, Any]], policy: str = "") -> str:
    """The agent's system message: tool instructions, a domain policy if any, then the schemas.

    Nothing task-specific goes here (the task's own system text opens its first user message),
    so every task of a world shares the system message and, with ``pick_examples``, the worked
    examples too: a batch's prompts then share a long token prefix that the sampler prefills
    once and keeps (``samplers.embedded.kv.PrefixCache``). A domain policy (τ²'s, in
    ``Task.meta["policy"]``) is the same for every task of its suite, so it goes here too.
    """
    rules = f"\n\nPolicy:\n{policy.strip()}" if policy.strip() else ""
    return f"{ACT_INSTRUCTIONS}{rules}\n\nAvailable tools:\n{tools_text(tools)}"


def policy_of(task: Task) -> str:
    """The domain policy a task carries for the agent (``TaskKey.POLICY``), or ''."""
    return str(task.meta.get(TaskKey.POLICY) or "")


def first_user_text(task: Task) -> str:
    """The first user message: the task's system text (its world state), then turn 0."""
    system = task.system.strip()
    return f"{system}\n\n{task.user_turns[0]}" if system else task.user_turns[0]


def act_messages(
    task: Task, tools: Sequence[dict[str, Any]], examples: Sequence[Task] = ()
) -> list[Message]:
    """The act prompt's opening messages: system, the worked examples as earlier chat turns
    (a 135M model copies a format it has seen itself write), then the first user turn. The
    task's own conversation starts at the last message."""
    messages = [Message("system", act_system(tools, policy_of(task)))]
    for example in examples:
        messages += trajectory_messages(example)
    return [*messages, Message("user", first_user_text(task))]


def conversation_head(
    task: Task, tools: Sequence[dict[str, Any]], greeting: str, examples: Sequence[Task] = ()
) -> list[Message]:
    """The agent's opening messages when a simulated user talks to it: as ``act_messages``,
    then the task's own context text (memory, world state) as a user message if it has one,
    then the agent's fixed greeting, which the user answers first (τ²'s protocol)."""
    messages = act_messages(task, tools, examples)[:-1]
    if task.system.strip():
        messages.append(Message("user", task.system.strip()))
    return [*messages, Message("assistant", greeting)]


def _history_text(history: Sequence[Message], private: str = "") -> str:
    """The conversation as the world role reads it: without the system message, and without
    the rehearsal-memory block ``private`` (``TaskKey.MEMORY``). The memory is the agent's
    private note: no environment reads it, the world role never meets one in training, and a
    world that did would repeat what an earlier imagined episode made up."""
    lines = []
    for m in history:
        if m.role == "system":
            continue
        content = _without(m.content, private) if private else m.content
        if content or not m.content:  # a message that held only the memory goes
            lines.append(f"{m.role}: {content}")
    return "\n".join(lines)


def _without(text: str, block: str) -> str:
    """``text`` less ``block`` as ``with_memory`` and ``first_user_text`` join them: after the
    task's own context (blank line before it) or opening the text (blank line after it)."""
    if f"\n\n{block}" in text:
        return text.replace(f"\n\n{block}", "", 1)
    if text.startswith(block):
        return text[len(block) :].removeprefix("\n\n")
    return text


def _to_simulate(tools: Sequence[dict[str, Any]], call: ToolCall) -> str:
    schema = _schema_of(tools, call.name)
    return (
        "Tool call to simulate:\n"
        f"name: {call.name}\n"
        f"schema: {dumps(schema) if schema is not None else 'none (not a candidate tool)'}\n"
        f"arguments: {dumps(call.arguments)}"
    )


def _rehearse_examples(tools: Sequence[dict[str, Any]], examples: Sequence[Task]) -> list[Message]:
    """Worked examples as earlier (call, result) chat turns, one per reference call."""
    messages: list[Message] = []
    for example in examples:
        for calls, results in zip(example.reference_calls, example.reference_results, strict=False):
            for call, result in zip(calls, results, strict=False):
                messages.append(Message("user", _to_simulate(tools, call)))
                messages.append(Message("assistant", rehearse_target(result)))
    return messages


def _schema_of(tools: Sequence[dict[str, Any]], name: str) -> dict[str, Any] | None:
    for tool in tools:
        fn = tool.get("function", tool)
        if fn.get("name") == name:
            return fn
    return None


@dataclass(frozen=True)
class RehearseContext:
    """What the world role sees besides the call: tools, task, history and switches."""

    tools: tuple[dict[str, Any], ...]
    task: Task
    grounded: bool = True
    with_history: bool = True
    examples: tuple[Task, ...] = ()
    stated: bool = False  # the task's world state (``TaskKey.WORLD_STATE``) in the prompt

    @property
    def states_world(self) -> bool:
        """Whether the prompt holds a world-state block (the switch, and a state to show)."""
        return self.stated and bool(str(self.task.meta.get(TaskKey.WORLD_STATE, "")).strip())


def rehearse_messages(
    ctx: RehearseContext,
    history: Sequence[Message],
    latest_reply: str,
    call: ToolCall,
    earlier: Sequence[tuple[ToolCall, ToolResult]] = (),
) -> list[Message]:
    """The rehearse prompt (docs/method.md §2) for one call of the agent's latest reply.

    Without examples it is EnvACE's fresh two-message chat (system, user). Worked examples go
    between them as short (call, ``<execution_result>``) turns: the untrained 135M model never
    writes the result tag without having seen itself write it.

    ``history`` is the agent conversation before the latest reply, shown without a rehearsal
    memory the task carries (``_history_text``); ``earlier`` are the calls
    of the same reply already answered (results of one reply are appended after the last call,
    so the world must see them here to stay consistent).
    """
    parts = ["Candidate tools:\n" + tools_text(ctx.tools)]
    if ctx.states_world:
        state = str(ctx.task.meta[TaskKey.WORLD_STATE]).strip()
        parts.append("Environment state at the start of the task:\n" + state)
    if ctx.grounded and any(ctx.task.reference_calls):
        refs = [
            f"call: {_call_json(c)}\nresult: {dumps(r)}"
            for calls, results in zip(
                ctx.task.reference_calls, ctx.task.reference_results, strict=False
            )
            for c, r in zip(calls, results, strict=False)
        ]
        parts.append("Reference calls and results for this task:\n" + "\n".join(refs))
    if ctx.with_history and history:
        private = str(ctx.task.meta.get(TaskKey.MEMORY, ""))
        parts.append("Conversation so far:\n" + _history_text(history, private))
    parts.append("Latest assistant reply:\n" + latest_reply.strip())
    for prev, result in earlier:
        parts.append(
            f"Already answered in this reply: {_call_json(prev)} -> {dumps(result_to_json(result))}"
        )
    parts.append(_to_simulate(ctx.tools, call))
    examples = _rehearse_examples(ctx.tools, ctx.examples)
    return [Message("system", REHEARSE_SYSTEM), *examples, Message("user", "\n\n".join(parts))]


def rehearse_target(result: Any) -> str:
    """The world role's target text for a result JSON value."""
    return f"<execution_result>{dumps(result)}</execution_result>"


def reference_messages(
    task: Task, tools: Sequence[dict[str, Any]], examples: Sequence[Task] = ()
) -> list[Message]:
    """A task's reference trajectory as the chat the agent would see (SFT data)."""
    return act_messages(task, tools, examples)[:-1] + trajectory_messages(task)


def act_samples(
    task: Task, tools: Sequence[dict[str, Any]], examples: Sequence[Task] = ()
) -> list[ChatSample]:
    """One SFT sample per assistant message of the reference trajectory (step-as-sample)."""
    messages = reference_messages(task, tools, examples)
    return [
        ChatSample(prompt=tuple(messages[:i]), target=m.content, role="act")
        for i, m in enumerate(messages)
        if m.role == "assistant"
    ]


@dataclass(frozen=True)
class ReferenceCall:
    """One call of a task's reference trajectory, where the world role meets it."""

    history: tuple[Message, ...]  # the agent conversation before the reply
    reply: str  # the assistant reply holding the call
    call: ToolCall
    result: Any  # the reference result (JSON)


def reference_calls(ctx: RehearseContext) -> list[ReferenceCall]:
    """Every reference call that has a result, in trajectory order."""
    messages = reference_messages(ctx.task, ctx.tools)
    found: list[ReferenceCall] = []
    for i, message in enumerate(messages[:-1]):
        if message.role != "assistant" or messages[i + 1].role != "tool":
            continue
        calls = parse_tool_calls(message.content).calls
        if calls:
            result = json.loads(messages[i + 1].content)
            found.append(ReferenceCall(tuple(messages[1:i]), message.content, calls[0], result))
    return found


def rehearse_samples(ctx: RehearseContext) -> list[ChatSample]:
    """One SFT sample per reference call: the rehearse prompt and its reference result."""
    return [
        ChatSample(
            prompt=tuple(rehearse_messages(ctx, ref.history, ref.reply, ref.call)),
            target=rehearse_target(ref.result),
            role="rehearse",
        )
        for ref in reference_calls(ctx)
    ]
