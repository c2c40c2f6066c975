"""SQLModel tables of the studio's DuckDB file: schema version, runs, jobs, annotations, budgets.

Every primary key is a string chosen by the application: DuckDB has no SERIAL, and string ids
also survive export/import between databases without renumbering. Episode data is *not* here —
it stays in the runs' Parquet shards and is read through views (storage.store).
"""

from __future__ import annotations

from sqlmodel import Field, SQLModel


class SchemaInfo(SQLModel, table=True):
    """One row, ``key="schema"``: the schema version the file was created with."""

    __tablename__ = "schema_info"

    key: str = Field(primary_key=True)
    version: int


class RunRecord(SQLModel, table=True):
    """A run the studio has seen (discovered from its ``run.json``, launched or imported)."""

    __tablename__ = "runs"

    run_id: str = Field(primary_key=True)
    kind: str
    model: str = ""
    suite: str = ""
    created_at: str = ""
    first_seen_at: str = ""
    origin: str = "discovered"  # discovered | imported


class Job(SQLModel, table=True):
    """A job subprocess the studio launched (studio/jobs.py mirrors its job.json here)."""

    __tablename__ = "jobs"

    job_id: str = Field(primary_key=True)
    kind: str
    run_id: str = Field(index=True)
    command: str = ""
    pid: int | None = None
    status: str = "starting"
    message: str = ""
    exit_code: int | None = None
    created_at: str = ""
    updated_at: str = ""


class Annotation(SQLModel, table=True):
    """A label on a call or an episode. Append-only: a new label is a new row, never an update."""

    __tablename__ = "annotations"

    annotation_id: str = Field(primary_key=True)
    target_kind: str  # "call" | "episode"
    target_id: str = Field(index=True)  # call_id ("<episode_id>/<call_index>") or episode_id
    episode_id: str = Field(default="", index=True)  # the episode the target belongs to
    run_id: str = Field(default="", index=True)
    label: str
    note: str = ""
    author: str = ""
    created_at: str = ""


# Test-time rehearsal modes a budget choice may name (the engine's RehearsalMode values).
BUDGET_MODES = ("parallel", "sequential", "select")


class BudgetChoice(SQLModel, table=True):
    """A test-time rehearsal budget someone chose for a model on a suite (append-only history)."""

    __tablename__ = "budget_choices"

    choice_id: str = Field(primary_key=True)
    model: str
    suite: str
    budget: int
    mode: str  # "parallel" | "sequential" | "select"
    author: str = ""
    note: str = ""
    created_at: str = ""
