"""Data-parallel training: 2 CPU processes (gloo) run 2 steps and end with identical weights."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from envace_engine.training.parallel import distributed

JOB = Path(__file__).resolve().parent / "train_job.py"


def test_single_process_needs_no_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    d = distributed.init()
    assert (d.rank, d.world_size, d.is_main, d.enabled) == (0, 1, True, False)
    assert distributed.total(3.0, d) == 3.0
    assert distributed.gather("x", d) == ["x"]
    assert distributed.share({"a": 1}, d) == {"a": 1}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_two_ranks_end_with_identical_parameters(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
        "--master_addr=127.0.0.1", f"--master_port={_free_port()}",
        str(JOB), str(run_dir), "steps=2", "tasks_per_step=1", "checkpoint_every=2",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    subprocess.run(cmd, env=env, check=True, timeout=1200)
    rank0 = (run_dir / "params.rank0.sha256").read_text()
    rank1 = (run_dir / "params.rank1.sha256").read_text()
    assert rank0 == rank1, "ranks diverged: gradients were not averaged"
    assert rank0 != (run_dir / "params.initial.sha256").read_text(), "nothing was trained"
    # rank 0 stored both ranks' episodes (1 task x group 2 each) for each step
    lines = (run_dir / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == 2 * 2 * 2
    assert (run_dir / "checkpoints" / "step-000002" / "state.json").is_file()
