"""Flattening: one step's ``Episode`` objects into Arrow tables, one per shard table.

Every table is built column by column, never from row dicts: a column is one pass over the
step's objects (``attrgetter`` maps run in C), token ids and log-probs go straight from the
sampler's tuples into Arrow list columns (pyarrow converts nested sequences in C++), and
columns derived from others (row positions, ``call_id``) are computed by numpy or Arrow kernels.
Nothing is re-tokenised: the stored tokens are the training data.

Every (rehearsed or simulated, real) pair is scored here, once, at write time, with exactly
``envace_engine.fidelity.metrics.compare``'s tiers, reusing the canonical JSON the result columns
already hold: the pairs are staged (``stage_pairs``: every tier but the text similarity of
inexact pairs), the step's distinct text pairs go to ``similarities`` in one batch (shared by
repeated pairs; ``storage.scoring`` may run it in a helper process meanwhile), and the tiers
are finished (``finish_pairs``). The episodes table aggregates the other three (counts,
``mean_fidelity``) with numpy over their columns.

``iter_step_tables`` yields the tables in ``WRITE_ORDER`` as it builds them, so the writer can
encode one shard while Python builds the next (storage.shards), and builds each in chunks of
episodes that fit the CPU cache.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from envace_engine.fidelity.metrics import (
    NLL_META_KEY,
    Fidelity,
    Staged,
    canonical,
    canonical_json,
    finish_pairs,
    pending_texts,
    similarities,
    stage_pairs,
)
from envace_engine.types import CallRecord, Episode, MetaKey, Role, ToolResult
from storage.schema import CALLS, EPISODES, LOGPROBS, REHEARSALS, SEGMENTS, TOKENS

ADVANTAGES_META_KEY = MetaKey.ADVANTAGES  # Episode.meta: {"act": float, "rehearse": float}
CHUNK_SEGMENTS = 2048  # tables are built in runs of episodes holding about this many segments
# json.dumps(meta, sort_keys=True, default=str) without building an encoder per episode.
_META_ENCODER = json.JSONEncoder(sort_keys=True, default=str)
# _answer of an absent answer: no columns, nothing to score.
_ABSENT = (None, None, None, None)
_RESULT_PARTS = ("json", "error", "message")
# CallRecord's answers, each with columns
_ANSWER_KINDS = ("rehearsed", "real", "simulated", "checked")
# Fidelity's fields in order, as calls columns: its ``score`` is the ``fidelity`` column.
_TIER_COLUMNS = tuple("fidelity" if f.name == "score" else f.name for f in fields(Fidelity))
_UNSCORED: tuple[None, ...] = (None,) * len(fields(Fidelity))  # tiers of a call with no pair


def list_array(seqs: Sequence[Sequence[Any] | None], kind: pa.ListType) -> pa.Array:
    """An Arrow list array straight from the sampler's tuples (None -> null), converted in C++."""
    return pa.array(seqs, type=kind)


def _constant(value: Any, n: int, kind: pa.DataType) -> pa.Array:
    return pa.repeat(pa.scalar(value, kind), n)


