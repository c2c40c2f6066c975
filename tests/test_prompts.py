"""Prompt rendering: act and rehearse prompts, worked examples, SFT samples."""

from __future__ import annotations

import dataclasses

from envace_engine.rollout.memory_prompts import MEMORY_HEADER, with_memory
from envace_engine.rollout.parsing import parse_rehearsal, parse_tool_calls
from envace_engine.rollout.prompts import (
    Message,
    RehearseContext,
    act_messages,
    act_samples,
    assistant_text,
    conversation_head,
    pick_examples,
    reference_messages,
    rehearse_messages,
    rehearse_samples,
    render,
)
from envace_engine.types import ToolCall, ToolResult
from tests.kv_world import TOOLS, KVSuite, kv_task

TASKS = KVSuite().tasks()


def test_act_prompt_has_tools_examples_and_the_first_turn(tokenizer):
    task = TASKS[0]
    examples = pick_examples(task, TASKS, 2)
    messages = act_messages(task, TOOLS, examples)
    assert messages[0].role == "system"
    assert '"name": "set"' in messages[0].content and "<tool_call>" in messages[0].content
    assert messages[-1] == Message("user", "Set a to 1.")
    users = [m.content for m in messages if m.role == "user"]
    assert len(users) == 2 * 2 + 1  # two two-turn examples, then the task
    text = render(tokenizer, messages, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou can call tools")
    assert "SmolLM" not in text  # our system message replaces the template's default one
    assert text.endswith("<|im_start|>user\nSet a to 1.<|im_end|>\n<|im_start|>assistant\n")


def test_pick_examples_never_picks_the_task_and_prefers_its_tools():
    task = TASKS[0]
    # a task whose reference calls use a tool the agent lacks: last, whatever the hash order
    base = kv_task("z", 9)
    stranger = type(base)(
        **{**base.__dict__, "id": "other", "reference_calls": ((ToolCall("rm", {}),),)}
    )
    for task in TASKS:
        picked = pick_examples(task, [stranger, *TASKS], 3)
        assert task not in picked and len(picked) == 3
        assert picked[-1].id == "other"
    assert pick_examples(task, TASKS, 2) == pick_examples(task, TASKS, 2)
    assert pick_examples(task, TASKS, 0) == ()


def test_assistant_text_round_trips_through_the_parser():
    calls = [ToolCall("set", {"key": "ü", "value": 1}), ToolCall("get", {"key": "a"})]
    parsed = parse_tool_calls(assistant_text(calls, "Doing it."))
    assert [(c.name, c.arguments) for c in parsed.calls] == [(c.name, c.arguments) for c in calls]
    assert parsed.content == "Doing it."


def test_rehearse_prompt_sections_and_switches():
    task = TASKS[0]
    history = [Message("user", "Set a to 1.")]
    call = ToolCall("set", {"key": "a", "value": 1})
    full = RehearseContext(tools=TOOLS, task=task)
    messages = rehearse_messages(full, history, "<tool_call>...</tool_call>", call)
    assert [m.role for m in messages] == ["system", "user"]  # EnvACE's fresh two-message chat
    assert "precise tool simulator" in messages[0].content
    user = messages[1].content
    for section in ("Candidate tools", "Reference calls and results", "Conversation so far"):
        assert section in user
    assert "name: set" in user and '"required": ["key", "value"]' in user
    bare = RehearseContext(tools=TOOLS, task=task, grounded=False, with_history=False)
    user = rehearse_messages(bare, history, "r", call)[1].content
    assert "Reference calls" not in user and "Conversation so far" not in user
    unknown = rehearse_messages(bare, history, "r", ToolCall("rm", {}))[1].content
    assert "none (not a candidate tool)" in unknown
    earlier = [(call, ToolResult(value={"ok": True}))]
    second = rehearse_messages(bare, history, "r", ToolCall("get", {"key": "a"}), earlier)
    assert 'Already answered in this reply: {"name": "set"' in second[1].content
    with_examples = RehearseContext(tools=TOOLS, task=task, examples=(TASKS[1],))
    roles = [m.role for m in rehearse_messages(with_examples, history, "r", call)]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]


def test_the_world_role_never_reads_the_rehearsal_memory():
    """A task with a memory gives the agent's history a memory block; the world role's prompt
    is the one the same conversation gives without it, with or without the task's own context
    text, and in the simulated-user opening (the context as a message of its own)."""
    call = ToolCall("set", {"key": "a", "value": 1})
    note = "Plan: set a, then answer 1."
    for context in ("The store holds a=0.", ""):
        plain = dataclasses.replace(TASKS[0], system=context)
        remembered = with_memory(plain, note)
        openings = [(act_messages(t, TOOLS)[1:], t) for t in (plain, remembered)] + [
            (conversation_head(t, TOOLS, "Hi!")[1:], t) for t in (plain, remembered)
        ]
        prompts = []
        for history, task in openings:
            assert (note in "".join(m.content for m in history)) == (task is remembered)
            ctx = RehearseContext(tools=TOOLS, task=task, grounded=False)
            prompts.append(rehearse_messages(ctx, history, "r", call))
        assert prompts[0] == prompts[1] and prompts[2] == prompts[3]
        assert note not in prompts[1][1].content and note not in prompts[3][1].content
        assert MEMORY_HEADER not in prompts[1][1].content


def test_reference_trajectory_and_sft_samples():
    task = TASKS[1]
    messages = reference_messages(task, TOOLS)
    assert [m.role for m in messages] == [
        "system", "user", "assistant", "tool", "assistant", "user", "assistant", "tool",
        "assistant",
    ]  # fmt: skip
    assert messages[-1].content == "2"  # the expected answer of the last turn
    acts = act_samples(task, TOOLS)
    assert len(acts) == 4 and all(s.role == "act" for s in acts)
    first = parse_tool_calls(acts[0].target).calls
    assert [(c.name, c.arguments) for c in first] == [("set", {"key": "b", "value": 2})]
    assert acts[1].target == "Done."  # the first turn has no expected answer
    assert acts[1].prompt[-1] == Message("tool", '{"ok": true}')
    rehearse = rehearse_samples(RehearseContext(tools=TOOLS, task=task, grounded=False))
    results = [parse_rehearsal(s.target).result.value for s in rehearse]
    assert results == [{"ok": True}, {"value": 2}]
    assert "Conversation so far:\nuser: Set b to 2." in rehearse[0].prompt[-1].content
