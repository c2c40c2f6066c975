"""Redoing a study arm: a new run from the start, the earlier run kept and listed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from envace_engine.cli import app
from envace_engine.config import build
from recipes.study.config import StudyConfig
from recipes.study.report import build_report, markdown
from recipes.study.runner import _redo_suffix
from recipes.study.state import ArmState, CheckpointEval, StudyState
from storage.layout import read_manifest, read_progress, run_dir
from storage.shards import RunWriter
from tests.studio_data import study_state


def test_redo_starts_the_arm_in_a_new_run_and_keeps_the_old_one_listed():
    config = build(StudyConfig, {"model": "tiny", "eval": {"bootstrap": 300}})
    state = study_state(config)
    other = state.arms["real-grpo"]
    fresh = state.redo("envace")
    assert fresh == ArmState("study-demo--envace-r2", retired=["study-demo--envace"])
    assert "envace" not in state.curves and "envace" not in state.evals
    assert state.arms["real-grpo"] is other and "real-grpo" in state.evals
    assert state.status == "running" and _redo_suffix(state, "envace") == "-r2"
    assert _redo_suffix(state, "real-grpo") == "" and _redo_suffix(state, "sft") == ""
    fresh.status, fresh.steps_done = "done", 40
    again = state.redo("envace")
    assert again.run_id == "study-demo--envace-r3"
    assert again.retired == ["study-demo--envace", "study-demo--envace-r2"]
    text = markdown(build_report(config, state))
    assert "Redone from the start in a new run: `envace` (earlier: study-demo--envace, " in text


def test_an_arm_that_never_ran_cannot_be_redone():
    state = StudyState("s", arms={"envace": ArmState("s--envace")})
    with pytest.raises(ValueError, match="has not run in study s: nothing to redo"):
        state.redo("envace")
    with pytest.raises(ValueError, match="'moon' has not run"):
        state.redo("moon")


def test_cli_redo_errors_name_the_problem(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVACE_HOME", str(tmp_path))
    runner = CliRunner(env={"COLUMNS": "400", "NO_COLOR": "1"})
    tiny = ["--config", "configs/study-tiny.toml"]
    result = runner.invoke(app, ["study", *tiny, "--redo", "envace"])
    assert result.exit_code == 2 and "pass --resume RUN with it" in result.output
    config = {"model": "tiny", "arms": ["envace", "real-grpo"]}
    with RunWriter.create(tmp_path, "study", model="tiny", config=config, run_id="st"):
        pass
    result = runner.invoke(app, ["study", "--resume", "st", "--redo", "moon"])
    assert result.exit_code == 2 and "moon: not an arm of this study" in result.output
    assert "envace, real-grpo" in result.output
    result = runner.invoke(app, ["study", "--resume", "st", "--redo", "envace"])
    assert result.exit_code == 2 and "nothing to redo" in result.output
    assert read_progress(run_dir(tmp_path, "st")).status == "done"  # not marked failed


def test_resume_may_change_only_eval_settings_and_records_them(tmp_path, monkeypatch):
    from recipes.study.cli import _study_config
    from recipes.study.evaluation import plan_settings
    from storage.layout import read_manifest

    monkeypatch.setenv("ENVACE_HOME", str(tmp_path))
    runner = CliRunner(env={"COLUMNS": "400", "NO_COLOR": "1"})
    config = build(StudyConfig, {"model": "tiny"}).model_dump(mode="json")
    with RunWriter.create(tmp_path, "study", model="tiny", config=config, run_id="st"):
        pass
    result = runner.invoke(app, ["study", "--resume", "st", "--config", "configs/study-tiny.toml"])
    assert (
        result.exit_code == 2 and "a resumed study keeps the config its run.json" in result.output
    )
    result = runner.invoke(app, ["study", "--resume", "st", "--set", "train.steps=3"])
    assert result.exit_code == 2 and "--set train.steps: a resumed study keeps" in result.output
    result = runner.invoke(app, ["study", "--resume", "st", "--set", "eval.select_budgets=[1]"])
    assert result.exit_code == 2 and "select at N = 1 replays the only imagined" in result.output
    assert read_manifest(run_dir(tmp_path, "st")).config == config  # nothing recorded

    cfg, _ = _study_config(None, "st", ["eval.select_budgets=[2]"])
    assert cfg.eval.select_budgets == (2,)
    recorded = read_manifest(run_dir(tmp_path, "st")).config
    assert recorded["eval"]["select_budgets"] == [2] and recorded["train"] == config["train"]
    again, _ = _study_config(None, "st", [])  # a later plain resume keeps the change
    labels = [s.label for s in plan_settings(again.eval.budgets, again.eval.modes, (2,))]
    assert again.eval.select_budgets == (2,) and labels[-1] == "select N=2"
    assert labels[:2] == ["plain N=0", "parallel N=1"]  # earlier settings keep their steps


def test_retired_runs_are_evaluated_last_and_only_when_asked(tmp_path):
    from recipes.study.cli import WriterSinks
    from recipes.study.runner import checkpoints

    sinks = WriterSinks(tmp_path, "toy")
    config = build(StudyConfig, {"model": "tiny", "arms": ["envace", "real-grpo"]})
    state = StudyState("s", arms={"envace": ArmState("s--envace", status="done", steps_done=3)})
    state.arms["real-grpo"] = ArmState("s--real-grpo", checkpoint="ckpt/rg")
    state.arms["envace"].checkpoint = "ckpt/e1"
    state.redo("envace").checkpoint = "ckpt/e2"
    for step in (2, 3):  # the retired run's checkpoints; only the newest complete one counts
        folder = sinks.path("s--envace") / "checkpoints" / f"step-{step:06d}"
        folder.mkdir(parents=True)
        (folder / "state.json").write_text("{}")
    plain = [name for name, _ in checkpoints(config, state, sinks)]
    assert plain == ["base", "sft", "envace", "real-grpo"]
    arms = ["envace", "real-grpo"]
    asked = build(StudyConfig, {"model": "tiny", "arms": arms, "eval": {"retired": ["s--envace"]}})
    found = checkpoints(asked, state, sinks)
    assert [name for name, _ in found] == [*plain, "envace-r1"]
    assert found[-1][1].endswith("s--envace/checkpoints/step-000003")
    assert dict(found)["envace"] == "ckpt/e2"  # the arm itself is its redone run
    typo = build(StudyConfig, {"model": "tiny", "arms": arms, "eval": {"retired": ["s--moon"]}})
    with pytest.raises(ValueError, match=r"s--moon: not an earlier run .* runs: s--envace\)"):
        checkpoints(typo, state, sinks)


def test_arms_keep_the_checkpoints_prompt_settings_across_a_resume(tmp_path):
    """The SFT checkpoint's prompt record fills the [train.rollout] keys the study does not set;
    a study rebuilt from its run.json (what --resume does) gives the arms the same settings."""
    import json

    from envace_engine.config import PROMPT_FILE, load

    model = tmp_path / "sft"
    model.mkdir()
    record = {"grounded_rehearsal": False, "n_examples": 0, "max_new_tokens_act": 128}
    (model / PROMPT_FILE).write_text(json.dumps(record))
    toml = tmp_path / "study.toml"
    toml.write_text(f'model = "{model}"\n[train.rollout]\nmax_new_tokens_act = 48\n')
    fresh = load(StudyConfig, toml)
    rollout = fresh.arm_config("envace", "r").rollout
    assert (rollout.grounded_rehearsal, rollout.n_examples) == (False, 0)  # the checkpoint's
    assert rollout.max_new_tokens_act == 48  # the study's own key wins
    resumed = build(StudyConfig, fresh.model_dump(mode="json"))
    for arm in ("envace", "real-grpo", "act-only", "shared-baseline"):
        assert resumed.arm_config(arm, "r") == fresh.arm_config(arm, "r"), arm


def test_a_study_refuses_a_starting_checkpoint_other_than_its_own(tmp_path: Path):
    """The digest of the starting checkpoint is recorded once; a rebuilt checkpoint with other
    weights is refused by name, the same bytes pass, and a registry model has no digest."""
    from recipes.study.runner import StartChanged, check_start

    ckpt = tmp_path / "model"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"weights-a")
    state = StudyState("s")
    check_start(str(ckpt), state)
    recorded = state.start_digest
    assert len(recorded) == 64
    check_start(str(ckpt), state)  # same bytes: fine
    (ckpt / "model.safetensors").write_bytes(b"weights-b")
    with pytest.raises(StartChanged, match=r"not the checkpoint this study started from"):
        check_start(str(ckpt), state)
    assert state.start_digest == recorded
    fresh = StudyState("t")
    check_start("tiny", fresh)
    assert fresh.start_digest == ""


def test_a_moved_starting_checkpoint_is_found_again_by_its_new_path(tmp_path, monkeypatch):
    """A study folder from an older clone names its SFT checkpoint where that clone kept it:
    the missing path is named with the way out (``--set model=``), which a resume accepts and
    records; the weights at the new path must still be the recorded ones."""
    from recipes.study.cli import _study_config
    from recipes.study.runner import StartChanged, check_start

    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "model.safetensors").write_bytes(b"weights-a")
    state = StudyState("st")
    check_start(str(tmp_path / "old"), state)
    (tmp_path / "old").rename(tmp_path / "new")
    with pytest.raises(StartChanged, match=r"old: no checkpoint there.*--set model=ITS_NEW_PATH"):
        check_start(str(tmp_path / "old"), state)
    check_start(str(tmp_path / "new"), state)  # the same bytes, moved: fine

    monkeypatch.setenv("ENVACE_HOME", str(tmp_path))
    config = build(StudyConfig, {"model": str(tmp_path / "old")}).model_dump(mode="json")
    with RunWriter.create(tmp_path, "study", model="tiny", config=config, run_id="st"):
        pass
    cfg, _ = _study_config(None, "st", [f"model={tmp_path / 'new'}"])
    assert cfg.model == str(tmp_path / "new")
    assert read_manifest(run_dir(tmp_path, "st")).config["model"] == str(tmp_path / "new")


def test_an_arm_whose_checkpoints_were_lost_starts_again_cleanly():
    from recipes.study.runner import forget_lost_steps

    state = StudyState("s", arms={"envace": ArmState("s--envace", "running", 7, seconds=420.0)})
    state.curves["envace"] = {"0": {"loss": 1.0}, "6": {"loss": 0.5}}
    logged: list[str] = []
    forget_lost_steps(state, "envace", True, logged.append)  # checkpoint there: untouched
    assert state.arms["envace"].steps_done == 7 and "envace" in state.curves and not logged
    forget_lost_steps(state, "envace", False, logged.append)
    arm = state.arms["envace"]
    assert (arm.steps_done, arm.seconds) == (0, 0.0) and "envace" not in state.curves
    assert "7 steps" in logged[0]


def test_a_finished_arm_whose_checkpoint_was_lost_mid_evaluation_trains_again(tmp_path: Path):
    """Restored from a copy of study.json elsewhere: a done arm with an unfinished evaluation and
    no checkpoint on disk starts again; its partial evaluation comes back only when the
    retrained weights have the recorded digest."""
    from recipes.study.runner import digest, keep_verified_eval, reopen_lost_arm

    config = build(StudyConfig, {"model": "tiny", "eval": {"bootstrap": 300}})
    state = study_state(config)
    ckpt = tmp_path / "step-000040"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"weights-a")
    arm = state.arms["envace"]
    arm.checkpoint, arm.digest, arm.seconds = str(tmp_path / "gone"), digest(str(ckpt)), 9.0
    state.evals["envace"].fidelity = None  # the evaluation was in flight
    logged: list[str] = []
    assert reopen_lost_arm(state, "real-grpo", 2, logged.append) is None  # evaluated: untouched
    lost = reopen_lost_arm(state, "envace", 2, logged.append)
    assert lost is not None and set(lost.evaluation.settings) == {"plain N=0", "parallel N=2"}
    fresh = state.arms["envace"]
    assert (fresh.status, fresh.steps_done, fresh.seconds, fresh.digest) == ("pending", 0, 0.0, "")
    assert "envace" not in state.curves and "envace" not in state.evals
    assert "is gone; it trains again" in logged[-1]
    state.save(tmp_path)  # killed while the arm retrains: the set-aside evaluation is on disk
    reloaded = StudyState.load(tmp_path)
    assert reloaded is not None and reloaded.held == state.held
    assert state.held["envace"] is lost and lost.digest == digest(str(ckpt))
    keep_verified_eval(state, "envace", logged.append)  # still training: nothing happens
    assert "envace" in state.held and "envace" not in state.evals

    def retrained(weights: bytes) -> None:  # what train_arm records once the arm is done
        (ckpt / "model.safetensors").write_bytes(weights)
        fresh.status, fresh.checkpoint, fresh.digest = "done", str(ckpt), digest(str(ckpt))

    retrained(b"weights-a")
    keep_verified_eval(state, "envace", logged.append)
    assert state.evals["envace"] is lost.evaluation and not state.held
    assert lost.evaluation.model == str(ckpt)
    assert "2 settings kept" in logged[-1]
    assert reopen_lost_arm(state, "envace", 2, logged.append) is None  # checkpoint there

    fresh.checkpoint = str(tmp_path / "gone")
    lost = reopen_lost_arm(state, "envace", 2, logged.append)
    fresh = state.arms["envace"]
    retrained(b"weights-b")
    keep_verified_eval(state, "envace", logged.append)
    assert "envace" not in state.evals and "evaluated afresh" in logged[-1]


def test_arms_retrained_for_a_lost_checkpoint_run_after_the_arms_not_yet_trained(tmp_path: Path):
    """A restored study first trains the arms it has no results for, in config order."""
    from recipes.study.runner import arm_order

    config = build(StudyConfig, {"model": "tiny", "eval": {"bootstrap": 300}})
    state = study_state(config)
    arms = ["envace", "real-grpo", "act-only", "shared-baseline"]
    kept = tmp_path / "step-000040"
    kept.mkdir()
    for arm in arms:
        state.arms[arm] = ArmState(f"s--{arm}", "pending")
    state.arms["envace"].status, state.arms["envace"].checkpoint = "done", str(tmp_path / "gone")
    state.evals["envace"].fidelity = None  # evaluation unfinished, weights gone
    assert arm_order(state, arms, 2) == ["real-grpo", "act-only", "shared-baseline", "envace"]
    state.arms["envace"].checkpoint = str(kept)  # weights there: config order
    assert arm_order(state, arms, 2) == arms
    state.arms["envace"].checkpoint = str(tmp_path / "gone")
    state.evals["envace"].fidelity = state.evals["real-grpo"].fidelity  # evaluation complete
    assert arm_order(state, arms, 2) == arms


def test_base_is_evaluated_before_an_arm_trains_again_for_a_lost_checkpoint(tmp_path, monkeypatch):
    """A restored study evaluates the checkpoints no arm trains (base) before it spends an arm's
    training on results it has part of; a fresh study keeps arms first, base after them."""
    from recipes.study import runner
    from recipes.study.cli import WriterSinks

    config = build(
        StudyConfig,
        {"model": "tiny", "eval": {"budgets": [0, 2], "modes": ["parallel"], "select_budgets": []}},
    )
    units: list[str] = []

    def train(config, arm, state, sinks, save, log, keep=None):
        record = state.arms[arm]
        if record.status == "done":
            return False
        units.append(f"train {arm}")
        record.status, record.checkpoint = "done", str(kept)
        return True

    def evaluate(config, state, plan, name_model, sinks, save, log):
        name = name_model[0]
        if name in state.evals and state.evals[name].fidelity is not None:
            return False
        units.append(f"eval {name}")
        state.evals[name] = CheckpointEval(name_model[1], f"s--eval-{name}", fidelity=fidelity)
        return True

    monkeypatch.setattr(runner, "train_arm", train)
    monkeypatch.setattr(runner, "evaluate_checkpoint", evaluate)
    monkeypatch.setattr(runner, "build_report", lambda config, state: None)
    monkeypatch.setattr(runner, "write_report", lambda report, folder: None)
    kept = tmp_path / "step-000040"
    kept.mkdir()
    state = study_state(config)
    fidelity = state.evals["sft"].fidelity
    for arm in config.arms:
        state.arms[arm].checkpoint = str(kept)
    for arm in ("envace", "shared-baseline"):  # done, weights gone, evaluation unfinished
        state.arms[arm].checkpoint = str(tmp_path / "gone")
        state.evals[arm].fidelity = None
    state.status = "running"
    (tmp_path / "s").mkdir()
    state.save(tmp_path / "s")
    sinks = WriterSinks(tmp_path, "toy")
    list(runner.study_units(config, tmp_path / "s", sinks, lambda line: None))
    assert units == [
        "eval base",
        "train envace",
        "eval envace",
        "train shared-baseline",
        "eval shared-baseline",
    ]
    units.clear()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    list(runner.study_units(config, fresh, sinks, lambda line: None))
    arms = [u for arm in config.arms for u in (f"train {arm}", f"eval {arm}")]
    assert units == ["eval sft", *arms, "eval base"]


def test_study_pause_marks_a_stopped_study_and_refuses_a_running_one(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVACE_HOME", str(tmp_path))
    runner = CliRunner(env={"COLUMNS": "400", "NO_COLOR": "1"})
    config = {"model": "tiny", "arms": ["envace"]}
    writer = RunWriter.create(tmp_path, "study", model="tiny", config=config, run_id="st")
    path = run_dir(tmp_path, "st")
    StudyState("st", arms={"envace": ArmState("st--envace", steps_done=3)}).save(path)
    writer.progress(3, 40, "step 3/40")  # then the machine went away: status stays running
    assert read_progress(path).status == "running"
    alive = runner.invoke(app, ["study", "pause", "st"])  # this process's pid is recorded
    assert alive.exit_code == 2 and f"is running (pid {os.getpid()})" in alive.output
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    progress = json.loads((path / "progress.json").read_text())
    (path / "progress.json").write_text(json.dumps({**progress, "pid": int(gone.stdout)}))
    result = runner.invoke(app, ["study", "pause", "st"])
    assert result.exit_code == 0, result.output
    assert StudyState.load(path).status == "paused"  # type: ignore[union-attr]
    assert read_progress(path).status == "paused"
    assert (path / "report.md").read_text().startswith("# Study st (paused)")
    missing = runner.invoke(app, ["study", "pause", str(tmp_path)])
    assert missing.exit_code == 2 and "holds no study.json" in missing.output
