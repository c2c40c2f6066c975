"""Real answers for an imagined episode's calls, computed after the episode ended.

A rehearsal rollout with ``shadow_real`` runs a real environment beside each episode: every call
is executed there when its rehearsal comes back, in call order, with ``start_turn`` called as the
user turns advance, and the answers are recorded as ``CallRecord.real`` without the agent ever
seeing them. ``replay_shadow`` computes the same answers afterwards, from the finished episode: a
fresh environment of the task, turn 0 started, then each call in order with every turn it
reaches started first. So episodes imagined with no environment at all (test-time rehearsal)
can be scored for fidelity without sampling them again (the study's evaluation measures its
world model on the imagined episodes of its rehearsal settings).

It gives the shadow environment's answers where those depend only on the agent's calls and the
turn — every environment here when no simulated user acts on it (a τ² user's own tool calls
change the environment between the agent's). ``tests/test_shadow_replay.py`` checks equality
with rollouts that ran a shadow environment.
"""

from __future__ import annotations

from dataclasses import replace

from envace_engine.environments.base import Environment, EnvironmentFault, Suite, close_env
from envace_engine.types import CallRecord, Episode, Task, ToolError, ToolResult


def replay_shadow(episode: Episode, task: Task, suite: Suite) -> Episode:
    """``episode`` with every call's ``real`` answer set as a shadow environment would have."""
    if episode.task_id != task.id:
        raise ValueError(f"episode {episode.id} is of task {episode.task_id}, not {task.id}")
    env = suite.make_env(task)
    try:
        return replace(episode, calls=_replay(episode, env))
    finally:
        close_env(env)


def _replay(episode: Episode, env: Environment) -> tuple[CallRecord, ...]:
    turn = 0
    env.start_turn(turn)
    calls = []
    for i, record in enumerate(episode.calls):
        while turn < record.turn:
            turn += 1
            env.start_turn(turn)
        try:
            real = env.execute(record.call)
        except EnvironmentFault as fault:
            # As in a live shadow: the broken call records the fault; later calls get nothing.
            error = ToolError(fault.stop.value.upper(), str(fault), record.call.raw)
            calls.append(replace(record, real=ToolResult(error=error)))
            return (*calls, *(replace(r, real=None) for r in episode.calls[i + 1 :]))
        calls.append(replace(record, real=real))
    return tuple(calls)
