"""The cross-call prefix cache of HFSampler: lookup/eviction by hand, and reuse end to end."""

from __future__ import annotations

import copy

import pytest
import torch

from envace_engine.samplers.base import SamplingParams
from envace_engine.samplers.embedded.kv import BLOCK, Continuation, PrefixCache, block_hashes
from envace_engine.samplers.embedded.sampler import HFSampler

GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)


def kv(n: int) -> torch.Tensor:
    """A fake ``[layers, 2, H, n, D]`` K/V whose values name their position (for slicing checks)."""
    return torch.arange(n, dtype=torch.float32).expand(1, 2, 1, n)[..., None].clone()


def test_block_hashes_chain_so_equal_hashes_mean_equal_prefixes():
    a = list(range(3 * BLOCK + 5))
    b = [*a[:BLOCK], -1, *a[BLOCK + 1 :]]
    assert len(block_hashes(a)) == 3
    assert block_hashes(a)[0] == block_hashes(b)[0]
    assert block_hashes(a)[1:] != block_hashes(b)[1:]  # a change poisons every later block


def test_lookup_finds_the_longest_prefix_token_exact_and_leaves_one_token():
    cache = PrefixCache(max_tokens=1000)
    seq = list(range(100, 100 + 2 * BLOCK + 7))
    cache.insert(seq, kv(len(seq)))
    entry, n = cache.lookup([*seq, 1, 2])
    assert entry is not None and n == len(seq)  # block walk, then token by token to the end
    assert cache.lookup(seq)[1] == len(seq) - 1  # the whole prompt cached: one token to compute
    assert cache.lookup([*seq[: BLOCK + 3], -5, -6])[1] == BLOCK + 3
    assert cache.lookup([7, *seq]) == (None, 0)
    assert cache.lookup(seq[: BLOCK - 1]) == (None, 0)  # under one block: never a hit


def test_a_continuation_supersedes_its_prefix_and_shared_blocks_survive_drops():
    cache = PrefixCache(max_tokens=10_000)
    system = list(range(2 * BLOCK))
    turn1 = [*system, 1, 2, 3]
    cache.insert(turn1, kv(len(turn1)))
    turn2 = [*turn1, *range(500, 500 + BLOCK)]
    cache.insert(turn2, kv(len(turn2)))
    assert len(cache.entries) == 1 and cache.tokens == len(turn2)  # turn1 was dropped
    other = [*system, 9, *range(900, 900 + BLOCK)]
    cache.insert(other, kv(len(other)))
    cache._drop(next(iter(cache.entries)))  # drop turn2: the system blocks stay reachable
    entry, n = cache.lookup([*system, 4, 4])
    assert entry is not None and entry.tokens == tuple(other) and n == len(system)


def test_end_call_evicts_least_recently_used_down_to_the_budget():
    cache = PrefixCache(max_tokens=3 * BLOCK)
    seqs = [[k * 1000 + i for i in range(2 * BLOCK)] for k in range(3)]
    for s in seqs:
        cache.insert(s, kv(len(s)))
    entry, n = cache.lookup([*seqs[0], 0])
    cache.use(entry, n)  # seqs[0] is now the most recently used
    cache.end_call()
    assert cache.tokens <= 3 * BLOCK
    assert cache.lookup([*seqs[0], 0])[1] == 2 * BLOCK
    assert cache.lookup([*seqs[1], 0]) == (None, 0)
    with pytest.raises(ValueError, match="max_tokens=-1"):
        PrefixCache(-1)


@pytest.fixture()
def history(tokenizer) -> list[int]:
    return tokenizer.encode("You are a tool-using agent. Tools: ls, cd, cat, grep, mkdir. " * 3)


def test_next_turn_prefills_only_new_tokens_and_matches_a_cold_sampler(
    tiny_model, tokenizer, history
):
    warm = HFSampler(tiny_model, tokenizer)
    first = warm.generate([history], GREEDY)[0]
    turn2 = [*history, *first.token_ids, *tokenizer.encode(" Result: ok. Next?")]
    before = warm.prefilled
    again = warm.generate([turn2], GREEDY)[0]
    new_tokens = len(turn2) - len(history) - len(first.token_ids) + 1  # +1: the last sampled
    assert warm.prefilled - before == new_tokens
    cold = HFSampler(tiny_model, tokenizer, prefix_reuse=False).generate([turn2], GREEDY)[0]
    assert again.token_ids == cold.token_ids
    assert max(abs(a - b) for a, b in zip(again.logprobs, cold.logprobs, strict=True)) < 1e-4


