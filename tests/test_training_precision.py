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
