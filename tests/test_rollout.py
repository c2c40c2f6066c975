"""The rollout loop on a real in-test key-value world with a scripted sampler (fast), plus slow
runs of the real smollm2-135m through HFSampler."""

from __future__ import annotations

import json

import pytest

from envace_engine.rollout.loop import RolloutConfig, rollout, rollout_metrics, score_inputs
from envace_engine.rollout.tokens import training_rows
from envace_engine.sink import JsonlSink, read_episodes
from envace_engine.types import Mode, Role, StopReason
from tests.kv_world import (
    KVSuite,
    Scripted,
    ScriptedSampler,
    both,
    call_text,
    good_agent,
    is_rehearse_prompt,
    last_message,
)

SUITE = KVSuite()


def world(prompt: str) -> str:
    """Answers like the store would (from the call to simulate), with a little reasoning first."""
    call = prompt.split("Tool call to simulate:")[-1]
    if "name: get" in call:
        return 'Looks fine.\n<execution_result>{"value": 7}</execution_result>'
    return '<execution_result>{"ok": true}</execution_result>'


def _run(script, tokenizer, tasks=None, group_size=2, **config):
    sampler = ScriptedSampler(tokenizer, script)
    cfg = RolloutConfig(**{"seed": 0, **config})
    tasks = tasks if tasks is not None else SUITE.tasks()[:2]
    episodes = rollout(tasks, SUITE, sampler, tokenizer, cfg, group_size, run_id="r")
    return episodes, sampler


def test_rehearsal_mode_records_rehearsed_and_real(tokenizer):
    episodes, sampler = _run(both(good_agent, world), tokenizer)
    assert [e.id for e in episodes] == ["r-0-0", "r-0-1", "r-1-0", "r-1-1"]
    assert [e.group_id for e in episodes] == ["r-0", "r-0", "r-1", "r-1"]
    for episode in episodes:
        assert episode.stop_reason is StopReason.DONE, episode.stop_detail
        assert episode.drift == 0 and episode.mode is Mode.REHEARSAL
        roles = [s.role for s in episode.segments]
        assert roles == [
            Role.PROMPT,
            Role.ACT,
            Role.TOOL,
            Role.ACT,
            Role.USER,
            Role.ACT,
            Role.TOOL,
            Role.ACT,
        ]
        first, second = episode.calls
        assert (first.shown, first.turn, first.step) == ("rehearsed", 0, 1)
        assert first.rehearsed.value == {"ok": True} and first.real.value == {"ok": True}
        # the agent saw the rehearsed 7, the shadow store holds the real value
        assert second.rehearsed.value == {"value": 7}
        assert second.real.value == {"value": 1 if episode.task_id == "kv-a" else 2}
        assert episode.final_answers == ("Stored.", "It is 7.")
        assert [r.call_index for r in episode.rehearsals] == [0, 1]
        assert all(r.grounded for r in episode.rehearsals)
        assert len(training_rows(episode)) == 4 + 2
    # micro-steps: every act batch and every world batch holds all 4 waiting episodes
    assert [len(b) for b in sampler.batches] == [4] * 6
    caps = [p.max_new_tokens for p in sampler.params]
    assert caps == [128, 96, 128, 128, 96, 128]
    metrics = rollout_metrics(episodes)
    assert metrics["rollout/stop/done"] == 1.0 and metrics["rollout/rehearsed_real_pairs"] == 8


def test_every_act_prompt_extends_the_previous_one(tokenizer):
    episodes, sampler = _run(both(good_agent, world), tokenizer, group_size=1)
    sent = {tuple(p) for batch in sampler.batches for p in batch}
    for episode in episodes:
        prefix: list[int] = []
        for segment in episode.segments:
            if segment.role is Role.ACT:
                assert tuple(prefix) in sent  # the sampler got exactly prompt + sampled + suffix
            prefix += segment.token_ids
        for rehearsal in episode.rehearsals:
            assert tuple(rehearsal.prompt_ids) in sent


def test_the_agent_never_sees_the_real_response_in_rehearsal_mode(tokenizer):
    episodes, _ = _run(both(good_agent, world), tokenizer, tasks=[SUITE.tasks()[0]])
    text = tokenizer.decode(list(episodes[0].token_ids))
    assert '{"value": 7}' in text and '{"value": 1}' not in text


def test_real_mode_executes_on_the_episode_env(tokenizer):
    def no_world(prompt):
        raise AssertionError("nothing is generated for tool calls in real mode")

    episodes, sampler = _run(both(good_agent, no_world), tokenizer, mode="real")
    for episode in episodes:
        assert episode.stop_reason is StopReason.DONE
        assert [s.role for s in episode.segments].count(Role.REAL) == 2
        assert all(c.shown == "real" and c.rehearsed is None for c in episode.calls)
        assert episode.rehearsals == ()
        expected = "1" if episode.task_id == "kv-a" else "2"
        assert episode.final_answers[-1] == f"It is {expected}."
        calls, answers = score_inputs(episode, 2)
        assert SUITE.score(SUITE.tasks()[0 if expected == "1" else 1], calls, answers) == 1.0
    assert sum(len(b) for b in sampler.batches) == 4 * 4  # 4 episodes x 4 replies, act only


