"""Training rows → padded tensors: layouts drawn with small integer tokens.

Rows (prompt | completion), pad id 0::

    row 0  act       5 6 7 | 8 9        old log-probs -0.1 -0.2
    row 1  rehearse  5     | 3 4 2      old log-probs -1.0 -2.0 -3.0
    row 2  act       5 6   | 1          old log-probs -0.5

    input_ids        completion_mask   old_logprobs
    5 6 7 8 9        0 0 0 1 1         0 0 0 -.1 -.2
    5 3 4 2 0        0 1 1 1 0         0 -1 -2 -3 0
    5 6 1 0 0        0 0 1 0 0         0 0 -.5 0 0
"""

from __future__ import annotations

import pytest
import torch

from envace_engine.training.batching import TRAINED_ROLES, collate, micro_batches, role_id
from envace_engine.types import Role, TrainRow

ROWS = [
    TrainRow("e1", "g", Role.ACT, (5, 6, 7), (8, 9), (-0.1, -0.2), 1.0),
    TrainRow("e1", "g", Role.REHEARSE, (5,), (3, 4, 2), (-1.0, -2.0, -3.0), 1.0),
    TrainRow("e2", "g", Role.ACT, (5, 6), (1,), (-0.5,), 0.0),
]
ADV = [0.5, 0.25, -0.5]


def test_collate_layout():
    batch = collate(ROWS, ADV, pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 3, 4, 2, 0], [5, 6, 1, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]
    assert batch.completion_mask.tolist() == [[0, 0, 0, 1, 1], [0, 1, 1, 1, 0], [0, 0, 1, 0, 0]]
    expected_old = [[0, 0, 0, -0.1, -0.2], [0, -1, -2, -3, 0], [0, 0, -0.5, 0, 0]]
    torch.testing.assert_close(batch.old_logprobs, torch.tensor(expected_old))
    assert batch.advantages.tolist() == ADV
    assert batch.role_ids.tolist() == [0, 1, 0]
    assert (batch.num_rows, batch.num_tokens) == (3, 6)


def test_micro_batches_respect_the_token_budget_and_keep_every_row():
    batches = micro_batches(ROWS, ADV, pad_id=0, token_budget=8)
    # longest first: row 0 (5 tokens) alone (2 x 5 > 8), then rows 1 and 2 (2 x 4 = 8)
    assert [b.input_ids.shape for b in batches] == [(1, 5), (2, 4)]
    assert all(b.input_ids.numel() <= 8 for b in batches)
    assert sum(b.num_tokens for b in batches) == 6
    assert sorted(a for b in batches for a in b.advantages.tolist()) == sorted(ADV)
    assert len(micro_batches(ROWS, ADV, pad_id=0, token_budget=2)) == 3  # oversize rows go alone
    assert len(micro_batches(ROWS, ADV, pad_id=0, token_budget=100)) == 1


def test_role_ids():
    assert [role_id(r) for r in TRAINED_ROLES] == [0, 1]
    with pytest.raises(ValueError, match="never trained"):
        role_id(Role.REAL)


def test_bad_rows_are_named():
    with pytest.raises(ValueError, match="unscorable"):
        collate(ROWS, [0.5, None, 0.1], pad_id=0)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="old log-probs"):
        collate([TrainRow("e", "g", Role.ACT, (1,), (2, 3), (-1.0,), 1.0)], [0.0], pad_id=0)
    with pytest.raises(ValueError, match="empty prompt"):
        collate([TrainRow("e", "g", Role.ACT, (), (2,), (-1.0,), 1.0)], [0.0], pad_id=0)
    with pytest.raises(ValueError, match="no completion"):
        collate([TrainRow("e", "g", Role.ACT, (1,), (), (), 1.0)], [0.0], pad_id=0)
    with pytest.raises(ValueError, match="zero rows"):
        collate([], [], pad_id=0)
