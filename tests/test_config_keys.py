"""Every setting is declared once, with its description, and ``--keys`` lists what ``--set`` takes.

``config.keys`` walks a config's sections; ``envace train --keys``, ``envace sft --keys`` and
``envace study keys`` print it. A field that means the same in two sections (the study's shared
``[train]`` and ``TrainConfig``) takes its declaration from one (``config.same_as``).
"""

from __future__ import annotations

import inspect

import pytest
from pydantic import BaseModel, ValidationError
from typer.testing import CliRunner

from envace_engine import config, specs
from envace_engine.cli import app
from envace_engine.config import SFTConfig, TrainConfig, build, keys
from recipes.study import config as study_config
from recipes.study.config import StudyConfig, StudyEval, StudyTrain

MODULES = (config, specs, study_config)


def _models() -> list[type[BaseModel]]:
    return [
        obj
        for mod in MODULES
        for obj in vars(mod).values()
        if inspect.isclass(obj) and issubclass(obj, BaseModel) and obj.__module__ == mod.__name__
    ]


@pytest.mark.parametrize("model", _models(), ids=lambda m: m.__name__)
def test_every_setting_has_a_description(model):
    missing = [name for name, field in model.model_fields.items() if not field.description]
    assert not missing, f"{model.__name__}: describe {missing} (Field(..., description=...))"


def test_keys_expand_sections_into_dotted_leaves():
    found = {k.name: k for k in keys(TrainConfig)}
    assert found["loss.world_nll"].type == "float"
    assert found["loss.world_nll"].default == "0.0"
    assert found["loss.world_nll"].description == (
        TrainConfig.model_fields["loss"].annotation.model_fields["world_nll"].description
    )
    assert found["optim.betas"].default == "[0.9, 0.999]"
    assert found["task_filter"].default == "{}"
    assert "loss" not in found and "rollout" not in found  # sections are expanded, not listed
    assert found["sampler"].default == "None"


@pytest.mark.parametrize("cls", [TrainConfig, SFTConfig], ids=lambda c: c.__name__)
def test_every_listed_default_is_a_valid_set_value(cls):
    """What --keys prints after ``=`` pastes into ``--set KEY=VALUE`` and gives the default."""
    overrides = [f"{k.name}={k.default}" for k in keys(cls) if k.default != "None"]
    assert build(cls, {}, overrides) == build(cls, {})


def test_a_shared_field_keeps_its_declaration_and_its_own_default():
    shared = StudyTrain.model_fields["steps"]
    assert shared.description == TrainConfig.model_fields["steps"].description
    assert StudyTrain().steps == 40 and TrainConfig().steps == 30
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        StudyTrain(steps=0)
    assert StudyEval.model_fields["n_tasks"].description == (
        specs.SweepSpec.model_fields["n_tasks"].description
    )


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["train", "--keys"], "loss.world_nll: float = 0.0"),
        (["sft", "--keys"], "max_steps: int = 100"),
        (["study", "keys"], "train.steps: int = 40"),
    ],
)
def test_the_cli_lists_the_keys(argv, line):
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert line in result.output.splitlines()


def test_the_study_lists_every_key_of_its_config():
    out = CliRunner().invoke(app, ["study", "keys"]).output
    names = {line.split(":")[0] for line in out.splitlines() if not line.startswith(" ")}
    assert names == {k.name for k in keys(StudyConfig)}
