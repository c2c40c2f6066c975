"""Inter-annotator agreement on the same items: observed agreement, Cohen's kappa, and per-label
(positive specific) agreement. Pure functions on (label by A, label by B) pairs.

Our own few lines rather than scikit-learn's ``cohen_kappa_score``: the studio would otherwise
depend on scikit-learn (and scipy) for one formula.

* observed ``p_o`` = share of items both gave the same label;
* chance ``p_e`` = sum over labels of (A's share of that label) x (B's share);
* ``kappa`` = (p_o - p_e) / (1 - p_e); 1 when both agree on every item, and defined as 1.0 when
  ``p_e`` = 1 (both always used the one same label);
* per label k: 2 n_kk / (n_A(k) + n_B(k)), the share of k-labels the other annotator matched.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Agreement:
    """Agreement of two annotators over ``n`` items both labelled."""

    n: int
    observed: float
    kappa: float
    per_label: dict[str, float]


def agreement(pairs: Sequence[tuple[str, str]]) -> Agreement:
    """Agreement statistics of ``pairs`` (one (label A, label B) per item); needs one item."""
    n = len(pairs)
    if n == 0:
        raise ValueError("agreement needs at least one item labelled by both annotators")
    a, b = Counter(x for x, _ in pairs), Counter(y for _, y in pairs)
    same = Counter(x for x, y in pairs if x == y)
    observed = sum(same.values()) / n
    chance = sum(a[k] * b[k] for k in a) / (n * n)
    kappa = 1.0 if chance == 1 else (observed - chance) / (1 - chance)
    labels = sorted(set(a) | set(b))
    per_label = {k: 2 * same[k] / (a[k] + b[k]) for k in labels}
    return Agreement(n, observed, kappa, per_label)
