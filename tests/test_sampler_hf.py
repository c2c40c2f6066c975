"""HFSampler: batching, left padding, prefix reuse, log-prob convention, stops, seeds, weights."""

from __future__ import annotations

import math

import pytest
import torch

from envace_engine.models import ModelError, resolve
from envace_engine.samplers import make_sampler
from envace_engine.samplers.base import Generation, Sampler, SamplingParams
from envace_engine.samplers.embedded.packed import onednn_bf16
from envace_engine.samplers.embedded.sampler import HFSampler, shared_prefix_len
from envace_engine.samplers.embedded.sampling import sample_categorical, truncate_logits
from envace_engine.samplers.sglang import SGLangSampler

GREEDY = SamplingParams(max_new_tokens=10, temperature=0.0)


@pytest.fixture(scope="module")
def sampler(tiny_model, tokenizer) -> HFSampler:
    # fp32 GEMMs: these tests pin the exact token-in/token-out guarantee (bf16: tests below)
    return HFSampler(tiny_model, tokenizer, batch_size=8, dtype="float32")


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    texts = ["Hi", "The quick brown fox jumps over the lazy dog", "List the files, please."]
    return [tokenizer.encode(t) for t in texts]


def assert_same(a: Generation, b: Generation, tol: float = 1e-4) -> None:
    assert a.token_ids == b.token_ids
    assert a.finish_reason == b.finish_reason
    assert max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)), default=0) < tol


def teacher_forced(
    model, prompt: list[int], ids: tuple[int, ...], temperature: float
) -> list[float]:
    """log_softmax(logits / T) of a fresh full forward pass, gathered at the sampled ids."""
    full = torch.tensor([prompt + list(ids)])
    with torch.no_grad():
        logits = model(input_ids=full).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(1, torch.tensor(ids)[:, None]).squeeze(1).tolist()


def test_sampler_satisfies_protocol(sampler):
    assert isinstance(sampler, Sampler)


def test_batch_with_left_padding_equals_each_prompt_alone(sampler, prompts):
    assert len({len(p) for p in prompts}) == 3  # really different lengths: padding is exercised
    batch = sampler.generate(prompts, GREEDY)
    for prompt, gen in zip(prompts, batch, strict=True):
        assert_same(gen, sampler.generate([prompt], GREEDY)[0])
        assert len(gen.token_ids) == 10 and gen.finish_reason == "length"


def test_greedy_matches_transformers_generate(sampler, tiny_model, prompts):
    for prompt in prompts:
        ours = sampler.generate([prompt], GREEDY)[0]
        ref = tiny_model.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False)
        assert list(ours.token_ids) == ref[0, len(prompt) :].tolist()


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.3])
def test_logprobs_equal_teacher_forced_forward(sampler, tiny_model, prompts, temperature):
    """The token-in/token-out guarantee: returned log-probs = a trainer's recomputation."""
    params = SamplingParams(max_new_tokens=12, temperature=temperature, top_k=50, top_p=0.9, seed=3)
    for prompt, gen in zip(prompts, sampler.generate(prompts, params), strict=True):
        # greedy returns log_softmax(logits) (temperature 1), the SGLang convention
        expected = teacher_forced(tiny_model, prompt, gen.token_ids, temperature or 1.0)
        assert max(abs(a - b) for a, b in zip(gen.logprobs, expected, strict=True)) < 1e-4


def test_same_seed_same_samples_and_other_seed_differs(sampler, prompts):
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=11)
    first = sampler.generate(prompts, params)
    again = sampler.generate(prompts, params)
    other = sampler.generate(prompts, SamplingParams(max_new_tokens=8, temperature=1.0, seed=12))
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    assert [g.token_ids for g in first] != [g.token_ids for g in other]


def test_stop_token_ends_generation_and_is_included(sampler, prompts):
    free = sampler.generate(prompts, GREEDY)
    stop = free[1].token_ids[4]  # a token prompt 1 produces at step 5
    params = SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=(stop,))
    stopped = sampler.generate(prompts, params)
    for before, after in zip(free, stopped, strict=True):
        if stop in before.token_ids:
            cut = before.token_ids.index(stop) + 1
            assert after.token_ids == before.token_ids[:cut]
            assert after.finish_reason == "stop"
        else:  # a row that did not stop keeps decoding after its neighbour finished
            assert_same(after, before)
    assert stopped[1].token_ids[-1] == stop


def test_eos_is_a_stop_token(tiny_model, tokenizer, prompts):
    sampler = HFSampler(tiny_model, tokenizer)
    assert tokenizer.eos_token_id in sampler.eos_ids
    first = sampler.generate(prompts[:1], GREEDY)[0].token_ids[0]
    sampler.eos_ids = (first,)  # the decode loop reads eos_ids: make the first greedy token EOS
    gen = sampler.generate(prompts[:1], GREEDY)[0]
    assert gen.token_ids == (first,) and gen.finish_reason == "stop"


