"""Prefill attention (``embedded.prefill``): new tokens over a cached prefix, GQA without copies."""

from __future__ import annotations

import math
import threading
import types

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from envace_engine.samplers.embedded import prefill
from envace_engine.samplers.embedded.sampler import HFSampler

HEADS, KV_HEADS, D = 6, 2, 8  # three query heads per K/V head, as SmolLM2's 9 on 3


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Softmax attention written out: query i of n sees the held columns and new ones <= i."""
    n, total = q.shape[2], k.shape[2]
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    scores = q @ k.transpose(-1, -2) * scale
    seen = torch.ones(n, total, dtype=torch.bool).tril(total - n)
    return torch.softmax(scores.masked_fill(~seen, -math.inf), dim=-1) @ v


@pytest.mark.parametrize(("held", "n"), [(0, 5), (7, 1), (7, 4), (30, 9)])
def test_prefill_attention_is_causal_attention_over_held_and_new_columns(held, n):
    gen = torch.Generator().manual_seed(held + n)
    q = torch.randn(1, HEADS, n, D, generator=gen)
    k, v = (torch.randn(1, KV_HEADS, held + n, D, generator=gen) for _ in range(2))
    got = prefill.prefill_attention(q, k, v, 0.3)
    assert torch.allclose(got, reference(q, k, v, 0.3), atol=1e-5)


def _module() -> torch.nn.Module:
    return types.SimpleNamespace(is_causal=True, num_key_value_groups=HEADS // KV_HEADS)  # type: ignore[return-value]


def test_outside_a_prefill_forward_attend_is_sdpa_and_honours_the_mask():
    # One row whose first two columns are padding: a prefill never has any, so ``attend``
    # would be wrong for it, and must leave it to SDPA unless this thread runs a prefill.
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, HEADS, 4, D, generator=gen)
    k, v = (torch.randn(1, KV_HEADS, 4, D, generator=gen) for _ in range(2))
    mask = torch.ones(4, 4, dtype=torch.bool).tril()[None, None].clone()
    mask[..., :2] = False
    mask[..., :2, :2] = torch.eye(2, dtype=torch.bool)  # every query keeps one column
    want, _ = sdpa_attention_forward(_module(), q, k, v, mask, scaling=0.3)
    got, _ = prefill.attend(_module(), q, k, v, mask, scaling=0.3)
    assert torch.equal(got, want)
    seen = []
    model = types.SimpleNamespace(config=types.SimpleNamespace(_attn_implementation="sdpa"))
    with prefill.active(model):  # type: ignore[arg-type]
        worker = threading.Thread(
            target=lambda: seen.append(prefill.attend(_module(), q, k, v, mask, scaling=0.3)[0])
        )
        worker.start()
        worker.join()
        inside, _ = prefill.attend(_module(), q, k, v, mask, scaling=0.3)
    assert torch.equal(seen[0], want)  # another thread's forward: SDPA
    assert not torch.allclose(inside, want)  # this thread: the prefill path ignores the mask
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("compact", [True, False])  # LlamaDecodeStep.prefill / transformers
def test_a_resumed_prefill_keeps_the_kv_of_one_plain_forward(tiny_model, tokenizer, compact):
    tokens = tokenizer.encode("You are a careful agent. Tools: ls, cd, cat, grep. " * 3)
    # fp32 GEMMs: rounding only
    sampler = HFSampler(tiny_model, tokenizer, dtype="float32", compact_decode=compact)
    assert (sampler.compact is not None) is compact
    sampler.prefix_kv(tokens[:20])  # cached: the next call prefills only the rest
    before = sampler.prefilled
    kv = sampler.prefix_kv(tokens)
    assert sampler.prefilled - before == len(tokens) - 20
    with torch.inference_mode():
        out = tiny_model(input_ids=torch.tensor([tokens]), use_cache=True)
    for i, layer in enumerate(out.cache.layers):
        assert torch.allclose(kv[i, 0], layer.keys[0], atol=1e-5)
        assert torch.allclose(kv[i, 1], layer.values[0], atol=1e-5)


def test_prompts_admitted_together_are_prefilled_in_one_pass_with_each_ones_kv(
    tiny_model, tokenizer, monkeypatch
):
    system = tokenizer.encode("You are a careful agent. Tools: ls, cd, cat, grep. " * 3)
    prompts = [
        system + tokenizer.encode(" List the files."),  # its first 20 tokens are cached
        tokenizer.encode("A prompt that shares nothing with the others. " * 3),
        system + tokenizer.encode(" Make a folder named docs, then list it."),
    ]
    sampler = HFSampler(tiny_model, tokenizer, dtype="float32")
    assert sampler.compact is not None
    sampler.prefix_kv(system[:20])
    passes = []
    real = sampler.compact.prefill
    monkeypatch.setattr(sampler.compact, "prefill", lambda segs: passes.append(segs) or real(segs))
    before = sampler.prefilled
    sampler.prefill_many([*prompts, prompts[1]])  # a duplicate is prefilled once
    assert len(passes) == 1 and [s.held for s in passes[0]] == [20, 0, 20]
    assert sampler.prefilled - before == sum(len(p) for p in prompts) - 40
    sampler.prefill_many(prompts)  # all cached now: no pass
    assert len(passes) == 1
    for tokens in prompts:
        kv = sampler.prefix_kv(tokens)  # from the cache
        with torch.inference_mode():
            out = tiny_model(input_ids=torch.tensor([tokens]), use_cache=True)
        for i, layer in enumerate(out.cache.layers):
            assert torch.allclose(kv[i, 0], layer.keys[0], atol=1e-5)
            assert torch.allclose(kv[i, 1], layer.values[0], atol=1e-5)
    assert sampler.prefilled - before == sum(len(p) for p in prompts) - 40  # no recompute