def test_simulator_mode_uses_the_frozen_simulator(tokenizer):
    simulator = ScriptedSampler(tokenizer, world)

    def policy(prompt):
        assert not is_rehearse_prompt(prompt), "the policy must not play the world here"
        return good_agent(prompt)

    episodes, _ = _run(policy, tokenizer, mode="simulator", simulator=simulator, group_size=1)
    assert sum(len(b) for b in simulator.batches) == 2 * 2  # 2 episodes x 2 calls
    for episode in episodes:
        assert episode.stop_reason is StopReason.DONE and episode.rehearsals == ()
        assert [c.shown for c in episode.calls] == ["simulated", "simulated"]
        assert episode.calls[1].simulated.value == {"value": 7}
        assert episode.calls[1].real is not None  # shadow env
        assert Role.TOOL in [s.role for s in episode.segments]


def test_several_calls_in_one_reply(tokenizer):
    def agent(prompt):
        role, _ = last_message(prompt)
        if role == "tool":
            return "Done."
        return call_text("set", key="x", value=5) + "\n" + call_text("get", key="x")

    seen = []

    def world_fn(prompt):
        seen.append("Already answered in this reply" in prompt)
        return world(prompt)

    tasks = [SUITE.tasks()[0]]
    episodes, sampler = _run(both(agent, world_fn), tokenizer, tasks=tasks, group_size=1)
    episode = episodes[0]
    assert seen[:2] == [False, True]  # the second rehearsal sees the first answer
    assert [c.step for c in episode.calls[:2]] == [1, 1]
    assert episode.calls[1].real.value == {"value": 5}
    tool = episode.segments[2]
    assert tool.role is Role.TOOL and tool.text.count("<|im_start|>tool") == 2
    assert [len(b) for b in sampler.batches][:3] == [1, 1, 1]


def test_truncated_reply_with_a_complete_call_continues(tokenizer):
    def agent(prompt):
        role, _ = last_message(prompt)
        if role == "tool":
            return "Fine."
        return Scripted(call_text("get", key="a") + " and then", finish="length")

    tasks = [SUITE.tasks()[0]]
    episodes, _ = _run(both(agent, world), tokenizer, tasks=tasks, group_size=1)
    episode = episodes[0]
    assert episode.stop_reason is StopReason.DONE and episode.drift == 0
    act, tool = episode.segments[1], episode.segments[2]
    assert act.token_ids[-1] != tokenizer.eos_token_id
    assert tool.token_ids[0] == tokenizer.eos_token_id  # the end token is external text


def _stop(script, tokenizer, **config):
    episodes, _ = _run(script, tokenizer, tasks=[SUITE.tasks()[0]], group_size=1, **config)
    return episodes[0]


def test_stop_reasons(tokenizer):
    malformed = _stop(both(lambda p: "<tool_call>{oops}</tool_call>", world), tokenizer)
    assert malformed.stop_reason is StopReason.MALFORMED_CALL
    assert malformed.stop_detail.startswith("INVALID_JSON")
    flagged = '<execution_result>{"error": {"code": "INVALID_PARAMETERS"}}</execution_result>'
    invalid = _stop(both(good_agent, lambda p: flagged), tokenizer)
    assert invalid.stop_reason is StopReason.INVALID_REHEARSAL
    assert invalid.calls[0].rehearsed.error.code == "INVALID_PARAMETERS"
    assert invalid.calls[0].real.value == {"ok": True}
    garbled = _stop(both(good_agent, lambda p: "it worked"), tokenizer)
    assert garbled.stop_reason is StopReason.UNPARSEABLE_REHEARSAL
    assert "MISSING_EXECUTION_RESULT" in garbled.stop_detail
    assert len(garbled.rehearsals) == 1 and garbled.calls[0].rehearsed is None
    looping = _stop(both(lambda p: call_text("get", key="a"), world), tokenizer, max_turns=3)
    assert looping.stop_reason is StopReason.TURN_LIMIT
    assert [s.role for s in looping.segments].count(Role.ACT) == 3
    cut = _stop(both(lambda p: Scripted("I think", "length"), world), tokenizer)
    assert cut.stop_reason is StopReason.TRUNCATED
    get_a = both(lambda p: call_text("get", key="a"), world)
    tokens = _stop(get_a, tokenizer, max_episode_tokens=30)
    assert tokens.stop_reason is StopReason.TOKEN_LIMIT
    assert _stop(both(good_agent, world), tokenizer, context_limit=200).stop_reason is (
        StopReason.CONTEXT_LIMIT
    )