def test_text_drops_the_stop_token(sampler, tokenizer, prompts):
    gen = sampler.generate(prompts[:1], GREEDY)[0]
    params = SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=(gen.token_ids[2],))
    stopped = sampler.generate(prompts[:1], params)[0]
    assert stopped.text == tokenizer.decode(stopped.token_ids[:-1], skip_special_tokens=True)


def test_prefix_reuse_equals_plain_path_and_prefills_prefix_once(tiny_model, tokenizer):
    shared = tokenizer.encode("You are a careful assistant. Tools: search, book, cancel. " * 2)
    prompts = [
        shared + tokenizer.encode(s) for s in ["Book it", "Cancel my order now", "Hi", "Search"]
    ]
    prompts.append(list(shared))  # a prompt that IS the prefix keeps one token for the suffix pass
    assert shared_prefix_len(prompts) == len(shared) - 1
    shapes: list[tuple[int, ...]] = []
    hook = tiny_model.register_forward_pre_hook(
        lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    try:
        # the model's own decode forward, so that the hook sees the decode batches too
        reused = HFSampler(tiny_model, tokenizer, prefix_reuse=True, compact_decode=False)
        reused = reused.generate(prompts, GREEDY)
    finally:
        hook.remove()
    plain = HFSampler(tiny_model, tokenizer, prefix_reuse=False, compact_decode=False)
    plain = plain.generate(prompts, GREEDY)
    assert shapes[0] == (1, len(shared) - 1)  # the prefix, once, at batch size 1
    prefills = [n for _, n in shapes[1:] if n > 1]
    assert prefills and max(prefills) <= 5  # then only each prompt's own few tokens
    assert max(b for b, n in shapes if n == 1) == len(prompts)  # all rows decode together
    for a, b in zip(reused, plain, strict=True):
        assert_same(a, b)


def test_chunking_and_reordering_keep_prompt_order(tiny_model, tokenizer, prompts):
    many = [*prompts, prompts[0] + [42], prompts[2][:3]]
    small = HFSampler(tiny_model, tokenizer, batch_size=2).generate(many, GREEDY)
    whole = HFSampler(tiny_model, tokenizer, batch_size=64).generate(many, GREEDY)
    for a, b in zip(small, whole, strict=True):
        assert_same(a, b)


def test_shared_prefix_len_by_hand():
    assert shared_prefix_len([[1, 2, 3, 4], [1, 2, 3, 9], [1, 2, 7]]) == 2
    assert shared_prefix_len([[1, 2, 3], [1, 2, 3]]) == 2  # capped: one own token each
    assert shared_prefix_len([[5], [5, 6]]) == 0


def test_truncate_logits_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    # top-p 0.75: mass before token 3 is 0.8 >= 0.75 -> keep tokens 0 and 1 only
    kept = torch.isfinite(truncate_logits(logits, -1, 0.75))
    assert kept.tolist() == [[True, True, False, False]]
    kept = torch.isfinite(truncate_logits(logits, 3, 1.0))
    assert kept.tolist() == [[True, True, True, False]]
    kept = torch.isfinite(truncate_logits(logits, 3, 0.4))  # top token always kept
    assert kept.tolist() == [[True, False, False, False]]


def test_top_k_1_samples_greedy_tokens_with_temperature_logprobs(sampler, tiny_model, prompts):
    greedy = sampler.generate(prompts[:1], GREEDY)[0]
    params = SamplingParams(max_new_tokens=10, temperature=0.5, top_k=1, seed=0)
    top1 = sampler.generate(prompts[:1], params)[0]
    assert top1.token_ids == greedy.token_ids
    expected = teacher_forced(tiny_model, prompts[0], top1.token_ids, 0.5)
    assert max(abs(a - b) for a, b in zip(top1.logprobs, expected, strict=True)) < 1e-4
    assert all(lp < 0 for lp in top1.logprobs)  # untruncated distribution: not log(1) = 0


def test_weights_are_shared_with_the_model_object(tiny_path, tokenizer, prompts):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    sampler = HFSampler(model, tokenizer)
    before = sampler.generate(prompts, GREEDY)
    model.train()  # as a trainer leaves it: sampling still runs in eval mode and restores it
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(-3.0)  # an in-place "optimizer step"
    after = sampler.generate(prompts, GREEDY)
    assert model.training
    assert [g.token_ids for g in before] != [g.token_ids for g in after]
    model.eval()
    assert_same(after[0], HFSampler(model, tokenizer).generate(prompts[:1], GREEDY)[0])


def test_zero_new_tokens_and_bad_input(sampler, prompts):
    gen = sampler.generate(prompts[:1], SamplingParams(max_new_tokens=0))[0]
    assert gen.token_ids == () and gen.finish_reason == "length"
    assert sampler.generate([], GREEDY) == []
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        sampler.generate([[1], []], GREEDY)
    with pytest.raises(ValueError, match="temperature"):
        sampler.generate(prompts, SamplingParams(temperature=-1.0))
    with pytest.raises(ValueError, match="top_p"):
        sampler.generate(prompts, SamplingParams(top_p=0.0))
    with pytest.raises(ValueError, match="temperature"):
        sampler.generate(prompts, SamplingParams(temperature=math.nan))


def test_make_sampler_builds_each_kind(tiny_model, tokenizer):
    hf = make_sampler(resolve("tiny"), model=tiny_model, tokenizer=tokenizer, batch_size=4)
    assert isinstance(hf, HFSampler) and hf.model is tiny_model and hf.batch_size == 4
    remote = make_sampler(resolve("sglang+http://127.0.0.1:1,127.0.0.1:2"))
    assert isinstance(remote, SGLangSampler)
    assert remote.urls == ("http://127.0.0.1:1", "http://127.0.0.1:2")
    remote.close()
    fp32 = make_sampler(resolve("tiny"), model=tiny_model, tokenizer=tokenizer, dtype="float32")
    assert fp32.compute_dtype == "float32"
    with pytest.raises(ModelError, match="started with"):  # a server's dtype is its own
        make_sampler(resolve("sglang+http://127.0.0.1:1"), dtype="float32")


@pytest.mark.slow
def test_smollm2_batch_equals_alone_and_logprobs_teacher_forced(tokenizer):
    from envace_engine.models import load_model

    model = load_model(resolve("smollm2-135m"))
    sampler = HFSampler(model, tokenizer, dtype="float32")  # the exact fp32 guarantee
    chats = [[{"role": "user", "content": q}] for q in ["What is 2+2?", "Name a colour."]]
    prompts = [
        tokenizer.apply_chat_template(c, add_generation_prompt=True)["input_ids"] for c in chats
    ]
    params = SamplingParams(max_new_tokens=16, temperature=0.0)
    batch = sampler.generate(prompts, params)
    for prompt, gen in zip(prompts, batch, strict=True):
        assert_same(gen, sampler.generate([prompt], params)[0])
        expected = teacher_forced(model, prompt, gen.token_ids, 1.0)
        assert max(abs(a - b) for a, b in zip(gen.logprobs, expected, strict=True)) < 1e-4


def test_inverse_cdf_sampling_follows_the_probabilities_and_never_draws_a_zero():
    probs = torch.tensor([[0.1, 0.0, 0.2, 0.7]]).expand(200_000, 4).contiguous()
    draws = sample_categorical(probs, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=4).double() / len(draws)
    assert freq[1] == 0
    assert torch.allclose(freq, probs[0].double(), atol=0.005)
    again = sample_categorical(probs[:5], torch.Generator().manual_seed(0))
    assert torch.equal(again, draws[:5])  # seeded: reproducible


def test_two_level_inverse_cdf_picks_the_token_a_flat_float64_cdf_picks():
    # The block search must land exactly where one float64 cumulative sum over the whole row
    # puts each draw, for a vocabulary that is not a whole number of blocks.
    gen = torch.Generator().manual_seed(1)
    probs = torch.rand(4000, 1000, generator=gen) ** 8  # peaked rows, mass spread over blocks
    probs[:, 300:700] = 0  # whole blocks with no mass
    probs /= probs.sum(dim=1, keepdim=True)
    got = sample_categorical(probs, torch.Generator().manual_seed(7))
    draw = torch.rand((4000, 1), generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    cdf = probs.double().cumsum(dim=1)
    want = torch.searchsorted(cdf, draw * cdf[:, -1:], right=True).squeeze(1)
    assert torch.equal(got, want)


@pytest.mark.skipif(
    not onednn_bf16(), reason="this CPU cannot run oneDNN's bf16 linear (an AVX2-only CPU)"
)
def test_bf16_samples_the_fp32_distribution_within_tolerance(tiny_model, tokenizer, prompts):
    """bf16 GEMMs (packed oneDNN; the LM head, norms and attention stay fp32): greedy tokens
    equal fp32's and every log-prob is within 0.05 nats of a fp32 teacher-forced forward."""
    bf16 = HFSampler(tiny_model, tokenizer, batch_size=8, dtype="bfloat16")
    fp32 = HFSampler(tiny_model, tokenizer, batch_size=8, dtype="float32")
    assert bf16.compute_dtype == "bfloat16" and fp32.compute_dtype == "float32"
    ours, ref = bf16.generate(prompts, GREEDY), fp32.generate(prompts, GREEDY)
    assert [g.token_ids for g in ours] == [g.token_ids for g in ref]
    params = SamplingParams(max_new_tokens=12, temperature=0.7, seed=3)
    for prompt, gen in zip(prompts, bf16.generate(prompts, params), strict=True):
        expected = teacher_forced(tiny_model, prompt, gen.token_ids, 0.7)
        assert max(abs(a - b) for a, b in zip(gen.logprobs, expected, strict=True)) < 0.05


def test_auto_dtype_takes_bf16_only_with_a_native_unit(tiny_model, tokenizer, monkeypatch):
    from envace_engine.samplers.embedded import sampler as module

    monkeypatch.setattr(module, "cpu_bf16", lambda: None)  # e.g. a CPU without AVX512-BF16
    assert HFSampler(tiny_model, tokenizer, dtype="auto").compute_dtype == "float32"
    monkeypatch.setattr(module, "cpu_bf16", lambda: "amx_bf16")
    monkeypatch.setattr(module, "onednn_bf16", lambda: True)
    assert HFSampler(tiny_model, tokenizer, dtype="auto").compute_dtype == "bfloat16"
    off = HFSampler(tiny_model, tokenizer, dtype="auto", packed_weights=False)
    assert off.compute_dtype == "float32"  # bf16 runs only on the packed path
    with pytest.raises(ValueError, match="sampler dtype 'fp16'"):
        HFSampler(tiny_model, tokenizer, dtype="fp16")
    with pytest.raises(ValueError, match="needs the packed oneDNN path"):
        HFSampler(tiny_model, tokenizer, dtype="bfloat16", packed_weights=False)
    monkeypatch.setattr(module, "onednn_bf16", lambda: False)  # an AVX2-only CPU
    with pytest.raises(ValueError, match="lacks what oneDNN's bf16 linear needs"):
        HFSampler(tiny_model, tokenizer, dtype="bfloat16")
    monkeypatch.setattr(module, "cpu_bf16", lambda: None)
    assert HFSampler(tiny_model, tokenizer, dtype="auto").compute_dtype == "float32"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compact_decode_step_equals_the_models_own_forward(tiny_model, tokenizer, prompts, dtype):
    """``llama_step``: fp32 decodes as transformers' forward does (rounding aside); bf16 as the
    trainer's autocast computes, within the tolerance the bf16 path keeps against fp32."""
    if dtype == "bfloat16" and not onednn_bf16():
        pytest.skip("this CPU cannot run oneDNN's bf16 linear (an AVX2-only CPU)")
    compact = HFSampler(tiny_model, tokenizer, batch_size=8, dtype=dtype)
    plain = HFSampler(tiny_model, tokenizer, batch_size=8, dtype=dtype, compact_decode=False)
    assert compact.compact is not None and plain.compact is None
    tol = 1e-4 if dtype == "float32" else 0.05
    ours, ref = compact.generate(prompts, GREEDY), plain.generate(prompts, GREEDY)
    for a, b in zip(ours, ref, strict=True):
        assert_same(a, b, tol=tol)
    params = SamplingParams(max_new_tokens=12, temperature=0.7, seed=5)
    for prompt, gen in zip(prompts, compact.generate(prompts, params), strict=True):
        expected = teacher_forced(tiny_model, prompt, gen.token_ids, 0.7)
        assert max(abs(a - b) for a, b in zip(gen.logprobs, expected, strict=True)) < tol


def test_compact_decode_step_is_skipped_where_it_does_not_apply(tiny_model, tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    from envace_engine.samplers.embedded.llama_step import LlamaDecodeStep, unsupported

    unpacked = HFSampler(tiny_model, tokenizer, dtype="float32", packed_weights=False)
    assert unpacked.compact is None
    assert "packed oneDNN path is off" in (unsupported(tiny_model, unpacked.packed) or "")
    config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=tokenizer.vocab_size)
    torch.manual_seed(0)  # a fixed random model: its greedy decode never hits EOS
    gpt2 = GPT2LMHeadModel(config).eval()
    sampler = HFSampler(gpt2, tokenizer, dtype="float32")
    assert sampler.compact is None  # decodes through the model's own forward
    assert len(sampler.generate([[1, 2, 3]], GREEDY)[0].token_ids) == GREEDY.max_new_tokens
    with pytest.raises(ValueError, match="GPT2LMHeadModel is not a LlamaForCausalLM"):
        LlamaDecodeStep(gpt2, sampler.packed)  # type: ignore[arg-type]
