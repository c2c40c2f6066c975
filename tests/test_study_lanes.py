"""Study lanes (``study.lanes``): shared ``study.json`` writes, unit claims, the order units are
taken in, and what a lane may not do. The tiny study run in lanes, killed and resumed, is in
``tests/test_study.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from envace_engine.config import build
from recipes.study.config import StudyConfig
from recipes.study.lanes import (
    LanesError,
    Unit,
    blocked,
    claim,
    finished,
    lane_threads,
    lane_units,
    prepare,
    release,
)
from recipes.study.state import ArmState, CheckpointEval, Owned, StudyState, merge_save


class Sinks:
    """``RunSinks`` over a folder (only ``path`` is used by what is tested here)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, run_id: str) -> Path:
        return self.root / run_id

    def open(self, *args, **kwargs):  # pragma: no cover - never opened here
        raise AssertionError("no run is opened")


def _config(**extra) -> StudyConfig:
    body = {"model": "tiny", "arms": ["envace", "real-grpo"], "lanes": 2, **extra}
    body["eval"] = {"budgets": [0, 1], "modes": ["parallel"], "select_budgets": []}
    return build(StudyConfig, body)


def _study(folder: Path, config: StudyConfig) -> StudyState:
    folder.mkdir(parents=True, exist_ok=True)
    return prepare(config, folder, lambda message: None)


def test_two_lanes_writing_their_own_parts_keep_each_others(tmp_path):
    config = _config()
    _study(tmp_path, config)
    a, b = StudyState.load(tmp_path), StudyState.load(tmp_path)
    assert a is not None and b is not None
    record = a.arms["envace"]
    record.steps_done, record.status = 3, "running"
    a.curves["envace"] = {"0": {"loss": 1.0}}
    merge_save(a, tmp_path, Owned(arms=frozenset({"envace"})))
    b.evals["sft"] = CheckpointEval("tiny", "s--eval-sft")
    b.arms["envace"].steps_done = 99  # b does not own envace: never written
    merge_save(b, tmp_path, Owned(evals=frozenset({"sft"})))
    record.steps_done = 4
    merge_save(a, tmp_path, Owned(arms=frozenset({"envace"})))
    disk = StudyState.load(tmp_path)
    assert disk is not None
    assert disk.arms["envace"].steps_done == 4 and disk.curves["envace"] == {"0": {"loss": 1.0}}
    assert "sft" in disk.evals  # b's evaluation survived a's later write
    assert a.arms["envace"] is record  # the owner's objects stay the ones it holds
    # the rest is brought up to date at each write: b's 99 is gone, a sees b's evaluation
    assert b.arms["envace"].steps_done == 3 and "sft" in a.evals


def test_lanes_claim_units_in_the_studys_order_and_wait_for_an_arms_training(tmp_path):
    config = _config()
    _study(tmp_path, config)
    sinks = Sinks(tmp_path)
    first, _ = claim(config, tmp_path, sinks, pid=101)
    second, _ = claim(config, tmp_path, sinks, pid=102)
    third, _ = claim(config, tmp_path, sinks, pid=103)
    assert [u.key for u in (first, second, third)] == [
        "train:envace",
        "train:real-grpo",
        "eval:sft",
    ]
    state = StudyState.load(tmp_path)
    assert state is not None
    assert state.claims == {"train:envace": 101, "train:real-grpo": 102, "eval:sft": 103}
    units = lane_units(config, state, sinks)
    assert [u.key for u in units] == [
        "train:envace",
        "train:real-grpo",
        "eval:sft",
        "eval:envace",
        "eval:real-grpo",
        "eval:base",
    ]
    assert blocked(units[3], state) and not blocked(units[5], state)
    fourth, waiting = claim(config, tmp_path, sinks, pid=104)
    assert fourth == Unit("eval", "base", "smollm2-135m")
    nothing, waiting = claim(config, tmp_path, sinks, pid=105)
    assert nothing is None and waiting  # the arms' evaluations wait for their training
    release(tmp_path, 101)
    state = StudyState.load(tmp_path)
    assert state is not None and "train:envace" not in state.claims


def test_finished_units_are_not_claimed_and_a_failed_arm_has_no_evaluation(tmp_path):
    config = _config()
    state = _study(tmp_path, config)
    state.arms["envace"] = ArmState("x--envace", status="failed", reason="diverged")
    state.arms["real-grpo"] = ArmState("x--real-grpo", status="done", checkpoint="/ck")
    state.save(tmp_path)
    units = {u.key: u for u in lane_units(config, state, Sinks(tmp_path))}
    assert finished(units["train:envace"], state, 3) and finished(units["eval:envace"], state, 3)
    assert units["eval:real-grpo"].model == "/ck" and not blocked(units["eval:real-grpo"], state)
    unit, _ = claim(config, tmp_path, Sinks(tmp_path), pid=7)
    assert unit is not None and unit.key == "eval:sft"
    unit, _ = claim(config, tmp_path, Sinks(tmp_path), pid=7)
    assert unit is not None and unit.key == "eval:real-grpo"


def test_a_resumed_study_clears_dead_lanes_claims_and_refuses_live_ones(tmp_path):
    config = _config()
    state = _study(tmp_path, config)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    state.claims = {"train:envace": dead.pid}
    state.save(tmp_path)
    messages: list[str] = []
    assert prepare(config, tmp_path, messages.append).claims == {}
    assert messages == ["lanes: train:envace was cut off; it continues from its last record"]
    state.claims = {"train:envace": os.getpid()}  # this process: alive
    state.save(tmp_path)
    with pytest.raises(LanesError, match=r"still run .*stop them"):
        prepare(config, tmp_path, messages.append)


def test_a_lost_arm_checkpoint_is_retrained_only_without_lanes(tmp_path):
    config = _config()
    state = _study(tmp_path, config)
    state.arms["envace"] = ArmState("x--envace", status="done", checkpoint=str(tmp_path / "gone"))
    state.save(tmp_path)
    with pytest.raises(LanesError, match="--set lanes=1"):
        prepare(config, tmp_path, lambda message: None)


def test_threads_per_lane(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = len(os.sched_getaffinity(0))
    assert lane_threads(1) == cores and lane_threads(cores * 4) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert lane_threads(2) == 3  # the user's setting wins


def test_lanes_is_validated():
    with pytest.raises(ValueError, match="lanes"):
        _config(lanes=0)
