"""``RunWriter``: the job-side writer of a run directory (implements ``envace_engine.sink.Sink``).

A job process owns exactly one run directory and never opens the studio's DuckDB file: it only
appends Parquet shards (one per table per step) and replaces ``progress.json``. Every file goes
through ``layout.write_atomic`` (temporary name, fsync, rename), and the ``episodes`` shard of a
step is written last, so the studio never lists an episode whose turns are not on disk, and a
``kill -9`` at any moment leaves every earlier step intact. Re-writing a step (a resumed job)
replaces its shards whole.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from envace_engine.types import Episode
from storage.layout import (
    KINDS,
    MANIFEST,
    PROGRESS,
    RunManifest,
    RunProgress,
    check_run_id,
    read_manifest,
    read_progress,
    remove_stale_temporaries,
    run_dir,
    shard_path,
    utc_now,
    write_atomic,
    write_json,
)
from storage.rows import step_tables
from storage.schema import METRICS, SCHEMA_VERSION, WRITE_ORDER, check_version

COMPRESSION = "zstd"
# Small row groups: rows are in episode order, so min/max statistics on episode_index let a
# one-episode lookup decode one row group instead of the whole step.
ROW_GROUP_ROWS = 2048


def write_shard(path: Path, table: pa.Table) -> None:
    """Atomically write one Parquet shard."""
    write_atomic(
        path,
        lambda fh: pq.write_table(
            table, fh, compression=COMPRESSION, row_group_size=ROW_GROUP_ROWS
        ),
    )


class RunWriter:
    """Appends one run's data as Parquet shards. Use ``RunWriter.create`` for a new run.

    As a context manager it marks the run ``done`` on a clean exit and ``failed`` (with the
    exception's message) when the block raises.
    """

    def __init__(self, path: Path | str, manifest: RunManifest | None = None) -> None:
        """Open run directory ``path``; write ``manifest`` as its ``run.json`` if it has none."""
        self.path = Path(path)
        if (self.path / MANIFEST).exists():
            self.manifest = read_manifest(self.path)
            check_version(self.manifest.schema_version, str(self.path / MANIFEST))
            if manifest is not None and manifest.run_id != self.manifest.run_id:
                raise ValueError(
                    f"{self.path} already holds run {self.manifest.run_id!r}, "
                    f"not {manifest.run_id!r}: choose another folder or run id"
                )
        elif manifest is None:
            raise ValueError(f"{self.path} has no run.json: pass a manifest to start a new run")
        else:
            self.path.mkdir(parents=True, exist_ok=True)
            write_json(self.path / MANIFEST, manifest.model_dump())
            self.manifest = manifest
        remove_stale_temporaries(self.path)
        previous = read_progress(self.path)
        self._started_at = previous.started_at or time.time()

    @classmethod
    def create(
        cls,
        root: Path | str,
        kind: str,
        model: str = "",
        suite: str = "",
        config: Mapping[str, Any] | None = None,
        run_id: str | None = None,
    ) -> RunWriter:
        """Start a new run under ``<root>/runs/``; the id defaults to ``<kind>-<time>-<hex>``."""
        if kind not in KINDS:
            raise ValueError(f"run kind {kind!r} is not one of {', '.join(KINDS)}")
        run_id = check_run_id(
            run_id or f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        )
        path = run_dir(Path(root), run_id)
        if (path / MANIFEST).exists():
            raise ValueError(f"run {run_id!r} already exists at {path}: pick another run id")
        manifest = RunManifest(
            run_id=run_id,
            kind=kind,
            model=model,
            suite=suite,
            config=dict(config or {}),
            created_at=utc_now(),
            schema_version=SCHEMA_VERSION,
        )
        return cls(path, manifest)

    @property
    def run_id(self) -> str:
        """This run's id (from its manifest)."""
        return self.manifest.run_id

    def episodes(self, step: int, episodes: Sequence[Episode]) -> None:
        """Write one step's episodes as segments, rehearsals, calls and (last) episodes shards."""
        tables = step_tables(self.run_id, step, episodes)
        for name in WRITE_ORDER:
            write_shard(shard_path(self.path, name, step), tables[name])

    def metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Write one step's scalar metrics as a long-format shard (step, name, value)."""
        names = sorted(metrics)
        table = pa.table(
            {
                "run_id": [self.run_id] * len(names),
                "step": [step] * len(names),
                "name": names,
                "value": [float(metrics[n]) for n in names],
            },
            schema=METRICS,
        )
        write_shard(shard_path(self.path, "metrics", step), table)

    def progress(self, done: int, total: int, message: str = "", status: str = "running") -> None:
        """Replace ``progress.json`` (done of total, an ETA from the average rate so far)."""
        now = time.time()
        eta = None
        if 0 < done < total:
            eta = (now - self._started_at) / done * (total - done)
        report = RunProgress(
            done=done,
            total=total,
            status=status,
            message=message,
            started_at=self._started_at,
            updated_at=now,
            eta_s=eta if status == "running" else None,
            pid=os.getpid(),
        )
        write_json(self.path / PROGRESS, report.model_dump(), durable=False)

    def finish(self, status: str = "done", message: str = "") -> None:
        """Record the final status (done, failed or cancelled), keeping the last counts."""
        last = read_progress(self.path)
        self.progress(last.done, last.total, message or last.message, status=status)

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.finish("done")
        elif isinstance(exc, KeyboardInterrupt):
            self.finish("cancelled", "interrupted")
        else:
            self.finish("failed", f"{type(exc).__name__}: {exc}")
