"""``report_to``: a real tiny training run logs its metrics to trackio (local, offline)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from envace_engine.tracking import open_tracker

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def _logged(db: Path, run: str) -> dict[int, dict[str, float]]:
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT step, metrics FROM metrics WHERE run_name = ?", (run,))
        return {step: json.loads(body) for step, body in rows}


def train_reporting(tmp_path: Path, run_id: str, *more: str) -> Path:
    """Run a tiny training run reporting to trackio in a fresh process (trackio reads
    TRACKIO_DIR once, at import); returns the trackio folder."""
    folder = tmp_path / "trackio"
    args = ["train", "--config", str(CONFIGS / "tiny-test.toml"), "--set", "report_to=trackio"]
    extra = ["--set", f"root={tmp_path / 'root'}", "--set", f"run_id={run_id}", *more]
    env = {**os.environ, "TRACKIO_DIR": str(folder)}
    cmd = [sys.executable, "-m", "envace_engine.cli", *args, *extra]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return folder


def test_a_training_run_reports_every_step_to_trackio(tmp_path):
    train_reporting(tmp_path, "tracked")
    logged = _logged(tmp_path / "trackio" / "envace.db", "tracked")
    assert sorted(logged) == [0, 1]  # tiny-test.toml: 2 steps
    assert all("loss" in m and "reward/mean" in m for m in logged.values())
    stored = json.loads((tmp_path / "root" / "runs" / "tracked" / "run.json").read_text())
    assert stored["config"]["report_to"] == "trackio"


def test_unknown_or_missing_trackers_name_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    assert open_tracker("none", "p", "r", {}) is None
    with pytest.raises(ValueError, match="choose one of none, trackio, wandb"):
        open_tracker("mlflow", "p", "r", {})
    with pytest.raises(ValueError, match="pip install wandb"):
        open_tracker("wandb", "p", "r", {})
