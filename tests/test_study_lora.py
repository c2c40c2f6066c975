"""A study whose arms train LoRA adapters keeps each finished arm's adapter in the study folder,
small enough to commit, and a copy of that folder alone (no run folders, no checkpoints)
continues elsewhere with ``--resume``."""

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
    first = _study(tmp_path / "a", "--config", str(CORE_TINY), *LORA, "--one-process")
    assert first.wait(timeout=600) == 0, first.stdout.read().decode()[-3000:]  # type: ignore[union-attr]
    study = tmp_path / "a" / "runs" / STUDY
    kept = study / "adapters" / "envace"
    assert adapters.is_adapter_dir(kept)
    assert sum(f.stat().st_size for f in kept.iterdir()) < 25 * 2**20
    assert json.loads((study / "study.json").read_text())["arms"]["envace"]["checkpoint"] == str(
        kept
    )
    # another machine: the committed study folder only; a new evaluation setting is asked for
    moved = tmp_path / "b" / "runs" / STUDY
    before = json.loads((study / "study.json").read_text())["evals"]["envace"]["settings"]
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
    after = state["evals"]["envace"]["settings"]
    assert set(after) - set(before) == {"parallel N=1"}  # evaluated from the kept adapter
    assert state["evals"]["envace"]["machines"]  # which CPU type evaluated it
