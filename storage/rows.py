"""Flattening: one step's ``Episode`` objects into Arrow tables, one per shard table.

Token ids and log-probs go straight from the sampler's tuples into Arrow list columns (pyarrow
converts whole columns in C++), and scalar columns are built column-wise, never row by row.
Nothing is re-tokenised: the stored tokens are the training data. Every (rehearsed or
simulated, real) pair is scored with envace_engine.fidelity here, once, at write time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from envace_engine.fidelity import NLL_META_KEY, Fidelity, canonical_json, compare
from envace_engine.types import CallRecord, Episode, Role, ToolResult
from storage.schema import CALLS, EPISODES, LOGPROBS, REHEARSALS, SEGMENTS, TOKENS

ADVANTAGES_META_KEY = "advantages"  # Episode.meta: {"act": float, "rehearse": float}


def list_array(seqs: Sequence[Sequence[Any] | None], kind: pa.ListType) -> pa.Array:
    """An Arrow list array straight from the sampler's tuples (None -> null), converted in C++."""
    return pa.array(seqs, type=kind)


def _result_columns(result: ToolResult | None) -> tuple[str | None, str | None, str | None]:
    """(value JSON, error code, error message) of one answer; all None when it is absent."""
    if result is None:
        return None, None, None
    if result.error is not None:
        return None, result.error.code, result.error.message
    try:
        return canonical_json(result.value), None, None
    except (TypeError, ValueError):
        # Not JSON: keep its repr so it can be inspected; fidelity marks it not parse-valid.
        return repr(result.value), None, None


def _status(result: ToolResult | None) -> str | None:
    return None if result is None else ("ok" if result.ok else "error")


def _pair_source(rec: CallRecord) -> str | None:
    """Which prediction is scored against the real answer, if any."""
    if rec.real is None:
        return None
    if rec.shown == "rehearsed" or rec.rehearsed is not None:
        return "rehearsed"
    return "simulated" if rec.simulated is not None else None


def _fidelity(predicted: ToolResult | None, real: ToolResult) -> Fidelity:
    if predicted is None or predicted.error is not None or real.error is not None:
        return compare(predicted, real)
    try:
        texts = (canonical_json(predicted.value), canonical_json(real.value))
    except (TypeError, ValueError):
        return compare(predicted, real)
    return compare(predicted, real, texts)


def call_row(
    run_id: str, step: int, position: int, ep: Episode, index: int, rec: CallRecord
) -> dict[str, Any]:
    """One ``calls`` row: the call, every answer it got, and the fidelity tiers of its pair."""
    row: dict[str, Any] = {
        "run_id": run_id,
        "step": step,
        "episode_id": ep.id,
        "episode_index": position,
        "call_index": index,
        "call_id": f"{ep.id}/{index}",
        "turn": rec.turn,
        "agent_step": rec.step,
        "tool": rec.call.name,
        "arguments_json": canonical_json(rec.call.arguments),
        "raw": rec.call.raw,
        "shown": rec.shown,
        "rehearsed_status": _status(rec.rehearsed),
        "real_status": _status(rec.real),
    }
    for name in ("rehearsed", "real", "simulated"):
        value, code, message = _result_columns(getattr(rec, name))
        row[f"{name}_json"], row[f"{name}_error"], row[f"{name}_message"] = value, code, message
    source = row["pair_source"] = _pair_source(rec)
    if source is not None and rec.real is not None:
        fid = _fidelity(getattr(rec, source), rec.real)
        row.update(
            parse_valid=fid.parse_valid,
            status_agree=fid.status_agree,
            error_code_agree=fid.error_code_agree,
            exact=fid.exact,
            key_jaccard=fid.key_jaccard,
            value_match=fid.value_match,
            text_similarity=fid.text_similarity,
            fidelity=fid.score,
        )
    nll = ep.meta.get(NLL_META_KEY)
    row["real_nll"] = nll.get(index, nll.get(str(index))) if isinstance(nll, dict) else None
    return row


def _meta_json(meta: dict[str, Any]) -> str:
    return json.dumps(meta, sort_keys=True, default=str)


def _advantage(ep: Episode, role: str) -> float | None:
    adv = ep.meta.get(ADVANTAGES_META_KEY)
    value = adv.get(role) if isinstance(adv, dict) else None
    return None if value is None else float(value)


