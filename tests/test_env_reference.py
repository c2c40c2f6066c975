"""The ``reference`` reward: order-aware fraction of reference calls matched, by hand."""

from __future__ import annotations

from envace_engine.environments import reference_match
from envace_engine.environments.reference import matched_in_order
from envace_engine.types import Task, ToolCall

A = ToolCall("a", {"x": 1})
B = ToolCall("b", {})
C = ToolCall("c", {"y": "z"})


def _task(*turns: tuple[ToolCall, ...]) -> Task:
    return Task(
        id="t",
        suite="toy",
        user_turns=tuple("u" for _ in turns),
        tools=(),
        initial_state={},
        reference_calls=turns,
    )


def test_longest_common_subsequence_counts() -> None:
    assert matched_in_order([A, B, C], [A, B, C]) == 3
    assert matched_in_order([A, B, C], [C, B, A]) == 1  # order matters
    assert matched_in_order([A, B, C], [A, C]) == 2
    assert matched_in_order([A, B], [A, A, B, B]) == 2  # repeats do not count twice
    assert matched_in_order([A], [ToolCall("a", {"x": 2})]) == 0  # arguments must be equal
    assert matched_in_order([A], [ToolCall("a", {"x": 1.0})]) == 1  # 1 == 1.0 in JSON


def test_fraction_over_turns() -> None:
    task = _task((A, B), (C,))
    assert reference_match(task, [[A, B], [C]]) == 1.0
    assert reference_match(task, [[B, A], [C]]) == 2 / 3
    assert reference_match(task, [[A, B]]) == 2 / 3  # missing turn counts as no calls
    assert reference_match(task, [[C], [A, B]]) == 0.0  # right calls in the wrong turns
    assert reference_match(task, [[A, B, C, C], [C]]) == 1.0  # extra calls are not penalised


def test_task_without_reference_calls() -> None:
    assert reference_match(_task((), ()), [[], []]) == 1.0
    assert reference_match(_task((), ()), [[A], []]) == 0.0
