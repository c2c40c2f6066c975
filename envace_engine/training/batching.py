"""Training rows → padded tensors, optionally split into micro-batches by a token budget.

Layout of one row ``prompt_ids + completion_ids``, right-padded to the batch's longest row
(``p`` prompt, ``c`` completion, ``.`` padding)::

    input_ids        p p p c c c . .
    attention_mask   1 1 1 1 1 1 0 0
    completion_mask  0 0 0 1 1 1 0 0
    old_logprobs     0 0 0 a b c 0 0     (the sampler's log-probs, aligned with their tokens)

Every tensor is ``[B, L]`` and aligned with ``input_ids``, the same alignment that
``logprobs.completion_logprobs`` returns, so the loss combines them position by position. Right
padding keeps position ids equal to ``arange`` for every real token. Only the sampled completion
of an ``act`` or ``rehearse`` row is ever marked for training; a row's prompt (which may hold
earlier ``act`` tokens as context) never is.

With ``share_prefix`` the longest prompt prefix common to all rows (when at least
``MIN_SHARED_PREFIX`` tokens) becomes ``Batch.prefix_ids`` and the ``[B, L]`` tensors hold what
follows it: the model runs the prefix once for the whole batch (``completion_logprobs``'s
``prefix_ids``). Rows of a GRPO group share their whole first prompt; SFT rows of one world
share the system message with its tool schemas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from envace_engine.types import Role, TrainRow

if TYPE_CHECKING:
    import torch

TRAINED_ROLES: tuple[Role, ...] = (Role.ACT, Role.REHEARSE)  # role id = index in this tuple
MIN_SHARED_PREFIX = 32  # a shorter common prefix is not worth the extra forward


def role_id(role: Role) -> int:
    """The integer id a trained role gets in ``Batch.role_ids``."""
    if role not in TRAINED_ROLES:
        raise ValueError(f"role {role!r} is never trained: rows must be act or rehearse rows")
    return TRAINED_ROLES.index(role)


@dataclass(frozen=True)
class Batch:
    """Padded training tensors for ``B`` rows of length ``L`` (see module docstring)."""

    input_ids: torch.Tensor  # [B, L] long
    attention_mask: torch.Tensor  # [B, L] long
    completion_mask: torch.Tensor  # [B, L] float, 1 on trained tokens
    old_logprobs: torch.Tensor  # [B, L] float, 0 off the completion
    advantages: torch.Tensor  # [B] float
    role_ids: torch.Tensor  # [B] long, index into TRAINED_ROLES
    prefix_ids: (
        torch.Tensor
    )  # [P] long: tokens every row starts with, not in input_ids (P may be 0)

    @property
    def num_rows(self) -> int:
        """Rows in this batch."""
        return int(self.input_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        """Trained (completion) tokens in this batch."""
        return int(self.completion_mask.sum().item())


def shared_prefix_len(rows: Sequence[TrainRow]) -> int:
    """Longest prompt prefix common to all rows, leaving every row one prompt token of its own
    (the hidden state before a row's completion must be computed with that row)."""
    first = rows[0].prompt_ids
    limit = min(len(r.prompt_ids) for r in rows) - 1
    n = 0
    while n < limit and all(r.prompt_ids[n] == first[n] for r in rows):
        n += 1
    return n


def collate(
    rows: Sequence[TrainRow],
    advantages: Sequence[float],
    pad_id: int,
    share_prefix: bool = False,
) -> Batch:
    """Pad ``rows`` (with one advantage each) into a ``Batch``; ``share_prefix``: see module."""
    import torch

    if not rows:
        raise ValueError("cannot build a batch from zero rows")
    if len(rows) != len(advantages):
        raise ValueError(f"{len(rows)} rows but {len(advantages)} advantages")
    for index, (row, adv) in enumerate(zip(rows, advantages, strict=True)):
        _check_row(index, row, adv)
    shared = shared_prefix_len(rows) if share_prefix and len(rows) > 1 else 0
    if shared < MIN_SHARED_PREFIX:
        shared = 0
    length = max(len(r.prompt_ids) + len(r.completion_ids) for r in rows) - shared
    shape = (len(rows), length)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    attention_mask = torch.zeros(shape, dtype=torch.long)
    completion_mask = torch.zeros(shape, dtype=torch.float32)
    old_logprobs = torch.zeros(shape, dtype=torch.float32)
    for b, row in enumerate(rows):
        start = len(row.prompt_ids) - shared
        end = start + len(row.completion_ids)
        own = row.prompt_ids[shared:] + row.completion_ids
        input_ids[b, :end] = torch.tensor(own, dtype=torch.long)
        attention_mask[b, :end] = 1
        completion_mask[b, start:end] = 1.0
        old_logprobs[b, start:end] = torch.tensor(row.old_logprobs, dtype=torch.float32)
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        completion_mask=completion_mask,
        old_logprobs=old_logprobs,
        advantages=torch.tensor([float(a) for a in advantages], dtype=torch.float32),
        role_ids=torch.tensor([role_id(r.role) for r in rows], dtype=torch.long),
        prefix_ids=torch.tensor(rows[0].prompt_ids[:shared], dtype=torch.long),
    )


