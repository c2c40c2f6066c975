"""Collusion over a run's steps from its stored calls (storage.collusion), equal to the engine's
instruments on the same episodes."""

from __future__ import annotations

import math

from envace_engine.fidelity.collusion import collusion
from envace_engine.types import CallRecord, Episode, Mode, ToolCall, ToolError, ToolResult
from storage import RunWriter, Store

STRAY = ToolCall("check_stock", {"item": "pen", "qty": 3})
REFUSED = ToolResult(error=ToolError("INVALID_PARAMETERS", "unknown parameter qty"))


def episode(eid: str, calls: list[CallRecord], answer: str) -> Episode:
    return Episode(
        eid,
        "t",
        "toy",
        Mode.REHEARSAL,
        "g",
        (),
        calls=tuple(calls),
        final_answers=(answer,),
        reward=1.0,
    )


def pair(call: ToolCall, rehearsed: ToolResult | None, real: ToolResult) -> CallRecord:
    return CallRecord(0, 1, call, "rehearsed", rehearsed=rehearsed, real=real)


def test_rates_per_step_match_the_engine_and_name_the_worst_episode(tmp_path):
    balance = ToolCall("get_balance", {"name": "ann"})
    step0 = [
        episode("e0", [pair(STRAY, ToolResult({"item": "pen", "qty": 3}), REFUSED)], "3 pens"),
        episode("e1", [pair(balance, ToolResult({"ann": 45}), ToolResult({"ann": 9}))], "45"),
        episode("e2", [pair(STRAY, REFUSED, REFUSED)], "sorry"),
    ]
    step1 = [episode("e3", [pair(balance, ToolResult({"ann": 9}), ToolResult({"ann": 9}))], "9")]
    with RunWriter.create(tmp_path, "train", model="tiny", suite="toy", run_id="r") as w:
        w.episodes(0, step0)
        w.episodes(1, step1)
    with Store(tmp_path, url="duckdb:///:memory:") as store:
        df = store.collusion.over_steps("r").set_index("step")
    expected = collusion(step0).rates()
    for name, value in expected.items():
        assert math.isclose(df.loc[0, name], value), name
    assert df.loc[0, "pairs"] == 3 and df.loc[0, "worst_episode"] in ("e0", "e1")
    assert df.loc[0, "worst_events"] == 2  # e0: an echo, and an error rehearsed as success
    assert df.loc[0, "worst_episode"] == "e0"
    assert df.loc[1, "echo_rate"] == 0.0 and not isinstance(df.loc[1, "worst_episode"], str)
    assert math.isnan(df.loc[1, "error_recall"])  # no real error at step 1: nothing to count


def test_a_live_runs_steps_are_read_once(tmp_path, monkeypatch):
    balance = ToolCall("get_balance", {"name": "ann"})
    step = [episode("e0", [pair(balance, ToolResult({"ann": 45}), ToolResult({"ann": 9}))], "45")]
    writer = RunWriter.create(tmp_path, "train", model="tiny", suite="toy", run_id="live")
    writer.episodes(0, step)
    with Store(tmp_path, url="duckdb:///:memory:") as store:
        read: list[list[int]] = []
        rates = store.collusion
        real = rates._collusion_steps
        monkeypatch.setattr(rates, "_collusion_steps", lambda r, s: read.append(s) or real(r, s))
        first = store.collusion.over_steps("live")
        assert store.collusion.over_steps("live").equals(first)  # nothing new: nothing read
        writer.episodes(1, [episode("e1", step[0].calls, "9")])
        assert list(store.collusion.over_steps("live")["step"]) == [0, 1]
        assert read == [[0], [1]]
    writer.finish("done")
