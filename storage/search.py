"""Search a run's text: act, rehearse, tool, real and user segments, with structured filters.

A hit is one segment (or one world-role generation, role ``rehearse``, from the rehearsals
table) whose text contains the query, case-insensitively, in an episode that passes the
filters: stop reason, reward range, a status mismatch (some call whose rehearsed status
differs from the real one) and a tool (some call of that tool). The query and every filter are
bound parameters, never spliced into the SQL. ``snippet`` cuts the text around the first match
and marks it for display.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import pandas as pd

from storage.queries import Database, bound

ROLES: tuple[str, ...] = ("act", "rehearse", "tool", "real", "user")
SEGMENT_ROLES = frozenset(ROLES) - {"rehearse"}


@dataclass(frozen=True)
class SearchQuery:
    """What to find in run ``run_id`` (None / empty: no filter)."""

    run_id: str
    text: str
    roles: tuple[str, ...] = ROLES
    stop_reason: str | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    status_mismatch: bool = False
    tool: str | None = None
    limit: int = 50

    def __post_init__(self) -> None:
        if not self.text.strip():
            raise ValueError("type something to search for")
        unknown = sorted(set(self.roles) - set(ROLES))
        if unknown or not self.roles:
            raise ValueError(f"roles {unknown or '(none)'}: choose from {', '.join(ROLES)}")


class Search:
    """Full-text search over stored turns and rehearsals."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def find(self, q: SearchQuery) -> pd.DataFrame:
        """Hits in run order: episode_id, step, task_id, reward, stop_reason, role, pos, text."""
        self._db.refresh()
        needle = q.text.strip().lower()
        parts, params = [], []
        segment_roles = [r for r in q.roles if r in SEGMENT_ROLES]
        if segment_roles:
            parts.append(
                "SELECT episode_id, role, seq AS pos, text FROM segments WHERE run_id = ? "
                "AND list_contains(?, role) AND contains(lower(text), ?)"
            )
            params += [q.run_id, segment_roles, needle]
        if "rehearse" in q.roles:
            parts.append(
                "SELECT episode_id, 'rehearse' AS role, rehearsal_index AS pos, text "
                "FROM rehearsals WHERE run_id = ? AND contains(lower(text), ?)"
            )
            params += [q.run_id, needle]
        where, more = _episode_filters(q)
        return self._db.sql(
            f"""SELECT h.episode_id, e.step, e.task_id, e.reward, e.stop_reason, h.role, h.pos,
            h.text FROM ({" UNION ALL ".join(parts)}) h
            JOIN episode_index e ON e.episode_id = h.episode_id WHERE {where}
            ORDER BY e.step, e.episode_index, h.role, h.pos LIMIT ?""",
            [*params, *more, q.limit],
        )


def _episode_filters(q: SearchQuery) -> tuple[str, list[Any]]:
    clauses, params = bound(
        (
            ("e.run_id = ?", q.run_id),
            ("e.stop_reason = ?", q.stop_reason),
            ("e.reward >= ?", q.reward_min),
            ("e.reward <= ?", q.reward_max),
        )
    )
    if q.status_mismatch:
        clauses.append(
            "e.episode_id IN (SELECT episode_id FROM call_index WHERE run_id = ? "
            "AND rehearsed_status IS NOT NULL AND rehearsed_status <> real_status)"
        )
        params.append(q.run_id)
    if q.tool:
        clauses.append(
            "e.episode_id IN (SELECT episode_id FROM call_index WHERE run_id = ? AND tool = ?)"
        )
        params += [q.run_id, q.tool]
    return " AND ".join(clauses), params


def snippet(text: str, query: str, width: int = 60) -> str:
    """HTML: up to ``width`` characters either side of the first match, the match marked."""
    at = text.lower().find(query.strip().lower())
    if at < 0:
        return html.escape(text[: 2 * width])
    end = at + len(query.strip())
    start, stop = max(0, at - width), min(len(text), end + width)
    return (
        ("…" if start else "")
        + html.escape(text[start:at])
        + f"<mark>{html.escape(text[at:end])}</mark>"
        + html.escape(text[end:stop])
        + ("…" if stop < len(text) else "")
    )
