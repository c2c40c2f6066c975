"""Rewards: the judge over a loopback OpenAI-compatible server, verdict parsing, committed calls."""

from __future__ import annotations

import json

import pytest

from envace_engine.rollout.rewards import (
    JudgeConfig,
    checklist,
    committed_calls,
    judge_reward,
    parse_verdict,
)
from envace_engine.types import CallRecord, Episode, Mode, Role, Segment, Task, ToolCall
from tests.openai_server import chat_server

TASK = Task(
    id="t1",
    suite="toy",
    user_turns=("Add 3 apples.", "How many apples now?"),
    tools=(),
    initial_state={"apples": 2},
    reference_calls=((ToolCall("add", {"item": "apples", "n": 3}),), ()),
)


def _episode(calls: tuple[CallRecord, ...] = ()) -> Episode:
    text = "<tool_call>...</tool_call>"
    return Episode(
        id="e1",
        task_id="t1",
        suite="toy",
        mode=Mode.REAL,
        group_id="g1",
        segments=(Segment(Role.PROMPT, (1, 2), "prompt "), Segment(Role.ACT, (3,), text)),
        calls=calls,
        final_answers=("done", "5"),
    )


def test_checklist_has_one_item_per_reference_call_and_turn():
    items = checklist(TASK)
    assert len(items) == 3
    assert 'called add with {"item": "apples", "n": 3}' in items[0]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"items": [true, false, true]}', 2 / 3),
        ('Sure! {"items": [true, true, true]} hope that helps', 1.0),
        ('{"items": [true, false]}', None),  # wrong count: unscorable, not 0
        ('{"items": ["yes", true, true]}', None),
        ("no json here", None),
        ('{"items": [true, true, true', None),
    ],
)
def test_parse_verdict(text, expected):
    assert parse_verdict(text, 3) == expected


def test_committed_calls_grouped_by_turn():
    call = ToolCall("add", {"item": "apples", "n": 3})
    records = (
        CallRecord(turn=0, step=0, call=call, shown="real"),
        CallRecord(turn=1, step=2, call=ToolCall("count", {}), shown="real"),
    )
    assert committed_calls(_episode(records), 2) == [[call], [ToolCall("count", {})]]


def test_judge_scores_over_http_and_sends_the_rubric():
    with chat_server(lambda messages: json.dumps({"items": [True, True, False]})) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        score = judge_reward(JudgeConfig(url=url))(TASK, _episode())
        assert score == pytest.approx(2 / 3)
        sent = server.requests[0]["messages"][1]["content"]
        assert "1. Turn 1: the assistant called add" in sent
        assert "<tool_call>" in sent


def test_judge_retries_server_errors_then_scores():
    with chat_server(lambda messages: '{"items": [true, true, true]}') as server:
        server.fail_next = [503]
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert judge_reward(JudgeConfig(url=url))(TASK, _episode()) == 1.0
        assert len(server.requests) == 2


def test_judge_failure_is_unscorable_not_zero():
    with chat_server(lambda messages: "I refuse to grade") as server:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert judge_reward(JudgeConfig(url=url))(TASK, _episode()) is None
        server.fail_next = [503, 503, 503]
        assert judge_reward(JudgeConfig(url=url, max_retries=2))(TASK, _episode()) is None
        server.fail_next = [400]
        assert judge_reward(JudgeConfig(url=url))(TASK, _episode()) is None
