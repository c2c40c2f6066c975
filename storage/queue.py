"""The annotation queue: one scored rehearsed-vs-real pair at a time, in run order, filtered.

Items are a run's scored pairs (``call_index`` rows with a pair), filtered by tool, rehearsed
and real status and a fidelity range, and by scope: ``unlabelled`` (no label by me yet),
``others`` (labelled by someone else, not by me: a second opinion for agreement) or ``all``.
``Queue.next`` walks them by key (step, episode_index, call_index) after the current one, so a
step is one indexed query however large the run; ``back`` steps to the previous item of the
same filters whatever its labels (the one just labelled drops out of ``unlabelled``). Labels are
the annotations table's, whose author is the signed-in user; several authors on one item give
``agreement`` (``storage.agreement``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd

from storage.agreement import Agreement, agreement
from storage.queries import Database, bound

Scope = Literal["unlabelled", "others", "all"]
SCOPES: tuple[str, ...] = ("unlabelled", "others", "all")
# the newest label per (run, call, author): an author who changed their mind counts once
AUTHOR_LABELS = """(SELECT run_id, target_id, author, label FROM (SELECT *, row_number() OVER
    (PARTITION BY run_id, target_id, author ORDER BY created_at DESC) AS rn FROM annotations
    WHERE target_kind = 'call') WHERE rn = 1)"""


@dataclass(frozen=True)
class QueueFilter:
    """Which pairs of a run the queue holds (None: any)."""

    run_id: str
    author: str
    tool: str | None = None
    rehearsed_status: str | None = None
    real_status: str | None = None
    fidelity_min: float | None = None
    fidelity_max: float | None = None
    scope: Scope = "unlabelled"

    def where(self, with_scope: bool = True) -> tuple[str, list[Any]]:
        """WHERE clause over ``call_index c`` and its parameters (values are bound, never
        spliced into the SQL)."""
        clauses, params = bound(
            (
                ("c.run_id = ?", self.run_id),
                ("c.tool = ?", self.tool),
                ("c.rehearsed_status = ?", self.rehearsed_status),
                ("c.real_status = ?", self.real_status),
                ("c.fidelity >= ?", self.fidelity_min),
                ("c.fidelity <= ?", self.fidelity_max),
            )
        )
        clauses.append("c.pair_source IS NOT NULL")
        if with_scope and self.scope != "all":
            mine = (
                f"EXISTS (SELECT 1 FROM {AUTHOR_LABELS} m "
                "WHERE m.run_id = c.run_id AND m.target_id = c.call_id AND m.author = ?)"
            )
            clauses.append(f"NOT {mine}")
            params.append(self.author)
            if self.scope == "others":
                clauses.append(
                    f"EXISTS (SELECT 1 FROM {AUTHOR_LABELS} o WHERE o.run_id = c.run_id "
                    "AND o.target_id = c.call_id AND o.author <> ?)"
                )
                params.append(self.author)
        return " AND ".join(clauses), params


KEY = "(c.step, c.episode_index, c.call_index)"


class Queue:
    """The annotation queue's verbs over the store's database."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def next(self, f: QueueFilter, after: str | None = None, back: bool = False) -> str | None:
        """The call id after (or, ``back``, before) call ``after`` in the queue; None at the
        end. With no ``after`` the first (or last) item."""
        self._db.refresh()
        where, params = f.where(with_scope=not back)
        if after is not None:
            key = self._db.sql(
                "SELECT step, episode_index, call_index FROM call_index "
                "WHERE run_id = ? AND call_id = ?",
                [f.run_id, after],  # call ids repeat across runs: the queue's run's
            )
            if key.empty:
                raise KeyError(f"no call {after!r} in run {f.run_id!r} (was it deleted?)")
            where += f" AND {KEY} {'<' if back else '>'} (?, ?, ?)"
            params += [int(v) for v in key.iloc[0]]
        order = "DESC" if back else "ASC"
        found = self._db.sql(
            f"SELECT c.call_id FROM call_index c WHERE {where} "
            f"ORDER BY c.step {order}, c.episode_index {order}, c.call_index {order} LIMIT 1",
            params,
        )
        return None if found.empty else str(found["call_id"].iloc[0])

    def progress(self, f: QueueFilter) -> tuple[int, int]:
        """(items of the filters labelled by ``f.author``, items of the filters)."""
        self._db.refresh()
        where, params = f.where(with_scope=False)
        row = self._db.sql(
            f"""SELECT count(*) AS total, count(m.target_id) AS mine FROM call_index c
            LEFT JOIN {AUTHOR_LABELS} m ON m.run_id = c.run_id AND m.target_id = c.call_id
                AND m.author = ?
            WHERE {where}""",
            [f.author, *params],
        ).iloc[0]
        return int(row["mine"]), int(row["total"])

    def author_labels(self, run_id: str) -> pd.DataFrame:
        """(target_id, author, label): each author's newest label on each call of the run."""
        self._db.refresh()
        return self._db.sql(
            f"""SELECT l.target_id, l.author, l.label FROM {AUTHOR_LABELS} l
            JOIN call_index c ON c.run_id = l.run_id AND c.call_id = l.target_id
            WHERE c.run_id = ?
            ORDER BY l.target_id, l.author""",
            [run_id],
        )

    def agreement(self, run_id: str) -> dict[tuple[str, str], Agreement]:
        """Agreement of every two authors over the run's calls both labelled."""
        labels = self.author_labels(run_id)
        by_author: dict[str, dict[str, str]] = {}
        for row in labels.itertuples():
            by_author.setdefault(str(row.author), {})[str(row.target_id)] = str(row.label)
        out: dict[tuple[str, str], Agreement] = {}
        authors = sorted(by_author)
        for i, a in enumerate(authors):
            for b in authors[i + 1 :]:
                shared = sorted(set(by_author[a]) & set(by_author[b]))
                if shared:
                    out[(a, b)] = agreement([(by_author[a][t], by_author[b][t]) for t in shared])
        return out
