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

With ``pack`` the rows of one episode that nest — act row k's prompt is everything before reply
k, so it starts with row k−1's prompt and completion — are one sequence (``Unit``) with several
completion spans: a GRPO step's act rows then cost one episode's tokens instead of the sum of
their prompts. The loss reads per-row ``[R, C]`` tensors (``Batch.rows_view``: row r's
completion tokens, in order), so its per-row normalisation and metrics are those of separate
rows whatever the packing.
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
    advantages: torch.Tensor  # [R] float, per row
    role_ids: torch.Tensor  # [R] long, per row: index into TRAINED_ROLES
    prefix_ids: (
        torch.Tensor
    )  # [P] long: tokens every row starts with, not in input_ids (P may be 0)
    positions: torch.Tensor  # [R, C] long: flat index into [B * L] of row r's c-th completion
    # token (-1 past its end); R rows, C their longest completion (``rows_view``)

    def rows_view(self, values: torch.Tensor) -> torch.Tensor:
        """``[B, L]`` values (log-probs, aligned with ``input_ids``) as ``[R, C]``: row r's
        completion tokens in order, 0 past its end. With ``pack`` B < R."""
        flat = values.reshape(-1)[self.positions.clamp(min=0)]
        return flat * (self.positions >= 0).to(flat.dtype)

    @property
    def row_mask(self) -> torch.Tensor:
        """``[R, C]`` float: 1 on each row's completion tokens."""
        return (self.positions >= 0).float()

    @property
    def num_rows(self) -> int:
        """Training rows in this batch (more than its sequences when rows are packed)."""
        return int(self.positions.shape[0])

    @property
    def num_tokens(self) -> int:
        """Trained (completion) tokens in this batch."""
        return int(self.completion_mask.sum().item())


def shared_prefix_len(rows: Sequence[TrainRow]) -> int:
    """Longest prompt prefix common to all rows, leaving every row one prompt token of its own
    (the hidden state before a row's completion must be computed with that row)."""
    return _common_prefix([r.prompt_ids for r in rows])


def _common_prefix(prompts: Sequence[Sequence[int]]) -> int:
    first = prompts[0]
    limit = min(len(p) for p in prompts) - 1
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return n


@dataclass(frozen=True)
class Unit:
    """One sequence of a batch's forward pass and the rows whose completions it holds.

    Unpacked, a unit is one row (``prompt + completion``). With ``pack`` the act rows of one
    episode form one unit: row ``k``'s prompt is everything the episode held before reply ``k``,
    so each row is a prefix of the next and the last row's tokens hold every earlier row's
    completion at the same positions, under the same causal context — one forward gives them
    all, with the values and gradients of separate rows.
    """

    ids: tuple[int, ...]
    spans: tuple[tuple[int, int], ...]  # [start, end) of each row's completion in ``ids``
    rows: tuple[int, ...]  # indices of those rows in the input

    @property
    def head(self) -> int:
        """Tokens before the first completion (what ``share_prefix`` may share)."""
        return self.spans[0][0]


def units(rows: Sequence[TrainRow], advantages: Sequence[float], pack: bool) -> list[Unit]:
    """One unit per row, or (``pack``) per chain of nested rows of one episode, role and
    advantage (each row's prompt starts with the previous row's prompt and completion)."""
    last: dict[tuple[str, Role, float], int] = {}  # a chain's newest unit, by index in out
    out: list[Unit] = []
    order = sorted(range(len(rows)), key=lambda i: len(rows[i].prompt_ids)) if pack else None
    for i in order if order is not None else range(len(rows)):
        row = rows[i]
        ids = (*row.prompt_ids, *row.completion_ids)
        span = (len(row.prompt_ids), len(ids))
        key = (row.episode_id, row.role, float(advantages[i]))
        at = last.get(key) if pack else None
        if at is not None and row.prompt_ids[: len(out[at].ids)] == out[at].ids:
            out[at] = Unit(ids, (*out[at].spans, span), (*out[at].rows, i))
            continue
        last[key] = len(out)
        out.append(Unit(ids, (span,), (i,)))
    return out


