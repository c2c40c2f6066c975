"""The study's plumbing on the ``tiny`` profile: every arm, evaluation and the report; resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envace_engine.config import ConfigError, build, load
from recipes.study.config import ARMS, StudyConfig

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "configs" / "study-tiny.toml"
CORE_TINY = ROOT / "configs" / "study-core-tiny.toml"
CORE = ROOT / "configs" / "study-core.toml"
TINY_ARMS = tuple(load(StudyConfig, TINY).arms)
# timings (and the report's costs, made of them) differ between two runs; nothing else may
VOLATILE = ("wall_s", "seconds", "perf/", "costs")


def _study(home: Path, *args: str) -> subprocess.Popen:
    # one thread per process in every run, so that a study in lanes (one thread per lane on
    # the 2-core machine) computes what the sequential study computes
    env = {**os.environ, "ENVACE_HOME": str(home), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "envace_engine.cli", "study", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _stable(value):
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if not any(s in k for s in VOLATILE)}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _report(home: Path) -> dict:
    return json.loads((home / "runs" / "study-tiny" / "report.json").read_text())


def test_arm_configs_differ_only_by_their_definition():
    cfg = load(StudyConfig, TINY)
    arms = {a: cfg.arm_config(a, f"r-{a}") for a in ARMS}
    assert arms["envace"].mode == "envace" and arms["envace"].advantages.role_wise
    assert not arms["shared-baseline"].advantages.role_wise
    assert {a.mode for a in arms.values()} == {"envace", "real-grpo", "act-only", "simulator"}
    shared = {(a.steps, a.tasks_per_step, a.group_size, a.seed, a.model) for a in arms.values()}
    assert len(shared) == 1 and all(a.checkpoint_every == 1 for a in arms.values())
    fid = arms["fidelity"]  # envace with the world role's truth signals of [fidelity]
    assert fid.mode == "envace" and fid.world.task_weight == cfg.fidelity.task_weight < 1
    assert fid.loss.world_nll == cfg.fidelity.world_nll
    others = [a for name, a in arms.items() if name != "fidelity"]
    assert all(a.world.task_weight == 1 and a.loss.world_nll == 0 for a in others)


def test_bad_study_configs_name_the_problem():
    with pytest.raises(ConfigError, match="arms"):
        build(StudyConfig, {"model": "tiny", "arms": ["envace", "moon"]})
    with pytest.raises(ConfigError, match="budgets must include 0"):
        build(StudyConfig, {"model": "tiny", "eval": {"budgets": [1, 2]}})
    with pytest.raises(ConfigError, match=r"unknown key 'train\.stpes'"):
        build(StudyConfig, {"model": "tiny", "train": {"stpes": 3}})


def _sft_checkpoint(folder: Path) -> Path:
    """The tiny model saved as a checkpoint whose prompt record differs from the defaults
    (ungrounded rehearse prompts), so an arm that lost the record on --resume would train on
    other prompts than the uninterrupted study's and the two reports would differ."""
    from envace_engine.config import RolloutSettings, write_prompt_settings
    from envace_engine.models import load_model, load_tokenizer, resolve

    spec = resolve("tiny")
    load_model(spec).save_pretrained(folder)
    load_tokenizer(spec).save_pretrained(folder)
    record = RolloutSettings(grounded_rehearsal=False, n_examples=0, rehearse_history=False)
    write_prompt_settings(folder, record)
    return folder


