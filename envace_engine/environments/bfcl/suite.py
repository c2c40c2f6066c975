"""Suite ``bfcl``: BFCL v4 multi-turn entries (base, miss_func, miss_param, long_context).

Loaded from the installed ``bfcl-eval`` package data with their possible answers. Each entry
becomes a ``Task``: user turns (a ``miss_func`` turn that only adds tools gets BFCL's own
"I have updated some more functions..." message), the involved classes' tools minus excluded and
held-out functions, ``initial_config`` as initial state, the ground truth parsed into calls and
their results from executing them for real on fresh backends. Scored by BFCL's multi-turn checker
(0 or 1). Held out for evaluation: splits are ``test`` (all four categories) or one category.

Two bases (``get_suite("bfcl", basis)``): ``official`` (the default for reported numbers) runs
episodes and the checker's replays the way BFCL's executor does (``official``: no argument
checks, any public method of the involved classes); ``strict`` uses the whitelisted, validated
dispatcher (``tool_environment``). A held-out ``miss_func`` tool is *offered* only from its turn
on under both (``tools_at``: the rollout shows its schema in that turn's user message).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from functools import cache
from importlib import resources
from typing import Any

from envace_engine.environments.bfcl.backends import (
    make_bfcl_env,
    parameter_order,
    tools_for,
)
from envace_engine.environments.bfcl.checker import bfcl_check, parse_call_string
from envace_engine.environments.bfcl.official import make_official_env
from envace_engine.environments.schema import tool_name
from envace_engine.environments.tool_environment import ToolEnvironment, jsonable
from envace_engine.types import Task, ToolCall, ToolResult

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
BASES = ("official", "strict")
SPLITS = ("test", *CATEGORIES)
# BFCL's user message for a turn that only brings new functions (constants/default_prompts.py).
ADDED_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"


def _read_jsonl(*parts: str) -> list[dict[str, Any]]:
    path = resources.files("bfcl_eval").joinpath("data", *parts)
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _result_json(result: ToolResult) -> Any:
    # A refused ground-truth call (two benchmark quirks, docs/tasks.md) keeps its error visible.
    if result.error is not None:
        return {"error": result.error.message, "code": result.error.code}
    return result.value


def reference_results(task: Task) -> tuple[tuple[Any, ...], ...]:
    """Execute a task's reference calls on a fresh environment; JSON results per turn."""
    env = make_bfcl_env(task)
    out = []
    for turn, calls in enumerate(task.reference_calls):
        env.start_turn(turn)
        out.append(tuple(_result_json(env.execute(call)) for call in calls))
    return tuple(out)


def entry_to_task(entry: dict[str, Any], ground_truth: list[list[str]]) -> Task:
    """One BFCL entry and its ground truth as a ``Task`` (reference results executed for real)."""
    entry_id: str = entry["id"]
    category = entry_id.rsplit("_", 1)[0].removeprefix("multi_turn_")
    missed: dict[str, list[str]] = entry.get("missed_function", {})
    turns = []
    for index, messages in enumerate(entry["question"]):
        texts = [m["content"] for m in messages if m.get("role") == "user"]
        if not texts and str(index) in missed:
            texts = [ADDED_FUNCTIONS_PROMPT]
        turns.append("\n".join(texts))
    classes = list(entry["involved_classes"])
    excluded = list(entry.get("excluded_function", []))
    held_out = [name for names in missed.values() for name in names]
    calls = tuple(
        tuple(parse_call_string(text, parameter_order) for text in turn) for turn in ground_truth
    )
    task = Task(
        id=f"bfcl/{entry_id}",
        suite="bfcl",
        user_turns=tuple(turns),
        tools=tuple(tools_for(classes, excluded, held_out)),
        initial_state=jsonable(entry["initial_config"]),
        reference_calls=calls,
        meta={
            "entry_id": entry_id,
            "category": category,
            "involved_classes": classes,
            "excluded_function": excluded,
            "missed_function": missed,
            "path": list(entry.get("path", [])),
            "long_context": category == "long_context",
        },
    )
    return replace(task, reference_results=reference_results(task))


@cache
def _category_tasks(category: str) -> tuple[Task, ...]:
    entries = _read_jsonl(f"BFCL_v4_multi_turn_{category}.json")
    answers = {
        a["id"]: a["ground_truth"]
        for a in _read_jsonl("possible_answer", f"BFCL_v4_multi_turn_{category}.json")
    }
    return tuple(entry_to_task(e, answers[e["id"]]) for e in entries)


class BfclSuite:
    """The BFCL v4 multi-turn benchmark as a ``Suite`` (evaluation only)."""

    name = "bfcl"
    bases = BASES

    def __init__(self, basis: str = "official") -> None:
        if basis not in BASES:
            raise ValueError(f"unknown basis {basis!r}; valid bases: {', '.join(BASES)}")
        self.basis = basis
        self._make_env = make_official_env if basis == "official" else make_bfcl_env

    def tasks(self, split: str = "test") -> list[Task]:
        """``test`` = all four categories (800 tasks); or one of base, miss_func, ... (200)."""
        if split not in SPLITS:
            raise ValueError(f"bfcl has no split {split!r}; valid splits: {', '.join(SPLITS)}")
        categories = CATEGORIES if split == "test" else (split,)
        return [t for c in categories for t in _category_tasks(c)]

    def make_env(self, task: Task) -> ToolEnvironment:
        """Fresh backend instances at the entry's ``initial_config`` (dispatch per basis)."""
        return self._make_env(task)

    def tools_at(self, task: Task, turn: int) -> list[dict[str, Any]]:
        """The tools offered in user turn ``turn``: the task's, plus held-out tools whose turn
        has come (in BFCL's class order)."""
        missed = task.meta.get("missed_function", {})
        due = {n for t, names in missed.items() if int(t) <= turn for n in names}
        offered = {tool_name(t) for t in task.tools}
        classes = task.meta.get("involved_classes", [])
        extra = [t for t in tools_for(classes) if tool_name(t) in due - offered]
        return [*task.tools, *extra]

    def score(
        self, task: Task, calls_per_turn: Sequence[Sequence[ToolCall]], answers: Sequence[str]
    ) -> float:
        """BFCL's multi-turn checker verdict: 1.0 if valid, else 0.0 (answers are not checked)."""
        return 1.0 if bfcl_check(task, calls_per_turn, self._make_env).valid else 0.0
