"""Export a run to one file per table (Parquet or JSON Lines), and import such an export back.

An export folder holds ``run.json``, ``progress.json`` and ``<table>.parquet`` or
``<table>.jsonl`` for every table that has data (plus ``labels.*`` when labels were given).
JSON Lines exports load with ``datasets.load_dataset("json", data_files="episodes.jsonl")``.
Exporting reads the run's shards with a private in-memory DuckDB: it never opens the studio's
database, so it works while the studio runs.

Import rebuilds a normal run directory (one shard per table per step, the same schema) in a
hidden temporary folder and renames it into ``<root>/runs/<run_id>`` at the end, so a failed
import never leaves half a run visible. A plain run directory (shards, not an export) is copied.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from storage.layout import (
    MANIFEST,
    PROGRESS,
    RunManifest,
    check_run_id,
    read_manifest,
    run_dir,
    shard_path,
    write_json,
)
from storage.schema import ADDED_IN, TABLES, check_version, padded_table
from storage.shards import write_shard
from storage.views import duck_type

FORMATS = ("parquet", "jsonl")
LABELS = "labels"
SORT_KEYS = {
    "episodes": "step, episode_index",
    "segments": "step, episode_id, seq",
    "calls": "step, episode_id, call_index",
    "rehearsals": "step, episode_id, rehearsal_index",
    "metrics": "step, name",
}


def _has_shards(run: Path, table: str) -> bool:
    return any((run / table).glob("*.parquet"))


def export_run(
    run: Path, out: Path, fmt: str = "parquet", labels: pd.DataFrame | None = None
) -> list[Path]:
    """Write run directory ``run`` to folder ``out`` in ``fmt``; returns the files written."""
    if fmt not in FORMATS:
        raise ValueError(f"export format must be one of {FORMATS}, got {fmt!r}")
    manifest = read_manifest(run)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in (MANIFEST, PROGRESS):
        if (run / name).is_file():
            shutil.copyfile(run / name, out / name)
            written.append(out / name)
    copy_format = "(FORMAT parquet, COMPRESSION zstd)" if fmt == "parquet" else "(FORMAT json)"
    con = duckdb.connect()
    try:
        for table in TABLES:
            if not _has_shards(run, table):
                continue
            target = out / f"{table}.{fmt}"
            # COPY targets cannot be bound parameters; the path is ours, quoted for SQL.
            quoted = str(target).replace("'", "''")
            con.execute(
                f"COPY (SELECT * FROM read_parquet(?, union_by_name=true) "
                f"ORDER BY {SORT_KEYS[table]}) "
                f"TO '{quoted}' {copy_format}",
                [str(run / table / "*.parquet")],
            )
            written.append(target)
    finally:
        con.close()
    if labels is not None and not labels.empty:
        target = out / f"{LABELS}.{fmt}"
        if fmt == "parquet":
            labels.to_parquet(target, index=False)
        else:
            labels.to_json(target, orient="records", lines=True)
        written.append(target)
    if not written:
        raise ValueError(f"run {manifest.run_id} at {run} has nothing to export")
    return written


def _read_table(src: Path, table: str, schema: pa.Schema) -> pa.Table | None:
    parquet, jsonl = src / f"{table}.parquet", src / f"{table}.jsonl"
    if parquet.is_file():
        data = pq.read_table(parquet)
    elif jsonl.is_file():
        # Explicit column types: JSON has no int32 and an all-null column has no type at all.
        columns = ", ".join(f"'{f.name}': '{duck_type(f.type)}'" for f in schema)
        con = duckdb.connect()
        try:
            data = con.sql(
                f"SELECT * FROM read_json(?, format='newline_delimited', columns={{{columns}}})",
                params=[str(jsonl)],
            ).to_arrow_table()
        finally:
            con.close()
    else:
        return None
    missing = [
        f.name
        for f in schema
        if f.name not in data.column_names and (table, f.name) not in ADDED_IN
    ]
    if missing:
        raise ValueError(f"{src}/{table}: missing columns {missing}: not an envace export")
    # an export of an older version lacks the columns added since: they read as nulls
    return padded_table(data.select([n for n in schema.names if n in data.column_names]), schema)


def read_labels(src: Path) -> pd.DataFrame | None:
    """The labels an export carries, if any."""
    if (src / f"{LABELS}.parquet").is_file():
        return pd.read_parquet(src / f"{LABELS}.parquet")
    if (src / f"{LABELS}.jsonl").is_file():
        return pd.read_json(src / f"{LABELS}.jsonl", lines=True, dtype=False)
    return None


def _rebuild(src: Path, staging: Path, run_id: str) -> None:
    for table, schema in TABLES.items():
        data = _read_table(src, table, schema)
        if data is None:
            continue
        data = data.set_column(0, "run_id", pa.array([run_id] * data.num_rows, pa.string()))
        for step in pc.unique(data["step"]).to_pylist():
            part = data.filter(pc.equal(data["step"], step))
            write_shard(shard_path(staging, table, int(step)), part)


def import_run(src: Path, root: Path, run_id: str | None = None) -> RunManifest:
    """Import an export folder or a run directory ``src`` into ``<root>/runs``.

    ``run_id`` renames the run (exports only); an existing run of that id is never overwritten.
    """
    manifest = read_manifest(src)
    check_version(manifest.schema_version, str(src / MANIFEST))
    is_run_dir = (src / "episodes").is_dir()
    if run_id is not None and is_run_dir and run_id != manifest.run_id:
        raise ValueError("renaming is supported for exports only: export the run first")
    target_id = check_run_id(run_id or manifest.run_id)
    target = run_dir(root, target_id)
    if target.exists():
        raise ValueError(
            f"run {target_id!r} already exists at {target}: pass another run id to import a copy"
        )
    staging = target.with_name(f".import-{target_id}-{uuid.uuid4().hex[:8]}")
    try:
        if is_run_dir:
            shutil.copytree(src, staging, ignore=shutil.ignore_patterns(".*.tmp-*"))
        else:
            staging.mkdir(parents=True)
            _rebuild(src, staging, target_id)
            manifest = manifest.model_copy(update={"run_id": target_id})
            write_json(staging / MANIFEST, manifest.model_dump())
            if (src / PROGRESS).is_file():
                shutil.copyfile(src / PROGRESS, staging / PROGRESS)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return read_manifest(target)
