"""The job manager: long work (training, evaluation, sweeps, rollouts) as subprocesses.

A job is ``python -m studio.jobs RUN_DIR -- ARGV...``: a small supervisor (``supervise``) that runs
the real command in its own process group and, when it ends, writes ``exit.json`` (exit code and
time) into the run directory. Because the supervisor, not the studio, waits for the command, the
exit code survives a studio restart; and because the job runs in a new session, stopping the
studio never stops a job.

The studio's ``job.json`` (command, pid, status; written atomically), the job's own
``progress.json`` and the supervisor's ``exit.json`` make a run folder self-describing: a
restarted studio re-attaches to live jobs and marks dead ones with what happened. Changes are
mirrored into the store's jobs table when one is given. Design: docs/studio.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

# progress.json is the storage layout's file: one model and one reader for job and studio
from storage.layout import RunProgress as Progress
from storage.layout import read_progress

ACTIVE = frozenset({"starting", "running"})
TERMINAL = frozenset({"done", "failed", "cancelled", "lost"})
JOB_FILE = "job.json"
EXIT_FILE = "exit.json"
LOG_FILE = "job.log"


class JobError(RuntimeError):
    """A job could not be launched, cancelled or resumed; the message says why."""


@dataclass(frozen=True)
class JobRecord:
    """What the studio knows about one job (``job.json``)."""

    job_id: str
    kind: str
    run_id: str
    argv: tuple[str, ...]
    pid: int | None
    status: str
    started_at: float
    ended_at: float | None = None
    exit_code: int | None = None
    message: str = ""
    resumable: bool = False


@dataclass(frozen=True)
class JobView:
    """A job as a page shows it: the record joined with its live progress."""

    record: JobRecord
    progress: Progress
    eta_s: float | None

    @property
    def label(self) -> str:
        """``step x of N`` plus ETA, or the final status message."""
        rec, prog = self.record, self.progress
        if rec.status in TERMINAL:
            return f"{rec.status}: {rec.message}" if rec.message else rec.status
        if prog.total <= 0:
            return f"{rec.status}: {prog.message or 'waiting for first progress report'}"
        eta = f", ETA {format_duration(self.eta_s)}" if self.eta_s is not None else ""
        return f"step {prog.done} of {prog.total}{eta}" + (
            f" — {prog.message}" if prog.message else ""
        )


class JobTable(Protocol):
    """The store's jobs table, as far as the job manager needs it (storage.Store provides it)."""

    def add_job(
        self, job_id: str, kind: str, run_id: str, command: str, pid: int | None, status: str
    ) -> Any:
        """Register a new job."""
        ...

    def update_job(self, job_id: str, **fields: Any) -> Any:
        """Change a job's fields (status, pid, message...)."""
        ...


def format_duration(seconds: float | None) -> str:
    """``1h 02m``, ``3m 05s`` or ``12s``; an em dash when unknown."""
    if seconds is None:
        return "—"
    s = max(0, round(seconds))
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s}s"


def eta_seconds(progress: Progress, now: float) -> float | None:
    """Time left: the job's own estimate if it gave one, else elapsed/done × remaining."""
    if progress.eta_s is not None:
        return max(0.0, progress.eta_s)
    if progress.started_at is None or progress.done <= 0 or progress.total <= 0:
        return None
    elapsed = now - progress.started_at
    return max(0.0, elapsed / progress.done * (progress.total - progress.done))


