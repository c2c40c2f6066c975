"""``envace tasks check``: replay every task's reference solution and count how many score 1.

A self-test of a suite's tools and its evaluator together, with no model: the reference calls
of each turn, the reference final answers (``meta["answers"]``, which on τ² say every
``communicate_info`` string), and an episode that ended normally. ``agent="nothing"`` scores
the do-nothing baseline instead (no calls, empty answers), a sanity check of the evaluator: on
τ² airline 23 of 50 tasks already hold at the start.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from envace_engine.environments.base import EpisodeScorer, ScoringBasis, Suite
from envace_engine.types import CallRecord, Episode, Mode, StopReason, Task, ToolCall

AGENTS = ("reference", "nothing")


@dataclass(frozen=True)
class CheckReport:
    """How many tasks scored 1, per component where the suite reports components."""

    suite: str
    basis: str
    tasks: int
    passed: int
    unscored: int
    # component -> (tasks where it is 1, tasks where it was computed and not None)
    components: dict[str, tuple[int, int]] = field(default_factory=dict)
    failed: tuple[str, ...] = ()  # ids of tasks below 1 (unscored ones excluded)
    seconds: float = 0.0


def _answers(task: Task) -> list[str]:
    given = [str(a) for a in task.meta.get("answers") or ()]
    return [given[t] if t < len(given) else "" for t in range(len(task.user_turns))]


def solution_episode(task: Task, agent: str = "reference") -> Episode:
    """The reference solution (or the do-nothing agent) of a task as an ended episode."""
    if agent not in AGENTS:
        raise ValueError(f"unknown agent {agent!r}; valid agents: {', '.join(AGENTS)}")
    calls: list[CallRecord] = []
    answers = [""] * len(task.user_turns)
    if agent == "reference":
        answers = _answers(task)
        for turn, turn_calls in enumerate(task.reference_calls):
            calls += [CallRecord(turn, len(calls) + 1, c, "real") for c in turn_calls]
    return Episode(
        id=f"check-{task.id}",
        task_id=task.id,
        suite=task.suite,
        mode=Mode.REAL,
        group_id=f"check-{task.id}",
        segments=(),
        calls=tuple(calls),
        stop_reason=StopReason.DONE,
        final_answers=tuple(answers),
    )


def _per_turn(episode: Episode, turns: int) -> list[list[ToolCall]]:
    out: list[list[ToolCall]] = [[] for _ in range(turns)]
    for record in episode.calls:
        out[record.turn].append(record.call)
    return out


def check_suite(suite: Suite, tasks: Sequence[Task], agent: str = "reference") -> CheckReport:
    """Score every task's reference solution (or do-nothing) and count the 1s."""
    start = time.perf_counter()
    passed = unscored = 0
    components: dict[str, tuple[int, int]] = {}
    failed: list[str] = []
    for task in tasks:
        episode = solution_episode(task, agent)
        reward: float | None
        if isinstance(suite, EpisodeScorer):
            score = suite.score_episode(task, episode)
            reward = score.reward
            for name, value in score.components.items():
                ones, computed = components.get(name, (0, 0))
                if value is not None:
                    components[name] = (ones + (value == 1.0), computed + 1)
        else:
            turns = len(task.user_turns)
            reward = suite.score(task, _per_turn(episode, turns), list(episode.final_answers))
        if reward is None:
            unscored += 1
        elif reward >= 1.0 - 1e-6:
            passed += 1
        else:
            failed.append(task.id)
    basis = suite.basis if isinstance(suite, ScoringBasis) else "default"
    seconds = time.perf_counter() - start
    return CheckReport(
        suite.name, basis, len(tasks), passed, unscored, components, tuple(failed), seconds
    )
