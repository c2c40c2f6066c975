"""Two or more runs side by side: per-task success in each, and each run's pick of an episode.

``task_outcomes`` gives one row per task any of the runs attempted, with each run's success
rate on it (reward >= ``threshold``, the evaluation's success rule; None where the run never
tried the task) — from the native episode index, one grouped query. ``task_episode`` picks the
episode a comparison opens for a task in a run: its first success, else its first attempt.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from storage.queries import Database


class Comparison:
    """Per-task outcomes of several runs, side by side."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def task_outcomes(self, run_ids: Sequence[str], threshold: float = 1.0) -> pd.DataFrame:
        """Wide frame: ``task_id``, then one success-rate column per run (in ``run_ids`` order)."""
        if len(run_ids) < 2:
            raise ValueError("pick at least two runs to compare")
        self._db.refresh()
        long = self._db.sql(
            """SELECT task_id, run_id, avg(CASE WHEN reward >= ? THEN 1.0 ELSE 0.0 END) AS rate,
            count(*) AS n FROM episode_index WHERE list_contains(?, run_id)
            GROUP BY task_id, run_id""",
            [threshold, list(run_ids)],
        )
        if long.empty:
            return pd.DataFrame(columns=["task_id", *run_ids])
        wide = long.pivot(index="task_id", columns="run_id", values="rate")
        return wide.reindex(columns=list(run_ids)).reset_index().sort_values("task_id")

    def task_episode(self, run_id: str, task_id: str, threshold: float = 1.0) -> str | None:
        """The run's first successful episode on the task, else its first; None if untried."""
        self._db.refresh()
        found = self._db.sql(
            """SELECT episode_id FROM episode_index WHERE run_id = ? AND task_id = ?
            ORDER BY (reward >= ?) DESC, step, episode_index LIMIT 1""",
            [run_id, task_id, threshold],
        )
        return None if found.empty else str(found["episode_id"].iloc[0])