def settle(
    record: JobRecord, progress: Progress, alive: bool, exit_code: int | None, log_tail: str = ""
) -> JobRecord:
    """The record's status given what can be observed now (pure: no files, no processes).

    A live process is ``running``. A dead one is ``done`` when it exited 0 or reported done,
    ``failed`` with its exit code and last log line otherwise, and ``lost`` when nobody saw it end
    (no exit code: the supervisor itself was killed, e.g. the machine rebooted).
    """
    if record.status in TERMINAL:
        return record
    if alive:
        return replace(record, status="running")
    now = time.time()
    where = f" at step {progress.done} of {progress.total}" if progress.total else ""
    if exit_code == 0 or (exit_code is None and progress.status == "done"):
        return replace(
            record,
            status="done",
            exit_code=exit_code,
            ended_at=now,
            message=progress.message or "finished",
            resumable=False,
        )
    if exit_code is not None:
        last = log_tail.strip().splitlines()[-1] if log_tail.strip() else "no output"
        return replace(
            record,
            status="failed",
            exit_code=exit_code,
            ended_at=now,
            message=f"exited with code {exit_code}{where}: {last}",
            resumable=True,
        )
    return replace(
        record,
        status="lost",
        ended_at=now,
        resumable=True,
        message=f"the job process ended while nobody was watching{where}",
    )


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomic replace so a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_record(run_dir: Path) -> JobRecord | None:
    """The studio's ``job.json`` for a run directory, or None if it is not a studio job."""
    data = _read_json(run_dir / JOB_FILE)
    if not data:
        return None
    data["argv"] = tuple(data.get("argv", ()))
    fields = {k: data[k] for k in JobRecord.__dataclass_fields__ if k in data}
    try:
        return JobRecord(**fields)
    except TypeError:
        return None


def _pid_runs(pid: int | None, run_dir: Path) -> bool:
    """Whether ``pid`` is alive *and* is our supervisor for ``run_dir`` (guards pid reuse)."""
    if not pid:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":  # a zombie has finished
        return False
    return str(run_dir).encode() in cmdline