@pytest.mark.slow
def test_tiny_study_runs_every_arm_and_a_killed_study_resumes_to_the_same_report(tmp_path):
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    sft = f"model={_sft_checkpoint(tmp_path / 'sft')}"
    done = _study(whole, "--config", str(TINY), "--set", sft, "--one-process")
    assert done.wait(timeout=600) == 0, done.stdout.read().decode()[-3000:]
    log = done.stdout.read().decode()
    _assert_each_arm_evaluated_before_the_next_trains(log)
    assert "fresh process" not in log
    report = _report(whole)
    assert {a["status"] for a in report["arms"].values()} == {"done"}
    names = {r["checkpoint"] for r in report["table"]}
    assert names == {"base", "sft", *TINY_ARMS}
    settings = {r["setting"] for r in report["table"] if r["checkpoint"] == "envace"}
    assert settings == {"plain N=0", "parallel N=1", "sequential N=1", "select N=2"}
    assert len(report["verdicts"]) == 5 and all(v["verdict"] for v in report["verdicts"])
    assert {"heldout/success", "loss"} <= set(report["curves"]["envace"]["1"])
    # the step-0 probe of the SFT checkpoint ran once and every arm's curve starts with it
    kept = json.loads((whole / "runs" / "study-tiny" / "study.json").read_text())["start_probe"]
    assert kept["key"] and "heldout/success" in kept["metrics"]
    starts = [report["curves"][arm]["0"] for arm in TINY_ARMS]
    held = [{k: v for k, v in p.items() if k.startswith("heldout/")} for p in starts]
    assert held[0] and all(h == held[0] for h in held)

    _bundle_installs(whole / "runs" / "study-tiny", tmp_path)

    # the default, a fresh process per unit: kill -9 once the first arm has finished a step
    # (the study has already moved to a fresh process once), then resume
    proc = _study(broken, "--config", str(TINY), "--set", sft)
    state = broken / "runs" / "study-tiny" / "study.json"
    _wait_for_a_step(state)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    resumed = _study(broken, "--resume", "study-tiny")
    assert resumed.wait(timeout=600) == 0, resumed.stdout.read().decode()[-3000:]
    # one fresh process after each unit: at least the arms after envace, their evals and base
    handovers = resumed.stdout.read().decode().count("next unit in a fresh process")
    assert handovers >= 2 * (len(TINY_ARMS) - 1) + 1, handovers
    assert _stable(_report(broken)) == _stable(report)  # the same as in one process
    for arm in TINY_ARMS:  # every arm, also those started after the resume, used the record
        manifest = json.loads((broken / "runs" / f"study-tiny--{arm}" / "run.json").read_text())
        assert manifest["config"]["rollout"]["grounded_rehearsal"] is False, arm
    # the killed process's time was banked step by step, not lost with it
    assert all(a["seconds"] > 0 for a in _report(broken)["arms"].values())

    _lanes_killed_and_resumed(tmp_path / "lanes", sft, report)


LANE_ARMS = ("envace", "act-only")  # two arms, one per lane: what lanes add, at half the cost


def _for_arms(report: dict, arms: tuple[str, ...]) -> dict:
    """What ``report`` says about base, sft and ``arms`` (a study of fewer arms judges fewer
    claims, so verdicts are left out), without timings."""
    keep = {"base", "sft", *arms}
    return _stable(
        {
            "arms": {a: report["arms"][a] for a in arms},
            "curves": {a: report["curves"][a] for a in arms},
            "table": [r for r in report["table"] if r["checkpoint"] in keep],
            "world": [r for r in report["world"] if r["checkpoint"] in keep],
        }
    )


def _lanes_killed_and_resumed(home: Path, sft: str, expected: dict) -> None:
    """A study of two arms in two lanes: kill -9 its supervisor once the first arm has a step
    (its lanes die with it), resume: for those arms, what the sequential study reported."""
    arms = f"arms={json.dumps(list(LANE_ARMS))}"
    proc = _study(home, "--config", str(TINY), "--set", sft, "--set", arms, "--set", "lanes=2")
    state = home / "runs" / "study-tiny" / "study.json"
    _wait_for_a_step(state)
    claims = _wait_for_claims(state, 2)
    assert len(claims) == 2, claims  # two lanes at work
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 30
    while time.time() < deadline and any(_alive(pid) for pid in claims.values()):
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in claims.values())  # the lanes died with it
    resumed = _study(home, "--resume", "study-tiny")
    log = resumed.communicate(timeout=600)[0].decode()
    assert resumed.returncode == 0, log[-3000:]
    assert "lanes: 2 processes of 1 thread(s) each" in log
    assert "was cut off; it continues from its last record" in log
    report = _report(home)
    assert _for_arms(report, LANE_ARMS) == _for_arms(expected, LANE_ARMS)
    assert report["costs"]["lanes"] == 2 and report["costs"]["wall_h"] > 0


def _wait_for_a_step(state: Path) -> None:
    """Until the first arm has recorded a step in ``state`` (study.json), for up to 5 min."""
    deadline = time.time() + 300
    while time.time() < deadline:
        if state.is_file() and json.loads(state.read_text())["arms"]["envace"]["steps_done"] >= 1:
            return
        time.sleep(0.2)


