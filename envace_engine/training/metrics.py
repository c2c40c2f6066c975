"""Per-step training metrics: rewards and advantages per role, real-env success, fidelity.

Names are flat (``reward/act``, ``adv/rehearse/std``, ``fidelity/score``) so any sink can store
them as (step, name, value) rows. Pure functions of a step's episodes and rows.

* ``reward/mean`` — mean over scorable episodes; ``reward/unscorable`` — episodes with None.
* ``reward/<role>`` — mean reward over that role's rows (a trajectory with many rows of a role
  weighs more: it is what that role was trained on).
* ``success/real`` — task success of the committed calls replayed on the real environment. In
  ``envace`` mode the agent only saw rehearsed answers, so this is the real-env success of the
  rehearsed episodes; it equals the reward when the reward is ``state``.
* ``fidelity/*`` — tiers (``fidelity.compare``) over this step's (rehearsed, real) pairs; an
  unparseable rehearsal counts as a pair that failed every tier.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence

from envace_engine.fidelity.collusion import collusion_metrics
from envace_engine.fidelity.metrics import compare
from envace_engine.rollout.loop import rollout_metrics
from envace_engine.types import Episode, TrainRow


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / len(values)
    return mean, math.sqrt(var)


def reward_metrics(
    episodes: Sequence[Episode], rows: Sequence[TrainRow], success: Mapping[str, float]
) -> dict[str, float]:
    """Reward mean, per-role row reward, unscorable count and real-env success."""
    scored = [e.reward for e in episodes if e.reward is not None]
    out = {
        "reward/mean": _mean_std(scored)[0],
        "reward/std": _mean_std(scored)[1],
        "reward/unscorable": float(len(episodes) - len(scored)),
        "success/real": _mean_std([success[e.id] for e in episodes if e.id in success])[0],
    }
    for role in ("act", "rehearse"):
        values = [r.reward for r in rows if r.role == role and r.reward is not None]
        out[f"reward/{role}"] = _mean_std(values)[0]
    return out


def advantage_metrics(rows: Sequence[TrainRow], advantages: Sequence[float]) -> dict[str, float]:
    """Mean, std and share of non-zero advantages per role over the trained rows."""
    out: dict[str, float] = {}
    for role in ("act", "rehearse"):
        values = [a for r, a in zip(rows, advantages, strict=True) if r.role == role]
        mean, std = _mean_std(values)
        out[f"adv/{role}/mean"] = mean
        out[f"adv/{role}/std"] = std
        out[f"adv/{role}/nonzero"] = sum(abs(a) > 1e-12 for a in values) / max(len(values), 1)
        out[f"rows/{role}/trained"] = float(len(values))
    return out


def fidelity_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Fidelity tiers averaged over every (rehearsed, real) pair of the step."""
    pairs = [
        compare(c.rehearsed, c.real)
        for e in episodes
        for c in e.calls
        if c.shown == "rehearsed" and c.real is not None
    ]
    n = len(pairs)
    out = {"fidelity/pairs": float(n)}
    if n == 0:
        return out
    out["fidelity/score"] = sum(p.score for p in pairs) / n
    out["fidelity/exact"] = sum(p.exact for p in pairs) / n
    out["fidelity/parse_valid"] = sum(p.parse_valid for p in pairs) / n
    out["fidelity/status_agree"] = sum(p.status_agree for p in pairs) / n
    return out


def role_advantages(
    rows: Sequence[TrainRow], advantages: Sequence[float]
) -> dict[str, dict[str, float]]:
    """Per episode, the mean advantage of each role's rows (for ``Episode.meta``)."""
    sums: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row, adv in zip(rows, advantages, strict=True):
        sums[row.episode_id][str(row.role)].append(adv)
    return {
        ep: {role: sum(v) / len(v) for role, v in by_role.items()} for ep, by_role in sums.items()
    }


def step_metrics(
    episodes: Sequence[Episode],
    rows: Sequence[TrainRow],
    advantages: Sequence[float],
    success: Mapping[str, float],
    extra: Mapping[str, float],
) -> dict[str, float]:
    """All metrics of one step (``extra``: loss, timing and optimizer figures)."""
    out = rollout_metrics(episodes)
    out.update(reward_metrics(episodes, rows, success))
    out.update(advantage_metrics(rows, advantages))
    out.update(fidelity_metrics(episodes))
    out.update(collusion_metrics(episodes))
    out.update(extra)
    return out
