"""The ``reference`` reward: how many of a task's reference calls the agent made, in order.

No execution at all. Per user turn, the longest common subsequence of the reference calls and
the agent's calls (a match is the same tool name and equal arguments) counts the reference calls
matched in order; the reward is the matched total over the reference total. Extra calls cost
nothing here (the ``state`` reward catches harmful ones). A task without reference calls scores
1.0 when the agent also made no calls, else 0.0.
"""

from __future__ import annotations

from collections.abc import Sequence

from envace_engine.types import Task, ToolCall


def _same(a: ToolCall, b: ToolCall) -> bool:
    return a.name == b.name and a.arguments == b.arguments


def matched_in_order(reference: Sequence[ToolCall], calls: Sequence[ToolCall]) -> int:
    """Length of the longest common subsequence of two call lists."""
    row = [0] * (len(calls) + 1)
    for ref in reference:
        prev_diag = 0
        for j, got in enumerate(calls, start=1):
            above = row[j]
            row[j] = prev_diag + 1 if _same(ref, got) else max(row[j], row[j - 1])
            prev_diag = above
    return row[-1]


def reference_match(task: Task, calls_per_turn: Sequence[Sequence[ToolCall]]) -> float:
    """Fraction of the task's reference calls matched, order-aware within each user turn."""
    total = sum(len(turn) for turn in task.reference_calls)
    if total == 0:
        return 0.0 if any(calls_per_turn) else 1.0
    matched = sum(
        matched_in_order(ref, calls_per_turn[t] if t < len(calls_per_turn) else ())
        for t, ref in enumerate(task.reference_calls)
    )
    return matched / total
