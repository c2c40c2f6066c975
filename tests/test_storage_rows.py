"""The job path's column-wise tables equal a plain row-by-row construction, cell for cell.

``reference_tables`` builds every row as a dict from first principles — the stdlib's json for
canonical JSON, difflib over the readable token pattern for text similarity, a left-to-right
mean — and lets pyarrow convert the rows. The fast path (storage.rows: columns, batched
fidelity scoring, numpy aggregates) must give equal tables on synthetic steps, on hand-made
edge cases and on episodes from a real rollout (the engine's loop on the key-value world).
"""

from __future__ import annotations

import difflib
import gc
import json
import re
import threading
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from envace_engine.fidelity.metrics import Fidelity, canonical, compare
from envace_engine.rollout.loop import RolloutConfig, rollout
from envace_engine.types import (
    CallRecord,
    Episode,
    Mode,
    Rehearsal,
    Role,
    Segment,
    StopReason,
    ToolCall,
    ToolError,
    ToolResult,
)
from storage import RunWriter, rows
from storage.rows import iter_step_tables, step_tables
from storage.schema import CALLS, EPISODES, REHEARSALS, SEGMENTS, WRITE_ORDER
from storage.synthetic import make_step
from tests.kv_world import KVSuite, ScriptedSampler, both, good_agent

# The tokenizer pattern as first written: fidelity's faster one must find the same tokens.
READABLE_TOKEN = re.compile(
    r'"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null|NaN|-?Infinity|[{}\[\]:,]'
)


def plain_json(value: Any, default: Any = None) -> str:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=default
    )


def reference_fidelity(predicted: ToolResult | None, real: ToolResult) -> Fidelity:
    """``compare``'s tiers with the text similarity (and so the score) redone with difflib."""
    fid = compare(predicted, real)
    if predicted is None or not fid.parse_valid or fid.exact:
        return fid
    # A real value JSON cannot hold is compared with its non-JSON parts as their repr().
    texts = [plain_json(canonical(r), default=repr) for r in (predicted, real)]
    tokens = [READABLE_TOKEN.findall(t) for t in texts]
    sim = difflib.SequenceMatcher(None, *tokens, autojunk=False).ratio()
    if not fid.status_agree:
        score = 0.0
    elif predicted.ok:
        score = (fid.key_jaccard + fid.value_match + sim) / 3
    else:
        score = (float(bool(fid.error_code_agree)) + sim) / 2
    return replace(fid, text_similarity=sim, score=score)


def result_cells(name: str, result: ToolResult | None) -> dict[str, Any]:
    cells: dict[str, Any] = {f"{name}_json": None, f"{name}_error": None, f"{name}_message": None}
    if result is not None and result.error is not None:
        cells[f"{name}_error"], cells[f"{name}_message"] = result.error.code, result.error.message
    elif result is not None:
        try:
            cells[f"{name}_json"] = plain_json(result.value)
        except (TypeError, ValueError):
            cells[f"{name}_json"] = repr(result.value)
    return cells


def status(result: ToolResult | None) -> str | None:
    return None if result is None else ("ok" if result.ok else "error")


def call_row(run_id: str, step: int, position: int, ep: Episode, i: int, rec: CallRecord):
    row: dict[str, Any] = {
        "run_id": run_id,
        "step": step,
        "episode_id": ep.id,
        "episode_index": position,
        "call_index": i,
        "call_id": f"{ep.id}/{i}",
        "turn": rec.turn,
        "agent_step": rec.step,
        "tool": rec.call.name,
        "arguments_json": plain_json(rec.call.arguments),
        "raw": rec.call.raw,
        "shown": rec.shown,
        "rehearsed_status": status(rec.rehearsed),
        "real_status": status(rec.real),
        **result_cells("rehearsed", rec.rehearsed),
        **result_cells("real", rec.real),
        **result_cells("simulated", rec.simulated),
    }
    source = None
    if rec.real is not None and (rec.shown == "rehearsed" or rec.rehearsed is not None):
        source = "rehearsed"
    elif rec.real is not None and rec.simulated is not None:
        source = "simulated"
    row["pair_source"] = source
    if source is not None:
        fid = reference_fidelity(getattr(rec, source), rec.real)
        row.update({k: v for k, v in vars(fid).items() if k != "score"}, fidelity=fid.score)
    nll = ep.meta.get("real_nll")
    row["real_nll"] = nll.get(i, nll.get(str(i))) if isinstance(nll, dict) else None
    return row


