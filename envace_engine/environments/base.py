"""The ``Environment`` protocol: real, executable tool backends for one episode each.

An environment is built fresh from a task for every episode (``Suite.make_env``), so state never
leaks between episodes and many environments can live side by side for a batch of rollouts.
Tool code runs for real; any exception it raises becomes a ``ToolResult`` error the model sees.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from envace_engine.types import Task, ToolCall, ToolResult


@runtime_checkable
class Environment(Protocol):
    """One live episode's backend state."""

    task: Task

    def tools(self) -> list[dict[str, Any]]:
        """OpenAI function schemas of the tools available in this episode."""
        ...

    def execute(self, call: ToolCall) -> ToolResult:
        """Run one parsed call for real. Never raises for bad model input: returns an error."""
        ...

    def state(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot of the current state (for display and checks)."""
        ...

    def start_turn(self, turn: int) -> None:
        """Called before the agent acts on user turn ``turn`` (0 first). Environments whose
        tools change between turns (BFCL's ``miss_func`` reveals a held-out tool at its turn)
        act on it; others do nothing."""
        ...


@runtime_checkable
class Suite(Protocol):
    """A named family of tasks with their environment factory and success check."""

    name: str

    def tasks(self, split: str = "train") -> list[Task]:
        """The suite's tasks for a split (``train`` | ``validation`` | ``test``)."""
        ...

    def make_env(self, task: Task) -> Environment:
        """A fresh environment at the task's initial state."""
        ...

    def score(self, task: Task, calls_per_turn: list[list[ToolCall]], answers: list[str]) -> float:
        """Task success in [0, 1] from the agent's committed calls per user turn (``state`` reward).

        Replays the calls on a fresh backend and compares with the reference; partial credit
        is allowed where the suite defines it.
        """
        ...
