"""Suites ``tau2-airline``, ``tau2-retail`` and ``tau2-mock``: τ²-bench as a ``Suite``.

Each task becomes a ``Task`` with one scripted user turn (the scenario's opening, replayed when
no user model is configured), the domain's tools, the reference actions as reference calls with
their real results (errors recorded as ``{"error": {...}}``), and ``meta`` holding the domain
policy (the agent's system message), the simulated user's system prompt and the evaluation
criteria. The database is loaded once per process (``dataset.fresh_db``); each environment gets
its own copy. Gold hashes are computed once per task, when the tasks are built.

Scoring is ``score_episode`` (``scoring``): it needs the stop reason (termination gate), every
assistant message and, for NL assertions, a judge. ``basis`` is ``official`` (the task's
``reward_basis``) or ``legacy`` (DB + COMMUNICATE).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from functools import cache
from typing import Any

from envace_engine.environments.base import NlJudge, Score
from envace_engine.environments.tau2 import dataset as data
from envace_engine.environments.tau2 import scoring
from envace_engine.environments.tau2.env import (
    Tau2Environment,
    domain,
    error_json,
    make_env,
    state_hash,
)
from envace_engine.environments.tau2.user_prompt import scripted_opening, user_system
from envace_engine.types import CallRecord, Episode, MetaKey, StopReason, Task, TaskKey, ToolCall

# Conversations the user (or the replayed script) ended: the only ones that can score.
GATE_OK = frozenset({StopReason.DONE, StopReason.USER_STOP})
# Mock tasks this project cannot run: their users need tools of their own.
UNSUPPORTED = frozenset({"update_task_with_user_tools"})
_GOLD: dict[str, str] = {}  # task id -> gold state hash


def _criteria(spec: data.TaskSpec) -> dict[str, Any]:
    ev = spec.evaluation_criteria or data.Criteria()
    actions = [a for a in ev.actions or [] if a.requestor == "assistant"]
    return {
        "actions": [
            {"name": a.name, "arguments": a.arguments, "compare_args": a.compare_args}
            for a in actions
        ],
        "env_assertions": [a.model_dump() for a in ev.env_assertions or []],
        "communicate_info": list(ev.communicate_info or []),
        "nl_assertions": list(ev.nl_assertions or []),
        "reward_basis": list(ev.reward_basis) if ev.reward_basis is not None else None,
    }


def _initial(spec: data.TaskSpec) -> dict[str, Any]:
    state = spec.initial_state
    if state is None:
        return {}
    calls = [
        {"name": c["name"], "arguments": c.get("arguments") or {}}
        for m in state.message_history or []
        if m.get("role") == "assistant"
        for c in m.get("tool_calls") or []
    ]
    out: dict[str, Any] = {
        "initialization_data": state.initialization_data or {},
        "initialization_actions": [a.model_dump() for a in state.initialization_actions or []],
        "history_calls": calls,
    }
    return out


def reference_message(evaluation: dict[str, Any]) -> str:
    """The reference trajectory's last message: it says every ``communicate_info`` string."""
    info = evaluation.get("communicate_info") or []
    return "Here is what I found: " + "; ".join(info) + "." if info else "Done."


def build_task(dom: str, spec: data.TaskSpec) -> Task:
    """One τ² task as a ``Task``; its reference actions are executed for real here."""
    evaluation = _criteria(spec)
    calls = tuple(ToolCall(a["name"], dict(a["arguments"])) for a in evaluation["actions"])
    task = Task(
        id=f"tau2-{dom}/{spec.id}",
        suite=f"tau2-{dom}",
        user_turns=(scripted_opening(spec),),
        tools=tuple(domain(dom).schemas),
        initial_state=_initial(spec),
        reference_calls=(calls,),
        meta={
            "domain": dom,
            "tau2_id": spec.id,
            TaskKey.POLICY: data.policy(dom),
            TaskKey.USER_SYSTEM: user_system(spec),
            "evaluation": evaluation,
            "answers": [reference_message(evaluation)],
        },
    )
    env = make_env(task)
    results = []
    for call in calls:  # the gold replay: errors are recorded and ignored
        result = env.execute(call)
        results.append(result.value if result.ok else error_json(result.error))  # type: ignore[arg-type]
    _GOLD[task.id] = env.state_hash()
    return replace(task, reference_results=(tuple(results),))


