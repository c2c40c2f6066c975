"""The read verbs the studio pages call: runs, curves, episodes, one episode, pairs, labels.

Every query is parameterised SQL over the studio tables, the native shard index
(storage.index: episode rows and call keys/tiers) and the shard views (storage.views: turns,
rehearsals, metrics). Lists are paginated with ``limit``/``offset`` in a stable order (run,
step, position); a page of pairs or one episode's turns is then read from the few Parquet files
that hold it. ``Store`` inherits these and supplies ``sql`` (one cursor per query),
``refresh`` and the run scan; ``@fresh`` verbs see every shard renamed into place before them.
The smaller groups of verbs (the queue, search, run comparison, collusion) are objects of their
own over the ``Database`` protocol, held by the store (``store.queue``, ...).

The current label of a target is its newest annotation (history is append-only); an episode's
labels include those of its calls.
"""

from __future__ import annotations

import functools
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pandas as pd

from envace_engine.types import MetaKey
from storage.layout import RunManifest, RunProgress, read_manifest, read_progress
from storage.schema import CALLS
from storage.views import empty_select, shard_rows

T = TypeVar("T")


def bound(pairs: Sequence[tuple[str, Any]]) -> tuple[list[str], list[Any]]:
    """The (clause, value) pairs whose value is not None: their clauses, and the values to bind
    to their ``?`` in order (a filter left empty adds nothing)."""
    kept = [(clause, value) for clause, value in pairs if value is not None]
    return [c for c, _ in kept], [v for _, v in kept]


# The newest annotation per target of a run: what "the label" of a call or episode means
# (episode ids repeat across runs, so a target is (run_id, target_id)).
LATEST_LABELS = """(SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY run_id, target_kind,
    target_id ORDER BY created_at DESC) AS rn FROM annotations) WHERE rn = 1)"""
EPISODE_COLUMNS = """e.episode_id, e.run_id, e.step, e.episode_index, e.task_id, e.suite, e.mode,
    e.group_id, e.reward, e.stop_reason, e.stop_detail, e.n_calls, e.n_segments, e.n_rehearsals,
    e.n_tokens, e.mean_fidelity, e.adv_act, e.adv_rehearse, e.drift"""
PAIR_COLUMNS = """c.call_id, c.run_id, c.step, c.episode_id, c.call_index, c.turn, c.tool,
    c.arguments_json, c.pair_source, c.rehearsed_json, c.rehearsed_error, c.rehearsed_message,
    c.simulated_json, c.simulated_error, c.real_json, c.real_error, c.real_message,
    c.rehearsed_status, c.real_status, c.parse_valid, c.status_agree, c.error_code_agree, c.exact,
    c.key_jaccard, c.value_match, c.text_similarity, c.fidelity, c.real_nll"""
TIER_AGGREGATES = """count(*) AS n, avg(fidelity) AS mean_fidelity,
    avg(parse_valid::INT) AS parse_valid, avg(status_agree::INT) AS status_agree,
    avg(error_code_agree::INT) AS error_code_agree, avg(exact::INT) AS exact,
    avg(key_jaccard) AS key_jaccard, avg(value_match) AS value_match,
    avg(text_similarity) AS text_similarity, avg(real_nll) AS real_nll"""


class AmbiguousEpisodeError(ValueError):
    """An episode id asked without a run is in several runs (ids repeat across runs)."""

    def __init__(self, episode_id: str, runs: Sequence[str]) -> None:
        """Name the episode and every run that holds it."""
        self.runs = tuple(runs)
        super().__init__(
            f"episode {episode_id!r} is in {len(self.runs)} runs ({', '.join(self.runs)}): "
            "say which run (run_id, or &run= in a link)"
        )


@dataclass(frozen=True)
class RunInfo:
    """One run: its manifest, live progress and the folder it lives in."""

    manifest: RunManifest
    progress: RunProgress
    path: Path


