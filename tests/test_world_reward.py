"""The offline fidelity reward F on hand-made calls (training.world_reward), its rows' rewards
and the config's checks."""

from __future__ import annotations

import pytest

from envace_engine.config import ConfigError, TrainConfig, build
from envace_engine.rollout.tokens import training_rows
from envace_engine.training.world_reward import (
    fidelity_terms,
    offline_fidelity,
    reference_result,
    rehearse_rewards,
)
from envace_engine.types import (
    CallRecord,
    Episode,
    Mode,
    Rehearsal,
    Role,
    Segment,
    Task,
    ToolCall,
    ToolError,
    ToolResult,
)

TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "check_stock",
            "parameters": {
                "type": "object",
                "properties": {"item": {"type": "string"}},
                "required": ["item"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "buy",
            "parameters": {
                "type": "object",
                "properties": {"item": {"type": "string"}, "qty": {"type": "integer"}},
                "required": ["item", "qty"],
            },
        },
    },
)
STOCK = ToolCall("check_stock", {"item": "pen"})
BUY = ToolCall("buy", {"item": "pen", "qty": 2})
TASK = Task(
    id="t",
    suite="toy",
    user_turns=("how many pens, then buy two", "and now?"),
    tools=TOOLS,
    initial_state={},
    reference_calls=((STOCK, BUY), (STOCK,)),
    reference_results=(
        ({"item": "pen", "stock": 5}, {"bought": 2}),
        ({"item": "pen", "stock": 3},),
    ),
)


def rec(turn: int, call: ToolCall, rehearsed: ToolResult | None) -> CallRecord:
    return CallRecord(turn, 1, call, "rehearsed", rehearsed=rehearsed)


def ok(value: object) -> ToolResult:
    return ToolResult(value=value)


def err(code: str) -> ToolResult:
    return ToolResult(error=ToolError(code, "no"))


def test_a_reference_call_with_a_reference_past_is_scored_against_the_recorded_result():
    calls = [rec(0, STOCK, ok({"item": "pen", "stock": 5})), rec(0, BUY, ok({"bought": 3}))]
    assert offline_fidelity(TASK, calls, 0) == 1.0  # exact
    # {"bought": 3} vs {"bought": 2}: keys 1, values 0, token similarity 2*4/10 -> (1+0+0.8)/3
    assert offline_fidelity(TASK, calls, 1) == pytest.approx(0.6)
    later = [*calls, rec(1, STOCK, err("NOT_FOUND"))]
    assert reference_result(TASK, later, 2) == ok({"item": "pen", "stock": 3})
    assert offline_fidelity(TASK, later, 2) == 0.0  # an error where the tool succeeded


def test_off_the_reference_path_there_is_no_f():
    other = ToolCall("check_stock", {"item": "ink"})
    assert offline_fidelity(TASK, [rec(0, other, ok({"stock": 1}))], 0) is None
    # the right call, but after a call the reference did not make: the state may differ
    calls = [rec(0, other, ok({"stock": 1})), rec(0, STOCK, ok({"item": "pen", "stock": 5}))]
    assert offline_fidelity(TASK, calls, 1) is None
    # turn 1's call after a turn 0 that skipped the purchase
    calls = [rec(0, STOCK, ok({})), rec(1, STOCK, ok({"item": "pen", "stock": 3}))]
    assert offline_fidelity(TASK, calls, 1) is None
    no_refs = Task("u", "toy", ("x",), TOOLS, {})
    assert offline_fidelity(no_refs, [rec(0, STOCK, ok({}))], 0) is None


def test_a_call_the_schema_refuses_scores_one_only_for_the_right_error():
    stray = ToolCall("check_stock", {"item": "pen", "qty": 3})  # the real tool rejects qty
    echo = ok({"item": "pen", "qty": 3})
    assert offline_fidelity(TASK, [rec(0, stray, err("INVALID_PARAMETERS"))], 0) == 1.0
    assert offline_fidelity(TASK, [rec(0, stray, echo)], 0) == 0.0
    assert offline_fidelity(TASK, [rec(0, stray, err("NOT_FOUND"))], 0) == 0.0
    assert offline_fidelity(TASK, [rec(0, stray, None)], 0) == 0.0  # unparseable
    unknown = ToolCall("sell", {"item": "pen"})
    assert offline_fidelity(TASK, [rec(0, unknown, err("TOOL_NOT_AVAILABLE"))], 0) == 1.0


def episode(reward: float | None, calls: list[CallRecord]) -> Episode:
    act = Segment(Role.ACT, (1, 2), "a", (-0.1, -0.2))
    rehearsals = tuple(
        Rehearsal(i, (7, 8), Segment(Role.REHEARSE, (9,), "r", (-0.3,)), True)
        for i in range(len(calls))
    )
    return Episode(
        "e-0-0",
        "t",
        "toy",
        Mode.REHEARSAL,
        "g",
        (Segment(Role.PROMPT, (5,), "p"), act),
        rehearsals=rehearsals,
        calls=tuple(calls),
        reward=reward,
    )


def test_rehearse_rows_get_alpha_task_plus_one_minus_alpha_f():
    stray = ToolCall("check_stock", {"item": "pen", "qty": 3})
    calls = [rec(0, stray, ok({"qty": 3})), rec(0, ToolCall("check_stock", {"item": "x"}), ok(1))]
    e = episode(1.0, calls)
    assert fidelity_terms(TASK, e) == [0.0, None]
    rewards = rehearse_rewards(TASK, e, 0.25)
    assert rewards == [0.25, 1.0]  # 0.25*1 + 0.75*0 where F is known; R_task elsewhere
    rows = training_rows(e, rewards)
    assert [(r.role, r.reward) for r in rows] == [
        (Role.ACT, 1.0),
        (Role.REHEARSE, 0.25),
        (Role.REHEARSE, 1.0),
    ]
    assert rehearse_rewards(TASK, episode(None, calls), 0.25) == [None, None]
    assert rehearse_rewards(TASK, e, 1.0) == [1.0, 1.0]
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        rehearse_rewards(TASK, e, 1.5)


def test_bad_world_settings_name_the_key():
    with pytest.raises(ConfigError, match="task_weight"):
        build(TrainConfig, {"world": {"task_weight": 1.5}})
    with pytest.raises(ConfigError, match="pooling"):
        build(
            TrainConfig, {"world": {"task_weight": 0.5}, "advantages": {"pooling": "trajectories"}}
        )
    with pytest.raises(ConfigError, match="mode"):
        build(TrainConfig, {"world": {"task_weight": 0.5}, "mode": "act-only"})
    with pytest.raises(ConfigError, match="fidelity_weight"):
        build(TrainConfig, {"world": {"fidelity_weight": 0.5}})