def episode_row(
    run_id: str, step: int, index: int, ep: Episode, scores: list[float]
) -> dict[str, Any]:
    """One ``episodes`` row; ``scores`` are the fidelity scores of its calls."""
    act = sum(len(s.token_ids) for s in ep.segments if s.role == Role.ACT)
    return {
        "run_id": run_id,
        "step": step,
        "episode_index": index,
        "episode_id": ep.id,
        "group_id": ep.group_id,
        "task_id": ep.task_id,
        "suite": ep.suite,
        "mode": str(ep.mode),
        "reward": ep.reward,
        "stop_reason": str(ep.stop_reason),
        "stop_detail": ep.stop_detail,
        "n_segments": len(ep.segments),
        "n_calls": len(ep.calls),
        "n_rehearsals": len(ep.rehearsals),
        "n_tokens": sum(len(s.token_ids) for s in ep.segments),
        "n_act_tokens": act,
        "n_rehearse_tokens": sum(len(r.completion.token_ids) for r in ep.rehearsals),
        "final_answers": list(ep.final_answers),
        "drift": ep.drift,
        "mean_fidelity": sum(scores) / len(scores) if scores else None,
        "adv_act": _advantage(ep, "act"),
        "adv_rehearse": _advantage(ep, "rehearse"),
        "meta_json": _meta_json(ep.meta),
    }


def _segments_table(run_id: str, step: int, episodes: Sequence[Episode]) -> pa.Table:
    segs = [(ep.id, i, s) for ep in episodes for i, s in enumerate(ep.segments)]
    n = len(segs)
    positions = np.repeat(
        np.arange(len(episodes), dtype=np.int32), [len(ep.segments) for ep in episodes]
    )
    return pa.table(
        {
            "run_id": pa.array([run_id] * n, pa.string()),
            "step": pa.array(np.full(n, step, dtype=np.int32)),
            "episode_id": pa.array([e for e, _, _ in segs], pa.string()),
            "episode_index": pa.array(positions),
            "seq": pa.array(np.fromiter((i for _, i, _ in segs), np.int32, n)),
            "role": pa.array([str(s.role) for _, _, s in segs], pa.string()),
            "text": pa.array([s.text for _, _, s in segs], pa.string()),
            "n_tokens": pa.array(np.fromiter((len(s.token_ids) for *_, s in segs), np.int32, n)),
            "token_ids": list_array([s.token_ids for *_, s in segs], TOKENS),
            "logprobs": list_array([s.logprobs for *_, s in segs], LOGPROBS),
        },
        schema=SEGMENTS,
    )


def _rehearsals_table(run_id: str, step: int, episodes: Sequence[Episode]) -> pa.Table:
    rows = [(ep.id, i, r) for ep in episodes for i, r in enumerate(ep.rehearsals)]
    positions = np.repeat(
        np.arange(len(episodes), dtype=np.int32), [len(ep.rehearsals) for ep in episodes]
    )
    return pa.table(
        {
            "run_id": pa.array([run_id] * len(rows), pa.string()),
            "step": pa.array([step] * len(rows), pa.int32()),
            "episode_id": pa.array([e for e, _, _ in rows], pa.string()),
            "episode_index": pa.array(positions),
            "rehearsal_index": pa.array([i for _, i, _ in rows], pa.int32()),
            "call_index": pa.array([r.call_index for *_, r in rows], pa.int32()),
            "grounded": pa.array([r.grounded for *_, r in rows], pa.bool_()),
            "text": pa.array([r.completion.text for *_, r in rows], pa.string()),
            "n_prompt_tokens": pa.array([len(r.prompt_ids) for *_, r in rows], pa.int32()),
            "n_tokens": pa.array([len(r.completion.token_ids) for *_, r in rows], pa.int32()),
            "prompt_ids": list_array([r.prompt_ids for *_, r in rows], TOKENS),
            "token_ids": list_array([r.completion.token_ids for *_, r in rows], TOKENS),
            "logprobs": list_array([r.completion.logprobs for *_, r in rows], LOGPROBS),
        },
        schema=REHEARSALS,
    )


def _from_rows(rows: Sequence[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    # Column lists convert faster than row dicts (from_pylist), and missing keys become nulls.
    columns = {f.name: [row.get(f.name) for row in rows] for f in schema}
    return pa.Table.from_pydict(columns, schema=schema)


def step_tables(run_id: str, step: int, episodes: Sequence[Episode]) -> dict[str, pa.Table]:
    """All four episode-data tables of one step, keyed by table name."""
    call_rows: list[dict[str, Any]] = []
    episode_rows: list[dict[str, Any]] = []
    for index, ep in enumerate(episodes):
        rows = [call_row(run_id, step, index, ep, i, rec) for i, rec in enumerate(ep.calls)]
        scores = [r["fidelity"] for r in rows if r.get("fidelity") is not None]
        call_rows.extend(rows)
        episode_rows.append(episode_row(run_id, step, index, ep, scores))
    return {
        "segments": _segments_table(run_id, step, episodes),
        "rehearsals": _rehearsals_table(run_id, step, episodes),
        "calls": _from_rows(call_rows, CALLS),
        "episodes": _from_rows(episode_rows, EPISODES),
    }