@dataclass(frozen=True)
class EpisodeView:
    """Everything the trajectory inspector shows for one episode.

    ``segments`` are ordered by position in the agent context; ``calls`` carry the rehearsed,
    real and simulated answers with their fidelity tiers; ``rehearsals`` the world-role
    generations (``call_index`` links each to its call).
    """

    episode: dict[str, Any]
    segments: pd.DataFrame
    calls: pd.DataFrame
    rehearsals: pd.DataFrame
    advantages: dict[str, float] | None
    labels: pd.DataFrame


@dataclass(frozen=True)
class EpisodeFilter:
    """Filters of the episode list; None means "any". ``text`` is a case-insensitive substring."""

    run_id: str | None = None
    step: int | None = None
    suite: str | None = None
    task: str | None = None
    stop_reason: str | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    fidelity_min: float | None = None
    fidelity_max: float | None = None
    label: str | None = None
    text: str | None = None
    role: str | None = None

    def where(self) -> tuple[str, list[Any]]:
        """A WHERE clause over alias ``e`` (episodes) and its parameters."""
        clauses, params = bound(
            (
                ("e.run_id = ?", self.run_id),
                ("e.step = ?", self.step),
                ("e.suite = ?", self.suite),
                ("e.task_id = ?", self.task),
                ("e.stop_reason = ?", self.stop_reason),
                ("e.reward >= ?", self.reward_min),
                ("e.reward <= ?", self.reward_max),
                ("e.mean_fidelity >= ?", self.fidelity_min),
                ("e.mean_fidelity <= ?", self.fidelity_max),
            )
        )
        if self.label is not None:
            clauses.append(
                f"EXISTS (SELECT 1 FROM {LATEST_LABELS} x WHERE x.run_id = e.run_id "
                "AND x.episode_id = e.episode_id AND x.label = ?)"
            )
            params.append(self.label)
        if self.text is not None or self.role is not None:
            clause, more = self._text_clause()
            clauses.append(clause)
            params.extend(more)
        return ("WHERE " + " AND ".join(clauses)) if clauses else "", params

    def _text_clause(self) -> tuple[str, list[Any]]:
        # Rehearse tokens live in their own sequences (the rehearsals table), all else in segments.
        source = "rehearsals" if self.role == "rehearse" else "segments"
        inner, params = [], []
        if self.role is not None and source == "segments":
            inner.append("role = ?")
            params.append(self.role)
        if self.text is not None:
            inner.append("contains(lower(text), ?)")
            params.append(self.text.lower())
        if self.run_id is not None:  # lets DuckDB skip other runs' row groups by statistics
            inner.append("run_id = ?")
            params.append(self.run_id)
        where = " AND ".join(inner) or "TRUE"
        clause = f"e.episode_id IN (SELECT episode_id FROM {source} WHERE {where})"
        if self.text is not None and self.role is None:
            clause = f"(contains(lower(e.task_id), ?) OR {clause})"
            params.insert(0, self.text.lower())
        return clause, params


def fresh(method: Callable[..., T]) -> Callable[..., T]:
    """Bring views and the shard index up to date once before a read verb runs."""

    @functools.wraps(method)
    def wrapper(self: Queries, *args: Any, **kwargs: Any) -> T:
        self.refresh()
        return method(self, *args, **kwargs)

    return wrapper


def _order(alias: str, run_id: str | None) -> str:
    """List order: run, step, position in the step (integer keys only within one run)."""
    keys = f"{alias}.step, {alias}.episode_index"
    return keys if run_id is not None else f"{alias}.run_id, {keys}"


def _page(limit: int, offset: int) -> list[int]:
    if limit < 1 or offset < 0:
        raise ValueError(f"need limit >= 1 and offset >= 0, got limit={limit}, offset={offset}")
    return [limit, offset]


def _sibling(episodes_shard: str, table: str) -> str:
    path = Path(episodes_shard)
    return str(path.parent.parent / table / path.name)


