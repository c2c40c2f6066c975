"""The ``Environment`` protocol: real, executable tool backends for one episode each.

An environment is built fresh from a task for every episode (``Suite.make_env``), so state never
leaks between episodes and many environments can live side by side for a batch of rollouts.
Tool code runs for real; any exception it raises becomes a ``ToolResult`` error the model sees.

An environment that holds outside resources (an MCP server's process: environments/mcp) also
has ``close()``, which the rollout calls when the episode ends (``close_env``), and raises
``EnvironmentFault`` when the environment itself breaks: that is no answer to show the model,
so the rollout ends the episode with the fault's stop reason instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from envace_engine.types import Episode, StopReason, Task, ToolCall, ToolResult

# An LLM judge of natural-language assertions: (conversation as "role: content" lines, the
# assertions) -> whether each one is met, or None when the judge failed or answered off-format.
NlJudge = Callable[[str, Sequence[str]], Sequence[bool] | None]


@runtime_checkable
class ChatJudge(Protocol):
    """A judge that can also hold a suite's own conversation with its model (VitaBench's
    rubric windows): ``complete`` sends chat messages and returns the reply's text, or None
    when the endpoint failed. The endpoint judge (``rollout.endpoints.NlJudge``) is one."""

    def __call__(self, conversation: str, assertions: Sequence[str]) -> Sequence[bool] | None:
        """Whether each assertion holds for the conversation (τ²'s NL assertions)."""
        ...

    def complete(self, messages: list[dict[str, str]]) -> str | None:
        """One chat completion's text (None: the endpoint failed)."""
        ...


class EnvironmentFault(RuntimeError):
    """The environment broke, not the agent's call: its process exited, a call hung past the
    timeout, or it answered off-protocol. ``stop`` is the stop reason the episode ends with;
    the job goes on with its other episodes."""

    def __init__(self, stop: StopReason, message: str) -> None:
        super().__init__(message)
        self.stop = stop


def close_env(env: object) -> None:
    """Release an environment's resources if it has any (``close()`` is optional: the
    in-process suites hold nothing to release). Safe to call more than once."""
    close = getattr(env, "close", None)
    if callable(close):
        close()


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
        """A fresh environment at the task's initial state. A suite whose environments are
        slow to open (a process each) sets a class attribute ``slow_start = True``: a batch's
        are then opened side by side, from several threads."""
        ...

    def score(self, task: Task, calls_per_turn: list[list[ToolCall]], answers: list[str]) -> float:
        """Task success in [0, 1] from the agent's committed calls per user turn (``state`` reward).

        Replays the calls on a fresh backend and compares with the reference; partial credit
        is allowed where the suite defines it.
        """
        ...


@dataclass(frozen=True)
class Score:
    """A whole-episode score: the reward (None = unscorable), the basis it was computed under
    and every component computed (τ²: ``DB``, ``COMMUNICATE``, ...; diagnostics included)."""

    reward: float | None
    basis: str
    components: Mapping[str, float | None] = field(default_factory=dict)


@runtime_checkable
class ScoringBasis(Protocol):
    """A suite with more than one way to score (``bases``; the first is the default).

    ``basis`` is the one this instance uses (``get_suite(name, basis)``): BFCL ``official`` |
    ``strict``, τ² ``official`` | ``legacy``. The rollout records it with every episode.
    """

    basis: str
    bases: tuple[str, ...]


@runtime_checkable
class EpisodeScorer(Protocol):
    """A suite that scores whole episodes: what ``Suite.score`` cannot see (how the episode
    ended, every assistant message, the conversation for an NL judge) matters (τ²)."""

    basis: str
    bases: tuple[str, ...]

    def score_episode(self, task: Task, episode: Episode, judge: NlJudge | None = None) -> Score:
        """The episode's score under this suite's basis; NL assertions only through ``judge``."""
        ...


@runtime_checkable
class TurnTools(Protocol):
    """A suite whose tasks offer more tools from a later user turn on (BFCL ``miss_func``)."""

    def tools_at(self, task: Task, turn: int) -> list[dict[str, Any]]:
        """The tool schemas the agent may call in user turn ``turn`` (0 first)."""
        ...