def _wait_for_claims(state: Path, n: int) -> dict:
    """The units claimed in ``state`` once ``n`` lanes hold one, for up to 5 min: on a loaded
    machine the second lane may claim its unit after the first arm's first step."""
    deadline = time.time() + 300
    while True:
        claims = json.loads(state.read_text())["claims"]
        if len(claims) >= n or time.time() > deadline:
            return claims
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _assert_each_arm_evaluated_before_the_next_trains(log: str) -> None:
    """The study's order (study.runner): sft's evaluation, then each arm and its evaluation,
    then base — so a study stopped part-way has finished arms, not only trained ones."""
    units = [ln.split(":")[0] for ln in log.splitlines() if ln.startswith(("eval ", "arm "))]
    units = [u for i, u in enumerate(units) if u not in units[:i]]
    expected = ["eval sft"]
    for arm in TINY_ARMS:
        expected += [f"arm {arm}", f"eval {arm}"]
    assert units == [*expected, "eval base"], units


def _bundle_installs(study: Path, tmp_path: Path) -> None:
    """scripts/make_demo_bundle.py slices the finished study; the studio installs the slice."""
    import importlib.util

    from studio.demo import install

    spec = importlib.util.spec_from_file_location(
        "bundle", ROOT / "scripts" / "make_demo_bundle.py"
    )
    assert spec is not None and spec.loader is not None
    bundle = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bundle)
    sizes = bundle.build(study, tmp_path / "bundle", episode_steps=1)
    expected = {"study-tiny", "study-tiny--eval-sft", "study-tiny--eval-envace"}
    expected |= {"study-tiny--fidelity-envace", *(f"study-tiny--{arm}" for arm in TINY_ARMS)}
    assert set(sizes) == expected
    arm_steps = tmp_path / "bundle" / "study-tiny--envace" / "episodes"
    assert len(list(arm_steps.glob("step-*.parquet"))) == 1  # only the last step's episodes
    assert not list((tmp_path / "bundle").rglob("checkpoints"))  # weights never bundled
    assert set(install(tmp_path / "fresh", tmp_path / "bundle")) == expected


@pytest.mark.slow
def test_the_core_protocols_tiny_profile_runs_every_unit_and_judges_the_world_claims(tmp_path):
    """configs/study-core-tiny.toml: the world-model protocol's plumbing (every arm, every
    evaluation, the claims (a′)–(d′) and the collusion columns), on the random tiny model."""
    sft = f"model={_sft_checkpoint(tmp_path / 'sft')}"
    done = _study(tmp_path, "--config", str(CORE_TINY), "--set", sft, "--one-process")
    assert done.wait(timeout=600) == 0, done.stdout.read().decode()[-3000:]
    report = json.loads((tmp_path / "runs" / "study-core-tiny" / "report.json").read_text())
    arms = load(StudyConfig, CORE_TINY).arms
    assert "fidelity" in arms and {a["status"] for a in report["arms"].values()} == {"done"}
    assert [v["claim"][:4] for v in report["verdicts"]] == ["(a′)", "(b′)", "(c′)", "(d′)"]
    assert all(v["verdict"] for v in report["verdicts"])
    assert {"base", "sft", *arms} == {r["checkpoint"] for r in report["table"]}
    assert all("collusion" in w for w in report["world"])
    text = (tmp_path / "runs" / "study-core-tiny" / "report.md").read_text()
    assert "| echo | error recall | errors as success | answer from a wrong rehearsal |" in text


def test_the_core_protocol_continues_its_committed_sft_adapter_as_lora():
    """configs/study-core.toml starts from the SFT adapter committed in the repository (not a
    run folder a later session would not have), trained on the world-state prompts, and every
    arm continues it as a LoRA adapter of the same rank, so each finished unit is small enough
    to commit and a later session continues from the committed study folder."""
    from envace_engine import adapters
    from envace_engine.config import PROMPT_FILE

    cfg = load(StudyConfig, CORE)
    sft = ROOT / cfg.model
    assert adapters.is_adapter_dir(sft), f"{sft}: commit the SFT adapter (docs/study.md)"
    assert adapters.recorded_base(sft) == cfg.base_model
    assert adapters.adapter_config(sft)["r"] == cfg.train.lora.rank
    assert json.loads((sft / PROMPT_FILE).read_text())["world_state"] is True
    assert sum(f.stat().st_size for f in sft.iterdir()) < 25 * 2**20
    for arm in cfg.arms:
        assert cfg.arm_config(arm, f"r-{arm}").lora.enabled, arm
