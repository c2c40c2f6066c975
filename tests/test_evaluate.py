"""Evaluation, pass^k and sweeps: hand-computed math, and a sweep stored in a real run folder
(Parquet shards written by ``RunWriter``, read back through DuckDB by ``Store``)."""

from __future__ import annotations

import json

import pytest

from envace_engine.environments import get_suite
from envace_engine.rollout.loop import RolloutConfig
from envace_engine.rollout.rewards import make_reward
from envace_engine.testtime.evaluate import (
    Checkpoint,
    EvalConfig,
    Setting,
    evaluate,
    is_success,
    pareto_front,
    pass_hat_k,
    run_sweep,
    sweep_settings,
)
from envace_engine.testtime.rehearsal import RehearsalConfig, RehearsalMode
from tests.test_rehearsal import CONFIG, ScriptedPolicy, toy_tasks


def test_pass_hat_k_hand_computed():
    counts = [(2, 4), (4, 4), (0, 4)]
    assert pass_hat_k(counts, 1) == pytest.approx((0.5 + 1 + 0) / 3)
    # C(2,2)/C(4,2) = 1/6, C(4,2)/C(4,2) = 1, C(0,2) = 0
    assert pass_hat_k(counts, 2) == pytest.approx((1 / 6 + 1) / 3)
    assert pass_hat_k(counts, 3) == pytest.approx(1 / 3)  # only the 4/4 task survives
    assert pass_hat_k([(3, 5)], 2) == pytest.approx(3 / 10)  # C(3,2)=3, C(5,2)=10


def test_pass_hat_k_rejects_bad_input():
    with pytest.raises(ValueError, match="at least 3 repeats"):
        pass_hat_k([(1, 2)], 3)
    with pytest.raises(ValueError, match="3 successes out of 2"):
        pass_hat_k([(3, 2)], 1)
    with pytest.raises(ValueError, match="k >= 1"):
        pass_hat_k([(1, 2)], 0)
    with pytest.raises(ValueError, match="no tasks"):
        pass_hat_k([], 1)


def test_success_threshold():
    assert is_success(1.0, 1.0) and not is_success(0.99, 1.0)
    assert is_success(0.5, 0.5) and not is_success(None, 0.1)
    with pytest.raises(ValueError, match="success_threshold=0"):
        EvalConfig(success_threshold=0)


def test_sweep_grid_runs_budget_zero_once():
    grid = sweep_settings([4, 0, 2, 1], ["parallel", "sequential"])
    labels = [s.label for s in grid]
    assert labels == [
        "plain N=0",
        "parallel N=1",
        "parallel N=2",
        "parallel N=4",
        "sequential N=1",
        "sequential N=2",
        "sequential N=4",
    ]
    assert grid[0].modes == ("parallel", "sequential", "select")  # N = 0 stands for every mode
    with pytest.raises(ValueError, match="unknown rehearsal mode 'both': use one of parallel"):
        sweep_settings([1], ["both"])
    with pytest.raises(ValueError, match="each 0 or more"):
        sweep_settings([-1], ["parallel"])


def test_pareto_front_hand_example():
    # (tokens, success): B dominates C (cheaper, better); D is as good as B but dearer.
    points = [(0, 0.2), (100, 0.5), (150, 0.4), (200, 0.5), (300, 0.7)]
    assert pareto_front(points) == [0, 1, 4]


