"""The SFT loop: bucketed batches of chains, the NLL of completion tokens under bf16 autocast,
AdamW over every weight or a LoRA adapter, an atomic checkpoint, then the held-out scores."""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from envace_engine import adapters
from envace_engine.config import SFTConfig, write_prompt_settings
from envace_engine.logprobs import completion_logprobs
from envace_engine.models import load_tokenizer, resolve
from envace_engine.rollout.tokens import ChatTokenizer
from envace_engine.samplers.embedded.heap import keep_freed_memory
from envace_engine.sink import Sink
from envace_engine.training.lora import trained_model
from envace_engine.training.precision import bf16_autocast
from envace_engine.training.sft.data import (
    all_samples,
    batch_stream,
    chain_batch,
    chains,
    lr_at,
    tokenize,
)
from envace_engine.training.sft.evaluate import heldout_metrics

LOG = logging.getLogger(__name__)


def sft_loss(model: Any, batch: Any, bf16: bool) -> Any:
    """Mean NLL over the batch's completion tokens (head only on those tokens); ``bf16`` asks
    for bf16 autocast where the hardware runs it natively (``precision.bf16_autocast``)."""
    device = next(model.parameters()).device
    bf16 = bf16_autocast(bf16, device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        logprobs = completion_logprobs(
            model,
            batch.input_ids,
            batch.attention_mask,
            batch.completion_mask,
            prefix_ids=batch.prefix_ids,
        ).float()
    mask = batch.completion_mask
    return -(logprobs * mask).sum() / mask.sum().clamp(min=1.0)


def run_sft(config: SFTConfig, out_dir: Path, sink: Sink | None = None) -> Path:
    """Train, save a checkpoint dir at ``out_dir`` (atomically), score the held-out split."""
    torch.manual_seed(config.seed)
    spec = resolve(config.model)
    (model, _), tokenizer = trained_model(spec, config.lora, sampled=False), load_tokenizer(spec)
    chat = ChatTokenizer(tokenizer)
    examples = tokenize(all_samples(config), chat)
    if not examples:
        raise ValueError("no SFT examples: check roles, task_filter and the split")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else chat.eos_id
    trained = [p for p in model.parameters() if p.requires_grad]  # under [lora]: the adapter
    optimizer = torch.optim.AdamW(trained, lr=config.lr, weight_decay=0.0)
    if next(model.parameters()).device.type == "cpu":
        keep_freed_memory()  # each step frees and re-allocates GBs of activations (heap.py)
    model.train()
    found = chains(examples, config.pack_turns)
    LOG.info(
        "sft: %d examples in %d sequences per epoch (%.0f %% of the examples' tokens)",
        len(examples),
        len(found),
        100 * sum(c.length for c in found) / sum(e.length for e in examples),
    )
    for step, (epoch, picked) in enumerate(
        batch_stream(found, config.batch_size, config.seed, config.max_steps)
    ):
        started = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, config)
        batch = chain_batch(examples, found, picked, pad)
        loss = sft_loss(model, batch, config.bf16)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip = config.grad_clip if config.grad_clip is not None else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(trained, clip))
        optimizer.step()
        if sink is not None:
            metrics = {
                "sft/loss": float(loss.item()),
                "sft/lr": optimizer.param_groups[0]["lr"],
                "sft/grad_norm": norm,
                "sft/epoch": float(epoch),
                "sft/tokens": float(batch.num_tokens),
                "sft/examples": float(batch.num_rows),
                "sft/padded_tokens": float(batch.input_ids.numel()),
                "perf/step_s": time.perf_counter() - started,
            }
            sink.metrics(step, metrics)
            sink.progress(step + 1, config.max_steps, f"sft step {step + 1}")
    model.eval()
    out = _save(model, tokenizer, config, Path(out_dir))
    if config.eval_split is not None and sink is not None:
        held = heldout_metrics(model, chat, config, pad)
        sink.metrics(config.max_steps, held)
    return out


def _save(model: Any, tokenizer: Any, config: SFTConfig, out: Path) -> Path:
    """Write the checkpoint (weights, tokenizer, prompt settings) to a temporary, then rename."""
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    if adapters.is_peft(model):  # the adapter alone; its tokenizer is its base model's
        adapters.save(model.float(), tmp)
    else:
        model.float().save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    write_prompt_settings(tmp, config.rollout)
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(out)
    return out
