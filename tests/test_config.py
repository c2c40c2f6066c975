"""The config tree: TOML + overrides, and errors that name the key and what to set."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from envace_engine.config import (
    PROMPT_KEYS,
    ConfigError,
    SFTConfig,
    TrainConfig,
    build,
    data_root,
    load,
    merge,
    parse_override,
)

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def test_defaults_follow_envace() -> None:
    cfg = build(TrainConfig, {})
    assert cfg.mode == "envace"
    assert cfg.optim.grad_clip == 1.0
    assert cfg.loss.clip_eps_low == 0.2 and cfg.loss.dual_clip == 3.0
    assert cfg.loss.kl_coef == 0.0 and cfg.advantages.scale_by_std is False
    assert cfg.advantages.pooling == "rows" and cfg.advantages.role_wise is True


def test_overrides_parse_toml_values_and_fall_back_to_strings() -> None:
    assert parse_override("steps=7") == (["steps"], 7)
    assert parse_override("rollout.temperature=0.5") == (["rollout", "temperature"], 0.5)
    assert parse_override("optim.betas=[0.9, 0.95]") == (["optim", "betas"], [0.9, 0.95])
    assert parse_override("bf16=true") == (["bf16"], True)
    assert parse_override("model=runs/x/model") == (["model"], "runs/x/model")
    with pytest.raises(ConfigError, match="key=value"):
        parse_override("steps")


def test_overrides_win_over_the_file_and_create_sections() -> None:
    merged = merge({"steps": 3, "rollout": {"max_turns": 2}}, ["steps=5", "loss.kl_coef=0.1"])
    assert merged == {"steps": 5, "rollout": {"max_turns": 2}, "loss": {"kl_coef": 0.1}}
    cfg = build(TrainConfig, {"steps": 3}, ["steps=5", "task_filter.world=bank"])
    assert cfg.steps == 5 and cfg.task_filter == {"world": "bank"}


def test_unknown_keys_name_the_key_and_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as err:
        build(TrainConfig, {"stepz": 3, "rollout": {"temprature": 1.0}})
    text = str(err.value)
    assert "unknown key 'stepz' in the top level" in text
    assert "unknown key 'rollout.temprature' in [rollout]" in text
    assert "temperature" in text and "tasks_per_step" in text  # the valid keys are listed


def test_bad_values_name_the_key_and_the_value() -> None:
    with pytest.raises(ConfigError, match=r"steps: .*greater than or equal to 1 \(got 0\)"):
        build(TrainConfig, {"steps": 0})
    with pytest.raises(ConfigError, match="mode"):
        build(TrainConfig, {"mode": "ppo"})
    with pytest.raises(ConfigError, match="set group_size >= 2"):
        build(TrainConfig, {"group_size": 1})
    with pytest.raises(ConfigError, match="judge_url"):
        build(TrainConfig, {"reward": "judge"})
    with pytest.raises(ConfigError, match="sampler = 'sglang"):
        build(TrainConfig, {"model": "sglang+http://127.0.0.1:30000"})
    with pytest.raises(ConfigError, match=r"rollout\.sampler_dtype"):
        build(TrainConfig, {"rollout": {"sampler_dtype": "fp16"}})
    with pytest.raises(ConfigError, match="its --dtype"):
        server = "sglang+http://127.0.0.1:30000"
        build(TrainConfig, {"sampler": server, "rollout": {"sampler_dtype": "float32"}})


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load(TrainConfig, tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("steps = = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(TrainConfig, bad)


@pytest.mark.parametrize("name", ["toy-envace", "toy-real-grpo", "toy-act-only", "tiny-test"])
def test_example_train_configs_load(name: str) -> None:
    cfg = load(TrainConfig, CONFIGS / f"{name}.toml")
    assert cfg.steps >= 1


def test_example_grpo_configs_take_their_prompts_from_the_sft_checkpoint() -> None:
    """The toy GRPO configs start from configs/study-sft.toml's checkpoint and set no prompt
    key, so they render prompts exactly as that checkpoint was trained with."""
    sft = load(SFTConfig, CONFIGS / "study-sft.toml")
    for name in ("toy-envace", "toy-real-grpo", "toy-act-only", "toy-envace-sglang"):
        body = tomllib.loads((CONFIGS / f"{name}.toml").read_text())
        assert body["model"] == f"runs/runs/{sft.run_id}/model", name
        assert not set(body.get("rollout", {})) & set(PROMPT_KEYS), name


def test_data_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENVACE_HOME", raising=False)
    assert data_root(None) == Path("runs")
    monkeypatch.setenv("ENVACE_HOME", "/data/envace")
    assert data_root(None) == Path("/data/envace")
    assert data_root("/x") == Path("/x")


def test_cli_reports_config_errors_without_starting(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from envace_engine.cli import app

    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, list(args), env={"COLUMNS": "300"})
        return result.exit_code, re.sub(r"[\s│╭╮╰╯─]+", " ", result.output)  # unwrap the box

    code, text = run("train", "--set", "stepz=3", "--set", f"root={tmp_path}")
    assert code == 2 and "unknown key 'stepz'" in text
    assert not (tmp_path / "runs").exists()  # nothing was created
    code, text = run("sft", "-c", str(tmp_path / "nope.toml"))
    assert code == 2 and "does not exist" in text
    code, text = run("train", "--resume", "no-such-run")
    assert code == 2 and "no run at" in text
