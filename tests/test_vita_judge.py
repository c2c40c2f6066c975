"""VitaBench's judge and suites (environments/vita/judge.py, suite.py) and the conversation
hooks they need in the rollout (the task's own greeting, the agent's ``###STOP###``).

The judge's rules are checked with hand-built conversations and a judge function written in
the test; the end-to-end test runs a real rollout on a real VitaBench task (its real tools), a
scripted agent behind the ``Sampler`` protocol, a scripted user, and the judge behind a
loopback OpenAI-compatible server speaking the real protocol.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from envace_engine.environments import get_suite, suite_names
from envace_engine.environments.base import EpisodeScorer
from envace_engine.environments.vita.comparable import comparability
from envace_engine.environments.vita.dataset import task_spec
from envace_engine.environments.vita.judge import (
    Line,
    evaluate,
    initial_states,
    render,
    updated,
    windows,
)
from envace_engine.environments.vita.suite import conversation, order_check
from envace_engine.rollout.endpoints import Endpoint, NlJudge
from envace_engine.rollout.judges import SamplerJudge
from envace_engine.rollout.loop import RolloutConfig, rollout
from envace_engine.rollout.rewards import PartsReward, state_reward
from envace_engine.rollout.user import ScriptedUser
from envace_engine.testtime.evaluate import part_means
from envace_engine.types import MetaKey, Mode, StopReason, ToolCall, ToolResult
from tests.kv_world import ScriptedSampler, call_text, last_message
from tests.openai_server import chat_server

TASK = "vita-delivery/en/10711001"
TASK_FACTS = ("order noodles", "2025-06-21 11:20:00 Saturday", "en")


def _state(i: int, met: bool, why: str = "") -> dict:
    return {"rubric_idx": f"rubric_{i}", "justification": why, "meetExpectation": met}


def test_rubric_states_lines_and_windows_follow_the_spec() -> None:
    assert initial_states(["a", "b"])[1] == {
        "rubric_idx": "rubric_1",
        "rubric": "b",
        "justification": "Not evaluated yet",
        "meetExpectation": False,
    }
    lines = [
        Line("assistant", "Hello, how can I help you?"),
        Line("user", "Noodles please."),
        Line("assistant", "", (("search", {"q": "noodle", "n": 2}), ("weather", {}))),
        Line("tool", "3 stores"),
        Line("assistant", "  "),  # neither text nor calls: left out, not numbered
        Line("assistant", "Found one.", (("pay", {"id": "O1"}),)),
    ]
    assert render(lines) == [
        "[1] assistant: Hello, how can I help you?",
        "[2] user: Noodles please.",
        "[3] assistant: search(q='noodle', n=2).weather()",
        "[4] tool: 3 stores",
        "[5] assistant: Found one. pay(id='O1')",
    ]
    # Windows of 10 lines starting every 8; the last is the first that reaches the end.
    assert windows(5) == [(0, 5)]
    assert windows(10) == [(0, 10)]
    assert windows(11) == [(0, 10), (8, 11)]
    assert windows(18) == [(0, 10), (8, 18)]
    assert windows(19) == [(0, 10), (8, 18), (16, 19)]


def test_the_judges_answer_is_read_leniently_and_only_named_rubrics_change() -> None:
    states = initial_states(["a", "b", "c"])
    item = '{"rubric_idx": "rubric_1", "justification": "[3] ok", "meetExpectation": true}'
    fenced = f"```json\n[{item},]\n```"  # a code fence and a trailing comma
    new = updated(states, fenced)
    assert new is not None and [s["meetExpectation"] for s in new] == [False, True, False]
    assert new[1]["justification"] == "[3] ok" and new[0]["justification"] == "Not evaluated yet"
    wrapped = json.dumps({"rubrics": [_state(2, True), _state(9, True)]})  # rubric_9: unknown
    assert [s["meetExpectation"] for s in updated(states, wrapped) or []] == [False, False, True]
    as_text = json.dumps([{"rubric_idx": "rubric_0", "meetExpectation": "True"}])
    assert (updated(states, as_text) or [{}])[0]["meetExpectation"] is True
    assert updated(states, "I cannot judge this.") is None
    assert (
        updated(states, json.dumps([{"rubric_idx": "rubric_0", "meetExpectation": "yes"}])) is None
    )
    assert states[1]["meetExpectation"] is False  # the input states are never mutated


def test_states_carry_across_windows_and_every_rubric_must_hold() -> None:
    lines = [Line("user" if i % 2 else "assistant", f"m{i}") for i in range(19)]  # 3 windows
    answers = iter(
        [
            json.dumps([_state(0, True), _state(1, True)]),
            "not json at all",  # unread: the states stay
            json.dumps([_state(1, False, "[17] overturned")]),  # a met rubric flips back
        ]
    )
    seen: list[list[dict]] = []

    def judge(messages: list[dict[str, str]]) -> str | None:
        seen.append(messages)
        return next(answers)

    verdict = evaluate(lines, ["a", "b"], TASK_FACTS, judge)
    assert (verdict.reward, verdict.rubric_score, verdict.windows, verdict.unread) == (
        0.0,
        0.5,
        3,
        1,
    )
    assert verdict.states[1]["justification"] == "[17] overturned"
    system, user = seen[2]
    assert "You are evaluating window 3 (out of 3 windows total)" in system["content"]
    assert "order noodles" in system["content"] and '"system_time"' in system["content"]
    assert user["content"].startswith("<window_content>[17] assistant: m16\n")
    states_shown = user["content"].split("<current_rubrics>")[1].removesuffix("</current_rubrics>")
    assert [s["meetExpectation"] for s in json.loads(states_shown)] == [True, True]

    all_met = evaluate(lines[:4], ["a"], TASK_FACTS, lambda m: json.dumps([_state(0, True)]))
    assert (all_met.reward, all_met.rubric_score, all_met.windows) == (1.0, 1.0, 1)


def test_no_rubric_is_a_pass_unasked_and_a_failed_judge_is_unscorable() -> None:
    def never(messages: list[dict[str, str]]) -> str | None:
        raise AssertionError("the judge must not be asked")

    assert evaluate([Line("user", "hi")], [], TASK_FACTS, never).reward == 1.0
    failed = evaluate([Line("user", "hi")], ["a"], TASK_FACTS, lambda m: None)
    assert (failed.reward, failed.rubric_score) == (None, None)


def test_the_suites_are_registered_by_language_with_one_test_split() -> None:
    names = suite_names()
    assert {"vita-delivery-zh", "vita-delivery-en", "vita-instore"} <= set(names)
    for name, n in [("vita-delivery-zh", 100), ("vita-delivery-en", 100), ("vita-instore", 100)]:
        suite = get_suite(name)
        tasks = suite.tasks("test")
        assert len(tasks) == n and {t.suite for t in tasks} == {name}
        assert isinstance(suite, EpisodeScorer) and suite.bases == ("official",)
        with pytest.raises(ValueError, match="valid splits: test"):
            suite.tasks("train")
    zh = get_suite("vita-delivery-zh").tasks()[0]
    spec = task_spec("delivery", "zh", "10711001")
    # Without a simulated user the one replayed turn is the instructions, said in one go.
    assert zh.id == "vita-delivery/zh/10711001" and zh.user_turns == (spec.instructions,)
    with pytest.raises(ValueError, match="one way"):
        get_suite("vita-instore", "legacy")
    task = get_suite("vita-delivery-en").tasks()[0]
    with pytest.raises(ValueError, match="only by its LLM judge"):
        get_suite("vita-delivery-en").score(task, [[]], [""])


def _order_call(task_id: str = TASK) -> ToolCall:
    task = next(t for t in get_suite("vita-delivery-en").tasks() if t.id == task_id)
    (order,) = task.meta["evaluation"]["required_orders"]
    return ToolCall(
        "create_delivery_order",
        {
            "user_id": "U000001",
            "store_id": order["store_id"],
            "product_ids": [p["product_id"] for p in order["products"]],
            "product_cnts": [p["quantity"] for p in order["products"]],
            "address": order["location"]["address"],
            "dispatch_time": "2025-06-21 11:30:00",
        },
    )


def test_the_order_check_compares_created_orders_with_the_required_ones() -> None:
    task = next(t for t in get_suite("vita-delivery-en").tasks() if t.id == TASK)
    call = _order_call()
    assert order_check(task, [call]) == 1.0
    assert order_check(task, []) == 0.0  # nothing ordered
    assert order_check(task, [call, call]) == 0.0  # one order too many
    two = replace(call, arguments={**call.arguments, "product_cnts": [2]})
    assert order_check(task, [two]) == 0.0  # the wrong quantity


def agent(prompt: str) -> str:
    """Orders the required noodles once the user has spoken, then ends the conversation."""
    role, _ = last_message(prompt)
    if role == "user":
        return call_text(_order_call().name, **_order_call().arguments)
    return "Your noodles are ordered. ###STOP###"


def _rollout(tokenizer, **kw: object):
    suite = get_suite("vita-delivery-en")
    task = next(t for t in suite.tasks() if t.id == TASK)
    user = ScriptedUser({task.id: ["I'd like mild rice noodles delivered, please."]})
    config = RolloutConfig(mode=Mode.REAL, n_examples=0, user=user, seed=0, **kw)  # type: ignore[arg-type]
    (episode,) = rollout([task], suite, ScriptedSampler(tokenizer, agent), tokenizer, config)
    return suite, task, user, episode


def test_a_vita_conversation_opens_with_its_greeting_and_the_agent_ends_it(tokenizer) -> None:
    suite, task, user, episode = _rollout(tokenizer)
    assert user.requests[0].conversation[0].content == "Hello, how can I help you?"
    assert "Hello, how can I help you?" in tokenizer.decode(episode.segments[0].token_ids)
    assert episode.stop_reason is StopReason.DONE
    assert episode.final_answers == ("Your noodles are ordered. ###STOP###",)
    (record,) = episode.calls
    assert record.real is not None and record.real.ok
    # No judge endpoint: the episode is stored unscored (None), never 0; the order check stays.
    score = suite.score_episode(task, episode)
    assert score.reward is None and score.components["order_check"] == 1.0
    assert state_reward(suite)(task, episode) is None


def test_the_judge_endpoint_scores_a_vita_episode(tokenizer) -> None:
    suite, task, _, episode = _rollout(tokenizer)
    n = len(task.meta["evaluation"]["rubrics"])
    verdicts = [_state(i, i < n - 1) for i in range(n)]  # every rubric but the last met

    def reply(messages: list[dict]) -> str:
        return f"```json\n{json.dumps(verdicts)}\n```"

    with chat_server(reply) as server:
        host, port = server.server_address[:2]
        judge = NlJudge(Endpoint(f"http://{host}:{port}", "judge-llm"))
        score = suite.score_episode(task, episode, judge)
        assert state_reward(suite, judge)(task, episode) == 0.0
        verdicts[-1]["meetExpectation"] = True
        assert state_reward(suite, judge)(task, episode) == 1.0
        (request, *_) = server.requests
    assert score.reward == 0.0 and score.components["rubric_score"] == pytest.approx((n - 1) / n)
    system, shown = request["messages"]
    assert (
        request["model"] == "judge-llm"
        and task.meta["evaluation"]["instructions"] in system["content"]
    )
    window = shown["content"]
    assert window.startswith("<window_content>[1] assistant: Hello, how can I help you?\n")
    assert "[3] assistant: create_delivery_order(user_id='U000001'," in window
    assert "[4] tool: Order(order_id:OT" in window
    assert "[5] assistant: Your noodles are ordered. ###STOP###" in window


def test_an_episode_that_did_not_end_normally_scores_zero_unjudged(tokenizer) -> None:
    suite, task, _, episode = _rollout(tokenizer)
    cut = replace(episode, stop_reason=StopReason.TOO_MANY_ERRORS)

    class Unreachable(NlJudge):
        def complete(self, messages: list[dict[str, str]]) -> str | None:
            raise AssertionError("an episode cut short is not judged")

    judge = Unreachable(Endpoint("http://127.0.0.1:9"))
    assert suite.score_episode(task, cut, judge).reward == 0.0


def test_an_embedded_model_judges_and_a_prompt_past_its_context_is_unscored(tokenizer) -> None:
    suite, task, _, episode = _rollout(tokenizer)
    n = len(task.meta["evaluation"]["rubrics"])
    every = json.dumps([_state(i, True) for i in range(n)])
    judge = SamplerJudge(ScriptedSampler(tokenizer, lambda prompt: every), tokenizer)
    assert suite.score_episode(task, episode, judge).reward == 1.0
    assert judge.failures == 0
    # τ²'s NL assertions go through the same model; an answer off τ²'s format is no verdict.
    assert judge("user: hi", ["the agent greeted"]) is None
    scripted = ScriptedSampler(tokenizer, lambda prompt: every)
    short = SamplerJudge(scripted, tokenizer, context_limit=512)
    assert suite.score_episode(task, episode, short).reward is None
    assert short.failures == 1 and "exceeds the context" in short.last_error


def test_every_vita_run_says_what_its_scores_compare_with() -> None:
    local = comparability("vita-delivery-en", {"user": "smollm2-135m", "judge_url": "smollm2-135m"})
    assert "user `smollm2-135m`, judge `smollm2-135m`" in local
    assert "local models, not leaderboard-comparable" in local
    unjudged = comparability("vita-instore", {"user": "openai+http://h:1?model=u"})
    assert "none (episodes stored unscored)" in unjudged and "not leaderboard" in unjudged
    served = {"user": "openai+http://h:1?model=u", "judge": "http://h:2"}
    assert "only if these serve upstream's models" in comparability("vita-instore", served)
    assert comparability("tau2-airline", served) == ""


def test_the_score_parts_go_with_the_episode_and_into_the_metrics(tokenizer) -> None:
    suite, task, _, episode = _rollout(tokenizer)
    reward = state_reward(suite)
    assert isinstance(reward, PartsReward)
    parts = dict(reward.score(task, episode).components)
    assert parts == {"rubric_score": None, "order_check": 1.0}  # unjudged: no rubric score
    stored = replace(episode, meta={**episode.meta, MetaKey.SCORE_PARTS: parts})
    other = replace(episode, meta={**episode.meta, MetaKey.SCORE_PARTS: {"order_check": 0.0}})
    assert part_means([stored, other, episode], "eval") == {"eval/part/order_check": 0.5}


def test_a_user_that_never_stops_ends_at_max_steps_and_scores_zero_unjudged(tokenizer) -> None:
    suite = get_suite("vita-delivery-en")
    task = next(t for t in suite.tasks() if t.id == TASK)
    user = ScriptedUser(script=lambda request: "Anything else you can tell me?")
    config = RolloutConfig(mode=Mode.REAL, n_examples=0, user=user, seed=0, max_steps=6)
    chatty = ScriptedSampler(tokenizer, lambda prompt: "Sure, what else do you need?")
    (episode,) = rollout([task], suite, chatty, tokenizer, config)
    assert episode.stop_reason is StopReason.MAX_STEPS and episode.stop_detail.endswith("messages")
    judge = SamplerJudge(ScriptedSampler(tokenizer, lambda prompt: "[]"), tokenizer)
    score = suite.score_episode(task, episode, judge)
    assert score.reward == 0.0 and judge.calls == 0  # cut short: never judged


def test_the_judge_reads_the_real_answer_not_the_rehearsed_one(tokenizer) -> None:
    _, task, _, episode = _rollout(tokenizer)
    (record,) = episode.calls
    imagined = replace(
        record, shown="rehearsed", rehearsed=ToolResult(value="Order(order_id:OTfake, ...)")
    )
    lines = conversation(task, replace(episode, calls=(imagined,)))
    assert "OTfake" not in str(lines) and lines[3].content.startswith("Order(order_id:OT")
    only = replace(imagined, real=None)  # nothing ran for real: what the agent saw
    assert conversation(task, replace(episode, calls=(only,)))[3].content.startswith(
        "Order(order_id:OTfake"
    )
