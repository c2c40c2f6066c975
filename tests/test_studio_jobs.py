"""The job manager with real subprocesses: launch, progress, done, failure, cancel, re-attach."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from studio.jobs import (
    JobError,
    JobManager,
    JobRecord,
    Progress,
    eta_seconds,
    format_duration,
    read_record,
    settle,
)

# A real job: writes progress.json the way storage's RunWriter does, one step per `pause` s.
STEPPER = """
import json, os, sys, time
run_dir, total, pause, code = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
start = time.time()
for done in range(total + 1):
    data = {"done": done, "total": total, "status": "running", "message": f"step {done}",
            "started_at": start, "updated_at": time.time(), "eta_s": None, "pid": os.getpid()}
    tmp = os.path.join(run_dir, ".p.tmp")
    open(tmp, "w").write(json.dumps(data))
    os.replace(tmp, os.path.join(run_dir, "progress.json"))
    if done < total:
        time.sleep(pause)
print("boom: out of widgets" if code else "all steps done")
sys.exit(code)
"""


def stepper(total: int, pause: float, code: int = 0) -> list[str]:
    return [sys.executable, "-c", STEPPER, "{run_dir}", str(total), str(pause), str(code)]


def wait_for(manager: JobManager, run_id: str, status: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = manager.get(run_id)
        if view.record.status == status:
            return view
        time.sleep(0.1)
    raise AssertionError(f"{run_id} never reached {status}: {manager.get(run_id)}")


def test_job_runs_to_done_with_progress(tmp_path: Path):
    manager = JobManager(tmp_path)
    record = manager.launch("rollout", stepper(total=3, pause=0.05), run_id="r1")
    view = wait_for(manager, "r1", "done")
    assert view.progress.done == 3 and view.progress.total == 3
    assert view.record.exit_code == 0
    assert "all steps done" in (tmp_path / "runs" / "r1" / "job.log").read_text()
    assert read_record(tmp_path / "runs" / "r1").status == "done"
    assert record.pid is not None


def test_failed_job_reports_exit_code_and_last_line(tmp_path: Path):
    manager = JobManager(tmp_path)
    manager.launch("eval", stepper(total=2, pause=0.01, code=3), run_id="bad")
    view = wait_for(manager, "bad", "failed")
    assert view.record.exit_code == 3
    assert "exited with code 3 at step 2 of 2: boom: out of widgets" in view.label
    assert view.record.resumable


def test_missing_program_is_a_failed_job(tmp_path: Path):
    manager = JobManager(tmp_path)
    manager.launch("eval", ["/no/such/program"], run_id="missing")
    view = wait_for(manager, "missing", "failed")
    assert view.record.exit_code == 127
    assert "cannot start '/no/such/program'" in view.record.message


def test_cancel_then_resume(tmp_path: Path):
    manager = JobManager(tmp_path)
    manager.launch("train", stepper(total=200, pause=0.05), run_id="long", resumable=True)
    view = wait_for(manager, "long", "running")
    while manager.get("long").progress.total == 0:  # a busy machine may start it slowly
        time.sleep(0.05)
    cancelled = manager.cancel("long")
    assert cancelled.status == "cancelled"
    assert "cancelled by user at step" in cancelled.message
    with pytest.raises(JobError, match="not running: nothing to cancel"):
        manager.cancel("long")
    resumed = manager.resume("long")
    assert resumed.argv[-2:] == ("--resume", str(tmp_path / "runs" / "long"))
    assert resumed.pid != view.record.pid
    manager.cancel("long")


def test_restarted_studio_reattaches_to_a_live_job(tmp_path: Path):
    first = JobManager(tmp_path)
    first.launch("sweep", stepper(total=100, pause=0.05), run_id="live")
    while first.get("live").progress.total == 0:  # wait for the job's first report
        time.sleep(0.05)
    second = JobManager(tmp_path)  # a new studio process knows the job only from its files
    [view] = second.jobs()
    assert view.record.status == "running"
    assert view.progress.total == 100
    second.cancel("live")
    assert first.get("live").record.status == "cancelled"


def test_job_whose_supervisor_vanished_is_marked_lost(tmp_path: Path):
    manager = JobManager(tmp_path)
    run_dir = tmp_path / "runs" / "ghost"
    run_dir.mkdir(parents=True)
    (run_dir / "job.json").write_text(
        '{"job_id": "j", "kind": "train", "run_id": "ghost", "argv": ["x"], "pid": 999999999,'
        ' "status": "running", "started_at": 1.0}'
    )
    (run_dir / "progress.json").write_text('{"done": 4, "total": 10, "status": "running"}')
    view = manager.get("ghost")
    assert view.record.status == "lost"
    assert view.label == "lost: the job process ended while nobody was watching at step 4 of 10"


def test_settle_keeps_terminal_status():
    rec = JobRecord("j", "train", "r", ("x",), 1, "cancelled", 0.0, message="cancelled by user")
    assert settle(rec, Progress(done=5, total=5, status="done"), False, 0) is rec


def test_eta_from_elapsed_time():
    # 4 of 10 steps took 20 s → 5 s per step → 6 remaining steps = 30 s
    assert eta_seconds(Progress(done=4, total=10, started_at=100.0), now=120.0) == 30.0
    assert eta_seconds(Progress(done=4, total=10, started_at=100.0, eta_s=7.0), now=120.0) == 7.0
    assert eta_seconds(Progress(done=0, total=10, started_at=100.0), now=120.0) is None


def test_format_duration():
    assert format_duration(None) == "—"
    assert format_duration(12.4) == "12s"
    assert format_duration(185) == "3m 05s"
    assert format_duration(3720) == "1h 02m"


def test_empty_command_is_refused(tmp_path: Path):
    with pytest.raises(JobError, match="empty command"):
        JobManager(tmp_path).launch("eval", [])
