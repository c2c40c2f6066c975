"""``RolloutConfig.check_calls``: a rehearsed call the tool schemas refuse gets the real tool
layer's error without a world generation (docs/rehearsal.md, *Checked calls*).

The check's error is compared with what the toy suite's real environment (``ToolEnvironment``)
answers for the same call; the loop is driven by a scripted policy on real toy tasks and real
token prompts; storage writes the checked answer in its own columns with no fidelity pair.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from envace_engine.environments import get_suite
from envace_engine.environments.tool_environment import check_call, parameter_schemas
from envace_engine.rollout.loop import RolloutConfig, rollout
from envace_engine.testtime.select import outlook
from envace_engine.types import CallRecord, Role, StopReason, ToolCall, ToolError, ToolResult
from storage import Store
from storage.shards import RunWriter
from studio.pages import inspector
from tests.kv_world import ScriptedSampler, call_text, is_rehearse_prompt, last_message

SUITE = get_suite("toy")


def _warehouse_task():
    """The first one-turn warehouse task of the validation split."""
    tasks = SUITE.tasks("validation")
    return next(t for t in tasks if t.meta["world"] == "warehouse" and len(t.user_turns) == 1)


BAD_CALLS = [
    ToolCall("get_stock", {"item": "nails"}),  # no such tool
    ToolCall("check_stock", {"item": "nails", "qty": 3}),  # an argument the schema lacks
    ToolCall("add_stock", {"item": "nails"}),  # a required argument missing
    ToolCall("add_stock", {"item": "nails", "qty": "3"}),  # the wrong type
    ToolCall("add_stock", {"item": "nails", "qty": 0}),  # below the schema's minimum
]


@pytest.mark.parametrize("call", BAD_CALLS, ids=lambda c: f"{c.name}{sorted(c.arguments)}")
def test_the_check_refuses_with_the_real_tools_error(call):
    task = _warehouse_task()
    refused = check_call(call, parameter_schemas(task.tools))
    real = SUITE.make_env(task).execute(call)
    assert refused is not None and real.error == refused


def test_the_check_passes_a_valid_call_and_leaves_the_backend_rules_to_the_world():
    task = _warehouse_task()
    item = next(iter(task.initial_state["stock"]))
    schemas = parameter_schemas(task.tools)
    assert check_call(ToolCall("check_stock", {"item": item}), schemas) is None
    # Valid by the schema, refused by the backend's own rule: a value the world must imagine.
    too_many = ToolCall("remove_stock", {"item": item, "qty": 1000})
    assert check_call(too_many, schemas) is None
    assert "error" in SUITE.make_env(task).execute(too_many).value


def _agent(prompt: str) -> str:
    """Asks with a wrong argument first; after the error, asks correctly; then answers."""
    role, content = last_message(prompt)
    if role != "tool":
        return call_text("check_stock", item="nails", qty=3)
    if "INVALID_PARAMETERS" in content:
        return call_text("check_stock", item="nails")
    return "There are some."


def _world(prompt: str) -> str:
    return '<execution_result>{"item": "nails", "qty": 5}</execution_result>'


def _script(world_prompts: list[str]):
    def script(prompt: str) -> str:
        if is_rehearse_prompt(prompt):
            world_prompts.append(prompt)
            return _world(prompt)
        return _agent(prompt)

    return script


def _run(tokenizer, **config):
    task = _warehouse_task()
    world_prompts: list[str] = []
    sampler = ScriptedSampler(tokenizer, _script(world_prompts))
    cfg = RolloutConfig(n_examples=0, seed=0, max_turns=3, **config)
    (episode,) = rollout([task], SUITE, sampler, tokenizer, cfg, 1, run_id="c")
    return episode, world_prompts


def test_a_checked_call_gets_the_error_without_a_world_generation(tokenizer):
    episode, world_prompts = _run(tokenizer, check_calls=True)
    assert episode.stop_reason is StopReason.DONE, episode.stop_detail
    first, second = episode.calls
    assert first.shown == "checked" and first.rehearsed is None
    assert first.checked.error.code == "INVALID_PARAMETERS"
    assert first.real.error == first.checked.error  # the shadow environment agrees
    assert second.shown == "rehearsed" and second.rehearsed.value == {"item": "nails", "qty": 5}
    assert len(world_prompts) == 1 and [r.call_index for r in episode.rehearsals] == [1]
    tool = [s for s in episode.segments if s.role is Role.TOOL]
    assert "INVALID_PARAMETERS" in tool[0].text  # the agent read the error as a tool message
    assert outlook(episode).errors == 1


def test_without_the_check_the_world_role_answers_every_call(tokenizer):
    episode, world_prompts = _run(tokenizer, check_calls=False)
    assert [c.shown for c in episode.calls] == ["rehearsed"]  # it "worked": the agent answers
    assert len(world_prompts) == 1 and outlook(episode).errors == 0


def test_real_mode_ignores_the_switch(tokenizer):
    def no_world(prompt: str) -> str:
        raise AssertionError("real mode generates nothing for tool calls")

    task = _warehouse_task()
    sampler = ScriptedSampler(
        tokenizer, lambda p: no_world(p) if is_rehearse_prompt(p) else _agent(p)
    )
    cfg = RolloutConfig(mode="real", n_examples=0, seed=0, max_turns=3, check_calls=True)
    (episode,) = rollout([task], SUITE, sampler, tokenizer, cfg, 1, run_id="r")
    assert [c.shown for c in episode.calls] == ["real", "real"]


def test_seen_is_the_answer_the_agent_saw():
    error = ToolResult(error=ToolError("INVALID_PARAMETERS", "no"))
    checked = CallRecord(0, 1, ToolCall("x", {}), "checked", real=error, checked=error)
    assert checked.seen() is error
    rehearsed = CallRecord(0, 1, ToolCall("x", {}), "rehearsed", real=error)
    assert rehearsed.seen() is None  # an unparseable rehearsal: nothing parsed was shown


def test_storage_keeps_the_checked_answer_apart_from_the_fidelity_pairs(tokenizer, tmp_path: Path):
    episode, _ = _run(tokenizer, check_calls=True)
    with RunWriter.create(tmp_path, "rollout", model="scripted", suite="toy", config={}) as w:
        w.episodes(0, [episode])
        path = w.path
    rows = duckdb.sql(
        f"""SELECT shown, checked_json, checked_error, rehearsed_status, pair_source, fidelity
        FROM read_parquet('{path}/calls/*.parquet') ORDER BY call_index"""
    ).fetchall()
    assert rows[0] == ("checked", None, "INVALID_PARAMETERS", None, None, None)
    assert rows[1][0] == "rehearsed" and rows[1][2] is None and rows[1][4] == "rehearsed"
    with Store(tmp_path) as store:  # the inspector shows the check's error under the call
        messages = inspector.chat_messages(store.episode(episode.id))
    titles = [m["metadata"]["title"] for m in messages if m.get("metadata")]
    checked = titles.index("schema check (the world role was not asked)")
    assert titles[checked - 1 : checked + 2] == [
        "tool call 0: check_stock",
        "schema check (the world role was not asked)",
        "real response",
    ]


def test_the_cli_option_reaches_the_rollout_config():
    from envace_engine.cli.eval import _prepare
    from envace_engine.cli.spec_options import read_spec
    from envace_engine.specs import EvalSpec

    given = {"model": "tiny", "suite": "toy", "n_tasks": 2, "max_turns": 3, "check_calls": True}
    job = _prepare(read_spec(EvalSpec, given))
    assert job.rollout.check_calls is True and job.record["check_calls"] is True
    assert RolloutConfig().check_calls is False  # off unless asked for: the method as specified