def episode_row(run_id: str, step: int, position: int, ep: Episode, scores: list[float]):
    total = 0.0
    for score in scores:  # a plain left-to-right mean
        total += score
    adv = ep.meta.get("advantages")
    adv = adv if isinstance(adv, dict) else {}
    return {
        "run_id": run_id,
        "step": step,
        "episode_index": position,
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
        "n_act_tokens": sum(len(s.token_ids) for s in ep.segments if s.role == Role.ACT),
        "n_rehearse_tokens": sum(len(r.completion.token_ids) for r in ep.rehearsals),
        "final_answers": list(ep.final_answers),
        "drift": ep.drift,
        "mean_fidelity": total / len(scores) if scores else None,
        "adv_act": None if adv.get("act") is None else float(adv["act"]),
        "adv_rehearse": None if adv.get("rehearse") is None else float(adv["rehearse"]),
        "meta_json": json.dumps(ep.meta, sort_keys=True, default=str),
    }


def reference_tables(run_id: str, step: int, episodes: list[Episode]) -> dict[str, pa.Table]:
    """Every table built row by row from the episodes, the obvious way."""
    by_table: dict[str, list[dict[str, Any]]] = {n: [] for n in WRITE_ORDER}
    for position, ep in enumerate(episodes):
        head = {"run_id": run_id, "step": step, "episode_id": ep.id, "episode_index": position}
        for seq, s in enumerate(ep.segments):
            by_table["segments"].append(
                {
                    **head,
                    "seq": seq,
                    "role": str(s.role),
                    "text": s.text,
                    "n_tokens": len(s.token_ids),
                    "token_ids": list(s.token_ids),
                    "logprobs": None if s.logprobs is None else list(s.logprobs),
                }
            )
        for index, r in enumerate(ep.rehearsals):
            c = r.completion
            by_table["rehearsals"].append(
                {
                    **head,
                    "rehearsal_index": index,
                    "call_index": r.call_index,
                    "grounded": r.grounded,
                    "stated": r.stated,
                    "text": c.text,
                    "n_prompt_tokens": len(r.prompt_ids),
                    "n_tokens": len(c.token_ids),
                    "prompt_ids": list(r.prompt_ids),
                    "token_ids": list(c.token_ids),
                    "logprobs": None if c.logprobs is None else list(c.logprobs),
                }
            )
        calls = [call_row(run_id, step, position, ep, i, rec) for i, rec in enumerate(ep.calls)]
        by_table["calls"].extend(calls)
        scores = [c["fidelity"] for c in calls if c.get("fidelity") is not None]
        by_table["episodes"].append(episode_row(run_id, step, position, ep, scores))
    schemas = {"segments": SEGMENTS, "rehearsals": REHEARSALS, "calls": CALLS}
    schemas["episodes"] = EPISODES
    return {
        name: pa.Table.from_pylist(
            [{f.name: row.get(f.name) for f in schemas[name]} for row in table_rows],
            schema=schemas[name],
        )
        for name, table_rows in by_table.items()
    }


def assert_same_tables(run_id: str, step: int, episodes: list[Episode]) -> None:
    fast, slow = step_tables(run_id, step, episodes), reference_tables(run_id, step, episodes)
    assert list(fast) == list(WRITE_ORDER)
    for name in WRITE_ORDER:
        assert fast[name].schema == slow[name].schema, name
        for column in slow[name].column_names:
            got, want = fast[name][column].to_pylist(), slow[name][column].to_pylist()
            assert got == want, f"{name}.{column} differs"
        assert fast[name].equals(slow[name]), name