def test_a_batch_mixing_cached_and_fresh_prompts_matches_the_plain_path(
    tiny_model, tokenizer, history
):
    # fp32: with bf16 logits a bit of batch-dependent rounding upstream can move a logit by one
    # bf16 step (log-probs then differ in the third decimal), which would hide a real bug
    warm = HFSampler(tiny_model, tokenizer, batch_size=3, dtype="float32")
    warm.generate([history, history[:40]], GREEDY)
    prompts = [
        [*history, *tokenizer.encode(" then cd")],
        tokenizer.encode("Unrelated short prompt"),
        [*history[:40], *tokenizer.encode(" and grep")],
        [*history, *tokenizer.encode(" then cat the file")],
    ]
    got = warm.generate(prompts, GREEDY)
    plain = HFSampler(tiny_model, tokenizer, prefix_reuse=False, dtype="float32")
    plain = plain.generate(prompts, GREEDY)
    for a, b in zip(got, plain, strict=True):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
    assert warm.cache.hits > 0


def test_changing_weights_in_place_empties_the_cache(tiny_model, tokenizer, history):
    model = copy.deepcopy(tiny_model)
    sampler = HFSampler(model, tokenizer)
    sampler.generate([history], GREEDY)
    with torch.no_grad():
        model.lm_head.weight.mul_(1.5)  # what an optimizer step does: an in-place update
    before = sampler.prefilled
    stale_free = sampler.generate([[*history, 5, 6]], GREEDY)[0]
    assert sampler.prefilled - before == len(history) + 2  # nothing reused
    cold = HFSampler(model, tokenizer, prefix_reuse=False).generate([[*history, 5, 6]], GREEDY)
    assert stale_free.token_ids == cold[0].token_ids


def test_requests_joining_a_running_batch_decode_as_if_alone(tiny_model, tokenizer, history):
    sampler = HFSampler(tiny_model, tokenizer, batch_size=2)
    short = tokenizer.encode("Hi there")
    long = [*history, *tokenizer.encode(" and then some more words")]  # wider than the slab
    stops = sampler.stop_ids
    got = {}
    with sampler.session(GREEDY) as session:
        session.submit("short", short, 8, stops)
        session.submit("none", short, 0, stops)  # a zero cap finishes at once, empty
        for _ in range(3):
            got.update(session.step())
        session.submit("long", long, 8, stops)  # joins mid-decode: the slab grows left
        session.submit("queued", history[:30], 5, stops)  # waits for a free slot
        while session.busy:
            got.update(session.step())
    assert got["none"].token_ids == () and got["none"].finish_reason == "length"
    assert len(got["queued"].token_ids) <= 5
    for key, prompt, cap in [("short", short, 8), ("long", long, 8), ("queued", history[:30], 5)]:
        params = SamplingParams(max_new_tokens=cap, temperature=0.0)
        alone = HFSampler(tiny_model, tokenizer, prefix_reuse=False).generate([prompt], params)[0]
        assert got[key].token_ids == alone.token_ids, key
        diffs = [abs(a - b) for a, b in zip(got[key].logprobs, alone.logprobs, strict=True)]
        assert max(diffs) < 1e-4, key
    with pytest.raises(ValueError, match="empty prompt"), sampler.session(GREEDY) as session:
        session.submit("bad", [], 4, stops)


def test_a_continuation_is_stored_without_copying_its_prefix_and_joined_on_use():
    cache = PrefixCache(max_tokens=10_000)
    prompt = list(range(2 * BLOCK))
    cache.insert(prompt, kv(len(prompt)))
    parent, _ = cache.lookup([*prompt, -1])
    own = kv(5) + 1000  # positions 1000..1004: distinguishable from the parent's
    cache.insert([*prompt, 1, 2, 3, 4, 5], Continuation(parent, len(prompt), own))
    assert len(cache.entries) == 1  # the prompt's own entry was superseded, as for a tensor
    entry, n = cache.lookup([*prompt, 1, 2, 3, 4, 5, 9])
    assert n == len(prompt) + 5 and entry is not parent
    joined = entry.kv[0, 0, 0, :, 0].tolist()
    assert joined == [*map(float, range(len(prompt))), 1000.0, 1001.0, 1002.0, 1003.0, 1004.0]
    assert entry.kv is entry.kv  # joined once, then kept


