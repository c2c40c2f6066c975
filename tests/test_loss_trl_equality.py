"""Our loss and gradients equal TRL 1.16 GRPOTrainer's on a fixed single-turn, single-role batch.

Recipe: docs/protocols.md §2.1. A GRPOTrainer is built on the seeded ``tiny`` model (saved on disk,
so ``beta > 0`` can build its reference model from the path), switched to eval mode (gradient
accumulation factor 1), and fed a fixed batch through ``_compute_loss``. Ours runs on the same
model object (TRL only patches ``forward``; we use the backbone and the head directly) with the
same token layout (left-padded prompts, right-padded completions).

Matching settings: TRL ``grpo`` ↔ ``seq_mean_token_mean``, ``bnpo`` ↔ ``token_mean``; TRL has
no dual clip, so ours runs with ``dual_clip=None`` (the dual clip is pinned by hand in
test_loss.py); TRL's KL is compared with ``use_bias_correction_kl=False`` (plain k3, as ours).
``old_per_token_logps`` are perturbed away from the current log-probs so that both the low and
the high clip are active on some tokens.
"""

from __future__ import annotations

import pytest
import torch

from envace_engine.logprobs import completion_logprobs
from envace_engine.training.loss import LossInputs, policy_loss

TEMPERATURE = 0.7
EPS_LOW, EPS_HIGH = 0.2, 0.28


def _trainer(tiny_path, tokenizer, tmp_path, loss_type: str, beta: float):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        temperature=TEMPERATURE,
        epsilon=EPS_LOW,
        epsilon_high=EPS_HIGH,
        loss_type=loss_type,
        beta=beta,
        use_bias_correction_kl=False,
        num_generations=2,
        per_device_train_batch_size=4,
        max_completion_length=8,
    )
    trainer = GRPOTrainer(
        model=str(tiny_path),
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["a", "b"]}),
        processing_class=tokenizer,
    )
    trainer.model.eval()
    return trainer


def _fixed_batch(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """4 rows: prompts of 3-5 tokens (left-padded), completions of 2-6 tokens (right-padded)."""
    g = torch.Generator().manual_seed(7)
    vocab = model.config.vocab_size
    prompt_lens, completion_lens = [5, 3, 4, 5], [6, 2, 5, 4]
    prompt_ids = torch.zeros(4, 5, dtype=torch.long)
    prompt_mask = torch.zeros(4, 5, dtype=torch.long)
    completion_ids = torch.zeros(4, 6, dtype=torch.long)
    completion_mask = torch.zeros(4, 6, dtype=torch.long)
    for b, (p, c) in enumerate(zip(prompt_lens, completion_lens, strict=True)):
        prompt_ids[b, 5 - p :] = torch.randint(0, vocab, (p,), generator=g)
        prompt_mask[b, 5 - p :] = 1
        completion_ids[b, :c] = torch.randint(0, vocab, (c,), generator=g)
        completion_mask[b, :c] = 1
    with torch.no_grad():
        ids = torch.cat([prompt_ids, completion_ids], 1)
        att = torch.cat([prompt_mask, completion_mask], 1)
        cmask = torch.cat([torch.zeros_like(prompt_mask), completion_mask], 1)
        current = completion_logprobs(model, ids, att, cmask, temperature=TEMPERATURE)[:, 5:]
    # Ratios exp(current - old) spread over [e^-0.6, e^0.6]: inside and outside [0.8, 1.28].
    shift = torch.linspace(-0.6, 0.6, 24).reshape(4, 6)
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.0, -0.5, 0.75, -1.25]),
        "old_per_token_logps": (current - shift) * completion_mask,
        "ref_per_token_logps": (current + shift.flip(1) * 0.5) * completion_mask,
    }


def _ours(model, batch, aggregation: str, beta: float, is_weights=None) -> torch.Tensor:
    prompt_len = batch["prompt_ids"].shape[1]
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    att = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    mask = torch.cat([torch.zeros_like(batch["prompt_mask"]), batch["completion_mask"]], 1)

    def widen(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(x, (prompt_len, 0))

    logprobs = completion_logprobs(model, ids, att, mask, temperature=TEMPERATURE)
    inputs = LossInputs(
        logprobs=logprobs,
        old_logprobs=widen(batch["old_per_token_logps"]),
        advantages=batch["advantages"],
        mask=mask.float(),
        role_ids=torch.zeros(4, dtype=torch.long),
        ref_logprobs=widen(batch["ref_per_token_logps"]),
        is_weights=None if is_weights is None else widen(is_weights),
    )
    out = policy_loss(
        inputs,
        clip_eps_low=EPS_LOW,
        clip_eps_high=EPS_HIGH,
        dual_clip=None,
        kl_coef=beta,
        aggregation=aggregation,
    )
    assert out.roles["act"].clipped > 0  # the comparison really exercises clipping
    return out.loss


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    ("loss_type", "aggregation"), [("grpo", "seq_mean_token_mean"), ("bnpo", "token_mean")]
)
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_loss_and_gradients_match_trl(tiny_path, tokenizer, tmp_path, loss_type, aggregation, beta):
    trainer = _trainer(tiny_path, tokenizer, tmp_path, loss_type, beta)
    model = trainer.model
    batch = _fixed_batch(model)

    model.zero_grad(set_to_none=True)
    trl_loss = trainer._compute_loss(model, batch)
    trl_loss.backward()
    trl_grads = _grads(model)

    model.zero_grad(set_to_none=True)
    our_loss = _ours(model, batch, aggregation, beta)
    our_loss.backward()
    our_grads = _grads(model)

    assert trl_loss.item() != 0.0
    torch.testing.assert_close(our_loss, trl_loss, atol=1e-6, rtol=1e-6)
    assert our_grads.keys() == trl_grads.keys() and len(our_grads) > 10
    for name, grad in trl_grads.items():
        torch.testing.assert_close(our_grads[name], grad, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_truncated_importance_weights_match_trl(tiny_path, tokenizer, tmp_path, beta):
    """TIS: TRL's ``token_truncate`` correction (``use_vllm`` with importance sampling) equals
    ours with ``is_weights``: the same per-token weights multiply the clipped surrogate."""
    trainer = _trainer(tiny_path, tokenizer, tmp_path, "grpo", beta)
    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
    model = trainer.model
    batch = _fixed_batch(model)
    sampler = batch["old_per_token_logps"] + torch.linspace(-1.0, 1.0, 24).reshape(4, 6)
    gap = (batch["old_per_token_logps"] - sampler) * batch["completion_mask"]
    weights = torch.exp(gap).clamp(max=2.0) * batch["completion_mask"]
    assert (weights > 1.999).any() and (weights < 0.5).any()  # truncated and down-weighted
    batch["importance_sampling_ratio"] = weights

    model.zero_grad(set_to_none=True)
    trl_loss = trainer._compute_loss(model, batch)
    trl_loss.backward()
    trl_grads = _grads(model)
    model.zero_grad(set_to_none=True)
    our_loss = _ours(model, batch, "seq_mean_token_mean", beta, is_weights=weights)
    our_loss.backward()
    our_grads = _grads(model)

    torch.testing.assert_close(our_loss, trl_loss, atol=1e-6, rtol=1e-6)
    for name, grad in trl_grads.items():
        torch.testing.assert_close(our_grads[name], grad, atol=1e-6, rtol=1e-5, msg=name)
