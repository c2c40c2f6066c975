"""Bootstrap confidence intervals over tasks (pure functions, seeded, no numpy needed).

Every figure of the study is a mean over held-out tasks of a per-task value (a task's success
rate over its repeats, or a paired difference between two settings on the same task). Tasks are
the unit that varies between studies, so the 95 % interval resamples *tasks* with replacement
(percentile bootstrap). Differences are paired: both settings were evaluated on the same
tasks, so each resample takes the same tasks for both.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

RESAMPLES = 2000  # task resamples behind a 95 % interval, unless a study config says otherwise


@dataclass(frozen=True)
class Estimate:
    """A mean over tasks and its 95 % percentile-bootstrap interval."""

    mean: float
    low: float
    high: float
    n: int

    def as_dict(self) -> dict[str, float]:
        """JSON-ready (``n`` as a float like the rest)."""
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": float(self.n)}

    @property
    def excludes_zero(self) -> bool:
        """Whether the interval lies strictly on one side of 0."""
        return self.low > 0 or self.high < 0


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of already sorted values (``q`` in [0, 1])."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def bootstrap_mean(values: Sequence[float], resamples: int, seed: int) -> Estimate:
    """Mean of per-task ``values`` with a 95 % interval from ``resamples`` task resamples."""
    if not values:
        raise ValueError("bootstrap of no tasks: evaluate at least one task")
    n = len(values)
    mean = sum(values) / n
    rng = random.Random(seed)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    return Estimate(mean, quantile(means, 0.025), quantile(means, 0.975), n)


def paired_difference(
    a: Sequence[float], b: Sequence[float], resamples: int, seed: int
) -> Estimate:
    """``mean(a - b)`` over tasks (a[i] and b[i] are the same task) with its interval."""
    if len(a) != len(b):
        raise ValueError(f"paired difference needs the same tasks: {len(a)} vs {len(b)} values")
    return bootstrap_mean([x - y for x, y in zip(a, b, strict=True)], resamples, seed)


def paired_by_task(
    a: Mapping[str, float], b: Mapping[str, float], resamples: int, seed: int
) -> Estimate | None:
    """``paired_difference`` of two per-task values (task id -> value) over the tasks both
    have, in task-id order; None when they share no task."""
    common = sorted(a.keys() & b.keys())
    if not common:
        return None
    return paired_difference([a[t] for t in common], [b[t] for t in common], resamples, seed)
