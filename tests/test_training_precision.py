"""bf16 autocast only where bf16 GEMMs are native; fp32 (and one warning) elsewhere."""

from __future__ import annotations

import logging

import torch

from envace_engine.training import precision
from envace_engine.training.batching import collate
from envace_engine.training.sft import sft_loss


def _batch(tokenizer):
    from envace_engine.types import TrainRow

    ids = tokenizer("the warehouse holds twelve crates of apples")["input_ids"]
    prompt, completion = tuple(ids[:4]), tuple(ids[4:])
    row = TrainRow("e", "g", "act", prompt, completion, (0.0,) * len(completion), None)
    return collate([row], [0.0], tokenizer.pad_token_id, share_prefix=False)


def test_bf16_is_asked_for_but_runs_only_on_a_native_unit(monkeypatch, caplog):
    cpu = torch.device("cpu")
    monkeypatch.setattr(precision, "cpu_bf16", lambda: None)  # an AVX2-only CPU (Zen 3)
    precision._log_choice.cache_clear()
    with caplog.at_level(logging.INFO, logger=precision.__name__):
        assert precision.bf16_autocast(True, cpu) is False
        assert precision.bf16_autocast(True, cpu) is False
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "training in fp32" in warned[0].getMessage()
    assert precision.bf16_autocast(False, cpu) is False
    monkeypatch.setattr(precision, "cpu_bf16", lambda: "amx_bf16")
    assert precision.bf16_autocast(True, cpu) is True
    assert precision.bf16_autocast(False, cpu) is False
    precision._log_choice.cache_clear()


def test_the_sft_loss_falls_back_to_exactly_fp32(tiny_model, tokenizer, monkeypatch):
    batch = _batch(tokenizer)
    with torch.no_grad():
        fp32 = float(sft_loss(tiny_model, batch, bf16=False))
        monkeypatch.setattr(precision, "cpu_bf16", lambda: None)
        assert float(sft_loss(tiny_model, batch, bf16=True)) == fp32  # the fallback is fp32
        monkeypatch.setattr(precision, "cpu_bf16", lambda: "avx512_bf16")
        bf16 = float(sft_loss(tiny_model, batch, bf16=True))  # emulated here if not native
    assert bf16 != fp32 and abs(bf16 - fp32) < 0.05 * fp32  # bf16 rounding, same loss
    precision._log_choice.cache_clear()


def test_weights_cast_once_per_step_give_the_same_gradients(tiny_path, tokenizer):
    """Micro-batches inside ``weight_casts_kept`` (each weight cast to bf16 once, the cast
    reused by every micro-batch's forward and backward) accumulate exactly the gradients of
    micro-batches each in its own autocast block, and ``autocast_off`` is fp32 inside it."""
    from transformers import AutoModelForCausalLM

    from envace_engine.logprobs import completion_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_path).train()
    batches = [_batch(tokenizer), _batch(tokenizer)]
    cpu = torch.device("cpu")

    def grads(kept: bool) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        with precision.weight_casts_kept(kept, cpu):
            for b in batches:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    lp = completion_logprobs(
                        model, b.input_ids, b.attention_mask, b.completion_mask
                    )
                with precision.autocast_off(cpu):
                    loss = -(lp.float() * b.completion_mask).sum()
                    loss.backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    once, each = grads(True), grads(False)
    assert len(once) == len(each) > 0
    for a, b in zip(once, each, strict=True):
        assert torch.equal(a, b)
    with precision.weight_casts_kept(True, cpu), precision.autocast_off(cpu):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
