"""Memory-conditioned SFT examples: the formats test-time rehearsal puts in front of the policy.

At test time (docs/method.md §5) the policy writes a rehearsal memory from imagined attempts,
then acts with that memory in its context. A policy fine-tuned only on memory-free prompts has
met neither: it writes rambling memories, and with a memory in context it tends to answer from
the memory without calling the tools. So for a seeded share of the SFT tasks
(``SFTConfig.memory_fraction``) we add, built from the task's reference trajectory:

* **act with memory** — the same reference replies (real calls, answers from the real results)
  with a memory block in the first user message (``with_memory``): a memory is a plan, the
  tools stay the source of truth;
* **memory writing** (role ``memory``, when listed in ``roles``) — the memory prompt over one
  or two imagined attempts, the target a short note in the three-part format of
  ``MEMORY_SYSTEM``: what failed, what the results looked like, the plan.

Imagined attempts are the reference trajectory as a transcript; the second attempt of a pair
has its integer results shifted, as imagination gets numbers wrong, and the memory then reports
the values it saw. The plan never states a final number: it says to answer from the real
result, which is what the act examples with memory then do.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from envace_engine.rollout.memory_prompts import (
    Seen,
    memory_messages,
    render_transcript,
    with_memory,
)
from envace_engine.rollout.prompts import ChatSample, act_samples, dumps
from envace_engine.seeds import derive_seed
from envace_engine.types import Task, ToolResult

TRANSCRIPT_CHARS = 1500  # as testtime.memory.MemoryConfig.transcript_chars


def attempt(task: Task, shift: int = 0) -> list[Seen]:
    """The reference trajectory as an imagined attempt; ``shift`` moves every integer result."""
    seen = []
    for turn, calls in enumerate(task.reference_calls):
        results = task.reference_results[turn] if turn < len(task.reference_results) else ()
        for call, value in zip(calls, results, strict=False):
            seen.append(Seen(turn, call, ToolResult(value=_shifted(value, shift))))
    return seen


def _shifted(value: Any, shift: int) -> Any:
    if shift == 0:
        return value
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return max(value + shift, 0)
    if isinstance(value, dict):
        return {k: _shifted(v, shift) for k, v in value.items()}
    if isinstance(value, list):
        return [_shifted(v, shift) for v in value]
    return value


def memory_note(seen: Sequence[Seen]) -> str:
    """The three-part memory a careful policy writes from ``seen`` (at most six short lines)."""
    results = "; ".join(
        f"{s.call.name} {dumps(s.call.arguments)} -> {dumps(s.result.value)}"
        for s in seen
        if s.result is not None
    )
    steps = []
    for turn in sorted({s.turn for s in seen}):
        names = ", ".join(
            f"{s.call.name} {dumps(s.call.arguments)}" for s in seen if s.turn == turn
        )
        steps.append(f"turn {turn + 1}: call {names}")
    plan = "; ".join(steps) + "; then answer from the real results."
    return f"Failed: nothing.\nResults: {results or 'none'}.\nPlan: {plan}"


def _answers(task: Task) -> list[str]:
    answers = task.meta.get("answers") or ()
    return [str(a) if str(a) else "Done." for a in answers]


def memory_samples(
    task: Task, tools: Sequence[dict[str, Any]], examples: Sequence[Task], write: bool
) -> list[ChatSample]:
    """Act examples with a memory in context; with ``write``, the memory-writing example too."""
    rng = random.Random(derive_seed(0, "sft-memory-variant", task.id))
    clean = attempt(task)
    off = attempt(task, shift=rng.choice((-2, -1, 1, 2)))
    pair = rng.random() < 0.5  # one imagined attempt (N = 1) or two (N = 2)
    seen_last = off if pair else clean
    note = memory_note(seen_last)
    samples = [
        ChatSample(s.prompt, s.target, "act")
        for s in act_samples(with_memory(task, note), tools, examples)
    ]
    if write:
        attempts = [clean, off] if pair else [clean]
        texts = [render_transcript(a, _answers(task), "done", TRANSCRIPT_CHARS) for a in attempts]
        prompt = memory_messages(task, texts)
        samples.append(ChatSample(tuple(prompt), note, "memory"))
    return samples
