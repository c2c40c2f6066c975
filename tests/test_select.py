"""Test-time ``select`` rehearsal: which imagined episode looks best (hand-built episodes), and
that the committed real episode replays exactly its first reply (ids and log-probs) and then
runs as plain execution, with no memory in its context.

The rollout-level tests use ``tests.test_rehearsal``'s scripted tool-using policy, made to write
a malformed first reply on every other act prompt it sees, so imagined episodes differ.
"""

from __future__ import annotations

from typing import Any

import pytest

from envace_engine.environments import get_suite
from envace_engine.rollout.loop import rollout
from envace_engine.rollout.memory_prompts import MEMORY_HEADER
from envace_engine.samplers.base import Generation, SamplingParams
from envace_engine.testtime.evaluate import EvalConfig, evaluate, sweep_settings
from envace_engine.testtime.rehearsal import RehearsalConfig, rehearse, run_with_rehearsal
from envace_engine.testtime.select import Outlook, choose, first_reply, outlook
from envace_engine.types import (
    CallRecord,
    Episode,
    Mode,
    Replay,
    Role,
    Segment,
    StopReason,
    ToolCall,
    ToolError,
    ToolResult,
)
from tests.test_rehearsal import CONFIG, CountingSuite, ScriptedPolicy, toy_tasks

OK = ToolResult(value={"ok": True})
BAD = ToolResult(error=ToolError("not_found", "no such item"))


def episode(
    stop: StopReason = StopReason.DONE,
    results: tuple[ToolResult | None, ...] = (OK,),
    logprobs: tuple[float, ...] = (-0.5, -0.5),
    act: bool = True,
) -> Episode:
    """An imagined episode: a prompt, one act reply and one rehearsed answer per result."""
    segments = [Segment(Role.PROMPT, (1, 2, 3), "p")]
    if act:
        segments.append(Segment(Role.ACT, tuple(range(10, 10 + len(logprobs))), "a", logprobs))
    segments.append(Segment(Role.TOOL, (7,), "t"))
    calls = tuple(CallRecord(0, 1, ToolCall("look", {}), "rehearsed", rehearsed=r) for r in results)
    return Episode(
        "e", "t", "toy", Mode.REHEARSAL, "g", tuple(segments), calls=calls, stop_reason=stop
    )


def test_outlook_reads_stop_reason_rehearsed_errors_and_confidence():
    look = outlook(episode(results=(OK, BAD, None), logprobs=(-1.0, -0.5, -0.0)))
    assert look == Outlook(finished=True, errors=2, confidence=-0.5)  # None: unparseable
    assert outlook(episode(StopReason.MALFORMED_CALL)).finished is False
    assert outlook(episode(act=False)).confidence is None


def test_choose_prefers_finished_then_fewer_errors_then_confidence_then_earliest():
    unfinished = episode(StopReason.TURN_LIMIT, logprobs=(-0.01,))
    errored = episode(results=(BAD,), logprobs=(-0.01,))
    unsure = episode(logprobs=(-2.0,))
    sure = episode(logprobs=(-0.2,))
    assert choose([unfinished, errored, unsure]) == 2
    assert choose([unfinished, errored]) == 1
    assert choose([unsure, sure, sure]) == 1
    assert choose([episode(act=False), unfinished]) == 1  # no first reply: never chosen
    assert choose([episode(act=False)]) is None
    assert choose([]) is None


def test_first_reply_is_the_first_act_segment_after_its_prompt():
    replay = first_reply(episode())
    assert replay is not None
    assert replay.prompt_ids == (1, 2, 3) and replay.reply.role is Role.ACT
    assert first_reply(episode(act=False)) is None


class FlakyFirstReply(ScriptedPolicy):
    """The scripted policy, but every other first reply it writes is a malformed call."""

    def __init__(self, tokenizer: Any, tasks: Any) -> None:
        super().__init__(tokenizer, tasks)
        self.first_prompts = 0

    def _one(self, prompt: list[int], params: SamplingParams) -> Generation:
        text = self.tokenizer.decode(prompt, skip_special_tokens=False)
        first_act = text.count("<|im_start|>assistant") == 1 and "precise tool" not in text
        if first_act and "rehearsal memory" not in text:
            self.first_prompts += 1
            if self.first_prompts % 2 == 1:
                self.prompts.append(text)
                ids = self.tokenizer("<tool_call>\n{broken", add_special_tokens=False)["input_ids"]
                ids = [*ids, self.tokenizer.eos_token_id]
                return Generation(tuple(ids), tuple(-0.1 for _ in ids), "stop")
        return super()._one(prompt, params)


