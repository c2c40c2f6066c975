"""``training.probe.real_nll``: the mean NLL per token of the real responses after their
rehearse prompts, in fp32 and under bf16 autocast (what a bf16 probe or study evaluation uses),
checked against a plain per-row forward."""

from __future__ import annotations

import math

from envace_engine.environments import get_suite
from envace_engine.rollout.loop import RolloutConfig, rollout
from envace_engine.rollout.parsing import result_to_json
from envace_engine.rollout.prompts import rehearse_target
from envace_engine.rollout.tokens import ChatTokenizer
from envace_engine.training.probe import real_nll
from envace_engine.types import Mode
from tests.test_rehearsal import ScriptedPolicy, toy_tasks


def _episodes(tokenizer):
    tasks = toy_tasks(3)
    config = RolloutConfig(
        mode=Mode.REHEARSAL, shadow_real=True, n_examples=0, seed=1, check_drift=False
    )
    return rollout(tasks, get_suite("toy"), ScriptedPolicy(tokenizer, tasks), tokenizer, config, 1)


def _by_hand(model, chat, episodes) -> float:
    """One unbatched forward per rehearsal, log-softmax over the full logits."""
    import torch

    total, count = 0.0, 0
    for e in episodes:
        for r in e.rehearsals:
            target = [*chat.encode(rehearse_target(result_to_json(e.calls[r.call_index].real)))]
            target.append(chat.eos_id)
            ids = torch.tensor([[*r.prompt_ids, *target]])
            with torch.inference_mode():
                logits = model(input_ids=ids).logits[0].float()
            lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
            total -= float(lp[-len(target) :].sum())
            count += len(target)
    return total / count


def test_real_nll_matches_a_plain_forward_and_bf16_stays_close(tiny_model, tokenizer):
    chat = ChatTokenizer(tokenizer)
    episodes = _episodes(tokenizer)
    assert sum(len(e.rehearsals) for e in episodes) >= 3
    fp32 = real_nll(tiny_model, chat, episodes)
    bf16 = real_nll(tiny_model, chat, episodes, bf16=True)
    assert fp32 is not None and bf16 is not None
    assert math.isclose(fp32, _by_hand(tiny_model, chat, episodes), rel_tol=1e-4)
    # bf16 rounds each GEMM's inputs (8 bits of mantissa); the log-softmax stays fp32
    assert fp32 != bf16 and math.isclose(fp32, bf16, rel_tol=0.02)
