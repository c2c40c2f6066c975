"""SFT with ``pack_turns``: a task's nested act turns as one sequence, the same loss, gradients
and teacher-forced scores as separate examples."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from envace_engine.config import SFTConfig, build
from envace_engine.environments import get_suite
from envace_engine.rollout.tokens import ChatTokenizer
from envace_engine.training.sft import sft_loss
from envace_engine.training.sft.data import (
    all_samples,
    as_rows,
    bucketed_batches,
    chain_batch,
    chains,
    tokenize,
)
from envace_engine.training.sft.evaluate import greedy_matches


def _examples(tokenizer, n_tasks: int = 6, world: str = "bank") -> list:
    config = build(
        SFTConfig,
        {
            "n_tasks": n_tasks,
            "task_filter": {"world": world},
            "roles": ["act", "rehearse", "memory"],
            "memory_fraction": 0.5,
            "rollout": {"n_examples": 0, "grounded_rehearsal": False, "rehearse_history": True},
        },
    )
    return tokenize(all_samples(config, get_suite("toy")), ChatTokenizer(tokenizer))


def test_chains_are_a_tasks_nested_act_turns(tokenizer) -> None:
    examples = _examples(tokenizer)
    found = chains(examples, pack=True)
    members = [i for c in found for i in c.members]
    assert sorted(members) == list(range(len(examples)))  # each example in exactly one chain
    longest = max(found, key=lambda c: len(c.members))
    assert len(longest.members) >= 2  # multi-turn bank tasks nest
    for chain in found:
        first = examples[chain.members[0]]
        assert {(examples[i].source, examples[i].role) for i in chain.members} == {
            (first.source, first.role)
        }
        for a, b in zip(chain.members, chain.members[1:], strict=False):
            seq = examples[a].prompt_ids + examples[a].completion_ids
            assert examples[b].prompt_ids[: len(seq)] == seq
        assert chain.length == examples[chain.members[-1]].length
    roles = Counter(examples[i].role for c in found if len(c.members) > 1 for i in c.members)
    assert set(roles) == {"act"}  # rehearse prompts do not nest: they stay alone
    assert [c.members for c in chains(examples, pack=False)] == [(i,) for i in range(len(examples))]


def test_unpacked_batches_are_the_examples_batches(tokenizer) -> None:
    """``pack_turns = false`` draws exactly the batches it drew before chains existed."""
    examples = _examples(tokenizer)
    singles = chains(examples, pack=False)
    assert bucketed_batches(singles, 4, seed=3) == bucketed_batches(examples, 4, seed=3)


def _grads(model, batch) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = sft_loss(model, batch, bf16=False)
    loss.backward()
    return float(loss.detach()), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_a_packed_batch_has_the_loss_and_gradients_of_separate_rows(tiny_path, tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path).train()
    examples = _examples(tokenizer, n_tasks=3)
    found = chains(examples, pack=True)
    picked = [c for c, chain in enumerate(found) if chain.group.startswith("act|")][:3]
    packed = chain_batch(examples, found, picked, tokenizer.pad_token_id)
    chosen = [examples[i] for c in picked for i in found[c].members]
    assert packed.num_rows == len(chosen) > packed.input_ids.shape[0]  # fewer sequences
    from envace_engine.training.batching import collate

    plain = collate(as_rows(chosen), [0.0] * len(chosen), tokenizer.pad_token_id, True)
    assert packed.num_tokens == plain.num_tokens
    assert packed.input_ids.numel() < plain.input_ids.numel()
    loss_p, grads_p = _grads(model, packed)
    loss_u, grads_u = _grads(model, plain)
    assert loss_p == pytest.approx(loss_u, rel=1e-5)
    for gp, gu in zip(grads_p, grads_u, strict=True):
        torch.testing.assert_close(gp, gu, rtol=1e-4, atol=1e-6)


def test_packed_teacher_forced_scores_equal_separate_ones(tiny_model, tokenizer) -> None:
    examples = _examples(tokenizer, n_tasks=4)
    pad = tokenizer.pad_token_id
    packed = greedy_matches(tiny_model, examples, pad, bf16=False, pack=True)
    plain = greedy_matches(tiny_model, examples, pad, bf16=False, pack=False)
    assert packed == plain
    assert [n for _, n in plain] == [len(e.completion_ids) for e in examples]


def test_heldout_examples_do_not_depend_on_the_runs_seed() -> None:
    """Runs of one recipe that differ in seed are scored on the same held-out examples, though
    the seed draws which tasks get memory-conditioned examples (and, past ``eval_tasks``, which
    tasks) — as it still does for the training examples."""
    from envace_engine.config import SFTConfig
    from envace_engine.rollout.memory_prompts import MEMORY_HEADER
    from envace_engine.training.sft.evaluate import heldout_samples

    def keyed(samples: list) -> list[tuple]:
        return sorted((s.source, s.role, s.target, repr(s.prompt)) for s in samples)

    def with_memory(samples: list) -> set[str]:
        return {s.source for s in samples if any(MEMORY_HEADER in m.content for m in s.prompt)}

    recipe = {"memory_fraction": 0.5, "roles": ("act", "rehearse", "memory"), "n_tasks": 30}
    held = [heldout_samples(SFTConfig(seed=seed, eval_tasks=30, **recipe)) for seed in (0, 1, 7)]
    assert with_memory(held[0]) and keyed(held[1]) == keyed(held[0]) == keyed(held[2])
    trained = [all_samples(SFTConfig(seed=seed, **recipe)) for seed in (0, 1)]
    assert with_memory(trained[0]) != with_memory(trained[1])  # the seed does draw them