def ok(value: Any) -> ToolResult:
    return ToolResult(value=value)


def err(code: str, message: str = "boom") -> ToolResult:
    return ToolResult(error=ToolError(code, message, "echo"))


def odd_episode(index: int) -> Episode:
    """Every kind of call record storage must flatten, in one episode."""
    nll = {0: 1.5, 3: 2.5} if index % 2 else {"0": 1.5, "3": 2.5}  # the engine writes int keys
    call = ToolCall("lookup", {"q": 'é"x', "n": [1, 2.5]}, "raw text")
    calls = (
        CallRecord(0, 1, call, "rehearsed", rehearsed=None, real=ok({"a": 1})),  # did not parse
        CallRecord(0, 2, call, "simulated", simulated=ok({"a": 1.004}), real=ok({"a": 1})),
        CallRecord(0, 3, call, "real", real=ok([1, 2, 3])),  # nothing to score
        CallRecord(1, 4, call, "rehearsed", rehearsed=err("E", "x"), real=err("E", "y")),
        CallRecord(1, 5, call, "rehearsed", rehearsed=err("E"), real=err("F")),
        CallRecord(1, 6, call, "rehearsed", rehearsed=ok({"s": {1, 2}}), real=ok({"s": [1]})),
        CallRecord(1, 7, call, "rehearsed", rehearsed=ok([1, [2, {"b": 3}]]), real=ok("scalar")),
        CallRecord(
            1,
            8,
            call,
            "rehearsed",
            rehearsed=ok({"error": {"code": "E", "message": "m"}}),
            real=err("E", "m"),
        ),  # an ok value shaped like the error: same text, not exact
        CallRecord(2, 9, call, "rehearsed", rehearsed=ok({"v": True}), real=None),  # no real
        CallRecord(2, 10, call, "rehearsed", rehearsed=ok({"v": 1}), real=ok({"v": True})),
        CallRecord(2, 11, call, "rehearsed", rehearsed=ok({}), real=ok({})),
        CallRecord(2, 12, call, "rehearsed", rehearsed=ok(None), real=ok({"x": None})),
        # a real answer JSON cannot hold: stored as its repr, and the pair is still scored
        CallRecord(2, 13, call, "rehearsed", rehearsed=ok({"s": [1, 2]}), real=ok({"s": {1, 2}})),
    )
    return Episode(
        id=f"odd-{index}",
        task_id="t-odd",
        suite="toy",
        mode=Mode.SIMULATOR,
        group_id="g-odd",
        segments=(
            Segment(Role.PROMPT, (1, 2), "prompt"),
            Segment(Role.ACT, (3,), "act", (-0.5,)),
            Segment(Role.REAL, (), ""),
            Segment(Role.USER, (4, 5, 6), "user"),
            Segment(Role.ACT, (7, 8), "act", (-1.0, -2.0)),
        ),
        rehearsals=(Rehearsal(3, (9,), Segment(Role.REHEARSE, (), "", ()), False),),
        calls=calls,
        stop_reason=StopReason.TOKEN_LIMIT,
        stop_detail="cap",
        reward=None,
        final_answers=("a", "b"),
        drift=2,
        meta={"real_nll": nll, "advantages": {"act": 1}, "note": object()},
    )


def bare_episode(index: int) -> Episode:
    """No calls, no rehearsals, no meta."""
    return Episode(
        id=f"bare-{index}",
        task_id="t",
        suite="toy",
        mode=Mode.REAL,
        group_id="g",
        segments=(Segment(Role.PROMPT, (1,), "p"),),
        reward=1,
    )


def test_synthetic_steps_match_the_reference():
    assert_same_tables("r", 3, make_step(3, 120, "r"))
    assert_same_tables("r", 0, make_step(0, 7, "r", calls=0, tokens=1))