def _positions(counts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(index of the owning episode, index within it) for every child row, in row order."""
    sizes = np.asarray(counts, dtype=np.int64)
    owner = np.repeat(np.arange(len(counts), dtype=np.int32), sizes)
    starts = np.cumsum(sizes) - sizes
    within = np.arange(int(sizes.sum()), dtype=np.int64) - np.repeat(starts, sizes)
    return owner, within.astype(np.int32)


def _strings(values: Sequence[Any]) -> pa.Array:
    return pa.array(values, pa.string())


def _lengths(lists: pa.Array) -> pa.Array:
    """Length of each list of a list column (int32, like the token counts in the schema)."""
    return pc.list_value_length(lists)


def _owner_columns(
    run_id: str, step: int, episodes: Sequence[Episode], owner: np.ndarray, first: int
) -> dict[str, pa.Array]:
    """The leading columns of a per-episode child table: run, step, episode id and index."""
    n = len(owner)
    return {
        "run_id": _constant(run_id, n, pa.string()),
        "step": _constant(step, n, pa.int32()),
        "episode_id": _strings([ep.id for ep in episodes]).take(owner),
        "episode_index": pa.array(owner + first),
    }


def segments_table(run_id: str, step: int, episodes: Sequence[Episode], first: int = 0) -> pa.Table:
    """The ``segments`` shard: one row per segment of every episode's agent context.

    ``first`` is the step position of ``episodes[0]`` when they are a chunk of the step.
    """
    owner, seq = _positions([len(ep.segments) for ep in episodes])
    segs = [s for ep in episodes for s in ep.segments]
    token_ids = list_array(list(map(attrgetter("token_ids"), segs)), TOKENS)
    return pa.table(
        {
            **_owner_columns(run_id, step, episodes, owner, first),
            "seq": pa.array(seq),
            "role": _strings(list(map(attrgetter("role"), segs))),  # StrEnum: a str already
            "text": _strings(list(map(attrgetter("text"), segs))),
            "n_tokens": _lengths(token_ids),
            "token_ids": token_ids,
            "logprobs": list_array(list(map(attrgetter("logprobs"), segs)), LOGPROBS),
        },
        schema=SEGMENTS,
    )


def rehearsals_table(
    run_id: str, step: int, episodes: Sequence[Episode], first: int = 0
) -> pa.Table:
    """The ``rehearsals`` shard: one row per world-role generation (``first`` as above)."""
    owner, index = _positions([len(ep.rehearsals) for ep in episodes])
    rows = [r for ep in episodes for r in ep.rehearsals]
    completions = list(map(attrgetter("completion"), rows))
    prompt_ids = list_array(list(map(attrgetter("prompt_ids"), rows)), TOKENS)
    token_ids = list_array(list(map(attrgetter("token_ids"), completions)), TOKENS)
    return pa.table(
        {
            **_owner_columns(run_id, step, episodes, owner, first),
            "rehearsal_index": pa.array(index),
            "call_index": pa.array(list(map(attrgetter("call_index"), rows)), pa.int32()),
            "grounded": pa.array(list(map(attrgetter("grounded"), rows)), pa.bool_()),
            "stated": pa.array(list(map(attrgetter("stated"), rows)), pa.bool_()),
            "text": _strings(list(map(attrgetter("text"), completions))),
            "n_prompt_tokens": _lengths(prompt_ids),
            "n_tokens": _lengths(token_ids),
            "prompt_ids": prompt_ids,
            "token_ids": token_ids,
            "logprobs": list_array(list(map(attrgetter("logprobs"), completions)), LOGPROBS),
        },
        schema=REHEARSALS,
    )


_Answer = tuple[str | None, str | None, str | None, str | None]


def _answer(result: ToolResult | None) -> _Answer:
    """(value JSON, error code, error message, scoring text) of one answer.

    The first three are its columns (all None when it is absent). The scoring text is the
    value's canonical JSON, reused by fidelity; None when the value is not JSON, and for an
    error, whose canonical form is only built when the error is scored.
    """
    if result is None:
        return _ABSENT
    if result.error is not None:
        return None, result.error.code, result.error.message, None
    try:
        text = canonical_json(result.value)
    except (TypeError, ValueError):
        # Not JSON: keep its repr so it can be inspected; fidelity marks it not parse-valid.
        return repr(result.value), None, None, None
    return text, None, None, text


def _pair_source(rec: CallRecord) -> str | None:
    """Which prediction is scored against the real answer, if any."""
    if rec.real is None:
        return None
    if rec.shown == "rehearsed" or rec.rehearsed is not None:
        return "rehearsed"
    return "simulated" if rec.simulated is not None else None


def _pair(
    predicted: ToolResult | None,
    p_text: str | None,
    real: ToolResult,
    r_text: str | None,
    error_texts: dict[tuple[str, str], str],
) -> tuple[ToolResult | None, ToolResult, tuple[str, str] | None]:
    """One pair for ``stage_pairs``, with both scoring texts when they are known.

    ``error_texts`` memoises the canonical JSON of each (code, message) within the step.
    """
    if predicted is None:
        return None, real, None  # not parsed
    if predicted.error is not None:
        p_text = _error_text(predicted, error_texts)
    if real.error is not None:
        r_text = _error_text(real, error_texts)
    if p_text is None or r_text is None:
        return predicted, real, None  # NOT_PARSED, or the real value's own error
    return predicted, real, (p_text, r_text)


def _error_text(result: ToolResult, memo: dict[tuple[str, str], str]) -> str:
    """Canonical JSON of a failed answer (``{"error": {"code", "message"}}``), memoised."""
    assert result.error is not None
    key = (result.error.code, result.error.message)
    text = memo.get(key)
    if text is None:
        text = memo[key] = canonical_json(canonical(result))
    return text


def _real_nll(ep: Episode) -> list[Any]:
    nll = ep.meta.get(NLL_META_KEY)
    if not isinstance(nll, dict):
        return [None] * len(ep.calls)
    return [nll.get(i, nll.get(str(i))) for i in range(len(ep.calls))]


@dataclass(frozen=True)
class StagedCalls:
    """A chunk's ``calls`` columns but the fidelity tiers, and its pairs' staged tiers."""

    columns: dict[str, Any]
    scored: list[int]  # positions of the calls that have a pair, in order
    staged: list[Staged]  # their tiers, inexact ones still without the text similarity


def stage_calls(run_id: str, step: int, episodes: Sequence[Episode], first: int = 0) -> StagedCalls:
    """Every ``calls`` column of ``episodes`` but the fidelity tiers, which wait for the text
    similarities of the step's ``pending_texts`` (``first`` as in ``segments_table``)."""
    owner, index = _positions([len(ep.calls) for ep in episodes])
    recs = [c for ep in episodes for c in ep.calls]
    calls = list(map(attrgetter("call"), recs))
    n = len(recs)
    head = _owner_columns(run_id, step, episodes, owner, first)
    episode_id = head["episode_id"]
    call_index = pa.array(index)
    columns: dict[str, Any] = {
        **head,
        "call_index": call_index,
        "call_id": pc.binary_join_element_wise(episode_id, pc.cast(call_index, pa.string()), "/"),
        "turn": list(map(attrgetter("turn"), recs)),
        "agent_step": list(map(attrgetter("step"), recs)),
        "tool": list(map(attrgetter("name"), calls)),
        "arguments_json": [canonical_json(c.arguments) for c in calls],
        "raw": list(map(attrgetter("raw"), calls)),
        "shown": list(map(attrgetter("shown"), recs)),
    }
    results: dict[str, list[ToolResult | None]] = {}
    scoring_texts: dict[str, Sequence[str | None]] = {}
    for kind in _ANSWER_KINDS:
        results[kind] = answered = list(map(attrgetter(kind), recs))
        if any(answered):
            *parts, scoring_texts[kind] = zip(*map(_answer, answered), strict=True)
        else:  # no call got this kind of answer (simulated, outside simulator mode)
            *parts, scoring_texts[kind] = [(None,) * n] * 4  # tuples, as zip gives above
        columns.update(zip((f"{kind}_{part}" for part in _RESULT_PARTS), parts, strict=True))
        if kind in ("rehearsed", "real"):  # the schema has no simulated_ or checked_status
            columns[f"{kind}_status"] = [
                None if r is None else ("ok" if r.error is None else "error") for r in answered
            ]
    columns["pair_source"] = sources = list(map(_pair_source, recs))
    columns["real_nll"] = [v for ep in episodes for v in _real_nll(ep)]
    scored, pairs = _pairs(sources, results, scoring_texts)
    return StagedCalls(columns, scored, stage_pairs(pairs))


def finish_calls(staged: StagedCalls, similarity: Mapping[tuple[str, str], float]) -> pa.Table:
    """The ``calls`` shard of a staged chunk, given the text similarity of its pending pairs."""
    columns = staged.columns
    per_call: list[tuple[Any, ...]] = [_UNSCORED] * len(columns["pair_source"])
    for i, tiers in zip(staged.scored, finish_pairs(staged.staged, similarity), strict=True):
        per_call[i] = tiers
    by_tier: list[Sequence[Any]] = (
        list(zip(*per_call, strict=True)) if per_call else [[] for _ in _TIER_COLUMNS]
    )
    columns = {**columns, **dict(zip(_TIER_COLUMNS, by_tier, strict=True))}
    return pa.table({f.name: pa.array(columns[f.name], f.type) for f in CALLS}, schema=CALLS)


def _pairs(
    sources: list[str | None],
    results: dict[str, list[ToolResult | None]],
    scoring_texts: dict[str, Sequence[str | None]],
) -> tuple[list[int], list[tuple[ToolResult | None, ToolResult, tuple[str, str] | None]]]:
    """The positions of the calls that have a pair, and each pair for ``stage_pairs``."""
    error_texts: dict[tuple[str, str], str] = {}
    real, real_texts = results["real"], scoring_texts["real"]
    scored = [i for i, source in enumerate(sources) if source is not None]
    pairs = []
    for i in scored:
        source, real_answer = sources[i], real[i]
        assert source is not None and real_answer is not None  # as _pair_source guarantees
        predicted, p_text = results[source][i], scoring_texts[source][i]
        pairs.append(_pair(predicted, p_text, real_answer, real_texts[i], error_texts))
    return scored, pairs


def _meta_json(meta: dict[str, Any]) -> str:
    return _META_ENCODER.encode(meta)


def _advantage(ep: Episode, role: str) -> float | None:
    adv = ep.meta.get(ADVANTAGES_META_KEY)
    value = adv.get(role) if isinstance(adv, dict) else None
    return None if value is None else float(value)


def _per_episode(owner: pa.ChunkedArray, n: int, weights: Any = None) -> np.ndarray:
    """Sum of ``weights`` (or the count of rows) per episode index, in row order."""
    index = owner.to_numpy()
    return np.bincount(index, weights=weights, minlength=n)[:n]


def _int_column(values: np.ndarray) -> pa.Array:
    # Sums of int32 counts arrive as float64 from bincount: exact below 2**53.
    return pa.array(values.astype(np.int32))


def _mean_fidelity(calls: pa.Table, n: int) -> pa.Array:
    """Each episode's mean pair score over its scored calls (null when none was scored)."""
    scored = calls.filter(pc.is_valid(calls["fidelity"]))
    owner = scored["episode_index"]
    scores = scored["fidelity"].to_numpy()
    # bincount adds in row order, as sum() over the episode's calls would.
    total, count = _per_episode(owner, n, scores), _per_episode(owner, n)
    mean = np.divide(total, count, out=np.zeros(n), where=count > 0)
    return pa.array(mean, pa.float64(), mask=count == 0)


def episodes_table(
    run_id: str,
    step: int,
    episodes: Sequence[Episode],
    segments: pa.Table,
    rehearsals: pa.Table,
    calls: pa.Table,
) -> pa.Table:
    """The ``episodes`` shard. Its counts and ``mean_fidelity`` aggregate the step's other
    three tables (numpy over their columns) instead of walking the objects again."""
    n = len(episodes)
    seg_owner, seg_tokens = segments["episode_index"], segments["n_tokens"].to_numpy()
    is_act = pc.equal(segments["role"], str(Role.ACT)).to_numpy()
    columns: dict[str, Any] = {
        "run_id": _constant(run_id, n, pa.string()),
        "step": _constant(step, n, pa.int32()),
        "episode_index": pa.array(np.arange(n, dtype=np.int32)),
        "episode_id": list(map(attrgetter("id"), episodes)),
        "group_id": list(map(attrgetter("group_id"), episodes)),
        "task_id": list(map(attrgetter("task_id"), episodes)),
        "suite": list(map(attrgetter("suite"), episodes)),
        "mode": [str(ep.mode) for ep in episodes],
        "reward": list(map(attrgetter("reward"), episodes)),
        "stop_reason": [str(ep.stop_reason) for ep in episodes],
        "stop_detail": list(map(attrgetter("stop_detail"), episodes)),
        "n_segments": _int_column(_per_episode(seg_owner, n)),
        "n_calls": _int_column(_per_episode(calls["episode_index"], n)),
        "n_rehearsals": _int_column(_per_episode(rehearsals["episode_index"], n)),
        "n_tokens": _int_column(_per_episode(seg_owner, n, seg_tokens)),
        "n_act_tokens": _int_column(_per_episode(seg_owner, n, seg_tokens * is_act)),
        "n_rehearse_tokens": _int_column(
            _per_episode(rehearsals["episode_index"], n, rehearsals["n_tokens"].to_numpy())
        ),
        "final_answers": list(map(attrgetter("final_answers"), episodes)),
        "drift": list(map(attrgetter("drift"), episodes)),
        "mean_fidelity": _mean_fidelity(calls, n),
        "adv_act": [_advantage(ep, "act") for ep in episodes],
        "adv_rehearse": [_advantage(ep, "rehearse") for ep in episodes],
        "meta_json": list(map(_meta_json, map(attrgetter("meta"), episodes))),
    }
    return pa.table({f.name: pa.array(columns[f.name], f.type) for f in EPISODES}, schema=EPISODES)


def _chunks(episodes: Sequence[Episode]) -> list[tuple[int, Sequence[Episode]]]:
    """The step as ``(position of its first episode, episodes)`` runs of ~``CHUNK_SEGMENTS``
    segments each (a whole number of episodes; one empty run for an empty step)."""
    chunks, start, size = [], 0, 0
    for i, ep in enumerate(episodes):
        size += len(ep.segments)
        if size >= CHUNK_SEGMENTS:
            chunks.append((start, episodes[start : i + 1]))
            start, size = i + 1, 0
    if start < len(episodes) or not chunks:
        chunks.append((start, episodes[start:]))
    return chunks


def _chunked(
    build: Callable[[str, int, Sequence[Episode], int], pa.Table],
    run_id: str,
    step: int,
    chunks: list[tuple[int, Sequence[Episode]]],
) -> pa.Table:
    return pa.concat_tables([build(run_id, step, part, first) for first, part in chunks])


def _inline(texts: list[tuple[str, str]]) -> Callable[[], Sequence[float]]:
    return lambda: similarities(texts)


def iter_step_tables(
    run_id: str,
    step: int,
    episodes: Sequence[Episode],
    submit: Callable[[list[tuple[str, str]]], Callable[[], Sequence[float]]] = _inline,
) -> Iterator[tuple[str, pa.Table]]:
    """The step's four episode-data tables in ``WRITE_ORDER``, each built when asked for.

    Segments, rehearsals, calls, then episodes (which aggregates the other three). The calls
    are staged first: every column but the fidelity tiers, whose text similarities go to
    ``submit`` (``storage.scoring`` may compute them in a helper process) and are collected
    only once segments and rehearsals are built. The first three tables are built chunk by
    chunk (``CHUNK_SEGMENTS``) and concatenated: each makes several passes over the episodes'
    objects, and a chunk's objects stay in the CPU cache from one pass to the next (less time
    per bench/storage.py step than whole-step passes).
    """
    chunks = _chunks(episodes)
    staged = [stage_calls(run_id, step, part, first) for first, part in chunks]
    texts = list(dict.fromkeys(t for chunk in staged for t in pending_texts(chunk.staged)))
    similarity = submit(texts)
    segments = _chunked(segments_table, run_id, step, chunks)
    yield "segments", segments
    rehearsals = _chunked(rehearsals_table, run_id, step, chunks)
    yield "rehearsals", rehearsals
    by_texts = dict(zip(texts, similarity(), strict=True))
    calls = pa.concat_tables([finish_calls(chunk, by_texts) for chunk in staged])
    yield "calls", calls
    yield "episodes", episodes_table(run_id, step, episodes, segments, rehearsals, calls)


def step_tables(run_id: str, step: int, episodes: Sequence[Episode]) -> dict[str, pa.Table]:
    """All four episode-data tables of one step, keyed by table name."""
    return dict(iter_step_tables(run_id, step, episodes))
