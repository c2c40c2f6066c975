"""Shared-prompt decode attention (``embedded.cascade``) and packed linear weights
(``embedded.packed``)."""

from __future__ import annotations

import copy
import math
import threading
import types

import pytest
import torch

from envace_engine.samplers.base import SamplingParams
from envace_engine.samplers.embedded import cascade
from envace_engine.samplers.embedded.cascade import (
    PromptSlab,
    attention_with_lse,
    common_prefix,
    few_keys_attention,
    merge_partials,
)
from envace_engine.samplers.embedded.packed import PackedLinears
from envace_engine.samplers.embedded.sampler import HFSampler

GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)
H, D = 2, 4  # K/V heads and head size of the hand-built slabs


def test_merge_partials_by_hand():
    # Keys with scores 0, ln 2, ln 3 and values 1, 3, 6: softmax weights 1/6, 2/6, 3/6.
    # Part A = the first two keys: out 7/3, lse ln 3; part B = the third: out 6, lse ln 3.
    out_a, lse_a = torch.tensor([[7 / 3]]), torch.tensor([math.log(3)])
    out_b, lse_b = torch.tensor([[6.0]]), torch.tensor([math.log(3)])
    out, lse = merge_partials(out_a, lse_a, out_b, lse_b)
    assert out.item() == pytest.approx((1 + 6 + 18) / 6)
    assert lse.item() == pytest.approx(math.log(6))
    # A part with no weight at all (lse = -inf) leaves the other unchanged.
    out, lse = merge_partials(out_a, lse_a, out_b, torch.tensor([-math.inf]))
    assert out.item() == pytest.approx(7 / 3) and lse.item() == pytest.approx(math.log(3))


def test_attention_with_lse_is_softmax_attention(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, H, n, D, generator=gen) for n in (3, 7, 7))
    mask = torch.zeros(2, 1, 1, 7)
    mask[0, ..., :2] = -math.inf
    scores = q @ k.transpose(-1, -2) * 0.5 + mask
    fused = attention_with_lse(q, k, v, mask, 0.5)
    monkeypatch.setattr(cascade, "_CPU_FLASH", None)  # the plain-matmul path (GPUs)
    for out, lse in (fused, attention_with_lse(q, k, v, mask, 0.5)):
        assert torch.allclose(lse, torch.logsumexp(scores, dim=-1), atol=1e-5)
        assert torch.allclose(out, torch.softmax(scores, dim=-1) @ v, atol=1e-5)


def test_few_keys_attention_is_softmax_attention_over_a_slab_view():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(3, H, 2, D, generator=gen)
    slab = torch.randn(2, 3, H, 10, D, generator=gen)  # [k/v, rows, heads, capacity, D]
    k, v = slab[0, :, :, 2:7], slab[1, :, :, 2:7]  # the filled columns: views, as in a session
    mask = torch.zeros(3, 1, 1, 5)
    mask[0, ..., :3] = -math.inf  # a row that joined late: only its last two columns count
    scores = q @ k.transpose(-1, -2) * 0.5 + mask
    out, lse = few_keys_attention(q, k, v, mask, 0.5)
    assert torch.allclose(lse, torch.logsumexp(scores, dim=-1), atol=1e-5)
    assert torch.allclose(out, torch.softmax(scores, dim=-1) @ v, atol=1e-5)


def test_common_prefix_by_hand():
    assert common_prefix((1, 2, 3, 4), (1, 2, 9)) == 2
    assert common_prefix((1, 2), (1, 2, 3)) == 2
    assert common_prefix((5,), (6,)) == 0
    assert common_prefix((), (1,)) == 0
    long = tuple(range(1000))
    assert common_prefix(long, (*long[:777], -1)) == 777


def _kv(n: int, gen: torch.Generator) -> torch.Tensor:
    """Random K/V of ``n`` tokens for one layer: ``[layers=1, 2, H, n, D]``."""
    return torch.randn(1, 2, H, n, D, generator=gen)


