"""A batch's environments opened side by side for suites that are slow to open
(``rollout.loop.open_envs``), and none leaked when one fails to open."""

from __future__ import annotations

import threading

import pytest

from envace_engine.rollout.loop import open_envs
from envace_engine.types import Task


class _Env:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def close(self) -> None:
        self.log.append(f"closed {self.name}")


class _SlowSuite:
    """make_env waits until ``together`` environments are being opened at once."""

    slow_start = True

    def __init__(self, together: int, fail: str | None = None) -> None:
        self.barrier = threading.Barrier(together, timeout=10)
        self.fail = fail
        self.log: list[str] = []

    def make_env(self, task: Task) -> _Env:
        self.barrier.wait()  # sequential opening would never get past this
        if task.id == self.fail:
            raise RuntimeError(f"server for {task.id} did not start")
        return _Env(self.log, task.id)


def _tasks(n: int) -> list[Task]:
    return [
        Task(id=f"t{i}", suite="slow", user_turns=("hi",), tools=(), initial_state={})
        for i in range(n)
    ]


def test_slow_suites_open_a_batch_side_by_side_in_task_order():
    suite = _SlowSuite(together=4)
    envs = open_envs(suite, _tasks(4))  # type: ignore[arg-type]
    assert envs is not None and [e.name for e in envs] == ["t0", "t1", "t2", "t3"]
    assert suite.log == []


def test_one_failing_to_open_closes_the_others_and_raises():
    suite = _SlowSuite(together=3, fail="t1")
    with pytest.raises(RuntimeError, match="server for t1 did not start"):
        open_envs(suite, _tasks(3))  # type: ignore[arg-type]
    assert sorted(suite.log) == ["closed t0", "closed t2"]


def test_other_suites_open_their_own():
    class Quick:
        def make_env(self, task: Task) -> None:
            raise AssertionError("not called: each episode opens its own")

    assert open_envs(Quick(), _tasks(2)) is None  # type: ignore[arg-type]
