"""Chunked completion log-probs equal a naive full-logits computation, values and gradients."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from envace_engine.logprobs import ChunkedHeadLogProb, completion_logprobs


def _batch(vocab: int, rows: int = 3, length: int = 12):
    """Right-padded rows; row 1 has 3 pads, row 2 has 6; completions of 7, 5 and 3 tokens."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, length), generator=g)
    att = torch.ones(rows, length, dtype=torch.long)
    att[1, 9:] = 0
    att[2, 6:] = 0
    cmask = torch.zeros(rows, length)
    cmask[0, 5:] = 1
    cmask[1, 4:9] = 1
    cmask[2, 3:6] = 1
    return ids, att, cmask


def _naive(model, ids, att, cmask, temperature):
    logits = model(input_ids=ids, attention_mask=att).logits[:, :-1] / temperature
    picked = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(picked * cmask[:, 1:], (1, 0))


def _value_and_grads(fn, model, weights):
    model.zero_grad(set_to_none=True)
    out = fn()
    (out * weights).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize(("temperature", "chunk_size"), [(1.0, 256), (0.7, 2), (1.3, 5)])
def test_matches_naive_values_and_gradients(tiny_model, temperature, chunk_size):
    ids, att, cmask = _batch(tiny_model.config.vocab_size)
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))
    ours, our_grads = _value_and_grads(
        lambda: completion_logprobs(tiny_model, ids, att, cmask, temperature, chunk_size),
        tiny_model,
        weights,
    )
    ref, ref_grads = _value_and_grads(
        lambda: _naive(tiny_model, ids, att, cmask, temperature), tiny_model, weights
    )
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)
    assert (ours[cmask == 0] == 0).all() and (ours[cmask == 1] < 0).all()
    for name, grad in ref_grads.items():
        # fp32 summation order differs (chunked accumulation): 1e-5 relative to the largest entry
        scale = max(1.0, grad.abs().max().item())
        torch.testing.assert_close(our_grads[name], grad, atol=1e-5 * scale, rtol=1e-5, msg=name)
    tiny_model.zero_grad(set_to_none=True)


