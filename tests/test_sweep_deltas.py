"""The sweep table's Δ vs N = 0: paired over tasks, per checkpoint, hand-computed."""

from __future__ import annotations

import pytest

from envace_engine.cli.eval import _delta_text, _sweep_rows, sweep_deltas
from envace_engine.testtime.evaluate import Setting, SweepPoint, TaskResult
from envace_engine.testtime.rehearsal import RehearsalMode

METRICS = {
    "sweep/success": 0.5,
    "sweep/reward": 0.5,
    "sweep/rehearsal_tokens": 0.0,
    "sweep/memory_tokens": 0.0,
    "sweep/act_tokens": 10.0,
    "sweep/wall_s": 1.0,
}


def _point(checkpoint: str, budget: int, successes: dict[str, int], repeats: int = 2) -> SweepPoint:
    tasks = tuple(
        TaskResult(task, (1.0,) * repeats, n, 10.0, 0.0, 0.0, 1.0) for task, n in successes.items()
    )
    setting = Setting(budget, RehearsalMode.SELECT if budget else RehearsalMode.PARALLEL)
    return SweepPoint(0, checkpoint, setting, METRICS, tasks)


def test_delta_is_paired_over_the_common_tasks_of_one_checkpoint() -> None:
    points = [
        _point("a", 0, {"t1": 2, "t2": 0, "t3": 1}),
        _point("a", 2, {"t1": 1, "t2": 2}),  # t3 not evaluated here: left out of the pairing
        _point("b", 2, {"t1": 2, "t2": 2}),  # no N = 0 point for b: no Δ
    ]
    deltas = sweep_deltas(points, resamples=2000, seed=0)
    assert set(deltas) == {1}
    est = deltas[1]
    # per-task Δ: t1 1/2 - 2/2 = -0.5, t2 2/2 - 0/2 = +1.0; mean +0.25 over n = 2 tasks.
    # Resampling 2 tasks gives means -0.5 (p 1/4), +0.25 (1/2), +1.0 (1/4): the 2.5 % and
    # 97.5 % quantiles are the extremes.
    assert est.n == 2
    assert est.mean == pytest.approx(0.25)
    assert (est.low, est.high) == (pytest.approx(-0.5), pytest.approx(1.0))


def test_sweep_rows_print_the_delta_only_where_there_is_one() -> None:
    points = [_point("a", 0, {"t1": 2}), _point("a", 2, {"t1": 1})]
    rows = _sweep_rows(points)
    assert [r["delta"] for r in rows] == ["-", "-0.500 [-0.500, -0.500]"]
    assert _delta_text(None) == "-"