class Database(Protocol):
    """What the query objects read through (``Store``): parameterised SQL over the studio
    tables, the shard index and views, and bringing those up to date with the run folders."""

    def sql(self, query: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        """Every row of one parameterised query."""
        ...

    def refresh(self) -> None:
        """Views and shard index up to date with the run folders (once per read verb)."""
        ...


class Queries(ABC):
    """Read verbs; the concrete store provides ``sql``, ``refresh``, ``scan_runs`` and
    ``run_path``."""

    @abstractmethod
    def sql(self, query: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        """Every row of one parameterised query."""

    @abstractmethod
    def refresh(self) -> None:
        """Views and shard index up to date with the run folders."""

    @abstractmethod
    def scan_runs(self) -> list[RunManifest]:
        """Manifests of every run."""

    @abstractmethod
    def run_path(self, run_id: str) -> Path:
        """A run's folder."""

    def _progress_frame(self, manifests: Sequence[RunManifest]) -> pd.DataFrame:
        raise NotImplementedError

    # -- runs and curves ------------------------------------------------------------------------

    @fresh
    def runs(self) -> pd.DataFrame:
        """One row per run: manifest, episode aggregates and live progress, newest first."""
        manifests = self.scan_runs()
        base = pd.DataFrame(
            [
                {k: getattr(m, k) for k in ("run_id", "kind", "model", "suite", "created_at")}
                for m in manifests
            ],
            columns=["run_id", "kind", "model", "suite", "created_at"],
        )
        stats = self.sql(
            "SELECT run_id, count(DISTINCT step) AS steps, count(*) AS episodes, "
            "avg(reward) AS mean_reward FROM episode_index GROUP BY run_id"
        )
        out = base.merge(stats, on="run_id", how="left")
        if manifests:
            out = out.merge(self._progress_frame(manifests), on="run_id", how="left")
        out[["steps", "episodes"]] = out[["steps", "episodes"]].fillna(0).astype(int)
        return out.sort_values("created_at", ascending=False, ignore_index=True)

    def run(self, run_id: str) -> RunInfo:
        """One run's manifest and progress (``KeyError`` if unknown)."""
        path = self.run_path(run_id)
        return RunInfo(read_manifest(path), read_progress(path), path)

    @fresh
    def curves(self, run_id: str) -> pd.DataFrame:
        """Step metrics in long form [step, name, value], by name then step."""
        return self.sql(
            "SELECT step, name, value FROM metrics WHERE run_id = ? ORDER BY name, step", [run_id]
        )

    def sweep_results(self, run_id: str) -> pd.DataFrame:
        """A sweep run's metrics, one row per step and one column per metric name."""
        long = self.curves(run_id)
        if long.empty:
            return pd.DataFrame({"step": pd.Series(dtype="int32")})
        return long.pivot_table(index="step", columns="name", values="value").reset_index()

    # -- episodes -------------------------------------------------------------------------------

    @fresh
    def episodes(self, limit: int = 50, offset: int = 0, **filters: Any) -> pd.DataFrame:
        """A page of episodes matching ``filters`` (EpisodeFilter fields), with current labels."""
        where, params = EpisodeFilter(**filters).where()
        return self.sql(
            f"""SELECT {EPISODE_COLUMNS}, l.label FROM episode_index e
            LEFT JOIN {LATEST_LABELS} l ON l.target_kind = 'episode' AND l.run_id = e.run_id
                AND l.target_id = e.episode_id
            {where} ORDER BY {_order("e", filters.get("run_id"))} LIMIT ? OFFSET ?""",
            params + _page(limit, offset),
        )

    @fresh
    def count_episodes(self, **filters: Any) -> int:
        """How many episodes match ``filters`` (for the pager)."""
        where, params = EpisodeFilter(**filters).where()
        return int(
            self.sql(f"SELECT count(*) AS n FROM episode_index e {where}", params)["n"].iloc[0]
        )

    @fresh
    def episode(self, episode_id: str, run_id: str | None = None) -> EpisodeView:
        """One episode with its ordered turns, calls, rehearsals, advantages and labels.

        Episode ids are unique within a run, not across runs (two runs of one config reuse
        them): pass ``run_id`` to say which run's. Without it the id must be in one run only,
        else ``AmbiguousEpisodeError`` names the runs that hold it."""
        rows = self.sql(
            f"""SELECT * FROM episode_index e WHERE episode_id = ? AND (? IS NULL OR run_id = ?)
            ORDER BY {_order("e", None)}""",
            [episode_id, run_id, run_id],
        )
        if rows.empty:
            where = f"run {run_id!r}" if run_id else "any run"
            raise KeyError(f"no episode {episode_id!r} in {where}")
        if rows["run_id"].nunique() > 1:
            raise AmbiguousEpisodeError(episode_id, sorted(rows["run_id"].unique()))
        row = rows.iloc[0].to_dict()
        shard = str(row.pop("filename"))
        # Sibling shards of the same step hold its turns: read one file, not the whole glob.
        parts = {
            table: self.sql(
                "SELECT * EXCLUDE (run_id, step, episode_id, episode_index, filename) FROM "
                f"{shard_rows(table, union=False)} "
                f"WHERE episode_index = ? AND episode_id = ? ORDER BY {order}",
                [_sibling(shard, table), int(row["episode_index"]), episode_id],
            )
            for table, order in (
                ("segments", "seq"),
                ("calls", "call_index"),
                ("rehearsals", "rehearsal_index"),
            )
        }
        advantages = json.loads(row.get("meta_json") or "{}").get(MetaKey.ADVANTAGES)
        return EpisodeView(
            episode=row,
            segments=parts["segments"],
            calls=parts["calls"],
            rehearsals=parts["rehearsals"],
            advantages=advantages,
            labels=self.sql(
                "SELECT * FROM annotations WHERE episode_id = ? AND run_id = ? "
                "ORDER BY created_at DESC",
                [episode_id, str(row["run_id"])],
            ),
        )

    @fresh
    def next_failure(self, run_id: str, after_episode_id: str | None = None) -> str | None:
        """The next episode (in list order) with reward < 1, no reward, or a non-done stop."""
        after, params = "", [run_id]
        if after_episode_id is not None:
            after = """AND (step, episode_index) > (SELECT (step, episode_index) FROM episode_index
                WHERE episode_id = ? AND run_id = ?)"""
            params += [after_episode_id, run_id]
        found = self.sql(
            f"""SELECT episode_id FROM episode_index WHERE run_id = ? {after}
            AND (reward IS NULL OR reward < 1 OR stop_reason <> 'done')
            ORDER BY step, episode_index LIMIT 1""",
            params,
        )
        return None if found.empty else str(found["episode_id"].iloc[0])

    # -- rehearsed vs real pairs ----------------------------------------------------------------

    @fresh
    def pairs(
        self,
        run_id: str | None = None,
        step: int | None = None,
        tool: str | None = None,
        status: str | None = None,
        fidelity_min: float | None = None,
        fidelity_max: float | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> pd.DataFrame:
        """A page of scored (rehearsed or simulated, real) pairs; ``status`` is the real one."""
        clauses, params = bound(
            (
                ("c.run_id = ?", run_id),
                ("c.step = ?", step),
                ("c.tool = ?", tool),
                ("c.real_status = ?", status),
                ("c.fidelity >= ?", fidelity_min),
                ("c.fidelity <= ?", fidelity_max),
            )
        )
        clauses.insert(0, "c.pair_source IS NOT NULL")
        # Keys of the page from the native index, then full rows from the few shards holding them.
        page = self.sql(
            f"""SELECT c.call_id, c.filename FROM call_index c WHERE {" AND ".join(clauses)}
            ORDER BY {_order("c", run_id)}, c.call_index LIMIT ? OFFSET ?""",
            params + _page(limit, offset),
        )
        ids = list(page["call_id"])
        # An empty page still needs the columns: select them from a typed empty relation.
        source = shard_rows("calls") if ids else f"({empty_select(CALLS)})"
        files = [sorted(set(page["filename"]))] if ids else []
        return self.sql(
            f"""SELECT {PAIR_COLUMNS}, l.label FROM {source} c
            LEFT JOIN {LATEST_LABELS} l ON l.target_kind = 'call' AND l.run_id = c.run_id
                AND l.target_id = c.call_id
            WHERE list_contains(?, c.call_id) ORDER BY list_position(?, c.call_id)""",
            [*files, ids, ids],
        )

    def _pair_groups(self, run_id: str, key: str) -> pd.DataFrame:
        return self.sql(
            f"""SELECT {key}, {TIER_AGGREGATES} FROM call_index
            WHERE run_id = ? AND pair_source IS NOT NULL GROUP BY {key} ORDER BY {key}""",
            [run_id],
        )

    @fresh
    def fidelity_by_run(self) -> pd.DataFrame:
        """Mean of every fidelity tier per run (all runs)."""
        return self.sql(
            f"""SELECT run_id, {TIER_AGGREGATES} FROM call_index
            WHERE pair_source IS NOT NULL GROUP BY run_id ORDER BY run_id"""
        )

    @fresh
    def fidelity_by_tool(self, run_id: str) -> pd.DataFrame:
        """Mean of every fidelity tier per tool."""
        return self._pair_groups(run_id, "tool")

    @fresh
    def fidelity_by_status(self, run_id: str) -> pd.DataFrame:
        """Mean of every fidelity tier per real status (ok / error)."""
        return self._pair_groups(run_id, "real_status")

    @fresh
    def fidelity_over_steps(self, run_id: str) -> pd.DataFrame:
        """Mean of every fidelity tier per step (the fidelity curve)."""
        return self._pair_groups(run_id, "step")

    @fresh
    def status_confusion(self, run_id: str) -> pd.DataFrame:
        """Counts of (predicted status, real status); a missing prediction reads "missing"."""
        return self.sql(
            """SELECT coalesce(CASE WHEN pair_source = 'simulated' THEN
                CASE WHEN simulated_error IS NULL THEN 'ok' ELSE 'error' END
                ELSE rehearsed_status END, 'missing') AS predicted_status,
            real_status, count(*) AS n FROM call_index
            WHERE run_id = ? AND pair_source IS NOT NULL
            GROUP BY ALL ORDER BY predicted_status, real_status""",
            [run_id],
        )

    # -- annotations ----------------------------------------------------------------------------

    def annotations(self, target_id: str | None = None, run_id: str | None = None) -> pd.DataFrame:
        """Annotation history, newest first (every label ever given; nothing is overwritten)."""
        clauses, params = bound((("target_id = ?", target_id), ("run_id = ?", run_id)))
        where = "WHERE " + " AND ".join(clauses) if clauses else ""
        return self.sql(f"SELECT * FROM annotations {where} ORDER BY created_at DESC", params)

    def export_labels(self, run_id: str | None = None) -> pd.DataFrame:
        """Every annotation with ``is_current`` marking the newest per target (for export)."""
        where, params = ("WHERE run_id = ?", [run_id]) if run_id else ("", [])
        return self.sql(
            f"""SELECT * EXCLUDE (rn), rn = 1 AS is_current FROM (SELECT *, row_number() OVER
            (PARTITION BY run_id, target_kind, target_id ORDER BY created_at DESC) AS rn
            FROM annotations {where}) ORDER BY run_id, target_kind, target_id, created_at""",
            params,
        )


__all__ = ["AmbiguousEpisodeError", "EpisodeFilter", "EpisodeView", "Queries", "RunInfo"]