def _log_tail(run_dir: Path, limit: int = 2000) -> str:
    try:
        with open(run_dir / LOG_FILE, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


class JobManager:
    """Launch, watch, cancel and resume jobs whose runs live under ``<root>/runs``."""

    def __init__(
        self, root: Path, table: JobTable | None = None, max_active: int | None = None
    ) -> None:
        self.runs = Path(root) / "runs"
        self.table = table
        self.max_active = max_active  # jobs running at once (a Space: 1); None = no limit
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    def run_dir(self, run_id: str) -> Path:
        """Where a run's files live."""
        return self.runs / run_id

    def new_run_id(self, kind: str) -> str:
        """A fresh, sortable run id such as ``train-20261129-1102-ab12``."""
        return f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"

    def launch(
        self, kind: str, argv: list[str], run_id: str | None = None, resumable: bool = False
    ) -> JobRecord:
        """Start ``argv`` (its ``{run_dir}`` placeholders filled in) as a supervised job."""
        if not argv:
            raise JobError("cannot launch an empty command")
        self._check_room()
        run_id = run_id or self.new_run_id(kind)
        run_dir = self.run_dir(run_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        argv = [a.replace("{run_dir}", str(run_dir)) for a in argv]
        with open(run_dir / LOG_FILE, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "studio.jobs", str(run_dir), "--", *argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # the job outlives the studio and is killed as a group
            )
        record = JobRecord(
            job_id=f"job-{uuid.uuid4().hex[:10]}",
            kind=kind,
            run_id=run_id,
            argv=tuple(argv),
            pid=proc.pid,
            status="running",
            started_at=time.time(),
            resumable=resumable,
        )
        self._children[record.job_id] = proc
        (run_dir / EXIT_FILE).unlink(missing_ok=True)
        self._save(record, new=True)
        return record

    def _check_room(self) -> None:
        """Refuse a launch when ``max_active`` jobs are running already."""
        if self.max_active is None:
            return
        active = [v.record.run_id for v in self.jobs() if v.record.status in ACTIVE]
        if len(active) >= self.max_active:
            raise JobError(
                f"this host runs {self.max_active} job(s) at a time and "
                f"{', '.join(active)} is running: wait for it to finish or cancel it"
            )

    def _save(self, record: JobRecord, new: bool = False) -> None:
        _write_json(self.run_dir(record.run_id) / JOB_FILE, asdict(record))
        if self.table is None:
            return
        if not new:
            try:
                self.table.update_job(
                    record.job_id,
                    status=record.status,
                    pid=record.pid,
                    message=record.message,
                    exit_code=record.exit_code,
                )
                return
            except KeyError:  # a run folder copied in, or a fresh database: register it
                pass
        self.table.add_job(
            record.job_id,
            record.kind,
            record.run_id,
            " ".join(record.argv),
            record.pid,
            record.status,
        )

    def _alive(self, record: JobRecord) -> bool:
        child = self._children.get(record.job_id)
        if child is not None:
            return child.poll() is None
        return _pid_runs(record.pid, self.run_dir(record.run_id))

    def refresh(self, record: JobRecord) -> JobView:
        """Observe one job now; persist its status if it changed."""
        run_dir = self.run_dir(record.run_id)
        progress = read_progress(run_dir)
        exit_code = _read_json(run_dir / EXIT_FILE).get("exit_code")
        settled = settle(record, progress, self._alive(record), exit_code, _log_tail(run_dir))
        if settled != record:
            self._save(settled)
        eta = eta_seconds(progress, time.time()) if settled.status in ACTIVE else None
        return JobView(settled, progress, eta)

    def jobs(self) -> list[JobView]:
        """Every studio job under the runs folder, newest first (re-attaches after a restart)."""
        records = [r for d in self.runs.glob("*/") if (r := read_record(d)) is not None]
        records.sort(key=lambda r: r.started_at, reverse=True)
        return [self.refresh(r) for r in records]

    def get(self, run_id: str) -> JobView:
        """One job by its run id."""
        record = read_record(self.run_dir(run_id))
        if record is None:
            raise JobError(f"run {run_id!r} was not started by the studio: no {JOB_FILE} in it")
        return self.refresh(record)

    def cancel(self, run_id: str, grace_s: float = 5.0) -> JobRecord:
        """Stop a running job: SIGTERM to its process group, SIGKILL after ``grace_s``."""
        view = self.get(run_id)
        if view.record.status not in ACTIVE:
            raise JobError(
                f"job {run_id!r} is {view.record.status}, not running: nothing to cancel"
            )
        pid = view.record.pid
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while self._alive(view.record) and time.monotonic() < deadline:
                time.sleep(0.05)
            if self._alive(view.record):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        progress = read_progress(self.run_dir(run_id))
        where = f" at step {progress.done} of {progress.total}" if progress.total else ""
        record = replace(
            view.record,
            status="cancelled",
            ended_at=time.time(),
            message=f"cancelled by user{where}",
            resumable=True,
        )
        self._save(record)
        child = self._children.pop(record.job_id, None)
        if child is not None:
            child.wait(timeout=grace_s)
        return record

    def resume(self, run_id: str) -> JobRecord:
        """Start a stopped job again in the same run directory, with ``--resume`` if it takes it."""
        view = self.get(run_id)
        if view.record.status in ACTIVE:
            raise JobError(f"job {run_id!r} is still running: cancel it first")
        if not view.record.resumable:
            raise JobError(
                f"job {run_id!r} is {view.record.status}: only a cancelled, failed or "
                "lost job can be resumed"
            )
        argv = list(view.record.argv)
        if view.record.kind in ("train", "baseline") and "--resume" not in argv:
            argv += ["--resume", str(self.run_dir(run_id))]
        return self.launch(view.record.kind, argv, run_id=run_id, resumable=True)


def supervise(run_dir: Path, argv: list[str]) -> int:
    """Run ``argv``, forward SIGTERM to it, and record its exit code in ``exit.json``."""
    try:
        child = subprocess.Popen(argv)
    except OSError as err:  # a missing program is a failed job, not a crashed supervisor
        print(f"cannot start {argv[0]!r}: {err}", flush=True)
        _write_json(run_dir / EXIT_FILE, {"exit_code": 127, "ended_at": time.time()})
        return 127

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = child.wait()
    _write_json(run_dir / EXIT_FILE, {"exit_code": code, "ended_at": time.time()})
    return code


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        raise SystemExit("usage: python -m studio.jobs RUN_DIR -- COMMAND [ARGS...]")
    raise SystemExit(supervise(Path(sys.argv[1]), sys.argv[3:]))