def test_select_commits_the_best_imagined_first_reply_token_for_token(tokenizer):
    tasks = toy_tasks(2)
    suite = CountingSuite(get_suite("toy"))
    policy = FlakyFirstReply(tokenizer, tasks)
    rehearsal = RehearsalConfig(budget=2, mode="select")
    attempts = run_with_rehearsal(tasks, suite, policy, tokenizer, CONFIG, rehearsal, repeats=2)
    assert policy.first_prompts == 8  # 2 tasks x 2 repeats x 2 imagined; commit sampled none
    for attempt in attempts:
        committed, imagined = attempt.committed, attempt.imagined
        stops = [e.stop_reason for e in imagined]
        assert stops == [StopReason.MALFORMED_CALL, StopReason.DONE]  # every other one broke
        assert committed.meta["selected"] == 1 and committed.meta["memory"] == ""
        assert [o["finished"] for o in committed.meta["outlooks"]] == [False, True]
        chosen = next(s for s in imagined[1].segments if s.role is Role.ACT)
        replayed = next(s for s in committed.segments if s.role is Role.ACT)
        assert replayed == chosen  # ids, text and the sampler's log-probs, unchanged
        assert committed.stop_reason is StopReason.DONE and committed.mode is Mode.REAL
        assert MEMORY_HEADER not in tokenizer.decode(committed.segments[0].token_ids)
        assert committed.meta["memory_tokens"] == 0
    made = [c.call for a in attempts for c in a.committed.calls]
    assert made and suite.executed == made  # the replayed calls ran for real, once each


def test_select_evaluates_and_names_its_setting(tokenizer):
    tasks = toy_tasks(2)
    policy = FlakyFirstReply(tokenizer, tasks)
    config = EvalConfig(1, RehearsalConfig(budget=2, mode="select"))
    suite = get_suite("toy")
    result = evaluate(tasks, suite, policy, tokenizer, CONFIG, config, lambda t, e: e.reward or 1.0)
    metrics = result.metrics()
    assert metrics["eval/select"] == 1.0 and metrics["eval/sequential"] == 0.0
    assert metrics["eval/memory_tokens"] == 0.0 and metrics["eval/rehearsal_tokens"] > 0
    grid = sweep_settings([0, 2], ["select"])
    assert [s.label for s in grid] == ["plain N=0", "select N=2"]


def test_a_replay_after_a_different_prompt_is_refused(tokenizer):
    tasks = toy_tasks(2)
    policy = ScriptedPolicy(tokenizer, tasks)
    (plan,) = rehearse(tasks[:1], get_suite("toy"), policy, tokenizer, CONFIG, RehearsalConfig(1))
    replay = first_reply(plan.imagined[0])
    assert replay is not None
    with pytest.raises(ValueError, match="sampled after a different prompt"):
        rollout(tasks[1:], get_suite("toy"), policy, tokenizer, CONFIG, first_replies=[replay])
    with pytest.raises(ValueError, match="sampled act segment"):
        bad = Replay(replay.prompt_ids, Segment(Role.TOOL, (1,), "x"))
        rollout(tasks[:1], get_suite("toy"), policy, tokenizer, CONFIG, first_replies=[bad])
    with pytest.raises(ValueError, match="2 first replies for 1 episodes"):
        rollout(tasks[:1], get_suite("toy"), policy, tokenizer, CONFIG, first_replies=[None] * 2)


def test_select_with_a_simulated_user_is_refused(tokenizer):
    from dataclasses import replace

    from envace_engine.rollout.user import ScriptedUser

    tasks = toy_tasks(1)
    config = replace(CONFIG, user=ScriptedUser())
    with pytest.raises(ValueError, match="select rehearsal replays"):
        rehearse(tasks, get_suite("toy"), None, tokenizer, config, RehearsalConfig(1, "select"))
