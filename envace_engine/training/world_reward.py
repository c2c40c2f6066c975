"""An offline fidelity reward for the world role: each rehearsal scored against what is known
without a live environment (docs/method.md §3, *Rewards per row*).

A rehearse row (one call's rehearsal) gets ``α·R_task + (1 − α)·F`` where ``F`` is known, and
``R_task`` alone where it is not. ``F`` needs only the task's recorded references and the tool
schemas:

* **schema refusal** — when the call fails the tools' schema check (``check_call``: an unknown
  tool, a missing or stray argument, a wrong type), the real tool layer answers with that error
  whatever the state, so ``F = 1`` for a rehearsed error with the same code and ``0`` for
  anything else (a success, another code, an unparseable rehearsal);
* **reference match** — when the call is the reference call at that point of the task, with the
  same calls before it (every earlier turn's calls equal that turn's reference calls, and this
  turn's earlier calls equal its first reference calls), the environment is in the state the
  reference was recorded in, so the recorded result is the real one: ``F`` is the pair score of
  ``fidelity.metrics.compare`` (0 on a status disagreement or an unparseable rehearsal, 1 on
  an exact match, partial credit for the fields in between);
* **elsewhere** — no ``F``: a call off the reference path may see a state nothing recorded.

Requiring every earlier call to match is conservative: a read-only call the agent added would
not change the state, but the engine cannot tell which tools only read, so such paths get no
``F`` rather than a wrong one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from envace_engine.environments.tool_environment import check_call, parameter_schemas
from envace_engine.fidelity.metrics import compare
from envace_engine.types import CallRecord, Episode, Task, ToolCall, ToolResult


def _same(a: ToolCall, b: ToolCall) -> bool:
    return a.name == b.name and a.arguments == b.arguments


def reference_result(task: Task, calls: Sequence[CallRecord], index: int) -> ToolResult | None:
    """The recorded result of ``calls[index]`` when it is the reference call at that point of
    the task, with every earlier call on the reference path (module docstring); else None."""
    record = calls[index]
    turn = record.turn
    if turn >= len(task.reference_calls) or turn >= len(task.reference_results):
        return None
    for earlier in range(turn):
        made = [c.call for c in calls[:index] if c.turn == earlier]
        wanted = task.reference_calls[earlier]
        if len(made) != len(wanted) or not all(map(_same, made, wanted)):
            return None
    this_turn = [c.call for c in calls[:index] if c.turn == turn]
    position = len(this_turn)
    refs, results = task.reference_calls[turn], task.reference_results[turn]
    if position >= min(len(refs), len(results)):
        return None
    if not all(map(_same, this_turn, refs[:position])) or not _same(record.call, refs[position]):
        return None
    return ToolResult(value=results[position])


def known_answer(
    task: Task,
    calls: Sequence[CallRecord],
    index: int,
    schemas: Mapping[str, dict[str, Any]] | None = None,
) -> ToolResult | None:
    """What the real tools answer to ``calls[index]``, where that is known offline: the schema
    check's error for a call it refuses, the recorded result on the reference path; else None.
    ``schemas`` defaults to the task's tools'."""
    call = calls[index].call
    refusal = check_call(call, parameter_schemas(task.tools) if schemas is None else schemas)
    if refusal is not None:
        return ToolResult(error=refusal)
    return reference_result(task, calls, index)


def offline_fidelity(
    task: Task,
    calls: Sequence[CallRecord],
    index: int,
    schemas: Mapping[str, dict[str, Any]] | None = None,
) -> float | None:
    """``F`` of the rehearsal of ``calls[index]`` (module docstring); None where nothing known
    says what the real answer is."""
    known = known_answer(task, calls, index, schemas)
    if known is None:
        return None
    rehearsed = calls[index].rehearsed
    if known.error is not None:  # a refusal: only the code matters, the message is the tool's
        flagged = rehearsed.error if rehearsed is not None else None
        return 1.0 if flagged is not None and flagged.code == known.error.code else 0.0
    return compare(rehearsed, known).score


def rehearse_rewards(
    task: Task,
    episode: Episode,
    task_weight: float,
    terms: Sequence[float | None] | None = None,
) -> list[float | None]:
    """One reward per rehearsal of ``episode`` (in ``episode.rehearsals`` order):
    ``task_weight·R_task + (1 − task_weight)·F`` where ``F`` is known, else ``R_task``; None
    when the episode is unscorable (its rows are never trained). ``terms``: the ``F`` values
    when the caller has them already (``fidelity_terms``)."""
    if not 0.0 <= task_weight <= 1.0:
        raise ValueError(f"task_weight must be in [0, 1], got {task_weight}")
    reward = episode.reward
    if reward is None:
        return [None] * len(episode.rehearsals)
    fs = fidelity_terms(task, episode) if terms is None else terms
    return [reward if f is None else task_weight * reward + (1.0 - task_weight) * f for f in fs]


def fidelity_terms(task: Task, episode: Episode) -> list[float | None]:
    """``F`` of every rehearsal of ``episode`` (None where unknown), for step metrics."""
    schemas = parameter_schemas(task.tools)
    calls = episode.calls
    return [offline_fidelity(task, calls, r.call_index, schemas) for r in episode.rehearsals]


def has_references(tasks: Sequence[Task]) -> bool:
    """Whether any task records reference results (else ``F`` exists only for refusals)."""
    return any(any(turn) for task in tasks for turn in task.reference_results)
