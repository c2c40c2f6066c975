"""A broken MCP server ends only its own episode, with a named stop reason, and leaves no
process behind; ``envace eval`` runs end to end on the example suite.

The misbehaving servers are the example server with ``--fault KIND --after 1``: its second
tool call exits the process, never returns, or comes back malformed. Of two episodes in one
batch, ``inv-01`` makes one call (and completes) and ``inv-08`` makes two (and breaks).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from envace_engine.environments import get_suite
from envace_engine.rollout.loop import RolloutConfig, rollout, rollout_metrics
from envace_engine.types import Mode, StopReason, ToolCall
from tests.kv_world import ScriptedSampler
from tests.mcp_helpers import EXAMPLE_SUITE, reference_agent, server_pids, write_suite

pytestmark = pytest.mark.timeout(180)

FAULTS = [
    ("exit", StopReason.ENV_EXITED, "exited mid-episode"),
    ("hang", StopReason.ENV_TIMEOUT, "gave no answer in 2 s"),
    ("malformed", StopReason.ENV_MALFORMED, "malformed result"),
]


ADD_PEARS = ToolCall("add_stock", {"item": "pears", "units": 4})


def _inv02(suite):
    """A task checked by a state probe only (pears: 7 after adding 4)."""
    return next(t for t in suite.tasks("train") if t.id == "inv-02")


def _run(suite, tokenizer, mode: Mode = Mode.REAL):
    tasks = [t for t in suite.tasks("train") if t.id in ("inv-01", "inv-08")]
    sampler = ScriptedSampler(tokenizer, reference_agent(tasks))
    config = RolloutConfig(mode=mode, n_examples=0, seed=0)
    episodes = rollout(tasks, suite, sampler, tokenizer, config, run_id="f")
    return {e.task_id: e for e in episodes}


def test_the_healthy_server_completes_both_episodes(tokenizer, tmp_path):
    name, tag = write_suite(tmp_path)
    suite = get_suite(name)
    episodes = _run(suite, tokenizer)
    for task_id, calls in (("inv-01", 1), ("inv-08", 2)):
        episode = episodes[task_id]
        assert episode.stop_reason is StopReason.DONE, episode.stop_detail
        assert len(episode.calls) == calls and all(c.real.ok for c in episode.calls)
    assert episodes["inv-08"].calls[1].real.value == {"item": "apples", "units": 5}
    assert episodes["inv-08"].final_answers == ("17",)
    assert suite.score(_inv02(suite), [[ADD_PEARS]], [""]) == 1.0  # the state probe passes
    assert server_pids(tag) == []


@pytest.mark.parametrize(("fault", "stop", "says"), FAULTS, ids=[f[0] for f in FAULTS])
def test_a_broken_server_ends_only_its_episode(tokenizer, tmp_path, fault, stop, says):
    name, tag = write_suite(tmp_path, args=["--fault", fault, "--after", "1"], call_timeout_s=2)
    suite = get_suite(name)
    episodes = _run(suite, tokenizer)
    done, broken = episodes["inv-01"], episodes["inv-08"]
    assert done.stop_reason is StopReason.DONE and done.final_answers == ("5",)
    assert broken.stop_reason is stop
    assert says in broken.stop_detail and "example.server --fault" in broken.stop_detail
    # The call that broke it is stored with the fault; the agent never saw a reply to it.
    assert len(broken.calls) == 2 and broken.calls[0].real.ok
    assert broken.calls[1].real.error.code == stop.value.upper()
    assert broken.final_answers == ()
    assert rollout_metrics(list(episodes.values()))[f"rollout/stop/{stop.value}"] == 0.5
    assert server_pids(tag) == []  # the hung one too: killed, not left behind
    # Scoring replays the calls, then the state probe, on a fresh server: the probe is its
    # second call and breaks it again. The check is not verified (0), and nothing crashes.
    assert suite.score(_inv02(suite), [[ADD_PEARS]], [""]) == 0.0
    assert server_pids(tag) == []


def test_a_broken_shadow_server_ends_a_rehearsal_episode(tokenizer, tmp_path):
    name, tag = write_suite(tmp_path, args=["--fault", "exit", "--after", "1"])
    suite = get_suite(name)
    tasks = [t for t in suite.tasks("train") if t.id == "inv-08"]
    agent = reference_agent(tasks)

    def script(prompt: str) -> str:
        if "You are a precise tool simulator" in prompt.split("<|im_end|>")[0]:
            return '<execution_result>{"item": "figs", "units": 12}</execution_result>'
        return agent(prompt)

    config = RolloutConfig(mode=Mode.REHEARSAL, n_examples=0, seed=0)
    sampler = ScriptedSampler(tokenizer, script)
    [episode] = rollout(tasks, suite, sampler, tokenizer, config, run_id="s")
    assert episode.stop_reason is StopReason.ENV_EXITED
    assert episode.calls[1].rehearsed is not None and episode.calls[1].real.error is not None
    assert server_pids(tag) == []


def test_new_stop_reasons_are_stored_and_read_back(tokenizer, tmp_path):
    from storage.shards import RunWriter
    from storage.store import Store

    name, _ = write_suite(tmp_path, args=["--fault", "exit", "--after", "1"])
    episodes = list(_run(get_suite(name), tokenizer).values())
    writer = RunWriter.create(tmp_path, "rollout", model="scripted", suite=name, config={})
    writer.episodes(0, episodes)
    writer.finish()
    store = Store(tmp_path)
    try:
        stored = store.episodes(run_id=writer.run_id, stop_reason="env_exited")
        assert list(stored["task_id"]) == ["inv-08"]
    finally:
        store.close()


@pytest.mark.timeout(400)
def test_envace_eval_runs_the_example_suite_end_to_end(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from envace_engine.cli import app
    from storage.store import Store

    run = tmp_path / "runs" / "eval-mcp"
    args = ["eval", "--model", "tiny", "--suite", EXAMPLE_SUITE, "--n-tasks", "2"]
    args += ["--examples", "0", "--max-new-tokens-act", "6", "--max-turns", "1"]
    args += ["--run-dir", str(run)]
    result = CliRunner(env={"COLUMNS": "400", "NO_COLOR": "1"}).invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "inv-09" in result.output and "inv-10" in result.output  # the validation split
    store = Store(tmp_path)
    try:
        assert store.run("eval-mcp").progress.status == "done"
        assert store.count_episodes(run_id="eval-mcp") == 2
    finally:
        store.close()