def test_head_gradcheck_float64_with_bias():
    """The hand-written backward is exact: finite differences in float64, bias included."""
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(7, 4, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(11, 4, dtype=torch.float64, generator=g, requires_grad=True)
    bias = torch.randn(11, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.tensor([0, 10, 3, 3, 5, 7, 1])

    def fn(h, w, b):
        return ChunkedHeadLogProb.apply(h, w, b, targets, 1 / 0.7, 3)

    assert torch.autograd.gradcheck(fn, (hidden, weight, bias))
    expected = torch.log_softmax((hidden @ weight.T + bias) / 0.7, -1)[torch.arange(7), targets]
    torch.testing.assert_close(fn(hidden, weight, bias), expected, atol=1e-12, rtol=0)


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor any op produces (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_never_materialises_batch_time_vocab_logits(tiny_model):
    vocab, hidden = tiny_model.config.vocab_size, tiny_model.config.hidden_size
    ids, att, cmask = _batch(vocab, rows=4, length=40)
    cmask[3, 20:] = 1
    chunk = 4
    with _LargestTensor() as seen:
        completion_logprobs(tiny_model, ids, att, cmask, chunk_size=chunk).sum().backward()
    tiny_model.zero_grad(set_to_none=True)
    # The embedding matrix (V x H) and one [chunk, V] tile are the biggest things allowed.
    assert seen.largest <= max(vocab * hidden, chunk * vocab)
    assert seen.largest < ids.numel() * vocab // 2


def test_bf16_autocast_is_close_to_fp32(tiny_model):
    ids, att, cmask = _batch(tiny_model.config.vocab_size)
    with torch.no_grad():
        fp32 = completion_logprobs(tiny_model, ids, att, cmask)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = completion_logprobs(tiny_model, ids, att, cmask)
    assert bf16.dtype == torch.float32
    torch.testing.assert_close(bf16, fp32, atol=0.1, rtol=0.02)


def test_bf16_head_gradients_are_those_of_its_bf16_forward():
    """Under bf16 autocast the head's values and gradients are those of the function its
    forward computes (bf16 hidden and weight, a bf16 product, fp32 softmax), the weight
    gradient accumulated in fp32 over chunks; the reference is that math in fp64."""
    g = torch.Generator().manual_seed(0)
    n, width, vocab, inv_t = 11, 16, 40, 1.0 / 0.7
    hidden = torch.randn(n, width, generator=g, requires_grad=True)
    weight = torch.randn(vocab, width, generator=g, requires_grad=True)
    targets = torch.randint(0, vocab, (n,), generator=g)
    upstream = torch.randn(n, generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ChunkedHeadLogProb.apply(hidden, weight, None, targets, inv_t, 4)
    (out * upstream).sum().backward()
    hb, wb = hidden.detach().bfloat16(), weight.detach().bfloat16()
    logits = (hb @ wb.t()).double() * inv_t  # the forward's product, rounded to bf16
    ref = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
    onehot = torch.nn.functional.one_hot(targets, vocab).double()
    dlogits = upstream.double()[:, None] * (onehot - torch.softmax(logits, -1)) * inv_t
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    assert weight.grad is not None and weight.grad.dtype == torch.float32
    expected = dlogits.t() @ hb.double()
    torch.testing.assert_close(weight.grad.double(), expected, atol=1e-5, rtol=1e-4)
    # the hidden gradient's product runs in bf16 (the tile is cast to the weight's dtype)
    assert hidden.grad is not None
    torch.testing.assert_close(hidden.grad.double(), dlogits @ wb.double(), atol=2e-2, rtol=2e-2)


def test_all_masked_batch_gives_zeros_and_a_finite_gradient(tiny_model):
    ids, att, _ = _batch(tiny_model.config.vocab_size)
    out = completion_logprobs(tiny_model, ids, att, torch.zeros(ids.shape))
    assert out.shape == ids.shape and (out == 0).all()
    out.sum().backward()  # connected to the graph: an empty micro-batch does not crash backward
    tiny_model.zero_grad(set_to_none=True)


def test_clear_errors_for_bad_masks(tiny_model):
    ids, att, cmask = _batch(tiny_model.config.vocab_size)
    first = cmask.clone()
    first[0, 0] = 1
    with pytest.raises(ValueError, match="position 0"):
        completion_logprobs(tiny_model, ids, att, first)
    with pytest.raises(ValueError, match="padding"):
        padded = cmask.clone()
        padded[2, 10] = 1
        completion_logprobs(tiny_model, ids, att, padded)
    with pytest.raises(ValueError, match="shape"):
        completion_logprobs(tiny_model, ids, att, cmask[:, :-1])
    with pytest.raises(ValueError, match="temperature"):
        completion_logprobs(tiny_model, ids, att, cmask, temperature=0.0)


def test_shared_prefix_gives_the_full_rows_values_and_gradients(tiny_model):
    """Rows sharing a 40-token prompt prefix: ``collate(share_prefix=True)`` runs the prefix
    once; every completion log-prob and every parameter gradient equals the full rows'."""
    from envace_engine.training.batching import collate
    from envace_engine.types import Role, TrainRow

    g = torch.Generator().manual_seed(3)
    vocab = tiny_model.config.vocab_size
    head = torch.randint(0, vocab, (40,), generator=g).tolist()
    rows = []
    for own, done in ((3, 4), (6, 2), (1, 5)):  # own prompt tokens, completion tokens
        tail = torch.randint(0, vocab, (own + done,), generator=g).tolist()
        rows.append(
            TrainRow(
                "e", "g", Role.ACT, tuple(head + tail[:own]), tuple(tail[own:]), (0.0,) * done, 1.0
            )
        )
    full = collate(rows, [1.0] * 3, pad_id=0)
    shared = collate(rows, [1.0] * 3, pad_id=0, share_prefix=True)
    assert full.prefix_ids.numel() == 0 and shared.prefix_ids.tolist() == head

    def run(batch):
        tiny_model.zero_grad(set_to_none=True)
        lp = completion_logprobs(
            tiny_model,
            batch.input_ids,
            batch.attention_mask,
            batch.completion_mask,
            prefix_ids=batch.prefix_ids,
        )
        picked = lp[batch.completion_mask.bool()]
        (picked * torch.arange(1, picked.numel() + 1)).sum().backward()
        return picked.detach(), {n: p.grad.clone() for n, p in tiny_model.named_parameters()}

    (a, ga), (b, gb) = run(full), run(shared)
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    for name in ga:
        torch.testing.assert_close(gb[name], ga[name], atol=1e-5, rtol=1e-4, msg=name)
