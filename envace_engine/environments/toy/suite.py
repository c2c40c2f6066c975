"""Suite ``toy``: tiny worlds where a 135M model's learning is visible on CPU in minutes.

Worlds (``toy_worlds``): warehouse, bank, notes; five templates each, one or two user turns,
small numbers, the state written into the system prompt. ``meta["answers"][t]`` is the short
string (a number, a word) the final answer of turn ``t`` must contain, or ``""``.

Reward (``score``), with partial credit because a 0/1 reward leaves most groups of a small
model without variance (docs/platform.md §3):

* state: over the state entries that the reference changes *or* the agent changes, the fraction
  whose final value equals the reference's (doing nothing scores 0; a spurious change costs);
* answer: the fraction of expected answers found in the agent's final answers;
* ``score = (state + answer) / 2`` when the task has both, else whichever it has.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from envace_engine.environments.generated import Draft, GeneratedSuite
from envace_engine.environments.tool_environment import ToolEnvironment
from envace_engine.environments.toy.templates import TEMPLATES
from envace_engine.environments.toy.worlds import WORLDS, describe_state, describe_world
from envace_engine.types import Task, TaskKey, ToolCall


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_leaves(item, f"{prefix}/{key}"))
        return out
    return {prefix: value}


def state_credit(initial: dict, reference: dict, final: dict) -> float:
    """Fraction right among the state entries the reference or the agent changed (1 if none)."""
    init, ref, got = _leaves(initial), _leaves(reference), _leaves(final)
    missing = object()
    keys = set(init) | set(ref) | set(got)
    relevant = [
        k
        for k in keys
        if init.get(k, missing) != ref.get(k, missing)
        or init.get(k, missing) != got.get(k, missing)
    ]
    if not relevant:
        return 1.0
    return sum(ref.get(k, missing) == got.get(k, missing) for k in relevant) / len(relevant)


def answer_credit(expected: Sequence[str], answers: Sequence[str]) -> float | None:
    """Fraction of expected answers found (as whole words) in the agent's answer per turn."""
    wanted = [(t, e) for t, e in enumerate(expected) if e]
    if not wanted:
        return None
    hits = 0
    for turn, text in wanted:
        said = answers[turn] if turn < len(answers) else ""
        hits += bool(re.search(rf"(?<![\w.]){re.escape(text)}(?![\w]|\.\d)", said, re.I))
    return hits / len(wanted)


class ToySuite(GeneratedSuite):
    """The toy worlds as one suite: ``train`` (512) and ``validation`` (64) splits."""

    name = "toy"
    templates = TEMPLATES

    def tools_for(self, draft: Draft) -> list[dict[str, Any]]:
        """The world's (at most four) tools."""
        return list(WORLDS[draft.meta["world"]].TOOLS)

    def build(self, draft: Draft, task_id: str) -> Task:
        """As ``GeneratedSuite.build``, with the task's context text (``context``) and the
        environment's own description of its state (``TaskKey.WORLD_STATE``)."""
        task = super().build(draft, task_id)
        meta = {**task.meta, TaskKey.WORLD_STATE: self.world_state(draft)}
        return replace(task, system=self.context(draft), meta=meta)

    def context(self, draft: Draft) -> str:
        """What the agent is told: the world's state in one line (a small model needs it)."""
        state = describe_state(draft.meta["world"], draft.initial_state)
        return f"{state} Use the tools, then answer briefly."

    def world_state(self, draft: Draft) -> str:
        """Everything the environment holds at the start, note texts included."""
        return describe_world(draft.meta["world"], draft.initial_state)

    def make_env(self, task: Task) -> ToolEnvironment:
        """A fresh world backend at the task's initial state."""
        world = task.meta["world"]
        if world not in WORLDS:
            raise ValueError(f"toy task {task.id}: unknown world {world!r}; known: {list(WORLDS)}")
        instance = WORLDS[world](task.initial_state)
        owners = {t["function"]["name"]: world for t in WORLDS[world].TOOLS}
        return ToolEnvironment(
            task,
            {world: instance},
            list(task.tools),
            owners,
            snapshot=lambda instances: dict(vars(instances[world])),
        )

    def replay(self, task: Task, calls_per_turn: Sequence[Sequence[ToolCall]]) -> dict:
        """The final state after executing calls per turn on a fresh backend."""
        env = self.make_env(task)
        for turn, calls in enumerate(calls_per_turn):
            env.start_turn(turn)
            for c in calls:
                env.execute(c)
        return env.state()

    def score(
        self, task: Task, calls_per_turn: Sequence[Sequence[ToolCall]], answers: Sequence[str]
    ) -> float:
        """Partial credit: half state, half answer (see the module docstring)."""
        reference = self.replay(task, task.reference_calls)
        initial = self.make_env(task).state()
        state = state_credit(initial, reference, self.replay(task, calls_per_turn))
        changes = state_credit(initial, reference, initial) < 1.0  # reference changes state
        answer = answer_credit(task.meta.get("answers", []), answers)
        if answer is None:
            return state
        return (state + answer) / 2 if changes else answer
