"""Generated task suites: templates draw a task, the real backend executes its reference calls.

A template is a function of a seeded ``random.Random`` returning a ``Draft`` (initial state,
user turns, reference calls per turn). ``generate`` turns drafts into ``Task``s by executing the
reference calls for real on a fresh environment: the results become ``reference_results``, and a
reference call that fails (a tool error, or a backend ``{"error": ...}`` value) is a template bug
and raises. Task ``i`` of ``generate(seed, n)`` depends only on ``(seed, i)``, so ids are stable.

Splits are fixed: ``train`` (512 tasks from seed 1) and ``validation`` (64 tasks from seed 2,
skipping any whose user turns and initial state equal a train task's), cached in memory.
"""

from __future__ import annotations

import json
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from envace_engine.environments.tool_environment import ToolEnvironment
from envace_engine.types import Task, ToolCall

SPLITS: dict[str, tuple[int, int]] = {"train": (1, 512), "validation": (2, 64)}


class GenerationError(RuntimeError):
    """A template produced a task whose reference calls do not execute cleanly."""


def call(name: str, **arguments: Any) -> ToolCall:
    """A reference ``ToolCall`` (shorthand used by the templates)."""
    return ToolCall(name=name, arguments=arguments)


@dataclass(frozen=True)
class Draft:
    """A task before execution: what a template draws."""

    template: str
    user_turns: tuple[str, ...]
    initial_state: dict[str, Any]
    calls: tuple[tuple[ToolCall, ...], ...]
    meta: dict[str, Any] = field(default_factory=dict)


Template = Callable[[random.Random], Draft]


def content_key(task: Task) -> str:
    """What makes two tasks the same task: their user turns and initial state."""
    return json.dumps([task.user_turns, task.initial_state], sort_keys=True)


def _is_error(value: Any) -> bool:
    if isinstance(value, dict) and "error" in value:
        return True
    return isinstance(value, list) and any(_is_error(v) for v in value)


def execute_reference(task: Task, env: ToolEnvironment) -> tuple[tuple[Any, ...], ...]:
    """Run a task's reference calls on ``env``; their JSON results per turn (errors raise)."""
    results = []
    for turn, calls in enumerate(task.reference_calls):
        env.start_turn(turn)
        row = []
        for ref in calls:
            result = env.execute(ref)
            if not result.ok or _is_error(result.value):
                problem = result.error.message if result.error else result.value
                raise GenerationError(f"{task.id}: reference call {ref.name} failed: {problem}")
            row.append(result.value)
        results.append(tuple(row))
    return tuple(results)


class GeneratedSuite(ABC):
    """A ``Suite`` of template-generated tasks: subclasses set ``name``, ``templates``, hooks."""

    name: str = ""
    system: str = ""
    templates: Sequence[Template] = ()

    def __init__(self) -> None:
        self._splits: dict[str, list[Task]] = {}

    @abstractmethod
    def tools_for(self, draft: Draft) -> list[dict[str, Any]]:
        """The tool schemas offered for a draft."""

    def task_meta(self, draft: Draft) -> dict[str, Any]:
        """Suite-specific ``Task.meta`` for a draft."""
        return dict(draft.meta)

    @abstractmethod
    def make_env(self, task: Task) -> ToolEnvironment:
        """A fresh environment at the task's initial state."""

    def draft(self, seed: int, index: int) -> Draft:
        """Draft ``index`` of a seed: the template and its randomness depend on both."""
        rng = random.Random(f"{self.name}:{seed}:{index}")
        return rng.choice(list(self.templates))(rng)

    def build(self, draft: Draft, task_id: str) -> Task:
        """Execute a draft's reference calls for real and return the finished task."""
        task = Task(
            id=task_id,
            suite=self.name,
            user_turns=draft.user_turns,
            tools=tuple(self.tools_for(draft)),
            initial_state=draft.initial_state,
            reference_calls=draft.calls,
            system=self.system,
            meta={"template": draft.template, **self.task_meta(draft)},
        )
        return replace(task, reference_results=execute_reference(task, self.make_env(task)))

    def generate(self, n: int, seed: int) -> list[Task]:
        """``n`` tasks from ``seed``, deterministic; ids ``{suite}/s{seed}-{index}``."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        return [self.build(self.draft(seed, i), f"{self.name}/s{seed}-{i}") for i in range(n)]

    def tasks(self, split: str = "train") -> list[Task]:
        """The fixed ``train`` or ``validation`` split (generated once, then cached)."""
        if split not in SPLITS:
            raise ValueError(
                f"{self.name} has no split {split!r}; valid splits: {', '.join(SPLITS)}"
            )
        if split not in self._splits:
            self._splits[split] = self._make_split(split)
        return list(self._splits[split])

    def _make_split(self, split: str) -> list[Task]:
        seed, n = SPLITS[split]
        if split == "train":
            return self.generate(n, seed)
        seen = {content_key(t) for t in self.tasks("train")}
        out: list[Task] = []
        index = 0
        while len(out) < n and index < 50 * n:  # small worlds repeat: skip train duplicates
            task = self.build(self.draft(seed, index), f"{self.name}/s{seed}-{index}")
            key = content_key(task)
            if key not in seen:
                seen.add(key)
                out.append(task)
            index += 1
        return out
