"""``envace eval`` on τ²: ``--user`` (a simulated user), ``--basis`` and their errors; the basis
and the user are recorded with the run, the user's turns stored as their own segments."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from envace_engine.cli import app

RUNNER = CliRunner(env={"COLUMNS": "400", "NO_COLOR": "1"})


def test_eval_with_the_tiny_model_as_agent_and_user(tmp_path: Path) -> None:
    from storage import Store
    from storage.layout import read_manifest

    run = tmp_path / "runs" / "eval-tau2"
    args = [
        "eval",
        "--model",
        "tiny",
        "--suite",
        "tau2-mock",
        "--split",
        "test",
        "--user",
        "tiny",
        "--user-temperature",
        "1.0",
        "--n-tasks",
        "2",
        "--examples",
        "0",
        "--max-new-tokens-act",
        "8",
        "--user-max-new-tokens",
        "8",
        "--max-steps",
        "6",
        "--run-dir",
        str(run),
    ]
    result = RUNNER.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["eval/tasks"] == 2.0
    config = read_manifest(run).config
    assert (config["basis"], config["user"], config["split"]) == ("official", "tiny", "test")
    with Store(tmp_path) as store:
        episodes = store.episodes(run_id="eval-tau2")
        assert len(episodes) == 2 and set(episodes["suite"]) == {"tau2-mock"}
        segments = store.episode(episodes["episode_id"].iloc[0]).segments
    assert "simulated_user" in set(segments["role"])


def test_eval_rejects_unknown_bases_and_splits_naming_the_valid_ones() -> None:
    base = ["eval", "--model", "tiny", "--suite"]
    bad = RUNNER.invoke(app, [*base, "tau2-airline", "--basis", "loose"])
    assert bad.exit_code == 2 and "valid bases: official, legacy" in bad.output
    bad = RUNNER.invoke(app, [*base, "tau2-airline", "--split", "dev"])
    assert bad.exit_code == 2 and "valid splits: train, test, base" in bad.output
    bad = RUNNER.invoke(app, [*base, "toy", "--basis", "official"])
    assert bad.exit_code == 2 and "one way to score" in bad.output
    bad = RUNNER.invoke(app, [*base, "bfcl", "--basis", "exact"])
    assert bad.exit_code == 2 and "valid bases: official, strict" in bad.output
