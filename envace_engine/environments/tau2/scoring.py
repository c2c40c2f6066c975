"""τ²-bench evaluation (docs/tasks.md, "τ²-bench"): the components and their product.

* **termination gate** — only a conversation the user (or the replayed script) ended can score;
* **DB** — the agent's write calls replayed in order on a fresh database must give the same
  canonical hash as the gold replay of the reference actions (their errors ignored);
* **ENV_ASSERTION** — boolean functions on that final database (mock);
* **COMMUNICATE** — every ``communicate_info`` string occurs, case-insensitively, in some
  assistant message with its commas removed ("1628" matches "$1,628");
* **NL_ASSERTION** — only through a configured judge; without one the reward is unscorable;
* **ACTION** — every reference action matched by an agent call (same name, equal arguments,
  restricted to ``compare_args`` when given).

The reward is the product of the components named by the basis: ``official`` (the task's
``reward_basis``) or ``legacy`` (DB and COMMUNICATE, fully offline). Other components are
computed as diagnostics (the NL judge is called only when it counts).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from envace_engine.environments.base import NlJudge, Score
from envace_engine.environments.tau2.env import Tau2Environment
from envace_engine.types import ToolCall

BASES = ("official", "legacy")
LEGACY_BASIS = ("DB", "COMMUNICATE")
DEFAULT_BASIS = ("DB", "COMMUNICATE")  # τ²'s default when a task names none


def check_basis(basis: str) -> str:
    """``basis`` if valid, else a ValueError listing the valid ones."""
    if basis not in BASES:
        raise ValueError(f"unknown basis {basis!r}; valid bases: {', '.join(BASES)}")
    return basis


def reward_basis(evaluation: Mapping[str, Any], basis: str) -> tuple[str, ...]:
    """The components the reward multiplies under ``basis``."""
    if check_basis(basis) == "legacy":
        return LEGACY_BASIS
    return tuple(evaluation.get("reward_basis") or DEFAULT_BASIS)


def communicated(info: Sequence[str], texts: Sequence[str]) -> float:
    """1.0 if every string occurs in some assistant text (commas removed, any case)."""
    said = [t.replace(",", "").lower() for t in texts]
    return float(all(any(s.lower() in text for text in said) for s in info))


def _matches(action: Mapping[str, Any], call: ToolCall) -> bool:
    if call.name != action["name"]:
        return False
    keys = action.get("compare_args")
    wanted = action.get("arguments") or {}
    if keys is None:
        return call.arguments == wanted
    return all(call.arguments.get(k) == wanted.get(k) for k in keys)


def actions_matched(actions: Sequence[Mapping[str, Any]], calls: Sequence[ToolCall]) -> float:
    """1.0 if every reference action is matched by some agent call."""
    return float(all(any(_matches(a, c) for c in calls) for a in actions))


def replay_writes(env: Tau2Environment, calls: Sequence[ToolCall]) -> Tau2Environment:
    """Replay the agent's write calls in order (reads change nothing, so they are skipped)."""
    for call in calls:
        if env.domain.writes(call.name):
            env.execute(call)
    return env


def env_assertions(env: Tau2Environment, assertions: Sequence[Mapping[str, Any]]) -> float:
    """1.0 if every assertion on the final database gives its ``assert_value``."""
    ok = all(
        env.check(a["func_name"], a.get("arguments") or {}) == bool(a.get("assert_value", True))
        for a in assertions
    )
    return float(ok)


def nl_component(
    assertions: Sequence[str], conversation: str, judge: NlJudge | None
) -> float | None:
    """1.0 iff the judge finds every assertion met; None without a judge or a verdict."""
    if not assertions:
        return 1.0
    if judge is None:
        return None
    verdict = judge(conversation, list(assertions))
    if verdict is None or len(verdict) != len(assertions):
        return None
    return float(all(verdict))


def score(
    evaluation: Mapping[str, Any],
    predicted: Tau2Environment,
    gold_hash: str,
    calls: Sequence[ToolCall],
    texts: Sequence[str],
    gate_ok: bool,
    basis: str,
    nl: tuple[str, NlJudge | None] = ("", None),
) -> Score:
    """Score one conversation. ``predicted`` has the agent's writes replayed; ``nl`` is the
    conversation text and the judge (called only when NL_ASSERTION counts and the gate passed).
    """
    counted = reward_basis(evaluation, basis)
    parts: dict[str, float | None] = {
        "DB": float(predicted.state_hash() == gold_hash),
        "COMMUNICATE": communicated(evaluation.get("communicate_info") or [], texts),
        "ACTION": actions_matched(evaluation.get("actions") or [], calls),
    }
    assertions = evaluation.get("env_assertions") or []
    if assertions or "ENV_ASSERTION" in counted:
        parts["ENV_ASSERTION"] = env_assertions(predicted, assertions)
    if "NL_ASSERTION" in counted and gate_ok:
        parts["NL_ASSERTION"] = nl_component(evaluation.get("nl_assertions") or [], *nl)
    parts["GATE"] = float(gate_ok)
    if not gate_ok:
        return Score(0.0, basis, parts)
    values = [parts.get(name) for name in counted]
    if any(v is None for v in values):
        return Score(None, basis, parts)
    reward = 1.0
    for value in values:
        reward *= float(value or 0.0)
    return Score(reward, basis, parts)
