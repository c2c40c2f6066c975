"""``Store``: the studio's one read-write owner of ``<root>/studio.duckdb``.

Concurrency (docs/storage.md): DuckDB allows one read-write *process* per database file, and
not even a reader beside it. So the studio process owns the file, and nothing else ever opens it:
jobs write Parquet shards into their run directories (storage.shards) and the store reads them
through views (storage.views) and a native index of their hot columns (storage.index).
Inside the studio, every query takes its own cursor on one shared database instance, which is
how DuckDB wants threads (Gradio handlers) to share it; the SQLModel engine is built on cursors
of that same instance, so both APIs see one database.

``Store(root, url="duckdb:///:memory:")`` keeps the tables in memory (tests, read-only demos)
while still reading the shards under ``root``.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import duckdb_engine
import pandas as pd
from sqlalchemy import create_engine, inspect
from sqlmodel import Session, SQLModel

from storage.collusion import CollusionRates
from storage.comparison import Comparison
from storage.index import ShardIndex
from storage.layout import (
    DB_FILE,
    MANIFEST,
    RunManifest,
    open_manifest,
    read_progress,
    runs_dir,
    utc_now,
)
from storage.queries import Queries, bound
from storage.queue import Queue
from storage.schema import SCHEMA_VERSION, SchemaVersionError, check_version
from storage.search import Search
from storage.tables import BUDGET_MODES, Annotation, BudgetChoice, Job, RunRecord, SchemaInfo
from storage.views import ViewSet

log = logging.getLogger(__name__)
TARGET_KINDS = ("call", "episode")
NOTE_MAX_CHARS = 2000  # a label's note: a sentence or a paragraph, not a document
STUDIO_TABLES: tuple[type[SQLModel], ...] = (SchemaInfo, RunRecord, Job, Annotation, BudgetChoice)


class StoreLockedError(RuntimeError):
    """Another process holds the studio database; the message names the file and what to do."""


def _database_path(root: Path, url: str | None) -> str:
    if url is None:
        return str(root / DB_FILE)
    if not url.startswith("duckdb:///"):
        raise ValueError(f"store url {url!r} must look like duckdb:///PATH or duckdb:///:memory:")
    return url.removeprefix("duckdb:///")


class Store(Queries):
    """Studio-side storage: SQLModel tables, the shard index and views (see module doc)."""

    def __init__(self, root: Path | str, url: str | None = None) -> None:
        """Open (or create) the store for data root ``root``."""
        self.root = Path(root).resolve()
        runs_dir(self.root).mkdir(parents=True, exist_ok=True)
        path = _database_path(self.root, url)
        try:
            self._db = duckdb.connect(path)
        except duckdb.IOException as err:
            raise StoreLockedError(
                f"cannot open {path}: another process (a running studio?) holds it. "
                "Only one studio may own a data folder: stop the other one, or point this one "
                f"at another folder (ENVACE_HOME). DuckDB said: {err}"
            ) from err
        self._db.execute("SET parquet_metadata_cache = true")
        self.engine = create_engine(
            "duckdb://", creator=lambda: duckdb_engine.ConnectionWrapper(self._db.cursor())
        )
        self._check_schema(path)
        self.views = ViewSet(self._db, self.root)
        self.index = ShardIndex(self._db, self.root)
        self._problems: dict[str, str] = {}  # run folder -> why its manifest was left out
        # the smaller groups of read verbs, each an object over this store's database
        self.queue = Queue(self)
        self.search = Search(self)
        self.comparison = Comparison(self)
        self.collusion = CollusionRates(self)

    def _check_schema(self, path: str) -> None:
        tables = set(inspect(self.engine).get_table_names())
        if tables and "schema_info" not in tables:
            raise SchemaVersionError(
                f"{path} holds tables {sorted(tables)} but no schema version: it was not created "
                "by envace-studio. Move it aside so a fresh database is created."
            )
        # Only our tables: SQLModel's metadata is process-global and others may add to it.
        # (SQLAlchemy sets __table__ on each table=True class; sqlmodel's types do not declare it.)
        ours = [t.__table__ for t in STUDIO_TABLES]  # type: ignore[attr-defined]
        SQLModel.metadata.create_all(self.engine, tables=ours)
        with Session(self.engine) as session:
            info = session.get(SchemaInfo, "schema")
            if info is None:
                session.add(SchemaInfo(key="schema", version=SCHEMA_VERSION))
                session.commit()
            else:
                check_version(info.version, path)
                if info.version < SCHEMA_VERSION:
                    # the studio tables are the same in every version so far: only the
                    # number moves on, so that an older build refuses the file from now on
                    log.info("%s: schema %d -> %d", path, info.version, SCHEMA_VERSION)
                    info.version = SCHEMA_VERSION
                    session.add(info)
                    session.commit()

    def close(self) -> None:
        """Release the database file (another process may open it afterwards)."""
        self.engine.dispose()
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the Database protocol (storage.queries) ------------------------------------------

    def refresh(self) -> None:
        """Views and shard index up to date with the run folders (called once per read verb)."""
        self.views.refresh()
        self.index.sync()

    def sql(self, query: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        """Run one parameterised query on a fresh cursor and return every row."""
        for attempt in (0, 1):
            cur = self._db.cursor()
            try:
                return cur.execute(query, list(params)).df()
            except duckdb.IOException as err:
                # A run folder was deleted under a view: rebuild the views and retry once.
                if attempt or "No files found" not in str(err):
                    raise
                self.views.refresh(force=True)
            finally:
                cur.close()
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def _session(self) -> Iterator[Session]:
        with Session(self.engine) as session:
            yield session

    # -- runs registry --------------------------------------------------------------------------

    def scan_runs(self) -> list[RunManifest]:
        """Manifests of every readable run folder under ``<root>/runs``; registers unseen ones.
        A folder whose manifest cannot be read is left out and listed by ``unreadable``."""
        manifests, problems = [], {}
        for path in sorted(runs_dir(self.root).glob(f"*/{MANIFEST}")):
            try:
                manifest = open_manifest(path.parent)
            except (ValueError, SchemaVersionError) as err:
                if self._problems.get(path.parent.name) != str(err):  # say it once
                    log.warning("skipping run folder %s: %s", path.parent, err)
                problems[path.parent.name] = str(err)
                continue
            manifests.append(manifest)
        self._problems = problems
        self._register(manifests)
        return manifests

    def unreadable(self) -> pd.DataFrame:
        """What this build could not read, and why: one row per run folder left out (its
        manifest) and per run with shards that could not be indexed (their rows are missing
        from every page). Columns: run, what, reason."""
        self.scan_runs()
        self.refresh()
        rows = [{"run": r, "what": MANIFEST, "reason": why} for r, why in self._problems.items()]
        by_run: dict[tuple[str, str], list[str]] = {}
        for shard, why in sorted(self.index.failures().items()):
            path = Path(shard)
            by_run.setdefault((path.parent.parent.name, why), []).append(
                f"{path.parent.name}/{path.name}"
            )
        for (run, why), shards in by_run.items():
            more = f" and {len(shards) - 3} more" if len(shards) > 3 else ""
            what = f"{len(shards)} shard(s): {', '.join(shards[:3])}{more}"
            rows.append({"run": run, "what": what, "reason": why})
        return pd.DataFrame(rows, columns=["run", "what", "reason"])

    def _register(self, manifests: Sequence[RunManifest], origin: str = "discovered") -> None:
        known = set(self.sql("SELECT run_id FROM runs")["run_id"])
        new = [m for m in manifests if m.run_id not in known]
        if not new:
            return
        with self._session() as session:
            for m in new:
                session.add(
                    RunRecord(
                        run_id=m.run_id,
                        kind=m.kind,
                        model=m.model,
                        suite=m.suite,
                        created_at=m.created_at,
                        first_seen_at=utc_now(),
                        origin=origin,
                    )
                )
            session.commit()

    def register_run(self, manifest: RunManifest, origin: str = "imported") -> None:
        """Record a run (e.g. just imported) in the registry if it is not there yet."""
        self._register([manifest], origin)

    def run_path(self, run_id: str) -> Path:
        """The run's folder; ``KeyError`` naming the known runs when it does not exist."""
        path = runs_dir(self.root) / run_id
        if not (path / MANIFEST).is_file() or path.parent != runs_dir(self.root):
            known = ", ".join(m.run_id for m in self.scan_runs()) or "none"
            raise KeyError(f"no run {run_id!r} under {runs_dir(self.root)} (known: {known})")
        return path

    def _progress_frame(self, manifests: Sequence[RunManifest]) -> pd.DataFrame:
        rows = []
        for m in manifests:
            p = read_progress(runs_dir(self.root) / m.run_id)
            rows.append({"run_id": m.run_id, **p.model_dump(include=set(p.model_fields))})
        return pd.DataFrame(rows)

    # -- annotations (append-only) --------------------------------------------------------------

    def annotate(
        self,
        target_kind: str,
        target_id: str,
        label: str,
        note: str = "",
        author: str = "",
        run_id: str | None = None,
    ) -> str:
        """Append a label to a call (``EPISODE_ID/CALL_INDEX``) or an episode of ``run_id``;
        return its id. Episode ids repeat across runs (each run counts from 0), so a label
        belongs to one run: ``run_id`` may be left out only when one run holds the episode."""
        if target_kind not in TARGET_KINDS:
            raise ValueError(f"target_kind must be one of {TARGET_KINDS}, got {target_kind!r}")
        if not label.strip():
            raise ValueError("an annotation needs a non-empty label")
        if len(note) > NOTE_MAX_CHARS:
            raise ValueError(
                f"the note has {len(note)} characters; a note holds at most {NOTE_MAX_CHARS}: "
                "shorten it (long evidence belongs in a linked document)"
            )
        episode_id = target_id.rsplit("/", 1)[0] if target_kind == "call" else target_id
        run = self._run_of(episode_id, run_id, target_id)
        if target_kind == "call":
            self._check_call(run, target_id)
        row = Annotation(
            annotation_id=uuid.uuid4().hex,
            target_kind=target_kind,
            target_id=target_id,
            episode_id=episode_id,
            run_id=run,
            label=label.strip(),
            note=note,
            author=author,
            created_at=utc_now(),
        )
        return self._append(row).annotation_id

    def _run_of(self, episode_id: str, run_id: str | None, target_id: str) -> str:
        """The one run a label on ``target_id`` belongs to, or a KeyError/ValueError saying why
        there is none or more than one."""
        self.refresh()
        clauses, params = bound((("episode_id = ?", episode_id), ("run_id = ?", run_id)))
        found = sorted(
            self.sql(
                f"SELECT DISTINCT run_id FROM episode_index WHERE {' AND '.join(clauses)}", params
            )["run_id"]
        )
        where = f"run {run_id!r}" if run_id else "any run"
        if not found:
            raise KeyError(f"no episode {episode_id!r} in {where}: cannot label {target_id!r}")
        if len(found) > 1:
            raise ValueError(
                f"episode {episode_id!r} is in {len(found)} runs ({', '.join(found)}): "
                f"choose the run whose {target_id!r} you are labelling"
            )
        return str(found[0])

    def _check_call(self, run_id: str, call_id: str) -> None:
        """``KeyError`` unless ``call_id`` (``EPISODE_ID/CALL_INDEX``) is a call of ``run_id``;
        the message says which calls the episode has."""
        episode_id = call_id.rsplit("/", 1)[0]
        calls = self.sql(
            "SELECT call_id FROM call_index WHERE run_id = ? AND episode_id = ?",
            [run_id, episode_id],
        )["call_id"]
        if call_id in set(calls):
            return
        has = (
            f"has {len(calls)} call(s), numbered 0 to {len(calls) - 1}"
            if len(calls)
            else "made no tool call (label the episode instead)"
        )
        raise KeyError(f"no call {call_id!r} in run {run_id!r}: episode {episode_id!r} {has}")

    def _append(self, row: SQLModel) -> Any:
        with self._session() as session:
            session.add(row)
            session.commit()
            session.refresh(row)
            return row

    def import_annotations(self, frame: pd.DataFrame) -> int:
        """Append exported annotation rows (their ids and times kept); skips ids already here."""
        have = set(self.sql("SELECT annotation_id FROM annotations")["annotation_id"])
        fields = set(Annotation.model_fields)
        added = 0
        with self._session() as session:
            for rec in frame.to_dict("records"):
                if rec["annotation_id"] in have:
                    continue
                session.add(Annotation(**{k: v for k, v in rec.items() if k in fields}))
                added += 1
            session.commit()
        return added

    # -- jobs -----------------------------------------------------------------------------------

    def add_job(
        self, job_id: str, kind: str, run_id: str, command: str, pid: int | None, status: str
    ) -> Job:
        """Register a job the studio launched."""
        now = utc_now()
        return self._append(
            Job(
                job_id=job_id,
                kind=kind,
                run_id=run_id,
                command=command,
                pid=pid,
                status=status,
                created_at=now,
                updated_at=now,
            )
        )

    def update_job(self, job_id: str, **fields: Any) -> Job:
        """Change a job's fields (status, pid, message, exit_code...)."""
        unknown = set(fields) - set(Job.model_fields) | ({"job_id"} & set(fields))
        if unknown:
            raise ValueError(f"update_job cannot set {sorted(unknown)}")
        with self._session() as session:
            job = session.get(Job, job_id)
            if job is None:
                raise KeyError(f"no job {job_id!r}")
            for key, value in fields.items():
                setattr(job, key, value)
            job.updated_at = utc_now()
            session.add(job)
            session.commit()
            session.refresh(job)
            return job

    def jobs(self, run_id: str | None = None) -> pd.DataFrame:
        """Jobs, newest first (optionally of one run)."""
        where, params = ("WHERE run_id = ?", [run_id]) if run_id else ("", [])
        return self.sql(f"SELECT * FROM jobs {where} ORDER BY created_at DESC", params)

    # -- budget choices -------------------------------------------------------------------------

    def save_budget(
        self, model: str, suite: str, budget: int, mode: str, author: str = "", note: str = ""
    ) -> str:
        """Record a chosen test-time rehearsal budget (history kept); returns its id."""
        if budget < 0:
            raise ValueError(f"budget must be >= 0 imagined episodes, got {budget}")
        if mode not in BUDGET_MODES:
            raise ValueError(f"mode must be one of {', '.join(BUDGET_MODES)}, got {mode!r}")
        row = BudgetChoice(
            choice_id=uuid.uuid4().hex,
            model=model,
            suite=suite,
            budget=budget,
            mode=mode,
            author=author,
            note=note,
            created_at=utc_now(),
        )
        return self._append(row).choice_id

    def budgets(self, model: str | None = None, suite: str | None = None) -> pd.DataFrame:
        """Budget choices, newest first; the first row per (model, suite) is the current one."""
        clauses, params = bound((("model = ?", model), ("suite = ?", suite)))
        where = "WHERE " + " AND ".join(clauses) if clauses else ""
        return self.sql(f"SELECT * FROM budget_choices {where} ORDER BY created_at DESC", params)

    def manifests(self) -> dict[str, RunManifest]:
        """Every run's manifest keyed by run id."""
        return {m.run_id: m for m in self.scan_runs()}


__all__ = ["SchemaVersionError", "Store", "StoreLockedError"]