def test_edge_cases_match_the_reference():
    episodes = [bare_episode(0), odd_episode(1), *make_step(1, 5, "mix"), odd_episode(2)]
    assert_same_tables("edge", 12, episodes)
    assert_same_tables("edge", 13, [bare_episode(0)])
    assert_same_tables("edge", 14, [])


def test_tables_built_in_chunks_match_the_reference(monkeypatch):
    # A step is flattened in runs of ~CHUNK_SEGMENTS segments: cut it after every episode or
    # two, so every table is glued from many chunks with all kinds of episodes at the seams.
    monkeypatch.setattr(rows, "CHUNK_SEGMENTS", 6)
    episodes = [bare_episode(0), odd_episode(1), *make_step(1, 9, "mix"), odd_episode(2)]
    episodes += [bare_episode(3), *make_step(2, 4, "mix", calls=0)]
    assert len(rows._chunks(episodes)) > 8
    assert_same_tables("chunks", 15, episodes)


def world(prompt: str) -> str:
    """Rehearses ``set`` right, ``get`` with a wrong value, and ``ok`` as a failure for kv-c."""
    call = prompt.split("Tool call to simulate:")[-1]
    if "name: get" in call:
        return '<execution_result>{"value": 7}</execution_result>'
    if '"c"' in call or "key: c" in call:
        return '<execution_result>{"error": "no such store"}</execution_result>'
    return '<execution_result>{"ok": true}</execution_result>'


@pytest.fixture(scope="module")
def rollout_episodes(tokenizer) -> list[Episode]:
    """Episodes of the real rollout loop (rehearsal mode, a shadow real store)."""
    sampler = ScriptedSampler(tokenizer, both(good_agent, world))
    config = RolloutConfig(seed=0)
    episodes = rollout(KVSuite().tasks(), KVSuite(), sampler, tokenizer, config, 3, run_id="kv")
    return [
        replace(ep, meta={**ep.meta, "advantages": {"act": 0.5, "rehearse": -0.25}})
        for ep in episodes
    ]


def test_real_rollout_episodes_match_the_reference(rollout_episodes):
    assert len(rollout_episodes) == 9 and all(ep.calls for ep in rollout_episodes)
    pairs = [(c.rehearsed, c.real) for ep in rollout_episodes for c in ep.calls]
    assert any(p == r for p, r in pairs) and any(p.ok and p != r for p, r in pairs)
    assert any(not p.ok and r.ok for p, r in pairs)  # a rehearsed failure of a real success
    assert_same_tables("kv", 5, rollout_episodes)


def test_tables_come_in_write_order():
    names = [name for name, _ in iter_step_tables("r", 0, make_step(0, 2, "r"))]
    assert tuple(names) == WRITE_ORDER


def test_writer_stores_the_tables_and_leaves_no_thread(tmp_path):
    writer = RunWriter.create(tmp_path, "rollout", run_id="r")
    episodes = [*make_step(4, 30, "r"), odd_episode(0)]
    threads = threading.active_count()
    writer.episodes(4, episodes)
    assert threading.active_count() == threads and gc.isenabled()
    for name, table in step_tables("r", 4, episodes).items():
        assert pq.read_table(writer.path / name / "step-000004.parquet").equals(table), name


def test_a_step_that_cannot_be_built_writes_nothing(tmp_path):
    writer = RunWriter.create(tmp_path, "rollout", run_id="r")
    writer.episodes(0, make_step(0, 3, "r"))
    circular: dict[str, Any] = {}
    circular["self"] = circular  # episodes.meta_json cannot hold it: the last table fails
    broken = [*make_step(1, 3, "r"), replace(bare_episode(0), meta=circular)]
    with pytest.raises(ValueError, match="Circular reference"):
        writer.episodes(1, broken)
    # no shard of step 1, and no temporary file of it either (staged ones are removed)
    written = sorted(p.relative_to(writer.path).as_posix() for p in writer.path.rglob("*step*"))
    assert written == [f"{name}/step-000000.parquet" for name in sorted(WRITE_ORDER)]
    assert gc.isenabled()  # the writer pauses cyclic GC while building, and restores it