def test_memory_gated_policy_succeeds_only_with_rehearsal(tokenizer):
    """A policy that acts well only with a rehearsal memory in context: N=0 fails every task,
    N=1 solves every task, and the real checker (toy ``state`` reward) says so."""
    tasks = toy_tasks(3)
    suite = get_suite("toy")
    policy = ScriptedPolicy(tokenizer, tasks, needs_memory=True)
    reward = make_reward("state", suite)
    plain = evaluate(tasks, suite, policy, tokenizer, CONFIG, EvalConfig(repeats=2), reward)
    metrics = plain.metrics()
    assert metrics["eval/success"] == 0.0 and metrics["eval/pass^2"] == 0.0
    assert metrics["eval/real_calls"] == 0.0 and metrics["eval/rehearsal_tokens"] == 0.0
    rehearsed = evaluate(
        tasks,
        suite,
        policy,
        tokenizer,
        CONFIG,
        EvalConfig(repeats=2, rehearsal=RehearsalConfig(budget=1)),
        reward,
    )
    metrics = rehearsed.metrics()
    assert metrics["eval/success"] == 1.0 and metrics["eval/pass^2"] == 1.0
    assert metrics["eval/reward"] == 1.0 and metrics["eval/tasks"] == 3.0
    assert metrics["eval/rehearsal_tokens"] > 0 and metrics["eval/memory_tokens"] > 0
    assert all(t.rewards == (1.0, 1.0) and t.successes == 2 for t in rehearsed.tasks)
    assert len(rehearsed.episodes) == 3 * 2 * 2  # committed + one imagined per task and repeat


class SloppyPolicy(ScriptedPolicy):
    """The reference calls with one argument their schemas do not have: the toy tools reject
    every call with INVALID_PARAMETERS."""

    def _reply(self, text: str) -> str:
        return super()._reply(text).replace('"arguments": {', '"arguments": {"bogus": 1, ')


def test_calls_the_real_tools_reject_are_counted(tokenizer):
    tasks = toy_tasks(3)
    suite = get_suite("toy")
    reward = make_reward("state", suite)

    def metrics(policy: ScriptedPolicy) -> dict[str, float]:
        return evaluate(tasks, suite, policy, tokenizer, CONFIG, EvalConfig(), reward).metrics()

    good = metrics(ScriptedPolicy(tokenizer, tasks))
    assert good["eval/real_calls"] > 0 and good["eval/invalid_calls"] == 0.0
    sloppy = metrics(SloppyPolicy(tokenizer, tasks))
    assert sloppy["eval/real_calls"] == good["eval/real_calls"]
    assert sloppy["eval/invalid_calls"] == sloppy["eval/real_calls"]


def test_sweep_is_stored_for_the_budget_page(tokenizer, tmp_path):
    from storage import RunWriter, Store

    tasks = toy_tasks(2)
    suite = get_suite("toy")
    policy = ScriptedPolicy(tokenizer, tasks, needs_memory=True)
    settings = sweep_settings([0, 1, 2], ["parallel", "sequential"])
    config = EvalConfig(repeats=1, rehearsal=RehearsalConfig())
    with RunWriter.create(
        tmp_path, "sweep", model="scripted", suite="toy", run_id="sweep-test"
    ) as writer:
        points = run_sweep(
            tasks,
            suite,
            [Checkpoint("scripted", policy, tokenizer)],
            CONFIG,
            config,
            settings,
            make_reward("state", suite),
            writer,
        )
    assert [p.step for p in points] == [0, 1, 2, 3, 4]
    assert points[0].metrics["sweep/success"] == 0.0
    assert all(p.metrics["sweep/success"] == 1.0 for p in points[1:])

    with Store(tmp_path) as store:
        table = store.sweep_results("sweep-test").set_index("step")
        assert list(table["sweep/budget"]) == [0, 1, 2, 1, 2]
        assert list(table["sweep/sequential"]) == [0, 0, 0, 1, 1]
        assert table.loc[0, "sweep/sequential/N=0/success"] == 0.0
        assert table.loc[4, "sweep/sequential/N=2/success"] == 1.0
        assert table.loc[4, "sweep/rehearsal_tokens"] > table.loc[3, "sweep/rehearsal_tokens"]
        episodes = store.episodes(run_id="sweep-test", limit=100)
        committed = episodes[episodes["mode"] == "real"]
        imagined = episodes[episodes["mode"] == "rehearsal"]
        assert len(committed) == 5 * 2 and len(imagined) == 2 * (1 + 2 + 1 + 2)

        def meta(episode_id: str) -> dict:
            return json.loads(store.episode(episode_id).episode["meta_json"])

        links = {meta(i)["imagined_for"] for i in imagined["episode_id"]}
        assert links == set(committed.loc[committed["step"] > 0, "episode_id"])
        step4 = committed[committed["step"] == 4]["episode_id"]
        assert all(meta(i)["rehearsal_mode"] == "sequential" for i in step4)
        assert all(len(meta(i)["imagined_ids"]) == 2 for i in step4)