def test_attend_over_shared_prompts_equals_attention_over_each_rows_whole_sequence():
    """Three rows: two share a 6-token prompt (one uses only 4 of its tokens, plus a 3-token
    rest), one has its own 5-token prompt; each has 2 own columns, one padded. The cascade
    must equal plain softmax attention over each row's own concatenated K/V."""
    gen = torch.Generator().manual_seed(1)
    prefixes = PromptSlab(1, 4, H, D, torch.zeros(()))
    rests = PromptSlab(1, 4, H, D, torch.zeros(()))
    shared, alone, rest = _kv(6, gen), _kv(5, gen), _kv(3, gen)
    s0 = prefixes.place("shared", tuple(range(6)), shared)
    s1 = prefixes.place("alone", tuple(range(10, 15)), alone)
    r0 = rests.place("rest", (7, 8, 9), rest)
    prefixes.join(0, s0, 6)
    prefixes.join(1, s0, 4)
    rests.join(1, r0, 3)
    prefixes.join(2, s1, 5)
    own_k, own_v = torch.randn(3, H, 2, D, generator=gen), torch.randn(3, H, 2, D, generator=gen)
    own_mask = torch.zeros(3, 1, 1, 2)
    own_mask[2, ..., 0] = -math.inf  # row 2 joined one step later: its first column is padding
    query = torch.randn(3, 2 * H, 1, D, generator=gen)  # 2 query heads per K/V head
    module = types.SimpleNamespace(layer_idx=0)
    cascade._ACTIVE.slabs = (prefixes, rests)
    try:
        got, _ = cascade.attend(module, query, own_k, own_v, own_mask, scaling=0.5)
    finally:
        cascade._ACTIVE.slabs = ()
    parts = {
        0: [shared[0, :, :, :6]],
        1: [shared[0, :, :, :4], rest[0]],
        2: [alone[0]],
    }
    for row, prompt in parts.items():
        first = 1 if row == 2 else 0
        keys = torch.cat([p[0] for p in prompt] + [own_k[row, :, first:]], dim=1)
        values = torch.cat([p[1] for p in prompt] + [own_v[row, :, first:]], dim=1)
        q = query[row, :, 0].view(H, 2, D)  # query heads 2h, 2h+1 read K/V head h
        want = torch.softmax(q @ keys.transpose(-1, -2) * 0.5, dim=-1) @ values
        assert torch.allclose(got[row, 0].view(H, 2, D), want, atol=1e-5), row


def test_prompt_slab_keeps_held_slots_contiguous_and_rows_find_their_columns():
    gen = torch.Generator().manual_seed(2)
    slab = PromptSlab(1, 3, H, D, torch.zeros(()))
    kvs = [_kv(n, gen) for n in (3, 5, 4)]
    for i, kv in enumerate(kvs):
        slab.join(i, slab.place(i, tuple(range(i, i + kv.shape[3])), kv), kv.shape[3])
    slab.leave(0)  # slot 0 freed: the last slot (key 2) moves into it
    assert slab.held == 2 and slab.find(2) == 0 and slab.find(1) == 1 and slab.find(0) is None
    keys, values = slab.row_kv(0, 2)
    assert torch.equal(keys, kvs[2][0, 0]) and torch.equal(values, kvs[2][0, 1])
    slab.move(2, 0)  # batch row 2 becomes batch row 0
    assert slab.slot_of == {0: 0, 1: 1}
    assert torch.equal(slab.row_kv(0, 0)[0], kvs[2][0, 0])
    assert slab.longest((1, 2, 3, 4, 9)) == (1, 4)  # key 1 holds tokens 1..5


