"""Every config in configs/ and every committed run (docs/, the studio's demo bundle) still
loads: a config with its job's class, a run's manifest with storage, and the job a run
recorded rebuilds (a study, a training run, an evaluation or sweep, also one recorded before
the job specs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envace_engine.config import SFTConfig, TrainConfig, build, load
from envace_engine.specs import SPECS, EvalSpec, SweepSpec, spec_of_run
from recipes.study.config import StudyConfig
from storage.layout import read_manifest

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted((ROOT / "configs").glob("*.toml"))
RUNS = sorted(p.parent for d in ("recipes", "studio/demo") for p in (ROOT / d).rglob("run.json"))


def _kind_of(path: Path) -> type:
    if "sft" in path.stem and path.stem.startswith("study-"):
        return SFTConfig
    return StudyConfig if path.stem.startswith("study-") else TrainConfig


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_loads(path: Path) -> None:
    load(_kind_of(path), path)


def test_the_committed_runs_are_found() -> None:
    assert len(RUNS) >= 10 and any(r.name == "core-s0" for r in RUNS)


@pytest.mark.parametrize("run", RUNS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_committed_run_loads_and_its_job_rebuilds(run: Path) -> None:
    manifest = read_manifest(run)
    config = manifest.config
    if manifest.kind == "study":
        build(StudyConfig, config)
    elif manifest.kind in ("train", "sft"):
        build(TrainConfig if manifest.kind == "train" else SFTConfig, config)
    elif "study" in config:  # a study's evaluation: its job is the study's (checked above)
        assert set(config) == {"checkpoint", "study"}
    elif manifest.kind in SPECS:
        spec_of_run(manifest.kind, manifest.model, manifest.suite, config)


def test_an_old_sweep_record_rebuilds_its_spec() -> None:
    old = {"examples": 0, "checkpoints": ["a", "b"], "modes": "parallel,select", "budgets": [0, 2]}
    spec = spec_of_run("sweep", "a,b", "toy", {**old, "judge_url": "http://h:1", "n_tasks": 3})
    assert isinstance(spec, SweepSpec)
    assert (spec.model, spec.modes, spec.n_examples, spec.judge) == (
        ("a", "b"),
        ("parallel", "select"),
        0,
        "http://h:1",
    )
    new = spec_of_run("eval", "tiny", "toy", {"n_tasks": 2})
    assert isinstance(new, EvalSpec) and new.model == "tiny"
    with pytest.raises(ValueError, match="runs of kind 'study' have no job spec here"):
        spec_of_run("study", "m", "toy", {})


def test_a_sweep_written_now_rebuilds_from_its_record() -> None:
    spec = SweepSpec(model=("a",), suite="toy")
    record = json.loads(json.dumps(spec.record()))
    assert spec_of_run("sweep", "a", "toy", record) == spec
