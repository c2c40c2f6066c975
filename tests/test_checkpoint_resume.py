"""Checkpoints hold everything a run needs, atomically; a killed run resumes exactly."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from envace_engine.training import checkpoint
from envace_engine.training.checkpoint import TrainState
from envace_engine.training.trainer import draw_tasks
from envace_engine.types import Task

JOB = Path(__file__).resolve().parent / "train_job.py"


def _fresh_model(tiny_path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_path)


def _one_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def test_save_restore_round_trip(tiny_path: Path, tokenizer, tmp_path: Path) -> None:
    model = _fresh_model(tiny_path)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _one_step(model, optimizer)
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    state = TrainState(step=3, data_position=12, config={"seed": 0})
    path = checkpoint.save(tmp_path, state, model, tokenizer, optimizer)
    after_save = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    saved_exp_avg = [optimizer.state[p]["exp_avg"].clone() for p in model.parameters()]

    _one_step(model, optimizer)  # move weights, optimizer and RNG away from the checkpoint
    random.random(), np.random.rand(), torch.rand(1)
    restored = checkpoint.restore(path, model, optimizer)

    assert restored == state
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, saved[name]), name
    for p, expected in zip(model.parameters(), saved_exp_avg, strict=True):
        assert torch.equal(optimizer.state[p]["exp_avg"], expected)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == after_save
    assert (path / "config.json").is_file()  # also a plain HF checkpoint: model = "<path>"


def test_latest_ignores_temporaries_and_prunes(tiny_path: Path, tokenizer, tmp_path: Path) -> None:
    model = _fresh_model(tiny_path)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, TrainState(step, step, {}), model, tokenizer, optimizer, keep=2)
    names = [p.name for p in checkpoint.list_checkpoints(tmp_path)]
    assert names == ["step-000002", "step-000003"]
    # a half-written checkpoint (killed before the rename) and one without state.json
    (tmp_path / "checkpoints" / ".step-000004.tmp123").mkdir()
    (tmp_path / "checkpoints" / "step-000005").mkdir()
    assert checkpoint.latest(tmp_path) == tmp_path / "checkpoints" / "step-000003"
    assert checkpoint.latest(tmp_path / "nothing") is None


def _tasks(n: int) -> list[Task]:
    return [
        Task(id=f"t{i}", suite="toy", user_turns=("hi",), tools=(), initial_state={})
        for i in range(n)
    ]


def test_draw_tasks_continues_from_any_position() -> None:
    tasks = _tasks(5)
    first, pos = draw_tasks(tasks, seed=7, position=0, per_rank=3)
    second, pos2 = draw_tasks(tasks, seed=7, position=pos, per_rank=3)
    assert (pos, pos2) == (3, 6)
    whole, _ = draw_tasks(tasks, seed=7, position=0, per_rank=6)
    assert [t.id for t in first + second] == [t.id for t in whole]
    assert sorted(t.id for t in whole[:5]) == [f"t{i}" for i in range(5)]  # an epoch is a perm
    other, _ = draw_tasks(tasks, seed=8, position=0, per_rank=5)
    assert [t.id for t in other] != [t.id for t in whole[:5]]


def test_draw_tasks_splits_between_ranks() -> None:
    tasks = _tasks(8)
    whole, _ = draw_tasks(tasks, seed=0, position=4, per_rank=4)
    r0, end0 = draw_tasks(tasks, seed=0, position=4, per_rank=2, rank=0, world=2)
    r1, end1 = draw_tasks(tasks, seed=0, position=4, per_rank=2, rank=1, world=2)
    assert end0 == end1 == 8
    assert [t.id for t in r0] == [t.id for t in whole[0::2]]
    assert [t.id for t in r1] == [t.id for t in whole[1::2]]


def _job(run_dir: Path, *args: str) -> list[str]:
    return [sys.executable, str(JOB), str(run_dir), "steps=4", "checkpoint_every=1", *args]


@pytest.mark.slow
def test_kill_and_resume_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    straight = subprocess.Popen(_job(tmp_path / "straight"), env=env)
    killed = subprocess.Popen(_job(tmp_path / "killed"), env=env)
    marker = tmp_path / "killed" / "checkpoints" / "step-000002" / "state.json"
    deadline = time.monotonic() + 900
    while not marker.exists():
        assert killed.poll() is None, "the job ended before its step-2 checkpoint"
        assert time.monotonic() < deadline, "no step-2 checkpoint after 15 minutes"
        time.sleep(0.2)
    os.kill(killed.pid, signal.SIGKILL)  # between steps (or inside step 3): no clean-up at all
    killed.wait()
    assert killed.returncode == -signal.SIGKILL
    assert not (tmp_path / "killed" / "params.sha256").exists()
    subprocess.run(_job(tmp_path / "killed", "--resume"), env=env, check=True, timeout=900)
    assert straight.wait(timeout=900) == 0
    want = (tmp_path / "straight" / "params.sha256").read_text()
    got = (tmp_path / "killed" / "params.sha256").read_text()
    assert got == want
    # and training did something: the weights are not the initial ones
    assert (tmp_path / "straight" / "params.initial.sha256").read_text() != want
