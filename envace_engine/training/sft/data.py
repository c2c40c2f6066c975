"""SFT examples: the reference trajectories of a suite's tasks as the prompts and targets the
policy meets at run time, tokenised token-in/token-out, packed into chains and batched by length
(the package docstring says what the examples are and why)."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from envace_engine.config import SFTConfig
from envace_engine.environments import get_suite
from envace_engine.environments.base import Suite
from envace_engine.rollout.prompts import (
    ChatSample,
    Message,
    RehearseContext,
    act_samples,
    pick_examples,
    rehearse_samples,
    to_chat,
)
from envace_engine.rollout.tokens import ChatTokenizer
from envace_engine.seeds import derive_seed
from envace_engine.training.batching import collate
from envace_engine.training.sft.invalid import invalid_samples
from envace_engine.training.sft.memory import memory_samples
from envace_engine.types import Role, Task, TrainRow

LOG = logging.getLogger(__name__)
BUCKET_BATCHES = 32  # batches drawn per sorted window: similar prompts, still shuffled


def sft_tasks(suite: Suite, config: SFTConfig, split: str | None = None) -> list[Task]:
    """The first ``n_tasks`` tasks (in a seeded order) matching ``task_filter``, with references."""
    split = split or config.split
    tasks = [
        t
        for t in suite.tasks(split)
        if any(t.reference_calls)
        and all(str(t.meta.get(k)) == v for k, v in config.task_filter.items())
    ]
    if not tasks:
        raise ValueError(
            f"no {config.suite}/{split} task with reference calls matches task_filter="
            f"{config.task_filter}: loosen the filter or choose another split"
        )
    random.Random(config.seed).shuffle(tasks)
    return tasks[: config.n_tasks]


def task_samples(
    task: Task, pool: Sequence[Task], config: SFTConfig, suite: Suite | None = None
) -> list[ChatSample]:
    """The SFT samples of one task for the configured roles, rendered as the rollout renders
    (``suite`` answers the invalid variants of ``invalid_fraction``)."""
    r = config.rollout
    examples = pick_examples(task, pool, r.n_examples)
    tools = tuple(task.tools)
    samples: list[ChatSample] = []
    if "act" in config.roles:
        samples += act_samples(task, tools, examples)
    if "rehearse" in config.roles:
        ctx = RehearseContext(
            tools=tools,
            task=task,
            grounded=r.grounded_rehearsal,
            stated=r.world_state,
            with_history=r.rehearse_history,
            examples=examples,
        )
        samples += rehearse_samples(ctx)
        if config.invalid_fraction > 0:
            real = suite or get_suite(config.suite)
            samples += invalid_samples(ctx, real, config.invalid_fraction, config.seed)
    if config.memory_fraction > 0 and _with_memory(task, config):
        samples += memory_samples(task, tools, examples, write="memory" in config.roles)
    names = ",".join(sorted(str(t.get("function", t).get("name")) for t in tools))
    return [dataclasses.replace(s, group=f"{s.role}|{names}", source=task.id) for s in samples]


def _with_memory(task: Task, config: SFTConfig) -> bool:
    """Whether this task also gets memory-conditioned examples (a seeded share of tasks)."""
    draw = derive_seed(config.seed, "sft-memory", task.id) / 2**31
    return draw < config.memory_fraction


def to_record(sample: ChatSample) -> dict[str, Any]:
    """One TRL conversational prompt-completion row (``role`` kept for counting)."""
    return {
        "prompt": to_chat(sample.prompt),
        "completion": to_chat([Message("assistant", sample.target)]),
        "role": sample.role,
    }


def all_samples(
    config: SFTConfig, suite: Suite | None = None, split: str | None = None
) -> list[ChatSample]:
    """Every SFT sample of ``config`` (on ``split``, default the training split), in a seeded
    order."""
    suite = suite or get_suite(config.suite)
    # The rollout draws worked examples from the train split (rollout.loop's default pool).
    pool = suite.tasks("train") if config.rollout.n_examples > 0 else []
    tasks = sft_tasks(suite, config, split)
    samples = [s for t in tasks for s in task_samples(t, pool, config, suite)]
    random.Random(derive_seed(config.seed, "sft-records")).shuffle(samples)
    return samples


def build_records(config: SFTConfig, suite: Suite | None = None) -> list[dict[str, Any]]:
    """All SFT rows for ``config`` in TRL's conversational form, shuffled with its seed."""
    return [to_record(s) for s in all_samples(config, suite)]


@dataclass(frozen=True)
class Example:
    """One tokenised SFT example: the prompt the rollout would send, the ids to sample."""

    role: str  # "act" | "rehearse" | "memory"
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    target: str
    group: str = ""  # as ChatSample.group: batches never mix groups
    source: str = ""  # as ChatSample.source: the task

    @property
    def length(self) -> int:
        """Prompt plus completion tokens."""
        return len(self.prompt_ids) + len(self.completion_ids)


def tokenize(samples: Sequence[ChatSample], chat: ChatTokenizer) -> list[Example]:
    """Prompts as the rollout tokenises them; completions as their text's canonical ids + EOS."""
    return [
        Example(
            s.role,
            tuple(chat.prompt_ids(s.prompt)),
            (*chat.encode(s.target), chat.eos_id),
            s.target,
            s.group,
            s.source,
        )
        for s in samples
    ]


