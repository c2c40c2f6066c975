"""The world role's auxiliary next-observation loss: the NLL of known answers under this step's
own rehearse prompts, added to the GRPO loss with weight ``loss.world_nll`` (λ).

A rehearsal's answer is known offline where ``training.world_reward.known_answer`` knows it
(the reference result on the reference path, or the schema check's error for a call it
refuses). For each such rehearsal the target is that answer as the world role's text
(``<execution_result>…</execution_result>`` and the end-of-turn token, as the SFT warm-up and
``probe.real_nll`` write it), scored after the rehearsal's stored prompt ids: the prompt is
never re-rendered. The term is ``λ · (−Σ log p(target token)) / (target tokens)``, a token mean
over the step, so its size does not grow with the batch.

With ``loss.world_nll_replay = k`` the term also holds ``k`` replayed SFT rehearse examples per
step: one reference call of each of ``k`` training tasks drawn by the step's seed, its rehearse
prompt rendered with the run's prompt settings and its recorded result as the target, exactly
as the SFT warm-up builds them (``training.sft.data``): the world role keeps seeing true answers on
the tasks' reference paths even where this step's own rehearsals left them.

The target is a *target*, not sampled text: encoding it is how every SFT example is built.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from envace_engine.environments.tool_environment import parameter_schemas
from envace_engine.logprobs import completion_logprobs
from envace_engine.rollout.parsing import result_to_json
from envace_engine.rollout.prompts import (
    RehearseContext,
    pick_examples,
    rehearse_samples,
    rehearse_target,
)
from envace_engine.training.batching import micro_batches
from envace_engine.training.sft.data import as_rows, tokenize
from envace_engine.training.world_reward import known_answer
from envace_engine.types import Episode, Role, Task, TrainRow

if TYPE_CHECKING:
    import torch

    from envace_engine.config import RolloutSettings
    from envace_engine.rollout.tokens import ChatTokenizer


T = TypeVar("T")


def target_rows(
    tasks: Mapping[str, Task], episodes: Sequence[Episode], chat: ChatTokenizer
) -> list[TrainRow]:
    """One row per rehearsal whose answer is known: its prompt, the known answer's tokens."""
    rows = []
    for episode in episodes:
        task = tasks[episode.task_id]
        schemas = parameter_schemas(task.tools)
        for rehearsal in episode.rehearsals:
            known = known_answer(task, episode.calls, rehearsal.call_index, schemas)
            if known is None:
                continue
            target = (*chat.encode(rehearse_target(result_to_json(known))), chat.eos_id)
            rows.append(
                TrainRow(
                    episode.id,
                    episode.group_id,
                    Role.REHEARSE,
                    rehearsal.prompt_ids,
                    target,
                    (0.0,) * len(target),
                    None,
                )
            )
    return rows


def replay_rows(
    tasks: Sequence[Task],
    rollout: RolloutSettings,
    chat: ChatTokenizer,
    k: int,
    seed: int,
) -> list[TrainRow]:
    """``k`` SFT rehearse examples (module docstring) from ``tasks``, drawn by ``seed``."""
    rng = random.Random(seed)
    pool = [t for t in tasks if any(t.reference_calls) and any(t.reference_results)]
    samples = []
    for task in rng.sample(pool, min(k, len(pool))):
        ctx = RehearseContext(
            tools=tuple(task.tools),
            task=task,
            grounded=rollout.grounded_rehearsal,
            with_history=rollout.rehearse_history,
            examples=pick_examples(task, tasks, rollout.n_examples),
            stated=rollout.world_state,
        )
        found = rehearse_samples(ctx)
        if found:
            samples.append(rng.choice(found))
    return as_rows(tokenize(samples, chat))


def sample_rows(rows: Sequence[T], limit: int, seed: int) -> list[T]:
    """At most ``limit`` of ``rows`` (all when ``limit`` is 0 or not smaller), drawn uniformly
    without replacement by ``seed``, in their order. Each row is equally likely to be kept, so
    the sample's mean NLL estimates the mean over every row without bias, at a cost the limit
    bounds: a row costs a forward and a backward over its whole rehearse prompt."""
    if not limit or limit >= len(rows):
        return list(rows)
    kept = sorted(random.Random(seed).sample(range(len(rows)), limit))
    return [rows[i] for i in kept]


def batch_nll(model: Any, batch: Any, temperature: float = 1.0) -> tuple[torch.Tensor, int]:
    """(−Σ log p, token count) of a collated batch's completion tokens; differentiable."""

    lp = completion_logprobs(
        model,
        batch.input_ids,
        batch.attention_mask,
        batch.completion_mask,
        temperature=temperature,
        prefix_ids=batch.prefix_ids,
    )
    mask = batch.completion_mask.bool()
    return -lp[mask].sum(), int(mask.sum())


def nll_backward(
    model: Any, rows: Sequence[TrainRow], coef: float, pad_id: int, micro_batch_tokens: int
) -> dict[str, float]:
    """Accumulate ``coef``× the token-mean NLL of ``rows`` into the gradients (one backward
    per micro-batch); returns ``loss/world_nll`` (the mean NLL) and the row count."""
    if not rows or coef == 0:
        return {"world/nll_rows": float(len(rows))}
    total_tokens = sum(len(r.completion_ids) for r in rows)
    nll_sum = 0.0
    device = next(model.parameters()).device
    for batch in micro_batches(rows, [0.0] * len(rows), pad_id, micro_batch_tokens, True):
        moved = {f.name: getattr(batch, f.name).to(device) for f in dataclasses.fields(batch)}
        nll, _ = batch_nll(model, dataclasses.replace(batch, **moved))
        (coef * nll / total_tokens).backward()
        nll_sum += float(nll.detach())
    return {"loss/world_nll": nll_sum / total_tokens, "world/nll_rows": float(len(rows))}