@cache
def _tasks(dom: str) -> tuple[Task, ...]:
    specs = [s for s in data.task_specs(dom) if s.id not in UNSUPPORTED]
    return tuple(build_task(dom, s) for s in specs)


def _splits(dom: str) -> dict[str, tuple[str, ...]]:
    named = dict(data.splits(dom))
    if "train" not in named:  # mock ships only "base": let tests name train and test too
        named["train"] = named["test"] = named["base"]
    return named


def gold_hash(task: Task) -> str:
    """The state hash after the task's reference actions (computed once per task id)."""
    if task.id not in _GOLD:
        env = scoring.replay_writes(make_env(task), [c for t in task.reference_calls for c in t])
        _GOLD[task.id] = env.state_hash()
    return _GOLD[task.id]


def _shown(record: CallRecord) -> Any:
    got = record.seen()
    if got is None:
        return None
    return got.value if got.error is None else error_json(got.error)


def conversation(task: Task, episode: Episode) -> str:
    """The episode as "role: content" lines (what an NL judge reads)."""
    users = list(episode.meta.get(MetaKey.USER_MESSAGES) or task.user_turns)
    lines: list[str] = []
    for turn, user in enumerate(users):
        lines.append(f"user: {user}")
        for record in (r for r in episode.calls if r.turn == turn):
            call = json.dumps({"name": record.call.name, "arguments": record.call.arguments})
            lines += [f"assistant: tool call {call}", f"tool: {json.dumps(_shown(record))}"]
        if turn < len(episode.final_answers):
            lines.append(f"assistant: {episode.final_answers[turn]}")
    return "\n".join(lines)


class Tau2Suite:
    """One τ² domain as a ``Suite`` (and ``EpisodeScorer``): splits from split_tasks.json."""

    bases = scoring.BASES

    def __init__(self, dom: str, basis: str = "official") -> None:
        domain(dom)  # fail fast on an unknown domain
        self.domain = dom
        self.name = f"tau2-{dom}"
        self.basis = scoring.check_basis(basis)

    def tasks(self, split: str = "train") -> list[Task]:
        """``train`` (for training), ``test`` (for evaluation) or ``base`` (all)."""
        named = _splits(self.domain)
        if split not in named:
            raise ValueError(
                f"{self.name} has no split {split!r}; valid splits: {', '.join(named)}"
            )
        by_id = {t.meta["tau2_id"]: t for t in _tasks(self.domain)}
        return [by_id[i] for i in named[split] if i in by_id]

    def make_env(self, task: Task) -> Tau2Environment:
        """A fresh environment: a private copy of the database at the task's initial state."""
        return make_env(task)

    def initial_hash(self, task: Task) -> str:
        """The state hash before any call (a do-nothing agent ends here)."""
        return state_hash(make_env(task).db)

    def score_episode(self, task: Task, episode: Episode, judge: NlJudge | None = None) -> Score:
        """τ²'s reward for one episode under this suite's basis (docs/tasks.md)."""
        calls = [record.call for record in episode.calls]
        predicted = scoring.replay_writes(make_env(task), calls)
        return scoring.score(
            task.meta["evaluation"],
            predicted,
            gold_hash(task),
            calls,
            list(episode.final_answers),
            episode.stop_reason in GATE_OK,
            self.basis,
            (conversation(task, episode), judge),
        )

    def score(
        self, task: Task, calls_per_turn: Sequence[Sequence[ToolCall]], answers: Sequence[str]
    ) -> float:
        """The reward of calls and answers of a conversation that ended normally, without a
        judge: a task whose basis needs one scores 0.0 here (use ``score_episode``)."""
        calls = [c for turn in calls_per_turn for c in turn]
        predicted = scoring.replay_writes(make_env(task), calls)
        result = scoring.score(
            task.meta["evaluation"], predicted, gold_hash(task), calls, answers, True, self.basis
        )
        return result.reward or 0.0
