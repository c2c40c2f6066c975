"""The world role's KL anchor (loss.world_kl) and auxiliary NLL (loss.world_nll), by hand."""

from __future__ import annotations

import math

import pytest
import torch

from envace_engine.rollout.parsing import result_to_json
from envace_engine.rollout.prompts import rehearse_target
from envace_engine.rollout.tokens import ChatTokenizer
from envace_engine.training.batching import micro_batches
from envace_engine.training.loss import LossInputs, policy_loss
from envace_engine.training.world_nll import batch_nll, nll_backward, target_rows
from envace_engine.types import (
    CallRecord,
    Episode,
    Mode,
    Rehearsal,
    Role,
    Segment,
    Task,
    ToolCall,
    ToolResult,
)

LN2 = math.log(2.0)


def _inputs(ref: list[list[float]] | None) -> LossInputs:
    """Row 0 act, row 1 rehearse; ratio 1 everywhere, advantage 0: only a KL term is left."""
    return LossInputs(
        logprobs=torch.zeros(2, 2, requires_grad=True),
        old_logprobs=torch.zeros(2, 2),
        advantages=torch.zeros(2),
        mask=torch.tensor([[1.0, 0.0], [1.0, 0.0]]),
        role_ids=torch.tensor([0, 1]),
        ref_logprobs=None if ref is None else torch.tensor(ref),
    )


def test_the_kl_anchor_is_zero_at_the_reference_weights():
    inputs = _inputs(None)
    at_ref = LossInputs(**{**inputs.__dict__, "ref_logprobs": inputs.logprobs.detach().clone()})
    plain = policy_loss(inputs).loss
    anchored = policy_loss(at_ref, kl_coef=0.3, world_kl_coef=0.5).loss
    assert anchored.item() == plain.item() == 0.0


def test_world_kl_reaches_rehearse_rows_only():
    # delta = ref - logp = ln 2 on each row's first token: k3 = 2 - ln 2 - 1 = 1 - ln 2
    k3 = 1 - LN2
    inputs = _inputs([[LN2, 0.0], [LN2, 0.0]])
    world_only = policy_loss(inputs, world_kl_coef=1.0)
    assert world_only.loss.item() == pytest.approx((0 + k3) / 2)  # seq mean over 2 rows
    both = policy_loss(inputs, kl_coef=1.0, world_kl_coef=1.0)
    assert both.loss.item() == pytest.approx((k3 + 2 * k3) / 2)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(_inputs(None), world_kl_coef=0.1)


def _episode(task: Task, prompt: tuple[int, ...]) -> Episode:
    call = task.reference_calls[0][0]
    return Episode(
        "e-0-0",
        task.id,
        "toy",
        Mode.REHEARSAL,
        "g",
        (),
        rehearsals=(Rehearsal(0, prompt, Segment(Role.REHEARSE, (5,), "x", (-1.0,)), True),),
        calls=(CallRecord(0, 1, call, "rehearsed", rehearsed=ToolResult({"stock": 1})),),
    )


TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "check_stock",
            "parameters": {"type": "object", "properties": {"item": {"type": "string"}}},
        },
    },
)


def test_the_auxiliary_loss_is_a_plain_nll_of_the_known_answer(tiny_model, tokenizer):
    chat = ChatTokenizer(tokenizer)
    call = ToolCall("check_stock", {"item": "pen"})
    task = Task("t", "toy", ("?",), TOOLS, {}, ((call,),), (({"stock": 5},),))
    prompt = tuple(tokenizer.encode("<|im_start|>user\nrehearse check_stock<|im_end|>\n"))
    rows = target_rows({"t": task}, [_episode(task, prompt)], chat)
    target = [*chat.encode(rehearse_target(result_to_json(ToolResult({"stock": 5})))), chat.eos_id]
    assert len(rows) == 1 and list(rows[0].completion_ids) == target
    (batch,) = micro_batches(rows, [0.0], chat.eos_id, 4096, True)
    nll, count = batch_nll(tiny_model, batch)
    ids = torch.tensor([[*prompt, *target]])
    with torch.no_grad():
        logits = tiny_model(input_ids=ids).logits[0].float()
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
    assert count == len(target)
    assert nll.item() == pytest.approx(float(-lp[-len(target) :].sum()), rel=1e-4)


def test_off_path_rehearsals_have_no_target_and_no_gradient(tiny_model, tokenizer):
    chat = ChatTokenizer(tokenizer)
    off = ToolCall("check_stock", {"item": "ink"})  # not the reference call
    task = Task("t", "toy", ("?",), TOOLS, {}, ((off,),), (({"stock": 5},),))
    episode = _episode(
        Task("t", "toy", ("?",), TOOLS, {}, ((ToolCall("check_stock", {"item": "pen"}),),)), (1, 2)
    )
    assert target_rows({"t": task}, [episode], chat) == []
    assert nll_backward(tiny_model, [], 0.5, 0, 4096) == {"world/nll_rows": 0.0}


def test_replayed_sft_rehearse_examples_are_the_sft_recipes_own(tokenizer):
    from envace_engine.config import ConfigError, RolloutSettings, TrainConfig, build
    from envace_engine.environments import get_suite
    from envace_engine.training.world_nll import replay_rows

    chat = ChatTokenizer(tokenizer)
    tasks = get_suite("toy").tasks("train")[:40]
    settings = RolloutSettings(n_examples=0, grounded_rehearsal=False, world_state=True)
    rows = replay_rows(tasks, settings, chat, 3, seed=7)
    assert len(rows) == 3 and {r.role for r in rows} == {Role.REHEARSE}
    assert rows == replay_rows(tasks, settings, chat, 3, seed=7)  # the step's seed decides
    for row in rows:
        text = tokenizer.decode(row.completion_ids[:-1])
        assert text.startswith("<execution_result>") and row.completion_ids[-1] == chat.eos_id
        prompt = tokenizer.decode(row.prompt_ids)
        assert "Environment state at the start of the task" in prompt  # the run's settings
    with pytest.raises(ConfigError, match="world_nll"):
        build(TrainConfig, {"loss": {"world_nll_replay": 4}})


def test_world_nll_rows_keeps_a_seeded_uniform_sample_in_order():
    from envace_engine.config import ConfigError, TrainConfig, build
    from envace_engine.training.world_nll import sample_rows

    rows = list("abcdefgh")
    assert sample_rows(rows, 0, seed=1) == rows  # 0: every row
    assert sample_rows(rows, 8, seed=1) == rows and sample_rows(rows, 20, seed=1) == rows
    kept = sample_rows(rows, 3, seed=1)
    assert len(kept) == 3 and kept == sorted(kept) and set(kept) <= set(rows)
    assert kept == sample_rows(rows, 3, seed=1)  # the step's seed decides
    draws = {tuple(sample_rows(rows, 3, seed=s)) for s in range(40)}
    assert len(draws) > 1  # not always the same rows
    counts = {
        r: sum(r in d for d in (sample_rows(rows, 4, seed=s) for s in range(400))) for r in rows
    }
    assert set(counts) == set(rows) and min(counts.values()) > 0  # every row can be drawn
    with pytest.raises(ConfigError, match="world_nll_rows"):
        build(TrainConfig, {"loss": {"world_nll_rows": 16}})