def test_a_grpo_group_shares_one_prompt_copy_and_decodes_as_if_alone(tiny_model, tokenizer):
    base = tokenizer.encode("You are a careful agent. Tools: ls, cd, cat, grep, mkdir. " * 4)
    long = [*base, *tokenizer.encode(" The user asks for the file list.")]
    near = [*base, *tokenizer.encode(" The user asks to make a folder.")]  # shares `base`
    sampler = HFSampler(tiny_model, tokenizer, batch_size=6)
    stops = sampler.stop_ids
    got, seen = {}, []
    with sampler.session(GREEDY) as session:
        for i in range(4):
            session.submit(("group", i), long, 8, stops)
        session.submit("near", near, 8, stops)
        while session.busy:
            got.update(session.step())
            seen.append((session.prefixes.held, session.rests.held))
    assert seen[0] == (1, 1)  # one held prompt for all five rows; `near` adds only its rest
    for key, prompt in [(("group", 0), long), ("near", near)]:
        alone = HFSampler(tiny_model, tokenizer, prefix_reuse=False).generate([prompt], GREEDY)
        assert got[key].token_ids == alone[0].token_ids
        diffs = [abs(a - b) for a, b in zip(got[key].logprobs, alone[0].logprobs, strict=True)]
        assert max(diffs) < 1e-4
    assert len({got[("group", i)].token_ids for i in range(4)}) == 1  # greedy: all alike


def test_packed_linears_match_f_linear_follow_weight_updates_and_switch_off(tiny_model):
    model = copy.deepcopy(tiny_model)
    packed = PackedLinears(model)
    assert packed.enabled  # a CPU fp32 model
    ids = torch.tensor([[5, 17, 300, 2]])
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with packed.active():
            fast = model(input_ids=ids).logits
        assert torch.allclose(fast, plain, atol=1e-4, rtol=1e-4)
        model.lm_head.weight.mul_(2.0)  # an optimizer step: in place, version bumps
        with packed.active():
            again = model(input_ids=ids).logits
        assert torch.allclose(again, model(input_ids=ids).logits, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(again, fast, atol=1e-2)
    assert "forward" not in vars(model.lm_head)  # outside the block: the class's own forward


def test_packed_siblings_share_one_gemm_per_input_and_match_their_own_linears(tiny_model):
    model = copy.deepcopy(tiny_model)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    packed = PackedLinears(model)
    qkv = next(p for p in packed.packs if p.linears[0] is attn.q_proj)
    assert qkv.linears == [attn.q_proj, attn.k_proj, attn.v_proj]
    assert any(p.linears == [mlp.gate_proj, mlp.up_proj] for p in packed.packs)
    gemms = []
    x, y = torch.randn(3, 2, attn.q_proj.in_features), torch.randn(3, 2, attn.q_proj.in_features)
    with torch.inference_mode(), packed.active():
        qkv._gemm = lambda t, run=qkv._gemm: gemms.append(t) or run(t)
        for layer in (attn.q_proj, attn.k_proj, attn.v_proj):
            want = torch.nn.functional.linear(x, layer.weight)
            assert torch.allclose(layer(x), want, atol=1e-5)
        assert len(gemms) == 1  # k and v took their columns of q's GEMM
        # the same tolerance as above: the packed GEMM may round differently from F.linear
        k_want = torch.nn.functional.linear(y, attn.k_proj.weight)
        assert torch.allclose(attn.k_proj(y), k_want, atol=1e-5)
        assert torch.allclose(attn.k_proj(y), k_want, atol=1e-5)  # the same input again
        v_want = torch.nn.functional.linear(x, attn.v_proj.weight)
        assert torch.allclose(attn.v_proj(x), v_want, atol=1e-5)
        assert len(gemms) == 4  # a new input, a second call for one input: a new GEMM each
    assert qkv.memo is None  # nothing held after the block


def test_samplers_decoding_in_two_threads_at_once_do_not_mix_their_prompts(tiny_model, tokenizer):
    # The active slabs are per thread: each loopback SGLang server decodes in its own thread.
    prompts = [tokenizer.encode(t * 8) for t in ("Book a flight. ", "Cancel the hotel. ")]
    params = SamplingParams(max_new_tokens=24, temperature=0.0)
    alone = [HFSampler(tiny_model, tokenizer).generate([p], params)[0] for p in prompts]
    models = [copy.deepcopy(tiny_model) for _ in prompts]
    got: dict[int, tuple[int, ...]] = {}
    start = threading.Barrier(len(prompts))

    def run(i: int) -> None:
        sampler = HFSampler(models[i], tokenizer)
        start.wait()
        for _ in range(3):
            got[i] = sampler.generate([prompts[i]] * 3, params)[0].token_ids

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[i] for i in range(len(prompts))] == [g.token_ids for g in alone]
