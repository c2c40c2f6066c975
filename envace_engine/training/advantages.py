"""Role-wise GRPO advantages (docs/method.md §4): pure functions over per-row values, no I/O.

Every training row (one per ``act`` reply, one per rehearsed call: "step-as-sample") carries a
reward ``r``: its trajectory's, or its own (below). For a row ``i`` of role ``ρ`` in group ``x``
(one task rolled out G times)::

    A_i = r_i − b(x, ρ)            and, with ``scale_by_std``,   A_i = (r_i − b) / (s + 1e-6)

Choices, and why:

* ``pooling="rows"`` (EnvACE's code): ``b`` is the mean of ``r`` over all rows of role ``ρ`` in
  the group, so a trajectory with many steps of that role weighs more. ``"trajectories"`` (the
  textbook baseline): ``b`` is the mean reward of the group's trajectories that have at least one
  row of role ``ρ``, each counted once. ``s`` is the (unbiased, Bessel) std over the same pool,
  as in TRL and verl; it is off by default because EnvACE's run uses mean-only advantages.
* ``role_wise=False`` is the ablation: one shared pool per group, whatever the role.
* A pool holding one trajectory (a group of one, or the only trajectory with rows of that role)
  has ``r_i == b``, so its advantage is exactly 0, never ``r`` — with std scaling too.
* Rows of one trajectory may carry different rewards (a reward per row: a rehearse row scored
  by ``training.world_reward``); with ``pooling="rows"`` each row is one member of its pool.
  ``"trajectories"`` counts one reward per trajectory, so it refuses rows that differ.
* An unscorable trajectory (reward ``None``) is left out of every baseline and std, and its rows
  get advantage ``None``: they are never trained. It is never silently scored 0, which would pull
  the baseline down and push the other rows up. ``scorable`` drops such rows before batching.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Literal

from envace_engine.types import TrainRow

Pooling = Literal["rows", "trajectories"]
STD_EPS = 1e-6


def compute_advantages(
    group_ids: Sequence[Hashable],
    roles: Sequence[Hashable],
    rewards: Sequence[float | None],
    trajectory_ids: Sequence[Hashable],
    *,
    pooling: Pooling = "rows",
    scale_by_std: bool = False,
    role_wise: bool = True,
) -> list[float | None]:
    """Per-row advantages; ``None`` for rows of unscorable trajectories (see module docstring)."""
    n = len(group_ids)
    if not len(roles) == len(rewards) == len(trajectory_ids) == n:
        raise ValueError(
            f"per-row inputs differ in length: {n} group ids, {len(roles)} roles, "
            f"{len(rewards)} rewards, {len(trajectory_ids)} trajectory ids"
        )
    if pooling not in ("rows", "trajectories"):
        raise ValueError(f"pooling must be 'rows' or 'trajectories', got {pooling!r}")
    pools: dict[tuple[Hashable, Hashable], dict[Hashable, list[float]]] = defaultdict(dict)
    for i in range(n):
        reward = rewards[i]
        if reward is None:
            continue
        if not math.isfinite(reward):
            raise ValueError(f"row {i} has reward {reward}: use None for an unscorable episode")
        key = (group_ids[i], roles[i] if role_wise else None)
        seen = pools[key].setdefault(trajectory_ids[i], [])
        if seen and seen[0] != reward and pooling == "trajectories":
            raise ValueError(
                f"row {i}: trajectory {trajectory_ids[i]!r} has rewards {seen[0]} and {reward}; "
                "pooling 'trajectories' counts one reward per trajectory: use pooling 'rows' "
                "with rewards per row"
            )
        seen.append(reward)
    stats = {key: _pool_stats(members, pooling) for key, members in pools.items()}
    out: list[float | None] = []
    for i in range(n):
        reward = rewards[i]
        if reward is None:
            out.append(None)
            continue
        baseline, std, size = stats[(group_ids[i], roles[i] if role_wise else None)]
        advantage = reward - baseline if size > 1 else 0.0
        out.append(advantage / (std + STD_EPS) if scale_by_std and size > 1 else advantage)
    return out


def _pool_stats(members: dict[Hashable, list[float]], pooling: Pooling) -> tuple[float, float, int]:
    """Mean and unbiased std of one pool (its rows, or one reward per trajectory), and how many
    trajectories it holds: with one, every row has ``r == b`` and gets exactly 0 (no float noise
    from averaging equal values, no division by a zero std)."""
    if pooling == "rows":
        values = [r for rewards in members.values() for r in rewards]
    else:
        values = [rewards[0] for rewards in members.values()]
    mean = sum(values) / len(values)
    if len(members) < 2:
        return mean, 0.0, len(members)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(var), len(members)


def row_advantages(
    rows: Sequence[TrainRow],
    *,
    pooling: Pooling = "rows",
    scale_by_std: bool = False,
    role_wise: bool = True,
) -> list[float | None]:
    """``compute_advantages`` over training rows (trajectory id = ``episode_id``)."""
    return compute_advantages(
        [row.group_id for row in rows],
        [row.role for row in rows],
        [row.reward for row in rows],
        [row.episode_id for row in rows],
        pooling=pooling,
        scale_by_std=scale_by_std,
        role_wise=role_wise,
    )


def scorable(
    rows: Sequence[TrainRow], advantages: Sequence[float | None]
) -> tuple[list[TrainRow], list[float]]:
    """Keep only rows with an advantage: unscorable trajectories contribute no training rows."""
    if len(rows) != len(advantages):
        raise ValueError(f"{len(rows)} rows but {len(advantages)} advantages")
    kept = [(row, adv) for row, adv in zip(rows, advantages, strict=True) if adv is not None]
    return [row for row, _ in kept], [adv for _, adv in kept]
