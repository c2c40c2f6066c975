"""``RunWriter``: the job-side writer of a run directory (implements ``envace_engine.sink.Sink``).

A job process owns exactly one run directory and never opens the studio's DuckDB file: it only
appends Parquet shards (one per table per step) and replaces ``progress.json``. Every file is
written to a temporary name, fsynced and renamed (``layout.write_atomic``, or the staged form
below for a step's shards), and the ``episodes`` shard of a step is renamed last, so the
studio never lists an episode whose turns are not on disk, and a ``kill -9`` at any moment
leaves every earlier step intact. Re-writing a step (a resumed job) replaces its shards whole.

``RunWriter.episodes`` overlaps the two halves of a step's work: while Python builds the next
table (storage.rows, which holds the GIL), one worker thread encodes the previous one to zstd
Parquet and writes it, fsynced, to its temporary name (pyarrow and the file calls release the
GIL). Once every table is built and staged, the step is published: the temporaries are renamed
in ``WRITE_ORDER``, and the episodes shard only after the other renames reached the disk. So an
error while building leaves nothing of the step, and the step's wait on the disk is two folder
syncs instead of eight file and folder syncs one after the other.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
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
    fsync_dir,
    read_manifest,
    read_progress,
    remove_stale_temporaries,
    run_dir,
    shard_path,
    stage,
    utc_now,
    write_atomic,
    write_json,
)
from storage.rows import iter_step_tables
from storage.schema import (
    DICTIONARY_COLUMNS,
    METRICS,
    SCHEMA_VERSION,
    STATISTICS_COLUMNS,
    WRITE_ORDER,
    check_version,
)
from storage.scoring import SimilarityHelper

COMPRESSION = "zstd"
# Small row groups: rows are in episode order, so min/max statistics on episode_index let a
# one-episode lookup decode one row group instead of the whole step.
ROW_GROUP_ROWS = 2048


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a step's tables are built.

    Building allocates some hundred thousand short-lived tuples and strings, none in a cycle
    (reference counting frees them all), yet each 700 allocations start a collection, and the
    older generations' collections walk every object the job holds. Pausing it shortens a
    bench/storage.py step, with nothing to collect; it is restored as it was, also after an
    error.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _write_parquet(table: pa.Table, where: Any) -> None:
    names = set(table.schema.names)
    pq.write_table(
        table,
        where,
        compression=COMPRESSION,
        row_group_size=ROW_GROUP_ROWS,
        use_dictionary=sorted(DICTIONARY_COLUMNS & names),
        write_statistics=[c for c in STATISTICS_COLUMNS if c in names],
    )


def write_shard(path: Path, table: pa.Table) -> None:
    """Atomically write one Parquet shard."""
    write_atomic(path, lambda fh: _write_parquet(table, fh))


def _stage(path: Path, table: pa.Table) -> Path:
    """Encode ``table`` and write it, fsynced, to the temporary name of ``path``; return it."""
    sink = pa.BufferOutputStream()  # in memory: pyarrow encodes without the GIL
    _write_parquet(table, sink)
    return stage(path, lambda fh: fh.write(sink.getvalue()))


def _publish(shards: list[tuple[Path, Path]]) -> None:
    """Rename staged ``(temporary, shard)`` pairs in order; the last only once the others'
    renames are on disk, so no crash can keep it without them."""
    *body, (last_tmp, last) = shards
    for tmp, path in body:
        os.replace(tmp, path)
    for folder in dict.fromkeys(path.parent for _, path in body):
        fsync_dir(folder)
    os.replace(last_tmp, last)
    fsync_dir(last.parent)


class RunWriter:
    """Appends one run's data as Parquet shards. Use ``RunWriter.create`` for a new run.

    As a context manager it marks the run ``done`` on a clean exit (unless ``finish`` recorded
    another status) and ``failed`` (with the exception's message) when the block raises.
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
        self._ended = False  # finish() ran: leaving the block keeps the status it recorded
        previous = read_progress(self.path)
        self._started_at = previous.started_at or time.time()
        self._similarity = SimilarityHelper()  # pairs' text similarity on another core

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
        staged: dict[str, Future[Path]] = {}
        try:
            # One worker: with the building thread that makes two busy cores, and it stages
            # in the order the tables come. Leaving the block waits for it, also after an error.
            with (
                _cyclic_gc_paused(),
                ThreadPoolExecutor(max_workers=1, thread_name_prefix="envace-shards") as pool,
            ):
                tables = iter_step_tables(self.run_id, step, episodes, self._similarity.submit)
                for name, table in tables:
                    staged[name] = pool.submit(_stage, shard_path(self.path, name, step), table)
            temporaries = {name: future.result() for name, future in staged.items()}
        except BaseException:
            for future in staged.values():  # all done: the pool has shut down
                if future.exception() is None:
                    future.result().unlink(missing_ok=True)
            raise
        if tuple(temporaries) != WRITE_ORDER:
            raise AssertionError(f"step tables came as {tuple(temporaries)}, not {WRITE_ORDER}")
        _publish([(temporaries[n], shard_path(self.path, n, step)) for n in WRITE_ORDER])

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
        """Record the final status (done, failed, cancelled or paused), keeping the last counts;
        stops the similarity helper process, if one was started."""
        self._ended = True
        self._similarity.close()
        last = read_progress(self.path)
        self.progress(last.done, last.total, message or last.message, status=status)

    def hand_over(self, message: str) -> None:
        """Stop the similarity helper and keep the run ``running``: the same run goes on in a
        new program image of this process (``envace study`` after each unit)."""
        self._similarity.close()
        last = read_progress(self.path)
        self.progress(last.done, last.total, message)

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            if not self._ended:
                self.finish("done")
        elif isinstance(exc, KeyboardInterrupt):
            self.finish("cancelled", "interrupted")
        else:
            self.finish("failed", f"{type(exc).__name__}: {exc}")
