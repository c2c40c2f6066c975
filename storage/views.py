"""DuckDB views over the runs' Parquet shards, one per table, guarded against empty globs.

``read_parquet('<root>/runs/*/<table>/*.parquet', union_by_name=true, filename=true)``, padded
with the columns older shards lack (``padded``), lets the studio query every run of every schema
version at once while jobs keep appending: each query lists the glob afresh, and
shards appear whole because they are renamed into place. DuckDB raises when a glob matches
nothing, so a table with no shard yet gets a typed empty view instead, swapped for the real one as
soon as a shard appears (``ViewSet.refresh``). View text cannot hold bound parameters, so the glob
is a quoted literal built from the store's own root path, never from user input.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import duckdb
import pyarrow as pa

from storage.layout import RUNS_DIR
from storage.schema import TABLES

log = logging.getLogger(__name__)
_DUCK_TYPES = {
    pa.string(): "VARCHAR",
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.float32(): "FLOAT",
    pa.float64(): "DOUBLE",
    pa.bool_(): "BOOLEAN",
}


def duck_type(kind: pa.DataType) -> str:
    """The DuckDB type name of an Arrow type used in storage.schema."""
    if pa.types.is_list(kind):
        return duck_type(kind.value_type) + "[]"
    return _DUCK_TYPES[kind]


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def empty_select(schema: pa.Schema) -> str:
    """A SELECT with the table's columns (and ``filename``) that returns no rows."""
    cols = [f"CAST(NULL AS {duck_type(f.type)}) AS {f.name}" for f in schema]
    cols.append("CAST(NULL AS VARCHAR) AS filename")
    return "SELECT " + ", ".join(cols) + " LIMIT 0"


def padded(source: str, table: str) -> str:
    """``source`` (a relation over ``table``'s shards) with every column of the current schema:
    a column a shard lacks because an older version wrote it (``schema.ADDED_IN``) reads as a
    typed null, so one query reads runs of every version. DuckDB keeps pushing filters into
    ``source``: the typed empty side has no rows to read."""
    return f"(SELECT * FROM {source} UNION ALL BY NAME ({empty_select(TABLES[table])}))"


def shard_rows(table: str, union: bool = True) -> str:
    """A relation over the shard files bound to one ``?`` (a path or a list of paths), padded
    to the current schema and with the ``filename`` column."""
    by_name = ", union_by_name=true" if union else ""
    return padded(f"read_parquet(?{by_name}, filename=true)", table)


class ViewSet:
    """Keeps one view per shard table in a DuckDB database pointed at ``<root>/runs``."""

    def __init__(self, db: duckdb.DuckDBPyConnection, root: Path) -> None:
        """Create every view now (empty where no shard exists yet)."""
        self._db = db
        self._root = root
        self._lock = threading.Lock()
        self._empty: set[str] = set(TABLES)
        self.refresh(force=True)

    def glob(self, table: str) -> str:
        """The shard glob of ``table`` across all runs."""
        return str(self._root / RUNS_DIR / "*" / table / "*.parquet")

    def _has_shards(self, table: str) -> bool:
        return any((self._root / RUNS_DIR).glob(f"*/{table}/*.parquet"))

    def _define(self, cur: duckdb.DuckDBPyConnection, table: str) -> None:
        empty = f"CREATE OR REPLACE VIEW {table} AS {empty_select(TABLES[table])}"
        if not self._has_shards(table):
            cur.execute(empty)
            self._empty.add(table)
            return
        self._empty.discard(table)
        glob = _quote(self.glob(table))
        try:
            source = f"read_parquet({glob}, union_by_name=true, filename=true)"
            cur.execute(f"CREATE OR REPLACE VIEW {table} AS SELECT * FROM {padded(source, table)}")
        except duckdb.Error as err:
            # A file that is not a shard (our writer never leaves half files) breaks the glob:
            # keep the studio up with an empty view and say which file, until the next open.
            log.warning("view %s is empty until %s is fixed: %s", table, self.glob(table), err)
            cur.execute(empty)

    def refresh(self, force: bool = False) -> None:
        """Point views at their globs once shards exist (all tables when ``force``)."""
        pending = set(TABLES) if force else set(self._empty)
        if not pending:
            return
        with self._lock:
            cur = self._db.cursor()
            try:
                for table in sorted(pending):
                    self._define(cur, table)
            finally:
                cur.close()
