"""Storage: Parquet shards written by jobs, and the studio's DuckDB store that reads them.

* ``RunWriter`` (job side, implements ``envace_engine.sink.Sink``): append-only shards per step.
* ``Store`` (studio side): the one owner of ``<root>/studio.duckdb``; views over every run's
  shards and the query verbs the pages need.

See docs/storage.md for the layout of a run directory and the concurrency design.
"""

from storage.queries import EpisodeFilter, EpisodeView, RunInfo
from storage.schema import SCHEMA_VERSION, SchemaVersionError
from storage.shards import RunWriter
from storage.store import Store, StoreLockedError

__all__ = [
    "SCHEMA_VERSION",
    "EpisodeFilter",
    "EpisodeView",
    "RunInfo",
    "RunWriter",
    "SchemaVersionError",
    "Store",
    "StoreLockedError",
]