@dataclass(frozen=True)
class Chain:
    """What a batch is made of: one example, or (``pack_turns``) a task's nested examples of
    one role — example k+1's prompt starts with example k's prompt and completion, as a task's
    act turns do — which one sequence holds with every member's completion in place
    (``batching.Unit``: the same values and gradients as separate rows)."""

    members: tuple[int, ...]  # indices into the examples, shortest first
    group: str
    length: int  # tokens of the sequence: the last member's prompt + completion


def chains(examples: Sequence[Example], pack: bool) -> list[Chain]:
    """``examples`` as ``Chain``s: one per example, or (``pack``) per nested chain of one task
    and role (an example joins the first chain whose sequence its prompt starts with)."""
    if not pack:
        return [Chain((i,), e.group, e.length) for i, e in enumerate(examples)]
    open_chains: dict[tuple[str, str, str], list[list[int]]] = {}
    found: list[list[int]] = []  # examples without a task stay alone
    for i in sorted(range(len(examples)), key=lambda i: len(examples[i].prompt_ids)):
        e = examples[i]
        if not e.source:
            found.append([i])
            continue
        pool = open_chains.setdefault((e.source, e.role, e.group), [])
        chain = next((m for m in pool if _extends(e, examples[m[-1]])), None)
        if chain is None:
            pool.append([i])
        else:
            chain.append(i)
    found += [m for pool in open_chains.values() for m in pool]
    found.sort(key=lambda m: m[0])  # the examples' (seeded) order, not the dict's
    return [Chain(tuple(m), examples[m[0]].group, examples[m[-1]].length) for m in found]


def _extends(example: Example, tail: Example) -> bool:
    """Whether ``example``'s prompt starts with ``tail``'s prompt and completion."""
    return example.prompt_ids[: tail.length] == tail.prompt_ids + tail.completion_ids


def bucketed_batches(
    items: Sequence[Example | Chain], batch_size: int, seed: int
) -> list[list[int]]:
    """One epoch of batches (indices into ``items``): a seeded shuffle, then each window of
    ``BUCKET_BATCHES`` batches sorted by group and length and cut into batches that never cross
    a group; then the batch order is shuffled. A group's items share their prompt head (one
    role, one tool set: the system message and tool schemas), so a batch's common prefix runs
    through the model once (``batching.collate(share_prefix=True)``), and sorting by length
    keeps padding small. A group's last batch of a window may be smaller than ``batch_size``."""
    rng = random.Random(seed)
    order = list(range(len(items)))
    rng.shuffle(order)
    window = batch_size * BUCKET_BATCHES
    batches: list[list[int]] = []
    for start in range(0, len(order), window):
        chunk = sorted(
            order[start : start + window],
            key=lambda i: (items[i].group, items[i].length),
        )
        for _, members in itertools.groupby(chunk, key=lambda i: items[i].group):
            picked = list(members)
            batches += [picked[i : i + batch_size] for i in range(0, len(picked), batch_size)]
    rng.shuffle(batches)
    return batches


def batch_stream(items: Sequence[Example | Chain], batch_size: int, seed: int, steps: int):
    """``steps`` batches of indices, epoch after epoch (each epoch reshuffled and re-bucketed)."""
    epoch = 0
    produced = 0
    while produced < steps:
        for batch in bucketed_batches(items, batch_size, derive_seed(seed, "sft-epoch", epoch)):
            if produced == steps:
                return
            yield epoch, batch
            produced += 1
        epoch += 1


def lr_at(step: int, config: SFTConfig) -> float:
    """Learning rate of optimizer step ``step`` (0-based): warm-up, then constant or cosine."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    if config.lr_schedule == "constant":
        return config.lr
    span = max(config.max_steps - config.warmup_steps, 1)
    progress = min((step - config.warmup_steps) / span, 1.0)
    floor = config.lr * config.min_lr_ratio
    return floor + (config.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def as_rows(examples: Sequence[Example], chain_ids: Sequence[int] | None = None) -> list[TrainRow]:
    """``TrainRow``s for ``batching.collate`` (no sampler log-probs: zeros, unused here); rows
    of one chain (``chain_ids``) share an episode id, which ``collate(pack=True)`` packs by."""
    ids = chain_ids if chain_ids is not None else [0] * len(examples)
    return [
        TrainRow(
            episode_id=f"sft-{chain}",
            group_id="sft",
            role=Role.REHEARSE if e.role == "rehearse" else Role.ACT,
            prompt_ids=e.prompt_ids,
            completion_ids=e.completion_ids,
            old_logprobs=(0.0,) * len(e.completion_ids),
            reward=None,
        )
        for e, chain in zip(examples, ids, strict=True)
    ]


def chain_batch(
    examples: Sequence[Example], found: Sequence[Chain], picked: Sequence[int], pad: int
):
    """The ``batching.Batch`` of chains ``picked``: their prompt head shared, each chain one
    sequence; its rows are the members' examples in chain order (``Batch.positions``)."""
    members = [(i, c) for c in picked for i in found[c].members]
    rows = as_rows([examples[i] for i, _ in members], [c for _, c in members])
    # ``pack`` only when a chain has several members: collate(pack=True) reorders sequences by
    # prompt length, so a batch of single examples keeps the unpacked layout (and numerics)
    packed = any(len(found[c].members) > 1 for c in picked)
    return collate(rows, [0.0] * len(rows), pad, share_prefix=True, pack=packed)
