"""Teacher-forced scoring of SFT examples: does greedy decoding reproduce each target exactly?

With the gold prefix in context at every position, an example is **exact** when the argmax
token equals the target token at every completion position, end-of-turn token included — which
is the same as greedy decoding writing the target and stopping. One forward per batch, the LM
head only on completion positions. Reported per kind of target: ``act_call`` (a reply holding a
tool call), ``act_answer`` (a final answer), ``rehearse`` (a rehearsed result), ``memory``;
and, where the suite's tasks name the template they were drawn from (toy, bfcl-gen), exact tool
calls per template (``template/<name>/act_call_exact``): an aggregate of 0.9 can hide a
template the policy never gets right.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from envace_engine.config import SFTConfig
from envace_engine.environments import get_suite
from envace_engine.logprobs import shared_prefix_hidden
from envace_engine.rollout.parsing import INVALID_CALL_CODES, parse_rehearsal
from envace_engine.rollout.tokens import ChatTokenizer
from envace_engine.training.precision import bf16_autocast
from envace_engine.training.sft.data import all_samples, chain_batch, chains, tokenize

EVAL_BATCH = 16
HELDOUT_SEED = 0  # the held-out draw of every run (the study recipe's own seed)
HEAD_CHUNK = 256  # completion positions projected through the LM head at a time


def kind_of(example: Any) -> str:
    """``act_call`` | ``act_answer`` | ``rehearse`` | ``rehearse_invalid`` (the world rules the
    call invalid: ``sft.invalid``) | ``memory``."""
    if example.role == "act":
        return "act_call" if "<tool_call>" in example.target else "act_answer"
    if example.role == "rehearse" and _flags_invalid(example.target):
        return "rehearse_invalid"
    return str(example.role)


def _flags_invalid(target: str) -> bool:
    """Whether a rehearse target is an invalid-call error (a reference result that is a tool's
    own error, ``TOOL_EXECUTION_ERROR``, stays a plain rehearsal)."""
    result = parse_rehearsal(target).result
    error = result.error if result is not None else None
    return error is not None and error.code in INVALID_CALL_CODES


def greedy_matches(
    model: Any, examples: Sequence[Any], pad_id: int, bf16: bool, pack: bool = False
) -> list[tuple]:
    """Per example: (matched completion tokens, completion tokens), in input order. ``pack``
    scores a task's nested act turns in one sequence (``sft.chains``): the same gold context
    at every position, fewer tokens."""
    found = chains(examples, pack)
    # batches of one group (a role and tool set) share their prompt head: run it once
    order = sorted(range(len(found)), key=lambda c: (found[c].group, found[c].length))
    batches = []
    for _, members in itertools.groupby(order, key=lambda c: found[c].group):
        picked = list(members)
        batches += [picked[s : s + EVAL_BATCH] for s in range(0, len(picked), EVAL_BATCH)]
    out: dict[int, tuple[int, int]] = {}
    head = model.get_output_embeddings()
    device = next(model.parameters()).device
    bf16 = bf16_autocast(bf16, device)
    for picked in batches:
        batch = chain_batch(examples, found, picked, pad_id)
        with (
            torch.inference_mode(),
            torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16),
        ):
            hidden = shared_prefix_hidden(
                model, batch.input_ids, batch.attention_mask, batch.prefix_ids
            )[:, :-1]
            mask = batch.completion_mask[:, 1:].bool()
            states = hidden[mask]
            best = torch.cat(
                [
                    head(states[s : s + HEAD_CHUNK]).argmax(-1)
                    for s in range(0, states.shape[0], HEAD_CHUNK)
                ]
            )
        hit = torch.zeros(batch.input_ids.shape, dtype=torch.float32)  # aligned with input_ids
        hit[:, 1:][mask] = (best == batch.input_ids[:, 1:][mask]).float()
        per_row = batch.rows_view(hit).sum(dim=1).long().tolist()
        counts = (batch.positions >= 0).sum(dim=1).tolist()
        scored = [i for c in picked for i in found[c].members]  # the batch's rows, in order
        for i, hits, n in zip(scored, per_row, counts, strict=True):
            out[i] = (int(hits), int(n))
    return [out[i] for i in range(len(examples))]


def summarize(
    examples: Sequence[Any],
    matches: Sequence[tuple],
    prefix: str,
    templates: Mapping[str, str] | None = None,
) -> dict[str, float]:
    """Exact share, token accuracy and count per kind of target; with ``templates`` (task id
    -> template name), exact share and count of the tool-call targets per template."""
    by_kind: dict[str, list[tuple[int, int]]] = defaultdict(list)
    by_template: dict[str, list[tuple[int, int]]] = defaultdict(list)
    templates = templates or {}
    for example, match in zip(examples, matches, strict=True):
        kind = kind_of(example)
        by_kind[kind].append(match)
        template = templates.get(example.source)
        if kind == "act_call" and template is not None:
            by_template[template].append(match)
    metrics: dict[str, float] = {}
    for kind, rows in sorted(by_kind.items()):
        metrics[f"{prefix}/{kind}_exact"] = _exact(rows)
        metrics[f"{prefix}/{kind}_token_acc"] = sum(h for h, _ in rows) / max(
            sum(n for _, n in rows), 1
        )
        metrics[f"{prefix}/{kind}_count"] = float(len(rows))
    for template, rows in sorted(by_template.items()):
        metrics[f"{prefix}/template/{template}/act_call_exact"] = _exact(rows)
        metrics[f"{prefix}/template/{template}/act_call_count"] = float(len(rows))
    return metrics


def _exact(rows: Sequence[tuple[int, int]]) -> float:
    """Share of (matched, total) rows matched at every token."""
    return sum(h == n for h, n in rows) / len(rows)


def task_templates(config: SFTConfig, split: str) -> dict[str, str]:
    """Task id -> the template it was drawn from, for the suite's tasks that name one."""
    tasks = get_suite(config.suite).tasks(split)
    return {t.id: str(t.meta["template"]) for t in tasks if t.meta.get("template")}


def heldout_samples(config: SFTConfig) -> list[Any]:
    """The held-out examples: ``eval_tasks`` tasks of ``eval_split`` drawn, and given their
    memory-conditioned variants, with ``HELDOUT_SEED`` whatever the run's seed, so runs that
    differ in seed are scored on the same examples."""
    assert config.eval_split is not None
    held = config.model_copy(update={"n_tasks": config.eval_tasks, "seed": HELDOUT_SEED})
    return all_samples(held, get_suite(config.suite), split=config.eval_split)


def heldout_metrics(model: Any, chat: ChatTokenizer, config: SFTConfig, pad_id: int) -> dict:
    """Teacher-forced metrics on ``heldout_samples`` (``sft/heldout/...``)."""
    examples = tokenize(heldout_samples(config), chat)
    model.eval()
    matches = greedy_matches(model, examples, pad_id, config.bf16, config.pack_turns)
    assert config.eval_split is not None  # heldout_samples checked it
    templates = task_templates(config, config.eval_split)
    return summarize(examples, matches, "sft/heldout", templates)
