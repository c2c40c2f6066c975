"""Bootstrap intervals: hand-computed quantiles, degenerate cases, pairing."""

from __future__ import annotations

import pytest

from envace_engine.stats import bootstrap_mean, paired_by_task, paired_difference, quantile


def test_quantile_interpolates():
    assert quantile([0.0, 1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert quantile([0.0, 10.0], 0.25) == 2.5  # 0 + (10 - 0) * 0.25
    assert quantile([5.0], 0.975) == 5.0
    with pytest.raises(ValueError, match="no values"):
        quantile([], 0.5)


def test_constant_values_give_a_point_interval():
    est = bootstrap_mean([0.5] * 10, resamples=200, seed=0)
    assert (est.mean, est.low, est.high, est.n) == (0.5, 0.5, 0.5, 10)
    assert not est.excludes_zero or est.low > 0


def test_interval_contains_the_mean_and_is_seeded():
    values = [1.0, 0.0, 1.0, 1.0, 0.0, 0.5, 1.0, 0.0]
    est = bootstrap_mean(values, resamples=500, seed=3)
    assert est.mean == pytest.approx(4.5 / 8)
    assert est.low <= est.mean <= est.high and est.low >= 0.0 and est.high <= 1.0
    assert bootstrap_mean(values, 500, 3) == est
    assert bootstrap_mean(values, 500, 4) != est


def test_paired_difference_uses_the_same_tasks():
    a = [1.0, 1.0, 0.0, 1.0]
    b = [0.0, 1.0, 0.0, 0.0]
    est = paired_difference(a, b, resamples=300, seed=0)
    assert est.mean == pytest.approx(0.5)
    assert est.low >= 0.0  # every per-task difference is >= 0, so every resample mean is
    with pytest.raises(ValueError, match="same tasks"):
        paired_difference([1.0], [1.0, 0.0], 10, 0)
    with pytest.raises(ValueError, match="no tasks"):
        bootstrap_mean([], 10, 0)


def test_paired_by_task_pairs_the_shared_tasks_in_id_order():
    a = {"t2": 1.0, "t1": 0.5, "t3": 1.0}
    b = {"t1": 0.0, "t2": 1.0, "t9": 0.0}  # t3 and t9 are not shared: left out
    est = paired_by_task(a, b, resamples=500, seed=3)
    assert est == paired_difference([0.5, 1.0], [0.0, 1.0], resamples=500, seed=3)
    assert est is not None and est.n == 2 and est.mean == pytest.approx(0.25)
    assert paired_by_task(a, {"t9": 1.0}, resamples=500, seed=3) is None
