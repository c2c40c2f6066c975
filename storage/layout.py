"""Layout of a studio data root and of a self-contained run directory, and atomic file writes.

::

    <root>/studio.duckdb                 the studio's database (one process opens it: storage.Store)
    <root>/runs/<run_id>/run.json        manifest (RunManifest), written once
    <root>/runs/<run_id>/progress.json   live progress (RunProgress), atomically replaced
    <root>/runs/<run_id>/<table>/step-000012.parquet   one shard per table per step

Every file is written to a hidden temporary name in the same folder, fsync'ed and then
``os.replace``'d: readers (DuckDB globs ``*.parquet``, JSON readers) see the old file, the new
file, or nothing — never half a file. A killed writer leaves only a ``.*.tmp-<pid>`` file,
which no glob matches and which the next writer of that run removes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from storage.schema import SCHEMA_VERSION, check_version

DB_FILE = "studio.duckdb"
RUNS_DIR = "runs"
MANIFEST = "run.json"
PROGRESS = "progress.json"
KINDS = ("train", "sft", "eval", "sweep", "rollout", "demo", "study")
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class RunManifest(BaseModel):
    """``run.json``: what a run is. Parsed with pydantic because it is outside text."""

    model_config = ConfigDict(frozen=True, extra="allow")

    run_id: str
    kind: str
    model: str = ""
    suite: str = ""
    config: dict[str, Any] = Field(default_factory=dict)
    created_at: str = ""  # ISO 8601, UTC
    schema_version: int = SCHEMA_VERSION


class RunProgress(BaseModel):
    """``progress.json``: the job's live progress; times are Unix seconds (as studio/jobs.py)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    done: int = 0
    total: int = 0
    status: str = ""  # running | done | failed | cancelled | paused (a study to --resume)
    message: str = ""
    started_at: float | None = None
    updated_at: float | None = None
    eta_s: float | None = None
    pid: int | None = None


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is a safe folder name, else raise ``ValueError`` saying why."""
    if not _RUN_ID.match(run_id):
        raise ValueError(
            f"run id {run_id!r} is not allowed: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return run_id


def runs_dir(root: Path) -> Path:
    """``<root>/runs``: where run directories live."""
    return Path(root) / RUNS_DIR


def run_dir(root: Path, run_id: str) -> Path:
    """``<root>/runs/<run_id>``."""
    return runs_dir(root) / check_run_id(run_id)


def shard_name(step: int) -> str:
    """``step-000012.parquet``: zero-padded so names sort in step order."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return f"step-{step:06d}.parquet"


def shard_path(run: Path, table: str, step: int) -> Path:
    """Where ``table``'s shard for ``step`` lives in run directory ``run``."""
    return run / table / shard_name(step)


def stage(path: Path, write: Callable[[BinaryIO], object], durable: bool = True) -> Path:
    """Write through ``write(fileobj)`` to the temporary name of ``path``; return that name.

    The temporary (``.NAME.tmp-PID``) matches no reader's glob and ``remove_stale_temporaries``
    deletes it. It is removed if writing fails. ``durable`` fsyncs the data.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def write_atomic(path: Path, write: Callable[[BinaryIO], object], durable: bool = True) -> None:
    """Write ``path`` through ``write(fileobj)`` to a temporary name, then rename it into place.

    ``durable`` fsyncs the data before the rename and the folder after it (shards and
    manifests); progress reports skip it because the next report supersedes them anyway.
    """
    tmp = stage(path, write, durable)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    """Flush a folder's entries: a rename reaches the disk with its folder, not with the file."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, data: dict[str, Any], durable: bool = True) -> None:
    """Atomically write ``data`` as indented JSON."""
    payload = json.dumps(data, indent=2, sort_keys=True, default=str).encode()
    write_atomic(path, lambda fh: fh.write(payload), durable=durable)


def remove_stale_temporaries(run: Path) -> int:
    """Delete temporary files a killed writer left in ``run``; returns how many."""
    removed = 0
    for tmp in run.glob("**/.*.tmp-*"):
        tmp.unlink(missing_ok=True)
        removed += 1
    return removed


def read_manifest(run: Path) -> RunManifest:
    """Parse ``run.json``; a missing or malformed file raises ``ValueError`` naming it."""
    path = run / MANIFEST
    try:
        return RunManifest.model_validate_json(path.read_bytes())
    except FileNotFoundError as err:
        raise ValueError(f"{path} not found: not a run directory") from err
    except ValidationError as err:
        raise ValueError(f"{path} is not a valid run manifest: {err}") from err


def open_manifest(run: Path) -> RunManifest:
    """``read_manifest``, then ``SchemaVersionError`` if this build cannot read the run's schema
    version (a newer build wrote it). Every older version is read."""
    manifest = read_manifest(run)
    check_version(manifest.schema_version, str(run / MANIFEST))
    return manifest


def rewrite_config(run: Path, config: dict[str, Any]) -> RunManifest:
    """Replace the config ``run.json`` records (a resumed run whose settings were changed);
    every other manifest field is kept. Returns the new manifest."""
    manifest = read_manifest(run).model_copy(update={"config": dict(config)})
    write_json(run / MANIFEST, manifest.model_dump())
    return manifest


def read_progress(run: Path) -> RunProgress:
    """Parse ``progress.json``; an absent or unreadable file reads as an empty progress."""
    try:
        return RunProgress.model_validate_json((run / PROGRESS).read_bytes())
    except (FileNotFoundError, ValidationError):
        return RunProgress()


def utc_now() -> str:
    """Current time as ISO 8601 UTC text with microseconds, so text order is time order."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
