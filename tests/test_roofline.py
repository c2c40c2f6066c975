"""The rollout bench's roofline (bench/throughput/roofline.py), with hand-computed numbers."""

from __future__ import annotations

import pytest

from bench.throughput import roofline


def test_prefill_min_counts_each_prefix_once_less_what_decode_steps_computed() -> None:
    calls = [
        ([1, 2, 3, 9], [5, 6]),  # a GRPO group of two: one prompt
        ([1, 2, 3, 9], [5, 7]),
        ([1, 2, 3, 9, 5, 6, 4, 9], [8]),  # the first episode's next turn: reply + 4 + 9
    ]
    # prompt prefixes (all but each prompt's last token): 1, 12, 123 and 1239, 12395, 123956,
    # 1239564: seven; decode computed 1239 and 12395 (each first-turn prompt, then it + 5)
    assert roofline.prefill_min(calls) == 5
    # a lone prompt: all but its last token
    assert roofline.prefill_min([([4, 5, 6], [7])]) == 2


def test_roofline_prefill_skips_the_head_and_the_bound_is_the_slower_limit() -> None:
    limits = roofline.Limits("float32", gemm_flops=1e9, bandwidth=1e6)
    weights = roofline.Weights(params=100, head=40, step_bytes=400)
    # compute: 2*100*10 + 2*60*50 = 8000 FLOPs -> 8e-6 s; memory: (3*400 + 600) / 1e6 = 1.8e-3 s
    roof = roofline.roofline_tok_s(limits, weights, 10, 50, 3, kv_bytes=600)
    assert roof["roofline_bound"] == "memory"
    assert roof["roofline_compute_s"] == pytest.approx(8e-6)
    assert roof["roofline_memory_s"] == pytest.approx(1.8e-3)
    assert roof["roofline_tok_s"] == pytest.approx(10 / 1.8e-3)
    fast_memory = roofline.Limits("float32", gemm_flops=1e9, bandwidth=1e12)
    roof = roofline.roofline_tok_s(fast_memory, weights, 10, 50, 3, kv_bytes=600)
    assert roof["roofline_bound"] == "compute"
    assert roof["roofline_tok_s"] == pytest.approx(10 / 8e-6)


def test_kv_private_tokens_reads_a_shared_prefix_once() -> None:
    # two prompts sharing 3 tokens: each reads its 1 private token plus half of its own
    # generation on average; the lone prompt reads all of it
    calls = [([1, 2, 3, 4], 2), ([1, 2, 3, 5], 4), ([9, 9], 2)]
    expected = 2 * (1 + 1) + 4 * (1 + 2) + 2 * (2 + 1)
    assert roofline.kv_private_tokens(calls) == expected


def test_weights_of_counts_the_llama_layers_and_a_tied_head_once(tiny_model) -> None:
    c = tiny_model.config
    d = c.hidden_size // c.num_attention_heads
    attention = c.hidden_size * d * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
    mlp = 3 * c.hidden_size * c.intermediate_size
    head = c.vocab_size * c.hidden_size
    assert c.tie_word_embeddings  # the tied embedding is the head: counted once
    w = roofline.weights_of(tiny_model, 2)
    assert w.head == head
    assert w.params == c.num_hidden_layers * (attention + mlp) + head
    assert w.step_bytes == 2 * w.params