def test_tiny_model_evaluation_runs_on_the_real_sampler(tiny_model, tokenizer):
    from envace_engine.samplers.embedded.sampler import HFSampler

    tasks = toy_tasks(2)
    suite = get_suite("toy")
    config = RolloutConfig(
        max_turns=1, max_new_tokens_act=6, n_examples=0, seed=0, check_drift=False
    )
    result = evaluate(
        tasks,
        suite,
        HFSampler(tiny_model, tokenizer),
        tokenizer,
        config,
        EvalConfig(repeats=3),
        make_reward("state", suite),
    )
    metrics = result.metrics()
    assert metrics["eval/repeats"] == 3.0 and "eval/pass^3" in metrics
    assert 0 < metrics["eval/act_tokens"] <= 6
    assert [len(t.rewards) for t in result.tasks] == [3, 3]
    assert all(r is not None for t in result.tasks for r in t.rewards)
    assert result.config.rehearsal.mode is RehearsalMode.PARALLEL
    assert Setting(0, RehearsalMode.PARALLEL).label == "plain N=0"


def test_cli_rejects_bad_settings_before_loading_a_model():
    from typer.testing import CliRunner

    from envace_engine.cli import app

    runner = CliRunner(env={"COLUMNS": "400", "NO_COLOR": "1"})
    result = runner.invoke(
        app,
        [
            "sweep",
            "--model",
            "tiny",
            "--suite",
            "toy",
            "--budgets",
            "0,2",
            "--rehearsal",
            "diagonal",
        ],
    )
    assert result.exit_code == 2 and "--modes (modes.0): Input should be 'parallel'" in (
        result.output
    )  # the sweep's --rehearsal is its --modes (a kept alias)
    result = runner.invoke(app, ["eval", "--model", "tiny", "--suite", "toy", "--split", "nope"])
    assert result.exit_code == 2 and "nope" in result.output
    result = runner.invoke(app, ["eval", "--model", "tiny", "--suite", "toy", "--dtype", "fp16"])
    assert result.exit_code == 2 and "Input should be 'auto', 'float32' or 'bfloat16'" in (
        result.output
    )


def test_cli_eval_writes_a_run(tmp_path):
    from typer.testing import CliRunner

    from envace_engine.cli import app
    from storage import Store

    args = [
        "eval",
        "--model",
        "tiny",
        "--suite",
        "toy",
        "--n-tasks",
        "1",
        "--repeats",
        "2",
        "--budget",
        "1",
        "--max-turns",
        "1",
        "--max-new-tokens-act",
        "4",
        "--max-new-tokens-rehearse",
        "4",
        "--memory-tokens",
        "4",
        "--examples",
        "0",
        "--dtype",
        "float32",
        "--check-calls",
        "--run-dir",
        str(tmp_path / "runs" / "eval-cli"),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["eval/pass^2"] == 0.0
    with Store(tmp_path) as store:
        metrics = store.sweep_results("eval-cli")
        assert metrics.loc[0, "eval/repeats"] == 2.0 and metrics.loc[0, "eval/budget"] == 1.0
        episodes = store.episodes(run_id="eval-cli")
        assert sorted(episodes["mode"]) == ["real", "real", "rehearsal", "rehearsal"]
        config = store.run("eval-cli").manifest.config
        assert config["dtype"] == "float32" and config["check_calls"] is True
