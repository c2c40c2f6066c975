"""Collusion over a run's steps, from what its shards store (``envace_engine.fidelity.collusion``).

The trainer logs the same rates as ``collusion/*`` metrics, but runs recorded before those
metrics (the bundled demo among them) hold everything the instruments need: each call's
arguments, rehearsed and real answers and which one the agent saw, and each episode's final
answers. So the studio computes them from the shards, for any run of any schema version, and
names per step the episode that colludes most (echoes, errors rehearsed as successes, an answer
taken from a wrong rehearsal), which the run page links to the inspector.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pandas as pd

from envace_engine.fidelity.collusion import COLLUSION_RATES, Collusion, collusion
from envace_engine.types import CallRecord, Episode, Mode, ToolCall, ToolError, ToolResult
from storage.queries import Database

COLUMNS = ["step", *COLLUSION_RATES, "pairs", "worst_episode", "worst_events"]


def _result(value_json: Any, error: Any) -> ToolResult | None:
    """A stored answer: an error code, a JSON value, or None (absent or not parsed)."""
    if isinstance(error, str):
        return ToolResult(error=ToolError(error, ""))
    if isinstance(value_json, str):
        return ToolResult(value=json.loads(value_json))
    return None


def _arguments(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text) if isinstance(text, str) else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def episodes_of(calls: pd.DataFrame, answers: pd.DataFrame) -> list[Episode]:
    """Episodes with just what the instruments read (calls and final answers), rebuilt from
    the rows of one step."""
    records: dict[str, list[CallRecord]] = {str(e): [] for e in answers["episode_id"]}
    for row in calls.itertuples(index=False):
        record = CallRecord(
            0,
            0,
            ToolCall(str(row.tool), _arguments(row.arguments_json)),
            str(row.shown),
            rehearsed=_result(row.rehearsed_json, row.rehearsed_error),
            real=_result(row.real_json, row.real_error),
        )
        records.setdefault(str(row.episode_id), []).append(record)
    finals = {str(e): tuple(a) if a is not None else () for e, a in answers.itertuples(index=False)}
    return [
        Episode(
            eid,
            "",
            "",
            Mode.REHEARSAL,
            "",
            (),
            calls=tuple(calls),
            final_answers=finals.get(eid, ()),
        )
        for eid, calls in records.items()
    ]


def events(c: Collusion) -> int:
    """How many colluding things one episode did (the worst episode has the most)."""
    return c.echoes + c.errors_rehearsed_as_success + c.episodes_taking_wrong_value


class CollusionRates:
    """The collusion rates of a run's steps."""

    def __init__(self, db: Database) -> None:
        self._db = db
        # (calls shard, its mtime) -> that step's row (None: no pairs). A step's shard is
        # written once, so a live run's page, redrawn every few seconds, reads only new steps.
        self._memo: dict[tuple[str, int], dict[str, Any] | None] = {}

    def over_steps(self, run_id: str) -> pd.DataFrame:
        """Per step with rehearsed-vs-real pairs: the four collusion rates (NaN where nothing
        counts), the pairs, and the step's worst episode with its count of colluding events."""
        self._db.refresh()
        memo = self._memo
        shards = self._db.sql(
            "SELECT DISTINCT step, filename FROM call_index WHERE run_id = ? ORDER BY step",
            [run_id],
        )
        keys = {
            int(r.step): (str(r.filename), _mtime(str(r.filename))) for r in shards.itertuples()
        }
        missing = [step for step, key in keys.items() if key not in memo]
        if missing:
            for step, row in self._collusion_steps(run_id, missing).items():
                memo[keys[step]] = row
        rows = [memo.get(keys[step]) for step in sorted(keys)]
        return pd.DataFrame([r for r in rows if r is not None], columns=COLUMNS)

    def _collusion_steps(self, run_id: str, steps: list[int]) -> dict[int, dict[str, Any] | None]:
        calls = self._db.sql(
            """SELECT step, episode_id, tool, arguments_json, shown, rehearsed_json,
            rehearsed_error, real_json, real_error FROM calls
            WHERE run_id = ? AND list_contains(?, step)
            ORDER BY step, episode_index, call_index""",
            [run_id, steps],
        )
        answers = self._db.sql(
            """SELECT step, episode_id, final_answers FROM episode_index
            WHERE run_id = ? AND list_contains(?, step)""",
            [run_id, steps],
        )
        out: dict[int, dict[str, Any] | None] = {step: None for step in steps}
        for step, part in calls.groupby("step", sort=True):
            mine = answers[answers["step"] == step][["episode_id", "final_answers"]]
            out[int(step)] = step_row(int(step), episodes_of(part, mine))
        return out


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return -1


def step_row(step: int, episodes: list[Episode]) -> dict[str, Any] | None:
    """One step's rates, pairs and worst episode (None when it has no pairs)."""
    total = collusion(episodes)
    if not total.pairs:
        return None
    worst = max(episodes, key=lambda e: events(collusion([e])))
    n = events(collusion([worst]))
    return {
        "step": step,
        **{k: total.rates().get(k, float("nan")) for k in COLLUSION_RATES},
        "pairs": total.pairs,
        "worst_episode": worst.id if n else None,
        "worst_events": n,
    }