def micro_batches(
    rows: Sequence[TrainRow],
    advantages: Sequence[float],
    pad_id: int,
    token_budget: int,
    share_prefix: bool = False,
) -> list[Batch]:
    """Split rows into batches of at most ``token_budget`` padded tokens (rows x longest row).

    Rows are sorted by length (longest first) so that rows of similar length share a batch and
    little padding is wasted; a row longer than the budget gets a batch of its own. With
    ``share_prefix`` rows are sorted by their prompt tokens instead, so rows sharing a prompt
    prefix (a GRPO group's first prompt, a world's rehearse instructions) are neighbours, and a
    batch's cost counts its shared prefix once (``collate(share_prefix=True)``). Pass the totals
    over all micro-batches to ``loss.policy_loss`` (``total_rows``/``total_tokens``) so that the
    summed micro-batch losses equal the loss of one big batch.
    """
    if token_budget <= 0:
        raise ValueError(f"token_budget must be a positive number of tokens, got {token_budget}")
    if len(rows) != len(advantages):
        raise ValueError(f"{len(rows)} rows but {len(advantages)} advantages")
    groups = (
        _prefix_groups(rows, token_budget) if share_prefix else _length_groups(rows, token_budget)
    )
    return [
        collate([rows[i] for i in g], [advantages[i] for i in g], pad_id, share_prefix)
        for g in groups
    ]


def _length_groups(rows: Sequence[TrainRow], token_budget: int) -> list[list[int]]:
    order = sorted(range(len(rows)), key=lambda i: _row_len(rows[i]), reverse=True)
    groups: list[list[int]] = []
    for i in order:
        # sorted longest first: a group's first row is its longest, so its size is n x that length
        if groups and (len(groups[-1]) + 1) * _row_len(rows[groups[-1][0]]) <= token_budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _prefix_groups(rows: Sequence[TrainRow], token_budget: int) -> list[list[int]]:
    """Consecutive rows in prompt order; a row joins the current group when that costs less
    than computing it alone (joining can shorten the group's shared prefix, so every member's
    own part grows) and the group still fits ``token_budget`` (cost = prefix + n x longest rest)."""
    order = sorted(range(len(rows)), key=lambda i: rows[i].prompt_ids)
    groups: list[list[int]] = []
    cost = 0
    for i in order:
        if groups:
            joined = _prefix_cost([rows[j] for j in groups[-1]] + [rows[i]])
            if joined <= token_budget and joined - cost < _row_len(rows[i]):
                groups[-1].append(i)
                cost = joined
                continue
        groups.append([i])
        cost = _row_len(rows[i])
    return groups


def _prefix_cost(rows: Sequence[TrainRow]) -> int:
    shared = shared_prefix_len(rows) if len(rows) > 1 else 0
    if shared < MIN_SHARED_PREFIX:
        shared = 0
    return shared + len(rows) * (max(_row_len(r) for r in rows) - shared)


def _row_len(row: TrainRow) -> int:
    return len(row.prompt_ids) + len(row.completion_ids)


def _check_row(index: int, row: TrainRow, advantage: float | None) -> None:
    where = f"row {index} (episode {row.episode_id!r}, role {row.role})"
    if advantage is None:
        raise ValueError(
            f"{where} has no advantage (unscorable episode): drop it with advantages.scorable()"
        )
    if not row.prompt_ids:
        raise ValueError(f"{where} has an empty prompt: a completion needs context to be scored")
    if not row.completion_ids:
        raise ValueError(f"{where} has no completion tokens: it has nothing to train")
    if len(row.old_logprobs) != len(row.completion_ids):
        raise ValueError(
            f"{where} has {len(row.completion_ids)} completion tokens but "
            f"{len(row.old_logprobs)} old log-probs: they must come from the sampler together"
        )
