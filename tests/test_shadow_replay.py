"""``rollout.shadow.replay_shadow`` gives the answers a live shadow environment gave: rehearsal
rollouts run with ``shadow_real`` on, their real answers dropped, then replayed after the fact.
A BFCL ``miss_func`` task checks that turns are started as the episode reached them (its
held-out tool exists only from turn 3 on)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from envace_engine.environments import get_suite
from envace_engine.rollout.loop import RolloutConfig, rollout
from envace_engine.rollout.shadow import replay_shadow
from envace_engine.types import Episode, Mode, Task
from tests.test_rehearsal import ScriptedPolicy, toy_tasks


def _without_real(episode: Episode) -> Episode:
    return replace(episode, calls=tuple(replace(c, real=None) for c in episode.calls))


def test_replay_gives_the_shadow_answers_on_toy(tokenizer):
    tasks = toy_tasks(4)
    suite = get_suite("toy")
    config = RolloutConfig(
        mode=Mode.REHEARSAL, shadow_real=True, n_examples=0, seed=1, check_drift=False
    )
    episodes = rollout(tasks, suite, ScriptedPolicy(tokenizer, tasks), tokenizer, config, 2)
    calls = [c for e in episodes for c in e.calls]
    assert len(calls) >= 8 and all(c.real is not None for c in calls)
    assert any(c.real != c.rehearsed for c in calls)  # the world role did not know the truth
    by_id = {t.id: t for t in tasks}
    for episode in episodes:
        bare = _without_real(episode)
        assert all(c.real is None for c in bare.calls)
        assert replay_shadow(bare, by_id[episode.task_id], suite) == episode


class LoggingSuite:
    """A real suite whose environments log ``start_turn`` and ``execute`` in order."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name = inner, inner.name
        self.logs: list[list[tuple[str, Any]]] = []

    def tasks(self, split: str = "train") -> list[Task]:
        return self.inner.tasks(split)

    def make_env(self, task: Task) -> Any:
        env, log = self.inner.make_env(task), []
        self.logs.append(log)
        turn, execute = env.start_turn, env.execute
        env.start_turn = lambda t: (log.append(("turn", t)), turn(t))[1]
        env.execute = lambda call: (log.append(("call", call.name)), execute(call))[1]
        return env

    def score(self, task: Task, calls_per_turn: Any, answers: Any) -> float:
        return self.inner.score(task, calls_per_turn, answers)


def _until_last_call(log: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    last = max((i for i, (kind, _) in enumerate(log) if kind == "call"), default=-1)
    return log[: last + 1]


def test_replay_starts_turns_and_runs_calls_in_the_shadow_order(tokenizer):
    tasks = [t for t in toy_tasks(40) if len(t.user_turns) > 1][:3]
    assert len(tasks) == 3  # multi-turn tasks: turns are started between calls
    suite = LoggingSuite(get_suite("toy"))
    config = RolloutConfig(
        mode=Mode.REHEARSAL, shadow_real=True, n_examples=0, seed=1, check_drift=False
    )
    episodes = rollout(tasks, suite, ScriptedPolicy(tokenizer, tasks), tokenizer, config)
    live = [_until_last_call(log) for log in suite.logs]
    assert any(("turn", 1) in log for log in live)
    suite.logs.clear()
    by_id = {t.id: t for t in tasks}
    replayed = [replay_shadow(_without_real(e), by_id[e.task_id], suite) for e in episodes]
    assert replayed == episodes
    assert [_until_last_call(log) for log in suite.logs] == live


def test_replay_refuses_another_tasks_episode(tokenizer):
    tasks = toy_tasks(2)
    config = RolloutConfig(mode=Mode.REHEARSAL, shadow_real=False, n_examples=0, seed=0)
    (episode,) = rollout(
        tasks[:1], get_suite("toy"), ScriptedPolicy(tokenizer, tasks), tokenizer, config
    )
    with pytest.raises(ValueError, match="is of task"):
        replay_shadow(episode, tasks[1], get_suite("toy"))
