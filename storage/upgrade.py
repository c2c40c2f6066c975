"""Rewrite a run written by an older schema version in the current layout.

Readers already read every older version (``storage.views.padded``), so upgrading is never
needed to open a run; it exists for runs that are shipped (the bundled demo) or handed to a tool
that reads the Parquet files directly and expects every current column. Each shard that lacks a
column gets it as typed nulls and is rewritten through ``storage.shards.write_shard`` (the
writer's own encoding), atomically, one file at a time; the manifest's ``schema_version`` is
stamped last, so an interrupted upgrade leaves a run that reads the same and can be upgraded
again. Nothing else in a shard changes: same rows, same values, same order.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from storage.layout import MANIFEST, open_manifest, write_json
from storage.schema import SCHEMA_VERSION, TABLES, padded_table
from storage.shards import write_shard


def upgrade_run(run: Path) -> list[Path]:
    """Bring run directory ``run`` to the current schema version; returns the shards rewritten
    (none when it is current already)."""
    manifest = open_manifest(run)
    rewritten = []
    for table, schema in TABLES.items():
        for shard in sorted((run / table).glob("*.parquet")):
            if set(schema.names) <= set(pq.read_schema(shard).names):
                continue
            write_shard(shard, padded_table(pq.read_table(shard), schema))
            rewritten.append(shard)
    if manifest.schema_version != SCHEMA_VERSION:
        stamped = manifest.model_copy(update={"schema_version": SCHEMA_VERSION})
        write_json(run / MANIFEST, stamped.model_dump())
    return rewritten
