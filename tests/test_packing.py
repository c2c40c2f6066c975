"""Packing an episode's nested act rows into one sequence (``batching.Unit``): layouts drawn
with small integer tokens, then the GRPO loss and every gradient against separate rows.

Episode e1 (pad id 0): reply 1 ``8 9`` after prompt ``5 6 7``, then tool ``4``, reply 2 ``3``::

    row 0  act  5 6 7       | 8 9     old log-probs -0.1 -0.2
    row 1  act  5 6 7 8 9 4 | 3       old log-probs -0.3

    packed:  input_ids 5 6 7 8 9 4 3   completion_mask 0 0 0 1 1 0 1
"""

from __future__ import annotations

from dataclasses import replace

import torch

from envace_engine.training.batching import collate, micro_batches, units
from envace_engine.training.loss import LossInputs, policy_loss
from envace_engine.types import Role, TrainRow

NESTED = [
    TrainRow("e1", "g", Role.ACT, (5, 6, 7), (8, 9), (-0.1, -0.2), 1.0),
    TrainRow("e1", "g", Role.ACT, (5, 6, 7, 8, 9, 4), (3,), (-0.3,), 1.0),
]


def test_nested_rows_of_one_episode_role_and_advantage_pack_into_one_unit():
    (unit,) = units(NESTED, [0.5, 0.5], pack=True)
    assert unit.ids == (5, 6, 7, 8, 9, 4, 3) and unit.spans == ((3, 5), (6, 7))
    assert unit.rows == (0, 1) and unit.head == 3
    assert len(units(NESTED, [0.5, 0.5], pack=False)) == 2
    assert len(units(NESTED, [0.5, -0.5], pack=True)) == 2  # advantages differ: never mixed
    other = replace(NESTED[1], episode_id="e2")
    assert len(units([NESTED[0], other], [0.5, 0.5], pack=True)) == 2  # another episode
    bent = TrainRow("e1", "g", Role.ACT, (5, 6, 7, 8, 1, 4), (3,), (-0.3,), 1.0)
    assert len(units([NESTED[0], bent], [0.5, 0.5], pack=True)) == 2  # not a prefix


def test_packed_batch_layout_and_its_per_row_view():
    batch = collate(NESTED, [0.5, 0.5], pad_id=0, pack=True)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9, 4, 3]]
    assert batch.completion_mask.tolist() == [[0, 0, 0, 1, 1, 0, 1]]
    assert batch.num_rows == 2 and batch.num_tokens == 3
    assert batch.rows_view(batch.old_logprobs).tolist() == [
        [-0.10000000149011612, -0.20000000298023224],
        [-0.30000001192092896, 0.0],
    ]
    assert batch.row_mask.tolist() == [[1.0, 1.0], [1.0, 0.0]]
    assert batch.advantages.tolist() == [0.5, 0.5] and batch.role_ids.tolist() == [0, 0]
    plain = collate(NESTED, [0.5, 0.5], pad_id=0)
    assert plain.input_ids.shape == (2, 7)
    assert torch.equal(plain.rows_view(plain.old_logprobs), batch.rows_view(batch.old_logprobs))


def _episode_rows(vocab: int, g: torch.Generator) -> tuple[list[TrainRow], list[float]]:
    """Two groups' episodes with 1-3 replies each, sharing a 40-token head, plus a rehearse row."""
    head = torch.randint(0, vocab, (40,), generator=g).tolist()
    rows, advantages = [], []
    for e, (replies, adv) in enumerate(((3, 0.5), (1, -1.0), (2, 0.25))):
        context = head + torch.randint(0, vocab, (3 + e,), generator=g).tolist()
        for _ in range(replies):
            reply = torch.randint(0, vocab, (4,), generator=g).tolist()
            logps = tuple(-0.1 * (k + 1) for k in range(4))
            rows.append(TrainRow(f"e{e}", "g", Role.ACT, tuple(context), tuple(reply), logps, 1.0))
            advantages.append(adv)
            context = context + reply + torch.randint(0, vocab, (5,), generator=g).tolist()
    world = tuple(torch.randint(0, vocab, (30,), generator=g).tolist())
    rows.append(TrainRow("e0", "g", Role.REHEARSE, world, (7, 8, 9), (-0.5,) * 3, 1.0))
    advantages.append(0.75)
    return rows, advantages


def test_packed_loss_and_gradients_equal_separate_rows(tiny_model):
    from envace_engine.logprobs import completion_logprobs

    rows, advantages = _episode_rows(tiny_model.config.vocab_size, torch.Generator().manual_seed(5))
    n_tokens = sum(len(r.completion_ids) for r in rows)

    def run(pack: bool, share: bool, budget: int):
        tiny_model.zero_grad(set_to_none=True)
        batches = micro_batches(rows, advantages, 0, budget, share, pack)
        total, per_role = 0.0, {}
        for batch in batches:
            lp = completion_logprobs(
                tiny_model,
                batch.input_ids,
                batch.attention_mask,
                batch.completion_mask,
                prefix_ids=batch.prefix_ids,
            )
            out = policy_loss(
                LossInputs.from_batch(batch, lp), total_rows=len(rows), total_tokens=n_tokens
            )
            out.loss.backward()
            total += float(out.loss.detach())
            for role, m in out.roles.items():
                per_role[role] = per_role.get(role, (0, 0))
                per_role[role] = (per_role[role][0] + m.rows, per_role[role][1] + m.tokens)
        grads = {n: p.grad.clone() for n, p in tiny_model.named_parameters() if p.grad is not None}
        return total, per_role, grads, sum(b.input_ids.shape[0] for b in batches)

    loss, roles, grads, sequences = run(pack=False, share=False, budget=10_000)
    assert sequences == len(rows) == 7 and roles == {"act": (6, 24), "rehearse": (1, 3)}
    for pack, share, budget in ((True, False, 10_000), (True, True, 10_000), (True, True, 120)):
        got, got_roles, got_grads, got_sequences = run(pack, share, budget)
        assert got_sequences == 4  # three episodes' act rows, and the rehearse row
        assert got_roles == roles  # per-row metrics count rows, not sequences
        torch.testing.assert_close(got, loss, atol=1e-6, rtol=1e-5)
        for name, grad in grads.items():
            torch.testing.assert_close(got_grads[name], grad, atol=1e-6, rtol=1e-4, msg=name)


def test_the_per_row_view_gives_the_loss_of_the_aligned_layout(tiny_model):
    """Unpacked, ``LossInputs.from_batch``'s [R, C] view and the [B, L] layout aligned with
    ``input_ids`` give one loss (the view only drops the positions no row trains)."""
    from envace_engine.logprobs import completion_logprobs

    rows, advantages = _episode_rows(tiny_model.config.vocab_size, torch.Generator().manual_seed(6))
    batch = collate(rows, advantages, pad_id=0)
    with torch.no_grad():
        lp = completion_logprobs(
            tiny_model, batch.input_ids, batch.attention_mask, batch.completion_mask
        )
    aligned = LossInputs(
        lp, batch.old_logprobs, batch.advantages, batch.completion_mask, batch.role_ids
    )
    viewed = LossInputs.from_batch(batch, lp)
    assert viewed.logprobs.shape == (len(rows), 4)
    torch.testing.assert_close(policy_loss(viewed).loss, policy_loss(aligned).loss)