def collate(
    rows: Sequence[TrainRow],
    advantages: Sequence[float],
    pad_id: int,
    share_prefix: bool = False,
    pack: bool = False,
) -> Batch:
    """Pad ``rows`` (with one advantage each) into a ``Batch``; ``share_prefix`` and ``pack``:
    see the module docstring and ``Unit``."""
    import torch

    if not rows:
        raise ValueError("cannot build a batch from zero rows")
    if len(rows) != len(advantages):
        raise ValueError(f"{len(rows)} rows but {len(advantages)} advantages")
    for index, (row, adv) in enumerate(zip(rows, advantages, strict=True)):
        _check_row(index, row, adv)
    seqs = units(rows, advantages, pack)
    shared = _shared(seqs) if share_prefix else 0
    length = max(len(u.ids) for u in seqs) - shared
    shape = (len(seqs), length)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    attention_mask = torch.zeros(shape, dtype=torch.long)
    completion_mask = torch.zeros(shape, dtype=torch.float32)
    old_logprobs = torch.zeros(shape, dtype=torch.float32)
    widest = max(len(r.completion_ids) for r in rows)
    positions = torch.full((len(rows), widest), -1, dtype=torch.long)
    for b, unit in enumerate(seqs):
        own = unit.ids[shared:]
        input_ids[b, : len(own)] = torch.tensor(own, dtype=torch.long)
        attention_mask[b, : len(own)] = 1
        for (start, end), i in zip(unit.spans, unit.rows, strict=True):
            lo, hi = start - shared, end - shared
            completion_mask[b, lo:hi] = 1.0
            old_logprobs[b, lo:hi] = torch.tensor(rows[i].old_logprobs, dtype=torch.float32)
            positions[i, : hi - lo] = torch.arange(b * length + lo, b * length + hi)
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        completion_mask=completion_mask,
        old_logprobs=old_logprobs,
        advantages=torch.tensor([float(a) for a in advantages], dtype=torch.float32),
        role_ids=torch.tensor([role_id(r.role) for r in rows], dtype=torch.long),
        prefix_ids=torch.tensor(seqs[0].ids[:shared], dtype=torch.long),
        positions=positions,
    )


def _shared(seqs: Sequence[Unit]) -> int:
    """The prefix ``share_prefix`` runs once: common to every unit and before each one's first
    completion (less than ``MIN_SHARED_PREFIX`` tokens is not worth the extra forward)."""
    if len(seqs) < 2:
        return 0
    shared = _common_prefix([u.ids[: u.head] for u in seqs])
    return shared if shared >= MIN_SHARED_PREFIX else 0


def micro_batches(
    rows: Sequence[TrainRow],
    advantages: Sequence[float],
    pad_id: int,
    token_budget: int,
    share_prefix: bool = False,
    pack: bool = False,
) -> list[Batch]:
    """Split rows into batches of at most ``token_budget`` padded tokens (units x longest unit).

    Units (rows, or with ``pack`` chains of one episode's nested rows: ``Unit``) are sorted by
    length (longest first) so that units of similar length share a batch and little padding is
    wasted; a unit longer than the budget gets a batch of its own. With ``share_prefix`` units
    are sorted by their tokens instead, so units sharing a prompt prefix (a GRPO group's first
    prompt, a world's rehearse instructions) are neighbours, and a batch's cost counts its
    shared prefix once (``collate(share_prefix=True)``). Pass the totals over all micro-batches
    to ``loss.policy_loss`` (``total_rows``/``total_tokens``) so that the summed micro-batch
    losses equal the loss of one big batch.
    """
    if token_budget <= 0:
        raise ValueError(f"token_budget must be a positive number of tokens, got {token_budget}")
    if len(rows) != len(advantages):
        raise ValueError(f"{len(rows)} rows but {len(advantages)} advantages")
    seqs = units(rows, advantages, pack)
    groups = (
        _prefix_groups(seqs, token_budget) if share_prefix else _length_groups(seqs, token_budget)
    )
    batches = []
    for group in groups:
        members = sorted(i for g in group for i in seqs[g].rows)
        picked = [rows[i] for i in members]
        batches.append(
            collate(picked, [advantages[i] for i in members], pad_id, share_prefix, pack)
        )
    return batches


def _length_groups(seqs: Sequence[Unit], token_budget: int) -> list[list[int]]:
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i].ids), reverse=True)
    groups: list[list[int]] = []
    for i in order:
        # sorted longest first: a group's first unit is its longest, so its size is n x that length
        if groups and (len(groups[-1]) + 1) * len(seqs[groups[-1][0]].ids) <= token_budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _prefix_groups(seqs: Sequence[Unit], token_budget: int) -> list[list[int]]:
    """Consecutive units in token order; a unit joins the current group when that costs less
    than computing it alone (joining can shorten the group's shared prefix, so every member's
    own part grows) and the group still fits ``token_budget`` (cost = prefix + n x longest rest)."""
    order = sorted(range(len(seqs)), key=lambda i: seqs[i].ids[: seqs[i].head])
    groups: list[list[int]] = []
    cost = 0
    for i in order:
        if groups:
            joined = _prefix_cost([seqs[j] for j in groups[-1]] + [seqs[i]])
            if joined <= token_budget and joined - cost < len(seqs[i].ids):
                groups[-1].append(i)
                cost = joined
                continue
        groups.append([i])
        cost = len(seqs[i].ids)
    return groups


def _prefix_cost(seqs: Sequence[Unit]) -> int:
    shared = _shared(seqs)
    return shared + len(seqs) * (max(len(u.ids) for u in seqs) - shared)


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