def test_a_flagged_rehearsal_can_be_a_tool_error_the_agent_answers(tokenizer):
    """With ``end_on_invalid_rehearsal=False`` a rehearsed INVALID_* error is a tool message,
    as a real tool's error is: the agent calls again and the episode goes on."""
    flagged = '<execution_result>{"error": {"code": "INVALID_PARAMETERS"}}</execution_result>'
    answers = iter([flagged])

    def flags_first(prompt):
        return next(answers, None) or world(prompt)

    def retries(prompt):
        role, content = last_message(prompt)
        if role == "tool" and "INVALID_PARAMETERS" in content:
            return call_text("set", key="a", value=1)
        return good_agent(prompt)

    script = both(retries, flags_first)
    ended = _stop(script, tokenizer)
    assert ended.stop_reason is StopReason.INVALID_REHEARSAL
    answers = iter([flagged])
    went_on = _stop(script, tokenizer, end_on_invalid_rehearsal=False)
    assert went_on.stop_reason is StopReason.DONE
    assert went_on.calls[0].rehearsed.error.code == "INVALID_PARAMETERS"
    assert went_on.calls[1].rehearsed.value == {"ok": True}
    tools = [s.text for s in went_on.segments if s.role is Role.TOOL]
    assert "INVALID_PARAMETERS" in tools[0] and "INVALID_PARAMETERS" not in tools[1]


def test_a_sampler_error_ends_only_that_episode(tokenizer):
    def agent(prompt):
        if last_message(prompt) == ("user", "Set b to 2."):
            return Scripted("server went away", "error")
        return good_agent(prompt)

    episodes, _ = _run(both(agent, world), tokenizer, group_size=1)
    assert [e.stop_reason for e in episodes] == [StopReason.DONE, StopReason.SAMPLER_ERROR]
    assert episodes[1].stop_detail == "server went away"
    assert [s.role for s in episodes[1].segments] == [Role.PROMPT]


def test_worked_examples_and_switches_reach_the_prompts(tokenizer):
    prompts = []

    def recording(prompt):
        prompts.append(prompt)
        return both(good_agent, world)(prompt)

    tasks = [SUITE.tasks()[0]]
    _run(recording, tokenizer, tasks=tasks, group_size=1, n_examples=1)
    act, rehearse = prompts[0], prompts[1]
    # one other task's trajectory as earlier chat turns, never the task itself
    example_turns = act.split("<|im_start|>user\nSet a to 1.")[0]
    assert act.count("<|im_start|>user\nSet ") == 2 and '"name": "set"' in example_turns
    assert rehearse.count("<|im_start|>assistant\n<execution_result>") == 2  # example turns
    assert "Reference calls and results" in rehearse
    prompts.clear()
    _run(recording, tokenizer, tasks=tasks, group_size=1, n_examples=0, grounded_rehearsal=False)
    assert prompts[0].count("<|im_start|>user") == 1 and "Reference calls" not in prompts[1]


def test_config_errors_say_what_to_set():
    with pytest.raises(ValueError, match="simulator mode needs"):
        RolloutConfig(mode="simulator")
    with pytest.raises(ValueError, match="max_turns=0"):
        RolloutConfig(max_turns=0)
    assert RolloutConfig(mode="real").mode is Mode.REAL


def test_jsonl_sink_round_trip(tokenizer, tmp_path):
    episodes, _ = _run(both(good_agent, world), tokenizer, group_size=1)
    sink = JsonlSink(tmp_path)
    sink.episodes(0, episodes)
    sink.metrics(0, rollout_metrics(episodes))
    sink.progress(2, 2, "done")
    records = read_episodes(sink.episodes_path)
    assert [r["id"] for r in records] == [e.id for e in episodes]
    assert records[0]["segments"][1]["role"] == "act" and records[0]["step"] == 0
    assert records[0]["calls"][0]["real"]["value"] == {"ok": True}
    assert json.loads(sink.metrics_path.read_text())["rollout/episodes"] == 2
    assert sink.last_progress == (2, 2, "done")


@pytest.fixture(scope="module")
def smollm2():
    """The real smollm2-135m behind HFSampler, with its tokenizer."""
    from envace_engine.models import load_model, load_tokenizer, resolve
    from envace_engine.samplers.embedded.sampler import HFSampler

    spec = resolve("smollm2-135m")
    tokenizer = load_tokenizer(spec)
    # fp32: the same tokens on machines with and without bf16 GEMMs
    return HFSampler(load_model(spec), tokenizer, dtype="float32"), tokenizer


