"""Teacher-forced scoring of SFT examples: does greedy decoding reproduce each target exactly?

With the gold prefix in context at every position, an example is **exact** when the argmax
token equals the target token at every completion position, end-of-turn token included — which
is the same as greedy decoding writing the target and stopping. One forward per batch, the LM
head only on completion positions. Reported per kind of target: ``act_call`` (a reply holding a
tool call), ``act_answer`` (a final answer), ``rehearse`` (a rehearsed result), ``memory``.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from envace_engine.config import SFTConfig
from envace_engine.environments import get_suite
from envace_engine.rollout.tokens import ChatTokenizer

EVAL_BATCH = 16
HEAD_CHUNK = 256  # completion positions projected through the LM head at a time


def kind_of(example: Any) -> str:
    """``act_call`` | ``act_answer`` | ``rehearse`` | ``memory``."""
    if example.role == "act":
        return "act_call" if "<tool_call>" in example.target else "act_answer"
    return str(example.role)


def greedy_matches(model: Any, examples: Sequence[Any], pad_id: int, bf16: bool) -> list[tuple]:
    """Per example: (matched completion tokens, completion tokens), in input order."""
    import torch

    from envace_engine.logprobs import shared_prefix_hidden
    from envace_engine.training.batching import collate
    from envace_engine.training.precision import bf16_autocast
    from envace_engine.training.sft import as_rows

    # batches of one group (a role and tool set) share their prompt head: run it once
    order = sorted(range(len(examples)), key=lambda i: (examples[i].group, examples[i].length))
    batches = []
    for _, members in itertools.groupby(order, key=lambda i: examples[i].group):
        picked = list(members)
        batches += [picked[s : s + EVAL_BATCH] for s in range(0, len(picked), EVAL_BATCH)]
    out: dict[int, tuple[int, int]] = {}
    head = model.get_output_embeddings()
    device = next(model.parameters()).device
    bf16 = bf16_autocast(bf16, device)
    for picked in batches:
        rows = as_rows([examples[i] for i in picked])
        batch = collate(rows, [0.0] * len(picked), pad_id, share_prefix=True)
        with (
            torch.inference_mode(),
            torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16),
        ):
            hidden = shared_prefix_hidden(
                model, batch.input_ids, batch.attention_mask, batch.prefix_ids
            )[:, :-1]
            mask = batch.completion_mask[:, 1:].bool()
            targets = batch.input_ids[:, 1:][mask]
            states = hidden[mask]
            best = torch.cat(
                [
                    head(states[s : s + HEAD_CHUNK]).argmax(-1)
                    for s in range(0, states.shape[0], HEAD_CHUNK)
                ]
            )
        hits = (best == targets).long()
        counts = mask.sum(dim=1).tolist()
        offset = 0
        for i, n in zip(picked, counts, strict=True):
            out[i] = (int(hits[offset : offset + n].sum()), int(n))
            offset += n
    return [out[i] for i in range(len(examples))]


def summarize(examples: Sequence[Any], matches: Sequence[tuple], prefix: str) -> dict[str, float]:
    """Exact share, token accuracy and count per kind of target."""
    by_kind: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for example, match in zip(examples, matches, strict=True):
        by_kind[kind_of(example)].append(match)
    metrics: dict[str, float] = {}
    for kind, rows in sorted(by_kind.items()):
        metrics[f"{prefix}/{kind}_exact"] = sum(h == n for h, n in rows) / len(rows)
        metrics[f"{prefix}/{kind}_token_acc"] = sum(h for h, _ in rows) / max(
            sum(n for _, n in rows), 1
        )
        metrics[f"{prefix}/{kind}_count"] = float(len(rows))
    return metrics


def heldout_metrics(model: Any, chat: ChatTokenizer, config: SFTConfig, pad_id: int) -> dict:
    """Teacher-forced metrics on ``eval_tasks`` tasks of ``eval_split`` (``sft/heldout/...``)."""
    from envace_engine.training.sft import all_samples, tokenize

    assert config.eval_split is not None
    suite = get_suite(config.suite)
    held = config.model_copy(update={"n_tasks": config.eval_tasks})
    examples = tokenize(all_samples(held, suite, split=config.eval_split), chat)
    model.eval()
    return summarize(examples, greedy_matches(model, examples, pad_id, config.bf16), "sft/heldout")