def test_kv_memory_counts_each_storage_once_and_sessions_only_while_open(tiny_model, tokenizer):
    from envace_engine.samplers.embedded.kv import storage_bytes

    whole = kv(64)
    assert storage_bytes([whole, whole[..., :10, :], whole[..., 20:, :]]) == whole.nbytes
    cache = PrefixCache(max_tokens=1000)
    parent = list(range(2 * BLOCK))
    cache.insert(parent, kv(len(parent)))
    own = kv(BLOCK)
    entry, _ = cache.lookup([*parent, 0])
    assert entry is not None
    cache.insert([*parent, *range(BLOCK)], Continuation(entry, len(parent), own))
    assert storage_bytes(cache.tensors()) == kv(len(parent)).nbytes + own.nbytes

    sampler = HFSampler(tiny_model, tokenizer, batch_size=4)
    assert sampler.kv_memory().session_bytes == 0
    prompt = tokenizer("the warehouse holds twelve crates of apples")["input_ids"]
    with sampler.session(GREEDY) as session:
        session.submit(0, prompt, 4, frozenset())
        session.step()
        held = sampler.kv_memory()
        assert held.session_bytes == storage_bytes(session.tensors()) > 0
    after = sampler.kv_memory()
    assert after.session_bytes == 0 and after.cache_tokens == sampler.cache.tokens
    assert after.cache_bytes == storage_bytes(sampler.cache.tensors())


def test_a_call_bound_evicts_during_a_session_and_changes_no_output(tiny_model, tokenizer, history):
    """``call_cache_tokens`` holds the cache to its bound while a session runs (an evaluation
    is one long session); what it evicts is recomputed, so greedy outputs stay the same."""
    prompts = [[*history, *tokenizer.encode(f" turn {i} of the episode")] for i in range(6)]
    free = HFSampler(tiny_model, tokenizer, batch_size=2)
    bounded = HFSampler(tiny_model, tokenizer, batch_size=2, call_cache_tokens=len(history))
    held = []
    outs = {}
    for sampler in (free, bounded):
        got = {}
        with sampler.session(GREEDY) as session:
            for i, prompt in enumerate(prompts):
                session.submit(i, prompt, 6, sampler.stop_ids)
            while session.busy:
                got.update(session.step())
                held.append((sampler is bounded, sampler.cache.tokens))
        outs[sampler is bounded] = [got[i].token_ids for i in range(len(prompts))]
    assert outs[True] == outs[False]
    assert max(n for b, n in held if b) <= len(history)
    assert max(n for b, n in held if not b) > len(history)  # unbounded: kept until the end
    with pytest.raises(ValueError, match="call_cache_tokens=-1"):
        HFSampler(tiny_model, tokenizer, call_cache_tokens=-1)


def test_drop_cache_frees_the_kept_kv_and_the_next_call_recomputes_it(
    tiny_model, tokenizer, history
):
    """The trainer drops the cache before an optimizer step (``CacheHolding``): nothing is
    held afterwards, and the next call prefills everything and samples the same tokens."""
    from types import SimpleNamespace

    from envace_engine.samplers.base import CacheHolding
    from envace_engine.training.trainer import release_sampler_cache

    sampler = HFSampler(tiny_model, tokenizer)
    assert isinstance(sampler, CacheHolding)
    first = sampler.generate([history], GREEDY)[0]
    assert sampler.kv_memory().cache_tokens >= len(history)
    release_sampler_cache(SimpleNamespace(sampler=sampler, model=tiny_model))  # type: ignore[arg-type]
    assert sampler.kv_memory().cache_tokens == 0 and sampler.kv_memory().cache_bytes == 0
    before = sampler.prefilled
    again = sampler.generate([history], GREEDY)[0]
    assert sampler.prefilled - before == len(history)
    assert again.token_ids == first.token_ids


def test_a_sampler_without_a_cache_is_left_alone(tiny_model):
    from types import SimpleNamespace

    from envace_engine.training.trainer import release_sampler_cache

    class Remote:  # a server sampler: no in-process cache to drop
        def generate(self, prompts, params):
            raise AssertionError("not called")

    release_sampler_cache(SimpleNamespace(sampler=Remote(), model=tiny_model))  # type: ignore[arg-type]
