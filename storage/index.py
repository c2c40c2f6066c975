"""``ShardIndex``: native DuckDB copies of the small, hot columns of the episode and call shards.

The episode list, the pairs page and their aggregates filter and sort every row of a run; read
from Parquet that means decoding every shard on every page turn, which grows with the run. So the
studio keeps two derived tables in its own database — every ``episodes`` column, and the
``calls`` columns without the long JSON texts — plus ``indexed_shards`` (path, mtime), and
brings them up to date before each query:

* a run's ``episodes/`` or ``calls/`` folder is listed only when its mtime changed (a rename into
  a folder changes it), or when that mtime is under ``RACY_S`` old, because a second rename in the
  same clock tick would not change it again;
* a new or replaced shard is (re)loaded and a vanished one dropped, in one transaction per folder,
  so a reader sees a shard's rows all or none.

Pages take their keys from these tables and fetch the full rows (segments, JSON texts) from the
few Parquet files that hold them. The index is a cache: deleting it loses nothing.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import duckdb

from storage.layout import RUNS_DIR
from storage.schema import CALLS, EPISODES
from storage.views import duck_type, shard_rows

log = logging.getLogger(__name__)
RACY_S = 2.0
LONG_CALL_COLUMNS = frozenset(
    {
        "arguments_json",
        "raw",
        "rehearsed_json",
        "real_json",
        "simulated_json",
        "rehearsed_message",
        "real_message",
        "simulated_message",
        "checked_json",
        "checked_message",
    }
)
INDEXED = {
    "episodes": ("episode_index", [f for f in EPISODES]),
    "calls": ("call_index", [f for f in CALLS if f.name not in LONG_CALL_COLUMNS]),
}


def _list_shards(folder: Path) -> dict[str, int]:
    """{path: mtime_ns} of the visible shards in ``folder`` (temporary files excluded)."""
    found = {}
    with os.scandir(folder) as entries:
        for entry in entries:
            if not entry.name.endswith(".parquet") or entry.name.startswith("."):
                continue
            try:
                found[entry.path] = entry.stat().st_mtime_ns
            except FileNotFoundError:  # replaced between listing and stat: seen next time
                continue
    return found


class ShardIndex:
    """Keeps ``episode_index`` and ``call_index`` in step with the shards under ``<root>/runs``."""

    def __init__(self, db: duckdb.DuckDBPyConnection, root: Path) -> None:
        """Create the index tables if needed; the first ``sync`` loads what is missing."""
        self._db = db
        self._runs = root / RUNS_DIR
        self._lock = threading.Lock()
        self._seen: dict[Path, int] = {}  # folder -> mtime_ns when it was last fully indexed
        self._runs_seen: frozenset[Path] | None = None  # run folders at the last sync
        self._known: dict[Path, dict[str, int]] = {}  # folder -> {shard path: mtime_ns} indexed
        self._failed: dict[str, str] = {}  # shard path -> why it could not be indexed
        cur = db.cursor()
        try:
            cur.execute(
                "CREATE TABLE IF NOT EXISTS indexed_shards (filename VARCHAR PRIMARY KEY, "
                "source VARCHAR, mtime_ns BIGINT)"
            )
            for name, fields in INDEXED.values():
                cols = ", ".join(f"{f.name} {duck_type(f.type)}" for f in fields)
                cur.execute(f"CREATE TABLE IF NOT EXISTS {name} ({cols}, filename VARCHAR)")
        finally:
            cur.close()

    def sync(self) -> None:
        """Index new and replaced shards, drop vanished ones (cheap when nothing changed)."""
        with self._lock:
            folders = frozenset(p for p in self._runs.glob("*/") if p.is_dir())
            for source in INDEXED:
                for run in folders:
                    self._sync_folder(run / source, source)
                if folders != self._runs_seen:  # a run folder appeared or went away
                    self._drop_vanished_runs(source, {str(run / source) for run in folders})
            self._runs_seen = folders

    def _sync_folder(self, folder: Path, source: str) -> None:
        try:
            mtime = folder.stat().st_mtime_ns
        except FileNotFoundError:
            return
        racy = time.time() - mtime / 1e9 < RACY_S
        if self._seen.get(folder) == mtime and not racy:
            return
        try:
            on_disk = _list_shards(folder)
        except FileNotFoundError:  # the run was deleted while we looked
            return
        known = self._known.get(folder)
        cur = self._db.cursor()
        try:
            if known is None:  # first look since the studio started: ask the database
                known = dict(
                    cur.execute(
                        "SELECT filename, mtime_ns FROM indexed_shards WHERE source = ? "
                        "AND parse_dirpath(filename) = ?",
                        [source, str(folder)],
                    ).fetchall()
                )
            stale = [f for f, m in known.items() if on_disk.get(f) != m]
            fresh = [f for f, m in on_disk.items() if known.get(f) != m]
            if stale or fresh:
                self._load(cur, source, stale, fresh, on_disk)
        finally:
            cur.close()
        self._known[folder] = on_disk
        self._seen[folder] = mtime

    def _load(
        self,
        cur: duckdb.DuckDBPyConnection,
        source: str,
        stale: list[str],
        fresh: list[str],
        mtimes: dict[str, int],
    ) -> None:
        try:
            self._apply(cur, source, stale, fresh, mtimes)
            return
        except duckdb.Error:
            pass  # one unreadable file must not hide the others: load them one by one
        self._apply(cur, source, stale, [], mtimes)
        for shard in fresh:
            try:
                self._apply(cur, source, [], [shard], mtimes)
            except duckdb.Error as err:
                # Not ours or damaged (our writer never leaves half files): skip it until it
                # changes, and say so once.
                log.warning("not indexing %s: %s", shard, err)
                self._failed[shard] = str(err).splitlines()[0]

    def _apply(
        self,
        cur: duckdb.DuckDBPyConnection,
        source: str,
        stale: list[str],
        fresh: list[str],
        mtimes: dict[str, int],
    ) -> None:
        table, fields = INDEXED[source]
        names = ", ".join(f.name for f in fields)
        cur.execute("BEGIN TRANSACTION")
        try:
            for files in (stale, fresh):
                if files:
                    cur.execute(f"DELETE FROM {table} WHERE list_contains(?, filename)", [files])
                    cur.execute(
                        "DELETE FROM indexed_shards WHERE list_contains(?, filename)", [files]
                    )
            for shard in (*stale, *fresh):
                self._failed.pop(shard, None)
            if fresh:
                cur.execute(
                    f"INSERT INTO {table} SELECT {names}, filename FROM {shard_rows(source)}",
                    [fresh],
                )
                cur.executemany(
                    "INSERT INTO indexed_shards VALUES (?, ?, ?)",
                    [[f, source, mtimes[f]] for f in fresh],
                )
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise

    def failures(self) -> dict[str, str]:
        """{shard path: reason} of the shards the last syncs could not index (their rows are
        missing from every page until the file changes)."""
        with self._lock:
            return {f: why for f, why in self._failed.items() if Path(f).exists()}

    def _drop_vanished_runs(self, source: str, live_folders: set[str]) -> None:
        cur = self._db.cursor()
        try:
            rows = cur.execute(
                "SELECT DISTINCT parse_dirpath(filename) FROM indexed_shards WHERE source = ?",
                [source],
            ).fetchall()
            gone = [folder for (folder,) in rows if folder not in live_folders]
            for folder in gone:
                files = [
                    f
                    for (f,) in cur.execute(
                        "SELECT filename FROM indexed_shards WHERE parse_dirpath(filename) = ?",
                        [folder],
                    ).fetchall()
                ]
                self._apply(cur, source, files, [], {})
                self._seen.pop(Path(folder), None)
                self._known.pop(Path(folder), None)
        finally:
            cur.close()
