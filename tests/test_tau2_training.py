"""Rehearsal and training on τ²: the world role rehearses τ² tools grounded in the gold results,
every rehearsed call has its real answer beside it (fidelity pairs), and EnvACE training on the
train split runs with the tiny model."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest

from envace_engine.environments import get_suite
from envace_engine.fidelity.metrics import compare
from envace_engine.rollout.loop import RolloutConfig, rollout
from envace_engine.rollout.rewards import state_reward
from envace_engine.rollout.user import ScriptedUser
from envace_engine.types import MetaKey, Mode, Role, StopReason, Task
from tests.kv_world import ScriptedSampler, call_text, is_rehearse_prompt

SUITE = get_suite("tau2-airline")
CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def _task(number: str) -> Task:
    return next(t for t in SUITE.tasks("base") if t.meta["tau2_id"] == number)


def _reference_agent(task: Task):
    """Makes the task's reference calls one per reply, then says the reference message."""
    calls = list(task.reference_calls[0])

    def act(prompt: str) -> str:
        done = prompt.count("<|im_start|>tool\n")
        if done < len(calls):
            return call_text(calls[done].name, **calls[done].arguments)
        return task.meta["answers"][0]

    return act


def copy_world(prompt: str) -> str:
    """The world role copying the reference result of the call it simulates (grounding)."""
    refs = dict(re.findall(r"^call: (.*)\nresult: (.*)$", prompt, re.M))
    name = re.search(r"^name: (.*)$", prompt, re.M).group(1)
    arguments = re.search(r"^arguments: (.*?)(<\|im_end\|>)?$", prompt, re.M).group(1)
    key = json.dumps({"name": name, "arguments": json.loads(arguments)}, ensure_ascii=False)
    return f"<execution_result>{refs.get(key, '{}')}</execution_result>"


def test_rehearsal_on_tau2_is_grounded_and_pairs_with_real_answers(tokenizer) -> None:
    task = _task("7")  # reservation look-ups, then a cabin upgrade paid by card
    act = _reference_agent(task)
    sampler = ScriptedSampler(
        tokenizer, lambda p: copy_world(p) if is_rehearse_prompt(p) else act(p)
    )
    user = ScriptedUser({task.id: [task.user_turns[0]]})
    config = RolloutConfig(mode=Mode.REHEARSAL, n_examples=0, user=user, max_turns=8, seed=0)
    (ep,) = rollout([task], SUITE, sampler, tokenizer, config)
    assert ep.stop_reason is StopReason.USER_STOP, ep.stop_detail
    assert len(ep.rehearsals) == len(ep.calls) == len(task.reference_calls[0])
    assert all(r.grounded for r in ep.rehearsals)
    first = tokenizer.decode(ep.rehearsals[0].prompt_ids)
    assert "Reference calls and results for this task" in first
    assert "Policy:" not in first  # the world role sees the conversation, not the agent policy
    for record in ep.calls:  # rehearsed vs real: copied from the gold replay, so exact
        assert record.shown == "rehearsed" and record.real is not None
        assert compare(record.rehearsed, record.real).exact, record.call.name
    assert {s.role for s in ep.segments} >= {Role.ACT, Role.TOOL, Role.SIMULATED_USER}
    assert state_reward(SUITE)(task, ep) == 1.0  # the agent's calls replayed on the real DB
    assert ep.meta[MetaKey.SCORE_BASIS] == "official"


def test_imagined_tau2_episodes_touch_no_real_tool(tokenizer) -> None:
    task = _task("7")
    act = _reference_agent(task)
    sampler = ScriptedSampler(
        tokenizer,
        lambda p: (
            '<execution_result>{"ok": true}</execution_result>' if is_rehearse_prompt(p) else act(p)
        ),
    )
    config = RolloutConfig(
        mode=Mode.REHEARSAL, n_examples=0, shadow_real=False, grounded_rehearsal=False, max_turns=8
    )
    (ep,) = rollout([task], SUITE, sampler, tokenizer, config)  # no user: the scripted opening
    assert ep.stop_reason is StopReason.DONE
    assert ep.calls and all(c.real is None for c in ep.calls)
    assert not any(r.grounded for r in ep.rehearsals)


@pytest.mark.slow
def test_envace_training_on_the_tau2_train_split_runs(tmp_path: Path) -> None:
    import torch

    from envace_engine.config import TrainConfig, load
    from envace_engine.sink import JsonlSink, read_episodes
    from envace_engine.training import trainer
    from tests.train_job import even_token_share

    overrides = [
        "suite=tau2-airline",
        "split=train",
        "steps=1",
        "tasks_per_step=1",
        "group_size=2",
        "micro_batch_tokens=16384",
        "rollout.context_limit=8192",
    ]
    config = load(TrainConfig, CONFIGS / "tiny-test.toml", overrides)
    parts = trainer.setup(config)
    assert {t.id for t in parts.tasks} == {t.id for t in SUITE.tasks("train")}
    # The random tiny model never solves a τ² task: score its tokens for a learning signal,
    # while real-env success is still τ²'s own evaluation (parts.success).
    parts = dataclasses.replace(parts, reward=even_token_share, reward_is_success=False)
    before = {k: v.clone() for k, v in parts.model.state_dict().items()}
    assert trainer.run(parts, tmp_path, JsonlSink(tmp_path)) == 1
    assert any(not torch.equal(v, before[k]) for k, v in parts.model.state_dict().items())
    (metrics,) = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert math.isfinite(metrics["loss"]) and metrics["rows/act/trained"] > 0
    assert metrics["success/real"] == 0.0
    episodes = read_episodes(tmp_path / "episodes.jsonl")
    assert len(episodes) == 2 and {e["suite"] for e in episodes} == {"tau2-airline"}
    assert all(e["meta"]["score_basis"] == "official" for e in episodes)
