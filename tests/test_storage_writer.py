"""RunWriter: run directory layout, rows flattened from episodes, progress, atomic files."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from envace_engine.fidelity.metrics import compare
from envace_engine.sink import Sink
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
from storage import SCHEMA_VERSION, RunWriter, SchemaVersionError
from storage.layout import read_progress, remove_stale_temporaries


def hand_episode() -> Episode:
    """prompt [1 2 3] | act [10 11] | tool [20] | act [30]; one call rehearsed 5 % off."""
    rehearsed = ToolResult(value={"balance": 105, "currency": "EUR"})
    real = ToolResult(value={"currency": "EUR", "balance": 100})
    return Episode(
        id="ep-1",
        task_id="t-1",
        suite="toy",
        mode=Mode.REHEARSAL,
        group_id="g-1",
        segments=(
            Segment(Role.PROMPT, (1, 2, 3), "user: balance?"),
            Segment(Role.ACT, (10, 11), "<tool_call>", (-0.5, -0.25)),
            Segment(Role.TOOL, (20,), '{"balance": 105}'),
            Segment(Role.ACT, (30,), "You have 105 EUR", (-1.0,)),
        ),
        rehearsals=(
            Rehearsal(0, (7, 8, 9, 9), Segment(Role.REHEARSE, (20,), "<r>", (-0.125,)), True),
        ),
        calls=(
            CallRecord(
                0,
                0,
                ToolCall("get_balance", {"acct": "a"}, "raw"),
                "rehearsed",
                rehearsed=rehearsed,
                real=real,
            ),
            CallRecord(
                0,
                1,
                ToolCall("ls", {}),
                "real",
                real=ToolResult(error=ToolError("TOOL_NOT_AVAILABLE", "no ls")),
            ),
        ),
        stop_reason=StopReason.DONE,
        reward=0.5,
        final_answers=("You have 105 EUR",),
        meta={"advantages": {"act": 0.25, "rehearse": -0.5}, "real_nll": {0: 1.5}},
    )


def test_run_writer_is_a_sink(tmp_path):
    writer = RunWriter.create(tmp_path, "rollout", model="tiny", suite="toy", run_id="r1")
    assert isinstance(writer, Sink)
    manifest = json.loads((tmp_path / "runs" / "r1" / "run.json").read_text())
    assert manifest["kind"] == "rollout" and manifest["schema_version"] == SCHEMA_VERSION


def test_episode_rows_keep_tokens_and_score_pairs(tmp_path):
    writer = RunWriter.create(tmp_path, "rollout", run_id="r1")
    writer.episodes(3, [hand_episode()])
    run = tmp_path / "runs" / "r1"
    segs = pq.read_table(run / "segments" / "step-000003.parquet").to_pylist()
    assert [s["role"] for s in segs] == ["prompt", "act", "tool", "act"]
    assert [s["token_ids"] for s in segs] == [[1, 2, 3], [10, 11], [20], [30]]
    assert segs[0]["logprobs"] is None and segs[1]["logprobs"] == [-0.5, -0.25]
    reh = pq.read_table(run / "rehearsals" / "step-000003.parquet").to_pylist()
    assert reh[0]["prompt_ids"] == [7, 8, 9, 9] and reh[0]["logprobs"] == [-0.125]
    calls = pq.read_table(run / "calls" / "step-000003.parquet").to_pylist()
    first, second = calls
    expected = compare(hand_episode().calls[0].rehearsed, hand_episode().calls[0].real)
    assert first["call_id"] == "ep-1/0" and first["pair_source"] == "rehearsed"
    assert first["value_match"] == 0.5 and first["fidelity"] == pytest.approx(expected.score)
    assert first["real_json"] == '{"balance":100,"currency":"EUR"}'
    assert first["real_nll"] == 1.5
    # shown "real" and never rehearsed: no pair to score
    assert second["pair_source"] is None and second["fidelity"] is None
    assert second["real_error"] == "TOOL_NOT_AVAILABLE" and second["real_status"] == "error"
    (ep,) = pq.read_table(run / "episodes" / "step-000003.parquet").to_pylist()
    assert (ep["n_tokens"], ep["n_act_tokens"], ep["n_rehearse_tokens"]) == (7, 3, 1)
    assert ep["mean_fidelity"] == pytest.approx(expected.score)
    assert (ep["adv_act"], ep["adv_rehearse"]) == (0.25, -0.5)
    assert ep["final_answers"] == ["You have 105 EUR"]


def test_metrics_shard_is_long_format(tmp_path):
    writer = RunWriter.create(tmp_path, "train", run_id="r1")
    writer.metrics(0, {"loss": 2.0, "reward/act": 0.5})
    rows = pq.read_table(tmp_path / "runs/r1/metrics/step-000000.parquet").to_pylist()
    assert rows == [
        {"run_id": "r1", "step": 0, "name": "loss", "value": 2.0},
        {"run_id": "r1", "step": 0, "name": "reward/act", "value": 0.5},
    ]


def test_progress_and_final_status(tmp_path):
    with RunWriter.create(tmp_path, "train", run_id="ok") as writer:
        writer.progress(1, 4, "step 1")
        p = read_progress(writer.path)
        assert (p.done, p.total, p.status, p.message) == (1, 4, "running", "step 1")
        assert p.eta_s is not None and p.eta_s >= 0
    assert read_progress(writer.path).status == "done"
    with pytest.raises(RuntimeError), RunWriter.create(tmp_path, "train", run_id="bad") as w:
        w.progress(2, 4)
        raise RuntimeError("diverged")
    final = read_progress(w.path)
    assert (final.status, final.done, final.message) == ("failed", 2, "RuntimeError: diverged")


def test_reopen_resumes_and_rejects_bad_input(tmp_path):
    writer = RunWriter.create(tmp_path, "train", run_id="r1")
    again = RunWriter(writer.path)
    assert again.run_id == "r1"
    with pytest.raises(ValueError, match="already exists"):
        RunWriter.create(tmp_path, "train", run_id="r1")
    with pytest.raises(ValueError, match="not allowed"):
        RunWriter.create(tmp_path, "train", run_id="../escape")
    with pytest.raises(ValueError, match="not one of"):
        RunWriter.create(tmp_path, "nonsense")
    with pytest.raises(ValueError, match=r"no run\.json"):
        RunWriter(tmp_path / "elsewhere")


def test_newer_schema_run_is_refused(tmp_path):
    writer = RunWriter.create(tmp_path, "train", run_id="r1")
    manifest = json.loads((writer.path / "run.json").read_text())
    manifest["schema_version"] = 99
    (writer.path / "run.json").write_text(json.dumps(manifest))
    with pytest.raises(SchemaVersionError, match="schema version 99"):
        RunWriter(writer.path)


def test_stale_temporaries_are_removed(tmp_path):
    writer = RunWriter.create(tmp_path, "train", run_id="r1")
    stale = writer.path / "episodes" / ".step-000001.parquet.tmp-999"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"PAR1 half")
    assert remove_stale_temporaries(writer.path) == 1
    assert not stale.exists()