def _toy_two_turn_tasks(n: int):
    from envace_engine.environments import get_suite

    suite = get_suite("toy")
    pool = suite.tasks("train")
    return suite, pool, [t for t in pool if len(t.user_turns) == 2][:n]


@pytest.mark.slow
def test_smollm2_multi_turn_episodes_have_no_drift(smollm2):
    sampler, tokenizer = smollm2
    suite, pool, tasks = _toy_two_turn_tasks(5)
    config = RolloutConfig(mode="real", seed=1, max_new_tokens_act=40, temperature=0.7)
    episodes = rollout(tasks, suite, sampler, tokenizer, config, 4, example_pool=pool)
    assert len(episodes) == 20
    assert sum(e.drift for e in episodes) == 0
    # non-canonical samples may occur and are kept as sampled; they are counted, not drift
    assert all(e.meta["noncanonical"] >= 0 for e in episodes)
    appends = [sum(s.role in (Role.REAL, Role.USER) for s in e.segments) for e in episodes]
    assert sum(a >= 2 for a in appends) >= 10, appends  # most episodes really are multi-turn


@pytest.mark.slow
def test_smollm2_rehearsal_mode_on_toy_holds_rehearsed_and_real(smollm2):
    """Every call the untrained model makes is rehearsed by its own generation and executed on
    the shadow env. Its rehearsals rarely parse before SFT (docs/platform.md §2): then
    ``rehearsed`` is None, the raw world-role output stays in ``Episode.rehearsals`` and the
    stop says why."""
    sampler, tokenizer = smollm2
    suite, pool, tasks = _toy_two_turn_tasks(2)
    # greedy: sampled at T = 1 the untrained model often writes no closed call at all
    config = RolloutConfig(
        mode="rehearsal",
        seed=0,
        max_new_tokens_act=40,
        max_new_tokens_rehearse=32,
        temperature=0.0,
    )
    episodes = rollout(tasks, suite, sampler, tokenizer, config, 2, example_pool=pool)
    assert any(e.calls for e in episodes), [(e.stop_reason, e.stop_detail) for e in episodes]
    for episode in episodes:
        assert len(episode.rehearsals) == len(episode.calls)
        for index, record in enumerate(episode.calls):
            assert record.shown == "rehearsed" and record.real is not None
            rehearsal = episode.rehearsals[index]
            assert rehearsal.call_index == index and rehearsal.completion.logprobs
            if record.rehearsed is None:
                assert episode.stop_reason is StopReason.UNPARSEABLE_REHEARSAL
    rows = [r for e in episodes for r in training_rows(e)]
    assert {Role.ACT, Role.REHEARSE} <= {r.role for r in rows}


def test_cli_rejects_bad_counts_before_loading_a_model(tmp_path):
    from typer.testing import CliRunner

    from envace_engine.cli import app

    args = ["rollout", "--model", "tiny", "--out", str(tmp_path), "--episodes", "3"]
    result = CliRunner().invoke(app, [*args, "--group", "2"])
    assert result.exit_code != 0 and "not a multiple of group 2" in result.output
    result = CliRunner().invoke(app, [*args, "--mode", "simulator"])
    assert result.exit_code != 0 and "--simulator MODEL is needed" in result.output


def test_cli_runs_the_tiny_model_and_writes_jsonl(tmp_path):
    from typer.testing import CliRunner

    from envace_engine.cli import app

    args = ["rollout", "--model", "tiny", "--suite", "toy", "--episodes", "4", "--group", "2"]
    args += ["--out", str(tmp_path), "--max-new-tokens", "4", "--show", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "== episode" in result.output and "stop reasons:" in result.output
    records = read_episodes(tmp_path / "episodes.jsonl")
    assert len(records) == 4 and len({r["group_id"] for r in records}) == 2
    assert (tmp_path / "metrics.jsonl").is_file()


def test_cli_stores_a_run_the_studio_reads(tmp_path):
    from typer.testing import CliRunner

    from envace_engine.cli import app
    from storage.store import Store

    run_dir = tmp_path / "runs" / "rollout-test"
    args = ["rollout", "--model", "tiny", "--suite", "toy", "--episodes", "4", "--group", "2"]
    args += ["--run-dir", str(run_dir), "--max-new-tokens", "4", "--show", "0"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    store = Store(tmp_path)
    try:
        runs = store.runs()
        assert list(runs["run_id"]) == ["rollout-test"]
        assert store.count_episodes(run_id="rollout-test") == 4
        assert store.run("rollout-test").progress.status == "done"
    finally:
        store.close()


def test_cli_needs_an_output(tmp_path):
    from typer.testing import CliRunner

    from envace_engine.cli import app

    result = CliRunner().invoke(app, ["rollout", "--model", "tiny", "--episodes", "2"])
    assert result.exit_code != 0 and "--out DIR (JSON Lines) or --run-dir DIR" in result.output
