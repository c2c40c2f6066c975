"""A study whose arms train LoRA adapters keeps each finished arm's adapter in the study folder,
small enough to commit, and a copy of that folder alone (no run folders, no checkpoints)
continues elsewhere with ``--resume``: a study paused by ``--units`` after an arm trained is
evaluated there from the kept adapter, not trained again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from envace_engine import adapters
from tests.test_study import CORE_TINY, _study

LORA = [
    "--set",
    "train.lora.enabled=true",
    "--set",
    "train.lora.rank=4",
    "--set",
    'arms=["envace"]',
]
STUDY = "study-core-tiny"


@pytest.mark.slow
def test_a_lora_study_keeps_its_adapters_and_resumes_from_the_study_folder_alone(
    tmp_path: Path,
) -> None:
    # the SFT checkpoint's evaluation and the arm's training, then paused (a fresh process each)
    first = _study(tmp_path / "a", "--config", str(CORE_TINY), *LORA, "--units", "2")
    assert first.wait(timeout=600) == 0, first.stdout.read().decode()[-3000:]  # type: ignore[union-attr]
    study = tmp_path / "a" / "runs" / STUDY
    assert json.loads((study / "progress.json").read_text())["status"] == "paused"
    assert (study / "report.md").read_text().startswith(f"# Study {STUDY} (paused)")
    kept = study / "adapters" / "envace"
    assert adapters.is_adapter_dir(kept)
    assert sum(f.stat().st_size for f in kept.iterdir()) < 25 * 2**20
    paused = json.loads((study / "study.json").read_text())
    assert paused["status"] == "paused"
    assert paused["arms"]["envace"]["checkpoint"] == str(kept)
    assert paused["arms"]["envace"]["status"] == "done"
    assert "envace" not in paused["evals"] and "base" not in paused["evals"]
    # another machine: the committed study folder only; a new evaluation setting is asked for
    moved = tmp_path / "b" / "runs" / STUDY
    shutil.copytree(study, moved)
    shutil.rmtree(tmp_path / "a")  # nothing of the first machine is left: no runs, no checkpoints
    again = _study(
        tmp_path / "b", "--resume", STUDY, "--set", "eval.budgets=[0, 1]", "--one-process"
    )
    assert again.wait(timeout=600) == 0, again.stdout.read().decode()[-3000:]  # type: ignore[union-attr]
    state = json.loads((moved / "study.json").read_text())
    arm = state["arms"]["envace"]
    assert arm["status"] == "done" and arm["checkpoint"] == str(moved / "adapters" / "envace")
    assert not (tmp_path / "b" / "runs" / f"{STUDY}--envace").exists()  # not trained again
    assert set(state["evals"]["envace"]["settings"]) >= {"plain N=0", "parallel N=1"}
    assert set(state["evals"]["sft"]["settings"]) >= {"plain N=0", "parallel N=1"}  # setting added
    assert state["evals"]["envace"]["machines"]  # which CPU type evaluated it
    assert json.loads((moved / "progress.json").read_text())["status"] == "done"
    assert state["status"] == "done"
