"""Job specs (``envace_engine.specs``): flags derived from fields, job files, old flags, and the
studio's launch forms running the same jobs as their earlier command lines did."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
import tomli_w
import typer
from typer.testing import CliRunner

from envace_engine.cli import app
from envace_engine.cli.eval import _PLACE
from envace_engine.cli.rollout import ROLLOUT_OWN
from envace_engine.cli.spec_options import flag, read_spec, spec_command, spec_params
from envace_engine.specs import SPECS, EvalSpec, JobSpec, RolloutSpec, SweepSpec
from studio import forms

RUNNER = CliRunner(env={"COLUMNS": "400", "NO_COLOR": "1"})


def _parsed(kind: str, argv: list[str]) -> JobSpec:
    """The spec ``envace KIND`` builds from ``argv`` (the command is not run)."""
    seen: list[JobSpec] = []
    own = ROLLOUT_OWN if kind == "rollout" else _PLACE
    one = typer.Typer()
    one.command()(spec_command(SPECS[kind], lambda job, **_: seen.append(job), own))
    result = RUNNER.invoke(one, argv)
    assert result.exit_code == 0, result.output
    return seen[0]


def test_every_field_is_a_flag_with_its_description():
    for spec in SPECS.values():
        options = {p.name: p.default for p in spec_params(spec)}
        for name, field in spec.model_fields.items():
            assert field.description, f"{spec.__name__}.{name} has no description"
            decls = options[name].param_decls
            assert decls[0].split("/")[0] == flag(name), (spec.__name__, name)
            assert field.description in options[name].help


def test_a_job_file_and_flags_make_one_spec_flags_winning(tmp_path):
    file = tmp_path / "job.toml"
    file.write_text(tomli_w.dumps({"model": "tiny", "suite": "toy", "n_tasks": 3, "seed": 5}))
    spec = _parsed("eval", ["--config", str(file), "--seed", "7", "--no-check-calls"])
    assert (spec.model, spec.n_tasks, spec.seed, spec.check_calls) == ("tiny", 3, 7, False)
    assert spec == read_spec(EvalSpec, {"config_file": file, "seed": 7})
    file.write_text('model = "tiny"\nsuite = "toy"\nn_taks = 3\n')
    result = RUNNER.invoke(app, ["eval", "--config", str(file)])
    assert result.exit_code == 2 and "unknown key 'n_taks' in the job file" in result.output
    assert "n_tasks" in result.output  # the valid keys are listed


def test_earlier_flags_still_work_and_say_what_replaced_them():
    spec = _parsed("eval", ["--model", "tiny", "--suite", "toy", "--examples", "0"])
    assert isinstance(spec, EvalSpec) and spec.n_examples == 0
    result = RUNNER.invoke(app, ["eval", "--suite", "toy", "--examples", "x"])
    assert result.exit_code == 2
    judge = _parsed("sweep", ["--model", "a,b", "--suite", "toy", "--judge-url", "http://h:1"])
    assert isinstance(judge, SweepSpec) and judge.judge == "http://h:1"
    assert judge.model == ("a", "b") and judge.modes == ("parallel", "sequential")
    old = ["--model", "tiny", "--max-new-tokens", "6", "--no-grounded", "--examples", "1"]
    rollout = _parsed("rollout", old)
    assert isinstance(rollout, RolloutSpec)
    assert (rollout.max_new_tokens_act, rollout.grounded_rehearsal, rollout.n_examples) == (
        6,
        False,
        1,
    )


def test_deprecated_flags_warn(capsys):
    read_spec(EvalSpec, {"model": "tiny", "suite": "toy", "deprecated_examples": 1})
    assert "--examples is deprecated: use --n-examples" in capsys.readouterr().err


def test_sweep_lists_take_repeats_and_commas():
    one = _parsed("sweep", ["--model", "a", "--model", "b", "--suite", "toy", "--budgets", "0,2"])
    two = _parsed("sweep", ["--model", "a,b", "--suite", "toy", "--budgets", "0", "--budgets", "2"])
    assert one == two and one.budgets == (0, 2)  # type: ignore[attr-defined]
    result = RUNNER.invoke(app, ["sweep", "--model", "a", "--suite", "toy", "--budgets", "-1"])
    assert result.exit_code == 2 and "each budget is 0 or more" in result.output


def test_unset_prompt_settings_come_from_the_checkpoint(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "envace_prompts.json").write_text(json.dumps({"n_examples": 0, "world_state": True}))
    spec = read_spec(EvalSpec, {"model": str(folder), "suite": "toy", "max_new_tokens_act": 9})
    resolved = spec.resolved()
    assert (resolved.n_examples, resolved.world_state, resolved.max_new_tokens_act) == (0, True, 9)
    assert resolved.rehearse_history is True  # neither given nor recorded: the default


# The launch form's command lines before the forms wrote job files (studio/forms.py then): the
# same request must run the same job now.
def _legacy_argv(r: forms.LaunchRequest) -> list[str]:
    common = ["--model", r.model, "--suite", r.suite, "--max-turns", str(r.max_turns)]
    tokens = ["--max-new-tokens-act", str(r.max_new_tokens)]
    tokens += ["--max-new-tokens-rehearse", str(r.max_new_tokens)]
    checked = ["--check-calls"] if r.check_calls else []
    judge = ["--judge", r.judge] if r.judge else []
    if r.kind == "eval":
        user = ["--user", r.user] if r.user else []
        counts = ["--tasks", str(r.tasks), "--repeats", str(r.episodes), "--seed", str(r.seed)]
        return [*common, *tokens, *counts, *checked, "--run-dir", "{run_dir}", *user, *judge]
    if r.kind == "sweep":
        grid = ["--budgets", ",".join(map(str, r.budgets)), "--rehearsal", ",".join(r.modes)]
        counts = ["--tasks", str(r.tasks), *grid, "--seed", str(r.seed), *checked]
        return [*common, *tokens, *counts, "--run-dir", "{run_dir}", *judge]
    size = ["--episodes", str(r.episodes), "--group", str(r.group), "--seed", str(r.seed)]
    mode = ["--max-new-tokens", str(r.max_new_tokens), "--mode", "rehearsal"]
    return [*common, *mode, *size, "--run-dir", "{run_dir}"]


REQUESTS: list[dict[str, Any]] = [
    {"kind": "rollout", "model": "tiny", "suite": "toy"},
    {"kind": "rollout", "model": "tiny", "suite": "bfcl-gen", "episodes": 6, "group": 3},
    {"kind": "eval", "model": "tiny", "suite": "toy", "tasks": 3, "episodes": 2, "seed": 4},
    {"kind": "eval", "model": "tiny", "suite": "vita-delivery-en", "user": "tiny", "judge": "tiny"},
    {"kind": "eval", "model": "tiny", "suite": "tau2-mock", "check_calls": True, "max_turns": 2},
    {"kind": "sweep", "model": "tiny", "suite": "toy", "budgets": "0,2", "modes": ("select",)},
    {"kind": "sweep", "model": "tiny", "suite": "tau2-retail", "judge": "http://h:1"},
]


@pytest.mark.parametrize("values", REQUESTS, ids=lambda v: f"{v['kind']}-{v['suite']}")
def test_the_launch_form_runs_the_same_job_as_its_earlier_command_line(values, tmp_path):
    request = forms.parse(values)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    job_file = run_dir / "config.toml"
    job_file.write_text(tomli_w.dumps(request.config(tmp_path, "run")))
    argv = [a.replace("{run_dir}", str(run_dir)) for a in request.argv()]
    assert argv[:3] == [sys.executable, "-m", "envace_engine.cli"] and argv[3] == request.kind
    now = _parsed(request.kind, argv[4:])
    before = [a.replace("{run_dir}", str(run_dir)) for a in _legacy_argv(request)]
    assert now == _parsed(request.kind, before)


def test_a_stored_runs_recorded_config_still_says_its_judge():
    from envace_engine.environments.vita.comparable import comparability

    old = comparability("vita-instore", {"user": "tiny", "judge_url": "tiny"})
    assert old == comparability("vita-instore", {"user": "tiny", "judge": "tiny"})
    assert "judge `tiny`" in old


def test_the_record_is_the_spec():
    spec = read_spec(SweepSpec, {"model": ["a", "b"], "suite": "toy", "modes": "select"})
    record = spec.record()
    assert record["model"] == ["a", "b"] and record["modes"] == ["select"]
    assert SweepSpec.model_validate(record) == spec  # a run's config rebuilds its job
    assert set(record) == set(SweepSpec.model_fields)


def test_top_p_reaches_the_rollout_and_the_record():
    """The key added as one field (and one line handing it to the rollout config)."""
    from envace_engine.cli.eval import _prepare

    spec = _parsed(
        "eval", ["--model", "tiny", "--suite", "toy", "--n-tasks", "1", "--top-p", "0.9"]
    )
    job = _prepare(spec)  # type: ignore[arg-type]
    assert job.rollout.top_p == 0.9 and job.record["top_p"] == 0.9
    result = RUNNER.invoke(app, ["sweep", "--model", "tiny", "--suite", "toy", "--top-p", "0"])
    assert (
        result.exit_code == 2 and "--top-p (top_p): Input should be greater than 0" in result.output
    )
