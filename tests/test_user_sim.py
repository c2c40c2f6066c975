"""Simulated users in the episode loop (rollout/turns.py, rollout/user.py) on real τ² tools.

The agent is a scripted policy behind the ``Sampler`` protocol (``tests.kv_world``) that reads
the real token prompts the loop builds; the user is a ``ScriptedUser``, the tiny model behind
``SamplerUser`` or a loopback OpenAI-compatible server behind ``EndpointUser``. Environments and
scoring are the real ``tau2-mock`` suite.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from envace_engine.environments import get_suite
from envace_engine.rollout.endpoints import Endpoint, EndpointUser, parse_endpoint
from envace_engine.rollout.loop import RolloutConfig, rollout
from envace_engine.rollout.prompts import Message
from envace_engine.rollout.rewards import state_reward
from envace_engine.rollout.user import (
    GREETING,
    SamplerUser,
    ScriptedUser,
    UserReply,
    UserRequest,
    parse_user_text,
    user_messages,
)
from envace_engine.types import MetaKey, Mode, Role, StopReason, Task
from tests.kv_world import ScriptedSampler, call_text, last_message
from tests.openai_server import chat_server

SUITE = get_suite("tau2-mock")


def _task(name: str) -> Task:
    return next(t for t in SUITE.tasks("base") if t.id == f"tau2-mock/{name}")


def agent(prompt: str) -> str:
    """Marks task_1 completed when asked, then says so."""
    role, content = last_message(prompt)
    if role == "tool":
        return "Task task_1 is now completed."
    if "task_1" in content:
        return call_text("update_task_status", task_id="task_1", status="completed")
    return "How can I help?"


def _config(user: object, **kw: object) -> RolloutConfig:
    return RolloutConfig(mode=Mode.REAL, n_examples=0, user=user, seed=0, **kw)  # type: ignore[arg-type]


def test_a_scripted_user_conversation_scores_and_keeps_token_in_token_out(tokenizer) -> None:
    task = _task("update_task_1")
    user = ScriptedUser({task.id: ["Hi, please mark task_1 as completed.", "Thanks! ###STOP###"]})
    sampler = ScriptedSampler(tokenizer, agent)
    (ep,) = rollout([task], SUITE, sampler, tokenizer, _config(user))
    assert ep.stop_reason is StopReason.USER_STOP and ep.stop_detail == "###STOP###"
    roles = [s.role for s in ep.segments]
    assert roles == [
        Role.PROMPT,
        Role.SIMULATED_USER,
        Role.ACT,
        Role.REAL,
        Role.ACT,
        Role.SIMULATED_USER,
    ]
    assert ep.drift == 0  # every appended suffix equals the full re-render's tokens
    assert ep.meta[MetaKey.USER_MESSAGES] == [
        "Hi, please mark task_1 as completed.",
        "Thanks! ###STOP###",
    ]
    assert ep.meta[MetaKey.SCORE_BASIS] == "official"
    assert ep.final_answers == ("Task task_1 is now completed.",)
    assert state_reward(SUITE)(task, ep) == 1.0
    # The agent's context holds the policy and the greeting; the user never sees tool traffic.
    first = tokenizer.decode(ep.segments[0].token_ids)
    assert "Policy:\n# Mock Domain Policy" in first and first.endswith(GREETING + "<|im_end|>\n")
    second = user.requests[1].conversation
    assert [m.role for m in second] == ["assistant", "user", "assistant"]
    assert second[2].content == "Task task_1 is now completed."


def test_the_user_model_sees_roles_flipped() -> None:
    task = _task("update_task_1")
    conv = (Message("assistant", GREETING), Message("user", "Mark task_1 done."))
    chat = user_messages("SYSTEM", conv)
    assert [(m.role, m.content) for m in chat] == [
        ("system", "SYSTEM"),
        ("user", GREETING),
        ("assistant", "Mark task_1 done."),
    ]
    assert "<scenario>" in task.meta["user_system"]
    assert "###STOP###" in task.meta["user_system"]


def test_max_turns_ends_the_user_turn_not_the_episode(tokenizer) -> None:
    task = _task("update_task_1")
    user = ScriptedUser({task.id: ["What users are there?", "Please just stop calling tools."]})
    sampler = ScriptedSampler(tokenizer, lambda prompt: call_text("get_users"))
    (ep,) = rollout([task], SUITE, sampler, tokenizer, _config(user, max_turns=2))
    assert ep.stop_reason is StopReason.USER_STOP
    assert [(c.turn, c.call.name) for c in ep.calls] == [(0, "get_users")] * 2 + [
        (1, "get_users")
    ] * 2
    assert ep.final_answers == ("", "")  # both turns ended at the reply cap, without an answer
    roles = [s.role for s in ep.segments]
    # The capped turn's tool messages are appended together with the user's next message.
    assert roles[4:7] == [Role.ACT, Role.REAL, Role.SIMULATED_USER]
    assert ep.drift == 0


def test_without_a_user_the_reply_cap_still_ends_the_episode(tokenizer) -> None:
    task = _task("update_task_1")
    sampler = ScriptedSampler(tokenizer, lambda prompt: call_text("get_users"))
    config = RolloutConfig(mode=Mode.REAL, n_examples=0, max_turns=2)
    (ep,) = rollout([task], SUITE, sampler, tokenizer, config)
    assert ep.stop_reason is StopReason.TURN_LIMIT


def test_a_user_that_never_stops_ends_at_max_steps_and_scores_zero(tokenizer) -> None:
    task = _task("create_task_1_nl_eval")  # needs no action: an ended conversation would pass
    user = ScriptedUser(script=lambda request: "Tell me more.")
    sampler = ScriptedSampler(tokenizer, lambda prompt: "Sure.")
    (ep,) = rollout([task], SUITE, sampler, tokenizer, _config(user, max_steps=9))
    assert ep.stop_reason is StopReason.MAX_STEPS
    assert ep.stop_detail == "9 messages"
    assert state_reward(SUITE)(task, ep) == 0.0  # the termination gate
    done = replace(ep, stop_reason=StopReason.USER_STOP)
    assert state_reward(SUITE)(task, done) == 1.0


@pytest.mark.parametrize(
    ("reply", "detail"),
    [
        ("   \n", "the user wrote an empty message"),
        ('<tool_call>{"name": "x"}</tool_call>', "the user wrote a tool call"),
    ],
)
def test_a_broken_user_message_is_a_user_error(tokenizer, reply: str, detail: str) -> None:
    task = _task("update_task_1")
    user = ScriptedUser(script=lambda request: reply)
    (ep,) = rollout([task], SUITE, ScriptedSampler(tokenizer, agent), tokenizer, _config(user))
    assert ep.stop_reason is StopReason.USER_ERROR and detail in ep.stop_detail
    assert [s.role for s in ep.segments] == [Role.PROMPT]
    assert state_reward(SUITE)(task, ep) == 0.0


class _Broken:
    """A user simulator that raises, or answers with the wrong number of replies."""

    def __init__(self, raises: bool) -> None:
        self.raises = raises

    def reply(self, requests: list[UserRequest]) -> list[UserReply]:
        if self.raises:
            raise ConnectionError("user backend down")
        return []


@pytest.mark.parametrize("raises", [True, False])
def test_a_failing_simulator_ends_its_episodes_without_crashing(tokenizer, raises: bool) -> None:
    tasks = [_task("update_task_1"), _task("create_task_1")]
    eps = rollout(
        tasks, SUITE, ScriptedSampler(tokenizer, agent), tokenizer, _config(_Broken(raises))
    )
    assert {e.stop_reason for e in eps} == {StopReason.USER_ERROR}
    assert ("ConnectionError" in eps[0].stop_detail) == raises


def test_too_many_tool_errors_end_the_conversation(tokenizer) -> None:
    task = _task("update_task_1")
    user = ScriptedUser(script=lambda request: "Do it.")
    sampler = ScriptedSampler(tokenizer, lambda prompt: call_text("delete_everything"))
    (ep,) = rollout([task], SUITE, sampler, tokenizer, _config(user, max_tool_errors=3))
    assert ep.stop_reason is StopReason.TOO_MANY_ERRORS
    assert len(ep.calls) == 3 and all(c.real.error.code == "TOOL_NOT_AVAILABLE" for c in ep.calls)


def test_stop_tokens_and_protocol_checks() -> None:
    assert parse_user_text("All done. ###STOP###").stop == "###STOP###"
    assert parse_user_text("###TRANSFER###").stop == "###TRANSFER###"
    assert parse_user_text("I can't say. ###OUT-OF-SCOPE###").stop == "###OUT-OF-SCOPE###"
    assert parse_user_text("  Hello ").text == "Hello" and parse_user_text("Hello").stop is None
    assert parse_user_text("").error


def test_the_tiny_model_plays_the_user(tokenizer) -> None:
    from envace_engine.models import resolve
    from envace_engine.samplers import make_sampler

    sampler = make_sampler(resolve("tiny"), tokenizer=tokenizer, batch_size=4)
    task = _task("update_task_1")
    agent_side = ScriptedSampler(tokenizer, agent)
    # Greedy, the random tiny model writes only newlines: an empty message, a user error.
    greedy = SamplerUser(sampler, tokenizer, max_new_tokens=8)
    (ep,) = rollout([task], SUITE, agent_side, tokenizer, _config(greedy))
    assert ep.stop_reason is StopReason.USER_ERROR and "empty" in ep.stop_detail
    sampling = SamplerUser(sampler, tokenizer, max_new_tokens=8, temperature=1.0, seed=1)
    (ep,) = rollout([task], SUITE, agent_side, tokenizer, _config(sampling, max_steps=6))
    assert ep.stop_reason is StopReason.MAX_STEPS
    assert Role.SIMULATED_USER in {s.role for s in ep.segments}
    assert len(ep.meta[MetaKey.USER_MESSAGES]) >= 2 and ep.drift == 0
    no_scenario = replace(task, meta={k: v for k, v in task.meta.items() if k != "user_system"})
    (ep,) = rollout([no_scenario], SUITE, agent_side, tokenizer, _config(sampling))
    assert ep.stop_reason is StopReason.USER_ERROR and "no simulated-user" in ep.stop_detail


def test_an_openai_compatible_endpoint_plays_the_user(tokenizer) -> None:
    replies = iter(["Please mark task_1 as completed.", "Great, thanks. ###STOP###"])
    with chat_server(lambda messages: next(replies)) as server:
        host, port = server.server_address[:2]
        endpoint = parse_endpoint(f"openai+http://{host}:{port}?model=user-llm")
        assert endpoint == Endpoint(f"http://{host}:{port}", "user-llm")
        user = EndpointUser(endpoint)
        task = _task("update_task_1")
        (ep,) = rollout([task], SUITE, ScriptedSampler(tokenizer, agent), tokenizer, _config(user))
        first = server.requests[0]["messages"]
    assert ep.stop_reason is StopReason.USER_STOP
    assert state_reward(SUITE)(task, ep) == 1.0
    assert first[0]["role"] == "system" and "<scenario>" in first[0]["content"]
    assert first[1:] == [{"role": "user", "content": GREETING}]
    with pytest.raises(ValueError, match="expected openai"):
        parse_endpoint("http://localhost:1")


def test_an_unreachable_endpoint_is_a_user_error(tokenizer) -> None:
    user = EndpointUser(Endpoint("http://127.0.0.1:9", max_retries=0, timeout_s=2.0))
    task = _task("update_task_1")
    (ep,) = rollout([task], SUITE, ScriptedSampler(tokenizer, agent), tokenizer, _config(user))
    assert ep.stop_reason is StopReason.USER_ERROR and "failed" in ep.stop_detail


def test_an_empty_reply_is_sampled_again_up_to_three_times(tokenizer) -> None:
    """As VitaBench's runner: an empty agent message (no call, no text) is sampled again, at
    most three times; the dropped replies never reach the context or the user."""
    task = _task("update_task_1")
    seen: list[str] = []

    def shy(prompt: str) -> str:  # empty twice for each prompt, then the real agent
        seen.append(prompt)
        return "" if seen.count(prompt) <= 2 else agent(prompt)

    user = ScriptedUser({task.id: ["Hi, please mark task_1 as completed.", "Thanks! ###STOP###"]})
    (ep,) = rollout([task], SUITE, ScriptedSampler(tokenizer, shy), tokenizer, _config(user))
    assert ep.stop_reason is StopReason.USER_STOP
    assert ep.final_answers == ("Task task_1 is now completed.",)
    assert ep.meta[MetaKey.EMPTY_RETRIES] == 4  # two before each of the two replies
    assert [s.role for s in ep.segments].count(Role.ACT) == 2 and ep.drift == 0

    mute = ScriptedUser({task.id: ["Hi?", "Hello? ###STOP###"]})
    silent = ScriptedSampler(tokenizer, lambda prompt: "")
    (quiet,) = rollout([task], SUITE, silent, tokenizer, _config(mute))
    assert quiet.meta[MetaKey.EMPTY_RETRIES] == 3  # then the fourth empty reply is passed on
    assert quiet.final_answers == ("",) and mute.requests[1].conversation[2].content == ""
